// drafter.h - the drafter interface (a small vtable: docs/house-rules.md, rule 7).
// The generation step (src/gen/gen.c) knows only this interface: draft
// models, n-gram lookup, lookahead, layer skipping, trained heads and remote
// clients all plug in here. Programs see sd_drafter as an opaque handle
// (include/specdec_spec.h) built from a method string.
#ifndef SD_DRAFTER_H
#define SD_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "spec/tree.h"
#include "specdec_spec.h"

// What the drafter may read when it proposes.
typedef struct sd_draft_ctx {
    const int32_t *tokens;  // (n_tokens) the generation's text, prompt included; its last
                            // token is the tree root, not yet in the target's cache
    int n_tokens;
    int max_nodes;          // tree capacity the verifier can afford (root included)
    int stochastic;         // 1: the target samples (drafts record their distributions q)
    const sd_sampler_params *sp; // the target's sampling parameters (stochastic drafts apply the same transform)
    sd_rng *rng;            // the drafter's own randomness (sd_drafter.rng)
    // The target's race noise when it samples with SD_DRAW_RACE (NULL
    // otherwise): a drafter that ranks children by its own distribution
    // passes it to the tree builders (sd_tree_grow.race), so that its first
    // child is its own draw under the target's noise.
    const sd_tree_race *race;
    // The target's session (its committed rows are the text but the root:
    // tokens[0 .. n_tokens - 1)), for drafters that read its KV cache (the
    // MoA drafter, docs/moa.md; read only), or NULL when the caller has none.
    const sd_session *target;
} sd_draft_ctx;

// Auxiliary batch nodes of one step: extra nodes the drafter wants evaluated
// in the SAME target forward as the tree (e.g. the lookahead branch of
// Jacobi decoding). Owned by the generation, allocated once.
typedef struct sd_aux_nodes {
    int cap;            // most nodes the drafter may add this step (batch and context room)
    int n;              // nodes filled by the drafter, 0..cap
    int32_t *token;     // (cap) token ids
    int32_t *parent;    // (cap) parent as a batch index: < tree->n a tree node, else tree->n + aux index (< own)
    uint8_t *logits;    // (cap) 1: target logits wanted for this node (read in accept)
} sd_aux_nodes;

// What happened in one step, given to accept(). Pointers are valid only
// during the call.
typedef struct sd_step_record {
    const sd_tree *tree;     // the step's tree (root = node 0)
    const int32_t *path;     // (n_path) accepted tree nodes, path[0] == 0 (the root)
    int n_path;
    int32_t bonus;           // the target's token after the path: the next root
    const sd_aux_nodes *aux; // the auxiliary nodes of the step (n == 0 if none)
    double draft_ms;         // measured time of this step's propose (and aux), ms; < 0: not measured
    double verify_ms;        // measured time of this step's target forward, verification and commit, ms;
                             // < 0: not measured
    // Target logits (n_vocab raw floats) of batch node i: i < tree->n a tree
    // node (always present), tree->n + j auxiliary node j (present when it
    // asked for them); NULL otherwise.
    const float *(*logits)(void *lstate, int i);
    void *lstate;
    // Hidden-state rows of the path nodes when the drafter asked for them
    // (sd_drafter.n_hidden_layers > 0): (n_path, n_hidden_layers, n_embd),
    // in the order of sd_drafter.hidden_layers. NULL otherwise.
    const float *hidden;
    // Set by the merging drafter (A+B) for the sub-drafter that reads hidden
    // states, which hears the whole step above: its own tree and the part of
    // the path in it (own_path[k] a node of own_tree), for what it learns
    // about its own drafts (acceptance statistics). NULL: tree is its own.
    const sd_tree *own_tree;
    const int32_t *own_path;
    int own_n_path;
} sd_step_record;

// rec as its drafter drafted it: rec itself, or its own tree and path when
// rec->own_tree is set (verify_ms then < 0: the forward verified more than
// its tree; the other fields as rec's).
sd_step_record sd_step_own_view(const sd_step_record *rec);

typedef struct sd_drafter_vt {
    const char *name;
    // Fills tree (already reset with the root token) with draft nodes.
    // Proposing nothing (tree->n == 1) is allowed: the step then decodes one token.
    int (*propose)(sd_drafter *d, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen);
    // Optional (NULL: none). Called after propose with the final tree; fills
    // aux with at most aux->cap nodes (aux->n = 0 for none). Auxiliary node j
    // is batch node tree->n + j; its parent is a batch index (a tree node, or
    // tree->n + k for an earlier auxiliary node k < j), so it attends to the
    // committed cache and its ancestor chain only, at position n_past + its
    // depth. Auxiliary nodes are never verified, accepted or committed.
    int (*aux)(sd_drafter *d, const sd_draft_ctx *ctx, const sd_tree *tree, sd_aux_nodes *aux, char *err,
               size_t errlen);
    // The step's outcome (see sd_step_record). The drafter updates its state
    // (keeps only the accepted rows of its own KV cache, learns acceptance,
    // reads the target's logits of its auxiliary nodes, ...).
    int (*accept)(sd_drafter *d, const sd_step_record *rec, char *err, size_t errlen);
    // Optional (NULL: none): hidden-state rows of prompt tokens, when the
    // drafter asks for them (n_hidden_layers > 0). The generation evaluated
    // tokens[pos0 .. pos0+n) (tokens[0 .. pos0+n) is the prompt so far) and
    // hands their rows in the layout of sd_step_record.hidden.
    int (*prompt)(sd_drafter *d, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                  size_t errlen);
    // Forgets all state (new sequence).
    void (*reset)(sd_drafter *d);
    // Releases impl and the sd_drafter itself.
    void (*free)(sd_drafter *d);
    // Optional: sd_drafter_note's text (NULL: "").
    const char *(*note)(const sd_drafter *d);
    // Optional (NULL: the drafter has no head): sd_drafter_save_head.
    int (*save_head)(sd_drafter *d, const char *path, char *err, size_t errlen);
    // Optional (NULL: no online adaptation): fills st, returns 1 when the drafter adapts online, else 0.
    int (*online_stats)(const sd_drafter *d, sd_head_online_stats *st);
    // Optional (NULL: no reduced vocabulary): sd_drafter_vocab_coverage.
    int (*vocab_coverage)(const sd_drafter *d, int64_t *n_checked, int64_t *n_in);
    // Optional (NULL: nothing to wait for): sd_drafter_online_wait.
    int (*online_wait)(sd_drafter *d, char *err, size_t errlen);
} sd_drafter_vt;

#define SD_DRAFTER_MAX_HIDDEN SD_MAX_HIDDEN_LAYERS

struct sd_drafter {
    const sd_drafter_vt *vt;
    void *impl;      // owned by the drafter
    sd_rng rng;      // the drafter's own randomness; seeded by the generation (sd_gen_new)
    int n_hidden_layers;                      // hidden-state rows accept() wants, 0: none
    int32_t hidden_layers[SD_DRAFTER_MAX_HIDDEN]; // (n_hidden_layers) layers, as sd_batch.hidden_layers
};

// A zeroed drafter with vt and impl set (NULL when out of memory).
sd_drafter *sd_drafter_alloc(const sd_drafter_vt *vt, void *impl);
// accept() with a record of only the path and bonus (no logits, no hidden
// rows, times not measured): for tests and for drafters that replay a path.
int sd_drafter_accept_path(sd_drafter *d, const sd_tree *tree, const int32_t *path, int n_path, int32_t bonus,
                           char *err, size_t errlen);

// A drafter's copy of the target's sampler transform (stochastic drafting):
// made again from want when there is none or want differs from have (the
// parameters it was made with). 0, or <0 with a message.
int sd_draft_sampler_sync(sd_sampler **smp, sd_sampler_params *have, const sd_sampler_params *want, int n_vocab,
                          char *err, size_t errlen);

#endif
