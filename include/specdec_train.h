// specdec_train.h - public C API: training a draft head (EAGLE-3 or Medusa,
// docs/heads.md) for a target model, on this CPU, from a JSON-lines corpus.
//
//   sd_train_head_params p = sd_train_head_default_params();
//   p.model_path = "target.gguf"; p.data_paths = files; p.n_data = 1;
//   p.out_path = "head.gguf";
//   sd_train_head_result res;
//   int r = sd_train_head(&p, &res, err, sizeof err);   // 0 done, 1 stopped (checkpoint written), <0 error
//
// What a run does: (1) builds or extends the feature cache (the target run
// once over the corpus; a directory, resumable); (2) chooses the draft
// vocabulary (the most frequent target argmax tokens); (3) initialises the
// head (output rows and norm from the target) or resumes a checkpoint;
// (4) trains with AdamW, evaluating top-1 agreement on a held-back split,
// writing checkpoints on a timer and at a stop; (5) saves the head with a
// recipe note. Progress goes to a callback; the library never prints.
// Deterministic for a given seed and thread count: a run resumed from a
// checkpoint ends with the same parameters, bit for bit, as one never
// interrupted.
#ifndef SPECDEC_TRAIN_H
#define SPECDEC_TRAIN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "specdec.h"

#ifdef __cplusplus
extern "C" {
#endif

// Head types (the values of the head files' types).
// The head kind trained: sd_head_type (include/specdec.h), SD_HEAD_EAGLE3, SD_HEAD_MEDUSA or SD_HEAD_MOA.
// Types of the saved head's matrices (norm gains and biases are always F32).
// Q5_0 is what the drafters run at by default (--head-bits 5): 40% smaller than Q8_0.
enum sd_train_out_type { SD_TRAIN_OUT_Q8_0 = 0, SD_TRAIN_OUT_F16 = 1, SD_TRAIN_OUT_F32 = 2, SD_TRAIN_OUT_Q5_0 = 3 };

#define SD_TRAIN_MAX_K 8   // most agreement figures per report (training-time-test steps / Medusa heads)

// What a progress report is about.
enum sd_train_phase {
    SD_TRAIN_PHASE_CACHE = 1,   // the feature cache grew by a record or, inside one, by a forward (records,
                                // cache_* and record_* fields)
    SD_TRAIN_PHASE_STEP,        // an optimiser step was taken (step, loss, agree, tok_per_s, eta_s)
    SD_TRAIN_PHASE_EVAL,        // the held-back split was evaluated (eval_* fields)
    SD_TRAIN_PHASE_NOTE,        // news for the user (note): resumed, vocabulary coverage, checkpoint written, ...
};

typedef struct sd_train_progress {
    int phase;                  // enum sd_train_phase
    double elapsed_s;           // wall time of this call of sd_train_head so far (s)
    // cache
    int64_t records, records_total;   // records cached, records in the data
    int64_t cache_tokens;             // positions in the cache
    double cache_tok_per_s;           // target positions per second of this build
    double cache_eta_s;               // estimated time to finish the cache (s), < 0 unknown
    int64_t record_tokens, record_done;  // the record being cached: its positions, those done (0, 0: between records)
    // training
    int64_t step, n_steps;            // steps taken, steps of the run
    int64_t tokens;                   // training positions consumed (resumed runs included)
    double tok_per_s;                 // training positions per second (this call's steps)
    double loss;                      // the last step's batch loss (weighted as docs/heads.md)
    double lr;                        // the last step's learning rate
    int n_agree;                      // entries of agree / eval_agree (K of EAGLE-3, Medusa heads)
    double agree[SD_TRAIN_MAX_K];     // the last step's batch: top-1 agreement with the target per TTT step / head
    double eta_s;                     // estimated time to the last step (s)
    // evaluation (held-back split)
    double eval_loss;
    double eval_agree[SD_TRAIN_MAX_K];
    int64_t eval_tokens;              // positions evaluated
    const char *note;                 // SD_TRAIN_PHASE_NOTE: one line, no newline
} sd_train_progress;
typedef void (*sd_train_progress_fn)(void *user, const sd_train_progress *p);

typedef struct sd_train_head_params {
    const char *model_path;     // target GGUF; ignored when model is set
    const sd_model *model;      // a loaded target, or NULL: model_path is loaded
    sd_head_type type;          // default SD_HEAD_EAGLE3
    const char *const *data_paths;  // (n_data) JSON-lines corpora, read in order (docs/heads.md, "Training")
    int n_data;
    const char *cache_dir;      // feature cache directory; NULL = OUT.cache (out_path + ".cache")
    const char *out_path;       // the head file to write (required)
    int out_type;               // enum sd_train_out_type; default SD_TRAIN_OUT_Q8_0
    const char *init_path;      // start from this head file (its vocabulary and parameters), or NULL
    int draft_vocab;            // draft vocabulary size (capped at the target's vocabulary); 0 (default) =
                                // 8192, or with init_path the init head's; with init_path a larger one
                                // grows the head's (its tokens and rows kept; a smaller one is refused)
    int head_ff;                // EAGLE-3: width of the head's feed-forward layer; 0 (default) = the target's
    int ttt_steps;              // EAGLE-3 training-time-test steps K (1..8); default 3
    int n_medusa;               // Medusa heads (1..8); default 4
    int seq_len;                // positions per training sequence T (>= 2); default 256
    int batch;                  // sequences per optimiser step; default 8
    int64_t tokens;             // training positions; 0 = by epochs. default 0
    double epochs;              // passes over the training split when tokens == 0; default 1
    float lr;                   // peak learning rate; default 3e-4
    int64_t warmup;             // warm-up steps; -1 (default) = 5% of the steps, at most 500
    float weight_decay;         // AdamW weight decay (never on norm gains and biases); default 0
    float clip;                 // gradient-norm clip (<= 0: none); default 1.0
    int n_threads;              // 0 (default) = number of cores
    uint64_t seed;              // default 42: initialisation, shuffling
    const char *ckpt_path;      // checkpoint file; NULL = OUT.ckpt
    double ckpt_minutes;        // minutes between checkpoints; default 5 (<= 0: only at a stop / the end)
    int64_t ckpt_every;         // also every this many steps; 0 (default) = by time only
    int resume;                 // 1: continue from ckpt_path (it must exist and match); 0: a checkpoint
                                // already at ckpt_path is an error (nothing is overwritten silently)
    double heldout;             // fraction of the records held back for evaluation; default 0.02
    int64_t eval_every;         // steps between evaluations; default 200 (and at the end)
    int64_t eval_tokens;        // most held-back positions per evaluation; default 16384
    int topk;                   // target distribution entries kept per position; default 8
    int n_ctx;                  // cache window (longer records are split); default 2048
    int n_batch;                // tokens per target forward while caching; default 256
    int cache_only;             // 1: build the cache and stop (no head is trained)
    const char *recipe;         // free text for the head's note (e.g. the command line), or NULL
    volatile sig_atomic_t *stop;  // set (to nonzero, e.g. by a SIGINT handler): write a checkpoint and return 1
    sd_train_progress_fn progress;  // NULL: none
    void *user;
    int moa_tli;                // MoA: target layers run after CA (TLI = N, 0..n_layer-1); default 0 (docs/moa.md)
    int moa_no_lsa;             // MoA: 1 = no LSA layer (the layers' mean K,V row projected); default 0
    int moa_ca_hidden;          // MoA: 1 = CA also reads the target's state entering layer L-N (TLI 0: its
                                // final normed state), as EAGLE reads the target's states; default 0
    int moa_sa_hidden;          // MoA: 1 = SA's input rows also add that state of the last verified position
                                // (as EAGLE's input); default 0
    int moa_block_min, moa_block_max;  // MoA: a verified point every k positions, k drawn per sequence in
                                // min..max (1..SD_TRAIN_MOA_MAX_BLOCK): a row at distance d after its point
                                // trains the d-th drafted token; default 6..15 (the reference's; docs/moa.md)
    int score_answers;          // 1 = the loss and the held-back agreement score only what the assistant writes
                                // in chat records (the positions whose next token is part of an assistant turn,
                                // its end-of-turn marker included: what a drafter drafts), text records in full;
                                // 0 (default) = every position, prompts included
    int moa_sa_full;            // MoA: 1 = SA attends to the whole text (every verified position's row), as the
                                // reference's drafter does at inference; trained with a curriculum: a sequence's
                                // SA sees the whole text with a probability rising from 0 to 1 over the first
                                // half of the steps, else its block only; not with moa_sa_hidden; default 0
} sd_train_head_params;
SD_API sd_train_head_params sd_train_head_default_params(void);

#define SD_TRAIN_MOA_MAX_BLOCK 64

typedef struct sd_train_head_result {
    int stopped;                // stopped by the flag: 1 while training (a checkpoint holds the run, no head
                                // was written), 2 while building the cache (its complete records and the
                                // finished windows of the record in progress are kept)
    int64_t cache_records, cache_tokens;  // the cache's size
    int64_t train_tokens_avail, eval_tokens_avail;  // positions in the training and held-back splits
    int draft_vocab;            // tokens of the draft vocabulary
    double coverage;            // fraction of the target's argmax mass (training split) inside the draft vocabulary
    int64_t step, n_steps, tokens;
    double loss;                // the last step's loss
    int n_agree;
    double eval_loss, eval_agree[SD_TRAIN_MAX_K];  // the last evaluation (eval_tokens 0: none)
    int64_t eval_tokens;
    double train_seconds;       // training wall time (resumed runs included)
} sd_train_head_result;

// Runs the whole job described above. Returns 0 when the head is written
// (or the cache built, with cache_only), 1 when stopped by *stop (while
// training: a checkpoint was written and resume = 1 continues; while
// caching: the same call again continues the cache; res->stopped says which),
// <0 with a message: a missing or unreadable data file, a bad JSON line
// (FILE:LINE), a cache, checkpoint or head made for another target or with
// other settings (saying what differs), a write error (a full disk: the
// previous checkpoint stays), ... res may be NULL.
SD_API int sd_train_head(const sd_train_head_params *p, sd_train_head_result *res, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
