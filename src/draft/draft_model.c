// draft_model.c - the draft-model drafter (a small LM with its own session).
//
// KV bookkeeping of the draft session. At propose time the draft cache is
// synchronised with the committed text (prompt + accepted tokens, root
// included): the common prefix with what it holds is kept, the rest is
// evaluated in one chain forward, whose last logits give the distribution
// over the root's children. While the tree is still a chain, each new draft
// node is committed right after its forward (the "spine"), so a chain draft
// costs one row per token and the accepted part never has to be redone. Once
// the tree branches, each depth is evaluated as one tree-masked batch holding
// the nodes below the spine that lead to the nodes being expanded (a forward
// discards the previous pending rows, so ancestors off the spine are
// re-evaluated; trees are small). After verification the spine is cut back to
// the accepted part, and accepted nodes that are pending rows of the last
// forward are committed; whatever is still missing (the bonus, deeper
// accepted nodes) is evaluated by the next synchronisation.
#include "draft/draft_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define DM_TREE_MAX 1024   // most nodes of any tree the drafter grows

sd_draft_model_params sd_draft_model_default_params(void) {
    sd_draft_model_params p;
    memset(&p, 0, sizeof p);
    p.shape = SD_DRAFT_CHAIN;
    p.k = 5;
    p.p_min = 0.0f;
    p.n_widths = 4;
    p.widths[0] = 2, p.widths[1] = 2, p.widths[2] = 1, p.widths[3] = 1;
    p.dyn_b = 4, p.dyn_d = 5, p.dyn_m = 16;
    p.n_ctx = 0;
    p.n_threads = 0;
    p.pool = NULL;
    p.adapt = 0;
    p.p_min_lo = 0.05f, p.p_min_hi = 0.95f;
    p.p_min_up = 0.05f, p.p_min_down = 0.02f;
    p.layer_skip = NULL;
    p.tree_auto = sd_draft_auto_default_params();
    return p;
}

int sd_draft_vocab_check(const sd_model *draft, const sd_model *target, char *err, size_t errlen) {
    const sd_tokenizer *td = sd_model_tokenizer(draft), *tt = sd_model_tokenizer(target);
    int nd = sd_tokenizer_n_vocab(td), nt = sd_tokenizer_n_vocab(tt);
    if (nd > nt)
        return sd_err(err, errlen, "draft vocabulary (%d tokens) is larger than the target's (%d)", nd, nt);
    for (int id = 0; id < nd; id++) {
        size_t ld = 0, lt = 0;
        const char *sd = sd_token_text(td, id, &ld), *st = sd_token_text(tt, id, &lt);
        if (!sd || !st || ld != lt || memcmp(sd, st, ld) != 0)
            return sd_err(err, errlen, "draft and target vocabularies differ at id %d: draft '%.*s', target '%.*s'", id,
                          sd ? (int)SD_MIN(ld, 64) : 6, sd ? sd : "(none)", st ? (int)SD_MIN(lt, 64) : 6,
                          st ? st : "(none)");
    }
    return 0;
}

typedef struct dm {
    const sd_model *m;
    sd_session *s;
    sd_draft_model_params p;
    int n_vocab;          // draft vocabulary
    int n_ctx, n_batch;   // of s
    int32_t *cached;      // (n_ctx) tokens committed in s
    int n_cached;         // == sd_session_n_past(s)
    int n_tok;            // committed text length (root included) at the last propose
    int n_spine;          // draft nodes committed in s below the root during this step
    int32_t *spine_node;  // (DM_TREE_MAX) their tree nodes
    int32_t *spine_tok;   // (DM_TREE_MAX) their tokens
    uint8_t *is_spine;    // (DM_TREE_MAX) node is the root or a spine node
    // The last forward over tree nodes (its rows are pending in s while lb_pending).
    int lb_n;
    int lb_pending;
    int32_t *lb_tok;      // (DM_TREE_MAX)
    int32_t *lb_par;      // (DM_TREE_MAX) batch parent, -1: hangs off the spine tip
    uint8_t *lb_want;     // (DM_TREE_MAX) logits wanted
    int32_t *bidx;        // (DM_TREE_MAX) batch index of a tree node, -1 if not in the batch
    float *root_logits;   // (n_vocab) logits after the root
    int32_t *hist;        // (n_ctx + DM_TREE_MAX) text + path, for the sampler's penalty
    uint8_t *want;        // (n_batch) logits flags of synchronisation chunks
    sd_sampler *smp;      // the target's sampler transform over the draft vocabulary (stochastic)
    sd_sampler_params smp_p;
    sd_tree work;         // dynamic trees
    float p_min;          // current threshold (p.p_min, adapted when p.adapt)
    const sd_draft_ctx *ctx;  // during propose
    sd_draft_auto *au;    // SD_DRAFT_AUTO: the automatic sizing state, else NULL
} dm;

static double dm_uniform(void *st) { return sd_rng_uniform((sd_rng *)st); }

// Draft distribution over tree->n_vocab tokens from draft logits; hist: the
// text up to and including the node.
static void dm_row(dm *d, const float *logits, const int32_t *hist, int n_hist, float *row, int nv_row) {
    const int nv = d->n_vocab;
    if (d->ctx->stochastic && d->smp) {
        sd_sampler_probs(d->smp, logits, hist, n_hist, row);
    } else {   // softmax at temperature 1: ranks children and feeds p_min
        float mx = logits[0];
        for (int v = 1; v < nv; v++) mx = logits[v] > mx ? logits[v] : mx;
        double s = 0.0;
        for (int v = 0; v < nv; v++) s += row[v] = expf(logits[v] - mx);
        float inv = (float)(1.0 / s);
        for (int v = 0; v < nv; v++) row[v] *= inv;
    }
    for (int v = nv; v < nv_row; v++) row[v] = 0.0f;
}

// History of node: committed text then the path below the root.
static int dm_hist(dm *d, const sd_tree *t, int node) {
    int depth = t->depth[node];
    int n = d->ctx->n_tokens + depth;
    memcpy(d->hist, d->ctx->tokens, sizeof(int32_t) * (size_t)d->ctx->n_tokens);
    for (int k = n - 1, i = node; k >= d->ctx->n_tokens; k--, i = t->parent[i]) d->hist[k] = t->token[i];
    return n;
}

static int dm_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows,
                   char *err, size_t errlen) {
    dm *d = ud;
    char ferr[256];
    if (t->n > DM_TREE_MAX) return sd_err(err, errlen, "draft model: tree of %d nodes is too large", t->n);
    if (n_nodes == 1 && nodes[0] == 0) {
        int nh = dm_hist(d, t, 0);
        dm_row(d, d->root_logits, d->hist, nh, rows[0], t->n_vocab);
        return 0;
    }
    // Batch: the nodes off the spine on the way to the nodes expanded.
    for (int i = 0; i < t->n; i++) d->bidx[i] = 0;   // used as "needed" marks first
    int tip = d->n_spine ? d->spine_node[d->n_spine - 1] : 0;
    for (int j = 0; j < n_nodes; j++) {
        int i = nodes[j];
        while (i >= 0 && !d->is_spine[i] && !d->bidx[i]) {
            d->bidx[i] = 1;
            i = t->parent[i];
        }
        if (i >= 0 && d->is_spine[i] && i != tip)
            return sd_err(err, errlen, "draft model: node %d branches off the committed draft chain", nodes[j]);
    }
    d->lb_pending = 0;
    d->lb_n = 0;
    for (int i = 0; i < t->n; i++) {
        if (!d->bidx[i]) {
            d->bidx[i] = -1;
            continue;
        }
        int b = d->lb_n++;
        d->bidx[i] = b;
        d->lb_tok[b] = t->token[i];
        d->lb_par[b] = d->is_spine[t->parent[i]] ? -1 : d->bidx[t->parent[i]];
        d->lb_want[b] = 0;
    }
    for (int j = 0; j < n_nodes; j++) d->lb_want[d->bidx[nodes[j]]] = 1;
    if (d->lb_n > d->n_batch || d->n_cached + d->lb_n > d->n_ctx) {
        // No room: the nodes get no children.
        for (int j = 0; j < n_nodes; j++) memset(rows[j], 0, sizeof(float) * (size_t)t->n_vocab);
        return 0;
    }
    sd_batch b = {.n = d->lb_n, .tokens = d->lb_tok, .parent = d->lb_par, .pos = NULL, .logits = d->lb_want};
    if (sd_session_forward(d->s, &b, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "draft model: forward failed: %s", ferr);
    d->lb_pending = 1;
    for (int j = 0; j < n_nodes; j++) {
        const float *lg = sd_session_logits(d->s, d->bidx[nodes[j]]);
        if (!lg) return sd_err(err, errlen, "draft model: no logits for node %d", nodes[j]);
        int nh = dm_hist(d, t, nodes[j]);
        dm_row(d, lg, d->hist, nh, rows[j], t->n_vocab);
    }
    // Still a chain (root, spine, this node): commit the new row to the spine.
    if (n_nodes == 1 && d->lb_n == 1 && t->n == d->n_spine + 2 && t->parent[nodes[0]] == tip) {
        if (sd_session_commit(d->s, NULL, 0, ferr, sizeof ferr) < 0)
            return sd_err(err, errlen, "draft model: commit failed: %s", ferr);
        d->lb_pending = 0;
        d->cached[d->n_cached++] = t->token[nodes[0]];
        d->spine_node[d->n_spine] = nodes[0];
        d->spine_tok[d->n_spine++] = t->token[nodes[0]];
        d->is_spine[nodes[0]] = 1;
    }
    return 0;
}

// Brings the draft cache to text[0..n) (root included) and leaves the logits
// after the root in root_logits. Returns 1 if done, 0 if the text does not
// fit the draft's context (nothing is drafted), <0 on error.
// Tokens of text[0..n) the draft cache keeps: the common prefix, short of the
// root (its logits are needed, and logits are not kept).
static int dm_kept(const dm *d, const int32_t *text, int n) {
    int L = 0;
    while (L < d->n_cached && L < n - 1 && d->cached[L] == text[L]) L++;
    return L;
}

static int dm_sync(dm *d, const int32_t *text, int n, char *err, size_t errlen) {
    char ferr[256];
    if (n > d->n_ctx) return 0;
    int L = dm_kept(d, text, n);
    if (L < d->n_cached || sd_session_n_past(d->s) != d->n_cached) {
        if (sd_session_truncate(d->s, L, ferr, sizeof ferr) < 0)
            return sd_err(err, errlen, "draft model: %s", ferr);
        d->n_cached = L;
    }
    d->lb_pending = 0;
    for (int i = L; i < n; i += d->n_batch) {
        int c = SD_MIN(d->n_batch, n - i);
        memset(d->want, 0, (size_t)c);
        if (i + c == n) d->want[c - 1] = 1;
        sd_batch b = {.n = c, .tokens = text + i, .parent = NULL, .pos = NULL, .logits = d->want};
        if (sd_session_forward(d->s, &b, ferr, sizeof ferr) < 0 ||
            sd_session_commit(d->s, NULL, 0, ferr, sizeof ferr) < 0)
            return sd_err(err, errlen, "draft model: evaluating the text failed: %s", ferr);
        memcpy(d->cached + d->n_cached, text + i, sizeof(int32_t) * (size_t)c);
        d->n_cached += c;
        if (i + c == n) {
            const float *lg = sd_session_logits(d->s, c - 1);
            if (!lg) return sd_err(err, errlen, "draft model: no logits after the text");
            memcpy(d->root_logits, lg, sizeof(float) * (size_t)d->n_vocab);
        }
    }
    return 1;
}

static int dm_propose_shape(dm *d, const sd_draft_ctx *ctx, sd_tree *tree, const sd_tree_shape *shape, char *err,
                            size_t errlen);

// Catch-ups longer than this many tokens are not timed for the automatic tree.
#define DM_SYNC_UNTIMED 8

static int dm_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    dm *d = dr->impl;
    if (tree->n != 1) return sd_err(err, errlen, "draft model: the tree must hold only the root");
    if (tree->cap > DM_TREE_MAX) return sd_err(err, errlen, "draft model: tree capacity %d > %d", tree->cap, DM_TREE_MAX);
    if (tree->n_vocab < d->n_vocab) return sd_err(err, errlen, "draft model: tree rows shorter than the draft vocabulary");
    if (ctx->n_tokens < 1 || ctx->tokens[ctx->n_tokens - 1] != tree->token[0])
        return sd_err(err, errlen, "draft model: the tree root is not the last committed token");
    d->ctx = ctx;
    if (d->au) {   // time the whole propose, synchronisation included
        // ... except a long catch-up (the prompt, on the first step), which
        // is not a per-step cost and would teach the sizing that drafting is
        // dear: done before the timed part (the timed sync then evaluates
        // only the root again).
        if (ctx->n_tokens - dm_kept(d, ctx->tokens, ctx->n_tokens) > DM_SYNC_UNTIMED) {
            int rc = dm_sync(d, ctx->tokens, ctx->n_tokens, err, errlen);
            if (rc <= 0) return rc;
        }
        const sd_tree_shape *shape = sd_draft_auto_begin(d->au);
        int rc = dm_propose_shape(d, ctx, tree, shape, err, errlen);
        sd_draft_auto_end(d->au);
        return rc;
    }
    return dm_propose_shape(d, ctx, tree, NULL, err, errlen);
}

// propose after the checks; shape: the automatic tree (SD_DRAFT_AUTO), else NULL.
static int dm_propose_shape(dm *d, const sd_draft_ctx *ctx, sd_tree *tree, const sd_tree_shape *shape, char *err,
                            size_t errlen) {
    if (ctx->stochastic) {
        if (!ctx->sp || !ctx->rng) return sd_err(err, errlen, "draft model: stochastic drafting needs sampler params and rng");
        const sd_sampler_params *a = &d->smp_p, *b = ctx->sp;
        int same = a->temp == b->temp && a->top_k == b->top_k && a->top_p == b->top_p && a->min_p == b->min_p &&
                   a->repeat_penalty == b->repeat_penalty && a->repeat_last_n == b->repeat_last_n;
        if (!d->smp || !same) {
            sd_sampler_free(d->smp);
            d->smp = NULL;
            if (sd_sampler_new(&d->smp, ctx->sp, d->n_vocab, err, errlen) < 0) return -1;
            d->smp_p = *ctx->sp;
        }
    }
    int rc = dm_sync(d, ctx->tokens, ctx->n_tokens, err, errlen);
    if (rc <= 0) return rc;
    d->n_tok = ctx->n_tokens;
    d->n_spine = 0;
    memset(d->is_spine, 0, DM_TREE_MAX);
    d->is_spine[0] = 1;
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    if (max_nodes <= 1) return 0;
    sd_tree_grow g = {dm_dist, d, ctx->stochastic, d->p_min, max_nodes, dm_uniform, ctx->rng, NULL, 0,
                      ctx->stochastic ? ctx->race : NULL};
    return sd_draft_grow(tree, &d->p, &d->work, shape, &g, "draft model", err, errlen);
}

int sd_draft_grow(sd_tree *tree, const sd_draft_model_params *p, sd_tree *work, const sd_tree_shape *shape,
                  const sd_tree_grow *g, const char *who, char *err, size_t errlen) {
    const int max_nodes = g->max_nodes;
    switch (p->shape) {
    case SD_DRAFT_CHAIN: return sd_tree_grow_chain(tree, p->k, g, err, errlen);
    case SD_DRAFT_WIDTHS: return sd_tree_grow_widths(tree, p->widths, p->n_widths, g, err, errlen);
    case SD_DRAFT_DYNAMIC:
        return sd_tree_grow_dynamic(tree, work, p->dyn_b, p->dyn_d, SD_MIN(p->dyn_m, max_nodes), g, err, errlen);
    case SD_DRAFT_AUTO:
        if (!shape || shape->n <= 1) return 0;
        if (shape->n > max_nodes)   // the verifier allows less this step: a chain of the shape's depth
            return sd_tree_grow_chain(tree, SD_MIN(shape->depth, max_nodes - 1), g, err, errlen);
        return sd_tree_grow_shape(tree, shape, g, err, errlen);
    default: return sd_err(err, errlen, "%s: unknown tree shape %d", who, p->shape);
    }
}

static int dm_accept(sd_drafter *dr, const sd_step_record *rec, char *err, size_t errlen) {
    dm *d = dr->impl;
    const sd_tree *tree = rec->tree;
    const int32_t *path = rec->path;
    const int n_path = rec->n_path;
    char ferr[256];
    int m = n_path - 1;   // accepted draft tokens: tree->token[path[1..m]]
    if (d->au && sd_draft_auto_accept(d->au, rec, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "draft model: %s", ferr);
    if (d->p.adapt) {
        int depth = 0;
        for (int i = 1; i < tree->n; i++) depth = SD_MAX(depth, tree->depth[i]);
        d->p_min = sd_draft_adapt_p_min(d->p_min, depth, m, &d->p);
    }
    int j = 0;
    while (j < d->n_spine && j < m && d->spine_tok[j] == tree->token[path[j + 1]]) j++;
    if (j < d->n_spine) {   // cut the spine back to the accepted part
        if (sd_session_truncate(d->s, d->n_tok + j, ferr, sizeof ferr) < 0)
            return sd_err(err, errlen, "draft model: %s", ferr);
        d->n_cached = d->n_tok + j;
        d->lb_pending = 0;
        d->n_spine = j;
        return 0;
    }
    if (!d->lb_pending || m <= j) return 0;
    // Accepted nodes below the spine that are pending rows: follow them by token.
    int32_t rows[DM_TREE_MAX];
    int nr = 0, cur = -1;
    for (int k = j + 1; k <= m; k++) {
        int found = -1;
        for (int b = 0; b < d->lb_n && found < 0; b++)
            if (d->lb_par[b] == cur && d->lb_tok[b] == tree->token[path[k]]) found = b;
        if (found < 0) break;
        rows[nr++] = found;
        cur = found;
    }
    d->lb_pending = 0;
    if (nr == 0 || d->n_cached + nr > d->n_ctx) return 0;
    if (sd_session_commit(d->s, rows, nr, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "draft model: commit failed: %s", ferr);
    for (int k = 0; k < nr; k++) d->cached[d->n_cached++] = d->lb_tok[rows[k]];
    return 0;
}

static void dm_reset(sd_drafter *dr) {
    dm *d = dr->impl;
    sd_session_truncate(d->s, 0, NULL, 0);
    d->n_cached = 0;
    d->n_spine = 0;
    d->lb_pending = 0;
    d->p_min = d->p.p_min;
    sd_draft_auto_reset(d->au);
}

static void dm_free(sd_drafter *dr) {
    if (!dr) return;
    dm *d = dr->impl;
    if (d) {
        sd_session_free(d->s);
        sd_draft_auto_free(d->au);
        sd_sampler_free(d->smp);
        sd_tree_free(&d->work);
        free(d->cached);
        free(d->spine_node);
        free(d->spine_tok);
        free(d->is_spine);
        free(d->lb_tok);
        free(d->lb_par);
        free(d->lb_want);
        free(d->bidx);
        free(d->root_logits);
        free(d->hist);
        free(d->want);
        free(d);
    }
    free(dr);
}

static const sd_drafter_vt dm_vt = {
    .name = "draft-model", .propose = dm_propose, .accept = dm_accept, .reset = dm_reset, .free = dm_free};

int sd_draft_model_new(sd_drafter **out, const sd_model *draft, const sd_model *target,
                       const sd_draft_model_params *p, char *err, size_t errlen) {
    *out = NULL;
    if (!draft || !target) return sd_err(err, errlen, "draft model: draft and target models are required");
    if (sd_draft_vocab_check(draft, target, err, errlen) < 0) return -1;
    sd_draft_model_params dp = p ? *p : sd_draft_model_default_params();
    if (dp.shape == SD_DRAFT_CHAIN && (dp.k < 1 || dp.k > 256))
        return sd_err(err, errlen, "draft model: chain length %d out of range 1..256", dp.k);
    if (dp.shape == SD_DRAFT_WIDTHS) {
        if (dp.n_widths < 1 || dp.n_widths > SD_DRAFT_MAX_WIDTHS)
            return sd_err(err, errlen, "draft model: %d widths (1..%d)", dp.n_widths, SD_DRAFT_MAX_WIDTHS);
        for (int i = 0; i < dp.n_widths; i++)
            if (dp.widths[i] < 1 || dp.widths[i] > 64)
                return sd_err(err, errlen, "draft model: width %d at depth %d out of range 1..64", dp.widths[i], i);
    }
    if (dp.adapt && !(dp.p_min_lo >= 0.0f && dp.p_min_lo <= dp.p_min_hi && dp.p_min_hi <= 1.0f &&
                      dp.p_min_up >= 0.0f && dp.p_min_down >= 0.0f))
        return sd_err(err, errlen, "draft model: adaptive p_min needs 0 <= lo (%g) <= hi (%g) <= 1, up, down >= 0",
                      (double)dp.p_min_lo, (double)dp.p_min_hi);
    if (dp.shape == SD_DRAFT_DYNAMIC &&
        (dp.dyn_b < 1 || dp.dyn_b > 16 || dp.dyn_d < 1 || dp.dyn_d > 16 || dp.dyn_m < 2 ||
         1 + dp.dyn_b * dp.dyn_b * dp.dyn_d > DM_TREE_MAX))
        return sd_err(err, errlen, "draft model: dynamic tree B=%d D=%d M=%d out of range", dp.dyn_b, dp.dyn_d,
                      dp.dyn_m);
    dm *d = calloc(1, sizeof *d);
    sd_drafter *dr = d ? sd_drafter_alloc(&dm_vt, d) : NULL;
    if (!dr) {
        free(d);
        return sd_err(err, errlen, "draft model: out of memory");
    }
    d->m = draft;
    d->p = dp;
    sd_model_info info;
    sd_model_get_info(draft, &info);
    d->n_vocab = info.n_vocab;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = dp.n_ctx > 0 ? dp.n_ctx : 0;   // 0: the session's default
    sp.n_batch = 512;
    sp.n_threads = dp.n_threads;
    sp.pool = dp.pool;
    if (sd_session_new(&d->s, draft, &sp, err, errlen) < 0) {
        dm_free(dr);
        return -1;
    }
    if (dp.layer_skip && sd_session_set_layer_skip(d->s, dp.layer_skip, err, errlen) < 0) {
        dm_free(dr);
        return -1;
    }
    d->p.layer_skip = NULL;   // copied into the session; the caller's array may go away
    d->p_min = dp.p_min;
    d->n_ctx = sd_session_n_ctx(d->s);
    d->n_batch = sp.n_batch;
    d->cached = malloc(sizeof(int32_t) * (size_t)d->n_ctx);
    d->spine_node = malloc(sizeof(int32_t) * DM_TREE_MAX);
    d->spine_tok = malloc(sizeof(int32_t) * DM_TREE_MAX);
    d->is_spine = calloc(DM_TREE_MAX, 1);
    d->lb_tok = malloc(sizeof(int32_t) * DM_TREE_MAX);
    d->lb_par = malloc(sizeof(int32_t) * DM_TREE_MAX);
    d->lb_want = malloc(DM_TREE_MAX);
    d->bidx = malloc(sizeof(int32_t) * DM_TREE_MAX);
    d->root_logits = malloc(sizeof(float) * (size_t)d->n_vocab);
    d->hist = malloc(sizeof(int32_t) * ((size_t)d->n_ctx + DM_TREE_MAX));
    d->want = malloc((size_t)d->n_batch);
    int bad = !d->cached || !d->spine_node || !d->spine_tok || !d->is_spine || !d->lb_tok || !d->lb_par ||
              !d->lb_want || !d->bidx || !d->root_logits || !d->hist || !d->want;
    if (!bad && dp.shape == SD_DRAFT_DYNAMIC) {
        const sd_tokenizer *tt = sd_model_tokenizer(target);
        bad = sd_tree_init(&d->work, 1 + dp.dyn_b * dp.dyn_b * dp.dyn_d, sd_tokenizer_n_vocab(tt),
                           1 + dp.dyn_b * (dp.dyn_d - 1)) < 0;
    }
    if (bad) {
        dm_free(dr);
        return sd_err(err, errlen, "draft model: out of memory");
    }
    if (dp.shape == SD_DRAFT_AUTO) {
        sd_draft_auto_params ap = dp.tree_auto;
        ap.on = 1;
        // The drafter's own cost, measured now (a chain node costs one
        // 1-token forward; a level of w nodes one w-token forward), so that the
        // first tree already weighs it instead of learning it from timings.
        sd_cost_curve dc;
        sd_cost_curve_init(&dc);
        static const int dn[] = {1, 4};
        if (sd_cost_curve_measure(&dc, d->s, dn, 2, 3, 0.0, err, errlen) >= 2) {
            double d1 = sd_cost_curve_verify_ms(&dc, 1), d4 = sd_cost_curve_verify_ms(&dc, 4);
            ap.draft_ms_per_node = SD_MAX(0.0, (d4 - d1) / 3.0);
            ap.draft_ms_per_depth = d1 - ap.draft_ms_per_node;
        }
        if (sd_draft_auto_new(&d->au, &ap, err, errlen) < 0) {
            dm_free(dr);
            return -1;
        }
    }
    *out = dr;
    return 0;
}
