// draft_lookahead.h - lookahead decoding (Fu et al. 2024, "Break the
// Sequential Dependency of LLM Inference Using Lookahead Decoding") as a
// drafter: no draft model, the target itself runs Jacobi iterations.
//
// Every step the target forward holds two branches in one tree-masked batch:
//   - the verification branch: the sd_tree proposed to the verifier, made of
//     up to G n-grams from the pool whose first token is the root (the last
//     accepted token), merged by shared prefixes (children mode
//     SD_CHILDREN_ANY: deterministic proposals, so stochastic verification
//     stays lossless);
//   - the lookahead branch: W x (N-1) auxiliary nodes (drafter.h aux_vt->aux()), the
//     2D Jacobi window. Level 0 (the "trunk") is a chain of W guesses hanging
//     off the root at depths 1..W; for every window column i, levels 1..N-2
//     form a chain hanging off trunk node i. So node (level j, column i)
//     attends to the committed cache, the root, trunk nodes 0..i and its own
//     column's levels 1..j-1, at position n_past + 1 + i + j. This is the
//     attention pattern of the paper's lookahead branch (each column is an
//     n-gram trajectory conditioned on the causal trunk prefix), expressed
//     exactly with the engine's ancestor-chain mask.
// After the forward (observe()) the target argmax at the last level of each
// column is the column's next Jacobi guess: the n-gram (level 0..N-2 of the
// column, new guess) goes into the pool keyed by its first token, then the
// levels shift down by one (level j <- level j+1, last level <- new guess).
// Only the last level's logits are requested (saves the output matmul of the
// other W*(N-2) rows). The window is not realigned when several tokens are
// accepted (as in the paper); it keeps sliding by one position per step.
//
// The pool keeps at most per_key n-grams per first token (a ring: the oldest
// is replaced; inserting an n-gram already present makes it the newest) for
// at most pool_keys distinct first tokens (when full, the first token
// updated least recently is evicted with its n-grams).
//
// Cost: each step evaluates 1 + (verification nodes, <= G*(N-1)) + W*(N-1)
// rows. On a CPU the forward cost grows with the batch (see `specdec
// bench-forward`): on SmolLM2-135M with 2 threads a forward of ~6 rows costs
// ~1.7x one row, while lookahead accepts only 0.1-0.6 extra tokens per
// forward on chat prompts, so every setting measured was slower than plain
// decoding; the smallest settings lose least. The defaults (W=2, N=3, G=2)
// are the smallest setting that still harvests real n-grams (N=3); paper-
// sized settings (W=5, N=4, G=5) are for hardware where extra rows are
// nearly free.
#ifndef SD_DRAFT_LOOKAHEAD_H
#define SD_DRAFT_LOOKAHEAD_H

#include <stddef.h>
#include <stdint.h>

#include "draft/drafter.h"

typedef struct sd_draft_lookahead_params {
    int W;              // Jacobi window width (columns), 1..256; default 2
    int N;              // n-gram size, 2..16; default 3 (so N-1 = 2 window levels)
    int G;              // most n-grams verified per step, 1..256; default 2
    int per_key;        // n-grams kept per first token; 0 (default) = G
    int pool_keys;      // most distinct first tokens in the pool; default 4096
    int text_ngrams;    // 1: also put the n-grams of the committed text (prompt and output) into the
                        // pool (an n-gram lookup on top of the Jacobi harvest); default 0 (the paper's method)
} sd_draft_lookahead_params;

sd_draft_lookahead_params sd_draft_lookahead_default_params(void);

// Creates a lookahead drafter for a target with n_vocab tokens. The window
// is initialised at the first step from the committed text. Returns 0, or
// <0 with a message (bad parameters, out of memory). Free with
// sd_drafter_free. Needs the speculative loop's aux/observe support
// (spec.c); with the tree budget max_nodes the verification branch holds at
// most max_nodes - 1 draft nodes, the lookahead branch comes on top of it
// (bounded by the session's n_batch).
int sd_draft_lookahead_new(sd_drafter **out, const sd_draft_lookahead_params *p, int n_vocab, char *err,
                           size_t errlen);

// ---- Inspection (tests, diagnostics). d must be a lookahead drafter.
// Window token at (level, column), -1 if out of range or not initialised.
int32_t sd_draft_lookahead_window(const sd_drafter *d, int level, int col);
// Copies the pool's n-grams starting with token key, newest first, into out
// (max n-grams of N-1 continuation tokens each, row-major); returns how many
// the pool holds for key (may exceed max).
int sd_draft_lookahead_pool_get(const sd_drafter *d, int32_t key, int32_t *out, int max);
// Distinct first tokens in the pool; total n-grams harvested from the window
// so far (duplicates included).
int sd_draft_lookahead_pool_keys(const sd_drafter *d);
long sd_draft_lookahead_n_harvested(const sd_drafter *d);
// Sets the window explicitly (levels (N-1) x W tokens, row-major by level)
// and the count of Jacobi updates done so far (harvesting starts after N-2).
void sd_draft_lookahead_set_window(sd_drafter *d, const int32_t *tokens, int n_updates);

#endif
