// draft_medusa.c - the Medusa drafter (docs/heads.md): K residual heads on
// the target's last normed state; head k gives the distribution at depth
// k+1 below the root whatever the path above it, so the tree is the
// Cartesian product of the heads' top tokens (the widths tree of
// spec/tree.h), grown best joint probability first and cut to the node
// budget.
#include "draft/draft_medusa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "runtime/sampler.h"

typedef struct mdd {
    const sd_head *head;
    const sd_model *target;
    int d, V, nv, K;
    int widths[SD_HEAD_MAX_MEDUSA], n_widths;
    float p_min;
    sd_pool *pool;
    sd_mm_ctx mm;
    void *wq[SD_HEAD_MAX_MEDUSA], *oq[SD_HEAD_MAX_MEDUSA];   // Q8_0 copies of fc and output
    int wq_type[SD_HEAD_MAX_MEDUSA], oq_type[SD_HEAD_MAX_MEDUSA]; // their types (sd_matmul_weights)
    int wtype;
    float *f;            // (d) the target's last normed state
    int have_f;          // f belongs to the position before the root
    int32_t *txt;        // the text f belongs to (its last token is the root's parent) ...
    int n_txt, cap_txt;  // ... as a prefix check
    int prop_n;          // tokens of the text at the last propose (0: none pending)
    float *z, *a;        // (d)
    float *lg;           // (K, V) draft logits per head
    int32_t *hist;
    int cap_hist;
    const sd_draft_ctx *ctx;
    sd_sampler *smp;
    sd_sampler_params smp_p;
} mdd;

static double md_uniform(void *st) { return sd_rng_uniform((sd_rng *)st); }

static void md_heads(mdd *s) {
    sd_pool_acquire(s->pool);
    for (int k = 0; k < s->K; k++) {
        const void *W = s->wq[k] ? s->wq[k] : sd_head_w(s->head, SD_MD_FC(k));
        sd_matmul(&s->mm, s->wq[k] ? s->wq_type[k] : SD_TYPE_F32, W, s->d, s->d, s->f, 1, s->a);
        const float *b = sd_head_w(s->head, SD_MD_BIAS(k));
        for (int j = 0; j < s->d; j++) {
            float x = s->a[j] + b[j];
            s->z[j] = s->f[j] + x / (1.0f + expf(-x));
        }
        const void *O = s->oq[k] ? s->oq[k] : sd_head_w(s->head, SD_MD_OUT(k));
        sd_matmul(&s->mm, s->oq[k] ? s->oq_type[k] : SD_TYPE_F32, O, s->d, s->V, s->z, 1, s->lg + (size_t)k * s->V);
    }
    sd_pool_release(s->pool);
}

static int md_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows, char *err,
                   size_t errlen) {
    (void)err;
    (void)errlen;
    mdd *s = ud;
    const int32_t *d2t = s->head->d2t;
    for (int j = 0; j < n_nodes; j++) {
        float *row = rows[j];
        int k = t->depth[nodes[j]];
        if (t->n_vocab > s->nv) memset(row + s->nv, 0, sizeof(float) * (size_t)(t->n_vocab - s->nv));
        if (k >= s->K) {   // no head this deep: no children
            memset(row, 0, sizeof(float) * (size_t)s->nv);
            continue;
        }
        const float *lg = s->lg + (size_t)k * s->V;
        if (s->ctx->stochastic && s->smp) {
            int n = s->ctx->n_tokens + k;
            if (n <= s->cap_hist) {
                memcpy(s->hist, s->ctx->tokens, sizeof(int32_t) * (size_t)s->ctx->n_tokens);
                for (int q = n - 1, i = nodes[j]; q >= s->ctx->n_tokens; q--, i = t->parent[i]) s->hist[q] = t->token[i];
            } else {
                n = 0;
            }
            sd_sampler_probs_support(s->smp, lg, d2t, s->V, s->hist, n, row);   // (its draft vocabulary only)
            continue;
        }
        sd_head_draft_probs(s->head, lg, row, s->nv);
    }
    return 0;
}

// Copies text[0..n) into s->txt.
static int md_keep_text(mdd *s, const int32_t *text, int n) {
    if (n > s->cap_txt) {
        int32_t *t = realloc(s->txt, sizeof(int32_t) * (size_t)n * 2);
        if (!t) return -1;
        s->txt = t;
        s->cap_txt = n * 2;
    }
    memmove(s->txt, text, sizeof(int32_t) * (size_t)n);
    return 0;
}

static int md_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    mdd *s = dr->impl;
    const int n = ctx->n_tokens;
    if (tree->n != 1 || n < 1 || ctx->tokens[n - 1] != tree->token[0])
        return sd_err(err, errlen, "medusa: the tree must hold only the root, the last committed token");
    s->ctx = ctx;
    // f must be the state of position n-2 of this very text.
    int ok = s->have_f && s->n_txt == n - 1 && memcmp(s->txt, ctx->tokens, sizeof(int32_t) * (size_t)(n - 1)) == 0;
    if (md_keep_text(s, ctx->tokens, n) < 0) return sd_err(err, errlen, "medusa: out of memory");
    s->prop_n = n;   // the text accept() extends
    if (!ok) return 0;
    if (ctx->stochastic) {
        if (!ctx->sp || !ctx->rng) return sd_err(err, errlen, "medusa: stochastic drafting needs sampler params and rng");
        if (sd_draft_sampler_sync(&s->smp, &s->smp_p, ctx->sp, s->nv, err, errlen) < 0) return -1;
    }
    md_heads(s);
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    if (max_nodes <= 1) return 0;
    sd_tree_grow g = {md_dist, s, ctx->stochastic, s->p_min, max_nodes, md_uniform, ctx->rng, s->head->d2t, s->V,
                      ctx->stochastic ? ctx->race : NULL};
    return sd_tree_grow_widths(tree, s->widths, s->n_widths, &g, err, errlen);
}

// Keeps text[0..n) and the state f of its last position.
static int md_keep(mdd *s, const int32_t *text, int n, const float *f) {
    if (n > s->cap_txt) {
        int32_t *t = realloc(s->txt, sizeof(int32_t) * (size_t)n * 2);
        if (!t) return -1;
        s->txt = t;
        s->cap_txt = n * 2;
    }
    memmove(s->txt, text, sizeof(int32_t) * (size_t)n);
    s->n_txt = n;
    memcpy(s->f, f, sizeof(float) * (size_t)s->d);
    s->have_f = 1;
    return 0;
}

static int md_accept(sd_drafter *dr, const sd_step_record *rec, char *err, size_t errlen) {
    mdd *s = dr->impl;
    s->have_f = 0;
    s->ctx = NULL;   // (propose's context is gone by now)
    if (!rec->hidden || s->prop_n < 1) return 0;
    // The text up to the last accepted node (the bonus, the next root, follows it):
    // propose's text, then the path below the root.
    int n = s->prop_n + rec->n_path - 1;
    if (n > s->cap_txt) {
        int32_t *t = realloc(s->txt, sizeof(int32_t) * (size_t)n * 2);
        if (!t) return sd_err(err, errlen, "medusa: out of memory");
        s->txt = t;
        s->cap_txt = n * 2;
    }
    for (int k = 1; k < rec->n_path; k++) s->txt[s->prop_n + k - 1] = rec->tree->token[rec->path[k]];
    s->n_txt = n;
    s->prop_n = 0;
    memcpy(s->f, rec->hidden + (size_t)(rec->n_path - 1) * s->d, sizeof(float) * (size_t)s->d);
    s->have_f = 1;
    return 0;
}

static int md_prompt(sd_drafter *dr, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                     size_t errlen) {
    mdd *s = dr->impl;
    if (md_keep(s, tokens, pos0 + n, hidden + (size_t)(n - 1) * s->d) < 0) return sd_err(err, errlen, "medusa: out of memory");
    s->ctx = NULL;
    return 0;
}

static void md_reset(sd_drafter *dr) {
    mdd *s = dr->impl;
    s->have_f = 0;
    s->n_txt = 0;
    s->prop_n = 0;
    s->ctx = NULL;
}

static void md_free(sd_drafter *dr) {
    if (!dr) return;
    mdd *s = dr->impl;
    if (s) {
        for (int k = 0; k < SD_HEAD_MAX_MEDUSA; k++) free(s->wq[k]), free(s->oq[k]);
        free(s->f), free(s->txt), free(s->z), free(s->a), free(s->lg), free(s->hist);
        free(s->mm.wbuf);
        sd_sampler_free(s->smp);
        if (s->pool) sd_pool_free(s->pool);
        free(s);
    }
    free(dr);
}

static const sd_drafter_vt md_vt = {
    .name = "medusa", .propose = md_propose, .accept = md_accept, .prompt = md_prompt, .reset = md_reset, .free = md_free};

// w as wtype rows in the layout sd_matmul reads fastest; *type: the type to pass it.
static void *quant_copy(const float *w, int64_t n_in, int64_t n_out, int wtype, int *type) {
    uint8_t *q = malloc(sd_row_size(wtype, n_in) * (size_t)n_out);
    if (q) *type = sd_matmul_weights(wtype, w, n_in, n_out, q);
    return q;
}

int sd_draft_medusa_new(sd_drafter **out, const sd_head *h, const sd_model *target, const int *widths, int n_widths,
                        float p_min, sd_threadpool *pool, int wtype, char *err, size_t errlen) {
    *out = NULL;
    if (!h || h->hp.type != SD_HEAD_MEDUSA) return sd_err(err, errlen, "medusa: a Medusa head is required");
    if (sd_head_check_target(h, target, err, errlen) < 0) return -1;
    if (n_widths < 1 || n_widths > h->hp.n_medusa)
        return sd_err(err, errlen, "medusa: %d depths asked, the head has %d heads", n_widths, h->hp.n_medusa);
    mdd *s = calloc(1, sizeof *s);
    sd_drafter *dr = s ? sd_drafter_alloc(&md_vt, s) : NULL;
    if (!dr) {
        free(s);
        return sd_err(err, errlen, "medusa: out of memory");
    }
    s->head = h;
    s->target = target;
    s->d = h->hp.n_embd;
    s->V = h->hp.n_draft_vocab;
    s->nv = target->hp.n_vocab;
    s->K = n_widths;
    s->n_widths = n_widths;
    memcpy(s->widths, widths, sizeof(int) * (size_t)n_widths);
    s->p_min = p_min;
    s->wtype = wtype;
    s->pool = pool ? sd_pool_ref((sd_pool *)pool) : NULL;
    s->mm.pool = s->pool;
    int bad = 0;
    if (wtype != SD_TYPE_F32 && s->d % sd_type_get(wtype)->blck == 0) {
        for (int k = 0; k < s->K; k++) {
            s->wq[k] = quant_copy(sd_head_w(h, SD_MD_FC(k)), s->d, s->d, wtype, &s->wq_type[k]);
            s->oq[k] = quant_copy(sd_head_w(h, SD_MD_OUT(k)), s->d, s->V, wtype, &s->oq_type[k]);
            bad |= !s->wq[k] || !s->oq[k];
        }
    }
    int mt = s->wq[0] ? s->wq_type[0] : SD_TYPE_F32;
    s->mm.wbuf_size = sd_matmul_wsize(mt, s->d, 1);
    s->mm.wbuf = malloc(s->mm.wbuf_size ? s->mm.wbuf_size : 64);
    s->f = malloc(sizeof(float) * (size_t)s->d);
    s->z = malloc(sizeof(float) * (size_t)s->d);
    s->a = malloc(sizeof(float) * (size_t)s->d);
    s->lg = malloc(sizeof(float) * (size_t)s->K * (size_t)s->V);
    s->cap_hist = 8192 + 64;
    s->hist = malloc(sizeof(int32_t) * (size_t)s->cap_hist);
    if (bad || !s->mm.wbuf || !s->f || !s->z || !s->a || !s->lg || !s->hist) {
        md_free(dr);
        return sd_err(err, errlen, "medusa: out of memory");
    }
    dr->n_hidden_layers = 1;
    dr->hidden_layers[0] = SD_HIDDEN_NORM;
    *out = dr;
    return 0;
}
