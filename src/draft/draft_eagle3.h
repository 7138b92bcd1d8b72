// draft_eagle3.h - the EAGLE-3 drafter: a trained head (head/head.h) that
// reads the target's hidden states (docs/heads.md). Trees as the draft model's
// (draft_model.h): chain, widths, EAGLE-2 dynamic, automatic.
#ifndef SD_DRAFT_EAGLE3_H
#define SD_DRAFT_EAGLE3_H

#include "draft/draft_model.h"
#include "head/eagle3.h"
#include "head/head.h"

// Creates the drafter for head h (shared, not owned; it must outlive the
// drafter) and target. p: the tree shape and its settings as for a draft
// model (n_ctx: the head's cache, 0 = min(n_ctx_train, 4096); pool: the
// target's, the two take turns). wtype: SD_TYPE_Q8_0 (default) or
// SD_TYPE_F32 for the head's matrices. The drafter asks the generation for
// the hidden rows of h->hp.extract. online: NULL or on = 0: the head as it
// is; on = 1: online adaptation (specdec_spec.h, train/learner.h): the
// drafter trains a copy of h (h itself is never written) and, unless
// deterministic, runs one training thread, stopped by sd_drafter_free.
// Online adaptation reaches the drafter through this hook, so that draft/
// needs nothing of train/ (the layers point one way): train/learner.c
// provides sd_learner_hook, which the method registry passes in. l is the
// learner create made; the functions are train/learner.h's, one for one.
typedef struct sd_e3_online_hook {
    int (*create)(void **l, const sd_head *h, const sd_model *target, int wtype, const sd_head_online_params *p,
                  char *err, size_t errlen);
    void (*free)(void *l);
    int (*add)(void *l, int pos, int32_t tok, const float *feat, const float *logits, char *err, size_t errlen);
    int (*brk)(void *l, char *err, size_t errlen);
    int (*cut)(void *l, int L, char *err, size_t errlen);
    int (*swap)(void *l, sd_e3 *e);
    int (*drain)(void *l, char *err, size_t errlen);
    int (*save)(void *l, const char *path, char *err, size_t errlen);
    void (*reset)(void *l, sd_e3 *e);
    void (*stats)(void *l, sd_head_online_stats *st);
    void (*note)(void *l, char *buf, size_t len);
} sd_e3_online_hook;

// hook: the learner for online->on = 1 (NULL: online adaptation is refused).
int sd_draft_eagle3_new(sd_drafter **out, const sd_head *h, const sd_model *target, const sd_draft_model_params *p,
                        int wtype, const sd_head_online_params *online, const sd_e3_online_hook *hook, char *err,
                        size_t errlen);

// Tests only: on = 1 makes the drafter misreport its distributions (each
// recorded row flattened after the draws were made from the true one), so
// that the sampled output is no longer the target's: a wrong algorithm the
// distribution test must catch.
void sd_draft_eagle3_test_fault(sd_drafter *d, int on);
// A remote client's drafter (on 1): hidden rows handed to prompt/accept are
// fused states (n, n_embd), one per position, as the server computed them
// (sd_head_fuse); an accept without rows takes the head's own outputs as the
// path's states (drafting on alone). -1 when d is not an EAGLE-3 drafter or
// adapts online.
int sd_draft_eagle3_set_fused(sd_drafter *d, int on);

#endif
