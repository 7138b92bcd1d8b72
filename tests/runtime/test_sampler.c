// test_sampler.c - every transform of the sampler on hand-made logits with
// exact expected probabilities, draws against probs (chi-square), determinism;
// both draws: the sequential generator (SD_DRAW_REJECTION) and the race
// (SD_DRAW_RACE: frequencies over many seeds and over the positions of one
// seed, independence of neighbouring positions, a draw fixed by seed,
// position and logits alone).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/race.h"
#include "runtime/sampler.h"
#include "specdec.h"
#include "t.h"

#define NV 6

static sd_sampler_params off(void) {
    sd_sampler_params p = sd_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    return p;
}

static sd_sampler *mk(const sd_sampler_params *p, int nv) {
    sd_sampler *s = NULL;
    char err[256];
    if (sd_sampler_new(&s, p, nv, err, sizeof err) != 0) {
        printf("  sd_sampler_new: %s\n", err);
        return NULL;
    }
    return s;
}

// logits log(w_i) give softmax probabilities w_i / sum(w).
static void logw(const double *w, float *l, int n) {
    for (int i = 0; i < n; i++) l[i] = w[i] > 0 ? (float)log(w[i]) : -INFINITY;
}

static void expect(const float *got, const double *want, int n, const char *what) {
    for (int i = 0; i < n; i++)
        CHECK(fabs(got[i] - want[i]) < 1e-6, "%s: p[%d] = %.8f, expected %.8f", what, i, got[i], want[i]);
}

static const double W[NV] = {0.05, 0.4, 0.1, 0.25, 0.15, 0.05}; // sums to 1

static void test_softmax_plain(void) {
    sd_sampler_params p = off();
    sd_sampler *s = mk(&p, NV);
    CHECK(s != NULL, "new");
    if (!s) return;
    float l[NV], pr[NV];
    logw(W, l, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    expect(pr, W, NV, "softmax");
    sd_sampler_free(s);
}

static void test_temperature(void) {
    sd_sampler_params p = off();
    p.temp = 0.5f; // squares the weights
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV], pr[NV];
    logw(W, l, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    double want[NV], z = 0;
    for (int i = 0; i < NV; i++) z += W[i] * W[i];
    for (int i = 0; i < NV; i++) want[i] = W[i] * W[i] / z;
    expect(pr, want, NV, "temp 0.5");
    sd_sampler_free(s);
}

static void test_greedy(void) {
    sd_sampler_params p = off();
    p.temp = 0.0f;
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV] = {1, 3, 2, 3, 0, -1}, pr[NV];
    sd_sampler_probs(s, l, NULL, 0, pr);
    double want[NV] = {0, 1, 0, 0, 0, 0}; // tie 1 vs 3: lowest id
    expect(pr, want, NV, "greedy");
    CHECK(sd_sampler_sample(s, l, NULL, 0) == 1, "greedy sample");
    sd_sampler_free(s);
}

static void test_top_k(void) {
    sd_sampler_params p = off();
    p.top_k = 3; // keeps ids 1 (0.4), 3 (0.25), 4 (0.15)
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV], pr[NV];
    logw(W, l, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    double want[NV] = {0, 0.4 / 0.8, 0, 0.25 / 0.8, 0.15 / 0.8, 0};
    expect(pr, want, NV, "top-k 3");
    sd_sampler_free(s);
}

static void test_top_k_ties(void) {
    sd_sampler_params p = off();
    p.top_k = 2;
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV] = {0, 1, 1, 1, 0, 1}, pr[NV]; // four tied: keep the lowest ids 1, 2
    sd_sampler_probs(s, l, NULL, 0, pr);
    double want[NV] = {0, 0.5, 0.5, 0, 0, 0};
    expect(pr, want, NV, "top-k ties");
    sd_sampler_free(s);
}

static void test_top_p(void) {
    sd_sampler_params p = off();
    p.top_p = 0.7f; // sorted: 0.4, 0.25 (0.65 < 0.7), 0.15 (0.80 >= 0.7) -> keep 3
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV], pr[NV];
    logw(W, l, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    double want[NV] = {0, 0.4 / 0.8, 0, 0.25 / 0.8, 0.15 / 0.8, 0};
    expect(pr, want, NV, "top-p 0.7");
    p.top_p = 0.3f; // the top token alone
    sd_sampler_free(s);
    s = mk(&p, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    double want1[NV] = {0, 1, 0, 0, 0, 0};
    expect(pr, want1, NV, "top-p 0.3");
    sd_sampler_free(s);
}

static void test_min_p(void) {
    sd_sampler_params p = off();
    p.min_p = 0.3f; // threshold 0.12: keeps 0.4, 0.25, 0.15
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV], pr[NV];
    logw(W, l, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    double want[NV] = {0, 0.4 / 0.8, 0, 0.25 / 0.8, 0.15 / 0.8, 0};
    expect(pr, want, NV, "min-p 0.3");
    sd_sampler_free(s);
}

static void test_repeat_penalty(void) {
    sd_sampler_params p = off();
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV] = {1.0f, 2.0f, -1.0f, 0.5f, 0.0f, 3.0f}, pr[NV];
    // history: 5 is outside the last 2; 1 and 2 inside (2 repeated: applied once)
    int32_t h[4] = {5, 1, 2, 2};
    p.repeat_last_n = 3;
    sd_sampler_free(s);
    s = mk(&p, NV);
    sd_sampler_probs(s, l, h, 4, pr);
    double pl[NV] = {1.0, 1.0, -2.0, 0.5, 0.0, 3.0}, want[NV], z = 0;
    for (int i = 0; i < NV; i++) z += exp(pl[i]);
    for (int i = 0; i < NV; i++) want[i] = exp(pl[i]) / z;
    expect(pr, want, NV, "repeat penalty");
    // greedy with the penalty: 5 is the argmax either way; penalise 5 and 1
    int32_t h2[2] = {5, 1};
    p.temp = 0.0f;
    p.repeat_penalty = 4.0f;
    sd_sampler_free(s);
    s = mk(&p, NV);
    CHECK(sd_sampler_sample(s, l, h2, 2) == 0, "greedy with penalty picks 0 (1.0 > 3/4, 2/4)");
    sd_sampler_free(s);
}

static void test_combined_order(void) {
    // temp 0.5 then top-k 4 then top-p 0.9 then min-p 0.2
    sd_sampler_params p = off();
    p.temp = 0.5f;
    p.top_k = 4;
    p.top_p = 0.9f;
    p.min_p = 0.2f;
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV], pr[NV];
    logw(W, l, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    // squared weights of the top 4: .16 .0625 .0225 .01 (sum .255)
    double q[4] = {.16 / .255, .0625 / .255, .0225 / .255, .01 / .255};
    // top-p 0.9: .627, .873, .961 -> keep 3; min-p .2*.627=.125: keeps .627 and .245
    double z = q[0] + q[1];
    double want[NV] = {0, q[0] / z, 0, q[1] / z, 0, 0};
    expect(pr, want, NV, "combined");
    sd_sampler_free(s);
}

// Large vocabulary: top-k by partial selection and top-p by growing prefixes
// must agree with a brute-force reference.
static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_large_vocab(void) {
    enum { N = 50000 };
    float *l = malloc(N * sizeof(float)), *pr = malloc(N * sizeof(float)), *srt = malloc(N * sizeof(float));
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((x >> 40) % 100000) / 10000.0f; // 0..10, with ties
    }
    sd_sampler_params p = off();
    p.top_k = 100;
    sd_sampler *s = mk(&p, N);
    sd_sampler_probs(s, l, NULL, 0, pr);
    memcpy(srt, l, N * sizeof(float));
    qsort(srt, N, sizeof(float), cmp_desc);
    int nz = 0;
    double sum = 0;
    for (int i = 0; i < N; i++)
        if (pr[i] > 0) {
            nz++;
            sum += pr[i];
            CHECK(l[i] >= srt[99], "kept token %d below the 100th logit", i);
        }
    CHECK(nz == 100, "top-k 100 kept %d", nz);
    CHECK(fabs(sum - 1) < 1e-5, "sum %f", sum);
    sd_sampler_free(s);

    p = off();
    p.top_p = 0.5f;
    s = mk(&p, N);
    sd_sampler_probs(s, l, NULL, 0, pr);
    // reference: softmax, sort, count prefix
    double z = 0;
    for (int i = 0; i < N; i++) z += exp(srt[i] - srt[0]);
    double cum = 0;
    int want_n = 0;
    while (cum < 0.5 - 1e-6) cum += exp(srt[want_n++] - srt[0]) / z;
    nz = 0;
    for (int i = 0; i < N; i++) nz += pr[i] > 0;
    CHECK(abs(nz - want_n) <= 1, "top-p 0.5 kept %d, reference %d", nz, want_n);
    sd_sampler_free(s);
    free(l);
    free(pr);
    free(srt);
}

static void test_chi_square(void) {
    sd_sampler_params p = off();
    p.seed = 42;
    p.draw = SD_DRAW_REJECTION;   // sequential draws: every call a new one
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV], pr[NV];
    logw(W, l, NV);
    sd_sampler_probs(s, l, NULL, 0, pr);
    enum { DRAWS = 200000 };
    long cnt[NV] = {0};
    for (int i = 0; i < DRAWS; i++) cnt[sd_sampler_draw(s, pr)]++;
    double chi = 0;
    for (int i = 0; i < NV; i++) {
        double e = DRAWS * W[i];
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    // 5 degrees of freedom: P(chi2 > 20.5) = 0.001
    CHECK(chi < 20.5, "chi-square %.2f too large", chi);
    // the convenience call draws from the same distribution
    long cnt2[NV] = {0};
    for (int i = 0; i < DRAWS; i++) cnt2[sd_sampler_sample(s, l, NULL, 0)]++;
    chi = 0;
    for (int i = 0; i < NV; i++) {
        double e = DRAWS * W[i];
        chi += (cnt2[i] - e) * (cnt2[i] - e) / e;
    }
    CHECK(chi < 20.5, "sample: chi-square %.2f too large", chi);
    // uniform in [0, 1) with mean 1/2
    double m = 0;
    for (int i = 0; i < DRAWS; i++) {
        double u = sd_sampler_uniform(s);
        CHECK(u >= 0 && u < 1, "uniform %f", u);
        m += u;
    }
    m /= DRAWS;
    CHECK(fabs(m - 0.5) < 0.005, "uniform mean %f", m);
    sd_sampler_free(s);
}

static void test_determinism(void) {
    sd_sampler_params p = off();
    p.seed = 7;
    p.draw = SD_DRAW_REJECTION;
    sd_sampler *a = mk(&p, NV), *b = mk(&p, NV);
    if (!a || !b) return;
    float l[NV];
    logw(W, l, NV);
    int same = 1;
    int32_t first[64];
    for (int i = 0; i < 64; i++) {
        first[i] = sd_sampler_sample(a, l, NULL, 0);
        if (first[i] != sd_sampler_sample(b, l, NULL, 0)) same = 0;
    }
    CHECK(same, "two samplers with one seed differ");
    sd_sampler_reseed(a, 7);
    same = 1;
    for (int i = 0; i < 64; i++)
        if (sd_sampler_sample(a, l, NULL, 0) != first[i]) same = 0;
    CHECK(same, "reseed does not replay");
    sd_sampler_reseed(b, 8);
    int diff = 0;
    for (int i = 0; i < 64; i++)
        if (sd_sampler_sample(b, l, NULL, 0) != first[i]) diff = 1;
    CHECK(diff, "another seed gives the same 64 draws");
    CHECK(sd_sampler_get_params(a)->seed == 7, "params seed");
    sd_sampler_free(a);
    sd_sampler_free(b);
}

// Pearson chi-square of counts cnt[n] of N draws against probabilities w.
static double chi2_of(const long *cnt, const double *w, int n, long N) {
    double chi = 0;
    for (int i = 0; i < n; i++) {
        double e = (double)N * w[i];
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    return chi;
}

// The race draw is a sample of the final distribution: over many seeds at
// one position, over the positions of one seed, with truncation (top-k 3 of
// W: the kept three renormalised), and a pair of neighbouring positions is
// independent (noise indexed by anything but the position, e.g. the depth in
// a tree, would repeat or correlate neighbours).
static void test_race_chi_square(void) {
    sd_sampler_params p = off();
    CHECK(p.draw == SD_DRAW_RACE, "the race is the default draw (%d)", p.draw);
    sd_sampler *s = mk(&p, NV);
    if (!s) return;
    float l[NV];
    logw(W, l, NV);
    enum { N = 120000 };
    long cnt[NV] = {0}, cnt_pos[NV] = {0}, pair[NV * NV] = {0};
    for (long i = 0; i < N; i++) {
        sd_sampler_reseed(s, 1000 + (uint64_t)i);
        cnt[sd_sampler_sample(s, l, NULL, 17)]++;
    }
    double chi = chi2_of(cnt, W, NV, N);
    printf("  over %d seeds: chi2 %.2f (df 5, limit 20.5)\n", N, chi);
    CHECK(chi < 20.5, "race over seeds: chi-square %.2f too large", chi);
    sd_sampler_reseed(s, 5);
    int32_t prev = -1;
    for (long i = 0; i < N; i++) {
        int32_t t = sd_sampler_sample(s, l, NULL, (int)i);
        cnt_pos[t]++;
        if (prev >= 0) pair[prev * NV + t]++;
        prev = t;
    }
    chi = chi2_of(cnt_pos, W, NV, N);
    double wp[NV * NV];
    for (int a = 0; a < NV; a++)
        for (int b = 0; b < NV; b++) wp[a * NV + b] = W[a] * W[b];
    double chi_pair = chi2_of(pair, wp, NV * NV, N - 1);
    printf("  over %d positions: chi2 %.2f (df 5), neighbouring pairs chi2 %.2f (df 35, limit 66.6)\n", N, chi,
           chi_pair);
    CHECK(chi < 20.5, "race over positions: chi-square %.2f too large", chi);
    CHECK(chi_pair < 66.6, "race: neighbouring positions are not independent (chi2 %.2f)", chi_pair);
    sd_sampler_free(s);

    // truncation: top-k 3 keeps {1, 3, 4} with 0.4, 0.25, 0.15 of 0.8
    p.top_k = 3;
    s = mk(&p, NV);
    if (!s) return;
    long ck[NV] = {0};
    for (long i = 0; i < N; i++) {
        sd_sampler_reseed(s, 77 + (uint64_t)i * 3);
        ck[sd_sampler_sample(s, l, NULL, 3)]++;
    }
    const double wk[NV] = {0, 0.5, 0, 0.3125, 0.1875, 0};
    CHECK(ck[0] + ck[2] + ck[5] == 0, "race drew a truncated token");
    long c3[3] = {ck[1], ck[3], ck[4]};
    const double w3[3] = {wk[1], wk[3], wk[4]};
    chi = chi2_of(c3, w3, 3, N);
    CHECK(chi < 13.8, "race with top-k 3: chi-square %.2f too large (df 2)", chi);
    sd_sampler_free(s);
}

// A race draw depends on the seed, the position and the logits only: not on
// the calls before it, nor on the sampler object; the texts of a seed
// (sd_sampler_next_text) start again after a reseed and differ between them.
static void test_race_determinism(void) {
    sd_sampler_params p = off();
    p.seed = 7;
    sd_sampler *a = mk(&p, NV), *b = mk(&p, NV);
    if (!a || !b) return;
    float l[NV];
    logw(W, l, NV);
    int32_t first[64];
    int same = 1, varied = 0;
    for (int i = 0; i < 64; i++) first[i] = sd_sampler_sample(a, l, NULL, i);
    for (int i = 63; i >= 0; i--) same &= sd_sampler_sample(b, l, NULL, i) == first[i];   // backwards
    for (int i = 1; i < 64; i++) varied |= first[i] != first[0];
    CHECK(same, "one seed, one position: another token on another sampler or in another order");
    CHECK(varied, "64 positions gave one token");
    for (int i = 0; i < 64; i++) (void)sd_sampler_draw(a, (const float[NV]){0.1f, 0.2f, 0.3f, 0.1f, 0.2f, 0.1f});
    same = 1;
    for (int i = 0; i < 64; i++) same &= sd_sampler_sample(a, l, NULL, i) == first[i];
    CHECK(same, "sequential draws in between changed the race");
    // the key of the race's first text is the one sd_sampler_sample uses; texts differ
    uint64_t k0 = sd_sampler_next_text(a), k1 = sd_sampler_next_text(a);
    CHECK(k0 == sd_race_key(7, 0) && k1 == sd_race_key(7, 1) && k0 != k1, "texts' keys");
    int diff = 0;
    for (int i = 0; i < 64; i++) diff |= sd_sampler_sample(a, l, NULL, i) != first[i];
    CHECK(diff, "the second text drew the first's tokens");
    sd_sampler_reseed(a, 7);
    same = 1;
    for (int i = 0; i < 64; i++) same &= sd_sampler_race_sample(a, l, NULL, 0, sd_race_key(7, 0), i) == first[i];
    CHECK(same, "the explicit key gives other tokens");
    CHECK(sd_sampler_next_text(a) == k0, "reseed does not restart the texts");
    sd_sampler_reseed(b, 8);
    diff = 0;
    for (int i = 0; i < 64; i++) diff |= sd_sampler_sample(b, l, NULL, i) != first[i];
    CHECK(diff, "another seed gives the same 64 draws");
    // the race over a full row agrees with the sampler's over its candidates
    float pr[NV];
    sd_sampler_probs(a, l, NULL, 0, pr);
    same = 1;
    for (int i = 0; i < 64; i++) same &= sd_race_draw_row(sd_race_key(7, 0), i, pr, NV) == first[i];
    CHECK(same, "sd_race_draw_row differs from the sampler's race");
    // greedy ignores the draw
    p.temp = 0.0f;
    sd_sampler *g = mk(&p, NV);
    if (g) CHECK(sd_sampler_sample(g, l, NULL, 5) == 1, "greedy race sample");
    sd_sampler_free(g);
    sd_sampler_free(a);
    sd_sampler_free(b);
}

// sd_sampler_probs_support (a draft head's row over its draft vocabulary)
// gives bit for bit the row sd_sampler_probs gives for the full logits with
// -inf outside the support, whatever the settings; with a repetition
// penalty or ids out of order it takes the full path and still does.
static void test_probs_support(void) {
    enum { V = 3000, N = 700 };
    float *lsub = malloc(sizeof(float) * N), *full = malloc(sizeof(float) * V), *a = malloc(sizeof(float) * V),
          *b = malloc(sizeof(float) * V);
    int32_t ids[N], hist[64];
    uint64_t x = 99;
    for (int i = 0; i < N; i++) ids[i] = 4 * i + (i % 3);   // increasing, gaps
    for (int i = 0; i < 64; i++) hist[i] = i % 9 == 8 ? 2990 : ids[(i * 11) % 12];   // (the penalty's tokens)
    struct { float temp; int top_k; float top_p, min_p, pen; int k_small, swap; } cs[] = {
        {0.7f, 40, 0.95f, 0.05f, 1.0f, 0, 0}, {1.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0}, {1.3f, 0, 0.9f, 0.0f, 1.0f, 0, 0},
        {0.5f, 5, 1.0f, 0.1f, 1.0f, 0, 0},    {0.8f, 40, 0.95f, 0.05f, 1.0f, 1, 0}, {0.8f, 40, 0.95f, 0.05f, 1.3f, 0, 0},
        {0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 1}, {0.3f, 1000, 1.0f, 0.0f, 1.0f, 0, 0}, {0.2f, 1000, 0.99f, 0.0f, 1.0f, 0, 0},
        {0.25f, 2999, 1.0f, 0.0f, 1.0f, 0, 0}};
    for (size_t c = 0; a && b && lsub && full && c < sizeof cs / sizeof *cs; c++) {
        sd_sampler_params p = off();
        p.temp = cs[c].temp, p.top_k = cs[c].top_k, p.top_p = cs[c].top_p, p.min_p = cs[c].min_p;
        p.repeat_penalty = cs[c].pen;
        sd_sampler *s = mk(&p, V);
        const int n = cs[c].k_small ? 12 : N;   // fewer than top_k tokens
        for (int i = 0; i < N; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            lsub[i] = (float)((x >> 40) % 2000) / (c >= 7 ? 40.0f : 200.0f) - 5.0f;   // ties happen; c 7-9: wide
        }
        if (cs[c].swap) {   // ids out of order: the full path
            int32_t t = ids[3];
            ids[3] = ids[4], ids[4] = t;
        }
        for (int v = 0; v < V; v++) full[v] = -INFINITY;
        for (int i = 0; i < n; i++) full[ids[i]] = lsub[i];
        if (s) {
            sd_sampler_probs(s, full, hist, 64, a);
            sd_sampler_probs_support(s, lsub, ids, n, hist, 64, b);
            double sum = 0;
            for (int v = 0; v < V; v++) sum += b[v];
            CHECK(!memcmp(a, b, sizeof(float) * V) && fabs(sum - 1.0) < 1e-5,
                  "case %zu: the support row differs from the full row (sum %.6f)", c, sum);
        }
        if (cs[c].swap) {
            int32_t t = ids[3];
            ids[3] = ids[4], ids[4] = t;
        }
        sd_sampler_free(s);
    }
    free(lsub), free(full), free(a), free(b);
}

static void test_bad_params(void) {
    sd_sampler *s = NULL;
    char err[128] = "";
    sd_sampler_params p = off();
    CHECK(sd_sampler_new(&s, &p, 0, err, sizeof err) < 0 && s == NULL, "n_vocab 0 accepted");
    CHECK(err[0] != 0, "no message");
    p.repeat_penalty = 0.0f;
    CHECK(sd_sampler_new(&s, &p, 10, err, sizeof err) < 0, "repeat_penalty 0 accepted");
    p = off();
    p.draw = 2;
    CHECK(sd_sampler_new(&s, &p, 10, err, sizeof err) < 0 && strstr(err, "draw"), "draw 2 accepted: %s", err);
}

int main(void) {
    T_RUN(test_softmax_plain);
    T_RUN(test_temperature);
    T_RUN(test_greedy);
    T_RUN(test_top_k);
    T_RUN(test_top_k_ties);
    T_RUN(test_top_p);
    T_RUN(test_min_p);
    T_RUN(test_repeat_penalty);
    T_RUN(test_combined_order);
    T_RUN(test_large_vocab);
    T_RUN(test_chi_square);
    T_RUN(test_determinism);
    T_RUN(test_race_chi_square);
    T_RUN(test_race_determinism);
    T_RUN(test_probs_support);
    T_RUN(test_bad_params);
    T_EXIT();
}
