// race.c - the exponential race over counter-based noise (see race.h).
//
// The bound that saves most logs: with b the best score so far, a candidate
// with u <= 1 - b p cannot win, since then E = -log(u) >= -log(1 - b p) > b p
// (-log(1 - y) > y for 0 < y < 1), so its score E / p exceeds b. Candidates
// are usually sorted by probability (top-k, top-p), so b falls quickly and
// the unlikely tokens cost one hash and one compare each.
#include "runtime/race.h"

#include <math.h>

double sd_race_exp(uint64_t pos_key, int32_t id) { return -log(sd_race_u(sd_race_hash(pos_key, id))); }

int sd_race_pick(uint64_t key, int64_t pos, const int32_t *ids, const float *p, int n, double *u) {
    const uint64_t pk = sd_race_pos_key(key, pos);
    for (int i = 0; i < n; i++) u[i] = sd_race_u(sd_race_hash(pk, ids[i]));   // vectorises (no branch)
    int best = -1;
    double bs = INFINITY;
    for (int i = 0; i < n; i++) {
        const double pi = p[i];
        if (!(pi > 0.0)) continue;
        if (best >= 0 && u[i] <= 1.0 - bs * pi) continue;   // cannot win (see the top)
        const double sc = -log(u[i]) / pi;
        if (best < 0 || sc < bs || (sc == bs && ids[i] < ids[best])) {
            bs = sc;
            best = i;
        }
    }
    return best;
}

int32_t sd_race_draw_row(uint64_t key, int64_t pos, const float *row, int n) {
    int32_t out;
    return sd_race_rank(key, pos, row, NULL, n, 1, &out) > 0 ? out : -1;
}

int sd_race_rank(uint64_t key, int64_t pos, const float *row, const int32_t *support, int n, int k, int32_t *out) {
    if (k <= 0) return 0;
    if (k > 64) k = 64;
    const uint64_t pk = sd_race_pos_key(key, pos);
    double sc[64];
    int m = 0;
    for (int i = 0; i < n; i++) {
        const int32_t v = support ? support[i] : i;
        const double q = row[v];
        if (!(q > 0.0)) continue;
        const double u = sd_race_u(sd_race_hash(pk, v));
        if (m == k && u <= 1.0 - sc[m - 1] * q) continue;   // worse than the k-th (see the top)
        const double s = -log(u) / q;
        // ids arrive in increasing order: an equal score never displaces an earlier id
        if (m == k && !(s < sc[m - 1])) continue;
        int b = m < k ? m++ : k - 1;
        while (b > 0 && sc[b - 1] > s) {
            sc[b] = sc[b - 1];
            out[b] = out[b - 1];
            b--;
        }
        sc[b] = s;
        out[b] = v;
    }
    return m;
}
