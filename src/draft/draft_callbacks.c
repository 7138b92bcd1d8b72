// draft_callbacks.c - a drafter defined by a program outside the library
// (include/specdec_spec.h, sd_drafter_callbacks): the library's drafter
// interface (drafter.h) forwarded to the program's functions.
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/drafter.h"

typedef struct cbd {
    sd_drafter_callbacks cb;
    sd_drafter_vt vt;   // CB_VT with the program's name
    int32_t *acc;     // (cap) accepted tokens of a step, handed to cb.step
    int cap;
} cbd;

int32_t sd_tree_token(const sd_tree *t, int i) { return t && i >= 0 && i < t->n ? t->token[i] : -1; }
int sd_tree_parent(const sd_tree *t, int i) { return t && i >= 0 && i < t->n ? t->parent[i] : -2; }
int sd_tree_size(const sd_tree *t) { return t ? t->n : 0; }

static int cb_propose(sd_drafter *d, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    cbd *c = d->impl;
    const sd_draft_request req = {.tokens = ctx->tokens, .n_tokens = ctx->n_tokens, .max_nodes = ctx->max_nodes,
                                  .sampling = ctx->stochastic};
    const int cap = tree->cap;
    tree->cap = SD_MIN(cap, SD_MAX(1, ctx->max_nodes));   // the program cannot exceed the step's room
    int rc = c->cb.propose(c->cb.user, &req, tree, err, errlen);
    tree->cap = cap;
    if (rc < 0) return -1;
    for (int i = 1; i < tree->n; i++) tree->mode[i] = SD_CHILDREN_ANY;   // chosen by the program's own rule
    tree->mode[0] = SD_CHILDREN_ANY;
    return 0;
}

static int cb_accept(sd_drafter *d, const sd_step_record *rec, char *err, size_t errlen) {
    cbd *c = d->impl;
    if (!c->cb.step) return 0;
    const int n = rec->n_path - 1;   // accepted drafts below the root
    if (n + 1 > c->cap) {
        int32_t *a = realloc(c->acc, sizeof *a * (size_t)(n + 1));
        if (!a) return sd_err(err, errlen, "drafter '%s': out of memory", c->vt.name);
        c->acc = a;
        c->cap = n + 1;
    }
    for (int k = 0; k < n; k++) c->acc[k] = rec->tree->token[rec->path[k + 1]];
    const sd_draft_result res = {.accepted = c->acc, .n_accepted = n, .bonus = rec->bonus, .hidden = rec->hidden};
    return c->cb.step(c->cb.user, &res, err, errlen);
}

static int cb_prompt(sd_drafter *d, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                     size_t errlen) {
    cbd *c = d->impl;
    if (!c->cb.prompt) return 0;
    return c->cb.prompt(c->cb.user, tokens, pos0, n, hidden, err, errlen);
}

static void cb_reset(sd_drafter *d) {
    cbd *c = d->impl;
    if (c->cb.reset) c->cb.reset(c->cb.user);
}

static void cb_free(sd_drafter *d) {
    cbd *c = d->impl;
    if (c) {
        if (c->cb.free) c->cb.free(c->cb.user);
        free(c->acc);
        free(c);
    }
    free(d);
}

static const sd_drafter_vt CB_VT = {.name = "callbacks", .propose = cb_propose, .accept = cb_accept,
                                    .prompt = cb_prompt, .reset = cb_reset, .free = cb_free};

int sd_drafter_from_callbacks(sd_drafter **out, const sd_drafter_callbacks *cb, char *err, size_t errlen) {
    *out = NULL;
    if (!cb || !cb->propose) return sd_errc(SD_ERR_INPUT, err, errlen, "drafter callbacks: propose is required");
    if (cb->n_hidden_layers < 0 || cb->n_hidden_layers > SD_DRAFTER_MAX_HIDDEN)
        return sd_errc(SD_ERR_INPUT, err, errlen, "drafter callbacks: n_hidden_layers %d out of range 0..%d",
                       cb->n_hidden_layers, SD_DRAFTER_MAX_HIDDEN);
    cbd *c = calloc(1, sizeof *c);
    sd_drafter *d = c ? sd_drafter_alloc(&c->vt, c) : NULL;
    if (!d) {
        free(c);
        return sd_errc(SD_ERR_OOM, err, errlen, "drafter callbacks: out of memory");
    }
    c->cb = *cb;
    c->vt = CB_VT;
    if (c->cb.name) c->vt.name = c->cb.name;
    d->n_hidden_layers = cb->n_hidden_layers;
    for (int i = 0; i < cb->n_hidden_layers; i++) d->hidden_layers[i] = cb->hidden_layers[i];
    *out = d;
    return 0;
}
