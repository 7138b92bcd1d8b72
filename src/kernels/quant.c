// quant.c - the type traits table, scalar reference kernels of the legacy
// quants (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation
// formats Q8_0 / Q8_1) and the CPU dispatch (sd_quant_init).
//
// Activation formats (vec_dot_type), chosen so that the integer dot products
// map onto VNNI `vpdpbusd` (unsigned weight byte x signed activation byte):
//   Q4_0, Q5_0, Q8_0 weights -> Q8_0 activations (fp16 d, 32 x int8)
//   Q4_1, Q5_1 weights       -> Q8_1 activations (fp32 d, fp32 s = d*sum(qs));
//                               s carries the weight's min term m*sum(x).
//   F32, F16, BF16 weights   -> F32 activations (no conversion at all; the
//                               float paths are not performance critical here).
// Activation quantization rounds to nearest-even (nearbyintf), the rounding
// of the SIMD cvtps2dq, so reference and optimized activation conversion give
// identical bytes and tests can compare dots tightly.
//
// ---- agreement with src/kernels/quant_k.c (K-quants, owned by another engineer) ----
// quant_k.c exports exactly these functions; this table references them:
//   void  sd_q4_K_to_float(const void *src, float *dst, int64_t n);
//   void  sd_q5_K_to_float(const void *src, float *dst, int64_t n);
//   void  sd_q6_K_to_float(const void *src, float *dst, int64_t n);
//   void  sd_q8_K_to_float(const void *src, float *dst, int64_t n);
//   void  sd_q4_K_from_float(const float *src, void *dst, int64_t n);  (q5_K, q6_K, q8_K alike)
//   float sd_q4_K_dot_ref(int64_t n, const void *w, const void *x);    (q5_K, q6_K alike;
//         x is a Q8_K row)
//   void  sd_quant_k_init(sd_type_traits *traits, int mode);
//         traits is this whole table (indexed by type id, SD_TYPE_COUNT
//         entries); the hook sets vec_dot and gemm of Q4_K/Q5_K/Q6_K to its
//         best kernels (to the references when force_ref != 0). It is called
//         by sd_quant_init with the table lock held, and must touch only the
//         vec_dot and gemm fields of its own types.
// Q8_K is an activation format only (supported = 0 as a weight type).
// ---------------------------------------------------------------------------
#include "kernels/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common.h"
#include "specdec.h"   // sd_backend_select, sd_backend_name are public (SD_API)

// K-quant functions (src/kernels/quant_k.c).
extern void sd_q4_K_to_float(const void *src, float *dst, int64_t n);
extern void sd_q5_K_to_float(const void *src, float *dst, int64_t n);
extern void sd_q6_K_to_float(const void *src, float *dst, int64_t n);
extern void sd_q8_K_to_float(const void *src, float *dst, int64_t n);
extern void sd_q4_K_from_float(const float *src, void *dst, int64_t n);
extern void sd_q5_K_from_float(const float *src, void *dst, int64_t n);
extern void sd_q6_K_from_float(const float *src, void *dst, int64_t n);
extern void sd_q8_K_from_float(const float *src, void *dst, int64_t n);
extern float sd_q4_K_dot_ref(int64_t n, const void *w, const void *x);
extern float sd_q5_K_dot_ref(int64_t n, const void *w, const void *x);
extern float sd_q6_K_dot_ref(int64_t n, const void *w, const void *x);
extern void sd_quant_k_init(sd_type_traits *traits, int mode); // mode: 0 best, 1 references, 2 AVX2

// Optimized kernels (src/kernels_x86.c). sd_kernels_x86_init returns the
// family name and fills vec_dot/gemm of the legacy types, or returns NULL
// (leaving the table alone) when this build or this CPU lacks the extensions.
// act[t] receives a fast quantizer for activation format t (bytes identical
// to the reference from_float) where one exists; pack[w] an activation packer
// for weight type w (see sd_act_pack_fn): traits[w].gemm recognizes its
// layout by the row stride.
extern const char *sd_kernels_x86_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                       sd_act_pack_fn pack[SD_TYPE_COUNT]);
// AVX2 + FMA dots of the legacy quants (src/kernels_avx2.c), for CPUs without
// AVX-512 VNNI; NULL when the CPU lacks AVX2.
extern const char *sd_kernels_avx2_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                        sd_act_pack_fn pack[SD_TYPE_COUNT]);

// ---------------------------------------------------------------------------
// float formats

static void f32_to_float(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void f32_from_float(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static float f32_dot_ref(int64_t n, const void *w, const void *x) {
    const float *a = w, *b = x;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}

static void f16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = sd_fp16_to_fp32(h[i]);
}
static void f16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = sd_fp32_to_fp16(src[i]);
}
static float f16_dot_ref(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)sd_fp16_to_fp32(a[i]) * b[i];
    return (float)s;
}

static void bf16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = sd_bf16_to_fp32(h[i]);
}
static void bf16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = sd_fp32_to_bf16(src[i]);
}
static float bf16_dot_ref(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)sd_bf16_to_fp32(a[i]) * b[i];
    return (float)s;
}

// ---------------------------------------------------------------------------
// Q8_0 (weights and activations) and Q8_1 (activations)

static void q8_0_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        const float *x = src + b * SD_QK;
        float amax = 0;
        for (int j = 0; j < SD_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = sd_fp32_to_fp16(d);
        for (int j = 0; j < SD_QK; j++) y[b].qs[j] = (int8_t)nearbyintf(x[j] * id);
    }
}
static void q8_0_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q8_0 *x = src;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        float d = sd_fp16_to_fp32(x[b].d);
        for (int j = 0; j < SD_QK; j++) dst[b * SD_QK + j] = d * x[b].qs[j];
    }
}
static float q8_0_dot_ref(int64_t n, const void *w, const void *xv) {
    const sd_block_q8_0 *a = w, *x = xv;
    double s = 0;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < SD_QK; j++) isum += a[b].qs[j] * x[b].qs[j];
        s += (double)sd_fp16_to_fp32(a[b].d) * sd_fp16_to_fp32(x[b].d) * isum;
    }
    return (float)s;
}

static void q8_1_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        const float *x = src + b * SD_QK;
        float amax = 0;
        for (int j = 0; j < SD_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < SD_QK; j++) {
            int q = (int)nearbyintf(x[j] * id);
            y[b].qs[j] = (int8_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}
static void q8_1_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q8_1 *x = src;
    for (int64_t b = 0; b < n / SD_QK; b++)
        for (int j = 0; j < SD_QK; j++) dst[b * SD_QK + j] = x[b].d * x[b].qs[j];
}

// ---------------------------------------------------------------------------
// Q4_0: x = d * (q - 8), q in [0, 15]; byte j holds element j (low nibble)
// and element j + 16 (high nibble).

// Value of largest magnitude, with its sign.
static float signed_absmax(const float *x, int n) {
    float amax = 0, vmax = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            vmax = x[j];
        }
    return vmax;
}

static void q4_0_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q4_0 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        const float *x = src + b * SD_QK;
        float d = signed_absmax(x, SD_QK) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = sd_fp32_to_fp16(d);
        for (int j = 0; j < SD_QK / 2; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
            q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
            q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}
static void q4_0_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q4_0 *x = src;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        float d = sd_fp16_to_fp32(x[b].d);
        for (int j = 0; j < SD_QK / 2; j++) {
            dst[b * SD_QK + j] = d * ((x[b].qs[j] & 15) - 8);
            dst[b * SD_QK + j + 16] = d * ((x[b].qs[j] >> 4) - 8);
        }
    }
}
static float q4_0_dot_ref(int64_t n, const void *w, const void *xv) {
    const sd_block_q4_0 *a = w;
    const sd_block_q8_0 *x = xv;
    double s = 0;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < SD_QK / 2; j++)
            isum += ((a[b].qs[j] & 15) - 8) * x[b].qs[j] + ((a[b].qs[j] >> 4) - 8) * x[b].qs[j + 16];
        s += (double)sd_fp16_to_fp32(a[b].d) * sd_fp16_to_fp32(x[b].d) * isum;
    }
    return (float)s;
}

// ---------------------------------------------------------------------------
// Q4_1: x = d * q + m, q in [0, 15].

static void minmax(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    *mn = lo;
    *mx = hi;
}

static void q4_1_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q4_1 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        const float *x = src + b * SD_QK;
        float mn, mx;
        minmax(x, SD_QK, &mn, &mx);
        float d = (mx - mn) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = sd_fp32_to_fp16(d);
        y[b].m = sd_fp32_to_fp16(mn);
        for (int j = 0; j < SD_QK / 2; j++) {
            int q0 = (int)((x[j] - mn) * id + 0.5f), q1 = (int)((x[j + 16] - mn) * id + 0.5f);
            q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
            q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}
static void q4_1_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q4_1 *x = src;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        float d = sd_fp16_to_fp32(x[b].d), m = sd_fp16_to_fp32(x[b].m);
        for (int j = 0; j < SD_QK / 2; j++) {
            dst[b * SD_QK + j] = d * (x[b].qs[j] & 15) + m;
            dst[b * SD_QK + j + 16] = d * (x[b].qs[j] >> 4) + m;
        }
    }
}
static float q4_1_dot_ref(int64_t n, const void *w, const void *xv) {
    const sd_block_q4_1 *a = w;
    const sd_block_q8_1 *x = xv;
    double s = 0;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < SD_QK / 2; j++)
            isum += (a[b].qs[j] & 15) * x[b].qs[j] + (a[b].qs[j] >> 4) * x[b].qs[j + 16];
        s += (double)sd_fp16_to_fp32(a[b].d) * x[b].d * isum + (double)sd_fp16_to_fp32(a[b].m) * x[b].s;
    }
    return (float)s;
}

// ---------------------------------------------------------------------------
// Q5_0: x = d * (q - 16), q in [0, 31]; low 4 bits as in Q4_0, bit 4 of
// element j in bit j of the little-endian 32-bit qh.

static uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}
static void store_qh(uint8_t qh[4], uint32_t v) {
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(v >> (8 * i));
}

static void q5_0_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q5_0 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        const float *x = src + b * SD_QK;
        float d = signed_absmax(x, SD_QK) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[b].d = sd_fp32_to_fp16(d);
        for (int j = 0; j < SD_QK / 2; j++) {
            int q0 = (int)(x[j] * id + 16.5f), q1 = (int)(x[j + 16] * id + 16.5f);
            q0 = q0 < 0 ? 0 : q0 > 31 ? 31 : q0;
            q1 = q1 < 0 ? 0 : q1 > 31 ? 31 : q1;
            y[b].qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_qh(y[b].qh, qh);
    }
}
// The 32 quant values of a Q5 block, in element order.
static void q5_values(const uint8_t qs[16], const uint8_t qh4[4], int q[32]) {
    uint32_t qh = load_qh(qh4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}
static void q5_0_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q5_0 *x = src;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int q[32];
        q5_values(x[b].qs, x[b].qh, q);
        float d = sd_fp16_to_fp32(x[b].d);
        for (int j = 0; j < SD_QK; j++) dst[b * SD_QK + j] = d * (q[j] - 16);
    }
}
static float q5_0_dot_ref(int64_t n, const void *w, const void *xv) {
    const sd_block_q5_0 *a = w;
    const sd_block_q8_0 *x = xv;
    double s = 0;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int q[32];
        q5_values(a[b].qs, a[b].qh, q);
        int32_t isum = 0;
        for (int j = 0; j < SD_QK; j++) isum += (q[j] - 16) * x[b].qs[j];
        s += (double)sd_fp16_to_fp32(a[b].d) * sd_fp16_to_fp32(x[b].d) * isum;
    }
    return (float)s;
}

// Q5_1: x = d * q + m, q in [0, 31].
static void q5_1_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q5_1 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        const float *x = src + b * SD_QK;
        float mn, mx;
        minmax(x, SD_QK, &mn, &mx);
        float d = (mx - mn) / 31.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[b].d = sd_fp32_to_fp16(d);
        y[b].m = sd_fp32_to_fp16(mn);
        for (int j = 0; j < SD_QK / 2; j++) {
            int q0 = (int)((x[j] - mn) * id + 0.5f), q1 = (int)((x[j + 16] - mn) * id + 0.5f);
            q0 = q0 < 0 ? 0 : q0 > 31 ? 31 : q0;
            q1 = q1 < 0 ? 0 : q1 > 31 ? 31 : q1;
            y[b].qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_qh(y[b].qh, qh);
    }
}
static void q5_1_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q5_1 *x = src;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int q[32];
        q5_values(x[b].qs, x[b].qh, q);
        float d = sd_fp16_to_fp32(x[b].d), m = sd_fp16_to_fp32(x[b].m);
        for (int j = 0; j < SD_QK; j++) dst[b * SD_QK + j] = d * q[j] + m;
    }
}
static float q5_1_dot_ref(int64_t n, const void *w, const void *xv) {
    const sd_block_q5_1 *a = w;
    const sd_block_q8_1 *x = xv;
    double s = 0;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int q[32];
        q5_values(a[b].qs, a[b].qh, q);
        int32_t isum = 0;
        for (int j = 0; j < SD_QK; j++) isum += q[j] * x[b].qs[j];
        s += (double)sd_fp16_to_fp32(a[b].d) * x[b].d * isum + (double)sd_fp16_to_fp32(a[b].m) * x[b].s;
    }
    return (float)s;
}

// ---------------------------------------------------------------------------
// the table

#define T_(id, nm, bl, ts, sup, vdt, tof, fromf, dot) \
    [id] = {nm, bl, ts, sup, vdt, tof, fromf, dot, dot, NULL}
// Types with known sizes that specdec cannot compute with (for messages and
// size checks of files that contain them).
#define U_(id, nm, bl, ts) [id] = {nm, bl, ts, 0, 0, NULL, NULL, NULL, NULL, NULL}

// A repacked type: base's block and activation format, no kernels until selected.
#define R_(id, nm, bs, bl, ts, vdt) [id] = {nm, bl, ts, 0, vdt, NULL, NULL, NULL, NULL, NULL, NULL, bs}

static sd_type_traits g_traits[SD_TYPE_COUNT] = {
    T_(SD_TYPE_F32, "F32", 1, 4, 1, SD_TYPE_F32, f32_to_float, f32_from_float, f32_dot_ref),
    T_(SD_TYPE_F16, "F16", 1, 2, 1, SD_TYPE_F32, f16_to_float, f16_from_float, f16_dot_ref),
    T_(SD_TYPE_BF16, "BF16", 1, 2, 1, SD_TYPE_F32, bf16_to_float, bf16_from_float, bf16_dot_ref),
    T_(SD_TYPE_Q4_0, "Q4_0", SD_QK, sizeof(sd_block_q4_0), 1, SD_TYPE_Q8_0, q4_0_to_float, q4_0_from_float, q4_0_dot_ref),
    T_(SD_TYPE_Q4_1, "Q4_1", SD_QK, sizeof(sd_block_q4_1), 1, SD_TYPE_Q8_1, q4_1_to_float, q4_1_from_float, q4_1_dot_ref),
    T_(SD_TYPE_Q5_0, "Q5_0", SD_QK, sizeof(sd_block_q5_0), 1, SD_TYPE_Q8_0, q5_0_to_float, q5_0_from_float, q5_0_dot_ref),
    T_(SD_TYPE_Q5_1, "Q5_1", SD_QK, sizeof(sd_block_q5_1), 1, SD_TYPE_Q8_1, q5_1_to_float, q5_1_from_float, q5_1_dot_ref),
    T_(SD_TYPE_Q8_0, "Q8_0", SD_QK, sizeof(sd_block_q8_0), 1, SD_TYPE_Q8_0, q8_0_to_float, q8_0_from_float, q8_0_dot_ref),
    // Q8_1 is internal (fp32 d and s, 40 bytes; GGUF's Q8_1 has fp16 fields,
    // 36 bytes): an activation format only, never a weight type.
    [SD_TYPE_Q8_1] = {"Q8_1", SD_QK, sizeof(sd_block_q8_1), 0, SD_TYPE_Q8_1, q8_1_to_float, q8_1_from_float,
                      NULL, NULL, NULL},
    T_(SD_TYPE_Q4_K, "Q4_K", SD_QK_K, sizeof(sd_block_q4_K), 1, SD_TYPE_Q8_K, sd_q4_K_to_float, sd_q4_K_from_float, sd_q4_K_dot_ref),
    T_(SD_TYPE_Q5_K, "Q5_K", SD_QK_K, sizeof(sd_block_q5_K), 1, SD_TYPE_Q8_K, sd_q5_K_to_float, sd_q5_K_from_float, sd_q5_K_dot_ref),
    T_(SD_TYPE_Q6_K, "Q6_K", SD_QK_K, sizeof(sd_block_q6_K), 1, SD_TYPE_Q8_K, sd_q6_K_to_float, sd_q6_K_from_float, sd_q6_K_dot_ref),
    [SD_TYPE_Q8_K] = {"Q8_K", SD_QK_K, sizeof(sd_block_q8_K), 0, SD_TYPE_Q8_K, sd_q8_K_to_float, sd_q8_K_from_float,
                      NULL, NULL, NULL},
    // ggml types specdec does not compute with (ids and sizes per ggml).
    U_(10, "Q2_K", 256, 84), U_(11, "Q3_K", 256, 110), U_(16, "IQ2_XXS", 256, 66), U_(17, "IQ2_XS", 256, 74),
    U_(18, "IQ3_XXS", 256, 98), U_(19, "IQ1_S", 256, 50), U_(20, "IQ4_NL", 32, 18), U_(21, "IQ3_S", 256, 110),
    U_(22, "IQ2_S", 256, 82), U_(23, "IQ4_XS", 256, 136), U_(24, "I8", 1, 1), U_(25, "I16", 1, 2),
    U_(26, "I32", 1, 4), U_(27, "I64", 1, 8), U_(28, "F64", 1, 8), U_(29, "IQ1_M", 256, 56),
    U_(34, "TQ1_0", 256, 54), U_(35, "TQ2_0", 256, 66),
    // Repacked forms (supported, gemm and repack are set by the kernel
    // selection when the CPU has the kernel): same block size and row bytes.
    R_(SD_TYPE_Q4_0_R, "Q4_0 (repacked)", SD_TYPE_Q4_0, SD_QK, sizeof(sd_block_q4_0), SD_TYPE_Q8_0),
    R_(SD_TYPE_Q4_1_R, "Q4_1 (repacked)", SD_TYPE_Q4_1, SD_QK, sizeof(sd_block_q4_1), SD_TYPE_Q8_1),
    R_(SD_TYPE_Q5_0_R, "Q5_0 (repacked)", SD_TYPE_Q5_0, SD_QK, sizeof(sd_block_q5_0), SD_TYPE_Q8_0),
    R_(SD_TYPE_Q5_1_R, "Q5_1 (repacked)", SD_TYPE_Q5_1, SD_QK, sizeof(sd_block_q5_1), SD_TYPE_Q8_1),
    R_(SD_TYPE_Q8_0_R, "Q8_0 (repacked)", SD_TYPE_Q8_0, SD_QK, sizeof(sd_block_q8_0), SD_TYPE_Q8_0),
    R_(SD_TYPE_Q4_K_R, "Q4_K (repacked)", SD_TYPE_Q4_K, SD_QK_K, sizeof(sd_block_q4_K), SD_TYPE_Q8_K),
    R_(SD_TYPE_Q5_K_R, "Q5_K (repacked)", SD_TYPE_Q5_K, SD_QK_K, sizeof(sd_block_q5_K), SD_TYPE_Q8_K),
    R_(SD_TYPE_Q6_K_R, "Q6_K (repacked)", SD_TYPE_Q6_K, SD_QK_K, sizeof(sd_block_q6_K), SD_TYPE_Q8_K),
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_inited;              // 1 once sd_quant_init ran
static int g_sel_mode = -1;              // family fixed for the process (sd_backend_select, model load):
                                         // its index in k_families (0 "auto"); -1 none yet. Under g_lock
static int g_model_loaded;               // 1 once a model was loaded (sd_quant_fix_for_model). Under g_lock
static const char *g_backend = "scalar"; // written under g_lock
static sd_from_float_fn g_act[SD_TYPE_COUNT]; // fast activation quantizers (or NULL)
static sd_act_pack_fn g_pack[SD_TYPE_COUNT];   // activation packers by weight type (or NULL)

const sd_type_traits *sd_type_get(int t) {
    if (t < 0 || t >= SD_TYPE_COUNT) return NULL;
    if (!atomic_load_explicit(&g_inited, memory_order_acquire)) sd_quant_init(0);
    return &g_traits[t];
}

// mode: 0 the best the CPU has, 1 scalar references only, 2 the AVX2 family
// even where AVX-512 VNNI exists (tests). Called with g_lock held.
static void quant_init_locked(int mode) {
    const int force_ref = mode == 1;
    for (int t = 0; t < SD_TYPE_COUNT; t++) {
        g_traits[t].vec_dot = g_traits[t].vec_dot_ref;
        g_traits[t].gemm = NULL;
        if (t >= SD_TYPE_FILE_COUNT) {
            g_traits[t].supported = 0;
            g_traits[t].repack = NULL;
        }
        g_act[t] = NULL;
        g_pack[t] = NULL;
    }
    const char *be = NULL;
    if (mode == 0) be = sd_kernels_x86_init(g_traits, g_act, g_pack);
    if (!be && !force_ref) be = sd_kernels_avx2_init(g_traits, g_act, g_pack);
    g_backend = be ? be : "scalar";
    sd_quant_k_init(g_traits, mode); // the same modes
    atomic_store_explicit(&g_inited, 1, memory_order_release);
}

void sd_quant_init(int force_ref) {
    pthread_mutex_lock(&g_lock);
    quant_init_locked(force_ref ? 1 : 0);
    pthread_mutex_unlock(&g_lock);
}

int sd_quant_init_backend(const char *name) {
    const int avx512 = !strcmp(name, "avx512-vnni");
    int mode = !strcmp(name, "auto") || avx512 ? 0 : !strcmp(name, "scalar") ? 1 : !strcmp(name, "avx2") ? 2 : -1;
    if (mode < 0) return -1;
    pthread_mutex_lock(&g_lock);
    quant_init_locked(mode);
    int ok = mode == 2 ? strcmp(g_backend, "avx2") == 0 : avx512 ? strcmp(g_backend, "avx512-vnni") == 0 : 1;
    if (!ok) quant_init_locked(0); // not on this CPU: back to the best it has
    pthread_mutex_unlock(&g_lock);
    return ok ? 0 : -1;
}

// The names sd_backend_select takes, and the quant_init_locked mode of each
// (avx512-vnni is what mode 0 picks on a CPU that has it).
static const struct {
    const char *name;
    int mode;
} k_families[] = {{"auto", 0}, {"scalar", 1}, {"avx2", 2}, {"avx512-vnni", 0}};
#define N_FAMILIES (int)(sizeof k_families / sizeof *k_families)

int sd_backend_select(const char *name, char *err, size_t errlen) {
    if (!name) name = "auto";
    int f = -1;
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(name, k_families[i].name)) f = i;
    if (f < 0) return sd_err(err, errlen, "unknown kernel family '%s' (auto, avx512-vnni, avx2, scalar)", name);
    pthread_mutex_lock(&g_lock);
    if (g_sel_mode >= 0) {
        const int sel = g_sel_mode, loaded = g_model_loaded;
        const char *be = g_backend;
        pthread_mutex_unlock(&g_lock);
        if (sel == f) return 0; // the same request again changes nothing
        if (loaded)
            return sd_err(err, errlen,
                          "kernel family '%s': a model was already loaded with '%s' (%s); the family is fixed once "
                          "per process, select it before loading any model",
                          name, k_families[sel].name, be);
        return sd_err(err, errlen, "kernel family '%s': '%s' (%s) was already selected; the family is fixed once per "
                      "process", name, k_families[sel].name, be);
    }
    quant_init_locked(k_families[f].mode);
    if (f != 0 && strcmp(g_backend, k_families[f].name) != 0) {
        quant_init_locked(0); // not on this CPU (or build): back to the best it has, nothing selected
        const char *be = g_backend;
        pthread_mutex_unlock(&g_lock);
        return sd_err(err, errlen, "kernel family '%s' is not available on this CPU or build (auto gives '%s')", name,
                      be);
    }
    g_sel_mode = f;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

const char *sd_backend_name(void) {
    if (!atomic_load_explicit(&g_inited, memory_order_acquire)) sd_quant_init(0);
    return sd_quant_backend();
}

void sd_quant_fix_for_model(void) {
    pthread_mutex_lock(&g_lock);
    if (g_sel_mode < 0) {
        g_sel_mode = 0;
        // a table a test installed (sd_quant_init) stays; a second load
        // never reinstalls one under running sessions
        if (!atomic_load_explicit(&g_inited, memory_order_acquire)) quant_init_locked(0);
    }
    g_model_loaded = 1;
    pthread_mutex_unlock(&g_lock);
}

int sd_quant_simd_level(void) {
    if (!atomic_load_explicit(&g_inited, memory_order_acquire)) sd_quant_init(0);
    const char *be = sd_quant_backend();
    return !strcmp(be, "avx512-vnni") ? 2 : !strcmp(be, "avx2") ? 1 : 0;
}

const char *sd_quant_backend(void) {
    pthread_mutex_lock(&g_lock);
    const char *be = g_backend;
    pthread_mutex_unlock(&g_lock);
    return be;
}

// Internal (used by matmul.c): the quantizer converting activations to
// format t, fastest available; same bytes as traits[t].from_float.
sd_from_float_fn sd_quant_act_quantizer(int t);
sd_from_float_fn sd_quant_act_quantizer(int t) {
    if (t < 0 || t >= SD_TYPE_COUNT) return NULL;
    if (!atomic_load_explicit(&g_inited, memory_order_acquire)) sd_quant_init(0);
    return g_act[t] ? g_act[t] : g_traits[t].from_float;
}

// Internal (used by matmul.c): the activation packer of weight type t, or NULL.
sd_act_pack_fn sd_quant_act_packer(int t);
sd_act_pack_fn sd_quant_act_packer(int t) {
    if (t < 0 || t >= SD_TYPE_COUNT) return NULL;
    if (!atomic_load_explicit(&g_inited, memory_order_acquire)) sd_quant_init(0);
    return g_pack[t];
}

int sd_quant_repack_type(int t, int64_t n_in) {
    if (t < 0 || t >= SD_TYPE_FILE_COUNT) return -1;
    if (!atomic_load_explicit(&g_inited, memory_order_acquire)) sd_quant_init(0);
    for (int r = SD_TYPE_FILE_COUNT; r < SD_TYPE_COUNT; r++) {
        const sd_type_traits *tr = &g_traits[r];
        if (tr->base == t && tr->repack && tr->supported && tr->gemm && n_in % tr->blck == 0) {
            // the kernel's own limits are checked by repack itself (-1)
            return r;
        }
    }
    return -1;
}

size_t sd_row_size(int t, int64_t n) {
    if (t < 0 || t >= SD_TYPE_COUNT || g_traits[t].blck == 0 || n < 0) return 0;
    return (size_t)(n / g_traits[t].blck) * g_traits[t].tsize;
}
