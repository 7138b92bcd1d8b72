// draft_merge.c - the merging drafter: asks each sub-drafter for a tree and
// merges them by token path (SpecInfer); after verification each sub-drafter
// hears the part of the accepted path that is in its own tree. See
// draft_merge.h.
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

static int mg_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    mg *g = dr->impl;
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    if (max_nodes > g->cap) {   // grows once, to the largest tree asked for
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
    }
    int cap0 = tree->cap;
    for (int i = 0; i < g->n; i++) {
        sd_tree *st = &g->trees[i];
        sd_tree_reset(st, tree->token[0]);
        int rc = g->subs[i]->vt->propose(g->subs[i], ctx, st, err, errlen);
        if (rc < 0) return rc;
        tree->cap = max_nodes;   // the merge fills up to the step's limit
        rc = sd_tree_merge(tree, st, g->maps[i]);
        tree->cap = cap0;
        if (rc < 0) return sd_err(err, errlen, "merge drafter: sub-drafter %d changed the root", i);
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
        // The sub-drafter hears its part of the path, then the token that
        // followed it; the path's hidden rows are the first len of the merge's.
        sub_logits sl = {rec, g->maps[i], st->n};
        sd_step_record sub = {st, g->subpath, len, len < n_path ? tree->token[path[len]] : rec->bonus, &no_aux,
                              rec->draft_ms, rec->verify_ms, sub_logits_get, &sl, rec->hidden};
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

static const sd_drafter_vt mg_vt = {
    .name = "merge", .propose = mg_propose, .accept = mg_accept, .reset = mg_reset, .free = mg_free};

int sd_draft_merge_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, char *err,
                       size_t errlen) {
    *out = NULL;
    mg *g = calloc(1, sizeof *g);
    sd_drafter *dr = g ? sd_drafter_alloc(&mg_vt, g) : NULL;
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
    *out = dr;
    return 0;
}
