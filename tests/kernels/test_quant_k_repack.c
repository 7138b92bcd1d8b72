// test_quant_k_repack.c - the repacked K-quant layouts (Q4_K_R, Q5_K_R,
// Q6_K_R; src/kernels/quant_k_repack.c) and the tile kernel of
// src/kernels/quant_k_x86.c (AVX-512) or src/kernels/quant_k_avx2.c (AVX2),
// whichever the build has.
//
// What is checked:
//  - the scalar reference of the repacked layout (sd_quant_k_r_dot_ref, which
//    performs the kernel's float operations in the kernel's order) agrees
//    with the plain references of quant_k.c within rounding, on every row
//    length class (even / odd number of super-blocks);
//  - the tile kernel gives exactly (bit for bit) that reference's value for
//    every (row, token), for rows repacked at load (Q*_K_R gemm) and for
//    rows in the file layout (Q*_K gemm, which repacks on the fly), over
//    many row ranges [r0, r1), batch sizes (one token, small batches on the
//    fly, buffered batches with several unit chunks and token passes, odd
//    and even numbers of super-blocks) and padded strides. Equality with one scalar value per (row, token) implies
//    batch invariance of the tile kernel;
//  - end to end through sd_matmul (activation conversion, thread split):
//    the repacked matrix gives the same bits as the file-layout one, and a
//    token gives the same bits alone as inside batches of 2..40;
//  - repack refuses rows it cannot take;
//  - the vectorized Q4_K / Q6_K dequantizers give the format's values bit
//    for bit.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "lib/quant_check.h"
#include "kernels/matmul.h"
#include "t.h"
#include "kernels/threadpool.h"

int sd_quant_k_repack(int base_type, const void *src, void *dst, int64_t n_in, int64_t n_rows);
float sd_quant_k_r_dot_ref(int base_type, int64_t n, const void *w, const void *x);

typedef struct {
    const char *name;
    int type, rtype;
    size_t bsize;
} ktype;

static const ktype k_types[3] = {
    {"Q4_K", SD_TYPE_Q4_K, SD_TYPE_Q4_K_R, sizeof(sd_block_q4_K)},
    {"Q5_K", SD_TYPE_Q5_K, SD_TYPE_Q5_K_R, sizeof(sd_block_q5_K)},
    {"Q6_K", SD_TYPE_Q6_K, SD_TYPE_Q6_K_R, sizeof(sd_block_q6_K)},
};

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_unif(void) { return (rnd_u32() >> 8) / 16777216.f * 2 - 1; } // [-1, 1)

// Random weight blocks: arbitrary bytes (every quant and scale pattern) with
// a sane fp16 d / dmin.
static void rnd_weights(const ktype *kt, uint8_t *w, int64_t nb) {
    qc_k_random_blocks(kt->type, w, nb, rnd_u32);
}

// Random Q8_K activations (through the library's quantizer, or extreme
// bytes including -128 with consistent bsums).
static void rnd_act(sd_block_q8_K *x, int64_t nb, int extreme) {
    if (!extreme) {
        float *f = malloc(sizeof(float) * (size_t)nb * SD_QK_K);
        for (int64_t i = 0; i < nb * SD_QK_K; i++) f[i] = (i / SD_QK_K % 3 == 0 ? 0.05f : 3.f) * rnd_unif();
        sd_type_get(SD_TYPE_Q8_K)->from_float(f, x, nb * SD_QK_K);
        free(f);
        return;
    }
    qc_q8_K_extreme(x, nb, rnd_u32);
}

// sum |w_i * x_i| over the dequantized row: the scale of rounding errors.
static double abs_dot(const ktype *kt, const void *w, const sd_block_q8_K *x, int64_t n) {
    float *fw = malloc(sizeof(float) * (size_t)n), *fx = malloc(sizeof(float) * (size_t)n);
    sd_type_get(kt->type)->to_float(w, fw, n);
    sd_type_get(SD_TYPE_Q8_K)->to_float(x, fx, n);
    double a = 0;
    for (int64_t i = 0; i < n; i++) a += fabs((double)fw[i] * fx[i]);
    free(fw);
    free(fx);
    return a;
}

static void test_repacked_ref_vs_plain_ref(void) {
    static const int nbs[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 35};
    for (int t = 0; t < 3; t++) {
        const ktype *kt = &k_types[t];
        const sd_type_traits *tr = sd_type_get(kt->type);
        for (size_t k = 0; k < sizeof nbs / sizeof *nbs; k++)
            for (int trial = 0; trial < 6; trial++) {
                const int64_t nb = nbs[k], n = nb * SD_QK_K;
                uint8_t *w = malloc((size_t)nb * kt->bsize), *wr = malloc((size_t)nb * kt->bsize);
                sd_block_q8_K *x = malloc(sizeof(sd_block_q8_K) * (size_t)nb);
                rnd_weights(kt, w, nb);
                rnd_act(x, nb, trial % 3 == 2);
                CHECK(sd_quant_k_repack(kt->type, w, wr, n, 1) == 0, "%s: repack failed", kt->name);
                const float r = tr->vec_dot_ref(n, w, x), o = sd_quant_k_r_dot_ref(kt->type, n, wr, x);
                const double a = abs_dot(kt, w, x, n);
                CHECK(fabs(r - o) <= 1e-5 * a + 1e-6, "%s nb %lld trial %d: repacked ref %.9g plain ref %.9g (abs %.3g)",
                      kt->name, (long long)nb, trial, o, r, a);
                free(w);
                free(wr);
                free(x);
            }
    }
}

// The tile kernel against the repacked reference, bit for bit.
static void test_gemm_bits(void) {
    // (rows, r0, r1, n_tok, n_sb, extra row bytes (file layout only), extra act bytes, extra ldy)
    static const int shapes[][8] = {
        {1, 0, 1, 1, 1, 0, 0, 0},      {9, 0, 9, 1, 6, 0, 0, 0},     {13, 3, 12, 1, 35, 0, 0, 2},
        {5, 1, 5, 2, 3, 16, 0, 1},     {7, 2, 7, 3, 9, 0, 292, 3},   {8, 0, 8, 4, 2, 0, 0, 0},
        {11, 0, 11, 5, 5, 8, 0, 0},    {10, 1, 10, 8, 6, 0, 0, 0},   {17, 0, 17, 16, 35, 0, 0, 1},
        {9, 2, 9, 13, 17, 0, 100, 5},  {12, 0, 12, 37, 3, 0, 0, 0},  {6, 0, 6, 40, 20, 0, 0, 0},
        {3, 0, 3, 7, 1, 0, 0, 0},      {4, 0, 4, 9, 11, 0, 0, 0},   {5, 0, 5, 12, 1, 0, 0, 0},
        {6, 1, 6, 20, 35, 0, 0, 0},    {2, 0, 2, 33, 2, 0, 0, 0},
    };
    int any = 0;
    for (int t = 0; t < 3; t++) {
        const ktype *kt = &k_types[t];
        const sd_type_traits *tb = sd_type_get(kt->type), *trp = sd_type_get(kt->rtype);
        if (!trp->supported || !trp->gemm || !tb->gemm) continue;
        any = 1;
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const int rows = shapes[s][0], r0 = shapes[s][1], r1 = shapes[s][2], nt = shapes[s][3];
            const int64_t nb = shapes[s][4], n = nb * SD_QK_K;
            const size_t rb = (size_t)nb * kt->bsize, wrb = rb + (size_t)shapes[s][5];
            const size_t xrb = (size_t)nb * sizeof(sd_block_q8_K) + (size_t)shapes[s][6];
            const int64_t ldy = rows + shapes[s][7];
            uint8_t *W = calloc((size_t)rows, wrb), *WR = malloc((size_t)rows * rb + 64), *X = calloc((size_t)nt, xrb);
            float *y = malloc(sizeof(float) * (size_t)(ldy * nt)), *yr = malloc(sizeof(float) * (size_t)(ldy * nt));
            for (int r = 0; r < rows; r++) {
                rnd_weights(kt, W + r * wrb, nb);
                CHECK(trp->repack(W + r * wrb, WR + r * rb, n, 1) == 0, "%s: repack refused n %lld", kt->name, (long long)n);
            }
            memset(WR + rows * rb, 0, 64);
            for (int j = 0; j < nt; j++) rnd_act((sd_block_q8_K *)(X + j * xrb), nb, (j + (int)s) % 4 == 3);
            for (int64_t i = 0; i < ldy * nt; i++) y[i] = yr[i] = -12345.f;
            tb->gemm(n, W, wrb, r0, r1, X, xrb, nt, y, ldy);
            trp->gemm(n, WR, rb, r0, r1, X, xrb, nt, yr, ldy);
            int bad = 0;
            for (int j = 0; j < nt; j++)
                for (int64_t r = 0; r < ldy; r++) {
                    const float got = y[j * ldy + r], gotr = yr[j * ldy + r];
                    if (r < r0 || r >= r1) {
                        if ((got != -12345.f || gotr != -12345.f) && bad++ < 3)
                            CHECK(0, "%s shape %zu: wrote outside rows (r %lld t %d)", kt->name, s, (long long)r, j);
                        continue;
                    }
                    const float ref = sd_quant_k_r_dot_ref(kt->type, n, WR + r * rb, X + j * xrb);
                    if ((memcmp(&got, &ref, 4) || memcmp(&gotr, &ref, 4)) && bad++ < 3)
                        CHECK(0, "%s shape %zu row %lld tok %d: file-layout gemm %.9g, repacked gemm %.9g, ref %.9g",
                              kt->name, s, (long long)r, j, got, gotr, ref);
                }
            CHECK(bad == 0, "%s shape %zu (rows %d [%d,%d) n_tok %d n_sb %lld): %d bad outputs", kt->name, s, rows, r0,
                  r1, nt, (long long)nb, bad);
            free(W);
            free(WR);
            free(X);
            free(y);
            free(yr);
        }
    }
    if (!any)
        SKIP("no repacked K-quant kernel in kernel family %s (the scalar family has none; the others need AVX-512 "
             "F/BW/VL, or AVX2 + FMA + F16C, in the build); scalar reference checked", sd_quant_backend());
}

// sd_matmul on the repacked matrix: same bits as on the file layout, and a
// token alone gives the bits it gets inside a batch.
static void test_matmul_repacked(void) {
    sd_pool *pool = sd_pool_new(2);
    CHECK(pool != NULL, "sd_pool_new(2) failed");
    int any = 0;
    static const int64_t shapes[][2] = {{1536, 36}, {2304, 20}, {768, 9}}; // n_in, n_out
    for (int t = 0; t < 3; t++) {
        const ktype *kt = &k_types[t];
        const sd_type_traits *trp = sd_type_get(kt->rtype);
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const int64_t n_in = shapes[s][0], n_out = shapes[s][1], nt_max = 40;
            const int rt = sd_quant_repack_type(kt->type, n_in);
            if (rt < 0) continue;
            CHECK(rt == kt->rtype && trp->supported, "%s: repack type %d", kt->name, rt);
            any = 1;
            const size_t rb = sd_row_size(kt->type, n_in);
            CHECK(sd_row_size(rt, n_in) == rb, "%s: repacked row size differs", kt->name);
            uint8_t *W = malloc(rb * (size_t)n_out), *WR = malloc(rb * (size_t)n_out + 64);
            float *x = malloc(sizeof(float) * (size_t)(nt_max * n_in));
            float *y1 = malloc(sizeof(float) * (size_t)(nt_max * n_out)), *yb = malloc(sizeof(float) * (size_t)(nt_max * n_out));
            float *yf = malloc(sizeof(float) * (size_t)(nt_max * n_out));
            rnd_weights(kt, W, n_in / SD_QK_K * n_out);
            CHECK(trp->repack(W, WR, n_in, n_out) == 0, "%s: repack", kt->name);
            memset(WR + rb * (size_t)n_out, 0, 64);
            for (int64_t i = 0; i < nt_max * n_in; i++) x[i] = 4.f * rnd_unif();
            sd_mm_ctx ctx = {.pool = s % 2 ? pool : NULL};
            ctx.wbuf_size = SD_MAX(sd_matmul_wsize(rt, n_in, nt_max), sd_matmul_wsize(kt->type, n_in, nt_max));
            ctx.wbuf = malloc(ctx.wbuf_size);
            for (int64_t k = 0; k < nt_max; k++) sd_matmul(&ctx, rt, WR, n_in, n_out, x + k * n_in, 1, y1 + k * n_out);
            sd_matmul(&ctx, kt->type, W, n_in, n_out, x, nt_max, yf);
            int n_diff = (int)(memcmp(yf, y1, sizeof(float) * (size_t)(nt_max * n_out)) != 0);
            CHECK(n_diff == 0, "%s n_in %lld: repacked and file-layout matmul differ", kt->name, (long long)n_in);
            for (int64_t nt = 2; nt <= nt_max; nt += (nt < 10 ? 1 : 7)) {
                const int64_t off = (nt * 7) % (nt_max - nt + 1);
                sd_matmul(&ctx, rt, WR, n_in, n_out, x + off * n_in, nt, yb);
                n_diff = 0;
                for (int64_t k = 0; k < nt; k++)
                    for (int64_t r = 0; r < n_out; r++)
                        n_diff += memcmp(&yb[k * n_out + r], &y1[(off + k) * n_out + r], 4) != 0;
                CHECK(n_diff == 0, "%s n_in %lld n_tok %lld pool %d: %d outputs differ from one-token matmul", kt->name,
                      (long long)n_in, (long long)nt, (int)(s % 2), n_diff);
            }
            free(ctx.wbuf);
            free(W);
            free(WR);
            free(x);
            free(y1);
            free(yb);
            free(yf);
        }
    }
    sd_pool_free(pool);
    if (!any)
        SKIP("no repacked K-quant layout in kernel family %s (the scalar family has none; the others need an AVX-512 "
             "or AVX2 kernel in the build)", sd_quant_backend());
}

// sd_q6_K_to_float (vectorized where AVX-512 is built in) gives exactly the
// element-wise value d * scales[e / 16] * q[e] of the format's definition,
// on random bytes (every scale, fp16 d including inf / NaN patterns).
static void test_q6_K_to_float_bits(void) {
    enum { NB = 512 };
    uint8_t *w = malloc(sizeof(sd_block_q6_K) * NB);
    float *got = malloc(sizeof(float) * SD_QK_K * NB);
    for (size_t i = 0; i < sizeof(sd_block_q6_K) * NB; i++) w[i] = (uint8_t)rnd_u32();
    sd_type_get(SD_TYPE_Q6_K)->to_float(w, got, (int64_t)SD_QK_K * NB);
    int bad = 0;
    for (int b = 0; b < NB; b++) {
        const sd_block_q6_K *blk = (const sd_block_q6_K *)(w + b * sizeof(sd_block_q6_K));
        const float d = sd_fp16_to_fp32(blk->d);
        for (int e = 0; e < SD_QK_K; e++) {
            const int h = e / 128, l = e % 32, quarter = (e % 128) / 32;
            const uint8_t lo = blk->ql[64 * h + 32 * (quarter & 1) + l], hb = blk->qh[32 * h + l];
            const int q = ((quarter < 2 ? lo & 15 : lo >> 4) | ((hb >> (2 * quarter)) & 3) << 4) - 32;
            const float want = d * blk->scales[e / 16] * q, g = got[b * SD_QK_K + e];
            if (!(isnan(want) && isnan(g)) && memcmp(&want, &g, 4) && bad++ < 3)
                CHECK(0, "block %d element %d: %.9g, want %.9g", b, e, g, want);
        }
    }
    CHECK(bad == 0, "%d of %d values differ", bad, SD_QK_K * NB);
    free(w);
    free(got);
}

// The same for sd_q4_K_to_float: d * sc * q - dmin * m of the definition
// (d * sc, dmin * m and their product with q are exact, so fused or not the
// difference is rounded once).
static void test_q4_K_to_float_bits(void) {
    enum { NB = 512 };
    uint8_t *w = malloc(sizeof(sd_block_q4_K) * NB);
    float *got = malloc(sizeof(float) * SD_QK_K * NB);
    for (size_t i = 0; i < sizeof(sd_block_q4_K) * NB; i++) w[i] = (uint8_t)rnd_u32();
    sd_type_get(SD_TYPE_Q4_K)->to_float(w, got, (int64_t)SD_QK_K * NB);
    int bad = 0;
    for (int b = 0; b < NB; b++) {
        const sd_block_q4_K *blk = (const sd_block_q4_K *)(w + b * sizeof(sd_block_q4_K));
        const float d = sd_fp16_to_fp32(blk->d), dmin = sd_fp16_to_fp32(blk->dmin);
        for (int e = 0; e < SD_QK_K; e++) {
            const int j = e / 32, c = e / 64, l = e % 32;
            // 6-bit scale and min of sub-block j (the packing of scales[12])
            const int sc = j < 4 ? blk->scales[j] & 63 : (blk->scales[j + 4] & 15) | (blk->scales[j - 4] >> 6) << 4;
            const int m = j < 4 ? blk->scales[j + 4] & 63 : (blk->scales[j + 4] >> 4) | (blk->scales[j] >> 6) << 4;
            const int q = j & 1 ? blk->qs[32 * c + l] >> 4 : blk->qs[32 * c + l] & 15;
            const float d0 = d * (float)sc, m0 = dmin * (float)m, want = d0 * (float)q - m0, g = got[b * SD_QK_K + e];
            if (!(isnan(want) && isnan(g)) && memcmp(&want, &g, 4) && bad++ < 3)
                CHECK(0, "block %d element %d: %.9g, want %.9g", b, e, g, want);
        }
    }
    CHECK(bad == 0, "%d of %d values differ", bad, SD_QK_K * NB);
    free(w);
    free(got);
}

static void test_repack_refuses(void) {
    uint8_t src[256], dst[256];
    memset(src, 0, sizeof src);
    CHECK(sd_quant_k_repack(SD_TYPE_Q4_K, src, dst, 100, 1) == -1, "n_in not a multiple of 256");
    CHECK(sd_quant_k_repack(SD_TYPE_Q8_0, src, dst, 256, 1) == -1, "not a K-quant");
    for (int t = 0; t < 3; t++) {
        const sd_type_traits *trp = sd_type_get(k_types[t].rtype);
        CHECK(sd_quant_repack_type(k_types[t].type, 100) == -1, "%s: n_in 100 has a repacked type", k_types[t].name);
        if (!trp->repack) continue;
        CHECK(trp->base == k_types[t].type, "%s: base %d", k_types[t].name, trp->base);
        CHECK(trp->repack(src, dst, 100, 1) == -1, "%s: repack of n_in 100", k_types[t].name);
        CHECK(trp->repack(src, dst, (int64_t)1 << 20, 0) == -1, "%s: repack of rows of 2^20 (too long for the kernel)",
              k_types[t].name);
    }
}

int main(int argc, char **argv) {
    (void)argc;
    t_families(argv); // every case under each kernel family this CPU has
    T_RUN(test_repacked_ref_vs_plain_ref);
    T_RUN(test_gemm_bits);
    T_RUN(test_matmul_repacked);
    T_RUN(test_repack_refuses);
    T_RUN(test_q6_K_to_float_bits);
    T_RUN(test_q4_K_to_float_bits);
    T_EXIT();
}
