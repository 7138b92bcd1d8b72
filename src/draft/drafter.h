// drafter.h - the drafter interface (a small vtable, house rule 7).
// The generate loop knows only this interface: draft models, n-gram lookup,
// lookahead, layer skipping, trained heads and remote clients all plug in here.
#ifndef SD_DRAFTER_H
#define SD_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "spec/tree.h"

typedef struct sd_draft_ctx {
    const int32_t *tokens;  // (n_tokens) the whole committed sequence, prompt included;
                            // its last token is the tree root, not yet in the target's cache
    int n_tokens;
    int max_nodes;          // tree capacity the verifier can afford (root included)
    int stochastic;         // 1: target samples (drafts must record distributions / be sampled)
    const sd_sampler_params *sp; // sampling parameters (stochastic drafts apply the same transform)
    sd_sampler *rng;        // randomness for stochastic drafting
} sd_draft_ctx;

// Auxiliary batch nodes of one step (see sd_drafter_aux_vt below). Owned by the
// speculative loop, allocated once.
typedef struct sd_aux_nodes {
    int cap;            // most nodes the drafter may add this step (batch and context room)
    int n;              // nodes filled by the drafter, 0..cap
    int32_t *token;     // (cap) token ids
    int32_t *parent;    // (cap) parent as a batch index: < tree->n a tree node, else tree->n + aux index (< own)
    uint8_t *logits;    // (cap) 1: target logits wanted for this node in observe
} sd_aux_nodes;

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

// Optional extension of the vtable, added for lookahead decoding. It is a
// separate table (not new members of sd_drafter_vt) so that vtables written
// positionally stay complete and warning-free under -Wextra.
typedef struct sd_drafter_aux_vt {
    // Auxiliary nodes: extra batch nodes the drafter wants evaluated in the
    // SAME target forward as the tree (e.g. the lookahead branch of Jacobi
    // decoding). Called after propose with the final tree; the drafter fills
    // aux (at most aux->cap nodes, aux->n = 0 for none). Auxiliary node j is
    // batch node tree->n + j; its parent is a batch index (a tree node, or
    // tree->n + k for an earlier auxiliary node k < j), so it attends to the
    // committed cache and its ancestor chain only, at position n_past + its
    // depth. Auxiliary nodes are never verified, accepted or committed (their
    // KV rows are dropped). NULL: none.
    int (*aux)(sd_drafter *d, const sd_draft_ctx *ctx, const sd_tree *tree, sd_aux_nodes *aux, char *err,
               size_t errlen);
    // Called right after the target forward (before verification) with read
    // access to the target logits of the batch: logits(lstate, i) for batch
    // index i gives n_vocab raw logits of tree node i (i < tree->n, always
    // present) or of auxiliary node i - tree->n (present when it asked for
    // them), else NULL. aux is what the drafter filled (n = 0 if none). The
    // rows are valid only during the call. NULL: not called.
    int (*observe)(sd_drafter *d, const sd_tree *tree, const sd_aux_nodes *aux,
                   const float *(*logits)(void *lstate, int i), void *lstate, char *err, size_t errlen);
} sd_drafter_aux_vt;

struct sd_drafter {
    const sd_drafter_vt *vt;
    void *impl;   // owned by the drafter
    // Optional (lookahead-style drafters); NULL for all others. Drafters
    // allocate their sd_drafter zeroed (calloc), so it is NULL unless set.
    const sd_drafter_aux_vt *aux_vt;
};

// Frees any drafter through its vtable (NULL is fine).
static inline void sd_drafter_free(sd_drafter *d) {
    if (d && d->vt && d->vt->free) d->vt->free(d);
}

#endif
