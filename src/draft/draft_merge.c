// draft_merge.c - the merging drafter: asks each sub-drafter for a tree and
// merges them by token path (SpecInfer); after verification each sub-drafter
// hears the part of the accepted path that is in its own tree. The fallback
// drafter ("A/B") drafts the first non-empty tree of its sub-drafters. A
// sub-drafter that reads hidden states (a head; at most one) hears every full
// path, and in a merge also its own part of it. See draft_merge.h.
#include "draft/draft_merge.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct mg {
    sd_drafter **subs;   // (n) owned
    int n;
    int n_vocab;
    int cap;             // capacity of the sub-trees
    sd_tree *trees;      // (n) the sub-drafters' trees of this step
    int32_t **maps;      // (n, cap) sub-tree node -> merged node
    int32_t *subpath;    // (cap)
    int first;           // 1: the first non-empty tree (A/B), 0: the union (A+B)
    int hid;             // the sub-drafter reading hidden states (first mode), -1: none
} mg;

static void mg_free_trees(mg *g) {
    for (int i = 0; i < g->n; i++) {
        if (g->trees) sd_tree_free(&g->trees[i]);
        if (g->maps) free(g->maps[i]);
    }
    free(g->trees);
    free(g->maps);
    free(g->subpath);
    g->trees = NULL;
    g->maps = NULL;
    g->subpath = NULL;
    g->cap = 0;
}

// Sub-trees of max_nodes nodes (grown once, to the largest tree asked for).
static int mg_reserve(mg *g, int max_nodes, char *err, size_t errlen) {
    if (max_nodes <= g->cap) return 0;
    mg_free_trees(g);
    g->trees = calloc((size_t)g->n, sizeof *g->trees);
    g->maps = calloc((size_t)g->n, sizeof *g->maps);
    g->subpath = malloc(sizeof(int32_t) * (size_t)max_nodes);
    if (!g->trees || !g->maps || !g->subpath) return sd_err(err, errlen, "merge drafter: out of memory");
    for (int i = 0; i < g->n; i++) {
        g->maps[i] = malloc(sizeof(int32_t) * (size_t)max_nodes);
        if (!g->maps[i] || sd_tree_init(&g->trees[i], max_nodes, g->n_vocab, max_nodes) < 0) {
            mg_free_trees(g);
            return sd_err(err, errlen, "merge drafter: out of memory");
        }
    }
    g->cap = max_nodes;
    return 0;
}

static int mg_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    mg *g = dr->impl;
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    if (mg_reserve(g, max_nodes, err, errlen) < 0) return -1;
    int cap0 = tree->cap, drafted = 0;
    for (int i = 0; i < g->n; i++) {
        sd_tree *st = &g->trees[i];
        sd_tree_reset(st, tree->token[0]);
        if (g->first && drafted && i != g->hid) continue;
        sd_draft_ctx c1 = *ctx;
        if (g->first && drafted) c1.max_nodes = 1;   // the head follows the text, drafting nothing
        int rc = g->subs[i]->vt->propose(g->subs[i], &c1, st, err, errlen);
        if (rc < 0) return rc;
        if (g->first && (drafted || st->n <= 1)) continue;
        tree->cap = max_nodes;   // the merge fills up to the step's limit
        rc = sd_tree_merge(tree, st, g->maps[i]);
        tree->cap = cap0;
        if (rc < 0) return sd_err(err, errlen, "merge drafter: sub-drafter %d changed the root", i);
        drafted = 1;
    }
    return 0;
}

// A sub-drafter's view of the target's logits: its tree node i is merged
// node map[i]; auxiliary nodes are not merged (none).
typedef struct sub_logits {
    const sd_step_record *rec;
    const int32_t *map;   // (sub tree n) merged node of each sub-tree node
    int n;                // sub tree nodes
} sub_logits;

static const float *sub_logits_get(void *st, int i) {
    const sub_logits *sl = st;
    return i >= 0 && i < sl->n ? sl->rec->logits(sl->rec->lstate, sl->map[i]) : NULL;
}

static int mg_accept(sd_drafter *dr, const sd_step_record *rec, char *err, size_t errlen) {
    mg *g = dr->impl;
    const sd_tree *tree = rec->tree;
    const int32_t *path = rec->path;
    const int n_path = rec->n_path;
    if (!g->trees) return 0;
    static const sd_aux_nodes no_aux = {0, 0, NULL, NULL, NULL};
    for (int i = 0; i < g->n; i++) {
        if (i == g->hid && g->first) {   // the whole path, with its hidden rows (its tree is the step's, or none)
            int rc = g->subs[i]->vt->accept(g->subs[i], rec, err, errlen);
            if (rc < 0) return rc;
            continue;
        }
        const sd_tree *st = &g->trees[i];
        int cur = 0, len = 1;
        g->subpath[0] = 0;
        while (len < n_path) {
            int nxt = -1;
            for (int c = cur + 1; c < st->n && nxt < 0; c++)
                if (st->parent[c] == cur && g->maps[i][c] == path[len]) nxt = c;
            if (nxt < 0) break;
            g->subpath[len++] = nxt;
            cur = nxt;
        }
        if (i == g->hid) {   // a head hears the whole path and its hidden rows, and which part of it it drafted
            sd_step_record full = *rec;
            full.own_tree = st;
            full.own_path = g->subpath;
            full.own_n_path = len;
            int rc = g->subs[i]->vt->accept(g->subs[i], &full, err, errlen);
            if (rc < 0) return rc;
            continue;
        }
        // The sub-drafter hears its part of the path, then the token that
        // followed it; the path's hidden rows are the first len of the merge's.
        sub_logits sl = {rec, g->maps[i], st->n};
        sd_step_record sub = {.tree = st, .path = g->subpath, .n_path = len,
                              .bonus = len < n_path ? tree->token[path[len]] : rec->bonus, .aux = &no_aux,
                              .draft_ms = rec->draft_ms, .verify_ms = rec->verify_ms, .logits = sub_logits_get,
                              .lstate = &sl, .hidden = rec->hidden};
        int rc = g->subs[i]->vt->accept(g->subs[i], &sub, err, errlen);
        if (rc < 0) return rc;
    }
    return 0;
}

static void mg_reset(sd_drafter *dr) {
    mg *g = dr->impl;
    for (int i = 0; i < g->n; i++) g->subs[i]->vt->reset(g->subs[i]);
}

static void mg_free(sd_drafter *dr) {
    if (!dr) return;
    mg *g = dr->impl;
    if (g) {
        for (int i = 0; i < g->n; i++) sd_drafter_free(g->subs[i]);
        mg_free_trees(g);
        free(g->subs);
        free(g);
    }
    free(dr);
}

// What the hidden-state sub-drafter (a head) answers for the whole drafter.
static sd_drafter *mg_hid(const sd_drafter *dr) {
    const mg *g = dr->impl;
    return g->hid >= 0 ? g->subs[g->hid] : NULL;
}

static int mg_prompt(sd_drafter *dr, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                     size_t errlen) {
    sd_drafter *h = mg_hid(dr);
    return h && h->vt->prompt ? h->vt->prompt(h, tokens, pos0, n, hidden, err, errlen) : 0;
}

// The head's note, else the first sub-drafter's that has one.
static const char *mg_note(const sd_drafter *dr) {
    const mg *g = dr->impl;
    const sd_drafter *h = mg_hid(dr);
    if (h && h->vt->note) return h->vt->note(h);
    for (int i = 0; i < g->n; i++) {
        const char *t = g->subs[i]->vt->note ? g->subs[i]->vt->note(g->subs[i]) : NULL;
        if (t && *t) return t;
    }
    return "";
}

static int mg_save_head(sd_drafter *dr, const char *path, char *err, size_t errlen) {
    sd_drafter *h = mg_hid(dr);
    if (!h || !h->vt->save_head) return sd_err(err, errlen, "this method has no head to save");
    return h->vt->save_head(h, path, err, errlen);
}

static int mg_online_stats(const sd_drafter *dr, sd_head_online_stats *st) {
    sd_drafter *h = mg_hid(dr);
    return h && h->vt->online_stats ? h->vt->online_stats(h, st) : 0;
}

static int mg_vocab_coverage(const sd_drafter *dr, int64_t *n_checked, int64_t *n_in) {
    sd_drafter *h = mg_hid(dr);
    return h && h->vt->vocab_coverage ? h->vt->vocab_coverage(h, n_checked, n_in) : 0;
}

static int mg_online_wait(sd_drafter *dr, char *err, size_t errlen) {
    sd_drafter *h = mg_hid(dr);
    return h && h->vt->online_wait ? h->vt->online_wait(h, err, errlen) : 0;
}

#define MG_VT(NAME)                                                                                            \
    {.name = NAME, .propose = mg_propose, .accept = mg_accept, .prompt = mg_prompt, .reset = mg_reset,       \
     .free = mg_free, .note = mg_note, .save_head = mg_save_head, .online_stats = mg_online_stats,           \
     .vocab_coverage = mg_vocab_coverage, .online_wait = mg_online_wait}
static const sd_drafter_vt mg_vt = MG_VT("merge"), mg_first_vt = MG_VT("fallback");

static int mg_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, int first, char *err,
                  size_t errlen) {
    *out = NULL;
    mg *g = calloc(1, sizeof *g);
    sd_drafter *dr = g ? sd_drafter_alloc(first ? &mg_first_vt : &mg_vt, g) : NULL;
    sd_drafter **s = n_subs > 0 ? malloc(sizeof *s * (size_t)n_subs) : NULL;
    if (!dr || !g || !s || n_vocab < 1) {
        for (int i = 0; i < n_subs; i++) sd_drafter_free(subs[i]);
        free(dr);
        free(g);
        free(s);
        return sd_err(err, errlen, n_subs > 0 ? "merge drafter: out of memory" : "merge drafter: no sub-drafters");
    }
    memcpy(s, subs, sizeof *s * (size_t)n_subs);
    g->subs = s;
    g->n = n_subs;
    g->n_vocab = n_vocab;
    g->first = first;
    g->hid = -1;
    for (int i = 0; i < n_subs; i++) {
        if (subs[i]->n_hidden_layers <= 0) continue;
        if (g->hid >= 0) {
            sd_drafter_free(dr);
            return sd_err(err, errlen, "%s drafter: at most one head (a drafter reading hidden states)",
                          first ? "fallback" : "merge");
        }
        g->hid = i;
        dr->n_hidden_layers = subs[i]->n_hidden_layers;
        memcpy(dr->hidden_layers, subs[i]->hidden_layers, sizeof dr->hidden_layers);
    }
    *out = dr;
    return 0;
}

int sd_draft_merge_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, char *err,
                       size_t errlen) {
    return mg_new(out, subs, n_subs, n_vocab, 0, err, errlen);
}

int sd_draft_first_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, char *err, size_t errlen) {
    return mg_new(out, subs, n_subs, n_vocab, 1, err, errlen);
}
