// learner.h - internal: online adaptation of an EAGLE-3 head (docs/heads.md,
// "Online adaptation"), the part of the EAGLE-3 drafter that learns.
//
// The drafter hands the learner every verified position of its text (token,
// the target's extract-layer rows, the target's logits after it); the
// learner cuts runs of consecutive positions into windows of T positions
// (consecutive windows share one position, so every head row of the text is
// trained once), and a background thread takes one AdamW step per window on
// a private copy of the head, then fills a spare parameter pack
// (head/eagle3.h) that the drafter swaps into its runner at the start of its
// next step. Who touches what:
//   - the drafter's thread: sd_learner_add / _break / _swap / _save / _reset
//     / _stats, and the window being filled;
//   - the training thread: the trained head, the optimiser, the window it
//     trains, and the spare pack while it fills it;
//   - both, under one mutex held only for a few assignments: the queues of
//     windows, the spare pack's state, the statistics.
// A step never waits on the thread: _add hands a window over in O(1), and
// _swap only try-locks (a busy lock keeps the old parameters one more step).
#ifndef SD_LEARNER_H
#define SD_LEARNER_H

#include <stddef.h>
#include <stdint.h>

#include "draft/draft_eagle3.h"
#include "head/eagle3.h"
#include "head/head.h"

typedef struct sd_learner sd_learner;

// A learner for head h (borrowed; it must outlive the learner and is never
// written: the learner trains a copy) drafting for target (its embedding is
// read while training). wtype: the runner's weight type (its packs'). p:
// checked (ranges in specdec_spec.h); p->deterministic = 0 starts the
// training thread. Allocates everything: a copy of the head, AdamW's
// moments, a gradient, the trainer's workspace for p->window positions, a
// spare pack and 4 window buffers.
int sd_learner_new(sd_learner **out, const sd_head *h, const sd_model *target, int wtype,
                   const sd_head_online_params *p, char *err, size_t errlen);
// Stops the thread (after the window it trains, if any) and frees everything. NULL: no-op.
void sd_learner_free(sd_learner *l);
// One verified position of the text: pos its position, tok its token, feat
// (3 n_embd) the target's rows of the head's extract layers there, logits
// (target n_vocab) the target's raw logits after it (its distribution of
// the token at pos + 1; the top 8 are kept, softmax over them). A position
// that does not follow the last one added starts a new run. Returns 0, or
// <0 when deterministic training failed (message in err).
int sd_learner_add(sd_learner *l, int pos, int32_t tok, const float *feat, const float *logits, char *err,
                   size_t errlen);
// The text changed (a new prompt, a cut): the current run ends (trained as
// a shorter window when it holds at least min_window untrained positions).
// Returns 0, or <0 when deterministic training failed.
int sd_learner_break(sd_learner *l, char *err, size_t errlen);
// The text changed from position L on: a break when the run reaches L.
int sd_learner_cut(sd_learner *l, int L, char *err, size_t errlen);
// At the start of a step: when newer parameters are ready (and the lock is
// free), swaps them into runner e. Returns 1 when it did, 0 otherwise.
int sd_learner_swap(sd_learner *l, sd_e3 *e);
// Ends the current run (sd_learner_break) and waits until every window
// collected so far is trained: the thread idle, nothing queued.
int sd_learner_drain(sd_learner *l, char *err, size_t errlen);
// Writes the trained head with Q8_0 matrices after sd_learner_drain; its
// note is the given head's plus "online.*" lines.
int sd_learner_save(sd_learner *l, const char *path, char *err, size_t errlen);
// Forgets what was learnt: waits for the windows in training and queued, and puts the given head's parameters back (in runner e too).
void sd_learner_reset(sd_learner *l, sd_e3 *e);
void sd_learner_stats(sd_learner *l, sd_head_online_stats *st);
// One line for sd_drafter_note ("" before the first window).
void sd_learner_note(sd_learner *l, char *buf, size_t len);

// The functions above as the EAGLE-3 drafter's online hook (draft_eagle3.h).
extern const sd_e3_online_hook sd_learner_hook;

#endif
