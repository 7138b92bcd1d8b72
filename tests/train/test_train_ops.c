// test_train_ops.c - the layers of head training (src/train/ops.h): the
// matrix products against their double-precision reference and bit for bit
// across thread counts; every backward against central finite differences
// (the linear layer, RMSNorm, RoPE, SwiGLU, SiLU, attention with EAGLE-3's
// training-time-test mask, soft cross-entropy) and every forward against
// its definition computed in double; the mask against the definition of
// docs/heads.md; and a deliberately wrong backward (the mask off by one)
// that the same check must reject.
//
// Finite differences. Each check perturbs one float of an input by +-eps
// (the step actually taken after rounding to float is used), evaluates the
// float forward, and reduces the output to one number in double: L = sum
// c * y with fixed random c (the backward gets dY = c), or the loss itself
// for the cross-entropy. An entry passes when |fd - grad| <= atol + rtol
// |grad| with rtol = 1e-2 and atol = 1e-3 max|grad| over the tensor:
// float rounding of L (about 1e-7 relative over ~100 terms) divided by
// 2 eps = 2e-2 gives ~1e-5 absolute, and the truncation error of the
// central difference is ~eps^2 / 6 = 2e-5 relative, both far inside the
// bar, while a wrong backward misses it by orders of magnitude (measured
// worst ratios are printed as "info").
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/threadpool.h"
#include "t.h"
#include "train/ops.h"

static sd_rng g_rng;

static float urand(void) { return (float)(2.0 * sd_rng_uniform(&g_rng) - 1.0); }
static void fill(float *x, size_t n, float a) {
    for (size_t i = 0; i < n; i++) x[i] = a * urand();
}
static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static double dotd(const float *c, const float *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)c[i] * y[i];
    return s;
}

// ---------------------------------------------------------------- finite differences

typedef double (*obj_fn)(void *st);

#define FD_RTOL 1e-2
#define FD_ATOL 1e-3
#define FD_EPS 1e-2f

// Worst |fd - grad| / (atol + rtol |grad|) over n_pick random entries of
// param (n floats; grad its analytic gradient). Entries are perturbed in
// place and restored.
static double fd_worst(obj_fn f, void *st, float *param, const float *grad, int n, int n_pick) {
    double gmax = 0;
    for (int i = 0; i < n; i++) gmax = fmax(gmax, fabs(grad[i]));
    double worst = 0;
    for (int t = 0; t < n_pick; t++) {
        int i = n_pick >= n ? t : (int)(sd_rng_next(&g_rng) % (uint64_t)n);
        if (i >= n) break;
        const float p0 = param[i];
        param[i] = p0 + FD_EPS;
        const double hp = (double)param[i] - p0, lp = f(st);
        param[i] = p0 - FD_EPS;
        const double hm = p0 - (double)param[i], lm = f(st);
        param[i] = p0;
        const double fd = (lp - lm) / (hp + hm);
        const double r = fabs(fd - grad[i]) / (FD_ATOL * gmax + FD_RTOL * fabs(grad[i]) + 1e-30);
        if (!(r <= worst)) worst = r;   // NaN sticks
    }
    return worst;
}

#define FD_CHECK(f, st, param, grad, n, what)                                           \
    do {                                                                                \
        double w_ = fd_worst(f, st, param, grad, n, 40);                                \
        CHECK(w_ <= 1.0, "%s: worst |fd - grad| / bar = %.3g > 1", what, w_);          \
        printf("  info: %-28s worst |fd - grad| / bar %.3g\n", what, w_);               \
    } while (0)

// ---------------------------------------------------------------- matrix products

// Products of every operand layout the layers use, thread counts 1, 2 and 3
// bitwise equal, within 2e-6 * sum_k |a b| of the double reference (float
// fused chains over at most KC terms, plus one rounding per block).
static void test_gemm_vs_ref(void) {
    sd_pool *p2 = sd_pool_new(2), *p3 = sd_pool_new(3);
    sd_tr_ctx c1, c2, c3;
    char err[128];
    CHECK(p2 && p3 && sd_tr_ctx_init(&c1, NULL, err, sizeof err) == 0 && sd_tr_ctx_init(&c2, p2, err, sizeof err) == 0 &&
              sd_tr_ctx_init(&c3, p3, err, sizeof err) == 0,
          "setup");
    static const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {6, 16, 256}, {7, 17, 257}, {13, 33, 600},
                                    {100, 40, 31}, {3, 2100, 70}, {200, 50, 520}, {97, 300, 64}, {300, 37, 333},
                                    {270, 48, 41}};
    int n_bad = 0;
    double worst = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int layout = 0; layout < 4; layout++) {
            // 0: A, B row-major; 1: B transposed (forward); 2: A transposed (dW); 3: both
            const long rsa = layout & 2 ? 1 : K, csa = layout & 2 ? M : 1;
            const long rsb = layout & 1 ? 1 : N, csb = layout & 1 ? K : 1;
            float *A = falloc((size_t)M * K), *B = falloc((size_t)K * N), *C0 = falloc((size_t)M * N);
            float *Cr = falloc((size_t)M * N), *C[3], *Aabs = falloc((size_t)M * K), *Babs = falloc((size_t)K * N);
            fill(A, (size_t)M * K, 1.0f);
            fill(B, (size_t)K * N, 1.0f);
            fill(C0, (size_t)M * N, 1.0f);
            for (size_t i = 0; i < (size_t)M * K; i++) Aabs[i] = fabsf(A[i]);
            for (size_t i = 0; i < (size_t)K * N; i++) Babs[i] = fabsf(B[i]);
            for (int acc = 0; acc < 2; acc++) {
                const sd_tr_ctx *cs[3] = {&c1, &c2, &c3};
                for (int t = 0; t < 3; t++) {
                    C[t] = falloc((size_t)M * N);
                    memcpy(C[t], C0, sizeof(float) * (size_t)M * N);
                    sd_tr_gemm(cs[t], M, N, K, A, rsa, csa, B, rsb, csb, C[t], N, acc);
                }
                memcpy(Cr, C0, sizeof(float) * (size_t)M * N);
                sd_tr_gemm_ref(M, N, K, A, rsa, csa, B, rsb, csb, Cr, N, acc);
                float *mag = falloc((size_t)M * N);
                sd_tr_gemm_ref(M, N, K, Aabs, rsa, csa, Babs, rsb, csb, mag, N, 0);
                for (size_t i = 0; i < (size_t)M * N; i++) {
                    const double e = fabs((double)C[0][i] - Cr[i]) / (mag[i] + (acc ? fabsf(C0[i]) : 0) + 1e-30);
                    if (!(e <= 2e-6)) n_bad++;
                    if (e > worst) worst = e;
                }
                CHECK(!memcmp(C[0], C[1], sizeof(float) * (size_t)M * N) &&
                          !memcmp(C[0], C[2], sizeof(float) * (size_t)M * N),
                      "%dx%dx%d layout %d acc %d: thread counts give different bits", M, N, K, layout, acc);
                for (int t = 0; t < 3; t++) free(C[t]);
                free(mag);
            }
            free(A);
            free(B);
            free(C0);
            free(Cr);
            free(Aabs);
            free(Babs);
        }
    }
    CHECK(n_bad == 0, "%d elements off the reference by more than 2e-6 relative (worst %.3g)", n_bad, worst);
    printf("  info: worst |C - ref| / sum|a b| = %.3g\n", worst);
    sd_tr_ctx_free(&c1);
    sd_tr_ctx_free(&c2);
    sd_tr_ctx_free(&c3);
    sd_pool_free(p2);
    sd_pool_free(p3);
}

// ---------------------------------------------------------------- linear

typedef struct lin_st {
    const sd_tr_ctx *ctx;
    int n, in, out;
    float *X, *W, *Y, *c;
} lin_st;

static double lin_obj(void *p) {
    lin_st *s = p;
    sd_tr_linear(s->ctx, s->n, s->in, s->out, s->X, s->W, s->Y, 0);
    return dotd(s->c, s->Y, (size_t)s->n * s->out);
}

static void test_fd_linear(void) {
    sd_tr_ctx ctx;
    char err[128];
    sd_tr_ctx_init(&ctx, NULL, err, sizeof err);
    lin_st s = {.ctx = &ctx, .n = 7, .in = 19, .out = 11};
    s.X = falloc(7 * 19);
    s.W = falloc(11 * 19);
    s.Y = falloc(7 * 11);
    s.c = falloc(7 * 11);
    float *dX = falloc(7 * 19), *dW = falloc(11 * 19);
    fill(s.X, 7 * 19, 1);
    fill(s.W, 11 * 19, 0.3f);
    fill(s.c, 7 * 11, 1);
    sd_tr_linear_dx(&ctx, 7, 19, 11, s.c, s.W, dX);
    sd_tr_linear_dw(&ctx, 7, 19, 11, s.c, s.X, dW);
    FD_CHECK(lin_obj, &s, s.X, dX, 7 * 19, "linear dX");
    FD_CHECK(lin_obj, &s, s.W, dW, 11 * 19, "linear dW");
    free(s.X), free(s.W), free(s.Y), free(s.c), free(dX), free(dW);
    sd_tr_ctx_free(&ctx);
}

// ---------------------------------------------------------------- RMSNorm

typedef struct norm_st {
    int n, d;
    float *X, *g, *Y, *r, *c;
} norm_st;

static double norm_obj(void *p) {
    norm_st *s = p;
    sd_tr_rmsnorm(s->n, s->d, s->X, s->g, 1e-5f, s->Y, s->r);
    return dotd(s->c, s->Y, (size_t)s->n * s->d);
}

static void test_fd_rmsnorm(void) {
    const int n = 5, d = 21;   // d not a multiple of the vector width: tails too
    norm_st s = {.n = n, .d = d, .X = falloc(n * d), .g = falloc(d), .Y = falloc(n * d), .r = falloc(n),
                 .c = falloc(n * d)};
    float *dX = falloc(n * d), *dg = falloc(d);
    fill(s.X, n * d, 1);
    for (int i = 0; i < d; i++) s.g[i] = 1.0f + 0.5f * urand();
    fill(s.c, n * d, 1);
    norm_obj(&s);
    double e = 0;   // the forward against its definition, in double
    for (int r = 0; r < n; r++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)s.X[r * d + i] * s.X[r * d + i];
        const double rs = 1.0 / sqrt(ss / d + 1e-5);
        for (int i = 0; i < d; i++) e = fmax(e, fabs(s.Y[r * d + i] - s.X[r * d + i] * rs * s.g[i]));
    }
    CHECK(e < 1e-5, "rmsnorm differs from x / rms(x) * g by %g", e);
    sd_tr_rmsnorm_bwd(n, d, s.X, s.g, s.r, s.c, dX, dg);
    FD_CHECK(norm_obj, &s, s.X, dX, n * d, "rmsnorm dX");
    FD_CHECK(norm_obj, &s, s.g, dg, d, "rmsnorm dgain");
    free(s.X), free(s.g), free(s.Y), free(s.r), free(s.c), free(dX), free(dg);
}

// ---------------------------------------------------------------- RoPE

typedef struct rope_st {
    int n, nh, hd, neox;
    const int32_t *pos;
    const float *cs;
    float *X, *Y, *c;
} rope_st;

static double rope_obj(void *p) {
    rope_st *s = p;
    memcpy(s->Y, s->X, sizeof(float) * (size_t)s->n * s->nh * s->hd);
    sd_tr_rope(s->n, s->nh, s->hd, s->pos, s->cs, s->Y, 0, s->neox);
    return dotd(s->c, s->Y, (size_t)s->n * s->nh * s->hd);
}

// RoPE against its definition (pairs (2i, 2i+1), or (i, i + hd/2) for NEOX;
// theta_i = base^(-2i/hd)), its inverse, and the backward (the inverse
// applied to dY), for both pairings.
static void test_fd_rope(void) {
    const int n = 4, nh = 2, hd = 8, N = n * nh * hd;
    int32_t pos[4] = {3, 0, 7, 5};
    float cs[8 * 4 * 2];
    sd_tr_rope_table(cs, 8, hd, 10000.0f);
    for (int neox = 0; neox < 2; neox++) {
        rope_st s = {.n = n, .nh = nh, .hd = hd, .neox = neox, .pos = pos, .cs = cs, .X = falloc(N), .Y = falloc(N),
                     .c = falloc(N)};
        fill(s.X, N, 1);
        fill(s.c, N, 1);
        rope_obj(&s);
        double err = 0;
        const int ia = neox ? 1 : 2, ib = neox ? hd / 2 : 1;
        for (int r = 0; r < n; r++)
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < hd / 2; i++) {
                    const double th = pos[r] * pow(10000.0, -2.0 * i / hd);
                    const float *x = s.X + (r * nh + h) * hd + ia * i, *y = s.Y + (r * nh + h) * hd + ia * i;
                    err = fmax(err, fabs(y[0] - (x[0] * cos(th) - x[ib] * sin(th))));
                    err = fmax(err, fabs(y[ib] - (x[0] * sin(th) + x[ib] * cos(th))));
                }
        CHECK(err < 1e-5, "RoPE (neox %d) differs from its definition by %g", neox, err);
        float *back = falloc(N);
        memcpy(back, s.Y, sizeof(float) * N);
        sd_tr_rope(n, nh, hd, pos, cs, back, 1, neox);
        double e2 = 0;
        for (int i = 0; i < N; i++) e2 = fmax(e2, fabs(back[i] - s.X[i]));
        CHECK(e2 < 1e-5, "inverse RoPE (neox %d) does not undo RoPE (%g)", neox, e2);
        float *dX = falloc(N);
        memcpy(dX, s.c, sizeof(float) * N);
        sd_tr_rope(n, nh, hd, pos, cs, dX, 1, neox);
        FD_CHECK(rope_obj, &s, s.X, dX, N, neox ? "rope dX (neox)" : "rope dX");
        free(s.X), free(s.Y), free(s.c), free(back), free(dX);
    }
}

// ---------------------------------------------------------------- SwiGLU, SiLU

typedef struct glu_st {
    int n;
    float *G, *U, *S, *c;
} glu_st;

static double glu_obj(void *p) {
    glu_st *s = p;
    sd_tr_swiglu((size_t)s->n, s->G, s->U, s->S);
    return dotd(s->c, s->S, (size_t)s->n);
}

static double silu_obj(void *p) {
    glu_st *s = p;
    sd_tr_silu((size_t)s->n, s->G, s->S);
    return dotd(s->c, s->S, (size_t)s->n);
}

static void test_fd_swiglu(void) {
    const int n = 45;
    glu_st s = {.n = n, .G = falloc(n), .U = falloc(n), .S = falloc(n), .c = falloc(n)};
    fill(s.G, n, 4);
    fill(s.U, n, 1);
    fill(s.c, n, 1);
    float *dG = falloc(n), *dU = falloc(n), *dX = falloc(n);
    sd_tr_swiglu_bwd(n, s.G, s.U, s.c, dG, dU);
    FD_CHECK(glu_obj, &s, s.G, dG, n, "swiglu dgate");
    FD_CHECK(glu_obj, &s, s.U, dU, n, "swiglu dup");
    double e = 0;   // the vector lanes and the scalar tail agree with the definition
    glu_obj(&s);
    for (int i = 0; i < n; i++) e = fmax(e, fabs(s.S[i] - s.G[i] / (1 + exp(-s.G[i])) * s.U[i]));
    CHECK(e < 1e-5, "swiglu differs from silu(g) u by %g", e);
    silu_obj(&s);
    e = 0;
    for (int i = 0; i < n; i++) e = fmax(e, fabs(s.S[i] - s.G[i] / (1 + exp(-s.G[i]))));
    CHECK(e < 1e-5, "silu differs from x sigmoid(x) by %g", e);
    sd_tr_silu_bwd(n, s.G, s.c, dX);
    FD_CHECK(silu_obj, &s, s.G, dX, n, "silu dX");
    free(s.G), free(s.U), free(s.S), free(s.c), free(dG), free(dU), free(dX);
}

// ---------------------------------------------------------------- attention

// The training-time-test mask against docs/heads.md's words: step k, row j
// (j = 1..T-1-k) sees step 0's rows 1..j and row j of steps 1..k, nothing
// else; and the transpose lists exactly the same pairs.
static void test_ttt_mask(void) {
    const int T = 9, K = 4;
    int32_t q_off[16], q_key[256], k_off[64], k_ent[256], k_q[256];
    for (int k = 0; k < K; k++) {
        const int n = sd_tr_mask_ttt(T, k, q_off, q_key), nq = sd_tr_ttt_rows(T, k), nk = sd_tr_ttt_off(T, k + 1);
        int bad = 0;
        for (int r = 0; r < nq; r++) {
            const int j = r + 1;
            uint8_t seen[64] = {0};
            for (int e = q_off[r]; e < q_off[r + 1]; e++) {
                if (q_key[e] < 0 || q_key[e] >= nk || seen[q_key[e]]) bad++;
                else seen[q_key[e]] = 1;
            }
            for (int g = 0; g < nk; g++) {   // global row g is (step s, row jj)
                int s = 0;
                while (g >= sd_tr_ttt_off(T, s + 1)) s++;
                const int jj = g - sd_tr_ttt_off(T, s) + 1;
                const int allowed = (s == 0 && jj <= j) || (s >= 1 && s <= k && jj == j);
                if (allowed != seen[g]) bad++;
            }
        }
        CHECK(bad == 0 && n == q_off[nq], "step %d: %d wrong entries", k, bad);
        sd_tr_mask m = {.n_q = nq, .n_k = nk, .q_off = q_off, .q_key = q_key};
        sd_tr_mask_transpose(&m, k_off, k_ent, k_q);
        int tbad = k_off[nk] != n;
        for (int jk = 0; jk < nk; jk++)
            for (int x = k_off[jk]; x < k_off[jk + 1]; x++) {
                const int e = k_ent[x];
                if (q_key[e] != jk || e < q_off[k_q[x]] || e >= q_off[k_q[x] + 1] || (x > k_off[jk] && e <= k_ent[x - 1]))
                    tbad++;
            }
        CHECK(tbad == 0, "step %d: transpose has %d wrong entries", k, tbad);
    }
}

typedef struct attn_st {
    const sd_tr_ctx *ctx;
    sd_tr_mask m;
    int nh, nkv, hd;
    float *Q, *K, *V, *O, *P, *c;
} attn_st;

static double attn_obj(void *p) {
    attn_st *s = p;
    sd_tr_attn(s->ctx, &s->m, s->nh, s->nkv, s->hd, s->Q, s->K, s->V, s->O, s->P);
    return dotd(s->c, s->O, (size_t)s->m.n_q * s->nh * s->hd);
}

// Attention under step k's training-time-test mask (T = 6, K = 3, 2 heads,
// 1 KV head, head size 8): dQ, dK, dV against finite differences. With
// bad_mask the backward runs with each query's causal keys moved by one
// row (the mask off by one): the check must then fail.
static double attn_case(int k, int bad_mask, int verbose) {
    const int T = 6, nh = 2, nkv = 1, hd = 8;
    sd_tr_ctx ctx;
    char err[128];
    sd_tr_ctx_init(&ctx, NULL, err, sizeof err);
    int32_t q_off[8], q_key[64], k_off[32], k_ent[64], k_q[64], bq_key[64], bk_off[32], bk_ent[64], bk_q[64];
    attn_st s = {.ctx = &ctx, .nh = nh, .nkv = nkv, .hd = hd};
    const int nnz = sd_tr_mask_ttt(T, k, q_off, q_key);
    s.m = (sd_tr_mask){.n_q = sd_tr_ttt_rows(T, k), .n_k = sd_tr_ttt_off(T, k + 1), .q_off = q_off, .q_key = q_key};
    sd_tr_mask_transpose(&s.m, k_off, k_ent, k_q);
    const int nq = s.m.n_q, nk = s.m.n_k;
    s.Q = falloc(nq * nh * hd), s.K = falloc(nk * nkv * hd), s.V = falloc(nk * nkv * hd);
    s.O = falloc(nq * nh * hd), s.P = falloc(nh * nnz), s.c = falloc(nq * nh * hd);
    fill(s.Q, nq * nh * hd, 1.5f);
    fill(s.K, nk * nkv * hd, 1.5f);
    fill(s.V, nk * nkv * hd, 1);
    fill(s.c, nq * nh * hd, 1);
    float *dQ = falloc(nq * nh * hd), *dK = falloc(nk * nkv * hd), *dV = falloc(nk * nkv * hd), *dS = falloc(nh * nnz);
    attn_obj(&s);
    if (!bad_mask) {   // the forward against a dense reference in double: mask[i][j] from docs/heads.md
        double e = 0;
        for (int i = 0; i < nq; i++)
            for (int h = 0; h < nh; h++) {
                double sc[32], mx = -1e300, z = 0;
                int ok[32] = {0};
                for (int e2 = q_off[i]; e2 < q_off[i + 1]; e2++) ok[q_key[e2]] = 1;
                for (int j = 0; j < nk; j++) {
                    if (!ok[j]) continue;
                    double dd = 0;
                    for (int c = 0; c < hd; c++) dd += (double)s.Q[(i * nh + h) * hd + c] * s.K[(j * nkv + h / (nh / nkv)) * hd + c];
                    sc[j] = dd / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j < nk; j++) z += ok[j] ? exp(sc[j] - mx) : 0;
                for (int c = 0; c < hd; c++) {
                    double o = 0;
                    for (int j = 0; j < nk; j++)
                        if (ok[j]) o += exp(sc[j] - mx) / z * s.V[(j * nkv + h / (nh / nkv)) * hd + c];
                    e = fmax(e, fabs(o - s.O[(i * nh + h) * hd + c]));
                }
            }
        CHECK(e < 1e-5, "step %d: attention differs from the dense reference by %g", k, e);
    }
    sd_tr_mask mb = s.m;
    if (bad_mask) {
        memcpy(bq_key, q_key, sizeof(int32_t) * nnz);
        for (int r = 0; r < nq; r++)
            for (int e = q_off[r]; e <= q_off[r] + r; e++) bq_key[e] = q_key[e] + 1;   // rows 2..j+1
        mb.q_key = bq_key;
        sd_tr_mask_transpose(&mb, bk_off, bk_ent, bk_q);
    }
    sd_tr_attn_bwd(&ctx, &mb, nh, nkv, hd, s.Q, s.K, s.V, s.P, s.c, dQ, dK, dV, dS);
    double w = 0;
    const char *nm[3] = {"attention dQ", "attention dK", "attention dV"};
    float *par[3] = {s.Q, s.K, s.V}, *gr[3] = {dQ, dK, dV};
    const int cnt[3] = {nq * nh * hd, nk * nkv * hd, nk * nkv * hd};
    for (int t = 0; t < 3; t++) {
        const double wt = fd_worst(attn_obj, &s, par[t], gr[t], cnt[t], 60);
        if (verbose) printf("  info: step %d %-20s worst |fd - grad| / bar %.3g\n", k, nm[t], wt);
        if (!(wt <= w)) w = wt;
    }
    free(s.Q), free(s.K), free(s.V), free(s.O), free(s.P), free(s.c), free(dQ), free(dK), free(dV), free(dS);
    sd_tr_ctx_free(&ctx);
    return w;
}

static void test_fd_attention_ttt(void) {
    for (int k = 0; k < 3; k++) {
        const double w = attn_case(k, 0, 1);
        CHECK(w <= 1.0, "step %d: worst |fd - grad| / bar = %.3g > 1", k, w);
    }
}

// The deliberately wrong backward: the same check must reject it.
static void test_fd_catches_wrong_mask(void) {
    for (int k = 1; k < 3; k++) {
        const double w = attn_case(k, 1, 0);
        printf("  info: step %d with the mask off by one in the backward: worst ratio %.3g\n", k, w);
        CHECK(w > 10.0, "step %d: a backward with the mask off by one passed (worst ratio %.3g)", k, w);
    }
}

// Attention with threads gives the bits of one thread.
static void test_attention_threads(void) {
    const int T = 64, k = 2, nh = 4, nkv = 2, hd = 16;   // 2 nnz nh hd = 2.6e5: enough for the pool
    sd_pool *p2 = sd_pool_new(2);
    sd_tr_ctx c1, c2;
    char err[128];
    sd_tr_ctx_init(&c1, NULL, err, sizeof err);
    sd_tr_ctx_init(&c2, p2, err, sizeof err);
    const int nq = sd_tr_ttt_rows(T, k), nk = sd_tr_ttt_off(T, k + 1);
    int32_t *q_off = malloc(sizeof(int32_t) * (nq + 1)), *q_key = malloc(sizeof(int32_t) * nq * (nq + k));
    int32_t *k_off = malloc(sizeof(int32_t) * (nk + 1)), *k_ent = malloc(sizeof(int32_t) * nq * (nq + k));
    int32_t *k_q = malloc(sizeof(int32_t) * nq * (nq + k));
    const int nnz = sd_tr_mask_ttt(T, k, q_off, q_key);
    sd_tr_mask m = {.n_q = nq, .n_k = nk, .q_off = q_off, .q_key = q_key};
    sd_tr_mask_transpose(&m, k_off, k_ent, k_q);
    float *Q = falloc(nq * nh * hd), *K = falloc(nk * nkv * hd), *V = falloc(nk * nkv * hd), *dO = falloc(nq * nh * hd);
    fill(Q, nq * nh * hd, 1), fill(K, nk * nkv * hd, 1), fill(V, nk * nkv * hd, 1), fill(dO, nq * nh * hd, 1);
    float *out[2][5];
    const sd_tr_ctx *cs[2] = {&c1, &c2};
    for (int t = 0; t < 2; t++) {
        float *O = falloc(nq * nh * hd), *P = falloc(nh * nnz), *dQ = falloc(nq * nh * hd);
        float *dK = falloc(nk * nkv * hd), *dV = falloc(nk * nkv * hd), *dS = falloc(nh * nnz);
        sd_tr_attn(cs[t], &m, nh, nkv, hd, Q, K, V, O, P);
        sd_tr_attn_bwd(cs[t], &m, nh, nkv, hd, Q, K, V, P, dO, dQ, dK, dV, dS);
        out[t][0] = O, out[t][1] = P, out[t][2] = dQ, out[t][3] = dK, out[t][4] = dV;
        free(dS);
    }
    const size_t sz[5] = {(size_t)nq * nh * hd, (size_t)nh * nnz, (size_t)nq * nh * hd, (size_t)nk * nkv * hd,
                          (size_t)nk * nkv * hd};
    for (int i = 0; i < 5; i++) {
        CHECK(!memcmp(out[0][i], out[1][i], sz[i] * sizeof(float)), "output %d differs between 1 and 2 threads", i);
        free(out[0][i]), free(out[1][i]);
    }
    free(q_off), free(q_key), free(k_off), free(k_ent), free(k_q), free(Q), free(K), free(V), free(dO);
    sd_tr_ctx_free(&c1);
    sd_tr_ctx_free(&c2);
    sd_pool_free(p2);
}

// ---------------------------------------------------------------- soft cross-entropy

typedef struct xent_st {
    const sd_tr_ctx *ctx;
    int n, V, nt;
    float *L, *tp, *lr;
    int32_t *tid;
} xent_st;

static double xent_obj(void *p) {
    xent_st *s = p;
    return sd_tr_softxent(s->ctx, s->n, s->V, s->L, s->tid, s->tp, s->nt, 1.0f, NULL, s->lr, NULL, NULL);
}

// Rows of 24 classes against sparse targets (unused entries, unnormalised
// masses, one row with no mass): the loss is the cross-entropy of the
// renormalised target (checked against a direct double computation), the
// gradient passes finite differences, the empty row is skipped with a zero
// gradient, argmax is the first largest logit.
static void test_fd_softxent(void) {
    sd_tr_ctx ctx;
    char err[128];
    sd_tr_ctx_init(&ctx, NULL, err, sizeof err);
    const int n = 4, V = 24, nt = 3;
    xent_st s = {.ctx = &ctx, .n = n, .V = V, .nt = nt, .L = falloc(n * V), .tp = falloc(n * nt), .lr = falloc(n)};
    s.tid = malloc(sizeof(int32_t) * n * nt);
    fill(s.L, n * V, 3);
    int32_t ids[4][3] = {{5, 17, -1}, {0, 23, 9}, {-1, -1, -1}, {11, 3, 7}};
    float ps[4][3] = {{0.5f, 0.2f, 0.3f}, {0.6f, 0.3f, 0.1f}, {1, 0, 0}, {0.9f, 0.05f, 0.0f}};
    memcpy(s.tid, ids, sizeof ids);
    memcpy(s.tp, ps, sizeof ps);
    s.L[1 * V + 4] = s.L[1 * V + 9] = 10.0f;   // a tie: argmax is the first
    float *dL = falloc(n * V);
    int32_t am[4];
    int ns = 0;
    const double loss = sd_tr_softxent(&ctx, n, V, s.L, s.tid, s.tp, nt, 1.0f, dL, s.lr, am, &ns);
    double want = 0;
    for (int r = 0; r < n; r++) {
        double mx = -1e30, se = 0, mass = 0, dot = 0;
        for (int c = 0; c < V; c++) mx = fmax(mx, s.L[r * V + c]);
        for (int c = 0; c < V; c++) se += exp(s.L[r * V + c] - mx);
        for (int i = 0; i < nt; i++)
            if (ids[r][i] >= 0 && ps[r][i] > 0) mass += ps[r][i], dot += ps[r][i] * s.L[r * V + ids[r][i]];
        if (mass > 0) want += mx + log(se) - dot / mass;
    }
    CHECK(ns == 3 && s.lr[2] == -1.0f, "scored %d rows (want 3), empty row's loss %g", ns, s.lr[2]);
    CHECK(fabs(loss - want) < 1e-5 * fabs(want), "loss %.8g, direct %.8g", loss, want);
    CHECK(am[1] == 4, "argmax of a tie: %d, want 4", am[1]);
    int nz = 0;
    for (int c = 0; c < V; c++) nz += dL[2 * V + c] != 0.0f;
    CHECK(nz == 0, "the skipped row has %d nonzero gradients", nz);
    FD_CHECK(xent_obj, &s, s.L, dL, n * V, "soft xent dlogits");
    // In place, with a weight: w times the same gradient.
    float *L2 = falloc(n * V), lr2[4];
    memcpy(L2, s.L, sizeof(float) * n * V);
    sd_tr_softxent(&ctx, n, V, L2, s.tid, s.tp, nt, 0.25f, L2, lr2, NULL, NULL);
    double e = 0;
    for (int i = 0; i < n * V; i++) e = fmax(e, fabs(L2[i] - 0.25f * dL[i]));
    CHECK(e < 1e-6, "in place with weight 0.25: off by %g", e);
    free(s.L), free(s.tp), free(s.lr), free(s.tid), free(dL), free(L2);
    sd_tr_ctx_free(&ctx);
}

// The cross-entropy split over rows among 2 threads gives one thread's bits
// (64 rows of 1000 classes: enough for the pool).
static void test_softxent_threads(void) {
    const int n = 64, V = 1000, nt = 4;
    sd_pool *p2 = sd_pool_new(2);
    sd_tr_ctx c1, c2;
    char err[128];
    sd_tr_ctx_init(&c1, NULL, err, sizeof err);
    sd_tr_ctx_init(&c2, p2, err, sizeof err);
    float *L = falloc((size_t)n * V), *tp = falloc(n * nt), *d1 = falloc((size_t)n * V), *d2 = falloc((size_t)n * V);
    float l1[64], l2[64];
    int32_t tid[64 * 4], a1[64], a2[64];
    fill(L, (size_t)n * V, 4);
    for (int i = 0; i < n * nt; i++) tid[i] = (int32_t)(sd_rng_next(&g_rng) % V), tp[i] = 0.25f;
    const double s1 = sd_tr_softxent(&c1, n, V, L, tid, tp, nt, 0.5f, d1, l1, a1, NULL);
    const double s2 = sd_tr_softxent(&c2, n, V, L, tid, tp, nt, 0.5f, d2, l2, a2, NULL);
    CHECK(s1 == s2 && !memcmp(d1, d2, sizeof(float) * (size_t)n * V) && !memcmp(a1, a2, sizeof a1),
          "2 threads give other bits than one");
    free(L), free(tp), free(d1), free(d2);
    sd_tr_ctx_free(&c1);
    sd_tr_ctx_free(&c2);
    sd_pool_free(p2);
}

int main(void) {
    sd_rng_seed(&g_rng, 20240611);
    T_RUN(test_gemm_vs_ref);
    T_RUN(test_fd_linear);
    T_RUN(test_fd_rmsnorm);
    T_RUN(test_fd_rope);
    T_RUN(test_fd_swiglu);
    T_RUN(test_ttt_mask);
    T_RUN(test_fd_attention_ttt);
    T_RUN(test_fd_catches_wrong_mask);
    T_RUN(test_attention_threads);
    T_RUN(test_fd_softxent);
    T_RUN(test_softxent_threads);
    T_EXIT();
}
