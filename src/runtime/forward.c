// forward.c - one batched forward pass over a token tree (or chain).
//
// All nodes of a batch go through every weight matrix together, so the weights
// are streamed from memory once per call whatever the batch size. Matrices
// with the same input share one pool run (Q, K, V; gate and up, with SwiGLU
// applied by each thread to its columns), and the attention (attention.c)
// runs inside the Q, K, V run where it can, so a layer costs 4 pool runs.
// The inputs of the output projection and of the down matrix are converted
// to 8 bits by the threads that computed them (the attention, SwiGLU); the
// normalized inputs of Q, K, V and of gate and up by all threads, a share of
// the nodes each, in the run's preparation. Attention honours the tree: node i sees the
// committed cache [0, n_past) plus its ancestors in the batch and itself. The
// K/V rows of node i are written at slot n_past + i (RoPE already applied with
// the node's own position), so a later sd_session_commit only has to move rows.
//
// A pass may hold the batches of several sessions (sd_batcher_forward,
// batcher.c): their nodes are the segments of one activation matrix, every
// step but the attention runs over all rows at once, and the attention runs
// per segment against that segment's session (forward.h). Every step is per
// row (the matmuls are batch invariant, house rule 18), so a node gets the
// same bits in a pass of several sessions as in its session's own forward.
#include <math.h>
#include <string.h>

#include "common.h"
#include "specdec.h"
#include "runtime/forward.h"
#include "runtime/gpu_session.h"
#include "kernels/vmath.h"

// ---------------------------------------------------------------- small helpers

// out = x / rms(x) * w over n elements (the sum of squares in four vector
// chains, a fixed order for a given n: each row gets the same bits anywhere).
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    vf a0 = vf_zero(), a1 = vf_zero(), a2 = vf_zero(), a3 = vf_zero();
    int i = 0;
    for (; i + 4 * SD_VW <= n; i += 4 * SD_VW) {
        a0 = vf_fma(vf_load(x + i), vf_load(x + i), a0);
        a1 = vf_fma(vf_load(x + i + SD_VW), vf_load(x + i + SD_VW), a1);
        a2 = vf_fma(vf_load(x + i + 2 * SD_VW), vf_load(x + i + 2 * SD_VW), a2);
        a3 = vf_fma(vf_load(x + i + 3 * SD_VW), vf_load(x + i + 3 * SD_VW), a3);
    }
    for (; i + SD_VW <= n; i += SD_VW) a0 = vf_fma(vf_load(x + i), vf_load(x + i), a0);
    float ss = vf_hsum(vf_add(vf_add(a0, a1), vf_add(a2, a3)));
    for (; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    const vf vr = vf_set1(r);
    for (i = 0; i + SD_VW <= n; i += SD_VW) vf_store(out + i, vf_mul(vf_mul(vf_load(x + i), vr), vf_load(w + i)));
    for (; i < n; i++) out[i] = x[i] * r * w[i];
}

// RoPE_NORM on the dims [j0, j1) of one head (v: its first dim; j0, j1
// even): the pair (2k, 2k + 1) turns by the angle whose (cos, sin) is
// (cs[2k], cs[2k + 1]). SD_VW dims at a time, the rest one pair at a time
// with the same fused operations (a c - b s and b c + a s, each with one
// product rounded), so a dim gets the same bits whatever the span.
static void rope_norm_span(float *v, int j0, int j1, const float *cs) {
    int j = j0;
#if SD_VW > 1
    for (; j + SD_VW <= j1; j += SD_VW) vf_store(v + j, vf_rot_pairs(vf_load(v + j), vf_load(cs + j)));
#endif
    for (; j < j1; j += 2) {
        const float c = cs[j], s = cs[j + 1], a = v[j], b = v[j + 1];
        v[j] = fmaf(a, c, -(b * s));
        v[j + 1] = fmaf(b, c, a * s);
    }
}

// Rotates the first n_rot dims of each of n_heads heads of one row.
static void rope_row(float *row, int n_heads, int head_dim, int n_rot, int type, const float *cs) {
    const int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = row + (size_t)h * head_dim;
        if (type == SD_ROPE_NORM) {
            rope_norm_span(v, 0, n_rot, cs);
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

typedef struct {
    const sd_fwd_pass *p;
    const float *norm_w;  // pre_norm: the RMSNorm weights
    int add;              // pre_norm: 1 if xn holds a sublayer's output still to be added to x
    int layer;            // qkv_rows: the layer
    const sd_mm_act *act; // swiglu_cols, att_after: where the result also goes, converted for the next
                          // matrix (down; the output projection), or NULL
    int hid_lo, hid_hi;   // pre_norm: after the add, x is the output of layers [hid_lo, hid_hi), whose
                          // wanted hidden rows it copies out; hid_lo == hid_hi: none
} fwd_job;

// The segment that row t of the pass belongs to.
static const sd_fwd_seg *seg_of(const sd_fwd_pass *p, int64_t t) {
    int j = 0;
    while (j + 1 < p->n_seg && t >= p->seg[j + 1].t0) j++;
    return &p->seg[j];
}

// Copies batch node i's residual row x (the output of layers [lo, hi)) to
// the caller's buffer of session s for every requested layer in that range.
static void hidden_put(const sd_session *s, int64_t i, const float *x, int lo, int hi) {
    const int E = s->m->hp.n_embd;
    for (int k = 0; k < s->n_hid; k++) {
        const int l = s->hid_layers[k];
        if (l >= lo && l < hi)
            memcpy(s->hid_out + ((size_t)s->hid_row[i] * s->n_hid + k) * E, x, (size_t)E * sizeof(float));
    }
}

// sd_mm_pre_fn: for rows [t0, t1), x += xn (if add), the hidden rows that
// x now holds copied out, then xn = rmsnorm(x).
static void pre_norm(void *arg, int64_t t0, int64_t t1) {
    const fwd_job *job = arg;
    const sd_fwd_pass *p = job->p;
    const int E = p->m->hp.n_embd;
    for (int64_t t = t0; t < t1; t++) {
        float *x = p->x + t * E, *xn = p->xn + t * E;
        if (job->add)
            for (int k = 0; k < E; k++) x[k] += xn[k];
        if (job->hid_lo < job->hid_hi) {
            const sd_fwd_seg *sg = seg_of(p, t);
            if (sg->s->n_hid > 0 && sg->s->hid_row[t - sg->t0] >= 0)
                hidden_put(sg->s, t - sg->t0, x, job->hid_lo, job->hid_hi);
        }
        rmsnorm(xn, x, job->norm_w, E, p->m->hp.rms_eps);
    }
}

// silu(g) * u over n elements; element-wise, so each element's result is the
// same wherever it sits (the partial last group goes through the same vector
// code via a padded copy): batch invariance.
static inline vf swiglu_vec(vf g, vf u) {
    return vf_mul(vf_div(g, vf_add(vf_set1(1.0f), vf_exp(vf_sub(vf_zero(), g)))), u);
}
static void swiglu_span(float *g, const float *u, long n) {
    long k = 0;
    for (; k + SD_VW <= n; k += SD_VW) vf_store(g + k, swiglu_vec(vf_load(g + k), vf_load(u + k)));
    if (k < n) {
        float tg[SD_VW] = {0}, tu[SD_VW] = {0};
        memcpy(tg, g + k, (size_t)(n - k) * sizeof(float));
        memcpy(tu, u + k, (size_t)(n - k) * sizeof(float));
        vf_store(tg, swiglu_vec(vf_load(tg), vf_load(tu)));
        memcpy(g + k, tg, (size_t)(n - k) * sizeof(float));
    }
}

// sd_mm_post_fn: ff_g = silu(ff_g) * ff_u on columns [r0, r1) of every row,
// then (job->act) those columns converted for the down matrix: the thread
// that computed them is the only one that reads ff_g and ff_u.
static void swiglu_cols(void *arg, int64_t r0, int64_t r1) {
    const fwd_job *job = arg;
    const sd_fwd_pass *p = job->p;
    const long n_ff = p->m->hp.n_ff;
    for (long t = 0; t < p->n; t++) {
        swiglu_span(p->ff_g + t * n_ff + r0, p->ff_u + t * n_ff + r0, (long)(r1 - r0));
        if (job->act) sd_mm_act_put(job->act, p->ff_g + t * n_ff, t, r0, r1);
    }
}

// b added to columns [r0, r1) of n rows of dim floats (b NULL: nothing).
static void add_bias_cols(float *y, const sd_tensor *b, int n, int dim, int64_t r0, int64_t r1) {
    if (!b) return;
    const float *bv = b->data;
    for (int t = 0; t < n; t++)
        for (int64_t k = r0; k < r1; k++) y[(size_t)t * dim + k] += bv[k];
}

// RoPE_NORM on columns [r0, r1) (even) of n rows of heads of head_dim.
static void rope_cols(const sd_fwd_pass *p, float *y, int n, int dim, int64_t r0, int64_t r1) {
    const sd_hparams *hp = &p->m->hp;
    const int hd = hp->head_dim, half = hp->n_rot / 2;
    for (int t = 0; t < n; t++) {
        const float *cs = p->rope_cs + (size_t)t * half * 2;
        for (int64_t h = r0 / hd; h * hd < r1; h++) {
            const int j0 = (int)SD_MAX(r0 - h * hd, 0), j1 = (int)SD_MIN(SD_MIN(r1 - h * hd, hd), hp->n_rot);
            if (j0 < j1) rope_norm_span(y + (size_t)t * dim + h * hd, j0, j1, cs);
        }
    }
}

// Columns [c0, c1) of the pass's K rows into each session's transposed
// cache and of its V rows into each session's V cache (fp16), at the
// session's pending slots of layer l.
static void kv_store_cols(const sd_fwd_pass *p, int l, int c0, int c1, int store_k, int store_v) {
    for (int j = 0; j < p->n_seg; j++) {
        const sd_fwd_seg *sg = &p->seg[j];
        sd_session *s = sg->s;
        const size_t kvd = (size_t)s->kv_dim;
        if (store_k) sd_kt_store_dims(s, l, p->k + (size_t)sg->t0 * kvd, sg->n, c0, c1);
        if (store_v) {
            uint16_t *vc = s->v_cache + ((size_t)(l - s->l0) * s->n_ctx + s->n_past) * kvd;
            for (int i = 0; i < sg->n; i++)
                sd_f16_row(vc + i * kvd + c0, p->v + (size_t)(sg->t0 + i) * kvd + c0, c1 - c0);
        }
    }
}

// sd_mm_rows_fn of the Q, K, V run (RoPE_NORM models): the thread that
// computed columns [r0, r1) of Q, K or V adds their bias, rotates them (Q,
// K) and stores K's and V's into the sessions' caches, while they are in
// its cache.
static void qkv_rows(void *arg, int m, int64_t r0, int64_t r1) {
    const fwd_job *job = arg;
    const sd_fwd_pass *p = job->p;
    const sd_layer *L = &p->m->layers[job->layer];
    const int qd = p->m->hp.n_head * p->m->hp.head_dim, kvd = p->m->hp.n_head_kv * p->m->hp.head_dim;
    if (m == 0) {
        add_bias_cols(p->q, L->bq, p->n, qd, r0, r1);
        rope_cols(p, p->q, p->n, qd, r0, r1);
    } else if (m == 1) {
        add_bias_cols(p->k, L->bk, p->n, kvd, r0, r1);
        rope_cols(p, p->k, p->n, kvd, r0, r1);
        kv_store_cols(p, job->layer, (int)r0, (int)r1, 1, 0);
    } else {
        add_bias_cols(p->v, L->bv, p->n, kvd, r0, r1);
        kv_store_cols(p, job->layer, (int)r0, (int)r1, 0, 1);
    }
}

// sd_mm_rows_fn of the output matrix in a pass of several sessions: the
// thread that computed columns [r0, r1) of the logits copies them to each
// session's logit rows.
static void logit_rows(void *arg, int m, int64_t r0, int64_t r1) {
    (void)m;
    const sd_fwd_pass *p = arg;
    const size_t V = (size_t)p->m->hp.n_vocab;
    for (int j = 0; j < p->n_seg; j++) {
        const sd_fwd_seg *sg = &p->seg[j];
        for (int r = 0; r < sg->n_out; r++)
            memcpy(sg->s->logits + r * V + r0, p->logits + (size_t)(sg->o0 + r) * V + r0,
                   (size_t)(r1 - r0) * sizeof(float));
    }
}

// The after hook of the Q, K, V run: the attention, on the run's threads.
static void att_after(void *arg, int ith, int nth) {
    const fwd_job *job = arg;
    sd_attention_part(job->p, job->layer, job->act, ith, nth);
}

// The tensor a matmul of this pass reads: with float activations
// (sd_batch.precise) the file's layout, which has a dequantizer, else the
// model's (possibly repacked) copy.
static const sd_tensor *mm_weight(const sd_fwd_pass *p, const sd_tensor *w) {
    return p->mm->act_f32 ? sd_model_file_tensor(p->m, w) : w;
}

// Matrices w[0..n_mats) (n_mats <= 4) sharing the input x (their ne[0]);
// x may be NULL with hooks->act.
static void matmul_multi_t(const sd_fwd_pass *p, int n_mats, const sd_tensor *const *w, const float *x, int n_tok,
                           float *const *y, const sd_mm_hooks *hooks) {
    int types[4];
    const void *W[4];
    int64_t n_out[4];
    for (int m = 0; m < n_mats; m++) {
        SD_ASSERT(w[m]->ne[0] == w[0]->ne[0]);
        const sd_tensor *f = mm_weight(p, w[m]);
        types[m] = f->type;
        W[m] = f->data;
        n_out[m] = w[m]->ne[1];
    }
    sd_matmul_multi(p->mm, n_mats, types, W, w[0]->ne[0], n_out, x, n_tok, y, hooks);
}

// y = x w^T, or on x already converted (act, from act_for; else NULL).
static void matmul_t(const sd_fwd_pass *p, const sd_tensor *w, const float *x, const sd_mm_act *act, int n_tok,
                     float *y) {
    const sd_mm_hooks h = {.act = act};
    matmul_multi_t(p, 1, &w, x, n_tok, &y, &h);
}

// Tells the next matrix run which matrix the run after it reads first (w): a
// prefetch hint, see sd_mm_next. None with float activations, which read the
// file's layouts.
static void hint_next(const sd_fwd_pass *p, const sd_tensor *w) {
    const sd_mm_next nx = {.W = w->data, .n_out = w->ne[1], .wrb = sd_row_size(w->type, w->ne[0])};
    const sd_mm_next none = {0};
    p->mm->next = p->mm->act_f32 ? none : nx;
}

// Sets a up (in abuf) for the activations of w's matmul over n tokens,
// converted by their producers (sd_mm_act), when that matmul takes converted
// activations and the producers' column ranges can start at multiples of its
// block: those of a head (head_dim > 0), or of a matmul's row chunks (16
// rows, or the block itself when it is a multiple of 16: sd_mm_hooks.align).
// Returns a or NULL.
static const sd_mm_act *act_for(const sd_fwd_pass *p, sd_mm_act *a, const sd_tensor *w, int n, int head_dim) {
    const sd_tensor *f = mm_weight(p, w);
    if (sd_mm_act_begin(p->mm, a, f->type, f->ne[0], n) != 0) return NULL;
    if (head_dim > 0) return head_dim % a->blk == 0 ? a : NULL;
    return 16 % a->blk == 0 || a->blk % 16 == 0 ? a : NULL;
}

// ---------------------------------------------------------------- batches

int sd_fwd_check(const sd_session *s, const sd_batch *b, char *err, size_t errlen) {
    const sd_hparams *hp = &s->m->hp;
    if (!b) return sd_err(err, errlen, "forward: no batch");
    if (!b->tokens == !b->embd)
        return sd_err(err, errlen, "forward: the batch must set exactly one of tokens and embd (%s set)",
                      b->tokens ? "both" : "neither");
    const int n = b->n;
    if (n < 1 || n > s->n_batch)
        return sd_err(err, errlen, "forward: batch of %d tokens, expected 1..%d (n_batch)", n, s->n_batch);
    if (s->n_past + n > s->n_ctx)
        return sd_errc(SD_ERR_NO_ROOM, err, errlen, "context full: %d cached + %d new tokens exceed n_ctx %d", s->n_past, n,
                      s->n_ctx);
    const int nh = b->n_hidden_layers;
    if (nh < 0 || nh > SD_MAX_HIDDEN_LAYERS)
        return sd_err(err, errlen, "forward: %d hidden layers asked, expected 0..%d (SD_MAX_HIDDEN_LAYERS)", nh,
                      SD_MAX_HIDDEN_LAYERS);
    if (nh > 0 && (!b->hidden_layers || !b->hidden_out))
        return sd_err(err, errlen, "forward: %d hidden layers asked but hidden_%s is NULL", nh,
                      b->hidden_layers ? "out" : "layers");
    for (int k = 0; k < nh; k++)
        if (b->hidden_layers[k] != SD_HIDDEN_NORM && (b->hidden_layers[k] < 0 || b->hidden_layers[k] >= hp->n_layer))
            return sd_err(err, errlen, "forward: hidden layer %d (entry %d) is out of range (0..%d or SD_HIDDEN_NORM)",
                          b->hidden_layers[k], k, hp->n_layer - 1);
    for (int i = 0; i < n; i++) {
        int32_t t = b->tokens ? b->tokens[i] : 0;
        if (t < 0 || t >= hp->n_vocab)
            return sd_err(err, errlen, "forward: token %d at batch index %d is out of range (n_vocab %d)", t, i,
                          hp->n_vocab);
        int32_t p = b->parent ? b->parent[i] : i - 1;
        if (p < -1 || p >= i)
            return sd_err(err, errlen, "forward: node %d has parent %d (must be -1 or a smaller index)", i, p);
        if (b->pos && (b->pos[i] < 0 || b->pos[i] > (1 << 30)))
            return sd_err(err, errlen, "forward: node %d has position %d", i, b->pos[i]);
    }
    return 0;
}

int sd_fwd_record(sd_session *s, const sd_batch *b) {
    const sd_hparams *hp = &s->m->hp;
    const int n = b->n, nb = s->n_batch, nh = b->n_hidden_layers;
    s->n_pending = 0; // the previous pending rows are dropped
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
    // Hidden rows: the wanted nodes' ranks.
    s->n_hid = nh;
    s->hid_out = nh > 0 ? b->hidden_out : NULL;
    for (int k = 0; k < nh; k++) s->hid_layers[k] = b->hidden_layers[k];
    if (nh > 0)
        for (int i = 0, r = 0; i < n; i++) s->hid_row[i] = !b->hidden || b->hidden[i] ? r++ : -1;
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

// Embeddings: the token rows (sd_model_token_embd does the same), or the caller's.
void sd_fwd_embed(const sd_model *m, const sd_batch *b, float *x) {
    const int E = m->hp.n_embd;
    if (b->embd) {
        memcpy(x, b->embd, (size_t)b->n * E * sizeof(float));
        return;
    }
    const sd_type_traits *et = sd_type_get(m->tok_embd->type);
    const size_t erow = sd_row_size(m->tok_embd->type, E);
    for (int i = 0; i < b->n; i++)
        et->to_float((const uint8_t *)m->tok_embd->data + (size_t)b->tokens[i] * erow, x + (size_t)i * E, E);
}

// ---------------------------------------------------------------- the forward pass

// The attention half of layer l: attention norm, then Q, K and V in one
// pool run (one activation conversion). For RoPE_NORM the same run adds the
// biases, rotates and stores K and V into the caches
// on each thread's own columns (qkv_rows) and, with enough attention work to
// split, runs the attention on its threads behind a barrier (att_after). The
// NEOX rotation pairs dims half a head apart: it runs here, after. Then the
// output projection into xn. o_act: room for the projection's converted input.
static void attention_half(const sd_fwd_pass *p, fwd_job *job, int l, sd_mm_act *o_act) {
    const sd_model *m = p->m;
    const sd_hparams *hp = &m->hp;
    const sd_layer *L = &m->layers[l];
    const int n = p->n, kvd = hp->n_head_kv * hp->head_dim, qd = hp->n_head * hp->head_dim, half = hp->n_rot / 2;
    job->norm_w = L->attn_norm->data;
    job->layer = l;
    job->act = act_for(p, o_act, L->wo, n, hp->head_dim); // filled by the attention
    const int in_task = hp->rope_type == SD_ROPE_NORM;
    const int att_in_task = in_task && sd_attention_parallel(p);
    const sd_mm_hooks h = {.pre = pre_norm, .pre_arg = job, .rows = in_task ? qkv_rows : NULL, .rows_arg = job,
                           .after = att_in_task ? att_after : NULL, .after_arg = job};
    const sd_tensor *w3[3] = {L->wq, L->wk, L->wv};
    float *y3[3] = {p->q, p->k, p->v};
    hint_next(p, L->wo);
    matmul_multi_t(p, 3, w3, p->xn, n, y3, &h);
    if (!in_task) {
        add_bias_cols(p->q, L->bq, n, qd, 0, qd);
        add_bias_cols(p->k, L->bk, n, kvd, 0, kvd);
        add_bias_cols(p->v, L->bv, n, kvd, 0, kvd);
        for (int i = 0; i < n; i++) {
            const float *cs = p->rope_cs + (size_t)i * half * 2;
            rope_row(p->q + (size_t)i * qd, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_type, cs);
            rope_row(p->k + (size_t)i * kvd, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_type, cs);
        }
        kv_store_cols(p, l, 0, kvd, 1, 1);
    }
    if (!att_in_task) sd_attention(p, l, job->act);
    hint_next(p, L->w_gate);
    matmul_t(p, L->wo, p->att, job->act, n, p->xn);
}

// The FFN half of layer l: residual add and FFN norm, then gate and up in one
// pool run, each thread applying SwiGLU to its columns (shapes were validated
// at load: both are [n_embd, n_ff]), then the down matrix into xn. next: the
// matrix read after it (the next layer's Q, or the output), or NULL.
static void ffn_half(const sd_fwd_pass *p, fwd_job *job, int l, sd_mm_act *d_act, const sd_tensor *next) {
    const sd_layer *L = &p->m->layers[l];
    job->add = 1;
    job->hid_lo = job->hid_hi = 0; // mid-block: no hidden rows
    job->norm_w = L->ffn_norm->data;
    job->act = act_for(p, d_act, L->w_down, p->n, 0);
    const sd_mm_hooks h = {.pre = pre_norm, .pre_arg = job, .post = swiglu_cols, .post_arg = job,
                           .align = job->act ? SD_MAX(job->act->blk, 16) : 0};
    const sd_tensor *ffn[2] = {L->w_gate, L->w_up};
    float *y2[2] = {p->ff_g, p->ff_u};
    hint_next(p, L->w_down);
    matmul_multi_t(p, 2, ffn, p->xn, p->n, y2, &h);
    if (next) hint_next(p, next);
    matmul_t(p, L->w_down, p->ff_g, job->act, p->n, p->xn);
}

// After the last layer: the final residual add of the rows whose hidden rows
// or logits are wanted (add: whether xn holds a sublayer output still to be
// added), their hidden rows of layers [hid_lo, n_layer) and of the final
// norm (the same rmsnorm of the same x as the logits', so the same bits),
// then the final norm of the logit rows (output row k into xn row k: k <=
// out_rows[k], and every add is done first) and the output matrix.
static void output_rows(const sd_fwd_pass *p, int add, int hid_lo) {
    const sd_model *m = p->m;
    const sd_hparams *hp = &m->hp;
    const int E = hp->n_embd;
    for (int j = 0; j < p->n_seg; j++) {
        const sd_fwd_seg *sg = &p->seg[j];
        const sd_session *s = sg->s;
        for (int i = 0; i < sg->n; i++) {
            const int hid = s->n_hid > 0 && s->hid_row[i] >= 0;
            if (!hid && s->logit_row[i] < 0) continue;
            float *x = p->x + (size_t)(sg->t0 + i) * E;
            if (add)
                for (int e = 0; e < E; e++) x[e] += p->xn[(size_t)(sg->t0 + i) * E + e];
            if (!hid) continue;
            hidden_put(s, i, x, hid_lo, hp->n_layer);
            for (int k = 0; k < s->n_hid; k++)
                if (s->hid_layers[k] == SD_HIDDEN_NORM)
                    rmsnorm(s->hid_out + ((size_t)s->hid_row[i] * s->n_hid + k) * E, x, m->out_norm->data, E,
                            hp->rms_eps);
        }
    }
    for (int k = 0; k < p->n_out; k++)
        rmsnorm(p->xn + (size_t)k * E, p->x + (size_t)p->out_rows[k] * E, m->out_norm->data, E, hp->rms_eps);
    if (p->n_out == 0) return;
    const sd_mm_hooks h = {.rows = p->scatter ? logit_rows : NULL, .rows_arg = (void *)p};
    float *y = p->logits;
    matmul_multi_t(p, 1, &m->output, p->xn, p->n_out, &y, &h);
}

// A part of a pipeline that ends before the last layer: every row's
// residual stream after layer l_hi - 1 (with the pending add, the same
// float add the next layer's pre hook would do) into x_out, and the wanted
// hidden rows of layers [hid_lo, l_hi).
static void part_rows(const sd_fwd_pass *p, int add, int hid_lo) {
    const int E = p->m->hp.n_embd;
    for (int j = 0; j < p->n_seg; j++) {
        const sd_fwd_seg *sg = &p->seg[j];
        const sd_session *s = sg->s;
        for (int i = 0; i < sg->n; i++) {
            float *x = p->x + (size_t)(sg->t0 + i) * E;
            if (add)
                for (int e = 0; e < E; e++) x[e] += p->xn[(size_t)(sg->t0 + i) * E + e];
            if (s->n_hid > 0 && s->hid_row[i] >= 0) hidden_put(s, i, x, hid_lo, p->l_hi);
            memcpy(p->x_out + (size_t)(sg->t0 + i) * E, x, (size_t)E * sizeof(float));
        }
    }
}

void sd_fwd_run(const sd_fwd_pass *p) {
    p->mm->act_f32 = p->precise != 0; // matmul_t & co. then use the file's weight layouts
    // The residual stream x: each sublayer's output lands in xn, and the next
    // matmul's pre hook (pre_norm) adds it to x and normalizes x into xn, row
    // by row, split among the threads.
    fwd_job job = {.p = p};
    // The inputs of the output projection and of the down matrix are
    // converted by their producers, each thread its own columns (the
    // attention its heads, SwiGLU its columns), into abuf (the runs that fill
    // it read their own input from wbuf), so no thread reads another's floats
    // there.
    sd_mm_act o_act, d_act;
    // Hidden rows: x (after the pending add) is the output of layers
    // [hid_lo, l) when non-skipped layer l starts (skipped layers pass it
    // on), so the pre hook of l's Q, K, V run copies them out; the last ones
    // in output_rows.
    int hid_lo = p->l_lo;
    for (int l = p->l_lo; l < p->l_hi; l++) {
        // A skipped layer (sd_session_set_layer_skip) is the identity on the
        // residual stream and writes no KV rows.
        if (p->layer_skip && p->layer_skip[l]) continue;
        if (p->any_hid) {
            job.hid_lo = hid_lo;
            job.hid_hi = l;
            hid_lo = l;
        }
        attention_half(p, &job, l, &o_act);
        // after the down matrix: the next layer's Q, K, V, or the output matrix
        int l1 = l + 1;
        while (l1 < p->l_hi && p->layer_skip && p->layer_skip[l1]) l1++;
        ffn_half(p, &job, l, &d_act,
                 l1 < p->l_hi ? p->m->layers[l1].wq : p->head && p->n_out > 0 ? p->m->output : NULL);
    }
    if (p->x_out) part_rows(p, job.add, hid_lo);
    if (p->head) output_rows(p, job.add && !p->x_out, hid_lo);
    p->mm->act_f32 = 0;
    for (int j = 0; j < p->n_seg; j++) {
        sd_session *s = p->seg[j].s;
        s->n_hid = 0;
        s->hid_out = NULL;
        s->n_pending = p->seg[j].n;
    }
}

// Checks a part of the layers against the session's model and the batch.
int sd_fwd_part_check(const sd_session *s, const sd_batch *b, const sd_forward_part *pt, char *err, size_t errlen) {
    const sd_model *m = s->m;
    const int nl = m->hp.n_layer;
    if (pt->layer_lo < 0 || pt->layer_hi < pt->layer_lo || pt->layer_hi > nl)
        return sd_errc(SD_ERR_INPUT, err, errlen, "forward part: bad layer range [%d, %d) (the model has %d layers)",
                       pt->layer_lo, pt->layer_hi, nl);
    if (pt->layer_lo < pt->layer_hi && (pt->layer_lo < m->layer_lo || pt->layer_hi > m->layer_hi))
        return sd_errc(SD_ERR_INPUT, err, errlen,
                       "forward part: layers [%d, %d) asked, but the model holds layers [%d, %d) only", pt->layer_lo,
                       pt->layer_hi, m->layer_lo, m->layer_hi);
    if (pt->output && (pt->layer_hi != nl || !m->has_output))
        return sd_errc(SD_ERR_INPUT, err, errlen, "forward part: the output stage needs %s",
                       pt->layer_hi != nl ? "the part to end at the last layer" : "a model loaded with its output");
    if (pt->layer_lo > 0 && !b->embd)
        return sd_errc(SD_ERR_INPUT, err, errlen,
                       "forward part: a part that starts at layer %d takes the residual rows as the batch's embd",
                       pt->layer_lo);
    return 0;
}

// One session's batch: a pass of one segment on the session's own scratch.
int sd_fwd_session(sd_session *s, const sd_batch *b, char *err, size_t errlen) {
    return sd_fwd_part(s, b, NULL, err, errlen);
}

int sd_fwd_part(sd_session *s, const sd_batch *b, const sd_forward_part *part, char *err, size_t errlen) {
    const int cr = sd_fwd_check(s, b, err, errlen);
    if (cr < 0) return cr;   // SD_ERR_NO_ROOM or SD_ERR_INPUT
    const int nl = s->m->hp.n_layer;
    const sd_forward_part whole = {.layer_lo = 0, .layer_hi = nl, .output = 1, .x_out = NULL};
    if (!part) {
        if (s->m->layer_lo != 0 || s->m->layer_hi != nl || !s->m->has_output)
            return sd_errc(SD_ERR_INPUT, err, errlen,
                           "forward: the model holds layers [%d, %d)%s only (a part of a pipeline: "
                           "sd_session_forward_part)",
                           s->m->layer_lo, s->m->layer_hi, s->m->has_output ? " and the output" : "");
        part = &whole;
    }
    const int pr = sd_fwd_part_check(s, b, part, err, errlen);
    if (pr < 0) return pr;
    const int n_out = sd_fwd_record(s, b);
    sd_fwd_embed(s->m, b, s->x);
    const sd_fwd_seg seg = {.s = s, .t0 = 0, .n = b->n, .o0 = 0, .n_out = n_out};
    const sd_fwd_pass p = {.m = s->m, .mm = &s->mm, .seg = &seg, .n_seg = 1, .n = b->n, .precise = b->precise,
                           .any_hid = s->n_hid > 0, .layer_skip = s->layer_skip, .out_rows = s->out_rows,
                           .n_out = part->output ? n_out : 0, .x = s->x, .xn = s->xn, .q = s->q, .k = s->k,
                           .att = s->att, .ff_g = s->ff_g, .ff_u = s->ff_u, .rope_cs = s->rope_cs, .v = s->v,
                           .logits = s->logits, .l_lo = part->layer_lo, .l_hi = part->layer_hi,
                           .head = part->output, .x_out = part->x_out};
    if (s->gkv) return sd_gpu_fwd_run(&p, err, errlen); // whole models only (sd_gpu_session_init)
    sd_fwd_run(&p);
    if (!part->output)
        for (int i = 0; i < b->n; i++) s->logit_row[i] = -1; // no logits from this part
    return 0;
}

// The take-turns rule of a shared pool: the forward holds the pool's busy
// flag, or fails before touching the session.
int sd_session_forward_part(sd_session *s, const sd_batch *b, const sd_forward_part *part, char *err,
                            size_t errlen) {
    if (!part) return sd_errc(SD_ERR_INPUT, err, errlen, "forward part: no part given");
    if (!sd_pool_try_acquire(s->pool))
        return sd_errc(SD_ERR_BUSY, err, errlen,
                       "forward: the thread pool is in use by another forward or sd_threadpool_run (sessions sharing "
                       "a pool must take turns)");
    const int r = sd_fwd_part(s, b, part, err, errlen);
    sd_pool_release(s->pool);
    return r;
}

int sd_session_forward(sd_session *s, const sd_batch *b, char *err, size_t errlen) {
    if (s->hooks.forward) return s->hooks.forward(s->hooks.arg, s, b, err, errlen);
    if (!sd_pool_try_acquire(s->pool))
        return sd_errc(SD_ERR_BUSY, err, errlen,
                       "forward: the thread pool is in use by another forward or sd_threadpool_run (sessions sharing "
                       "a pool must take turns)");
    const int r = sd_fwd_session(s, b, err, errlen);
    sd_pool_release(s->pool);
    return r;
}
