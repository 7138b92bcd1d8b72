// draft_eagle3.c - the EAGLE-3 drafter (docs/heads.md): a trained head that
// reads the target's hidden states of the accepted text and drafts chains,
// SpecInfer trees, EAGLE-2 dynamic trees or automatically sized ones.
//
// State follows the text by position p: the fused state g_p of every
// position the target evaluated (from the prompt's rows and from each step's
// record), and the head's KV cache of rows made from those states (row p
// pairs token x_p with g_{p-1}). At propose time the rows up to the root's
// position are made (a chain, committed), the root row's output gives the
// root's children, and deeper tree nodes are pending rows fed with their
// parent's output state, dropped after the step. Positions whose state is
// unknown (a prompt prefix another generation evaluated) get no row; the
// head then attends to fewer rows, which costs acceptance, never correctness.
// The target's rows of a position are fused (fc) only when a draft needs
// them, or when E3_RAW_MAX of them wait: they wait, unfused, in a run of
// pending positions and are fused together, one matrix product for many
// rows. A server under load drafts nothing for many steps (its draft budget,
// serve/budget.h): a matrix-vector product per slot and step cost it ~5% of
// its rounds for nothing.
#include "draft/draft_eagle3.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/draft_head.h"
#include "head/eagle3.h"
#include "model/model.h"

#define E3_TREE_MAX 512
#define E3_ROWS 64   // rows per head call
#define E3_RAW_MAX 256   // the target's rows waiting to be fused, at most

typedef struct e3d {
    sd_draft_model_params p;
    const sd_model *target;
    const sd_head *head;
    sd_e3 *e;
    int d, V, nv, n_ctx;
    int32_t *txt;        // (n_ctx) the text the state follows
    int n_txt;
    float *g;            // (n_ctx, d) fused states
    uint8_t *gv;         // (n_ctx) 1: g_p known (fused, or its rows pending)
    float *raw;          // (E3_RAW_MAX, 3d) the target's rows of positions raw_lo.. not yet fused
    int raw_lo, raw_n;
    int32_t *row_pos;    // (n_ctx) position of each committed head row
    int last_row;        // position of the last committed row, -1: none
    float *last_h;       // (d) output state of that row
    float *last_lg;      // (V) its draft logits
    int root_pos;        // position of the root at the last propose
    int followed;        // 1: the last propose only followed the text (room for no draft)
    // tree scratch
    int32_t *slot;       // (E3_TREE_MAX) pending slot of each evaluated node
    float *node_h;       // (E3_TREE_MAX, d)
    float *lg;           // (E3_ROWS, V)
    float *hbuf;         // (E3_ROWS, d)
    float *cbuf;         // (E3_ROWS, d)
    int32_t *hist;       // (n_ctx + E3_TREE_MAX)
    float *feat;         // (E3_ROWS, 3d) staging of hidden rows
    sd_sampler *smp;
    sd_sampler_params smp_p;
    const sd_draft_ctx *ctx;
    float p_min;
    sd_tree work;
    sd_draft_auto *au;
    // coverage of the draft vocabulary: the target's tokens after path nodes, and those it holds
    int64_t cov_n, cov_in;
    void *lr;            // online adaptation (through hook), or NULL
    const sd_e3_online_hook *hook;
    char note[400];
    int test_fault;      // tests only: misreport the draft distributions (sd_draft_eagle3_test_fault)
    int fused;           // 1: hidden rows handed in are fused states (n, d), not (n, 3, d) target rows
                         // (a remote client: the server fuses); accept without rows feeds the head's
                         // own predicted states (sd_draft_eagle3_set_fused)
} e3d;

static double e3_uniform(void *st) { return sd_rng_uniform((sd_rng *)st); }

// Fuses the pending rows into g.
static void fuse_pending(e3d *s) {
    if (s->raw_n > 0) sd_e3_fuse(s->e, s->raw, s->raw_n, s->g + (size_t)s->raw_lo * s->d);
    s->raw_n = 0;
}

// Takes n hidden rows (n, 3, d) of positions pos0..: they wait, unfused,
// after the pending ones when they continue them (fused at the next
// catch-up, or E3_RAW_MAX at a time).
static void put_states(e3d *s, const float *hidden, int pos0, int n) {
    if (pos0 >= s->n_ctx || n <= 0) return;
    n = SD_MIN(n, s->n_ctx - pos0);
    memset(s->gv + pos0, 1, (size_t)n);
    if (s->fused) {
        memcpy(s->g + (size_t)pos0 * s->d, hidden, sizeof(float) * (size_t)n * s->d);
        return;
    }
    const int end = s->raw_lo + s->raw_n;
    if (s->raw_n > 0 && pos0 >= s->raw_lo && pos0 <= end && pos0 + n >= end)
        s->raw_n = pos0 - s->raw_lo;   // continues the pending run, or rewrites its tail
    else
        fuse_pending(s);   // none pending, a gap, or rows before or inside the run: g holds those first
    if (s->raw_n == 0) s->raw_lo = pos0;
    const size_t row = 3 * (size_t)s->d;
    for (int i = 0; i < n;) {
        if (s->raw_n == E3_RAW_MAX) {
            fuse_pending(s);
            s->raw_lo = pos0 + i;
        }
        const int c = SD_MIN(n - i, E3_RAW_MAX - s->raw_n);
        memcpy(s->raw + (size_t)s->raw_n * row, hidden + (size_t)i * row, sizeof(float) * row * (size_t)c);
        s->raw_n += c;
        i += c;
    }
}

// Forget everything from position L on (the text changed there).
static int cut_text(e3d *s, int L, char *err, size_t errlen) {
    if (s->lr && s->hook->cut(s->lr, L, err, errlen) < 0) return -1;
    if (L >= s->n_txt && L > s->last_row) return 0;
    if (L < s->n_ctx) memset(s->gv + L, 0, (size_t)(s->n_ctx - L));
    if (s->raw_lo + s->raw_n > L) s->raw_n = SD_MAX(0, L - s->raw_lo);
    int n = sd_e3_n_cached(s->e);
    while (n > 0 && s->row_pos[n - 1] >= L) n--;
    sd_e3_truncate(s->e, n);
    s->last_row = n > 0 ? s->row_pos[n - 1] : -1;
    if (s->n_txt > L) s->n_txt = L;
    return 0;
}

static int e3_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows, char *err,
                   size_t errlen) {
    e3d *s = ud;
    if (t->n > E3_TREE_MAX) return sd_err(err, errlen, "eagle3: tree of %d nodes is too large", t->n);
    for (int j0 = 0; j0 < n_nodes; j0 += E3_ROWS) {
        int c = SD_MIN(E3_ROWS, n_nodes - j0);
        int32_t tok[E3_ROWS], pos[E3_ROWS], par[E3_ROWS];
        int nr = 0, map[E3_ROWS];
        for (int j = 0; j < c; j++) {
            int node = nodes[j0 + j];
            map[j] = -1;
            if (node == 0) continue;
            int pa = t->parent[node];
            tok[nr] = t->token[node];
            pos[nr] = s->root_pos + t->depth[node];
            par[nr] = pa == 0 ? -1 : s->slot[pa];
            memcpy(s->cbuf + (size_t)nr * s->d, pa == 0 ? s->last_h : s->node_h + (size_t)pa * s->d,
                   sizeof(float) * (size_t)s->d);
            map[j] = nr++;
        }
        if (nr > 0) {
            if (sd_e3_n_pending(s->e) + nr > E3_TREE_MAX || sd_e3_n_cached(s->e) >= s->n_ctx) {
                for (int j = 0; j < c; j++) memset(rows[j0 + j], 0, sizeof(float) * (size_t)t->n_vocab);
                continue;   // no room: these nodes get no children
            }
            int slot0 = sd_e3_n_pending(s->e);
            if (sd_e3_eval(s->e, tok, s->cbuf, pos, par, nr, s->hbuf, s->lg, err, errlen) < 0) return -1;
            for (int j = 0; j < c; j++) {
                if (map[j] < 0) continue;
                int node = nodes[j0 + j];
                s->slot[node] = slot0 + map[j];
                memcpy(s->node_h + (size_t)node * s->d, s->hbuf + (size_t)map[j] * s->d, sizeof(float) * (size_t)s->d);
            }
        }
        for (int j = 0; j < c; j++) {
            int node = nodes[j0 + j];
            const float *lg = node == 0 ? s->last_lg : s->lg + (size_t)map[j] * s->V;
            int nh = s->ctx->stochastic ? sd_draft_node_hist(s->ctx, t, node, s->hist) : 0;
            sd_draft_head_dist(s->head, s->smp, s->ctx->stochastic, lg, s->nv, s->hist, nh, rows[j0 + j]);
            if (t->n_vocab > s->nv) memset(rows[j0 + j] + s->nv, 0, sizeof(float) * (size_t)(t->n_vocab - s->nv));
        }
    }
    return 0;
}

// Makes the committed rows up to position n-1 (the root). Returns 1 when the
// root row exists, 0 when it cannot (no state for position n-2, or no room).
static int catch_up(e3d *s, const int32_t *text, int n, char *err, size_t errlen) {
    int32_t tok[E3_ROWS], pos[E3_ROWS], par[E3_ROWS], slots[E3_ROWS];
    int p = s->last_row + 1;
    if (p < 1) p = 1;
    if (p <= n - 1) fuse_pending(s);
    while (p <= n - 1) {
        int nr = 0;
        while (p <= n - 1 && nr < E3_ROWS) {
            if (s->gv[p - 1] && sd_e3_n_cached(s->e) + nr < s->n_ctx) {
                tok[nr] = text[p];
                pos[nr] = p;
                par[nr] = nr - 1;
                slots[nr] = nr;
                memcpy(s->cbuf + (size_t)nr * s->d, s->g + (size_t)(p - 1) * s->d, sizeof(float) * (size_t)s->d);
                nr++;
            }
            p++;
        }
        if (nr == 0) continue;
        sd_e3_drop_pending(s->e);
        // the last row's outputs only: the others' keys and values are all the draft reads of them
        if (sd_e3_eval_last(s->e, tok, s->cbuf, pos, par, nr, s->hbuf, s->lg, err, errlen) < 0) return -1;
        int n0 = sd_e3_n_cached(s->e);
        if (sd_e3_commit(s->e, slots, nr, err, errlen) < 0) return -1;
        for (int i = 0; i < nr; i++) s->row_pos[n0 + i] = pos[i];
        s->last_row = pos[nr - 1];
        memcpy(s->last_h, s->hbuf, sizeof(float) * (size_t)s->d);
        memcpy(s->last_lg, s->lg, sizeof(float) * (size_t)s->V);
    }
    return s->last_row == n - 1;
}

static int e3_grow(e3d *s, const sd_draft_ctx *ctx, sd_tree *tree, const sd_tree_shape *shape, char *err,
                   size_t errlen) {
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    max_nodes = SD_MIN(max_nodes, E3_TREE_MAX);
    if (max_nodes <= 1) return 0;
    sd_tree_grow g = {e3_dist, s, ctx->stochastic, s->p_min, max_nodes, e3_uniform, ctx->rng, s->head->d2t, s->V,
                      ctx->stochastic ? ctx->race : NULL};
    return sd_draft_grow(tree, &s->p, &s->work, shape, &g, "eagle3", err, errlen);
}

static int e3_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    e3d *s = dr->impl;
    if (tree->n != 1) return sd_err(err, errlen, "eagle3: the tree must hold only the root");
    const int n = ctx->n_tokens;
    if (n < 1 || ctx->tokens[n - 1] != tree->token[0])
        return sd_err(err, errlen, "eagle3: the tree root is not the last committed token");
    s->ctx = ctx;
    if (ctx->stochastic) {
        if (!ctx->sp || !ctx->rng) return sd_err(err, errlen, "eagle3: stochastic drafting needs sampler params and rng");
        if (sd_draft_sampler_sync(&s->smp, &s->smp_p, ctx->sp, s->nv, err, errlen) < 0) return -1;
    }
    if (s->lr) s->hook->swap(s->lr, s->e);   // newer parameters, when ready (never waits)
    // Follow the text: keep what agrees with it.
    int L = 0, lim = SD_MIN(s->n_txt, n);
    while (L < lim && s->txt[L] == ctx->tokens[L]) L++;
    if (cut_text(s, L, err, errlen) < 0) return -1;
    if (n > s->n_ctx) return 0;   // beyond the head's context: nothing drafted
    memcpy(s->txt, ctx->tokens, sizeof(int32_t) * (size_t)n);
    s->n_txt = n;
    s->root_pos = n - 1;
    sd_e3_drop_pending(s->e);
    // No room for a draft (a fallback method's other drafter drafts this
    // step): the rows up to the root wait for the next draft.
    s->followed = ctx->max_nodes == 1;
    if (s->followed) return 0;
    const sd_tree_shape *shape = s->au ? sd_draft_auto_begin(s->au) : NULL;
    // no draft this step (the automatic tree's choice): the rows wait for the next draft, caught up together
    int rc = shape && shape->n <= 1 ? 0 : catch_up(s, ctx->tokens, n, err, errlen);
    if (rc > 0) rc = e3_grow(s, ctx, tree, shape, err, errlen);
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

// Online adaptation: the path's positions (root first) with their target
// rows and the target's logits after each go to the learner.
static int learn(e3d *s, const sd_step_record *rec, char *err, size_t errlen) {
    for (int k = 0; k < rec->n_path; k++) {
        const float *lt = rec->logits ? rec->logits(rec->lstate, rec->path[k]) : NULL;
        if (!lt || !rec->hidden) return s->hook->brk(s->lr, err, errlen);
        if (s->hook->add(s->lr, s->root_pos + k, rec->tree->token[rec->path[k]],
                           rec->hidden + (size_t)k * 3 * s->d, lt, err, errlen) < 0)
            return -1;
    }
    return 0;
}

// No target rows (a remote client drafting offline): the path's states are
// the head's own outputs, its prediction of the target's fused states (the
// root's row output, then each path node's as the tree evaluated it).
static void self_states(e3d *s, const sd_step_record *rec) {
    for (int k = 0; k < rec->n_path; k++) {
        const int p = s->root_pos + k, node = rec->path[k];
        if (p >= s->n_ctx) return;
        if (k > 0 && (node >= E3_TREE_MAX || node >= rec->tree->n)) return;
        const float *h = k == 0 ? s->last_h : s->node_h + (size_t)node * s->d;
        if (k == 0 && s->last_row != s->root_pos) return;   // no root row: no prediction
        memcpy(s->g + (size_t)p * s->d, h, sizeof(float) * (size_t)s->d);
        s->gv[p] = 1;
    }
}

static int e3_accept(sd_drafter *dr, const sd_step_record *rec, char *err, size_t errlen) {
    e3d *s = dr->impl;
    char ferr[256];
    const int own = !s->followed;   // the step's tree is this drafter's
    // what it learns about its own drafts, from its own tree (the step's, or its part of a merged one)
    const sd_step_record ov = sd_step_own_view(rec);
    if (own && s->au && sd_draft_auto_accept(s->au, &ov, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "eagle3: %s", ferr);
    const sd_tree *tree = rec->tree;
    if (own && s->p.adapt) {
        int depth = 0;
        for (int i = 1; i < ov.tree->n; i++) depth = SD_MAX(depth, ov.tree->depth[i]);
        s->p_min = sd_draft_adapt_p_min(s->p_min, depth, ov.n_path - 1, &s->p);
    }
    sd_e3_drop_pending(s->e);
    // Coverage: is the target's choice after each path node (the next path
    // token, the bonus after the last) a draft token?
    for (int k = 0; k < rec->n_path; k++) {
        const int32_t t = k + 1 < rec->n_path ? tree->token[rec->path[k + 1]] : rec->bonus;
        if (t < 0 || t >= s->nv) continue;
        s->cov_n++;
        s->cov_in += s->head->t2d[t] >= 0;
    }
    // The accepted tokens join the text at the positions after the root, and
    // the target's states of the path become fused states.
    if (s->root_pos < 0 || s->n_txt != s->root_pos + 1)   // nothing proposed for this text
        return s->lr ? s->hook->brk(s->lr, err, errlen) : 0;
    for (int k = 1; k < rec->n_path && s->n_txt < s->n_ctx; k++) s->txt[s->n_txt++] = tree->token[rec->path[k]];
    if (rec->hidden) put_states(s, rec->hidden, s->root_pos, rec->n_path);
    else if (s->fused && !s->followed && !rec->own_tree) self_states(s, rec);   // (its own node rows)
    if (s->lr) return learn(s, rec, err, errlen);
    return 0;
}

static int e3_prompt(sd_drafter *dr, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                     size_t errlen) {
    e3d *s = dr->impl;
    int end = SD_MIN(pos0 + n, s->n_ctx);
    int L = 0, lim = SD_MIN(s->n_txt, end);
    while (L < lim && s->txt[L] == tokens[L]) L++;
    if (cut_text(s, L, err, errlen) < 0) return -1;
    if (end <= pos0) return 0;
    memcpy(s->txt + L, tokens + L, sizeof(int32_t) * (size_t)(end - L));
    s->n_txt = end;
    put_states(s, hidden, pos0, end - pos0);
    return 0;
}

static void e3_reset(sd_drafter *dr) {
    e3d *s = dr->impl;
    s->n_txt = 0;
    s->raw_n = 0;
    memset(s->gv, 0, (size_t)s->n_ctx);
    sd_e3_truncate(s->e, 0);
    s->last_row = -1;
    s->root_pos = -1;
    s->followed = 0;
    s->p_min = s->p.p_min;
    sd_draft_auto_reset(s->au);
    if (s->lr) s->hook->reset(s->lr, s->e);
}

static const char *e3_note(const sd_drafter *dr) {
    e3d *s = dr->impl;
    int n;
    if (s->cov_n == 0) n = snprintf(s->note, sizeof s->note, "eagle3 head: draft vocabulary %d tokens", s->V);
    else
        n = snprintf(s->note, sizeof s->note, "eagle3 head: draft vocabulary %d tokens holds the target's choice %.1f%% of %lld times",
                     s->V, 100.0 * (double)s->cov_in / (double)s->cov_n, (long long)s->cov_n);
    if (s->lr && n > 0 && (size_t)n + 2 < sizeof s->note) {
        memcpy(s->note + n, "; ", 3);
        s->hook->note(s->lr, s->note + n + 2, sizeof s->note - (size_t)n - 2);
    }
    return s->note;
}

static int e3_vocab_coverage(const sd_drafter *dr, int64_t *n_checked, int64_t *n_in) {
    const e3d *s = dr->impl;
    *n_checked = s->cov_n;
    *n_in = s->cov_in;
    return 1;
}

static int e3_save_head(sd_drafter *dr, const char *path, char *err, size_t errlen) {
    e3d *s = dr->impl;
    if (s->lr) return s->hook->save(s->lr, path, err, errlen);
    return sd_head_save_for(s->head, s->target, path, SD_TYPE_Q8_0, err, errlen);
}

static int e3_online_wait(sd_drafter *dr, char *err, size_t errlen) {
    e3d *s = dr->impl;
    return s->lr ? s->hook->drain(s->lr, err, errlen) : 0;
}

static int e3_online_stats(const sd_drafter *dr, sd_head_online_stats *st) {
    e3d *s = dr->impl;
    if (!s->lr) return 0;
    s->hook->stats(s->lr, st);
    return 1;
}

static void e3_free(sd_drafter *dr) {
    if (!dr) return;
    e3d *s = dr->impl;
    if (s) {
        if (s->lr) s->hook->free(s->lr);   // (first: stops the training thread)
        sd_e3_free(s->e);
        sd_draft_auto_free(s->au);
        sd_sampler_free(s->smp);
        sd_tree_free(&s->work);
        void *bufs[] = {s->txt, s->g, s->gv, s->raw, s->row_pos, s->last_h, s->last_lg, s->slot, s->node_h,
                        s->lg, s->hbuf, s->cbuf, s->hist, s->feat};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
        free(s);
    }
    free(dr);
}

static const sd_drafter_vt e3_vt = {.name = "eagle3",
                                    .propose = e3_propose,
                                    .accept = e3_accept,
                                    .prompt = e3_prompt,
                                    .reset = e3_reset,
                                    .free = e3_free,
                                    .note = e3_note,
                                    .save_head = e3_save_head,
                                    .vocab_coverage = e3_vocab_coverage,
                                    .online_stats = e3_online_stats,
                                    .online_wait = e3_online_wait};

// The top-1 agreement with the target that training measured on held-back
// text (the first training-time-test step: "eval_agree=a0,a1,..." in the
// file's note), or 0 when the head does not record it.
static double e3_head_agreement(const sd_head *h) {
    static const char key[] = "eval_agree=";
    const char *k = strstr(h->note, key);
    if (!k) return 0.0;
    char *end;
    const double a = strtod(k + sizeof key - 1, &end);
    return end != k + sizeof key - 1 && a > 0 && a < 1 ? a : 0.0;
}

// The head's own cost, for an automatic tree to start from (instead of
// learning it from 0, which makes the first trees of every text far too
// deep): one row, then 4 sibling rows, of zeros on an empty cache, best of 3
// each. *per_depth = the one-row call, *per_node = what each further row of
// a call adds (ms). The drafter learns the real figures online from there.
static void e3_time_head(e3d *s, double *per_depth, double *per_node) {
    enum { NR = 4 };
    int32_t tok[NR] = {0}, pos[NR] = {0}, par[NR] = {-1, -1, -1, -1};
    memset(s->cbuf, 0, sizeof(float) * NR * (size_t)s->d);
    double best[2] = {1e30, 1e30};
    char e2[256];
    for (int rep = 0; rep < 3; rep++)
        for (int k = 0; k < 2; k++) {
            const int n = k ? NR : 1;
            const double t0 = sd_time_ms();
            const int rc = sd_e3_eval(s->e, tok, s->cbuf, pos, par, n, s->hbuf, s->lg, e2, sizeof e2);
            const double t = sd_time_ms() - t0;
            sd_e3_drop_pending(s->e);
            if (rc < 0) return;   // no estimate: learnt online from 0 as before
            if (t < best[k]) best[k] = t;
        }
    *per_depth = best[0];
    *per_node = best[1] > best[0] ? (best[1] - best[0]) / (NR - 1) : 0.0;
}

int sd_draft_eagle3_new(sd_drafter **out, const sd_head *h, const sd_model *target, const sd_draft_model_params *p,
                        int wtype, const sd_head_online_params *online, const sd_e3_online_hook *hook, char *err,
                        size_t errlen) {
    *out = NULL;
    if (!h || h->hp.type != SD_HEAD_EAGLE3) return sd_err(err, errlen, "eagle3: an EAGLE-3 head is required");
    if (sd_head_check_target(h, target, err, errlen) < 0) return -1;
    sd_draft_model_params dp;
    int n_ctx;
    if (sd_draft_head_params("eagle3", p, target, E3_TREE_MAX, &dp, &n_ctx, err, errlen) < 0) return -1;
    e3d *s = calloc(1, sizeof *s);
    sd_drafter *dr = s ? sd_drafter_alloc(&e3_vt, s) : NULL;
    if (!dr) {
        free(s);
        return sd_err(err, errlen, "eagle3: out of memory");
    }
    s->p = dp;
    s->target = target;
    s->head = h;
    s->d = h->hp.n_embd;
    s->V = h->hp.n_draft_vocab;
    s->nv = target->hp.n_vocab;
    s->n_ctx = n_ctx;
    s->p_min = dp.p_min;
    s->last_row = -1;
    s->root_pos = -1;
    const int learns = online && online->on;   // its runner's parameters change: a pack of its own
    if (sd_e3_new(&s->e, h, target, s->n_ctx, E3_ROWS, E3_TREE_MAX, wtype, !learns, (sd_pool *)dp.pool, err,
                  errlen) < 0) {
        e3_free(dr);
        return -1;
    }
    const size_t d = (size_t)s->d, nc = (size_t)s->n_ctx;
    s->txt = malloc(sizeof(int32_t) * nc);
    s->g = malloc(sizeof(float) * nc * d);
    s->gv = calloc(nc, 1);
    s->raw = malloc(sizeof(float) * E3_RAW_MAX * 3 * d);
    s->row_pos = malloc(sizeof(int32_t) * nc);
    s->last_h = malloc(sizeof(float) * d);
    s->last_lg = malloc(sizeof(float) * (size_t)s->V);
    s->slot = malloc(sizeof(int32_t) * E3_TREE_MAX);
    s->node_h = malloc(sizeof(float) * E3_TREE_MAX * d);
    s->lg = malloc(sizeof(float) * E3_ROWS * (size_t)s->V);
    s->hbuf = malloc(sizeof(float) * E3_ROWS * d);
    s->cbuf = malloc(sizeof(float) * E3_ROWS * d);
    s->hist = malloc(sizeof(int32_t) * (nc + E3_TREE_MAX));
    int bad = !s->txt || !s->g || !s->gv || !s->raw || !s->row_pos || !s->last_h || !s->last_lg || !s->slot || !s->node_h ||
              !s->lg || !s->hbuf || !s->cbuf || !s->hist;
    if (!bad && dp.shape == SD_DRAFT_DYNAMIC)
        bad = sd_tree_init(&s->work, 1 + dp.dyn_b * dp.dyn_b * dp.dyn_d, s->nv, 1 + dp.dyn_b * (dp.dyn_d - 1)) < 0;
    if (bad) {
        e3_free(dr);
        return sd_err(err, errlen, "eagle3: out of memory");
    }
    if (dp.shape == SD_DRAFT_AUTO) {
        sd_draft_auto_params ap = dp.tree_auto;
        ap.on = 1;
        if (ap.draft_ms_per_depth <= 0 && ap.draft_ms_per_node <= 0)
            e3_time_head(s, &ap.draft_ms_per_depth, &ap.draft_ms_per_node);
        if (ap.prior_top1 <= 0) ap.prior_top1 = e3_head_agreement(h);
        if (sd_draft_auto_new(&s->au, &ap, err, errlen) < 0) {
            e3_free(dr);
            return -1;
        }
    }
    if (online && online->on && !hook) {
        e3_free(dr);
        return sd_err(err, errlen, "eagle3: online adaptation is not available here (no learner given)");
    }
    s->hook = hook;
    if (online && online->on && hook->create(&s->lr, h, target, wtype, online, err, errlen) < 0) {
        e3_free(dr);
        return -1;
    }
    dr->n_hidden_layers = 3;
    for (int i = 0; i < 3; i++) dr->hidden_layers[i] = h->hp.extract[i];
    *out = dr;
    return 0;
}

void sd_draft_eagle3_test_fault(sd_drafter *d, int on) { ((e3d *)d->impl)->test_fault = on; }

int sd_draft_eagle3_set_fused(sd_drafter *d, int on) {
    if (!d || d->vt != &e3_vt) return -1;
    e3d *s = d->impl;
    if (on && s->lr) return -1;   // online learning reads the target's raw rows
    fuse_pending(s);
    s->fused = on != 0;
    return 0;
}
