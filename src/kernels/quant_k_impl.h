// quant_k_impl.h - private to the K-quant files: quant_k.c (layouts, scalar
// reference kernels, kernel selection), quant_k_vec_x86.c (AVX-512 / AVX2
// vec_dot, AVX-512 dequantization), quant_k_repack.c (the repacked layouts
// Q4_K_R, Q5_K_R, Q6_K_R and their scalar reference), quant_k_x86.c (the
// AVX-512 tile kernel) and quant_k_avx2.c (the AVX2 tile kernel): the kernels
// each exports to the others, and the helpers they share.
#ifndef SD_QUANT_K_IMPL_H
#define SD_QUANT_K_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "kernels/quant.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define K_HAVE_AVX512 1
#endif
// The AVX2 kernels are compiled into AVX-512 builds too: the "avx2" kernel
// family (sd_backend_select) runs them there, so an AVX-512 host tests them.
#if defined(__AVX2__) && defined(__FMA__)
#define K_HAVE_AVX2 1
#endif

// ---------------------------------------------------------------------------
// quant_k.c

// Exported kernels (referenced by the traits table in quant.c; declared
// there, repeated here so the definitions are checked against them).
// to_float: dequantize n elements (n a multiple of 256) into dst.
void sd_q4_K_to_float(const void *src, float *dst, int64_t n);
void sd_q5_K_to_float(const void *src, float *dst, int64_t n);
void sd_q6_K_to_float(const void *src, float *dst, int64_t n);
void sd_q8_K_to_float(const void *src, float *dst, int64_t n);
// from_float: quantize n elements (n a multiple of 256) into n / 256 blocks.
// The weight quantizers fit per sub-block scales by least squares (good, not
// ggml's exact search); the Q8_K one fills bsums and is the activation path.
void sd_q4_K_from_float(const float *src, void *dst, int64_t n);
void sd_q5_K_from_float(const float *src, void *dst, int64_t n);
void sd_q6_K_from_float(const float *src, void *dst, int64_t n);
void sd_q8_K_from_float(const float *src, void *dst, int64_t n);
// dot_ref: plain C dot of a weight row (n elements) with a Q8_K row.
float sd_q4_K_dot_ref(int64_t n, const void *w, const void *x);
float sd_q5_K_dot_ref(int64_t n, const void *w, const void *x);
float sd_q6_K_dot_ref(int64_t n, const void *w, const void *x);
// The plain C bodies of the three functions above that have AVX-512
// versions in AVX-512 builds (the same values, bit for bit); the scalar
// kernel family installs these.
void sd_q4_K_to_float_ref(const void *src, float *dst, int64_t n);
void sd_q6_K_to_float_ref(const void *src, float *dst, int64_t n);
void sd_q8_K_from_float_ref(const float *src, void *dst, int64_t n);
// Kernel families of sd_quant_k_init.
enum { SD_QK_BEST = 0, SD_QK_REF = 1, SD_QK_AVX2 = 2 };
// Sets traits[T].vec_dot and traits[T].gemm for T = Q4_K, Q5_K, Q6_K
// (traits: array of SD_TYPE_COUNT entries), by family:
//   SD_QK_BEST: the best kernels compiled in (AVX-512, else AVX2: vec_dot +
//     tile kernel; else the references);
//   SD_QK_AVX2: the AVX2 kernels (AVX-512 builds included; the references
//     where the build has no AVX2);
//   SD_QK_REF: the reference dots and no tile kernel, and the plain C
//     to_float of Q4_K, Q6_K and from_float of Q8_K.
// With a tile kernel also gemm, repack and supported = 1 of the repacked
// types Q4_K_R, Q5_K_R, Q6_K_R (left as sd_quant_init reset them otherwise),
// and to_float of Q4_K, Q5_K, Q6_K / from_float of Q8_K as the family's.
// Touches no other entry; no state of its own, so it may be called any
// number of times.
void sd_quant_k_init(sd_type_traits *traits, int mode);

// ---------------------------------------------------------------------------
// quant_k_vec_x86.c (AVX-512 builds: the first five; AVX2 builds, AVX-512
// ones included: the last three)

// to_float with AVX-512: the values of sd_q4_K_to_float / sd_q6_K_to_float.
void sd_q4_K_to_float_avx512(const void *src, float *dst, int64_t n);
void sd_q6_K_to_float_avx512(const void *src, float *dst, int64_t n);
// vec_dot: the dot of a weight row (n elements) with a Q8_K row, as
// sd_q*_K_dot_ref within rounding.
float sd_q4_K_dot_avx512(int64_t n, const void *w, const void *x);
float sd_q5_K_dot_avx512(int64_t n, const void *w, const void *x);
float sd_q6_K_dot_avx512(int64_t n, const void *w, const void *x);
float sd_q4_K_dot_avx2(int64_t n, const void *w, const void *x);
float sd_q5_K_dot_avx2(int64_t n, const void *w, const void *x);
float sd_q6_K_dot_avx2(int64_t n, const void *w, const void *x);

// ---------------------------------------------------------------------------
// quant_k_repack.c, quant_k_x86.c and quant_k_avx2.c

// Rewrites n_rows rows of base type base_type (Q4_K, Q5_K, Q6_K) with n_in
// elements each into the repacked layout (same bytes); returns 0, or -1 if
// the type is not a K-quant or n_in is not a multiple of 256.
int sd_quant_k_repack(int base_type, const void *src, void *dst, int64_t n_in, int64_t n_rows);
// Scalar reference of the tile kernel: the dot of one repacked row (base type
// base_type, n elements) with one Q8_K row, with the kernel's float
// operations in the kernel's order (so it has the kernel's bits).
float sd_quant_k_r_dot_ref(int base_type, int64_t n, const void *w, const void *x);
// Sets gemm of Q4_K, Q5_K, Q6_K and gemm / repack / supported of their
// repacked types when this build has the AVX-512 kernel; returns 1 if it did,
// 0 (table untouched) if not.
int sd_quant_k_x86_init(sd_type_traits *traits);
// The same for the AVX2 kernel (AVX2 + FMA + F16C builds, AVX-512 ones too):
// returns 1 if it set the table, 0 (table untouched) if not. Same layouts,
// same bits as the AVX-512 kernel.
int sd_quant_k_avx2_init(sd_type_traits *traits);

// ---------------------------------------------------------------------------
// helpers of quant_k.c and quant_k_vec_x86.c

static inline float k_h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return sd_fp16_to_fp32(h);
#endif
}

// Decodes the 12 packed bytes of Q4_K/Q5_K into sc[8] and m[8] (6-bit each).
static inline void k_scales_decode(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

// ---------------------------------------------------------------------------
// the repacked layouts: shared by quant_k_repack.c, quant_k_x86.c and
// quant_k_avx2.c

// Unit sizes of the Q4_K_R / Q5_K_R rows (bytes).
static inline size_t kx_pair_bytes(int has_qh) { return has_qh ? 352 : 288; }
// Offset of the header in a pair / a half unit.
static inline size_t kx_hdr_off(int has_qh, int half) { return (size_t)(half ? 32 : 64) * (has_qh ? 5 : 4); }

// Prepared activations of one pair of Q8_K blocks (Q4_K / Q5_K kernels).
typedef struct {
    int8_t x[8][64]; // (8 vectors, 16 lanes x 4) quants in the w[k] order; zero for a missing block B
    float dx[16];    // (16) Q8_K scale of the lane's block
    float bxs[16];   // (16) dx * sum of the lane's 32 activations
} kx_xp45;           // 640 bytes

// Prepared activations of one Q8_K block (Q6_K kernels).
typedef struct {
    int8_t x[4][64];  // (4 vectors, 16 lanes x 4) quants in the w[k] order
    int32_t acc0[16]; // (16) -32 * bsums[g]: the quants' offset of 32
    float dx[16];     // (16) the block's Q8_K scale, repeated
} kx_xp6;             // 384 bytes

// The 32-byte pair header of unit p of a Q4_K_R / Q5_K_R row (a half unit's
// header is widened, block B zero).
static inline void kx_pair_header(const uint8_t *unit, int has_qh, int half, uint8_t out[32]) {
    const uint8_t *hdr = unit + kx_hdr_off(has_qh, half);
    if (!half) {
        memcpy(out, hdr, 32);
        return;
    }
    memset(out, 0, 32);
    memcpy(out, hdr, 8);
    const uint32_t w = sd_ld32(hdr + 8);
    const uint64_t mlo = (uint64_t)(w & 0xFFFF) | (uint64_t)(w >> 16) << 32;
    memcpy(out + 16, &mlo, 8);
    memcpy(out + 24, hdr + 12, 2);
    memcpy(out + 28, hdr + 14, 2);
}

// Prepared activations of pair p (blocks 2p, 2p + 1 < nb) of a Q8_K row.
static inline void kx_prep45_pair(const sd_block_q8_K *x, int64_t nb, int64_t p, kx_xp45 *o) {
    for (int h = 0; h < 2; h++) {
        const int64_t b = 2 * p + h;
        for (int j = 0; j < 8; j++) {
            const int L = 8 * h + j;
            if (b < nb) {
                for (int k = 0; k < 8; k++) memcpy(&o->x[k][4 * L], x[b].qs + 32 * j + 4 * k, 4);
                o->dx[L] = x[b].d;
                o->bxs[L] = (float)(x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]) * x[b].d;
            } else {
                for (int k = 0; k < 8; k++) memset(&o->x[k][4 * L], 0, 4);
                o->dx[L] = 0;
                o->bxs[L] = 0;
            }
        }
    }
}

static inline void kx_prep6_block(const sd_block_q8_K *xb, kx_xp6 *o) {
    for (int g = 0; g < 16; g++) {
        for (int k = 0; k < 4; k++) memcpy(&o->x[k][4 * g], xb->qs + 16 * g + 4 * k, 4);
        o->acc0[g] = -32 * xb->bsums[g];
        o->dx[g] = xb->d;
    }
}

#endif
