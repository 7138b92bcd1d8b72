// draft_medusa.h - the Medusa drafter: K residual heads on the target's last
// normed state (docs/heads.md), a tree from the heads' top tokens.
#ifndef SD_DRAFT_MEDUSA_H
#define SD_DRAFT_MEDUSA_H

#include "draft/drafter.h"
#include "head/head.h"

// Creates the drafter for the Medusa head h (shared; it must outlive the
// drafter). widths[k]: children per node at depth k (head k's top tokens),
// for k < n_widths <= h->hp.n_medusa; the tree is grown best joint
// probability first up to the step's node budget. p_min: no children below
// this top probability (0: off). pool: the target's (the two take turns).
// wtype: SD_TYPE_Q8_0 or SD_TYPE_F32 for the head's matrices.
int sd_draft_medusa_new(sd_drafter **out, const sd_head *h, const sd_model *target, const int *widths, int n_widths,
                        float p_min, sd_threadpool *pool, int wtype, char *err, size_t errlen);

#endif
