// draft_auto.h - automatic tree sizing for a drafter: the glue between a
// drafter's propose / accept and the sd_tree_auto bundle of tree_opt.h
// (timing, probing, reporting). Used by draft_model.c and draft_ngram.c.
#ifndef SD_DRAFT_AUTO_H
#define SD_DRAFT_AUTO_H

#include <stddef.h>
#include <stdint.h>

#include "draft/drafter.h"
#include "spec/tree_opt.h"

// Called when an automatically sized tree is chosen for the first time and
// whenever the choice changes, with one line "tree auto: <shape>" (the
// library never prints; tools do). The public sd_method_report_fn.
typedef void (*sd_tree_auto_report_fn)(void *user, const char *line);

// Automatic tree sizing for a drafter (tree_opt.h): the drafter keeps its own
// sd_tree_auto bundle (statistics of its accepted paths, a copy of the
// target's cost curve refined online) and drafts the tree the optimiser
// chooses. Timing: the drafter's own propose is timed (draft_ms); the
// target's verification time comes from the step's record (verify_ms).
typedef struct sd_draft_auto_params {
    int on;                         // 1: size trees automatically; default 0
    const sd_cost_curve *cost;      // the target's cost curve, at least one point (copied at creation);
                                    // required when on
    int max_nodes;                  // most tree nodes, root included, 2..SD_TA_MAX_NODES; default 32
    int max_depth;                  // most draft depth, 1..SD_TA_MAX_DEPTH; default 12
    int reopt_every;                // re-optimise after this many steps; default 16
    sd_tree_auto_report_fn report;  // or NULL
    void *user;                     // for report
    double draft_ms_per_depth;      // the drafter's cost model to start from (sd_cost_curve's
    double draft_ms_per_node;       // fields, ms); both 0 (default): learnt online from 0
    double prior_top1;              // > 0: the prior acceptance of a rank-0 draft token (a head's measured
                                    // agreement) instead of the statistics' default 0.6, the other ranks'
                                    // scaled alike; 0 (default) = the defaults
} sd_draft_auto_params;

sd_draft_auto_params sd_draft_auto_default_params(void);

// The sizing state a drafter embeds (used by draft_model.c and draft_ngram.c).
typedef struct sd_draft_auto sd_draft_auto;
// Creates it (the only allocation): optimises the first shape from the
// statistics' prior and the cost curve and reports it. Returns 0 or <0.
int sd_draft_auto_new(sd_draft_auto **out, const sd_draft_auto_params *p, char *err, size_t errlen);
void sd_draft_auto_free(sd_draft_auto *a);
// At the start of propose: the shape to draft now (records the time). While
// the choice is not to draft (n == 1), every 8th step drafts one token (a
// probe) so that changed acceptance can change the choice.
const sd_tree_shape *sd_draft_auto_begin(sd_draft_auto *a);
// At the end of propose (records the time: draft_ms).
void sd_draft_auto_end(sd_draft_auto *a);
// At the start of accept: observes the verified path and the step's
// verification time, re-optimises when due and reports a changed shape.
// Returns 0 or <0 with a message (a path that is not a chain of the tree).
int sd_draft_auto_accept(sd_draft_auto *a, const sd_step_record *rec, char *err, size_t errlen);
// New sequence: forgets a pending timing (statistics and cost model are kept:
// they describe the model pair and the machine, not one text).
void sd_draft_auto_reset(sd_draft_auto *a);
// The current shape (for tools and tests).
const sd_tree_shape *sd_draft_auto_shape(const sd_draft_auto *a);

#endif
