// test_merge_head.c - a head (a drafter reading the target's hidden states)
// inside a merge of trees ("A+B"): the merging drafter hands it the whole
// accepted path with every hidden row, and, for what it learns about its own
// drafts, its own tree and the part of the path in it; sd_step_own_view gives
// that view. The method strings accept one head in a merge and refuse two.
// (Greedy output of merges with a real EAGLE-3 head: test_eagle3_drafter.c.)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft/draft_merge.h"
#include "draft/drafter.h"
#include "spec/tree.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

#define NV 64

static char g_err[512];

// A fixed chain drafter; with hid set it says it reads hidden states (one
// layer) and keeps what its accept heard.
typedef struct spy {
    int32_t chain[4];
    int n_chain;
    int hid;
    int accepts;
    sd_step_record got;           // the last record heard (pointers valid until the next propose)
    int32_t path_tok[8];          // the tokens of the full path heard
    int32_t own_tok[8];           // the tokens of own_path in own_tree
    float row0;                   // the first hidden value of the last path row heard
} spy;

static int spy_propose(sd_drafter *d, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    (void)ctx;
    spy *s = d->impl;
    int parent = 0;
    for (int i = 0; i < s->n_chain; i++) {
        int node = sd_tree_add(tree, parent, s->chain[i], 0.5f);
        if (node < 0) return sd_err(err, errlen, "spy: tree full");
        parent = node;
    }
    return 0;
}

static int spy_accept(sd_drafter *d, const sd_step_record *rec, char *err, size_t errlen) {
    (void)err, (void)errlen;
    spy *s = d->impl;
    s->accepts++;
    s->got = *rec;
    for (int k = 0; k < rec->n_path && k < 8; k++) s->path_tok[k] = rec->tree->token[rec->path[k]];
    for (int k = 0; rec->own_tree && k < rec->own_n_path && k < 8; k++)
        s->own_tok[k] = rec->own_tree->token[rec->own_path[k]];
    s->row0 = rec->hidden ? rec->hidden[(size_t)(rec->n_path - 1) * 4] : -1.0f;
    return 0;
}

static void spy_reset(sd_drafter *d) { (void)d; }
static void spy_free(sd_drafter *d) {
    if (d) free(d->impl);
    free(d);
}
static const sd_drafter_vt spy_vt = {.name = "spy", .propose = spy_propose, .accept = spy_accept, .reset = spy_reset,
                                     .free = spy_free};

static sd_drafter *new_spy(const int32_t *chain, int n, int hid) {
    spy *s = calloc(1, sizeof *s);
    sd_drafter *d = s ? sd_drafter_alloc(&spy_vt, s) : NULL;
    if (!d) {
        free(s);
        return NULL;
    }
    memcpy(s->chain, chain, sizeof(int32_t) * (size_t)n);
    s->n_chain = n;
    s->hid = hid;
    if (hid) {
        d->n_hidden_layers = 1;
        d->hidden_layers[0] = 3;
    }
    return d;
}

// The head's chain 10 11 12, the other's 10 20 21: merged, the root's child
// 10 is shared. The target accepts 10 20 21 (the other's branch): the head
// hears the full path 10 20 21 with its three rows, and that its own part
// was the root and 10 (nodes of its own tree).
static void test_head_hears_full_path_and_own_part(void) {
    static const int32_t head_chain[3] = {10, 11, 12}, other_chain[3] = {10, 20, 21};
    sd_drafter *subs[2] = {new_spy(other_chain, 3, 0), new_spy(head_chain, 3, 1)};
    CHECK(subs[0] && subs[1], "out of memory");
    if (!subs[0] || !subs[1]) return;
    spy *other = subs[0]->impl, *head = subs[1]->impl;
    sd_drafter *mg = NULL;
    CHECK(sd_draft_merge_new(&mg, subs, 2, NV, g_err, sizeof g_err) == 0, "one head in a merge: %s", g_err);
    if (!mg) return;
    CHECK(mg->n_hidden_layers == 1 && mg->hidden_layers[0] == 3, "the merge asks for the head's layers (%d)",
          mg->n_hidden_layers);
    sd_tree *t = NULL;
    CHECK(sd_tree_new(&t, 16, NV, g_err, sizeof g_err) == 0, "%s", g_err);
    const int32_t text[2] = {1, 5};
    CHECK(t && sd_drafter_draft(mg, text, 2, 16, t, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(t && sd_tree_size(t) == 6, "merged tree: %d nodes, expected 6 (root, 10, 11, 12, 20, 21)",
          t ? sd_tree_size(t) : -1);
    if (!t || sd_tree_size(t) != 6) goto out;
    // the accepted path: root -> 10 -> 20 -> 21, found by tokens in the merged tree
    int32_t path[4] = {0, -1, -1, -1};
    for (int k = 1; k < 4; k++)
        for (int i = 1; i < sd_tree_size(t); i++)
            if (sd_tree_parent(t, i) == path[k - 1] && sd_tree_token(t, i) == other_chain[k - 1]) path[k] = i;
    CHECK(path[1] > 0 && path[2] > 0 && path[3] > 0, "the other's branch is in the merged tree");
    float rows[4 * 4];   // (n_path, 1 layer, n_embd 4)
    for (int i = 0; i < 16; i++) rows[i] = (float)i;
    static const sd_aux_nodes none = {0};
    const sd_step_record rec = {.tree = t, .path = path, .n_path = 4, .bonus = 33, .aux = &none, .draft_ms = 1.0,
                                .verify_ms = 5.0, .hidden = rows};   // (as generation hands it: timed)
    CHECK(mg->vt->accept(mg, &rec, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(head->accepts == 1 && other->accepts == 1, "accepts heard: head %d, other %d", head->accepts,
          other->accepts);
    // the head: the full path with its rows
    CHECK(head->got.n_path == 4 && head->got.bonus == 33, "head: path of %d nodes, bonus %d", head->got.n_path,
          head->got.bonus);
    CHECK(head->path_tok[1] == 10 && head->path_tok[2] == 20 && head->path_tok[3] == 21, "head: path tokens %d %d %d",
          head->path_tok[1], head->path_tok[2], head->path_tok[3]);
    CHECK(head->row0 == 12.0f, "head: the last path row's first value %g, expected 12 (all 4 rows handed on)",
          head->row0);
    // ... and its own part: the root and 10, in its own tree (3 drafted nodes + root)
    CHECK(head->got.own_tree && head->got.own_tree->n == 4, "head: own tree of %d nodes, expected 4",
          head->got.own_tree ? head->got.own_tree->n : -1);
    CHECK(head->got.own_n_path == 2 && head->own_tok[1] == 10, "head: own part of %d nodes (token %d)",
          head->got.own_n_path, head->own_tok[1]);
    const sd_step_record v = sd_step_own_view(&head->got);
    CHECK(v.tree == head->got.own_tree && v.n_path == 2 && v.path == head->got.own_path && !v.own_tree &&
              v.bonus == 33 && v.hidden == head->got.hidden && v.verify_ms < 0,
          "sd_step_own_view: its own tree and part, no verification time of its own, the rest as heard");
    const sd_step_record w = sd_step_own_view(&other->got);
    CHECK(w.tree == other->got.tree && w.n_path == other->got.n_path && w.verify_ms == 5.0,
          "a record without own_tree is its own view");
    CHECK(head->got.verify_ms == 5.0, "the head hears the step's verification time (%g)", head->got.verify_ms);
    // the other drafter: its part of the path (all of it here), no own_tree
    CHECK(other->got.n_path == 4 && !other->got.own_tree && other->path_tok[3] == 21, "other: %d nodes",
          other->got.n_path);
out:
    sd_tree_destroy(t);
    sd_drafter_free(mg);
}

// Two heads in one merge are refused, by the drafter and by the method string.
static void test_two_heads_refused(void) {
    static const int32_t a[1] = {3}, b[1] = {4};
    sd_drafter *subs[2] = {new_spy(a, 1, 1), new_spy(b, 1, 1)};
    sd_drafter *mg = NULL;
    CHECK(sd_draft_merge_new(&mg, subs, 2, NV, g_err, sizeof g_err) < 0 && !mg && strstr(g_err, "at most one head"),
          "two heads merged: %s", g_err);
    sd_method me;
    CHECK(sd_method_parse("eagle3:chain:4+ngram:3-8", &me, g_err, sizeof g_err) == 0 && me.kind == SD_METHOD_MERGE &&
              me.needs_head == SD_HEAD_EAGLE3 && me.tree_nodes == 5 + 33 - 1,   // the parts' nodes, one root
          "eagle3:chain:4+ngram:3-8: %s (kind %d, %d nodes)", g_err, me.kind, me.tree_nodes);
    CHECK(sd_method_parse("ngram:3-8+eagle3:auto", &me, g_err, sizeof g_err) == 0 && me.uses_cost_curve,
          "ngram:3-8+eagle3:auto: %s", g_err);
    CHECK(sd_method_parse("eagle3:chain:2+medusa:2-2", &me, g_err, sizeof g_err) < 0 && strstr(g_err, "one head"),
          "%s", g_err);
}

int main(void) {
    T_RUN(test_head_hears_full_path_and_own_part);
    T_RUN(test_two_heads_refused);
    T_EXIT();
}
