// forward.c - one batched forward pass over a token tree (or chain).
//
// All nodes of a batch go through every weight matrix together, so the weights
// are streamed from memory once per call whatever the batch size. Matrices
// with the same input share one pool run (Q, K, V; gate and up, with SwiGLU
// applied by each thread to its columns), so a layer costs 4 matmul runs plus
// the attention run. Attention honours the tree: node i sees the
// committed cache [0, n_past) plus its ancestors in the batch and itself. The
// K/V rows of node i are written at slot n_past + i (RoPE already applied with
// the node's own position), so a later sd_session_commit only has to move rows.
#include <math.h>
#include <string.h>

#include "common.h"
#include "session.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SD_FWD_AVX2 1
#if defined(__AVX512F__)
#define SD_FWD_AVX512 1
#endif
#endif

// ---------------------------------------------------------------- small vector helpers
// Each helper has a plain C version; the AVX2 versions are used when the
// compiler targets AVX2 + FMA (the Makefile builds with -march=native).

#ifdef SD_FWD_AVX2
// exp(x) for 8 floats: range reduction to r in [-ln2/2, ln2/2], degree-6
// polynomial, scaling by 2^n through the exponent bits. Relative error
// ~2e-7 over the float range; inputs below -87 give 0 (softmax, silu).
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static inline float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

// SD_ATT_MQ (session.h) queries of one KV head are processed together by
// the attention (GQA: the query heads sharing a KV head read the same key
// and value rows once).

#ifdef SD_FWD_AVX2
// The eight horizontal sums of a[0..7], in lane j, always in the same order
// (every score of a row goes through it: batch invariance), times scale,
// stored to out[0..8); vmx = max(vmx, them).
static inline __m256 sum8_store(const __m256 a[8], float scale, float *out, __m256 vmx) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 h0 = _mm256_hadd_ps(h01, h23), h1 = _mm256_hadd_ps(h45, h67);
    __m256 v = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
    v = _mm256_mul_ps(v, _mm256_set1_ps(scale));
    _mm256_storeu_ps(out, v);
    return _mm256_max_ps(vmx, v);
}

// The sum of one accumulator in the order sum8_store gives each lane.
static inline float sum8_one(__m256 acc, float scale) {
    float l[8];
    _mm256_storeu_ps(l, acc);
    return (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) * scale;
}

static inline float hmax8(__m256 v) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}
#endif

// For each query qi < nq: out[qi][r] = scale * dot(q[qi], row r) for n rows
// of dimension d; row r starts at base + (idx ? idx[r] : r) * stride.
// mx[qi] = max(mx[qi], its scores). Every (query, row) dot is the same
// sequence of operations whatever nq is and wherever the row falls, so the
// scores do not depend on how queries and rows are grouped (batch invariance).
static inline __attribute__((always_inline)) void scores_rows_mq(const float *const *q, int nq, const float *base,
                                                                 size_t stride, const int32_t *idx, int n, int d,
                                                                 float scale, float *const *out, float *mx) {
    int r = 0;
#ifdef SD_FWD_AVX512
    if (d % 16 == 0) {
        // Eight rows at a time, 16 dims per step; the two halves of each
        // accumulator are added, then the eight sums reduce as in the AVX2
        // path below. (Head sizes that are multiples of 16 always take this
        // path, so a score's bits never depend on the batch.)
        __m256 vmx[SD_ATT_MQ];
        for (int qi = 0; qi < nq; qi++) vmx[qi] = _mm256_set1_ps(mx[qi]);
        for (; r + 8 <= n; r += 8) {
            const float *k[8];
            for (int j = 0; j < 8; j++) k[j] = base + (size_t)(idx ? idx[r + j] : r + j) * stride;
            __m512 a[SD_ATT_MQ][8];
            for (int qi = 0; qi < nq; qi++)
                for (int j = 0; j < 8; j++) a[qi][j] = _mm512_setzero_ps();
            for (int c = 0; c < d; c += 16) {
                __m512 qv[SD_ATT_MQ];
                for (int qi = 0; qi < nq; qi++) qv[qi] = _mm512_loadu_ps(q[qi] + c);
                for (int j = 0; j < 8; j++) {
                    __m512 kv = _mm512_loadu_ps(k[j] + c);
                    for (int qi = 0; qi < nq; qi++) a[qi][j] = _mm512_fmadd_ps(qv[qi], kv, a[qi][j]);
                }
            }
            for (int qi = 0; qi < nq; qi++) {
                __m256 b[8];
                for (int j = 0; j < 8; j++)
                    b[j] = _mm256_add_ps(_mm512_castps512_ps256(a[qi][j]), _mm512_extractf32x8_ps(a[qi][j], 1));
                vmx[qi] = sum8_store(b, scale, out[qi] + r, vmx[qi]);
            }
        }
        for (; r < n; r++) {
            const float *k = base + (size_t)(idx ? idx[r] : r) * stride;
            for (int qi = 0; qi < nq; qi++) {
                __m512 acc = _mm512_setzero_ps();
                for (int c = 0; c < d; c += 16)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q[qi] + c), _mm512_loadu_ps(k + c), acc);
                // the reduction order of the eight-row path above
                out[qi][r] = sum8_one(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)), scale);
                if (out[qi][r] > mx[qi]) mx[qi] = out[qi][r];
            }
        }
        for (int qi = 0; qi < nq; qi++) mx[qi] = SD_MAX(mx[qi], hmax8(vmx[qi]));
        return;
    }
#endif
#ifdef SD_FWD_AVX2
    if (d % 8 == 0) {
        // Eight rows at a time; one horizontal reduction gives all eight dots.
        __m256 vmx[SD_ATT_MQ];
        for (int qi = 0; qi < nq; qi++) vmx[qi] = _mm256_set1_ps(mx[qi]);
        for (; r + 8 <= n; r += 8) {
            const float *k[8];
            for (int j = 0; j < 8; j++) k[j] = base + (size_t)(idx ? idx[r + j] : r + j) * stride;
            __m256 a[SD_ATT_MQ][8];
            for (int qi = 0; qi < nq; qi++)
                for (int j = 0; j < 8; j++) a[qi][j] = _mm256_setzero_ps();
            for (int c = 0; c < d; c += 8) {
                __m256 qv[SD_ATT_MQ];
                for (int qi = 0; qi < nq; qi++) qv[qi] = _mm256_loadu_ps(q[qi] + c);
                for (int j = 0; j < 8; j++) {
                    __m256 kv = _mm256_loadu_ps(k[j] + c);
                    for (int qi = 0; qi < nq; qi++) a[qi][j] = _mm256_fmadd_ps(qv[qi], kv, a[qi][j]);
                }
            }
            for (int qi = 0; qi < nq; qi++) vmx[qi] = sum8_store(a[qi], scale, out[qi] + r, vmx[qi]);
        }
        for (; r < n; r++) {
            const float *k = base + (size_t)(idx ? idx[r] : r) * stride;
            for (int qi = 0; qi < nq; qi++) {
                __m256 acc = _mm256_setzero_ps();
                for (int c = 0; c < d; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q[qi] + c), _mm256_loadu_ps(k + c), acc);
                // Reduce in exactly the order of the eight-row hadd path above, so
                // that a key's score does not depend on whether it fell into a
                // group of eight: batched and one-token forwards stay bit-identical.
                out[qi][r] = sum8_one(acc, scale);
                if (out[qi][r] > mx[qi]) mx[qi] = out[qi][r];
            }
        }
        for (int qi = 0; qi < nq; qi++) mx[qi] = SD_MAX(mx[qi], hmax8(vmx[qi]));
        return;
    }
#endif
    for (; r < n; r++) {
        const float *k = base + (size_t)(idx ? idx[r] : r) * stride;
        for (int qi = 0; qi < nq; qi++) {
            float acc[4] = {0, 0, 0, 0};
            int c = 0;
            for (; c + 4 <= d; c += 4)
                for (int t = 0; t < 4; t++) acc[t] += q[qi][c + t] * k[c + t];
            float sum = acc[0] + acc[1] + acc[2] + acc[3];
            for (; c < d; c++) sum += q[qi][c] * k[c];
            out[qi][r] = sum * scale;
            if (out[qi][r] > mx[qi]) mx[qi] = out[qi][r];
        }
    }
}

// scores_rows_mq with the query count as a compile-time constant.
static void scores_rows(const float *const *q, int nq, const float *base, size_t stride, const int32_t *idx, int n,
                        int d, float scale, float *const *out, float *mx) {
    switch (nq) {
    case 3: scores_rows_mq(q, 3, base, stride, idx, n, d, scale, out, mx); break;
    case 2: scores_rows_mq(q, 2, base, stride, idx, n, d, scale, out, mx); break;
    default: scores_rows_mq(q, 1, base, stride, idx, n, d, scale, out, mx); break;
    }
}

// sc[j] = exp(sc[j] - mx) for j < n; returns the sum.
static float softmax_exp(float *sc, int n, float mx) {
    int j = 0;
    float sum = 0.0f;
#ifdef SD_FWD_AVX2
    __m256 vm = _mm256_set1_ps(mx), vs = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vm));
        _mm256_storeu_ps(sc + j, e);
        vs = _mm256_add_ps(vs, e);
    }
    sum = hsum8(vs);
#endif
    for (; j < n; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
}

// For each query qi < nq: o[qi][0..d) += sum_r p[qi][r] * row r (rows
// addressed as in scores_rows). Each output element gets the same sequence
// of operations whatever nq is.
static inline __attribute__((always_inline)) void accum_rows_mq(float *const *o, const float *const *p, int nq,
                                                                const float *base, size_t stride,
                                                                const int32_t *idx, int n, int d) {
    int c = 0;
#ifdef SD_FWD_AVX512
    // 64 output dims of every query stay in registers over all rows. (Each
    // element gets the same FMAs whatever the vector width.)
    for (; c + 64 <= d; c += 64) {
        __m512 a[SD_ATT_MQ][4];
        for (int qi = 0; qi < nq; qi++)
            for (int u = 0; u < 4; u++) a[qi][u] = _mm512_loadu_ps(o[qi] + c + 16 * u);
        for (int r = 0; r < n; r++) {
            const float *v = base + (size_t)(idx ? idx[r] : r) * stride + c;
            __m512 vv[4];
            for (int u = 0; u < 4; u++) vv[u] = _mm512_loadu_ps(v + 16 * u);
            for (int qi = 0; qi < nq; qi++) {
                __m512 pr = _mm512_set1_ps(p[qi][r]);
                for (int u = 0; u < 4; u++) a[qi][u] = _mm512_fmadd_ps(pr, vv[u], a[qi][u]);
            }
        }
        for (int qi = 0; qi < nq; qi++)
            for (int u = 0; u < 4; u++) _mm512_storeu_ps(o[qi] + c + 16 * u, a[qi][u]);
    }
#endif
#ifdef SD_FWD_AVX2
    // 32 output dims of every query stay in registers over all rows.
    for (; c + 32 <= d; c += 32) {
        __m256 a[SD_ATT_MQ][4];
        for (int qi = 0; qi < nq; qi++)
            for (int u = 0; u < 4; u++) a[qi][u] = _mm256_loadu_ps(o[qi] + c + 8 * u);
        for (int r = 0; r < n; r++) {
            const float *v = base + (size_t)(idx ? idx[r] : r) * stride + c;
            __m256 vv[4];
            for (int u = 0; u < 4; u++) vv[u] = _mm256_loadu_ps(v + 8 * u);
            for (int qi = 0; qi < nq; qi++) {
                __m256 pr = _mm256_set1_ps(p[qi][r]);
                for (int u = 0; u < 4; u++) a[qi][u] = _mm256_fmadd_ps(pr, vv[u], a[qi][u]);
            }
        }
        for (int qi = 0; qi < nq; qi++)
            for (int u = 0; u < 4; u++) _mm256_storeu_ps(o[qi] + c + 8 * u, a[qi][u]);
    }
#endif
    if (c < d)
        for (int qi = 0; qi < nq; qi++)
            for (int r = 0; r < n; r++) {
                const float *v = base + (size_t)(idx ? idx[r] : r) * stride;
                for (int k = c; k < d; k++) o[qi][k] += p[qi][r] * v[k];
            }
}

static void accum_rows(float *const *o, const float *const *p, int nq, const float *base, size_t stride,
                       const int32_t *idx, int n, int d) {
    switch (nq) {
    case 3: accum_rows_mq(o, p, 3, base, stride, idx, n, d); break;
    case 2: accum_rows_mq(o, p, 2, base, stride, idx, n, d); break;
    default: accum_rows_mq(o, p, 1, base, stride, idx, n, d); break;
    }
}

// out = x / rms(x) * w over n elements.
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * x[i + k];
    float ss = 0;
    for (int k = 0; k < 8; k++) ss += acc[k];
    for (; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

// Rotates the first n_rot dims of each of n_heads heads of one row.
static void rope_row(float *row, int n_heads, int head_dim, int n_rot, int type, const float *cs) {
    const int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = row + (size_t)h * head_dim;
        if (type == SD_ROPE_NORM) {
            for (int k = 0; k < half; k++) {
                float c = cs[2 * k], s = cs[2 * k + 1];
                float a = v[2 * k], b = v[2 * k + 1];
                v[2 * k] = a * c - b * s;
                v[2 * k + 1] = a * s + b * c;
            }
        } else {
            for (int k = 0; k < half; k++) {
                float c = cs[2 * k], s = cs[2 * k + 1];
                float a = v[k], b = v[k + half];
                v[k] = a * c - b * s;
                v[k + half] = a * s + b * c;
            }
        }
    }
}

// ---------------------------------------------------------------- parallel tasks

// Below this many multiply-adds a task runs on the calling thread: waking the
// pool costs a few microseconds, more than the work (single-token decoding
// with a short context).
#define SD_FWD_PAR_MIN 65536

typedef struct {
    sd_session *s;
    int layer;
    int n;      // batch nodes
} fwd_job;

// Attention for items (node i, up to SD_ATT_MQ query heads of one KV head),
// split across threads: scores against the committed rows and the node's
// ancestors, softmax, weighted sum of the value rows. The heads of an item
// share every key and value row load.
static void attention_task(void *arg, int ith, int nth) {
    const fwd_job *job = arg;
    sd_session *s = job->s;
    const sd_hparams *hp = &s->m->hp;
    const int hd = hp->head_dim, grp = hp->n_head / hp->n_head_kv;
    const int kvd = s->kv_dim, n_past = s->n_past, nb = s->n_batch;
    const int per_kv = (grp + SD_ATT_MQ - 1) / SD_ATT_MQ; // items per (node, KV head)
    const float scale = 1.0f / sqrtf((float)hd);
    const float *kc = s->k_cache + (size_t)job->layer * s->n_ctx * kvd;
    const float *vc = s->v_cache + (size_t)job->layer * s->n_ctx * kvd;
    float *sc0 = s->att_scores + (size_t)ith * SD_ATT_MQ * (size_t)(s->n_ctx + 16);
    long lo, hi;
    sd_split_range((long)job->n * hp->n_head_kv * per_kv, ith, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
        const int i = (int)(it / (hp->n_head_kv * per_kv)), rest = (int)(it % (hp->n_head_kv * per_kv));
        const int g = rest / per_kv, h0 = g * grp + (rest % per_kv) * SD_ATT_MQ;
        const int nq = SD_MIN(SD_ATT_MQ, g * grp + grp - h0);
        const float *q[SD_ATT_MQ];
        float *sc[SD_ATT_MQ], *o[SD_ATT_MQ], mx[SD_ATT_MQ];
        for (int qi = 0; qi < nq; qi++) {
            q[qi] = s->q + (size_t)i * s->q_dim + (size_t)(h0 + qi) * hd;
            sc[qi] = sc0 + (size_t)qi * (size_t)(s->n_ctx + 16);
            o[qi] = s->att + (size_t)i * s->q_dim + (size_t)(h0 + qi) * hd;
            mx[qi] = -INFINITY;
        }
        const float *kb = kc + (size_t)g * hd, *vb = vc + (size_t)g * hd;
        const float *kb_new = kb + (size_t)n_past * kvd, *vb_new = vb + (size_t)n_past * kvd;
        const int32_t *anc = s->anc + (size_t)i * nb;
        const int na = s->n_anc[i];
        scores_rows(q, nq, kb, (size_t)kvd, NULL, n_past, hd, scale, sc, mx);
        float *scn[SD_ATT_MQ];
        const float *pc[SD_ATT_MQ], *pn[SD_ATT_MQ];
        for (int qi = 0; qi < nq; qi++) scn[qi] = sc[qi] + n_past;
        scores_rows(q, nq, kb_new, (size_t)kvd, anc, na, hd, scale, scn, mx);
        const int tot = n_past + na;
        for (int qi = 0; qi < nq; qi++) {
            const float inv = 1.0f / softmax_exp(sc[qi], tot, mx[qi]);
            for (int j = 0; j < tot; j++) sc[qi][j] *= inv;
            memset(o[qi], 0, (size_t)hd * sizeof(float));
            pc[qi] = sc[qi];
            pn[qi] = sc[qi] + n_past;
        }
        accum_rows(o, pc, nq, vb, (size_t)kvd, NULL, n_past, hd);
        accum_rows(o, pn, nq, vb_new, (size_t)kvd, anc, na, hd);
    }
}

// silu(g) * u over n elements; element-wise, so each element's result is the
// same wherever it sits (the partial last group goes through the same vector
// code via a padded copy): batch invariance.
static void swiglu_span(float *g, const float *u, long n) {
    long k = 0;
#ifdef SD_FWD_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; k < n; k += 8) {
        float tg[8] = {0}, tu[8] = {0};
        const long m = SD_MIN(8, n - k);
        const float *gp = g + k, *up = u + k;
        if (m < 8) {
            memcpy(tg, gp, (size_t)m * sizeof(float));
            memcpy(tu, up, (size_t)m * sizeof(float));
            gp = tg;
            up = tu;
        }
        __m256 v = _mm256_loadu_ps(gp);
        __m256 e = exp8(_mm256_sub_ps(zero, v));
        __m256 r = _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(one, e)), _mm256_loadu_ps(up));
        if (m < 8) {
            _mm256_storeu_ps(tg, r);
            memcpy(g + k, tg, (size_t)m * sizeof(float));
        } else {
            _mm256_storeu_ps(g + k, r);
        }
    }
#endif
    for (; k < n; k++) {
        float v = g[k];
        g[k] = v / (1.0f + expf(-v)) * u[k];
    }
}

// sd_mm_post_fn: ff_g = silu(ff_g) * ff_u on columns [r0, r1) of every batch row.
static void swiglu_cols(void *arg, int64_t r0, int64_t r1) {
    const fwd_job *job = arg;
    sd_session *s = job->s;
    const long n_ff = s->m->hp.n_ff;
    for (long t = 0; t < job->n; t++) swiglu_span(s->ff_g + t * n_ff + r0, s->ff_u + t * n_ff + r0, (long)(r1 - r0));
}

// The tensor a matmul of this forward reads: with float activations
// (sd_batch.precise) the file's layout, which has a dequantizer, else the
// model's (possibly repacked) copy.
static const sd_tensor *mm_weight(const sd_session *s, const sd_tensor *w) {
    return s->mm.act_f32 ? sd_model_file_tensor(s->m, w) : w;
}

static void matmul_t(sd_session *s, const sd_tensor *w, const float *x, int n_tok, float *y) {
    w = mm_weight(s, w);
    sd_matmul(&s->mm, w->type, w->data, w->ne[0], w->ne[1], x, n_tok, y);
}

// Matrices w[0..n_mats) (n_mats <= 4) sharing the input x (their ne[0]).
static void matmul_multi_t(sd_session *s, int n_mats, const sd_tensor *const *w, const float *x, int n_tok,
                           float *const *y) {
    int types[4];
    const void *W[4];
    int64_t n_out[4];
    for (int m = 0; m < n_mats; m++) {
        SD_ASSERT(w[m]->ne[0] == w[0]->ne[0]);
        const sd_tensor *f = mm_weight(s, w[m]);
        types[m] = f->type;
        W[m] = f->data;
        n_out[m] = w[m]->ne[1];
    }
    sd_matmul_multi(&s->mm, n_mats, types, W, w[0]->ne[0], n_out, x, n_tok, y);
}

static void add_bias(float *y, const sd_tensor *b, int n_tok, int dim) {
    if (!b) return;
    const float *bv = b->data;
    for (int t = 0; t < n_tok; t++)
        for (int k = 0; k < dim; k++) y[(size_t)t * dim + k] += bv[k];
}

// ---------------------------------------------------------------- the forward pass

// Checks the batch and records its structure (parents, positions, ancestor
// lists, logit rows). Leaves the session untouched on error.
static int prepare_batch(sd_session *s, const sd_batch *b, char *err, size_t errlen) {
    const sd_hparams *hp = &s->m->hp;
    if (!b || !b->tokens) return sd_err(err, errlen, "forward: no batch / tokens");
    const int n = b->n;
    if (n < 1 || n > s->n_batch)
        return sd_err(err, errlen, "forward: batch of %d tokens, expected 1..%d (n_batch)", n, s->n_batch);
    if (s->n_past + n > s->n_ctx)
        return sd_err(err, errlen, "context full: %d cached + %d new tokens exceed n_ctx %d", s->n_past, n,
                      s->n_ctx);
    for (int i = 0; i < n; i++) {
        int32_t t = b->tokens[i];
        if (t < 0 || t >= hp->n_vocab)
            return sd_err(err, errlen, "forward: token %d at batch index %d is out of range (n_vocab %d)", t, i,
                          hp->n_vocab);
        int32_t p = b->parent ? b->parent[i] : i - 1;
        if (p < -1 || p >= i)
            return sd_err(err, errlen, "forward: node %d has parent %d (must be -1 or a smaller index)", i, p);
        if (b->pos && (b->pos[i] < 0 || b->pos[i] > (1 << 30)))
            return sd_err(err, errlen, "forward: node %d has position %d", i, b->pos[i]);
    }
    const int nb = s->n_batch;
    // From here on the batch is valid: the previous pending rows are dropped.
    s->n_pending = 0;
    int n_out = 0;
    for (int i = 0; i < nb; i++) s->logit_row[i] = -1;
    for (int i = 0; i < n; i++) {
        int32_t p = b->parent ? b->parent[i] : i - 1;
        s->parent[i] = p;
        // Ancestor list of i: the parent's list, then i itself (increasing order).
        int32_t *a = s->anc + (size_t)i * nb;
        int na = 0;
        if (p >= 0) {
            na = s->n_anc[p];
            memcpy(a, s->anc + (size_t)p * nb, (size_t)na * sizeof(int32_t));
        }
        a[na++] = i;
        s->n_anc[i] = na;
        s->pos[i] = b->pos ? b->pos[i] : s->n_past + na - 1;
        if (!b->logits || b->logits[i]) {
            s->logit_row[i] = n_out;
            s->out_rows[n_out++] = i;
        }
    }
    // RoPE angles of each node.
    const int half = hp->n_rot / 2;
    for (int i = 0; i < n; i++) {
        float *cs = s->rope_cs + (size_t)i * half * 2;
        for (int k = 0; k < half; k++) {
            double th = (double)s->pos[i] * s->rope_freq[k];
            cs[2 * k] = (float)cos(th);
            cs[2 * k + 1] = (float)sin(th);
        }
    }
    return n_out;
}

int sd_session_forward(sd_session *s, const sd_batch *b, char *err, size_t errlen) {
    int n_out = prepare_batch(s, b, err, errlen);
    if (n_out < 0) return n_out;
    s->mm.act_f32 = b->precise != 0; // matmul_t & co. then use the file's weight layouts
    const sd_model *m = s->m;
    const sd_hparams *hp = &m->hp;
    const int n = b->n, E = hp->n_embd, kvd = s->kv_dim, qd = s->q_dim;
    const int half = hp->n_rot / 2;

    // Embeddings.
    const sd_type_traits *et = sd_type_get(m->tok_embd->type);
    const size_t erow = sd_row_size(m->tok_embd->type, E);
    for (int i = 0; i < n; i++)
        et->to_float((const uint8_t *)m->tok_embd->data + (size_t)b->tokens[i] * erow, s->x + (size_t)i * E, E);

    fwd_job job = {s, 0, n};
    for (int l = 0; l < hp->n_layer; l++) {
        // A skipped layer (sd_session_set_layer_skip) is the identity on the
        // residual stream and writes no KV rows.
        if (s->layer_skip && s->layer_skip[l]) continue;
        const sd_layer *L = &m->layers[l];
        job.layer = l;
        float *kc = s->k_cache + ((size_t)l * s->n_ctx + s->n_past) * kvd;
        float *vc = s->v_cache + ((size_t)l * s->n_ctx + s->n_past) * kvd;

        for (int i = 0; i < n; i++)
            rmsnorm(s->xn + (size_t)i * E, s->x + (size_t)i * E, L->attn_norm->data, E, hp->rms_eps);
        {
            // Q, K and V in one pool run (one activation conversion).
            const sd_tensor *w3[3] = {L->wq, L->wk, L->wv};
            float *y3[3] = {s->q, kc, vc};
            matmul_multi_t(s, 3, w3, s->xn, n, y3);
        }
        add_bias(s->q, L->bq, n, qd);
        add_bias(kc, L->bk, n, kvd);
        add_bias(vc, L->bv, n, kvd);
        for (int i = 0; i < n; i++) {
            const float *cs = s->rope_cs + (size_t)i * half * 2;
            rope_row(s->q + (size_t)i * qd, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_type, cs);
            rope_row(kc + (size_t)i * kvd, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_type, cs);
        }

        if ((long)n * hp->n_head * (s->n_past + n) * hp->head_dim >= SD_FWD_PAR_MIN) sd_pool_run(s->pool, attention_task, &job);
        else attention_task(&job, 0, 1);

        matmul_t(s, L->wo, s->att, n, s->xn);
        for (size_t k = 0; k < (size_t)n * E; k++) s->x[k] += s->xn[k];

        for (int i = 0; i < n; i++)
            rmsnorm(s->xn + (size_t)i * E, s->x + (size_t)i * E, L->ffn_norm->data, E, hp->rms_eps);
        {
            // gate and up in one pool run, each thread applying SwiGLU to its
            // columns (shapes were validated at load: both are [n_embd, n_ff])
            const sd_tensor *wg = mm_weight(s, L->w_gate), *wu = mm_weight(s, L->w_up);
            const int ty[2] = {wg->type, wu->type};
            const void *W2[2] = {wg->data, wu->data};
            float *y2[2] = {s->ff_g, s->ff_u};
            sd_matmul_multi_post(&s->mm, 2, ty, W2, E, hp->n_ff, s->xn, n, y2, swiglu_cols, &job);
        }
        matmul_t(s, L->w_down, s->ff_g, n, s->xn);
        for (size_t k = 0; k < (size_t)n * E; k++) s->x[k] += s->xn[k];
    }

    // Final norm and output projection, only for the rows that asked for logits.
    for (int k = 0; k < n_out; k++)
        rmsnorm(s->xn + (size_t)k * E, s->x + (size_t)s->out_rows[k] * E, m->out_norm->data, E, hp->rms_eps);
    if (n_out > 0) matmul_t(s, m->output, s->xn, n_out, s->logits);
    s->mm.act_f32 = 0;
    s->n_pending = n;
    return 0;
}
