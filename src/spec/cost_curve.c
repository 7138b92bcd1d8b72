// cost_curve.c - the target's cost curve: points set by hand, measured on a
// session or parsed from bench-forward JSON; interpolation; online
// refinement from timed forwards. See cost_curve.h.
#include "spec/cost_curve.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime/session.h"
#include "specdec_spec.h"

void sd_cost_curve_init(sd_cost_curve *c) {
    memset(c, 0, sizeof *c);
    c->online_weight = 0.02;
}

int sd_cost_curve_set(sd_cost_curve *c, int n, double ms) {
    if (n < 1 || !(ms >= 0)) return -1;
    int i = 0;
    while (i < c->n_points && c->n[i] < n) i++;
    if (i < c->n_points && c->n[i] == n) {
        c->ms[i] = ms;
        return 0;
    }
    if (c->n_points == SD_TA_MAX_POINTS) return -1;
    memmove(c->n + i + 1, c->n + i, (size_t)(c->n_points - i) * sizeof c->n[0]);
    memmove(c->ms + i + 1, c->ms + i, (size_t)(c->n_points - i) * sizeof c->ms[0]);
    c->n[i] = n;
    c->ms[i] = ms;
    c->n_points++;
    return 0;
}

void sd_cost_curve_set_draft(sd_cost_curve *c, double fixed, double per_depth, double per_node) {
    c->draft_ms_fixed = fixed;
    c->draft_ms_per_depth = per_depth;
    c->draft_ms_per_node = per_node;
}

double sd_cost_curve_verify_ms(const sd_cost_curve *c, int n) {
    int k = c->n_points;
    if (k == 0) return 0.0;
    if (n <= c->n[0]) return c->ms[0];
    if (k == 1) return c->ms[0] * n / c->n[0];
    for (int i = 1; i < k; i++)
        if (n <= c->n[i]) {
            double w = (double)(n - c->n[i - 1]) / (c->n[i] - c->n[i - 1]);
            return c->ms[i - 1] + w * (c->ms[i] - c->ms[i - 1]);
        }
    double slope = (c->ms[k - 1] - c->ms[k - 2]) / (c->n[k - 1] - c->n[k - 2]);
    return c->ms[k - 1] + SD_MAX(0.0, slope) * (n - c->n[k - 1]);
}

double sd_cost_curve_draft_ms(const sd_cost_curve *c, int n, int depth) {
    if (n <= 1) return 0.0;
    return c->draft_ms_fixed + c->draft_ms_per_depth * depth + c->draft_ms_per_node * (n - 1);
}

void sd_cost_curve_monotone(sd_cost_curve *c) {
    // pool adjacent violators (unweighted): blocks of equal value
    double val[SD_TA_MAX_POINTS];
    int len[SD_TA_MAX_POINTS], nb = 0;
    for (int i = 0; i < c->n_points; i++) {
        val[nb] = c->ms[i];
        len[nb] = 1;
        nb++;
        while (nb > 1 && val[nb - 2] > val[nb - 1]) {
            double v = (val[nb - 2] * len[nb - 2] + val[nb - 1] * len[nb - 1]) / (len[nb - 2] + len[nb - 1]);
            len[nb - 2] += len[nb - 1];
            val[nb - 2] = v;
            nb--;
        }
    }
    for (int b = 0, i = 0; b < nb; b++)
        for (int k = 0; k < len[b]; k++) c->ms[i++] = val[b];
}

// The factor that moves an estimate est towards an observation obs: over the
// first SD_CC_FAST_OBS observations a running geometric mean (the estimate
// counting as one observation; each ratio clamped to [1/4, 4], so that one
// preempted step moves it by 2x at most), then the sign step of online_weight.
// A drafter's cost measured before generation (one call on an empty cache)
// was a quarter of what its steps took while generating (catch-up rows, the
// tree's bookkeeping), and sign steps of 2% needed 70 steps, most of a
// 128-token answer, to get there: its trees were too big all along.
static double track(double est, double obs, double a, int *n_obs) {
    double f = obs > est ? 1.0 + a : obs < est ? 1.0 - a : 1.0;
    if (*n_obs < SD_CC_FAST_OBS && est > 0) f = pow(SD_MAX(0.25, SD_MIN(4.0, obs / est)), 1.0 / (*n_obs + 2));
    (*n_obs)++;
    return f;
}

void sd_cost_curve_observe(sd_cost_curve *c, int n, double ms) {
    if (n < 1 || !(ms >= 0) || c->n_points < 1) return;
    const double f = track(sd_cost_curve_verify_ms(c, n), ms, c->online_weight, &c->n_obs);
    for (int j = 0; j < c->n_points; j++) c->ms[j] *= f;
}

void sd_cost_curve_observe_draft(sd_cost_curve *c, int n, int depth, double ms) {
    if (n <= 1 || !(ms >= 0)) return;
    if (c->draft_ms_fixed == 0 && c->draft_ms_per_depth == 0 && c->draft_ms_per_node == 0) {
        c->draft_ms_per_depth = ms / SD_MAX(1, depth);
        c->n_draft_obs++;
        return;
    }
    const double f = track(sd_cost_curve_draft_ms(c, n, depth), ms, c->online_weight, &c->n_draft_obs);
    c->draft_ms_fixed *= f;
    c->draft_ms_per_depth *= f;
    c->draft_ms_per_node *= f;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

int sd_cost_curve_measure(sd_cost_curve *c, sd_session *s, const int *ns, int n_ns, int reps, double q,
                          char *err, size_t errlen) {
    return sd_cost_curve_measure_rounds(c, s, ns, n_ns, reps, reps, 0.0, q, err, errlen);
}

// Untimed forwards of one token before the rounds: at least CC_WARM_MIN and
// until CC_WARM_MS have passed (at most CC_WARM_MAX). A machine that was idle
// runs its first forwards slowly, speeding up over tens of them (measured on
// a 2-vCPU Sapphire Rapids VM: 13 ms, then 4.5, then 3.4 for the same
// forward), which made the small sizes, timed first, look dear and the curve
// flat.
#define CC_WARM_MIN 3
#define CC_WARM_MAX 40
#define CC_WARM_MS 100.0
#define CC_SMALL_MAX 8   // sizes timed in every round (larger ones: in the first only)

int sd_cost_curve_measure_rounds(sd_cost_curve *c, sd_session *s, const int *ns, int n_ns, int min_rounds,
                                 int max_rounds, double budget_ms, double q, char *err, size_t errlen) {
    static const int def_ns[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
    enum { MAX_R = 64 };
    if (!ns) {
        ns = def_ns;
        n_ns = (int)(sizeof def_ns / sizeof def_ns[0]);
    }
    min_rounds = SD_MAX(1, SD_MIN(min_rounds, MAX_R));
    max_rounds = SD_MAX(min_rounds, SD_MIN(max_rounds, MAX_R));
    sd_model_info info;
    sd_model_get_info(sd_session_model(s), &info);
    const int n_past = sd_session_n_past(s);
    const int room = SD_MIN(s->n_batch, sd_session_n_ctx(s) - n_past);
    int32_t toks[SD_TA_MAX_NODES];
    for (int i = 0; i < SD_TA_MAX_NODES; i++) toks[i] = (int32_t)((1000 + (int64_t)i * 7919) % info.n_vocab);
    int use[SD_TA_MAX_POINTS], n_use = 0;   // the sizes that fit, in the given order
    for (int i = 0; i < n_ns && n_use < SD_TA_MAX_POINTS; i++)
        if (ns[i] >= 1 && ns[i] <= room && ns[i] <= SD_TA_MAX_NODES) use[n_use++] = ns[i];
    if (n_use == 0) return sd_err(err, errlen, "cost curve: no batch size fits the session (room %d)", room);
    const double t_start = sd_time_ms();
    for (int w = 0; w < CC_WARM_MAX && (w < CC_WARM_MIN || sd_time_ms() - t_start < CC_WARM_MS); w++) {
        sd_batch b = {.n = 1, .tokens = toks};
        if (sd_session_forward(s, &b, err, errlen) < 0) return -1;
    }
    // Rounds: every size once per round, one after the other, so that each
    // size's time can be compared with the first size's time of the same
    // round (the machine's speed drifts over seconds; within a round it
    // hardly does).
    // Sizes above CC_SMALL_MAX (but the first) are timed in the first round
    // only: they cost most (32 nodes of Qwen2.5-Coder-1.5B on 2 AVX2 cores:
    // 0.76 s, most of a 2 s round) and automatic trees on a CPU are rarely
    // that large, while the small sizes decide whether drafting pays at all
    // and need the repeated rounds (a 3-round curve came out flat for 1-4
    // nodes on a busy host).
    double times[SD_TA_MAX_POINTS][MAX_R];   // 16 KB
    const double t_rounds = sd_time_ms();
    int rounds = 0;
    c->n_timed = 0;
    while (rounds < max_rounds && (rounds < min_rounds || sd_time_ms() - t_rounds < budget_ms)) {
        for (int k = 0; k < n_use; k++) {
            if (rounds > 0 && k > 0 && use[k] > CC_SMALL_MAX) continue;
            sd_batch b = {.n = use[k], .tokens = toks};
            const double t0 = sd_time_ms();
            if (sd_session_forward(s, &b, err, errlen) < 0) return -1;
            times[k][rounds] = sd_time_ms() - t0;
            c->n_timed++;
        }
        rounds++;
    }
    if (sd_session_truncate(s, n_past, err, errlen) < 0) return -1;
    // The first size's level: the quantile q of its rounds; every other size:
    // that level times the median over rounds of its ratio to the first
    // size's time in the same round.
    double v[MAX_R];
    for (int r = 0; r < rounds; r++) v[r] = times[0][r];
    qsort(v, (size_t)rounds, sizeof v[0], cmp_double);
    const double pos = SD_MAX(0.0, SD_MIN(1.0, q)) * (rounds - 1);
    const int lo = (int)pos, hi = SD_MIN(lo + 1, rounds - 1);
    const double level = v[lo] + (pos - lo) * (v[hi] - v[lo]);
    // (a size timed once: its time over the first size's median time)
    const double med0 = rounds % 2 ? v[rounds / 2] : 0.5 * (v[rounds / 2 - 1] + v[rounds / 2]);
    int n_set = 0;
    for (int k = 0; k < n_use; k++) {
        double ratio;
        if (k > 0 && use[k] > CC_SMALL_MAX) {
            ratio = med0 > 0 ? times[k][0] / med0 : 1.0;
        } else {
            for (int r = 0; r < rounds; r++) v[r] = times[0][r] > 0 ? times[k][r] / times[0][r] : 1.0;
            qsort(v, (size_t)rounds, sizeof v[0], cmp_double);
            ratio = rounds % 2 ? v[rounds / 2] : 0.5 * (v[rounds / 2 - 1] + v[rounds / 2]);
        }
        if (sd_cost_curve_set(c, use[k], level * (k ? ratio : 1.0)) < 0)
            return sd_err(err, errlen, "cost curve: too many points");
        n_set++;
    }
    sd_cost_curve_monotone(c);
    return n_set;
}

int sd_cost_curve_from_json(sd_cost_curve *c, const char *json) {
    const char *p = strstr(json, "\"batches\"");
    if (!p) return -1;
    const char *end = strchr(p, ']');
    int n_set = 0;
    while ((p = strstr(p, "\"n\"")) && (!end || p < end)) {
        p += 3;
        while (*p == ' ' || *p == ':') p++;
        char *q;
        long n = strtol(p, &q, 10);
        if (q == p) return -1;
        const char *m = strstr(q, "\"ms\"");
        if (!m || (end && m > end)) return -1;
        m += 4;
        while (*m == ' ' || *m == ':') m++;
        double ms = strtod(m, &q);
        if (q == m) return -1;
        if (n >= 1 && n <= 1 << 20 && sd_cost_curve_set(c, (int)n, ms) == 0) n_set++;
        p = q;
    }
    return n_set > 0 ? n_set : -1;
}

// ---------------------------------------------------------------- the public handle (specdec_spec.h)
int sd_cost_curve_new(sd_cost_curve **out, sd_session *s, int max_nodes, char *err, size_t errlen) {
    // dense where the curve bends (a few rows cost about one), sparse beyond;
    // 3 rounds at least, more while the rounds have taken under 150 ms (the
    // sizes above 8 in the first round only)
    static const int all[] = {1, 2, 3, 4, 6, 8, 16, 32, 64, 128};
    int ns[sizeof all / sizeof all[0]], n = 0;
    *out = NULL;
    for (int i = 0; i < (int)(sizeof all / sizeof all[0]) && all[i] <= max_nodes; i++) ns[n++] = all[i];
    if (n == 0) ns[n++] = 1;
    sd_cost_curve *c = malloc(sizeof *c);
    if (!c) return snprintf(err, errlen, "out of memory"), -1;
    sd_cost_curve_init(c);
    if (sd_cost_curve_measure_rounds(c, s, ns, n, 3, 9, 150.0, 0.0, err, errlen) < 0) {
        free(c);
        return -1;
    }
    if (c->n_points < 1) {
        free(c);
        return snprintf(err, errlen, "cannot measure the target's forward cost"), -1;
    }
    *out = c;
    return 0;
}

void sd_cost_curve_free(sd_cost_curve *c) { free(c); }

double sd_cost_curve_ms(const sd_cost_curve *c, int n) { return sd_cost_curve_verify_ms(c, n); }

int sd_cost_curve_describe(const sd_cost_curve *c, char *buf, size_t len) {
    if (!c || c->n_points < 1) return snprintf(buf, len, "no points");
    return snprintf(buf, len, "%.2f ms at %d node%s, %.2f ms at %d nodes", c->ms[0], c->n[0], c->n[0] == 1 ? "" : "s",
                    c->ms[c->n_points - 1], c->n[c->n_points - 1]);
}
