// tree.h - the token tree a drafter proposes and the target verifies.
//
// Node 0 is the root: the last accepted token, not yet in the target's KV
// cache (it is evaluated in the same forward as the drafts, so its logits give
// the target's distribution for depth 1). Every other node is a draft token.
// Nodes are in topological order (parent[i] < i), so the tree maps directly
// onto an sd_batch: tokens = token, parent = parent, pos = n_past + depth.
#ifndef SD_TREE_H
#define SD_TREE_H

#include <stdint.h>

typedef struct sd_tree {
    int n;              // nodes in use, root included (>= 1)
    int cap;            // capacity in nodes
    int n_vocab;        // length of a distribution row
    int32_t *token;     // (cap) token id
    int32_t *parent;    // (cap) parent node, -1 for the root
    int32_t *depth;     // (cap) 0 for the root
    float *p;           // (cap) probability the draft gave this token in its parent's context
    // Full draft distributions, when the drafter has them (stochastic
    // verification needs the distribution each node's children were drawn from).
    int n_dist_cap;     // rows available in dist
    float *dist;        // (n_dist_cap, n_vocab)
    int32_t *dist_row;  // (cap) row of dist holding the draft distribution over node i's children, -1 if none
    int n_dist;         // rows used
} sd_tree;

// Allocates a tree of cap nodes with room for n_dist_cap full distributions
// (0 for drafters that have none). <0 on allocation failure.
int sd_tree_init(sd_tree *t, int cap, int n_vocab, int n_dist_cap);
void sd_tree_free(sd_tree *t);
// Empties the tree and sets the root token.
void sd_tree_reset(sd_tree *t, int32_t root_token);
// Appends a child of parent with token and draft probability p; returns its
// index, or -1 if the tree is full.
int sd_tree_add(sd_tree *t, int parent, int32_t token, float p);
// Reserves a distribution row for node i (the distribution over its children)
// and returns it for the drafter to fill, or NULL if none is left.
float *sd_tree_dist_for(sd_tree *t, int i);

#endif
