// draft_moa.h - the Mixture of Attentions drafter (seed 000, docs/moa.md): an
// MoA head (head/moa.h) that reads the target's KV cache of the verified
// text and drafts chains, widths trees, EAGLE-2 dynamic trees or
// automatically sized ones, as the EAGLE-3 drafter does.
#ifndef SD_DRAFT_MOA_H
#define SD_DRAFT_MOA_H

#include "draft/draft_model.h"
#include "head/head.h"

// Creates the drafter for MoA head h (shared, not owned; it must outlive the
// drafter) and target. p: the tree shape and its settings as for a draft
// model (n_ctx: the drafter's context, 0 = min(n_ctx_train, 4096); pool:
// the target's, the two take turns). wtype: SD_TYPE_Q8_0 (default) or
// SD_TYPE_F32. The drafter reads the target session's committed K,V rows
// (sd_draft_ctx.target) at each propose; where the generation gives no
// session, it drafts nothing.
int sd_draft_moa_new(sd_drafter **out, const sd_head *h, const sd_model *target, const sd_draft_model_params *p,
                     int wtype, char *err, size_t errlen);

// A remote client's drafter (sd_drafter_remote, docs/split.md) on 1: the
// K,V rows of verified positions come as the hidden rows of prompt and
// accept, (n, L, Ekv) floats each (every target layer's K row then V row, K
// with the target's RoPE, as cached), never from a session; the text after
// the last position with rows (drafted offline) is read by SA alone. Resets
// the drafter. on = 2: the rows are (n, E + N Ekv), each position's LSA
// output (computed by the server) then the last N layers' K,V rows. -1 for
// another drafter.
int sd_draft_moa_set_remote(sd_drafter *d, int on);
// The rows an MoA drafter reads per position: the target's layers L and
// Ekv. -1 for another drafter.
int sd_draft_moa_kv_shape(const sd_drafter *d, int *n_layer, int *kv_width);

// Tests only: on = 1 makes the drafter misreport its distributions (each
// recorded row flattened after the draws), a wrong algorithm the
// distribution test must catch.
void sd_draft_moa_test_fault(sd_drafter *d, int on);
// Tests only: a ca_hidden drafter's kept target states, (n_ok, E) rows of
// the positions 0 .. *n_ok-1 of the text *text; NULL for other drafters.
const float *sd_draft_moa_test_states(const sd_drafter *d, int *n_ok, const int32_t **text);

#endif
