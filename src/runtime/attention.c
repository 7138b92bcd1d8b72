// attention.c - the tree-masked attention of one layer, between the Q/K/V
// and the output projections of forward.c.
//
// Layout (session.h); both caches hold fp16, converted to float as they are
// loaded (vf_load_h). K is cached transposed, per layer and KV head, in
// blocks of SD_KT_W = 16 positions: block b holds dimension c of positions
// 16 b .. 16 b + 15 at kt[b][c][0..16), so one vector load gives dimension c
// of SD_VW consecutive keys and a block's 16 keys are one contiguous run.
// V is cached by rows, v[pos][kv_dim]. The queries of the batch that share a KV head (GQA) are
// taken in blocks of up to SD_ATT_QB:
//  1. scores: for two vectors of keys at a time, acc[q] += q[c] * kt[c][keys]
//     over c, each query element broadcast: one key per lane, no
//     horizontal sums, and every key load serves the whole block;
//  2. each query's visible scores are made contiguous (the committed rows,
//     then its ancestors in the batch, in order), then softmax over them;
//  3. outputs: for two vectors of dimensions at a time,
//     acc[q] += p[q][key] * v[key][dims], one value-row load for the block.
//
// Batch invariance: a score is the chain over c = 0..hd-1 of fma(q, k, acc)
// in one lane, whatever its key's slot; the softmax runs over the contiguous
// visible scores, which form the same list whether the node is in a batch or
// decoded alone after its ancestors were committed (they are then the last
// committed rows, in the same order); an output element is the chain over that
// list, in order. So a node's output has the same bits whatever the batch,
// the tree around it and the thread count (tests/runtime/test_batch_invariance.c).
#include <math.h>
#include <string.h>

#include "common.h"
#include "runtime/forward.h"
#include "kernels/vmath.h"

// Register tiles. Scores: ATT_TQ queries times 2 key vectors. Outputs:
// ATT_OQ queries times ATT_OV vectors of dims (64 dims with AVX-512: a value
// row's 256 bytes in one pass).
#define ATT_OV 4
#if SD_VW == 16
#define ATT_TQ 8
#define ATT_OQ 6
#elif SD_VW == 8
#define ATT_TQ 4
#define ATT_OQ 2
#else
#define ATT_TQ 4
#define ATT_OQ 4
#endif

#define ATT_INLINE static inline __attribute__((always_inline))

// Software prefetch distances: the KV cache is mostly out of the caches when
// a layer's attention starts (the weights streamed past since the last
// token), and the hardware prefetcher alone leaves the loops waiting.
#define ATT_PF_KBLK 4  // key blocks ahead in the score loop
#define ATT_PF_ROWS 32 // value rows ahead in the output loop

static inline void prefetch_row(const uint16_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o);
}

// Offset of dimension 0 of key position p in the blocks of one KV head
// (head size hd); dimension c is SD_KT_W floats further per c.
static inline size_t kt_off(int hd, int p) { return (size_t)(p / SD_KT_W) * hd * SD_KT_W + p % SD_KT_W; }

// The blocks of KV head g of layer l.
static uint16_t *kt_head(sd_session *s, int l, int g) {
    const sd_hparams *hp = &s->m->hp;
    return s->kt + ((size_t)(l - s->l0) * hp->n_head_kv + g) * hp->head_dim * (size_t)s->kt_nblk * SD_KT_W;
}

// sc[qi][v * VW ..) = scale * q[qi] . key, for the nv key vectors starting at
// position 0 of kt, queries qi < nq (nq a constant after inlining).
ATT_INLINE void scores_tile(int nq, const float *const *q, const uint16_t *kt, int hd, int nv, float scale,
                            float *const *sc) {
    const vf vs = vf_set1(scale);
    int v = 0;
    for (; v + 2 <= nv; v += 2) {
        vf a0[ATT_TQ], a1[ATT_TQ];
        for (int qi = 0; qi < nq; qi++) a0[qi] = a1[qi] = vf_zero();
        const uint16_t *k = kt + kt_off(hd, v * SD_VW), *kk = kt + kt_off(hd, (v + 1) * SD_VW);
        // a line per c: the block's hd lines; not past the keys in use (an
        // untouched page costs a page walk per prefetch)
        const size_t pf = v + 2 + ATT_PF_KBLK <= nv ? (size_t)ATT_PF_KBLK * hd * SD_KT_W : 0;
        for (int c = 0; c < hd; c++, k += SD_KT_W, kk += SD_KT_W) {
            __builtin_prefetch(k + pf);
            __builtin_prefetch(kk + pf);
            const vf k0 = vf_load_h(k), k1 = vf_load_h(kk);
            for (int qi = 0; qi < nq; qi++) {
                const vf b = vf_set1(q[qi][c]);
                a0[qi] = vf_fma(b, k0, a0[qi]);
                a1[qi] = vf_fma(b, k1, a1[qi]);
            }
        }
        for (int qi = 0; qi < nq; qi++) {
            vf_store(sc[qi] + (size_t)v * SD_VW, vf_mul(a0[qi], vs));
            vf_store(sc[qi] + (size_t)(v + 1) * SD_VW, vf_mul(a1[qi], vs));
        }
    }
    if (v < nv) {
        vf a0[ATT_TQ];
        for (int qi = 0; qi < nq; qi++) a0[qi] = vf_zero();
        const uint16_t *k = kt + kt_off(hd, v * SD_VW);
        for (int c = 0; c < hd; c++, k += SD_KT_W) {
            const vf k0 = vf_load_h(k);
            for (int qi = 0; qi < nq; qi++) a0[qi] = vf_fma(vf_set1(q[qi][c]), k0, a0[qi]);
        }
        for (int qi = 0; qi < nq; qi++) vf_store(sc[qi] + (size_t)v * SD_VW, vf_mul(a0[qi], vs));
    }
}

// Dims [c, c + nv * VW) of one query tile's outputs: o[qi][c..] = inv[qi] *
// (the sum over the committed rows r < n_past of p[qi][r] * v[r], then over
// its ancestors a of p[qi][n_past + a] * v[n_past + anc[qi][a]]). vb: row 0 of
// the KV head's values, rows kvd floats apart. (nq, nv constants after inlining.)
ATT_INLINE void outputs_chunk(int nq, int nv, const float *const *p, const int32_t *const *anc, const int *na,
                              const uint16_t *vb, size_t kvd, int n_past, int c, const float *inv, float *const *o) {
    vf a[ATT_OQ][ATT_OV];
    for (int qi = 0; qi < nq; qi++)
        for (int u = 0; u < nv; u++) a[qi][u] = vf_zero();
    const uint16_t *v = vb + c;
    for (int r = 0; r < n_past; r++, v += kvd) {
        prefetch_row(r + ATT_PF_ROWS < n_past ? v + ATT_PF_ROWS * kvd : v, (size_t)nv * SD_VW * sizeof(uint16_t));
        vf w[ATT_OV];
        for (int u = 0; u < nv; u++) w[u] = vf_load_h(v + u * SD_VW);
        for (int qi = 0; qi < nq; qi++) {
            const vf b = vf_set1(p[qi][r]);
            for (int u = 0; u < nv; u++) a[qi][u] = vf_fma(b, w[u], a[qi][u]);
        }
    }
    const uint16_t *vn = vb + (size_t)n_past * kvd + c; // the batch's rows
    for (int qi = 0; qi < nq; qi++) {
        for (int j = 0; j < na[qi]; j++) {
            const uint16_t *w = vn + (size_t)anc[qi][j] * kvd;
            const vf b = vf_set1(p[qi][n_past + j]);
            for (int u = 0; u < nv; u++) a[qi][u] = vf_fma(b, vf_load_h(w + u * SD_VW), a[qi][u]);
        }
        for (int u = 0; u < nv; u++) vf_store(o[qi] + c + u * SD_VW, vf_mul(a[qi][u], vf_set1(inv[qi])));
    }
}

// One query tile's outputs, all hd dims: chunks of ATT_OV vectors, then
// single vectors, then (head sizes that are not a multiple of the vector
// width) scalar elements. An element takes the same path for every tile.
ATT_INLINE void outputs_tile(int nq, const float *const *p, const int32_t *const *anc, const int *na,
                             const uint16_t *vb, size_t kvd, int n_past, int hd, const float *inv, float *const *o) {
    int c = 0;
    for (; c + ATT_OV * SD_VW <= hd; c += ATT_OV * SD_VW)
        outputs_chunk(nq, ATT_OV, p, anc, na, vb, kvd, n_past, c, inv, o);
    for (; c + SD_VW <= hd; c += SD_VW) outputs_chunk(nq, 1, p, anc, na, vb, kvd, n_past, c, inv, o);
    const uint16_t *vn = vb + (size_t)n_past * kvd;
    for (; c < hd; c++)
        for (int qi = 0; qi < nq; qi++) {
            float a0 = 0.0f;
            for (int r = 0; r < n_past; r++) a0 = p[qi][r] * sd_fp16_to_fp32(vb[(size_t)r * kvd + c]) + a0;
            for (int j = 0; j < na[qi]; j++)
                a0 = p[qi][n_past + j] * sd_fp16_to_fp32(vn[(size_t)anc[qi][j] * kvd + c]) + a0;
            o[qi][c] = a0 * inv[qi];
        }
}

// The two tiles with the query count nq (1..max) as a compile-time constant.
#define ATT_K(k, max) ((k) < (max) ? (k) : (max))
#define ATT_CASES(F, max, ...)                                                                               \
    switch (nq) {                                                                                            \
    case 1: F(1, __VA_ARGS__); break;                                                                        \
    case 2: F(ATT_K(2, max), __VA_ARGS__); break;                                                            \
    case 3: F(ATT_K(3, max), __VA_ARGS__); break;                                                            \
    case 4: F(ATT_K(4, max), __VA_ARGS__); break;                                                            \
    case 5: F(ATT_K(5, max), __VA_ARGS__); break;                                                            \
    case 6: F(ATT_K(6, max), __VA_ARGS__); break;                                                            \
    case 7: F(ATT_K(7, max), __VA_ARGS__); break;                                                            \
    default: F(ATT_K(8, max), __VA_ARGS__); break;                                                           \
    }

static void scores_tq(int nq, const float *const *q, const uint16_t *kt, int hd, int nv, float scale,
                      float *const *sc) {
    ATT_CASES(scores_tile, ATT_TQ, q, kt, hd, nv, scale, sc)
}

static void outputs_tq(int nq, const float *const *p, const int32_t *const *anc, const int *na, const uint16_t *vb,
                       size_t kvd, int n_past, int hd, const float *inv, float *const *o) {
    ATT_CASES(outputs_tile, ATT_OQ, p, anc, na, vb, kvd, n_past, hd, inv, o)
}

// Softmax in place over sc[0..n) (n >= 1), in two steps so that a block's
// queries can go through each step one after another (their dependency
// chains then overlap instead of running back to back). softmax_max pads sc
// to the vector width with -inf (exp gives 0: the sum is unchanged; sc must
// have room) and returns the maximum; softmax_exp replaces sc by the
// exponentials of sc - mx and returns 1 / their sum.
static float softmax_max(float *sc, int n) {
    const int np = (n + SD_VW - 1) / SD_VW * SD_VW;
    for (int j = n; j < np; j++) sc[j] = -INFINITY;
    vf m = vf_set1(-INFINITY);
    for (int j = 0; j < np; j += SD_VW) m = vf_max(m, vf_load(sc + j));
    return vf_hmax(m);
}

static float softmax_exp(float *sc, int n, float mx) {
    const int np = (n + SD_VW - 1) / SD_VW * SD_VW;
    const vf vm = vf_set1(mx);
    vf sum = vf_zero();
    for (int j = 0; j < np; j += SD_VW) {
        const vf e = vf_exp(vf_sub(vf_load(sc + j), vm));
        vf_store(sc + j, e);
        sum = vf_add(sum, e);
    }
    return 1.0f / vf_hsum(sum);
}

typedef struct {
    const sd_fwd_pass *p;
    int layer;
    const sd_mm_act *out;  // NULL, or where the outputs also go, converted for the output projection
} att_job;

// A block of nq <= SD_ATT_QB queries u0..u0+nq of KV head g of segment sg;
// query u is head g * grp + u % grp of the segment's node u / grp (row
// sg->t0 + u / grp of the pass). Thread ith's scores go to its part of the
// session's att_scores.
static void att_block(const att_job *job, const sd_fwd_seg *sg, int g, int u0, int nq, int ith) {
    sd_session *s = sg->s;
    const sd_hparams *hp = &s->m->hp;
    const int hd = hp->head_dim, grp = hp->n_head / hp->n_head_kv, n_past = s->n_past;
    const size_t kvd = (size_t)s->kv_dim, ld = (size_t)s->kt_nblk * SD_KT_W, qd = (size_t)s->q_dim;
    const uint16_t *kt = kt_head(s, job->layer, g);
    const uint16_t *vb = s->v_cache + (size_t)(job->layer - s->l0) * s->n_ctx * kvd + (size_t)g * hd;
    float *scratch = s->att_scores + (size_t)ith * SD_ATT_QB * ld;
    const float *qrows = job->p->q + (size_t)sg->t0 * qd;
    float *orows = job->p->att + (size_t)sg->t0 * qd;
    const float *q[SD_ATT_QB];
    float *sc[SD_ATT_QB], *o[SD_ATT_QB], inv[SD_ATT_QB];
    const int32_t *anc[SD_ATT_QB];
    int na[SD_ATT_QB];
    for (int k = 0; k < nq; k++) {
        const int i = (u0 + k) / grp, h = g * grp + (u0 + k) % grp;
        q[k] = qrows + (size_t)i * qd + (size_t)h * hd;
        o[k] = orows + (size_t)i * qd + (size_t)h * hd;
        sc[k] = scratch + (size_t)k * ld;
        anc[k] = s->anc + (size_t)i * s->n_batch;
        na[k] = s->n_anc[i];
    }
    // Keys up to the last node of the block (a node's ancestors come before it).
    const int i_last = (u0 + nq - 1) / grp, nv = (n_past + i_last + 1 + SD_VW - 1) / SD_VW;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int k = 0; k < nq; k += ATT_TQ)
        scores_tq(SD_MIN(ATT_TQ, nq - k), q + k, kt, hd, nv, scale, sc + k);
    float mx[SD_ATT_QB];
    for (int k = 0; k < nq; k++) {
        // the ancestors' scores right after the committed ones (anc[a] >= a, increasing)
        for (int a = 0; a < na[k]; a++) sc[k][n_past + a] = sc[k][n_past + anc[k][a]];
        mx[k] = softmax_max(sc[k], n_past + na[k]);
    }
    for (int k = 0; k < nq; k++) inv[k] = softmax_exp(sc[k], n_past + na[k], mx[k]);
    for (int k = 0; k < nq; k += ATT_OQ)
        outputs_tq(SD_MIN(ATT_OQ, nq - k), (const float *const *)sc + k, anc + k, na + k, vb, kvd, n_past, hd,
                   inv + k, o + k);
    if (job->out) // the output projection's input, converted here while it is in this core's cache
        for (int k = 0; k < nq; k++) {
            const int i = (u0 + k) / grp, h = g * grp + (u0 + k) % grp;
            sd_mm_act_put(job->out, orows + (size_t)i * qd, sg->t0 + i, (int64_t)h * hd, (int64_t)(h + 1) * hd);
        }
}

// Thread ith's queries [*u0, *u1) of segment j, whose queries cost w each
// (the keys they read) and start at weight base, among all queries of the
// pass split by weight [lo, hi): those whose start base + u w lies there.
static void seg_share(long q, long w, long base, long lo, long hi, long *u0, long *u1) {
    *u0 = lo <= base ? 0 : SD_MIN(q, (lo - base + w - 1) / w);
    *u1 = hi <= base ? 0 : SD_MIN(q, (hi - base + w - 1) / w);
}

// The queries of all segments and KV heads, (segment, g, u) flattened, split
// among the threads (evenly by count for one segment; for several, by the
// keys they read, so that a session with a long context does not leave one
// thread with most of the work); each thread takes its share in blocks
// within one segment and KV head. How the queries fall into blocks changes
// no bit of any query's output.
static void att_task(void *arg, int ith, int nth) {
    const att_job *job = arg;
    const sd_fwd_pass *p = job->p;
    const sd_hparams *hp = &p->m->hp;
    const int grp = hp->n_head / hp->n_head_kv;
    long total = 0, lo, hi, base = 0;
    for (int j = 0; j < p->n_seg; j++)
        total += (long)p->seg[j].n * grp * hp->n_head_kv * (p->n_seg > 1 ? p->seg[j].s->n_past + p->seg[j].n : 1);
    sd_split_range(total, ith, nth, &lo, &hi);
    for (int j = 0; j < p->n_seg && base < hi; j++) {
        const sd_fwd_seg *sg = &p->seg[j];
        const long per_g = (long)sg->n * grp, q = per_g * hp->n_head_kv;
        const long w = p->n_seg > 1 ? sg->s->n_past + sg->n : 1;
        long u, u_end;
        seg_share(q, w, base, lo, hi, &u, &u_end);
        while (u < u_end) {
            const int g = (int)(u / per_g);
            const long u0 = u % per_g, u1 = SD_MIN(per_g, u0 + (u_end - u));
            const int nq = (int)SD_MIN(SD_ATT_QB, u1 - u0);
            att_block(job, sg, g, (int)u0, nq, ith);
            u += nq;
        }
        base += q * w;
    }
}

// Below this many multiply-adds (scores alone) the attention runs on the
// calling thread: waking the pool costs more than the work.
#define SD_ATT_PAR_MIN 16384

int sd_attention_parallel(const sd_fwd_pass *p) {
    const sd_hparams *hp = &p->m->hp;
    long work = 0;
    for (int j = 0; j < p->n_seg; j++)
        work += (long)p->seg[j].n * hp->n_head * (p->seg[j].s->n_past + p->seg[j].n) * hp->head_dim;
    return sd_pool_size(p->mm->pool) > 1 && work >= SD_ATT_PAR_MIN;
}

void sd_attention(const sd_fwd_pass *p, int layer, const sd_mm_act *out) {
    att_job job = {p, layer, out};
    if (sd_attention_parallel(p)) sd_pool_run(p->mm->pool, att_task, &job);
    else att_task(&job, 0, 1);
}

void sd_attention_part(const sd_fwd_pass *p, int layer, const sd_mm_act *out, int ith, int nth) {
    att_job job = {p, layer, out};
    att_task(&job, ith, nth);
}

void sd_kt_store_dims(sd_session *s, int layer, const float *k, int n, int d0, int d1) {
    const sd_hparams *hp = &s->m->hp;
    const int hd = hp->head_dim;
    uint16_t h[256];
    for (int g = d0 / hd; g * hd < d1; g++) {
        uint16_t *kt = kt_head(s, layer, g);
        const int c0 = SD_MAX(d0 - g * hd, 0), c1 = SD_MIN(d1 - g * hd, hd);
        for (int i = 0; i < n; i++) {
            uint16_t *dst = kt + kt_off(hd, s->n_past + i);
            const float *row = k + (size_t)i * s->kv_dim + (size_t)g * hd;
            for (int c = c0; c < c1; c += 256) { // converted a run at a time, then stored transposed
                const int e = SD_MIN(c1, c + 256);
                sd_f16_row(h, row + c, e - c);
                for (int j = c; j < e; j++) dst[(size_t)j * SD_KT_W] = h[j - c];
            }
        }
    }
}

void sd_kt_store(sd_session *s, int layer, const float *k, int n) { sd_kt_store_dims(s, layer, k, n, 0, s->kv_dim); }

void sd_kt_move(sd_session *s, int layer, int dst, int src) {
    const sd_hparams *hp = &s->m->hp;
    const int hd = hp->head_dim;
    for (int g = 0; g < hp->n_head_kv; g++) {
        uint16_t *kt = kt_head(s, layer, g), *d = kt + kt_off(hd, dst);
        const uint16_t *r = kt + kt_off(hd, src);
        for (int c = 0; c < hd; c++) d[(size_t)c * SD_KT_W] = r[(size_t)c * SD_KT_W];
    }
}
