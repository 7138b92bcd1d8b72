// skip_search.h - choosing the layers a skip drafter (draft_skip.h) skips:
// a search that scores candidate skip sets by simulating greedy chain
// speculation on calibration prompts.
#ifndef SD_SKIP_SEARCH_H
#define SD_SKIP_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "draft/draft_skip.h"

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
    sd_threadpool *pool;   // run on this pool (e.g. the target session's,
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
