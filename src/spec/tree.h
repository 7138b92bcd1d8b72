// tree.h - the token tree a drafter proposes and the target verifies.
//
// Node 0 is the root: the last accepted token, not yet in the target's KV
// cache (it is evaluated in the same forward as the drafts, so its logits give
// the target's distribution for depth 1). Every other node is a draft token.
// Nodes are in topological order (parent[i] < i), so the tree maps directly
// onto an sd_batch: tokens = token, parent = parent, pos = n_past + depth.
// Siblings are in the order they were proposed (for sampled children: the
// order of the draws), which stochastic verification relies on.
//
// The tree-building helpers below (chain, width vector, EAGLE-2 dynamic tree,
// merge, prune) know nothing about models: they call back into the drafter
// for the draft distributions of a set of nodes, so every drafter can reuse
// them.
#ifndef SD_TREE_H
#define SD_TREE_H

#include <stddef.h>
#include <stdint.h>

// How the children of a node were produced; decides which proposal
// distribution the stochastic verifier uses for them (see verify.h).
enum sd_children_mode {
    SD_CHILDREN_ANY = 0,  // chosen by any rule independent of the verifier's randomness
                          // (argmax, top-k, n-gram lookup, merged sources): verified with
                          // one-hot proposals, i.e. "sample from p, follow the child if present"
    SD_CHILDREN_IID = 1,  // drawn i.i.d. from the node's dist row (with replacement; duplicates possible)
    SD_CHILDREN_WOR = 2,  // drawn one after another without replacement from the node's dist row
};

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
    uint8_t *mode;      // (cap) enum sd_children_mode of node i's children; IID/WOR need dist_row[i] >= 0
    int32_t *scratch;   // (4 * cap) internal work space of the helpers (no malloc while drafting)
    double *jscratch;   // (cap) internal: joint probabilities
    float **rowptr;     // (cap) internal: distribution rows handed to sd_tree_dist_fn
} sd_tree;

// Allocates a tree of cap nodes with room for n_dist_cap full distributions
// (0 for drafters that have none). <0 on allocation failure.
int sd_tree_init(sd_tree *t, int cap, int n_vocab, int n_dist_cap);
void sd_tree_free(sd_tree *t);
// Empties the tree and sets the root token.
void sd_tree_reset(sd_tree *t, int32_t root_token);
// Appends a child of parent with token and draft probability p; returns its
// index, or -1 if the tree is full. The parent's children mode is unchanged
// (SD_CHILDREN_ANY unless the caller set it).
int sd_tree_add(sd_tree *t, int parent, int32_t token, float p);
// Reserves a distribution row for node i (the distribution over its children)
// and returns it for the drafter to fill, or NULL if none is left. Calling it
// again for the same node returns the same row.
float *sd_tree_dist_for(sd_tree *t, int i);
// The distribution row of node i, or NULL.
const float *sd_tree_dist(const sd_tree *t, int i);

// Root-to-node path of node i (node indices, root first) into out (room for
// depth[i] + 1); returns its length.
int sd_tree_path(const sd_tree *t, int i, int32_t *out);
// Joint draft probability of node i: the product of p along its path (1 for the root).
double sd_tree_joint(const sd_tree *t, int i);
// Number of children of node i (a scan: trees are small).
int sd_tree_n_children(const sd_tree *t, int i);
// Largest depth in the tree.
int sd_tree_max_depth(const sd_tree *t);

// ------------------------------------------------------------ building
// Fills rows[j] (tree->n_vocab floats, already reserved by the builder) with
// the draft distribution over the children of nodes[j], for j < n_nodes. All
// nodes are at the same depth and their ancestors are in the tree; a drafter
// evaluates them in one batch. Returns <0 (message in err) on failure.
typedef int (*sd_tree_dist_fn)(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes,
                               float *const *rows, char *err, size_t errlen);
// A uniform double in [0, 1).
typedef double (*sd_uniform_fn)(void *state);

// The target's race noise (runtime/race.h) as a drafter sees it: the children
// of node i stand at position pos0 + depth[i] of the text (pos0: the position
// after the root, the text's length), drawn with key.
typedef struct sd_tree_race {
    uint64_t key;
    int64_t pos0;
} sd_tree_race;

typedef struct sd_tree_grow {
    sd_tree_dist_fn dist;   // the drafter's distributions
    void *ud;               // passed to dist
    int sample;             // 1: children are drawn at random from the distribution (i.i.d. for one
                            // child, without replacement for several): for stochastic verification.
                            // 0: children are the top-k tokens (deterministic, SD_CHILDREN_ANY)
    float p_min;            // a node whose top draft probability is below p_min gets no children (0: off)
    int max_nodes;          // stop growing at this many nodes (root included); 0 = the tree's cap
    sd_uniform_fn uniform;  // randomness when sample
    void *ustate;
    // Optional: the distributions have mass only on these n_support token ids
    // (strictly increasing), e.g. a head's draft vocabulary, so that choosing
    // children reads n_support entries of a row instead of n_vocab. NULL: any token.
    const int32_t *support;
    int n_support;
    // Optional: the target samples with the race draw (SD_DRAW_RACE). Children
    // are then the best tokens by race score E_x / q_x under the target's noise
    // at their position (sd_race_rank: the first is the drafter's own draw
    // under shared noise, which the target's draw equals whenever q is close
    // to p), in every builder, and their mode is SD_CHILDREN_ANY; sample and
    // uniform are not used. NULL: as sample says.
    const sd_tree_race *race;
} sd_tree_grow;

// The k best children of node (at most 64) from its distribution row, by
// g's rule: race score when g->race, else probability (descending, ties:
// lower id). Writes them to out; returns how many (only tokens with mass).
int sd_tree_rank_children(const sd_tree *t, int node, const float *row, const sd_tree_grow *g, int k, int32_t *out);

// Chain of up to k draft tokens below the root (the tree must hold only the
// root). Stops early when the top draft probability is below p_min.
int sd_tree_grow_chain(sd_tree *t, int k, const sd_tree_grow *g, char *err, size_t errlen);
// Expansion tree (SpecInfer): widths[d] children for every node at depth d,
// for d < n_depth. Within a depth the nodes with the highest joint draft
// probability are expanded first, so a capacity cut drops the least likely.
int sd_tree_grow_widths(sd_tree *t, const int *widths, int n_depth, const sd_tree_grow *g,
                        char *err, size_t errlen);
// EAGLE-2 dynamic tree: for D depths, expand the B nodes of the newest depth
// with the highest joint draft probability by their top-B tokens; then keep
// the M - 1 best draft nodes overall by joint probability (closed under
// ancestors) plus the root. work is a scratch tree with cap >= 1 + B*B*D and
// n_dist_cap >= 1 + B*(D-1). Children are the top-k by probability, or by
// race score with g->race (SD_CHILDREN_ANY either way); g->sample is ignored.
int sd_tree_grow_dynamic(sd_tree *t, sd_tree *work, int B, int D, int M, const sd_tree_grow *g,
                         char *err, size_t errlen);
// Keeps the root and the m - 1 non-root nodes of src with the highest joint
// probability (ties: lower index first), closed under ancestors, writing the
// result into dst in topological order. A node that loses some of its
// children has its mode downgraded to SD_CHILDREN_ANY (the kept subset of a
// random sample is no longer a sample). Uses src's scratch space. Returns
// the number of nodes kept.
int sd_tree_prune(sd_tree *dst, sd_tree *src, int m);
// Merges src into dst (SpecInfer's token tree merge): the union by token
// path. Roots must carry the same token. Nodes are added in src order until
// dst is full (the result stays closed under ancestors). A node whose
// children come from both trees becomes SD_CHILDREN_ANY; a node whose
// children come only from src takes src's mode and distribution row.
// Returns 0, or <0 if the roots differ. map (src->n entries, may be NULL)
// receives the dst node of every src node (-1 if it did not fit); NULL uses
// src's scratch space.
int sd_tree_merge(sd_tree *dst, sd_tree *src, int32_t *map);

#endif
