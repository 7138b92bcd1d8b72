// elem.h - per-element math shared by the CPU engine's tests and the CUDA
// kernels (src/runtime/cuda/): one weight element from its quantised block,
// fp16 / bf16 conversions, a rotary pair, the online-softmax merge and the
// ancestor test of a tree of up to 64 nodes. Both the C compiler and nvcc
// build it (SD_ELEM marks each function __host__ __device__ under nvcc), so
// tests/kernels/test_elem.c checks on this machine the very code the GPU runs
// against the CPU engine's results.
//
// Block layouts are GGUF's (kernels/quant.h describes them); a block is read
// as bytes, little endian, with no alignment assumed.
#ifndef SD_ELEM_H
#define SD_ELEM_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define SD_ELEM static __host__ __device__ __forceinline__
#else
#define SD_ELEM static inline
#endif

// Type ids (GGUF's numbering; the same values as kernels/quant.h's SD_TYPE_*).
enum {
    SD_ELEM_F32 = 0, SD_ELEM_F16 = 1, SD_ELEM_Q4_0 = 2, SD_ELEM_Q4_1 = 3, SD_ELEM_Q5_0 = 6, SD_ELEM_Q5_1 = 7,
    SD_ELEM_Q8_0 = 8, SD_ELEM_Q4_K = 12, SD_ELEM_Q5_K = 13, SD_ELEM_Q6_K = 14, SD_ELEM_BF16 = 30
};

SD_ELEM float sd_elem_bits_f32(uint32_t u) {
    union { uint32_t u; float f; } v;
    v.u = u;
    return v.f;
}
SD_ELEM uint32_t sd_elem_f32_bits(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    return v.u;
}

// IEEE half -> float, exact (subnormals, infinities and NaN included).
SD_ELEM float sd_elem_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F) return sd_elem_bits_f32(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return sd_elem_bits_f32(sign);
        float f = (float)man * (1.0f / 16777216.0f); // man * 2^-24
        return sign ? -f : f;
    }
    return sd_elem_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}
SD_ELEM float sd_elem_bf2f(uint16_t h) { return sd_elem_bits_f32((uint32_t)h << 16); }
// float -> bf16, rounded to nearest even (NaN stays a quiet NaN).
SD_ELEM uint16_t sd_elem_f2bf(float f) {
    uint32_t u = sd_elem_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

SD_ELEM uint16_t sd_elem_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

// Elements and bytes of one block of type t (0, 0 for a type not handled).
SD_ELEM int sd_elem_block_n(int t) {
    switch (t) {
    case SD_ELEM_F32: case SD_ELEM_F16: case SD_ELEM_BF16: return 1;
    case SD_ELEM_Q4_0: case SD_ELEM_Q4_1: case SD_ELEM_Q5_0: case SD_ELEM_Q5_1: case SD_ELEM_Q8_0: return 32;
    case SD_ELEM_Q4_K: case SD_ELEM_Q5_K: case SD_ELEM_Q6_K: return 256;
    default: return 0;
    }
}
SD_ELEM int sd_elem_block_bytes(int t) {
    switch (t) {
    case SD_ELEM_F32: return 4;
    case SD_ELEM_F16: case SD_ELEM_BF16: return 2;
    case SD_ELEM_Q4_0: return 18;
    case SD_ELEM_Q4_1: return 20;
    case SD_ELEM_Q5_0: return 22;
    case SD_ELEM_Q5_1: return 24;
    case SD_ELEM_Q8_0: return 34;
    case SD_ELEM_Q4_K: return 144;
    case SD_ELEM_Q5_K: return 176;
    case SD_ELEM_Q6_K: return 210;
    default: return 0;
    }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 packed bytes.
SD_ELEM void sd_elem_k_scale(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Element e (0 <= e < sd_elem_block_n(t)) of the block at b, as the CPU
// engine's reference dequantisation computes it (the same float operations in
// the same order, so the same bits).
SD_ELEM float sd_elem_dequant(int t, const uint8_t *b, int e) {
    switch (t) {
    case SD_ELEM_F32:
        return sd_elem_bits_f32((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    case SD_ELEM_F16: return sd_elem_h2f(sd_elem_u16(b));
    case SD_ELEM_BF16: return sd_elem_bf2f(sd_elem_u16(b));
    case SD_ELEM_Q8_0: return sd_elem_h2f(sd_elem_u16(b)) * (float)(int8_t)b[2 + e];
    case SD_ELEM_Q4_0: {
        int q = e < 16 ? (b[2 + e] & 15) : (b[2 + e - 16] >> 4);
        return sd_elem_h2f(sd_elem_u16(b)) * (float)(q - 8);
    }
    case SD_ELEM_Q4_1: {
        int q = e < 16 ? (b[4 + e] & 15) : (b[4 + e - 16] >> 4);
        return sd_elem_h2f(sd_elem_u16(b)) * (float)q + sd_elem_h2f(sd_elem_u16(b + 2));
    }
    case SD_ELEM_Q5_0: case SD_ELEM_Q5_1: {
        const int o = t == SD_ELEM_Q5_0 ? 2 : 4; // qh follows d (and m)
        uint32_t qh = (uint32_t)b[o] | (uint32_t)b[o + 1] << 8 | (uint32_t)b[o + 2] << 16 | (uint32_t)b[o + 3] << 24;
        const uint8_t *qs = b + o + 4;
        int q = (e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4)) | (int)((qh >> e) & 1) << 4;
        if (t == SD_ELEM_Q5_0) return sd_elem_h2f(sd_elem_u16(b)) * (float)(q - 16);
        return sd_elem_h2f(sd_elem_u16(b)) * (float)q + sd_elem_h2f(sd_elem_u16(b + 2));
    }
    case SD_ELEM_Q4_K: case SD_ELEM_Q5_K: {
        // 64-element chunk c; its first 32 use the low nibbles (sub-block 2c), the next 32 the high ones.
        const int c = e >> 6, hi = (e >> 5) & 1, l = e & 31, j = 2 * c + hi;
        int sc, m;
        sd_elem_k_scale(b + 4, j, &sc, &m);
        const float d = sd_elem_h2f(sd_elem_u16(b)) * (float)sc, mn = sd_elem_h2f(sd_elem_u16(b + 2)) * (float)m;
        const uint8_t *qs = b + (t == SD_ELEM_Q4_K ? 16 : 48);
        int q = hi ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0xF);
        if (t == SD_ELEM_Q5_K) q |= ((b[16 + l] >> j) & 1) << 4;
        return d * (float)q - mn;
    }
    case SD_ELEM_Q6_K: {
        // ql[128] qh[64] scales[16] d: element e = 128 h + 32 s + l
        const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
        const uint8_t lo = b[64 * h + 32 * (s & 1) + l], hb = b[128 + 32 * h + l];
        const int q = ((s < 2 ? (lo & 0xF) : (lo >> 4)) | (((hb >> (2 * s)) & 3) << 4)) - 32;
        const float ds = sd_elem_h2f(sd_elem_u16(b + 208)) * (float)(int8_t)b[192 + e / 16];
        return ds * (float)q;
    }
    default: return 0.0f;
    }
}

// Element j of a row of n_in elements of type t starting at row (bytes).
SD_ELEM float sd_elem_row_get(int t, const uint8_t *row, int64_t j) {
    const int bn = sd_elem_block_n(t);
    return sd_elem_dequant(t, row + (j / bn) * sd_elem_block_bytes(t), (int)(j % bn));
}

// RoPE: the angle per position of rotary pair i (base^(-2i/n_rot) / scale,
// in double as the CPU session computes it; the angle at pos is pos * freq).
SD_ELEM double sd_elem_rope_freq(double base, int i, int n_rot, double scale) {
    return pow(base, -2.0 * i / n_rot) / scale;
}
// The rotation of one pair (a, b) = (x[first], x[second]) by the angle whose
// cosine and sine are c, s, with the float operations of the CPU engine's
// forward: NORM pairs (2i, 2i+1) with fused multiply-adds, NEOX pairs (i, i +
// n_rot/2) without.
SD_ELEM void sd_elem_rope_pair(float *a, float *b, float c, float s, int neox) {
    const float x = *a, y = *b;
    if (neox) {
        *a = x * c - y * s;
        *b = x * s + y * c;
    } else {
        *a = fmaf(x, c, -(y * s));
        *b = fmaf(y, c, x * s);
    }
}
// The two elements of rotary pair i: first and the returned second.
SD_ELEM int sd_elem_rope_partner(int neox, int n_rot, int i, int *first) {
    *first = neox ? i : 2 * i;
    return neox ? i + n_rot / 2 : 2 * i + 1;
}

// Online softmax: a running state (max m, sum l of exp(score - m)) and the
// weights that merge two partial states (m1, l1, acc1) and (m2, l2, acc2)
// into one: acc = acc1 * w1 + acc2 * w2, l = l1 * w1 + l2 * w2, m = max.
// An empty state has m = -INFINITY and l = 0 (its weight is 0).
typedef struct { float m, l; } sd_elem_sm;
SD_ELEM sd_elem_sm sd_elem_sm_merge(sd_elem_sm a, sd_elem_sm b, float *wa, float *wb) {
    sd_elem_sm r;
    r.m = a.m > b.m ? a.m : b.m;
    if (r.m == -INFINITY) {
        *wa = *wb = 0.0f;
        r.l = 0.0f;
        return r;
    }
    *wa = a.l > 0.0f ? expf(a.m - r.m) : 0.0f;
    *wb = b.l > 0.0f ? expf(b.m - r.m) : 0.0f;
    r.l = a.l * *wa + b.l * *wb;
    return r;
}
// Adds one score to a state: returns the weight to scale the accumulator by
// and sets *p, the weight of the new value.
SD_ELEM float sd_elem_sm_add(sd_elem_sm *st, float score, float *p) {
    const float m = st->m > score ? st->m : score;
    const float w = st->l > 0.0f ? expf(st->m - m) : 0.0f;
    *p = expf(score - m);
    st->l = st->l * w + *p;
    st->m = m;
    return w;
}

// Tree mask of up to 64 nodes: bit j of anc[i] is set when node j is node i
// itself or one of its ancestors; sd_elem_tree_mask fills it from parents
// (parent[i] < i, -1 for a root). Node i may attend to batch node j iff
// sd_elem_sees(anc, i, j).
SD_ELEM void sd_elem_tree_mask(const int32_t *parent, int n, uint64_t *anc) {
    for (int i = 0; i < n; i++) {
        uint64_t bits = (uint64_t)1 << i;
        if (parent[i] >= 0) bits |= anc[parent[i]];
        anc[i] = bits;
    }
}
SD_ELEM int sd_elem_sees(const uint64_t *anc, int i, int j) { return (int)((anc[i] >> j) & 1); }

#endif
