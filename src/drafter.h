// drafter.h - the drafter interface (a small vtable, house rule 7).
// The generate loop knows only this interface: draft models, n-gram lookup,
// lookahead, layer skipping, trained heads and remote clients all plug in here.
#ifndef SD_DRAFTER_H
#define SD_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "../include/specdec.h"
#include "tree.h"

typedef struct sd_draft_ctx {
    const int32_t *tokens;  // (n_tokens) the whole committed sequence, prompt included;
                            // its last token is the tree root, not yet in the target's cache
    int n_tokens;
    int max_nodes;          // tree capacity the verifier can afford (root included)
    int stochastic;         // 1: target samples (drafts must record distributions / be sampled)
    const sd_sampler_params *sp; // sampling parameters (stochastic drafts apply the same transform)
    sd_sampler *rng;        // randomness for stochastic drafting
} sd_draft_ctx;

typedef struct sd_drafter sd_drafter;
typedef struct sd_drafter_vt {
    const char *name;
    // Fills tree (already reset with the root token) with draft nodes.
    // Proposing nothing (tree->n == 1) is allowed: the step then decodes one token.
    int (*propose)(sd_drafter *d, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen);
    // The verifier kept path[0..n_path) (tree node indices, path[0] == 0, the
    // root) and produced bonus, the next root. The drafter updates its state
    // (e.g. keeps only the accepted rows of its own KV cache).
    int (*accept)(sd_drafter *d, const sd_tree *tree, const int32_t *path, int n_path,
                  int32_t bonus, char *err, size_t errlen);
    // Forgets all state (new sequence).
    void (*reset)(sd_drafter *d);
    // Releases impl and the sd_drafter itself.
    void (*free)(sd_drafter *d);
} sd_drafter_vt;

struct sd_drafter {
    const sd_drafter_vt *vt;
    void *impl;   // owned by the drafter
};

// Frees any drafter through its vtable (NULL is fine).
static inline void sd_drafter_free(sd_drafter *d) {
    if (d && d->vt && d->vt->free) d->vt->free(d);
}

#endif
