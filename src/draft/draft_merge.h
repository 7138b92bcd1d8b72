// draft_merge.h - a drafter that merges the trees of several drafters.
#ifndef SD_DRAFT_MERGE_H
#define SD_DRAFT_MERGE_H

#include <stddef.h>

#include "draft/drafter.h"

// Creates a drafter that asks each of subs[0..n_subs) for a tree and merges
// them (union by token path, SpecInfer). Takes ownership of the sub-drafters
// (freed with it, also when creation fails). n_vocab: the target's.
int sd_draft_merge_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, char *err,
                       size_t errlen);

#endif
