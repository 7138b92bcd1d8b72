// draft_merge.h - a drafter that merges the trees of several drafters.
#ifndef SD_DRAFT_MERGE_H
#define SD_DRAFT_MERGE_H

#include <stddef.h>

#include "draft/drafter.h"

// Creates a drafter that asks each of subs[0..n_subs) for a tree and merges
// them (union by token path, SpecInfer). Takes ownership of the sub-drafters
// (freed with it, also when creation fails). n_vocab: the target's. At most
// one sub-drafter may read the target's hidden states (a trained head): it
// hears every step's full path and states, with the part of the path that is
// in its own tree (sd_step_record.own_tree) for its acceptance statistics.
int sd_draft_merge_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, char *err,
                       size_t errlen);

// Creates a drafter that asks subs[0], subs[1], ... in turn and drafts the
// first non-empty tree (method "A/B": A's tree, or B's when A proposes
// nothing). At most one sub-drafter may read the target's hidden states (a
// trained head); it follows every step's full path and states, also when
// another sub-drafter drafted (its own catch-up then waits for its next
// draft). Takes ownership of the sub-drafters like sd_draft_merge_new.
int sd_draft_first_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, char *err, size_t errlen);

#endif
