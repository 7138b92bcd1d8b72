// draft_moa.c - the Mixture of Attentions drafter (docs/moa.md).
//
// State follows the text by position: the runner holds CA keys and values
// (and the TLI layers' K,V rows) of verified positions 0 .. n_cached-1,
// made from the target session's cache rows of those positions. At propose
// time the positions the target committed since (the root excluded: it is
// not in the target's cache yet) are read and run through LSA; then every
// tree node, the root first, is a drafted row (SA over its chain from the
// root, CA over the verified positions, the TLI layers), dropped after the
// step. Nothing of a step's drafts is kept: the next propose reads the
// accepted tokens' rows from the target's cache, as the target made them.
#include "draft/draft_moa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/draft_auto.h"
#include "draft/draft_head.h"
#include "head/moa.h"
#include "model/model.h"
#include "runtime/session.h"

#define MOA_TREE_MAX 512
#define MOA_CHAIN_MAX 512   // remote: most unverified tokens after the verified text (pending rows before a tree)

typedef struct moad {
    sd_draft_model_params p;
    const sd_model *target;
    const sd_head *head;
    sd_moa_run *r;
    int E, V, nv, n_ctx, L, ekv;
    int32_t *txt;        // (n_ctx) the text whose positions the runner holds (the first n_cached)
    int root_pos;
    int32_t *slot;       // (MOA_TREE_MAX) pending slot of each evaluated node
    float *lg;           // (SD_MOA_ROWS, V) draft logits
    float *kv;           // (SD_MOA_ROWS, L, ekv) K,V rows of verified positions
    float *kb, *vb;      // (SD_MOA_ROWS, ekv / 2) one layer's rows
    // ca_hidden drafters: the target's states of the text's positions, as the
    // prompt and every accepted path deliver them (rows 0 .. hid_ok-1 hold
    // those of the text htxt); NULL otherwise
    float *hid;          // (n_ctx, E)
    int32_t *htxt;       // (n_ctx)
    int hid_ok;
    int64_t n_no_states;
    int32_t *hist;       // (n_ctx + MOA_TREE_MAX)
    sd_sampler *smp;
    sd_sampler_params smp_p;
    const sd_draft_ctx *ctx;
    float p_min;
    sd_tree work;
    sd_draft_auto *au;
    int followed;
    // A remote client's drafter (sd_drafter_remote, docs/split.md): the K,V
    // rows of verified positions come through prompt and accept (from the
    // server), never from a session; the text after them that is not
    // verified (drafted offline) is a chain of pending rows, slots
    // 0 .. chain_n-1, kept between steps while the text agrees.
    int remote, chain_n; // remote: 1 the rows are every layer's K,V; 2 LSA's outputs and the TLI layers' K,V;
                         // 3 (no LSA) the layers' mean K,V and the TLI layers' K,V
    int32_t root_parent; // the tree root's parent slot: -1, or the chain's last
    int64_t cov_n, cov_in, n_no_session;
    char note[300];
    int test_fault;
} moad;

static double moa_uniform(void *st) { return sd_rng_uniform((sd_rng *)st); }

static int moa_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows, char *err,
                    size_t errlen) {
    moad *s = ud;
    if (t->n > MOA_TREE_MAX) return sd_err(err, errlen, "moa: tree of %d nodes is too large", t->n);
    for (int j0 = 0; j0 < n_nodes; j0 += SD_MOA_ROWS) {
        const int c = SD_MIN(SD_MOA_ROWS, n_nodes - j0);
        int32_t tok[SD_MOA_ROWS], pos[SD_MOA_ROWS], par[SD_MOA_ROWS];
        for (int j = 0; j < c; j++) {
            const int node = nodes[j0 + j];
            tok[j] = t->token[node];
            pos[j] = s->root_pos + t->depth[node];
            par[j] = node == 0 ? s->root_parent : s->slot[t->parent[node]];
        }
        if (sd_moa_run_n_pending(s->r) + c > MOA_TREE_MAX + MOA_CHAIN_MAX) {
            for (int j = 0; j < c; j++) memset(rows[j0 + j], 0, sizeof(float) * (size_t)t->n_vocab);
            continue;   // no room: these nodes get no children
        }
        const int slot0 = sd_moa_run_n_pending(s->r);
        if (sd_moa_run_eval(s->r, tok, pos, par, c, s->lg, NULL, err, errlen) < 0) return -1;
        for (int j = 0; j < c; j++) {
            const int node = nodes[j0 + j];
            s->slot[node] = slot0 + j;
            const int nh = s->ctx->stochastic ? sd_draft_node_hist(s->ctx, t, node, s->hist) : 0;
            sd_draft_head_dist(s->head, s->smp, s->ctx->stochastic, s->lg + (size_t)j * s->V, s->nv, s->hist,
                               nh, rows[j0 + j]);
            if (t->n_vocab > s->nv) memset(rows[j0 + j] + s->nv, 0, sizeof(float) * (size_t)(t->n_vocab - s->nv));
        }
    }
    return 0;
}

// ca_hidden: the target's states of positions pos0 .. pos0+n-1 of text (rows
// (n, E)) kept; rows after them belong to another text until delivered.
static void put_states(moad *s, const int32_t *text, int pos0, int n, const float *rows) {
    if (!s->hid || !rows || pos0 < 0) return;
    const int end = SD_MIN(pos0 + n, s->n_ctx);
    if (end <= pos0) return;
    memcpy(s->hid + (size_t)pos0 * s->E, rows, sizeof(float) * (size_t)(end - pos0) * (size_t)s->E);
    memcpy(s->htxt + pos0, text + pos0, sizeof(int32_t) * (size_t)(end - pos0));
    if (pos0 <= s->hid_ok) s->hid_ok = end;
}

// Runs LSA over the verified positions the runner lacks: n_cached .. n_ver-1,
// read from the target's cache (and, ca_hidden, the states delivered for
// text). Returns 1 when the runner holds them all, 0 when it cannot (no
// session, or one that holds other rows; no states for them), <0 on error.
static int catch_up(moad *s, const sd_session *ts, const int32_t *text, int n_ver, char *err, size_t errlen) {
    if (!ts || sd_session_n_past(ts) != n_ver) {
        s->n_no_session++;
        return 0;
    }
    if (s->hid && sd_moa_run_n_cached(s->r) < n_ver &&
        (s->hid_ok < n_ver || memcmp(s->htxt, text, sizeof(int32_t) * (size_t)n_ver) != 0)) {
        s->n_no_states++;
        return 0;
    }
    const int L = s->L, ekv = s->ekv, half = ekv / 2;
    while (sd_moa_run_n_cached(s->r) < n_ver) {
        const int p0 = sd_moa_run_n_cached(s->r), c = SD_MIN(SD_MOA_ROWS, n_ver - p0);
        for (int l = 0; l < L; l++) {
            if (sd_session_kv_rows(ts, l, p0, c, s->kb, s->vb) < 0)
                return sd_err(err, errlen, "moa: the target's cache rows %d..%d of layer %d are not readable", p0,
                              p0 + c - 1, l);
            for (int i = 0; i < c; i++) {
                float *row = s->kv + ((size_t)i * L + l) * ekv;
                memcpy(row, s->kb + (size_t)i * half, sizeof(float) * (size_t)half);
                memcpy(row + half, s->vb + (size_t)i * half, sizeof(float) * (size_t)half);
            }
        }
        if (sd_moa_run_context(s->r, s->kv, s->hid ? s->hid + (size_t)p0 * s->E : NULL, text + p0, c, err, errlen) < 0)
            return -1;
    }
    return 1;
}

static int moa_grow(moad *s, const sd_draft_ctx *ctx, sd_tree *tree, const sd_tree_shape *shape, char *err,
                    size_t errlen) {
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    max_nodes = SD_MIN(max_nodes, MOA_TREE_MAX);
    if (max_nodes <= 1) return 0;
    sd_tree_grow g = {moa_dist, s, ctx->stochastic, s->p_min, max_nodes, moa_uniform, ctx->rng, s->head->d2t, s->V,
                      ctx->stochastic ? ctx->race : NULL};
    return sd_draft_grow(tree, &s->p, &s->work, shape, &g, "moa", err, errlen);
}

// Remote: K,V rows kv (n, L, Ekv) of positions pos0 .. pos0+n-1 of text (the
// text up to them; remote 2: LSA's outputs and the TLI layers' rows), and for
// a drafter reading the target's states, their states (n, E) after the n
// rows. Keeps the held positions that agree with text, appends the new ones;
// a gap (rows before pos0 unknown) leaves them unverified text.
static int remote_rows(moad *s, const int32_t *text, int pos0, int n, const float *kv, char *err, size_t errlen) {
    int L = 0;
    const int lim = SD_MIN(sd_moa_run_n_cached(s->r), pos0 + n);
    while (L < lim && s->txt[L] == text[L]) L++;
    sd_moa_run_truncate(s->r, L);   // drops the pending rows too: they attended to the old context
    s->chain_n = 0;
    if (L < pos0) return 0;
    const int end = SD_MIN(pos0 + n, s->n_ctx);
    const size_t N = (size_t)s->head->hp.moa_tli;
    const size_t ld = s->remote == 2 ? (size_t)s->E + N * s->ekv
                      : s->remote == 3 ? (1 + N) * s->ekv
                                       : (size_t)s->L * s->ekv;
    const float *hid = s->hid ? kv + (size_t)n * ld : NULL;   // (n, E) after the rows
    for (int p = L; p < end;) {
        const int c = SD_MIN(SD_MOA_ROWS, end - p);
        memcpy(s->txt + p, text + p, sizeof(int32_t) * (size_t)c);
        const float *rows = kv + (size_t)(p - pos0) * ld, *h = hid ? hid + (size_t)(p - pos0) * s->E : NULL;
        if ((s->remote == 2   ? sd_moa_run_context_lsa(s->r, rows, h, text + p, c, err, errlen)
             : s->remote == 3 ? sd_moa_run_context_mean(s->r, rows, h, text + p, c, err, errlen)
                              : sd_moa_run_context(s->r, rows, h, text + p, c, err, errlen)) < 0)
            return -1;
        p += c;
    }
    return 0;
}

static int moa_prompt(sd_drafter *dr, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                      size_t errlen) {
    moad *s = dr->impl;
    if (!s->remote) {   // in-process: the K,V rows are read from the target's session; the states kept
        put_states(s, tokens, pos0, n, hidden);
        return 0;
    }
    if (!hidden || n < 1) return 0;
    return remote_rows(s, tokens, pos0, n, hidden, err, errlen);
}

// Remote propose: the verified context is what the runner holds; the text
// after it up to the root runs as a chain of pending rows (SA sees it, CA
// does not: no target rows), the tree hangs below its last row.
static int remote_prepare(moad *s, const sd_draft_ctx *ctx, char *err, size_t errlen) {
    const int n = ctx->n_tokens;
    int L = 0;
    const int lim = SD_MIN(sd_moa_run_n_cached(s->r), n - 1);
    while (L < lim && s->txt[L] == ctx->tokens[L]) L++;
    if (L < sd_moa_run_n_cached(s->r)) {
        sd_moa_run_truncate(s->r, L);
        s->chain_n = 0;
    }
    int k = 0;
    while (k < s->chain_n && L + k < n - 1 && s->txt[L + k] == ctx->tokens[L + k]) k++;
    sd_moa_run_keep_pending(s->r, k);
    s->chain_n = k;
    s->root_parent = k > 0 ? k - 1 : -1;
    if (n > s->n_ctx || n - 1 - L > MOA_CHAIN_MAX) return 0;   // too far from the verified text: nothing drafted
    memcpy(s->txt, ctx->tokens, sizeof(int32_t) * (size_t)n);
    s->root_pos = n - 1;
    for (int p = L + k; p < n - 1;) {
        const int c = SD_MIN(SD_MOA_ROWS, n - 1 - p);
        int32_t tok[SD_MOA_ROWS], pos[SD_MOA_ROWS], par[SD_MOA_ROWS];
        for (int j = 0; j < c; j++) tok[j] = ctx->tokens[p + j], pos[j] = p + j, par[j] = s->chain_n + j - 1;
        if (sd_moa_run_eval(s->r, tok, pos, par, c, NULL, NULL, err, errlen) < 0) return -1;
        s->chain_n += c;
        p += c;
    }
    s->root_parent = s->chain_n - 1;
    return 1;
}

static int moa_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    moad *s = dr->impl;
    if (tree->n != 1) return sd_err(err, errlen, "moa: the tree must hold only the root");
    const int n = ctx->n_tokens;
    if (n < 1 || ctx->tokens[n - 1] != tree->token[0])
        return sd_err(err, errlen, "moa: the tree root is not the last committed token");
    s->ctx = ctx;
    if (ctx->stochastic) {
        if (!ctx->sp || !ctx->rng) return sd_err(err, errlen, "moa: stochastic drafting needs sampler params and rng");
        if (sd_draft_sampler_sync(&s->smp, &s->smp_p, ctx->sp, s->nv, err, errlen) < 0) return -1;
    }
    if (s->remote) {
        const int rc = remote_prepare(s, ctx, err, errlen);
        s->followed = ctx->max_nodes == 1;
        if (rc <= 0 || s->followed) return rc < 0 ? -1 : 0;
        const sd_tree_shape *shape = s->au ? sd_draft_auto_begin(s->au) : NULL;
        const int g = moa_grow(s, ctx, tree, shape, err, errlen);
        if (s->au) sd_draft_auto_end(s->au);
        return g < 0 ? -1 : 0;
    }
    sd_moa_run_drop_pending(s->r);
    // Follow the text: keep the verified positions that agree with it.
    int L = 0;
    const int lim = SD_MIN(sd_moa_run_n_cached(s->r), n - 1);
    while (L < lim && s->txt[L] == ctx->tokens[L]) L++;
    sd_moa_run_truncate(s->r, L);
    s->root_pos = -1;
    if (n > s->n_ctx) return 0;   // beyond the drafter's context: nothing drafted
    memcpy(s->txt, ctx->tokens, sizeof(int32_t) * (size_t)n);
    s->root_pos = n - 1;
    int rc = catch_up(s, ctx->target, ctx->tokens, n - 1, err, errlen);
    s->followed = ctx->max_nodes == 1;
    if (rc <= 0 || s->followed) return rc < 0 ? -1 : 0;
    const sd_tree_shape *shape = s->au ? sd_draft_auto_begin(s->au) : NULL;
    rc = moa_grow(s, ctx, tree, shape, err, errlen);
    if (s->au) sd_draft_auto_end(s->au);
    if (s->test_fault && rc >= 0) {   // flatten every recorded distribution after the draws: a wrong q
        for (int r = 0; r < tree->n_dist; r++) {
            float *row = tree->dist + (size_t)r * tree->n_vocab;
            double sum = 0.0;
            for (int v = 0; v < tree->n_vocab; v++) sum += row[v] = sqrtf(row[v]);
            for (int v = 0; v < tree->n_vocab; v++) row[v] = (float)(row[v] / sum);
        }
    }
    return rc < 0 ? -1 : 0;
}

static int moa_accept(sd_drafter *dr, const sd_step_record *rec, char *err, size_t errlen) {
    moad *s = dr->impl;
    char ferr[256];
    const int own = !s->followed;
    // what it learns about its own drafts, from its own tree (the step's, or its part of a merged one)
    const sd_step_record ov = sd_step_own_view(rec);
    if (own && s->au && sd_draft_auto_accept(s->au, &ov, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "moa: %s", ferr);
    const sd_tree *tree = rec->tree;
    if (own && s->p.adapt) {
        int depth = 0;
        for (int i = 1; i < ov.tree->n; i++) depth = SD_MAX(depth, ov.tree->depth[i]);
        s->p_min = sd_draft_adapt_p_min(s->p_min, depth, ov.n_path - 1, &s->p);
    }
    if (s->remote && rec->hidden) {   // the path's K,V rows, from the server: root_pos .. root_pos + n_path - 1
        if (s->root_pos < 0 || s->root_pos + rec->n_path > s->n_ctx) return 0;
        memcpy(s->hist, s->txt, sizeof(int32_t) * (size_t)(s->root_pos + 1));
        for (int k = 1; k < rec->n_path; k++) s->hist[s->root_pos + k] = tree->token[rec->path[k]];
        if (remote_rows(s, s->hist, s->root_pos, rec->n_path, rec->hidden, err, errlen) < 0) return -1;
    } else if (!s->remote) {
        sd_moa_run_drop_pending(s->r);
        // The path joins the text after the root, the bonus becomes the next root: a step can come without a
        // propose (the generation asks for none when it drafts nothing), and its accept stands there.
        const int r0 = s->root_pos, nr = r0 + rec->n_path;
        s->root_pos = -1;
        if (r0 >= 0 && s->txt[r0] == tree->token[0] && nr < s->n_ctx) {
            for (int k = 1; k < rec->n_path; k++) s->txt[r0 + k] = tree->token[rec->path[k]];
            put_states(s, s->txt, r0, rec->n_path, rec->hidden);
            if (rec->bonus >= 0) s->txt[nr] = rec->bonus, s->root_pos = nr;
        }
    }
    for (int k = 0; k < rec->n_path; k++) {
        const int32_t t = k + 1 < rec->n_path ? tree->token[rec->path[k + 1]] : rec->bonus;
        if (t < 0 || t >= s->nv) continue;
        s->cov_n++;
        s->cov_in += s->head->t2d[t] >= 0;
    }
    return 0;
}

static void moa_reset(sd_drafter *dr) {
    moad *s = dr->impl;
    sd_moa_run_truncate(s->r, 0);
    s->root_pos = -1;
    s->chain_n = 0;
    s->root_parent = -1;
    s->followed = 0;
    s->p_min = s->p.p_min;
    sd_draft_auto_reset(s->au);
}

static const char *moa_note(const sd_drafter *dr) {
    moad *s = dr->impl;
    int n = s->cov_n == 0 ? snprintf(s->note, sizeof s->note, "moa drafter: draft vocabulary %d tokens", s->V)
                          : snprintf(s->note, sizeof s->note,
                                     "moa drafter: draft vocabulary %d tokens holds the target's choice %.1f%% of %lld "
                                     "times",
                                     s->V, 100.0 * (double)s->cov_in / (double)s->cov_n, (long long)s->cov_n);
    if (s->n_no_session > 0 && n > 0 && (size_t)n < sizeof s->note)
        n += snprintf(s->note + n, sizeof s->note - (size_t)n, "; %lld steps without the target's cache (no draft)",
                      (long long)s->n_no_session);
    if (s->n_no_states > 0 && n > 0 && (size_t)n < sizeof s->note)
        snprintf(s->note + n, sizeof s->note - (size_t)n, "; %lld steps without the target's states (no draft)",
                 (long long)s->n_no_states);
    return s->note;
}

static int moa_vocab_coverage(const sd_drafter *dr, int64_t *n_checked, int64_t *n_in) {
    const moad *s = dr->impl;
    *n_checked = s->cov_n;
    *n_in = s->cov_in;
    return 1;
}

static int moa_save_head(sd_drafter *dr, const char *path, char *err, size_t errlen) {
    moad *s = dr->impl;
    return sd_head_save(s->head, path, SD_TYPE_Q8_0, err, errlen);
}

static void moa_free(sd_drafter *dr) {
    if (!dr) return;
    moad *s = dr->impl;
    if (s) {
        sd_moa_run_free(s->r);
        sd_draft_auto_free(s->au);
        sd_sampler_free(s->smp);
        sd_tree_free(&s->work);
        void *bufs[] = {s->txt, s->slot, s->lg, s->kv, s->kb, s->vb, s->hist, s->hid, s->htxt};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
        free(s);
    }
    free(dr);
}

static const sd_drafter_vt moa_vt = {.name = "moa",
                                     .propose = moa_propose,
                                     .accept = moa_accept,
                                     .reset = moa_reset,
                                     .prompt = moa_prompt,
                                     .free = moa_free,
                                     .note = moa_note,
                                     .save_head = moa_save_head,
                                     .vocab_coverage = moa_vocab_coverage};

// The drafter's own cost for an automatic tree to start from: a root row
// on an empty context, then 4 rows, best of 3 (ms).
static void moa_time(moad *s, double *per_depth, double *per_node) {
    enum { NR = 4 };
    int32_t tok[NR] = {0}, pos[NR] = {0}, par[NR] = {-1, 0, 0, 0};
    double best[2] = {1e30, 1e30};
    char e2[256];
    for (int rep = 0; rep < 3; rep++)
        for (int k = 0; k < 2; k++) {
            const int n = k ? NR : 1;
            const double t0 = sd_time_ms();
            const int rc = sd_moa_run_eval(s->r, tok, pos, par, n, s->lg, NULL, e2, sizeof e2);
            const double t = sd_time_ms() - t0;
            sd_moa_run_drop_pending(s->r);
            if (rc < 0) return;
            if (t < best[k]) best[k] = t;
        }
    *per_depth = best[0];
    *per_node = best[1] > best[0] ? (best[1] - best[0]) / (NR - 1) : 0.0;
}

int sd_draft_moa_new(sd_drafter **out, const sd_head *h, const sd_model *target, const sd_draft_model_params *p,
                     int wtype, char *err, size_t errlen) {
    *out = NULL;
    if (!h || h->hp.type != SD_HEAD_MOA) return sd_err(err, errlen, "moa: an MoA drafter file is required");
    if (sd_head_check_target(h, target, err, errlen) < 0) return -1;
    sd_draft_model_params dp;
    int n_ctx;
    if (sd_draft_head_params("moa", p, target, MOA_TREE_MAX, &dp, &n_ctx, err, errlen) < 0) return -1;
    moad *s = calloc(1, sizeof *s);
    sd_drafter *dr = s ? sd_drafter_alloc(&moa_vt, s) : NULL;
    if (!dr) {
        free(s);
        return sd_err(err, errlen, "moa: out of memory");
    }
    s->p = dp;
    s->target = target;
    s->head = h;
    s->E = h->hp.n_embd;
    s->V = h->hp.n_draft_vocab;
    s->nv = target->hp.n_vocab;
    s->L = target->hp.n_layer;
    s->ekv = h->hp.moa_kv_width;
    s->n_ctx = n_ctx;
    s->p_min = dp.p_min;
    s->root_pos = -1;
    s->root_parent = -1;
    if (sd_moa_run_new(&s->r, h, target, s->n_ctx, MOA_TREE_MAX + MOA_CHAIN_MAX, wtype, 1, (sd_pool *)dp.pool, err, errlen) < 0) {
        moa_free(dr);
        return -1;
    }
    const size_t R = SD_MOA_ROWS;
    s->txt = malloc(sizeof(int32_t) * (size_t)s->n_ctx);
    s->slot = malloc(sizeof(int32_t) * MOA_TREE_MAX);
    s->lg = malloc(sizeof(float) * R * (size_t)s->V);
    s->kv = malloc(sizeof(float) * R * (size_t)s->L * (size_t)s->ekv);
    s->kb = malloc(sizeof(float) * R * (size_t)(s->ekv / 2));
    s->vb = malloc(sizeof(float) * R * (size_t)(s->ekv / 2));
    s->hist = malloc(sizeof(int32_t) * ((size_t)s->n_ctx + MOA_TREE_MAX + MOA_CHAIN_MAX));
    int bad = !s->txt || !s->slot || !s->lg || !s->kv || !s->kb || !s->vb || !s->hist;
    if (!bad && sd_moa_reads_states(&h->hp)) {   // SA or CA reads the target's states: the engine hands them in
        s->hid = malloc(sizeof(float) * (size_t)s->n_ctx * (size_t)s->E);
        s->htxt = malloc(sizeof(int32_t) * (size_t)s->n_ctx);
        bad = !s->hid || !s->htxt;
        dr->n_hidden_layers = 1;
        dr->hidden_layers[0] = sd_moa_hidden_layer(&h->hp);
    }
    if (!bad && dp.shape == SD_DRAFT_DYNAMIC)
        bad = sd_tree_init(&s->work, 1 + dp.dyn_b * dp.dyn_b * dp.dyn_d, s->nv, 1 + dp.dyn_b * (dp.dyn_d - 1)) < 0;
    if (bad) {
        moa_free(dr);
        return sd_err(err, errlen, "moa: out of memory");
    }
    if (dp.shape == SD_DRAFT_AUTO) {
        sd_draft_auto_params ap = dp.tree_auto;
        ap.on = 1;
        if (ap.draft_ms_per_depth <= 0 && ap.draft_ms_per_node <= 0)
            moa_time(s, &ap.draft_ms_per_depth, &ap.draft_ms_per_node);
        if (sd_draft_auto_new(&s->au, &ap, err, errlen) < 0) {
            moa_free(dr);
            return -1;
        }
    }
    *out = dr;
    return 0;
}

void sd_draft_moa_test_fault(sd_drafter *d, int on) { ((moad *)d->impl)->test_fault = on; }

const float *sd_draft_moa_test_states(const sd_drafter *d, int *n_ok, const int32_t **text) {
    if (!d || d->vt != &moa_vt) return NULL;
    const moad *s = d->impl;
    *n_ok = s->hid_ok;
    *text = s->htxt;
    return s->hid;
}

int sd_draft_moa_set_remote(sd_drafter *d, int on) {
    if (!d || d->vt != &moa_vt) return -1;
    moad *s = d->impl;
    if (on == 3 && !s->head->hp.moa_no_lsa) return -1;   // the layers' mean is what a drafter without LSA reads
    s->remote = on == 2 || on == 3 ? on : on != 0;
    moa_reset(d);
    return 0;
}

int sd_draft_moa_kv_shape(const sd_drafter *d, int *n_layer, int *kv_width) {
    if (!d || d->vt != &moa_vt) return -1;
    const moad *s = d->impl;
    *n_layer = s->L;
    *kv_width = s->ekv;
    return 0;
}
