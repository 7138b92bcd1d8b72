// draft_skip.h - self-speculative drafting by layer skipping (Draft & Verify,
// SWIFT): the draft is the target model itself with a set of layers skipped.
// It shares the target's weights (the same sd_model; no second copy), runs in
// a session of its own (see the KV note in draft_skip.c) and is otherwise the
// draft-model drafter (draft_model.h), with adaptive drafting on by default.
//
// Usage:
//   uint8_t skip[n_layer];
//   sd_skip_parse("3,5,7-9", n_layer, skip, err, sizeof err);       // or sd_skip_load / sd_skip_search
//   sd_draft_model_params dp = sd_draft_skip_default_params();
//   sd_drafter *d;  sd_draft_skip_new(&d, target, skip, &dp, err, sizeof err);
//   sd_spec_generate(session, sampler, d, ...);
//   sd_drafter_free(d);
#ifndef SD_DRAFT_SKIP_H
#define SD_DRAFT_SKIP_H

#include <stddef.h>
#include <stdint.h>

#include "draft/draft_model.h"

// Draft-model parameters suited to a skip drafter: chain of up to k = 8
// tokens, adaptive p_min starting at 0.4 (see sd_draft_adapt_p_min).
sd_draft_model_params sd_draft_skip_default_params(void);

// Creates the skip drafter: a draft-model drafter whose draft model is target
// (shared, not owned; it must outlive the drafter) with the layers skip[l] != 0
// skipped (skip has target n_layer bytes; copied). p == NULL: the defaults
// above; p->layer_skip is ignored (skip is used). Fails if skip is NULL or
// skips every layer.
int sd_draft_skip_new(sd_drafter **out, const sd_model *target, const uint8_t *skip,
                      const sd_draft_model_params *p, char *err, size_t errlen);

// Parses a layer list "L1,L2,..." where an item may be a range "A-B"
// (inclusive); spaces are ignored; "" or "none" is the empty set. Layers are
// 0-based and must be < n_layer. Fills skip (n_layer bytes, 0/1). Returns the
// number of skipped layers, <0 with a message (bad syntax, out of range, all
// layers skipped).
int sd_skip_parse(const char *spec, int n_layer, uint8_t *skip, char *err, size_t errlen);

// Writes skip as a sorted list "1,4,7" (ranges are not folded), "none" when
// empty, NUL-terminated. Returns the length needed (excluding the NUL; the
// output is truncated when it is >= size).
int sd_skip_format(const uint8_t *skip, int n_layer, char *buf, size_t size);

// ------------------------------------------------------------ files
// A tiny text format, one key per line ('#' starts a comment line):
//   specdec-skip 1
//   model <general.name of the model, may be empty>
//   n_layer <n>
//   skip <list as sd_skip_format writes it>
// sd_skip_save writes it for model m. sd_skip_load reads it, checks that
// n_layer (and the model name, when both are non-empty) match m and fills
// skip (m's n_layer bytes). Both return the number of skipped layers, <0 with
// a message naming the file (and line) on any error.
int sd_skip_save(const char *path, const sd_model *m, const uint8_t *skip, char *err, size_t errlen);
int sd_skip_load(const char *path, const sd_model *m, uint8_t *skip, char *err, size_t errlen);

// ------------------------------------------------------------ search
// Progress of sd_skip_search, reported after every evaluated candidate.
typedef struct sd_skip_progress {
    int phase;             // 0: baseline, 1: single-layer scan, 2: greedy additions
    int n_eval;            // candidates evaluated so far
    int layer;             // layer tried by this candidate (-1: baseline)
    int kept;              // phase 2: 0 for each candidate tried, then 1 in the report that adds
                           // layer (the round's best) to the set
    double score;          // estimated speedup of this candidate over plain decoding
    double accept_len;     // its mean tokens per target forward (bonus included)
    double best_score;     // estimated speedup of the best set so far
    int best_n_skip;       // layers in the best set
    const uint8_t *best;   // (n_layer) the best set so far
    int n_layer;
    double elapsed_s;      // seconds since the search began
} sd_skip_progress;
typedef void (*sd_skip_progress_fn)(void *user, const sd_skip_progress *pr);

typedef struct sd_skip_search_params {
    int n_predict;         // tokens of target continuation per calibration prompt; default 32
    double max_seconds;    // time budget; the best set so far is returned when it runs out; default 120
    int max_skip;          // most layers skipped; 0 = n_layer - 1
    int n_threads;         // threads of the search session; 0 = number of cores (ignored with pool)
    sd_threadpool *pool;   // run on this pool (e.g. the target session
                                     // about to generate); NULL = own threads. Default NULL
    sd_draft_model_params dp; // the drafting rule simulated (k, p_min, adapt...): pass the params the
                              // drafter will run with; default sd_draft_skip_default_params()
    sd_skip_progress_fn progress; // or NULL
    void *user;
} sd_skip_search_params;

sd_skip_search_params sd_skip_search_default_params(void);

typedef struct sd_skip_search_result {
    int n_skip;            // layers in the chosen set
    double speedup;        // estimated speedup of the chosen set over plain decoding
    double accept_len;     // its simulated mean tokens per target forward (bonus included)
    double draft_cost;     // cost of one draft forward relative to one target forward (byte model)
    double verify_node_cost; // measured extra cost of one more tree node in the target forward (relative)
    double base_speedup;   // the same estimate for drafting with the unskipped model (reference)
    int n_eval;            // candidates evaluated
    double seconds;        // search time
    int timed_out;         // 1 if the time budget ended the search
} sd_skip_search_result;

// Chooses a skip set for model m on calibration prompts (prompts[i] has
// n_prompt[i] tokens, i < n_prompts, each >= 1 token; prompt + n_predict must
// fit in 4096 tokens).
//
// Method. The target's greedy continuation of every prompt is computed once.
// A candidate set is scored without running the speculative loop: one
// teacher-forced forward of the skip model over prompt + continuation gives,
// at every position, whether its greedy token equals the target's and its top
// probability; by batch invariance these are exactly what the drafter would
// see while its drafts are being accepted, so greedy chain speculation (with
// dp's k, p_min and adaptive rule; after a rejection the draft's confidence
// on the true text stands in for its confidence on its own) is simulated:
// accepted tokens per step and draft forwards. The score is the estimated
// speedup over plain decoding: tokens / (steps x (1 + v x nodes) + draft
// forwards x c), c = weight bytes of the kept layers + output head over all
// weight bytes (decoding is memory-bound), v measured once by timing
// one-token and 9-token forwards. Search: phase 1 scores every single layer
// and ranks the layers; phase 2 walks a greedy path from the empty set: each
// round tries the 4 best-ranked layers not yet in the set and adds the one
// scoring best (even if the score drops: one layer alone rarely pays), and
// the best set on the path wins. It stops after 3 rounds without a new best,
// at max_skip, or when the time budget runs out (then the best set so far).
// Cost: about n_layer + 4 x (rounds) teacher-forced forwards over the
// calibration text.
//
// Fills skip (n_layer bytes) with the best non-empty set found and res (may
// be NULL). res->speedup < 1 means self-speculation is not expected to pay on
// this model with these parameters: the caller should say so (and may fall
// back to plain decoding). Returns the number of skipped layers, <0 with a
// message.
int sd_skip_search(const sd_model *m, const int32_t *const *prompts, const int *n_prompt, int n_prompts,
                   const sd_skip_search_params *p, uint8_t *skip, sd_skip_search_result *res, char *err,
                   size_t errlen);

// The same over texts: each is tokenized with the model's tokenizer (BOS as
// the vocabulary asks; wrapped in the model's chat template as a user
// message when chat is 1 and the model has a known template, plain text
// otherwise). texts == NULL: a small built-in calibration set (a writing, a
// coding, a math and a question-answering request).
int sd_skip_search_texts(const sd_model *m, const char *const *texts, int n_texts, int chat,
                         const sd_skip_search_params *p, uint8_t *skip, sd_skip_search_result *res, char *err,
                         size_t errlen);

#endif
