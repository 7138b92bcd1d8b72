// ops_attn.c - masked multi-head attention with GQA, forward and backward
// (ops.h), for any allowed-key mask: EAGLE-3's training-time test (each
// step's rows see the first step's causal prefix and their own draft chain,
// docs/heads.md) is one such mask.
//
// Forward, per query i and head h (KV head g = h / (n_head / n_kv)):
//   s_e = scale q_i . k_{key(e)},  p = softmax(s) over i's entries e,
//   o_i = sum_e p_e v_{key(e)}.
// Backward, with dO given:
//   dp_e = dO_i . v_{key(e)},  ds_e = p_e (dp_e - sum_e' p_e' dp_e'),
//   dq_i = scale sum_e ds_e k_{key(e)},
//   dk_j = scale sum over entries e of key j (and heads h of group g) ds_e q_i,
//   dv_j = sum over the same of p_e dO_i.
// The first pass runs over queries, the second over keys, so no two threads
// ever add into one row and each sum runs in a fixed order (entries
// ascending, then heads ascending). Rows are dealt to threads in turn
// (r = ith, ith + nth, ...): a causal mask gives later queries more keys.
// The head size is small (64), so dots and row updates run in vf lanes
// without register tiling: attention is a few percent of a training step.
#include <math.h>
#include <string.h>

#include "common.h"
#include "kernels/vmath.h"
#include "train/ops.h"

static inline float dot_f(const float *x, const float *y, int n) {
    int i = 0;
    float s = 0.0f;
#if SD_VW > 1
    vf acc = vf_zero();
    for (; i + SD_VW <= n; i += SD_VW) acc = vf_fma(vf_load(x + i), vf_load(y + i), acc);
    s = vf_hsum(acc);
#endif
    for (; i < n; i++) s = SD_FMAF(x[i], y[i], s);
    return s;
}

// y += a x over n floats.
static inline void axpy_f(float *y, float a, const float *x, int n) {
    int i = 0;
#if SD_VW > 1
    const vf va = vf_set1(a);
    for (; i + SD_VW <= n; i += SD_VW) vf_store(y + i, vf_fma(va, vf_load(x + i), vf_load(y + i)));
#endif
    for (; i < n; i++) y[i] = SD_FMAF(a, x[i], y[i]);
}

void sd_tr_mask_transpose(sd_tr_mask *m, int32_t *k_off, int32_t *k_ent, int32_t *k_q) {
    memset(k_off, 0, sizeof(int32_t) * (size_t)(m->n_k + 1));
    for (int e = 0; e < m->q_off[m->n_q]; e++) k_off[m->q_key[e] + 1]++;
    for (int j = 0; j < m->n_k; j++) k_off[j + 1] += k_off[j];
    // k_off[j] serves as key j's fill cursor (it ends at the next key's
    // start, shifted back below); entries come in ascending order.
    for (int i = 0; i < m->n_q; i++)
        for (int e = m->q_off[i]; e < m->q_off[i + 1]; e++) {
            const int32_t x = k_off[m->q_key[e]]++;
            k_ent[x] = e;
            k_q[x] = i;
        }
    for (int j = m->n_k; j > 0; j--) k_off[j] = k_off[j - 1];
    k_off[0] = 0;
    m->k_off = k_off;
    m->k_ent = k_ent;
    m->k_q = k_q;
}

// ---------------------------------------------------------------- forward

typedef struct attn_job {
    const sd_tr_mask *m;
    int n_head, n_kv, hd;
    float scale;
    const float *Q, *K, *V, *P, *dO;
    float *O, *Pw, *dQ, *dK, *dV, *dS;
} attn_job;

static void attn_query(const attn_job *j, int i) {
    const sd_tr_mask *m = j->m;
    const int hd = j->hd, grp = j->n_head / j->n_kv, nnz = m->q_off[m->n_q];
    const int e0 = m->q_off[i], e1 = m->q_off[i + 1];
    for (int h = 0; h < j->n_head; h++) {
        const float *q = j->Q + ((size_t)i * j->n_head + h) * hd;
        const size_t kvo = (size_t)(h / grp) * hd;
        float *p = j->Pw + (size_t)h * nnz;
        float *o = j->O + ((size_t)i * j->n_head + h) * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        if (e0 == e1) continue;
        float mx = -INFINITY;
        for (int e = e0; e < e1; e++) {
            p[e] = j->scale * dot_f(q, j->K + (size_t)m->q_key[e] * j->n_kv * hd + kvo, hd);
            mx = p[e] > mx ? p[e] : mx;
        }
        float sum = 0.0f;
        for (int e = e0; e < e1; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        const float inv = 1.0f / sum;
        for (int e = e0; e < e1; e++) {
            p[e] *= inv;
            axpy_f(o, p[e], j->V + (size_t)m->q_key[e] * j->n_kv * hd + kvo, hd);
        }
    }
}

static void attn_fwd_task(void *arg, int ith, int nth) {
    const attn_job *j = arg;
    for (int i = ith; i < j->m->n_q; i += nth) attn_query(j, i);
}

// Whether a job of this many multiply-adds is worth the pool's hand-over.
static int use_pool(const sd_tr_ctx *ctx, double work) { return ctx->nth > 1 && work > 1e5; }

void sd_tr_attn(const sd_tr_ctx *ctx, const sd_tr_mask *m, int n_head, int n_kv, int hd, const float *Q,
                const float *K, const float *V, float *O, float *P) {
    attn_job j = {.m = m, .n_head = n_head, .n_kv = n_kv, .hd = hd, .scale = 1.0f / sqrtf((float)hd),
                  .Q = Q, .K = K, .V = V, .O = O, .Pw = P};
    if (use_pool(ctx, 2.0 * m->q_off[m->n_q] * n_head * hd))
        sd_pool_run(ctx->pool, attn_fwd_task, &j);
    else
        attn_fwd_task(&j, 0, 1);
}

// ---------------------------------------------------------------- backward

// Pass 1, query i: dS of its entries and dQ.
static void attn_bwd_query(const attn_job *j, int i) {
    const sd_tr_mask *m = j->m;
    const int hd = j->hd, grp = j->n_head / j->n_kv, nnz = m->q_off[m->n_q];
    const int e0 = m->q_off[i], e1 = m->q_off[i + 1];
    for (int h = 0; h < j->n_head; h++) {
        const float *dout = j->dO + ((size_t)i * j->n_head + h) * hd;
        const size_t kvo = (size_t)(h / grp) * hd;
        const float *p = j->P + (size_t)h * nnz;
        float *ds = j->dS + (size_t)h * nnz;
        float *dq = j->dQ + ((size_t)i * j->n_head + h) * hd;
        memset(dq, 0, sizeof(float) * (size_t)hd);
        float dsum = 0.0f;   // sum_e p_e dp_e
        for (int e = e0; e < e1; e++) {
            ds[e] = dot_f(dout, j->V + (size_t)m->q_key[e] * j->n_kv * hd + kvo, hd);   // dp_e
            dsum = SD_FMAF(p[e], ds[e], dsum);
        }
        for (int e = e0; e < e1; e++) {
            ds[e] = p[e] * (ds[e] - dsum);
            axpy_f(dq, j->scale * ds[e], j->K + (size_t)m->q_key[e] * j->n_kv * hd + kvo, hd);
        }
    }
}

static void attn_bwd_q_task(void *arg, int ith, int nth) {
    const attn_job *j = arg;
    for (int i = ith; i < j->m->n_q; i += nth) attn_bwd_query(j, i);
}

// Pass 2, key row jk: dK and dV of each KV head from every entry that saw it.
static void attn_bwd_key(const attn_job *j, int jk) {
    const sd_tr_mask *m = j->m;
    const int hd = j->hd, grp = j->n_head / j->n_kv, nnz = m->q_off[m->n_q];
    for (int g = 0; g < j->n_kv; g++) {
        float *dk = j->dK + ((size_t)jk * j->n_kv + g) * hd;
        float *dv = j->dV + ((size_t)jk * j->n_kv + g) * hd;
        for (int x = m->k_off[jk]; x < m->k_off[jk + 1]; x++) {
            const int e = m->k_ent[x], i = m->k_q[x];
            for (int h = g * grp; h < (g + 1) * grp; h++) {
                const size_t qo = ((size_t)i * j->n_head + h) * hd;
                axpy_f(dk, j->scale * j->dS[(size_t)h * nnz + e], j->Q + qo, hd);
                axpy_f(dv, j->P[(size_t)h * nnz + e], j->dO + qo, hd);
            }
        }
    }
}

static void attn_bwd_k_task(void *arg, int ith, int nth) {
    const attn_job *j = arg;
    for (int jk = ith; jk < j->m->n_k; jk += nth) attn_bwd_key(j, jk);
}

void sd_tr_attn_bwd(const sd_tr_ctx *ctx, const sd_tr_mask *m, int n_head, int n_kv, int hd, const float *Q,
                    const float *K, const float *V, const float *P, const float *dO, float *dQ, float *dK, float *dV,
                    float *dS) {
    attn_job j = {.m = m, .n_head = n_head, .n_kv = n_kv, .hd = hd, .scale = 1.0f / sqrtf((float)hd),
                  .Q = Q, .K = K, .V = V, .P = P, .dO = dO, .dQ = dQ, .dK = dK, .dV = dV, .dS = dS};
    if (use_pool(ctx, 2.0 * m->q_off[m->n_q] * n_head * hd)) {
        sd_pool_run(ctx->pool, attn_bwd_q_task, &j);
        sd_pool_run(ctx->pool, attn_bwd_k_task, &j);
    } else {
        attn_bwd_q_task(&j, 0, 1);
        attn_bwd_k_task(&j, 0, 1);
    }
}

// ---------------------------------------------------------------- the training-time-test mask

int sd_tr_ttt_rows(int T, int k) { return T - 1 - k > 0 ? T - 1 - k : 0; }

int sd_tr_ttt_off(int T, int k) {
    int off = 0;
    for (int s = 0; s < k; s++) off += sd_tr_ttt_rows(T, s);
    return off;
}

int sd_tr_mask_ttt(int T, int k, int32_t *q_off, int32_t *q_key) {
    const int n = sd_tr_ttt_rows(T, k);
    int e = 0;
    q_off[0] = 0;
    for (int r = 0; r < n; r++) {
        for (int c = 0; c <= r; c++) q_key[e++] = c;                      // step 0, rows 1..j
        for (int s = 1; s <= k; s++) q_key[e++] = sd_tr_ttt_off(T, s) + r; // row j of steps 1..k
        q_off[r + 1] = e;
    }
    return e;
}
