// ops_mm.c - the float matrix products of training (ops.h): C = A B with
// strided operands, cache-blocked in the manner of BLIS, with an AVX2 + FMA
// register tile and its plain C twin.
//
// Per thread, over its part of C: for each block of at most SD_TR_KC of the
// summed dimension and SD_TR_MC rows, A's block is packed into panels of
// SD_TR_MR rows (k-major, MR floats per k: the tile broadcasts them; the
// block stays in L2). Then for each panel of SD_TR_NR columns of B, the
// tile runs down every A panel with the B panel in L1. B is packed into
// that KC x NR panel just before (the forward's transposed W with 8 x 8
// register transposes): read in place, a panel's rows lie a row stride
// apart and collide in L1's sets (2304-byte strides map to 16 of 64). The tile keeps MR x NR sums in registers (6 x 16 = 12 AVX2
// vectors), adds a broadcast A element times two B vectors per row and k,
// and adds its sums to C after the block. Edges are zero-padded panels.
//
// Rows are few in training (a sequence, <= a few hundred), so one A block
// usually covers them all and each B panel is loaded or packed once.
//
// Determinism: C(i, j) = sum over the K blocks in order of (the chain of
// fused multiply-adds over the block's k in order); neither the chain nor
// the block boundaries depend on which thread computes (i, j) or where its
// part starts, so the bits are the same for every pool size.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "train/ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

int sd_tr_ctx_init(sd_tr_ctx *ctx, sd_pool *pool, char *err, size_t errlen) {
    ctx->pool = pool;
    ctx->nth = pool ? sd_pool_size(pool) : 1;
    size_t bytes = (size_t)ctx->nth * SD_TR_PACK_FLOATS * sizeof(float);
    ctx->pack = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!ctx->pack) return sd_err(err, errlen, "train: out of memory for %zu bytes of packing space", bytes);
    return 0;
}

void sd_tr_ctx_free(sd_tr_ctx *ctx) {
    free(ctx->pack);
    ctx->pack = NULL;
}

// ---------------------------------------------------------------- packing

// A(i0 .. i0+mc, p0 .. p0+kc) into panels of MR rows: panel ir holds, for
// each k, the MR floats A(i0 + ir*MR + r, p0 + k); rows past mc are zero.
static void pack_a(float *Ap, const float *A, long rsa, long csa, int i0, int mc, int p0, int kc) {
    const int MR = SD_TR_MR;
    if (rsa == 1) {   // A is a transposed operand: a k's rows are contiguous; read them in order
        for (int k = 0; k < kc; k++) {
            const float *src = A + (size_t)i0 + (size_t)(p0 + k) * csa;
            for (int ir = 0; ir < mc; ir += MR) {
                float *d = Ap + (size_t)ir * kc + (size_t)k * MR;
                const int mr = SD_MIN(MR, mc - ir);
                int r = 0;
                for (; r < mr; r++) d[r] = src[ir + r];
                for (; r < MR; r++) d[r] = 0.0f;
            }
        }
        return;
    }
    for (int ir = 0; ir < mc; ir += MR) {
        float *dst = Ap + (size_t)ir * kc;
        const int mr = SD_MIN(MR, mc - ir);
        for (int r = 0; r < mr; r++) {
            const float *src = A + (size_t)(i0 + ir + r) * rsa + (size_t)p0 * csa;
            if (csa == 1)
                for (int k = 0; k < kc; k++) dst[(size_t)k * MR + r] = src[k];
            else
                for (int k = 0; k < kc; k++) dst[(size_t)k * MR + r] = src[(size_t)k * csa];
        }
        for (int r = mr; r < MR; r++)
            for (int k = 0; k < kc; k++) dst[(size_t)k * MR + r] = 0.0f;
    }
}

// B(p0 .. p0+kc, j0 .. j0+nr) (nr <= NR) into one panel: for each k the NR
// floats B(p0 + k, j0 + c), columns past nr zero.
static void pack_b(float *Bp, const float *B, long rsb, long csb, int p0, int kc, int j0, int nr) {
    const int NR = SD_TR_NR;
    if (csb == 1) {   // a row of the panel is contiguous
        for (int k = 0; k < kc; k++) {
            const float *src = B + (size_t)(p0 + k) * rsb + (size_t)j0;
            float *d = Bp + (size_t)k * NR;
            int c = 0;
            for (; c < nr; c++) d[c] = src[c];
            for (; c < NR; c++) d[c] = 0.0f;
        }
        return;
    }
    // B is a transposed operand: each column is contiguous along k.
    int c = 0;
#if defined(__AVX2__)
    if (rsb == 1 && nr == NR) {   // 8 x 8 blocks transposed in registers
        for (; c < NR; c += 8) {
            const float *src = B + (size_t)(j0 + c) * csb + (size_t)p0;
            int k = 0;
            for (; k + 8 <= kc; k += 8) {
                __m256 r0 = _mm256_loadu_ps(src + 0 * csb + k), r1 = _mm256_loadu_ps(src + 1 * csb + k);
                __m256 r2 = _mm256_loadu_ps(src + 2 * csb + k), r3 = _mm256_loadu_ps(src + 3 * csb + k);
                __m256 r4 = _mm256_loadu_ps(src + 4 * csb + k), r5 = _mm256_loadu_ps(src + 5 * csb + k);
                __m256 r6 = _mm256_loadu_ps(src + 6 * csb + k), r7 = _mm256_loadu_ps(src + 7 * csb + k);
                __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
                __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
                __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
                __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
                __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                float *d = Bp + (size_t)k * NR + c;
                _mm256_store_ps(d + 0 * NR, _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_store_ps(d + 1 * NR, _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_store_ps(d + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_store_ps(d + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_store_ps(d + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_store_ps(d + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_store_ps(d + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_store_ps(d + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
            for (; k < kc; k++)
                for (int cc = 0; cc < 8; cc++) Bp[(size_t)k * NR + c + cc] = src[(size_t)cc * csb + k];
        }
        return;
    }
#endif
    for (; c < nr; c++) {
        const float *src = B + (size_t)(j0 + c) * csb + (size_t)p0 * rsb;
        for (int k = 0; k < kc; k++) Bp[(size_t)k * NR + c] = src[(size_t)k * rsb];
    }
    for (; c < NR; c++)
        for (int k = 0; k < kc; k++) Bp[(size_t)k * NR + c] = 0.0f;
}

// ---------------------------------------------------------------- register tile

// C (mr x nr part of an MR x NR tile, row stride ldc) = (first ? 0 : C) +
// sum over k < kc of Ap[k][r] * Bp[k][c].
#if defined(__AVX2__) && defined(__FMA__)
static void tile(int kc, const float *Ap, const float *Bp, float *C, long ldc, int mr, int nr, int first) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
           c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
           c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
           c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(Bp), b1 = _mm256_load_ps(Bp + 8);
        __m256 a;
        a = _mm256_broadcast_ss(Ap + 0);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(Ap + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(Ap + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(Ap + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(Ap + 4);
        c40 = _mm256_fmadd_ps(a, b0, c40);
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(Ap + 5);
        c50 = _mm256_fmadd_ps(a, b0, c50);
        c51 = _mm256_fmadd_ps(a, b1, c51);
        Ap += SD_TR_MR;
        Bp += SD_TR_NR;
    }
    __m256 acc[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (mr == SD_TR_MR && nr == SD_TR_NR) {
        for (int r = 0; r < SD_TR_MR; r++) {
            float *c = C + (size_t)r * ldc;
            if (first) {
                _mm256_storeu_ps(c, acc[r][0]);
                _mm256_storeu_ps(c + 8, acc[r][1]);
            } else {
                _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), acc[r][0]));
                _mm256_storeu_ps(c + 8, _mm256_add_ps(_mm256_loadu_ps(c + 8), acc[r][1]));
            }
        }
        return;
    }
    float t[SD_TR_MR][SD_TR_NR];
    for (int r = 0; r < SD_TR_MR; r++) {
        _mm256_storeu_ps(t[r], acc[r][0]);
        _mm256_storeu_ps(t[r] + 8, acc[r][1]);
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) C[(size_t)r * ldc + c] = first ? t[r][c] : C[(size_t)r * ldc + c] + t[r][c];
}
#else
// The scalar tile: the same sums in the same order, fused where the CPU
// has FMA (the build without AVX2 + FMA: one multiply-add at a time).
static void tile(int kc, const float *Ap, const float *Bp, float *C, long ldc, int mr, int nr, int first) {
    float t[SD_TR_MR][SD_TR_NR];
    memset(t, 0, sizeof t);
    for (int k = 0; k < kc; k++) {
        for (int r = 0; r < SD_TR_MR; r++) {
            const float a = Ap[r];
            for (int c = 0; c < SD_TR_NR; c++) t[r][c] = SD_FMAF(a, Bp[c], t[r][c]);
        }
        Ap += SD_TR_MR;
        Bp += SD_TR_NR;
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) C[(size_t)r * ldc + c] = first ? t[r][c] : C[(size_t)r * ldc + c] + t[r][c];
}
#endif

// ---------------------------------------------------------------- one thread's part

typedef struct gemm_job {
    int M, N, K;
    const float *A, *B;
    long rsa, csa, rsb, csb, ldc;
    float *C;
    int acc;
    int kb;                  // block of the summed dimension (<= SD_TR_KC), from K alone
    int split_rows;          // 1: threads split the rows of C, 0: its columns
    float *pack;             // (nth, SD_TR_PACK_FLOATS)
} gemm_job;

// C(m0 .. m1, n0 .. n1) of the job, with pack space Ap (MC x KC) and Bp (KC x NR).
static void gemm_part(const gemm_job *j, int m0, int m1, int n0, int n1, float *Ap, float *Bp) {
    if (j->K == 0) {
        if (!j->acc)
            for (int i = m0; i < m1; i++) memset(j->C + (size_t)i * j->ldc + n0, 0, sizeof(float) * (size_t)(n1 - n0));
        return;
    }
    for (int pc = 0; pc < j->K; pc += j->kb) {
        const int kc = SD_MIN(j->kb, j->K - pc);
        const int first = pc == 0 && !j->acc;
        for (int ic = m0; ic < m1; ic += SD_TR_MC) {
            const int mc = SD_MIN(SD_TR_MC, m1 - ic);
            pack_a(Ap, j->A, j->rsa, j->csa, ic, mc, pc, kc);
            for (int jr = n0; jr < n1; jr += SD_TR_NR) {
                const int nr = SD_MIN(SD_TR_NR, n1 - jr);
                pack_b(Bp, j->B, j->rsb, j->csb, pc, kc, jr, nr);
                for (int ir = 0; ir < mc; ir += SD_TR_MR) {
                    float *c = j->C + (size_t)(ic + ir) * j->ldc + jr;
                    tile(kc, Ap + (size_t)ir * kc, Bp, c, j->ldc, SD_MIN(SD_TR_MR, mc - ir), nr, first);
                }
            }
        }
    }
}

// Thread ith's part: contiguous runs of whole tiles (MR rows or NR columns).
static void gemm_task(void *arg, int ith, int nth) {
    const gemm_job *j = arg;
    float *Ap = j->pack + (size_t)ith * SD_TR_PACK_FLOATS;
    float *Bp = Ap + (size_t)SD_TR_MC * SD_TR_KC;
    long lo, hi;
    if (j->split_rows) {
        const long nt = (j->M + SD_TR_MR - 1) / SD_TR_MR;
        sd_split_range(nt, ith, nth, &lo, &hi);
        const int m0 = (int)(lo * SD_TR_MR), m1 = (int)SD_MIN(hi * SD_TR_MR, (long)j->M);
        if (m0 < m1) gemm_part(j, m0, m1, 0, j->N, Ap, Bp);
    } else {
        const long nt = (j->N + SD_TR_NR - 1) / SD_TR_NR;
        sd_split_range(nt, ith, nth, &lo, &hi);
        const int n0 = (int)(lo * SD_TR_NR), n1 = (int)SD_MIN(hi * SD_TR_NR, (long)j->N);
        if (n0 < n1) gemm_part(j, 0, j->M, n0, n1, Ap, Bp);
    }
}

void sd_tr_gemm(const sd_tr_ctx *ctx, int M, int N, int K, const float *A, long rsa, long csa, const float *B,
                long rsb, long csb, float *C, long ldc, int acc) {
    if (M <= 0 || N <= 0) return;
    gemm_job j = {.M = M, .N = N, .K = K, .A = A, .B = B, .rsa = rsa, .csa = csa, .rsb = rsb, .csb = csb,
                  .ldc = ldc, .C = C, .acc = acc, .pack = ctx->pack};
    // K in equal blocks of at most KC (576 = 2 x 288 rather than 256 + 256 +
    // 64: fewer passes over C), a multiple of 8; a function of K alone.
    const int nkb = (K + SD_TR_KC - 1) / SD_TR_KC;
    j.kb = nkb ? ((K + nkb - 1) / nkb + 7) / 8 * 8 : 1;
    j.kb = SD_MIN(j.kb, SD_TR_KC);
    // Each thread packs all of the operand the split does not divide: split
    // the rows when B (K x N) is the smaller to pack twice, i.e. M > N (and
    // when there are too few column panels to go round).
    j.split_rows = M > N || N < SD_TR_NR * ctx->nth;
    // Small products are not worth waking the pool (a hand-over costs microseconds).
    if (ctx->nth == 1 || (double)M * N * K < 2e5)
        gemm_task(&j, 0, 1);
    else
        sd_pool_run(ctx->pool, gemm_task, &j);
}

void sd_tr_gemm_ref(int M, int N, int K, const float *A, long rsa, long csa, const float *B, long rsb, long csb,
                    float *C, long ldc, int acc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)A[i * rsa + k * csa] * B[k * rsb + j * csb];
            float *c = C + (size_t)i * ldc + j;
            *c = acc ? (float)(*c + s) : (float)s;
        }
}

// ---------------------------------------------------------------- linear layers

void sd_tr_linear(const sd_tr_ctx *ctx, int n, int n_in, int n_out, const float *X, const float *W, float *Y,
                  int acc) {
    // B(k, j) = W[j][k]: W^T read through strides.
    sd_tr_gemm(ctx, n, n_out, n_in, X, n_in, 1, W, 1, n_in, Y, n_out, acc);
}

void sd_tr_linear_dx(const sd_tr_ctx *ctx, int n, int n_in, int n_out, const float *dY, const float *W, float *dX) {
    sd_tr_gemm(ctx, n, n_in, n_out, dY, n_out, 1, W, n_in, 1, dX, n_in, 1);
}

void sd_tr_linear_dw(const sd_tr_ctx *ctx, int n, int n_in, int n_out, const float *dY, const float *X, float *dW) {
    // A(o, t) = dY[t][o]: dY^T read through strides.
    sd_tr_gemm(ctx, n_out, n_in, n, dY, 1, n_out, X, n_in, 1, dW, n_in, 1);
}
