// test_quant_legacy.c - tensor types: traits table, reference quantization, the
// optimized dots and tile kernels against the scalar references (rule 11),
// and the half-precision conversions.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "lib/quant_check.h"
#include "kernels/matmul.h"
#include "t.h"
#include "kernels/threadpool.h"

#ifdef __F16C__
#include <immintrin.h>
#endif

sd_from_float_fn sd_quant_act_quantizer(int t); // quant.c (internal)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_uniform(void) { return (float)rnd_u32() / 4294967296.0f; } // [0, 1)
static float rnd_sym(void) { return 2.0f * rnd_uniform() - 1.0f; }

// n floats in blocks of 32 with a random scale per block (2^-6 .. 2^4) and,
// sometimes, an offset, so min/max quantizers see asymmetric blocks.
static void fill_random(float *x, int64_t n) {
    for (int64_t b = 0; b < n; b += 32) {
        float scale = ldexpf(1.0f, (int)(rnd_u32() % 11) - 6);
        float off = (rnd_u32() % 3 == 0) ? scale * rnd_sym() : 0.0f;
        for (int64_t j = b; j < b + 32 && j < n; j++) x[j] = off + scale * rnd_sym();
    }
}

static const int my_types[] = {SD_TYPE_F32, SD_TYPE_F16, SD_TYPE_BF16, SD_TYPE_Q4_0,
                               SD_TYPE_Q4_1, SD_TYPE_Q5_0, SD_TYPE_Q5_1, SD_TYPE_Q8_0};
#define N_MY_TYPES (int)(sizeof my_types / sizeof *my_types)

// Largest error of a round trip, as a fraction of the block's largest
// magnitude (float types: relative per element).
static double rt_tol(int t) {
    switch (t) {
    case SD_TYPE_F32: return 0;
    case SD_TYPE_F16: return 1.0 / 2048;
    case SD_TYPE_BF16: return 1.0 / 256;
    case SD_TYPE_Q4_0: return 0.5 / 8 * 2 + 0.01; // clamp at +7: up to one step
    case SD_TYPE_Q4_1: return 2.0 / 15 / 2 + 0.01;
    case SD_TYPE_Q5_0: return 1.0 / 16 + 0.01;
    case SD_TYPE_Q5_1: return 2.0 / 31 / 2 + 0.01;
    case SD_TYPE_Q8_0: return 0.5 / 127 + 0.001;
    case SD_TYPE_Q8_1: return 0.5 / 127 + 0.0001;
    default: return 1;
    }
}

static void test_traits(void) {
    struct { int t; const char *name; int blck; size_t tsize; int sup; } want[] = {
        {SD_TYPE_F32, "F32", 1, 4, 1},       {SD_TYPE_F16, "F16", 1, 2, 1},       {SD_TYPE_BF16, "BF16", 1, 2, 1},
        {SD_TYPE_Q4_0, "Q4_0", 32, 18, 1},   {SD_TYPE_Q4_1, "Q4_1", 32, 20, 1},   {SD_TYPE_Q5_0, "Q5_0", 32, 22, 1},
        {SD_TYPE_Q5_1, "Q5_1", 32, 24, 1},   {SD_TYPE_Q8_0, "Q8_0", 32, 34, 1},   {SD_TYPE_Q8_1, "Q8_1", 32, 40, 0},
        {SD_TYPE_Q4_K, "Q4_K", 256, 144, 1}, {SD_TYPE_Q5_K, "Q5_K", 256, 176, 1}, {SD_TYPE_Q6_K, "Q6_K", 256, 210, 1},
        {SD_TYPE_Q8_K, "Q8_K", 256, 292, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const sd_type_traits *tr = sd_type_get(want[i].t);
        CHECK(tr != NULL, "type %d", want[i].t);
        if (!tr) continue;
        CHECK(tr->name && strcmp(tr->name, want[i].name) == 0, "name of %d", want[i].t);
        CHECK(tr->blck == want[i].blck && tr->tsize == want[i].tsize, "%s: blck %d tsize %zu", want[i].name,
              tr->blck, tr->tsize);
        CHECK(tr->supported == want[i].sup, "%s supported %d", want[i].name, tr->supported);
        if (tr->supported) {
            const sd_type_traits *vt = sd_type_get(tr->vec_dot_type);
            CHECK(tr->to_float && tr->from_float && tr->vec_dot_ref && tr->vec_dot, "%s: kernels", tr->name);
            CHECK(vt && vt->from_float, "%s: vec_dot_type %d has no quantizer", tr->name, tr->vec_dot_type);
        }
    }
    CHECK(sd_type_get(-1) == NULL && sd_type_get(SD_TYPE_COUNT) == NULL, "out of range ids");
    CHECK(sd_type_get(5) && !sd_type_get(5)->supported, "id 5 (removed Q4_2) unsupported");
    CHECK(sd_row_size(SD_TYPE_Q4_1, 576) == 18 * 20, "row size Q4_1");
    CHECK(sd_row_size(SD_TYPE_Q6_K, 512) == 2 * 210, "row size Q6_K");
    CHECK(sd_row_size(SD_TYPE_F16, 7) == 14, "row size F16");
    printf("  backend: %s\n", sd_quant_backend());
}

static void test_roundtrip(void) {
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static uint8_t q[N * 4 + 64];
    int types[N_MY_TYPES + 1];
    memcpy(types, my_types, sizeof my_types);
    types[N_MY_TYPES] = SD_TYPE_Q8_1;
    for (int i = 0; i < N_MY_TYPES + 1; i++) {
        const sd_type_traits *tr = sd_type_get(types[i]);
        fill_random(x, N);
        tr->from_float(x, q, N);
        tr->to_float(q, y, N);
        double worst = 0, err2 = 0, ref2 = 0;
        for (int b = 0; b < N; b += 32) {
            float amax = 0;
            for (int j = b; j < b + 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            for (int j = b; j < b + 32; j++) {
                double e = fabs((double)y[j] - x[j]);
                double rel = tr->blck == 1 ? (x[j] != 0 ? e / fabs(x[j]) : e) : e / amax;
                if (rel > worst) worst = rel;
                err2 += e * e;
                ref2 += (double)x[j] * x[j];
            }
        }
        CHECK(worst <= rt_tol(types[i]), "%s: worst error %.3g of block max > %.3g", tr->name, worst,
              rt_tol(types[i]));
        printf("  %-5s worst %.4f rms rel %.5f\n", tr->name, worst, sqrt(err2 / ref2));
    }
}

// Random weight row of type t: quantized random floats, or (raw=1) random
// bytes with sane random scales, which reaches quant values (e.g. Q8_0 -128)
// the quantizer never produces.
static void random_row(int t, void *dst, int64_t n, int raw) {
    const sd_type_traits *tr = sd_type_get(t);
    float *x = malloc((size_t)n * sizeof(float));
    fill_random(x, n);
    tr->from_float(x, dst, n);
    free(x);
    if (!raw || tr->blck != SD_QK) return;
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / SD_QK; b++, p += tr->tsize) {
        for (size_t i = 0; i < tr->tsize; i++) p[i] = (uint8_t)rnd_u32();
        uint16_t d = sd_fp32_to_fp16(ldexpf(rnd_sym(), (int)(rnd_u32() % 8) - 8));
        uint16_t m = sd_fp32_to_fp16(ldexpf(rnd_sym(), (int)(rnd_u32() % 8) - 6));
        memcpy(p, &d, 2);
        if (t == SD_TYPE_Q4_1 || t == SD_TYPE_Q5_1) memcpy(p + 2, &m, 2);
    }
}

// Checks (2) vec_dot == vec_dot_ref and (3) vec_dot_ref == double dot of the
// dequantized weights and activations, for every supported type.
static void test_vec_dot(void) {
    const int64_t sizes[] = {32, 64, 96, 256, 288, 576, 1536};
    for (int t = 0; t < SD_TYPE_FILE_COUNT; t++) {
        const sd_type_traits *tr = sd_type_get(t);
        if (!tr->supported) continue;
        const sd_type_traits *vt = sd_type_get(tr->vec_dot_type);
        double worst_opt = 0, worst_deq = 0;
        int n_cases = 0;
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            int64_t n = sizes[si];
            if (n % tr->blck) continue;
            for (int rep = 0; rep < 8; rep++) {
                void *w = malloc(sd_row_size(t, n));
                void *xq = malloc(sd_row_size(tr->vec_dot_type, n) + 1);
                float *x = malloc((size_t)n * 4), *wf = malloc((size_t)n * 4), *xf = malloc((size_t)n * 4);
                random_row(t, w, n, rep & 1);
                fill_random(x, n);
                vt->from_float(x, xq, n);
                tr->to_float(w, wf, n);
                if (vt->to_float) vt->to_float(xq, xf, n);
                else memcpy(xf, x, (size_t)n * 4);
                double exact = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    exact += (double)wf[i] * xf[i];
                    mag += fabs((double)wf[i] * xf[i]);
                }
                float ref = tr->vec_dot_ref(n, w, xq), opt = tr->vec_dot(n, w, xq);
                double e_opt = fabs((double)opt - ref) / (mag + 1e-30), e_deq = fabs(ref - exact) / (mag + 1e-30);
                worst_opt = fmax(worst_opt, e_opt);
                worst_deq = fmax(worst_deq, e_deq);
                CHECK(e_opt <= 1e-5, "%s n=%lld: vec_dot %.9g vs ref %.9g (|terms| %.3g)", tr->name, (long long)n, opt,
                      ref, mag);
                CHECK(e_deq <= 1e-5, "%s n=%lld: ref %.9g vs dequantized dot %.9g (|terms| %.3g)", tr->name,
                      (long long)n, ref, exact, mag);
                n_cases++;
                free(w), free(xq), free(x), free(wf), free(xf);
            }
        }
        printf("  %-5s %3d cases: opt-ref %.2e, ref-dequant %.2e (of sum |w x|)\n", tr->name, n_cases, worst_opt,
               worst_deq);
    }
}

// The fast activation quantizers write the same bytes as the references.
static void test_act_quant(void) {
    enum { N = 32 * 48 };
    static float x[N];
    static uint8_t a[N * 2], b[N * 2];
    const int acts[] = {SD_TYPE_Q8_0, SD_TYPE_Q8_1};
    for (int i = 0; i < 2; i++) {
        const sd_type_traits *vt = sd_type_get(acts[i]);
        sd_from_float_fn fast = sd_quant_act_quantizer(acts[i]);
        for (int rep = 0; rep < 4; rep++) {
            fill_random(x, N);
            if (rep == 3) memset(x, 0, 32 * sizeof(float)); // an all-zero block
            memset(a, 0, sizeof a);
            memset(b, 0, sizeof b);
            vt->from_float(x, a, N);
            fast(x, b, N);
            CHECK(memcmp(a, b, sd_row_size(acts[i], N)) == 0, "%s: fast quantizer differs from reference",
                  vt->name);
        }
    }
}

// (4) sd_matmul (optimized, 2 threads) against sd_matmul_ref for every
// supported type, with odd row counts and many batch sizes.
static void test_matmul(void) {
    const int64_t toks[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 64};
    const int64_t outs[] = {37, 64, 5};
    sd_pool *pool = sd_pool_new(2);
    CHECK(pool != NULL, "pool");
    if (!pool) return;
    for (int t = 0; t < SD_TYPE_FILE_COUNT; t++) {
        const sd_type_traits *tr = sd_type_get(t);
        if (!tr->supported) continue;
        // Row lengths: for 32-blocks, block counts 9, 1, 18, 3, 12, 13, 16, 23
        // reach every tail shape of the grouped kernels (nb % 8 = 0..7).
        int64_t ins[8] = {288, 32, 576, 96, 384, 416, 512, 736};
        int n_ins = 8;
        if (tr->blck == SD_QK_K) ins[0] = 512, ins[1] = 256, n_ins = 2;
        if (tr->blck == 1) ins[0] = 288, ins[1] = 40, n_ins = 2;
        double worst = 0;
        for (int ii = 0; ii < n_ins; ii++)
            for (size_t oi = 0; oi < (ii < 2 ? sizeof outs / sizeof *outs : 1); oi++) {
                int64_t n_in = ins[ii], n_out = outs[oi], n_tok_max = 64;
                size_t wrb = sd_row_size(t, n_in);
                uint8_t *W = malloc(wrb * (size_t)n_out);
                float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok_max));
                float *y = malloc(sizeof(float) * (size_t)(n_out * n_tok_max));
                float *yr = malloc(sizeof(float) * (size_t)(n_out * n_tok_max));
                float *wf = malloc(sizeof(float) * (size_t)(n_in * n_out));
                for (int64_t r = 0; r < n_out; r++) random_row(t, W + r * wrb, n_in, r & 1);
                for (int64_t r = 0; r < n_out; r++) tr->to_float(W + r * wrb, wf + r * n_in, n_in);
                fill_random(x, n_in * n_tok_max);
                sd_mm_ctx ctx = {.pool = pool, .wbuf_size = sd_matmul_wsize(t, n_in, n_tok_max)};
                ctx.wbuf = malloc(ctx.wbuf_size + 1);
                for (size_t ti = 0; ti < sizeof toks / sizeof *toks; ti++) {
                    int64_t n_tok = toks[ti];
                    for (int64_t i = 0; i < n_out * n_tok; i++) y[i] = NAN;
                    sd_matmul(&ctx, t, W, n_in, n_out, x, n_tok, y);
                    sd_matmul_ref(t, W, n_in, n_out, x, n_tok, yr);
                    int bad = 0;
                    for (int64_t k = 0; k < n_tok && bad < 3; k++)
                        for (int64_t r = 0; r < n_out && bad < 3; r++) {
                            double mag = 0;
                            for (int64_t i = 0; i < n_in; i++) mag += fabs((double)wf[r * n_in + i] * x[k * n_in + i]);
                            double e = fabs((double)y[k * n_out + r] - yr[k * n_out + r]) / (mag + 1e-30);
                            if (!(e <= 2e-5)) {
                                bad++;
                                CHECK(0, "%s n_in=%lld n_out=%lld n_tok=%lld [tok %lld, row %lld]: %.9g vs ref %.9g",
                                      tr->name, (long long)n_in, (long long)n_out, (long long)n_tok, (long long)k,
                                      (long long)r, y[k * n_out + r], yr[k * n_out + r]);
                            }
                            if (e > worst) worst = e;
                        }
                }
                free(W), free(x), free(y), free(yr), free(wf), free(ctx.wbuf);
            }
        printf("  %-5s gemm=%s worst |y-ref| %.2e of sum |w x|\n", tr->name, tr->gemm ? "yes" : "no ", worst);
    }
    sd_pool_free(pool);
}

// The tile kernels called directly on plain vec_dot_type rows (the path
// sd_matmul does not take for the legacy types, whose activations it packs),
// and sd_matmul on rows too long for the panel path.
static void test_gemm_plain_rows(void) {
    const int64_t toks[] = {1, 2, 3, 4, 5, 9};
    for (int t = 0; t < SD_TYPE_FILE_COUNT; t++) {
        const sd_type_traits *tr = sd_type_get(t);
        if (!tr->supported || !tr->gemm) continue;
        const sd_type_traits *vt = sd_type_get(tr->vec_dot_type);
        int64_t n_in = tr->blck == SD_QK ? 416 : 512, n_out = 11, n_tok_max = 9;
        size_t wrb = sd_row_size(t, n_in), xrb = sd_row_size(tr->vec_dot_type, n_in);
        uint8_t *W = malloc(wrb * (size_t)n_out), *xq = malloc(xrb * (size_t)n_tok_max);
        float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok_max)), *y = malloc(sizeof(float) * 8 * 1024);
        for (int64_t r = 0; r < n_out; r++) random_row(t, W + r * wrb, n_in, r & 1);
        fill_random(x, n_in * n_tok_max);
        for (int64_t k = 0; k < n_tok_max; k++) vt->from_float(x + k * n_in, xq + k * xrb, n_in);
        for (size_t ti = 0; ti < sizeof toks / sizeof *toks; ti++) {
            int64_t n_tok = toks[ti], ldy = n_out + 3;
            for (int i = 0; i < 8 * 1024; i++) y[i] = NAN;
            tr->gemm(n_in, W, wrb, 2, n_out, xq, xrb, n_tok, y, ldy); // rows [2, n_out)
            for (int64_t k = 0; k < n_tok; k++)
                for (int64_t r = 0; r < ldy; r++) {
                    float v = y[k * ldy + r];
                    if (r < 2 || r >= n_out) {
                        CHECK(isnan(v), "%s: gemm wrote outside its rows (row %lld)", tr->name, (long long)r);
                        continue;
                    }
                    float ref = tr->vec_dot_ref(n_in, W + r * wrb, xq + k * xrb);
                    CHECK(fabsf(v - ref) <= 1e-4f * (fabsf(ref) + 1.0f) * 10, "%s n_tok=%lld [%lld,%lld]: %.9g vs %.9g",
                          tr->name, (long long)n_tok, (long long)k, (long long)r, v, ref);
                }
        }
        free(W), free(xq), free(x), free(y);
    }
    // rows longer than the panel path supports (n_in > 16384) through sd_matmul
    sd_pool *pool = sd_pool_new(2);
    const int types[] = {SD_TYPE_Q4_1, SD_TYPE_Q8_0};
    for (int i = 0; i < 2; i++) {
        int t = types[i];
        int64_t n_in = 32 * 521, n_out = 6, n_tok = 3;
        size_t wrb = sd_row_size(t, n_in);
        uint8_t *W = malloc(wrb * (size_t)n_out);
        float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok)), y[18], yr[18];
        for (int64_t r = 0; r < n_out; r++) random_row(t, W + r * wrb, n_in, 0);
        fill_random(x, n_in * n_tok);
        sd_mm_ctx ctx = {.pool = pool, .wbuf_size = sd_matmul_wsize(t, n_in, n_tok)};
        ctx.wbuf = malloc(ctx.wbuf_size);
        sd_matmul(&ctx, t, W, n_in, n_out, x, n_tok, y);
        sd_matmul_ref(t, W, n_in, n_out, x, n_tok, yr);
        // The tolerance scales with sum |w x| (as above), not with the result:
        // over 16,672 products the float accumulation of the AVX2 kernels ends
        // ~5e-7 of that sum away from the reference, which can be 1e-4 of a
        // result that cancels down to ~17.
        float *wf = malloc(sizeof(float) * (size_t)n_in);
        for (int k = 0; k < 18; k++) {
            const int64_t tk = k / n_out, r = k % n_out;
            sd_type_get(t)->to_float(W + (size_t)r * wrb, wf, n_in);
            double mag = 0;
            for (int64_t e = 0; e < n_in; e++) mag += fabs((double)wf[e] * x[tk * n_in + e]);
            CHECK(fabs((double)y[k] - yr[k]) <= 1e-5 * mag, "long rows type %d [%d]: %.9g vs %.9g (|terms| %.3g)", t,
                  k, y[k], yr[k], mag);
        }
        free(wf);
        free(W), free(x), free(ctx.wbuf);
    }
    sd_pool_free(pool);
}

// force_ref=1 puts the references everywhere; t_kernels_reset restores the
// family under test.
static void test_force_ref(void) {
    sd_quant_init(1);
    const sd_type_traits *tr = sd_type_get(SD_TYPE_Q4_1);
    CHECK(tr->vec_dot == tr->vec_dot_ref && tr->gemm == NULL, "force_ref keeps Q4_1 scalar");
    CHECK(strcmp(sd_quant_backend(), "scalar") == 0, "backend %s", sd_quant_backend());
    CHECK(sd_quant_repack_type(SD_TYPE_Q4_1, 576) < 0, "force_ref: no repacked types");
    t_kernels_reset();
    printf("  backend after re-init: %s\n", sd_quant_backend());
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// (5) half-precision conversions on edge values.
static void test_half(void) {
    CHECK(sd_fp16_to_fp32(0x0000) == 0.0f && !signbit(sd_fp16_to_fp32(0x0000)), "+0");
    CHECK(sd_fp16_to_fp32(0x8000) == 0.0f && signbit(sd_fp16_to_fp32(0x8000)), "-0");
    CHECK(sd_fp16_to_fp32(0x3c00) == 1.0f, "1");
    CHECK(sd_fp16_to_fp32(0xc000) == -2.0f, "-2");
    CHECK(sd_fp16_to_fp32(0x7bff) == 65504.0f, "max");
    CHECK(sd_fp16_to_fp32(0x0001) == ldexpf(1, -24), "min subnormal");
    CHECK(sd_fp16_to_fp32(0x03ff) == ldexpf(1023, -24), "max subnormal");
    CHECK(sd_fp16_to_fp32(0x0400) == ldexpf(1, -14), "min normal");
    CHECK(isinf(sd_fp16_to_fp32(0x7c00)) && sd_fp16_to_fp32(0x7c00) > 0, "+inf");
    CHECK(isinf(sd_fp16_to_fp32(0xfc00)) && sd_fp16_to_fp32(0xfc00) < 0, "-inf");
    CHECK(isnan(sd_fp16_to_fp32(0x7e00)), "nan");
    CHECK(sd_fp32_to_fp16(65504.0f) == 0x7bff, "65504");
    CHECK(sd_fp32_to_fp16(65519.0f) == 0x7bff, "65519 rounds down");
    CHECK(sd_fp32_to_fp16(65520.0f) == 0x7c00, "65520 overflows to inf");
    CHECK(sd_fp32_to_fp16(1e10f) == 0x7c00 && sd_fp32_to_fp16(-1e10f) == 0xfc00, "overflow");
    CHECK(sd_fp32_to_fp16(ldexpf(1, -25)) == 0x0000, "half of min subnormal ties to even 0");
    CHECK(sd_fp32_to_fp16(ldexpf(1.5f, -25)) == 0x0001, "1.5 * 2^-25 rounds up");
    CHECK(sd_fp32_to_fp16(ldexpf(3, -25)) == 0x0002, "3 * 2^-25 ties to even 2");
    CHECK(sd_fp32_to_fp16(1.0f + ldexpf(1, -11)) == 0x3c00, "1 + half ulp ties to even");
    CHECK(sd_fp32_to_fp16(1.0f + ldexpf(3, -11)) == 0x3c02, "1 + 3 half ulp ties to even (up)");
    CHECK(sd_fp32_to_fp16(-0.0f) == 0x8000, "-0");
    uint16_t hn = sd_fp32_to_fp16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff), "nan stays nan");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) { // every non-NaN half survives the round trip
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        if (sd_fp32_to_fp16(sd_fp16_to_fp32((uint16_t)h)) != h && bad++ < 3) CHECK(0, "half 0x%04x round trip", h);
    }
#ifdef __F16C__
    for (int i = 0; i < 200000; i++) { // against the hardware conversion
        float f = u2f(rnd_u32() << 1 ^ rnd_u32());
        if (isnan(f)) continue;
        uint16_t hw = (uint16_t)_cvtss_sh(f, 0);
        if (sd_fp32_to_fp16(f) != hw && bad++ < 3) CHECK(0, "fp32 %a -> 0x%04x, hardware 0x%04x", f, sd_fp32_to_fp16(f), hw);
    }
#endif
    CHECK(sd_bf16_to_fp32(0x3f80) == 1.0f && sd_bf16_to_fp32(0xc040) == -3.0f, "bf16 values");
    CHECK(sd_fp32_to_bf16(u2f(0x3f808000)) == 0x3f80, "bf16 tie to even (down)");
    CHECK(sd_fp32_to_bf16(u2f(0x3f818000)) == 0x3f82, "bf16 tie to even (up)");
    CHECK(sd_fp32_to_bf16(u2f(0x3f808001)) == 0x3f81, "bf16 above half rounds up");
    CHECK(sd_fp32_to_bf16(INFINITY) == 0x7f80 && sd_fp32_to_bf16(-INFINITY) == 0xff80, "bf16 inf");
    CHECK(isnan(sd_bf16_to_fp32(sd_fp32_to_bf16(NAN))), "bf16 nan stays nan");
    CHECK(sd_fp32_to_bf16(u2f(0x7f7fffff)) == 0x7f80, "bf16 max float rounds to inf");
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
        if (sd_fp32_to_bf16(sd_bf16_to_fp32((uint16_t)h)) != h && bad++ < 3) CHECK(0, "bf16 0x%04x round trip", h);
    }
    (void)f2u;
}

// Batch invariance (bitwise), see tests/lib/quant_check.h: with no pool and
// with a pool of 2 threads (other row splits). The speculative verifier
// relies on it: greedy results must not depend on the batch a token is
// evaluated in.
static void inv_fail(const char *msg) { CHECK(0, "%s", msg); }
static int matmul_invariance_case(sd_pool *pool, int t, int64_t n_in, int64_t n_out) {
    return qc_matmul_invariance_case(pool, t, n_in, n_out, rnd_sym, inv_fail);
}

static void test_matmul_batch_invariance(void) {
    sd_pool *pool = sd_pool_new(2);
    CHECK(pool != NULL, "pool");
    for (int t = 0; t < SD_TYPE_FILE_COUNT; t++) {
        const sd_type_traits *tr = sd_type_get(t);
        if (!tr->supported || tr->blck == SD_QK_K) continue; // K-quants: tests/kernels/test_quant_k.c
        // 32-blocks: 18, 13, 23, 3, 48 blocks per row; 37 rows = 2 panels of 16 and 5 rows
        const int64_t ins32[] = {576, 416, 736, 96, 1536}, insf[] = {288, 40};
        const int64_t *ins = tr->blck == SD_QK ? ins32 : insf;
        int n_ins = tr->blck == SD_QK ? 5 : 2;
        for (int ii = 0; ii < n_ins; ii++)
            for (int use_pool = 0; use_pool < 2; use_pool++)
                matmul_invariance_case(use_pool ? pool : NULL, t, ins[ii], 37);
    }
    sd_pool_free(pool);
}

// Repacked weights (SD_TYPE_*_R, rewritten at load for the CPU's kernel):
// sd_matmul on a repacked matrix gives, bit for bit, what the file's layout
// gives for one token, for every batch size 1..19 and with a thread pool,
// on row lengths of 1..48 blocks; 37 rows = 2 panels of 16 plus 5 rows the
// repacked matrix keeps in the file's layout.
// A type without a repacked form on this CPU is reported, not skipped silently.
static void test_repacked(void) {
    const int bases[] = {SD_TYPE_Q4_0, SD_TYPE_Q4_1, SD_TYPE_Q5_0, SD_TYPE_Q5_1, SD_TYPE_Q8_0,
                         SD_TYPE_Q4_K, SD_TYPE_Q5_K, SD_TYPE_Q6_K};
    sd_pool *pool = sd_pool_new(2);
    int n_checked = 0;
    for (size_t bi = 0; bi < sizeof bases / sizeof *bases; bi++) {
        const int t = bases[bi];
        const sd_type_traits *tr = sd_type_get(t);
        // 16..31 blocks (a full group of 16 and every tail length 0..15), then 1, 3, 8, 13 and 48 blocks
        const int64_t ins32[] = {512, 544, 576, 608, 640, 672, 704, 736, 768, 800, 832, 864, 896, 928, 960, 992,
                                 32, 96, 256, 416, 1536};
        const int64_t insk[] = {256, 768, 1536};
        const int64_t *ins = tr->blck == SD_QK ? ins32 : insk;
        const int n_ins = tr->blck == SD_QK ? (int)(sizeof ins32 / sizeof *ins32) : 3;
        if (sd_quant_repack_type(t, ins[0]) < 0) {
            if (strcmp(sd_quant_backend(), "scalar") != 0) // (the scalar family has none at all: see the end)
                printf("  %s: no repacked form on this CPU (backend %s)\n", tr->name, sd_quant_backend());
            continue;
        }
        for (int ii = 0; ii < n_ins; ii++) {
            const int64_t n_in = ins[ii], n_out = 37, n_tok_max = 19;
            const int rt = sd_quant_repack_type(t, n_in);
            CHECK(rt >= SD_TYPE_FILE_COUNT && rt < SD_TYPE_COUNT, "%s n_in=%lld: repacked id %d", tr->name,
                  (long long)n_in, rt);
            if (rt < 0) continue;
            const sd_type_traits *rtr = sd_type_get(rt);
            CHECK(rtr->base == t && rtr->supported && rtr->gemm && rtr->repack, "%s: repacked traits", tr->name);
            CHECK(sd_row_size(rt, n_in) == sd_row_size(t, n_in), "%s: repacked row size", tr->name);
            const size_t wrb = sd_row_size(t, n_in);
            uint8_t *W = malloc(wrb * n_out), *R = malloc(wrb * n_out + 64);
            float *x = malloc(sizeof(float) * n_in * n_tok_max);
            float *y1 = malloc(sizeof(float) * n_out * n_tok_max), *yb = malloc(sizeof(float) * n_out * n_tok_max);
            for (int64_t r = 0; r < n_out; r++) random_row(t, W + r * wrb, n_in, (int)(r & 1));
            for (int64_t i = 0; i < n_in * n_tok_max; i++) x[i] = 4.0f * rnd_sym();
            CHECK(rtr->repack(W, R, n_in, n_out) == 0, "%s n_in=%lld: repack", tr->name, (long long)n_in);
            size_t ws = SD_MAX(sd_matmul_wsize(t, n_in, n_tok_max), sd_matmul_wsize(rt, n_in, n_tok_max));
            sd_mm_ctx ctx = {.wbuf = malloc(ws), .wbuf_size = ws};
            for (int64_t k = 0; k < n_tok_max; k++) sd_matmul(&ctx, t, W, n_in, n_out, x + k * n_in, 1, y1 + k * n_out);
            for (int use_pool = 0; use_pool < 2; use_pool++) {
                ctx.pool = use_pool ? pool : NULL;
                for (int64_t n_tok = 1; n_tok <= n_tok_max; n_tok++) {
                    int64_t off = (n_tok * 7) % (n_tok_max - n_tok + 1);
                    sd_matmul(&ctx, rt, R, n_in, n_out, x + off * n_in, n_tok, yb);
                    int n_diff = 0;
                    for (int64_t k = 0; k < n_tok * n_out; k++)
                        n_diff += memcmp(&yb[k], &y1[off * n_out + k], sizeof(float)) != 0;
                    CHECK(n_diff == 0, "%s n_in=%lld n_tok=%lld pool=%d: %d outputs differ from the file layout",
                          tr->name, (long long)n_in, (long long)n_tok, use_pool, n_diff);
                }
            }
            n_checked++;
            free(ctx.wbuf), free(W), free(R), free(x), free(y1), free(yb);
        }
    }
    // never for file ids' own table range or types without a kernel
    CHECK(sd_quant_repack_type(SD_TYPE_F32, 64) < 0 && sd_quant_repack_type(SD_TYPE_Q4_1_R, 64) < 0,
          "no repacked form of F32 or of a repacked type");
    printf("  %d repacked matrix shapes equal to the file layout\n", n_checked);
    sd_pool_free(pool);
    if (n_checked == 0) SKIP("no repacked layouts in kernel family %s (the scalar family has none)", sd_quant_backend());
}

// Float activations (sd_mm_ctx.act_f32, used for prompts): every type with a
// dequantizer, y equals the double dot of the dequantized row with the float
// activations to float rounding, and a token gets the same bits alone as in
// batches of 2..19 (with and without a pool).
static void test_matmul_f32_act(void) {
    sd_pool *pool = sd_pool_new(2);
    const int64_t n_in = 576, n_out = 37, n_tok_max = 19;
    int n_types = 0;
    for (int t = 0; t < SD_TYPE_FILE_COUNT; t++) {
        const sd_type_traits *tr = sd_type_get(t);
        const int64_t nin = tr->blck == SD_QK_K ? 768 : n_in;
        if (!tr->supported || !tr->to_float || nin % tr->blck) continue;
        const size_t wrb = sd_row_size(t, nin);
        uint8_t *W = malloc(wrb * n_out);
        float *x = malloc(sizeof(float) * nin * n_tok_max), *row = malloc(sizeof(float) * nin);
        float *y1 = malloc(sizeof(float) * n_out * n_tok_max), *yb = malloc(sizeof(float) * n_out * n_tok_max);
        for (int64_t r = 0; r < n_out; r++) random_row(t, W + r * wrb, nin, 0);
        for (int64_t i = 0; i < nin * n_tok_max; i++) x[i] = 4.0f * rnd_sym();
        sd_mm_ctx ctx = {.act_f32 = 1};
        for (int64_t k = 0; k < n_tok_max; k++) sd_matmul(&ctx, t, W, nin, n_out, x + k * nin, 1, y1 + k * n_out);
        double worst = 0;
        for (int64_t k = 0; k < n_tok_max; k++)
            for (int64_t r = 0; r < n_out; r++) {
                tr->to_float(W + r * wrb, row, nin);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < nin; i++) {
                    ref += (double)row[i] * x[k * nin + i];
                    mag += fabs((double)row[i] * x[k * nin + i]);
                }
                double e = fabs(y1[k * n_out + r] - ref) / (mag > 0 ? mag : 1);
                if (e > worst) worst = e;
            }
        CHECK(worst < 1e-5, "%s: float-activation matmul off the double dot by %.2e of sum |w x|", tr->name, worst);
        for (int use_pool = 0; use_pool < 2; use_pool++) {
            ctx.pool = use_pool ? pool : NULL;
            for (int64_t n_tok = 2; n_tok <= n_tok_max; n_tok++) {
                int64_t off = (n_tok * 7) % (n_tok_max - n_tok + 1);
                sd_matmul(&ctx, t, W, nin, n_out, x + off * nin, n_tok, yb);
                CHECK(memcmp(yb, y1 + off * n_out, sizeof(float) * n_tok * n_out) == 0,
                      "%s n_tok=%lld pool=%d: float-activation results depend on the batch", tr->name,
                      (long long)n_tok, use_pool);
            }
        }
        n_types++;
        free(W), free(x), free(row), free(y1), free(yb);
    }
    printf("  %d types with float activations\n", n_types);
    CHECK(n_types >= 11, "only %d types", n_types);
    sd_pool_free(pool);
}

// The family under test is the one installed (t_families runs every case of
// this program under each family the CPU has, so the AVX2 kernels are checked
// on an AVX-512 CPU too): its name, and dots / tile kernels that are the
// family's own. The avx2 family must not reuse any AVX-512 kernel (its
// K-quant tile kernels once were the AVX-512 ones, so an AVX-512 host never
// ran the AVX2 ones).
void sd_q4_K_to_float_ref(const void *src, float *dst, int64_t n);
void sd_q6_K_to_float_ref(const void *src, float *dst, int64_t n);
void sd_q8_K_from_float_ref(const float *src, void *dst, int64_t n);
static void test_family_installed(void) {
    CHECK(sd_quant_init_backend("no-such") == -1, "unknown backend name accepted");
    t_kernels_reset();
    if (!t_family) SKIP("not run under t_families");
    printf("  backend: %s\n", sd_quant_backend());
    CHECK(strcmp(sd_quant_backend(), t_family) == 0, "backend %s, family %s", sd_quant_backend(), t_family);
    static const int kt[] = {SD_TYPE_Q4_0, SD_TYPE_Q4_1, SD_TYPE_Q5_0, SD_TYPE_Q5_1, SD_TYPE_Q8_0,
                             SD_TYPE_Q4_K, SD_TYPE_Q5_K, SD_TYPE_Q6_K};
    const int scalar = !strcmp(t_family, "scalar");
    sd_vec_dot_fn dot[8];
    sd_gemm_fn gemm[8];
    for (int i = 0; i < 8; i++) {
        const sd_type_traits *tr = sd_type_get(kt[i]);
        dot[i] = tr->vec_dot;
        gemm[i] = tr->gemm;
        if (scalar) {
            CHECK(tr->vec_dot == tr->vec_dot_ref && tr->gemm == NULL, "%s: scalar family, optimized kernel", tr->name);
            CHECK(sd_quant_repack_type(kt[i], 1024) < 0, "%s: scalar family, repacked type", tr->name);
        } else if (i < 5 || sd_type_get(SD_TYPE_Q4_K)->gemm) { // (K-quant kernels: AVX2 + FMA + F16C builds)
            CHECK(tr->vec_dot != tr->vec_dot_ref && tr->gemm != NULL, "%s: family %s, reference kernels", tr->name,
                  t_family);
        }
    }
    if (scalar) {
        CHECK(sd_type_get(SD_TYPE_Q4_K)->to_float == sd_q4_K_to_float_ref &&
                  sd_type_get(SD_TYPE_Q6_K)->to_float == sd_q6_K_to_float_ref &&
                  sd_type_get(SD_TYPE_Q8_K)->from_float == sd_q8_K_from_float_ref,
              "scalar family: K-quant conversions are not the plain C ones");
    }
    if (!strcmp(t_family, "avx2") && sd_quant_init_backend("avx512-vnni") == 0) {
        for (int i = 0; i < 8; i++) {
            const sd_type_traits *tr = sd_type_get(kt[i]);
            CHECK(tr->vec_dot != dot[i] && (!gemm[i] || tr->gemm != gemm[i]), "%s: avx2 family has avx512-vnni's kernel",
                  tr->name);
        }
        t_kernels_reset();
    }
}

int main(int argc, char **argv) {
    (void)argc;
    t_families(argv); // every case under each kernel family this CPU has
    T_RUN(test_traits);
    T_RUN(test_half);
    T_RUN(test_roundtrip);
    T_RUN(test_act_quant);
    T_RUN(test_vec_dot);
    T_RUN(test_matmul);
    T_RUN(test_gemm_plain_rows);
    T_RUN(test_matmul_batch_invariance);
    T_RUN(test_repacked);
    T_RUN(test_matmul_f32_act);
    T_RUN(test_force_ref);
    T_RUN(test_family_installed);
    T_EXIT();
}
