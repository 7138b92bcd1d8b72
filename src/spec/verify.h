// verify.h - verification of a token tree against the target model: pure
// functions over trees and distributions (no model, no allocation).
//
// Both verifiers return the accepted path as tree node indices, root first
// (path[0] == 0, so n_path >= 1), and the bonus token: the token the target
// itself produces after the last accepted node, which becomes the next root.
// One step therefore yields n_path - 1 draft tokens plus the bonus.
#ifndef SD_VERIFY_H
#define SD_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "spec/tree.h"

// Greedy verification. tgt_next[i] is the target's greedy choice after node i
// (the token plain greedy decoding would emit there); it is read only for the
// nodes on the walk. From the root, the walk moves to the first child whose
// token equals tgt_next of the current node, as deep as it goes; the bonus is
// tgt_next of the last accepted node. path needs room for max depth + 1.
void sd_verify_greedy(const sd_tree *t, const int32_t *tgt_next, int32_t *path, int *n_path,
                      int32_t *bonus);
// The same walk with the target's choice computed on demand: next(state, i)
// returns tgt_next[i] (< 0 on error, which is returned). Only the nodes on the
// walk are asked, so a wide tree costs one argmax per accepted depth, not one
// per node.
typedef int32_t (*sd_next_fn)(void *state, int node);
int sd_verify_greedy_fn(const sd_tree *t, sd_next_fn next, void *state, int32_t *path, int *n_path,
                        int32_t *bonus);

// Race verification (SD_DRAW_RACE, runtime/race.h): draw(state, i) is the
// target's race draw after node i, the token plain sampling with the same
// seed emits at that position (noise of the node's absolute position in the
// text, never of its depth in the tree). The walk follows the child equal to
// the draw, as deep as it goes; the bonus is the draw after the last accepted
// node. Every emitted token is therefore the target's own draw at its
// position: the text equals plain sampling's token for token, for any tree,
// drafter or children mode (a drafter's distributions are not read). Only
// the nodes on the walk are asked. Returns 0, or the draw's value when < 0.
int sd_verify_race(const sd_tree *t, sd_next_fn draw, void *state, int32_t *path, int *n_path, int32_t *bonus);

// Supplies the target distribution p after node i (n_vocab floats, the
// sampler's final distribution: penalties, temperature, top-k/p, min-p). The
// row is writable: the verifier turns it into residual distributions in
// place. It is called at most once per node, only for nodes on the walk.
// NULL means failure (the verifier returns <0).
typedef float *(*sd_target_row_fn)(void *state, int node);

// Stochastic verification (multi-draft speculative sampling). The output
// token sequence is distributed exactly as if the target sampled alone, for
// every children mode recorded in the tree (see the long comment in
// verify.c). Uses one uniform draw per tried child and one per residual or
// bonus draw. q_scratch: n_vocab floats of work space. Returns 0, or <0 with
// a message.
int sd_verify_stochastic(const sd_tree *t, sd_target_row_fn get_p, void *pstate,
                         sd_uniform_fn uniform, void *ustate, float *q_scratch, int32_t *path,
                         int *n_path, int32_t *bonus, char *err, size_t errlen);

// Draws from the unnormalised non-negative row (n floats) with uniform u in
// [0, 1); -1 if the row has no mass.
int32_t sd_draw_row(const float *row, int n, double u);

#endif
