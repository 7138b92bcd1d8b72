// loop_impl.h - private to train/loop.c and train/loop_data.c: the state of
// one sd_train_head call.
#ifndef SD_TRAIN_LOOP_IMPL_H
#define SD_TRAIN_LOOP_IMPL_H

#include "specdec_train.h"
#include "head/head.h"
#include "train/answers.h"
#include "train/cache.h"
#include "train/ckpt.h"
#include "train/train.h"

// A training or evaluation sequence: positions [off, off + T) of a cache sequence.
typedef struct loop_chunk {
    int64_t seq;              // cache sequence (index entry)
    int32_t off, T;           // T in 2..seq_len
} loop_chunk;

#define LOOP_PRE 4096          // tokens read at a time outside a chunk

typedef struct loop_run {
    sd_train_head_params P;   // the caller's params with the defaults resolved
    char cache_dir[4200], ckpt_path[4200];
    sd_model *own_model;      // loaded here (freed at the end), or NULL
    const sd_model *m;
    sd_threadpool *pool;
    sd_cache *cache;
    loop_chunk *train, *eval; // (n_train), (n_eval): the two splits
    int64_t n_train, n_eval;
    int64_t train_pos, eval_pos;  // positions in each split
    int64_t *train_seqs;      // (n_train_seqs) cache sequences of the training records (vocabulary counts)
    int64_t n_train_seqs;
    int64_t *perm;            // (n_train) the current epoch's order of the training chunks
    sd_rng rng;               // shuffling
    sd_head *h;
    sd_adamw opt;
    int have_opt;
    sd_trainer *tr;
    float *grad;              // (h->n_w)
    int32_t *b_tok, *b_ids;   // (seq_len), (seq_len, topk): one sequence read from the cache
    float *b_feat, *b_p;      // (seq_len, n_feat), (seq_len, topk)
    sd_answers ans;           // --score answers (loop_data.c): the chat template's tokens (n_hdr 0: off)
    uint8_t *b_score;         // (seq_len) the chunk's mask (sd_train_seq.score)
    int32_t *b_pre;           // (LOOP_PRE) tokens of the chunk's record outside it
    sd_ckpt_recipe recipe;
    sd_ckpt_state st;
    double coverage;          // of the training split's argmax mass by the draft vocabulary
    double t0;                // sd_time_ms at the call's start
    double t_train0;          // ... when the first step of this call started
    int64_t step0, tokens0;   // step and tokens when this call's training started
    int64_t cache_rec0;       // records the cache held when this call's build started (-1: not yet known)
    double seconds0;          // training time of earlier calls (resumed)
    sd_train_progress prog;   // the last figures reported
    char *note_buf;           // (1024) scratch for notes
    // MoA heads (loop_moa.c): the target session that recomputes a sequence's K,V rows (with LSA), and buffers
    sd_session *moa_s;
    float *moa_feat;          // (seq_len, sd_moa_n_feat) the trainer's features
    float *moa_hid;           // (seq_len, 2, n_embd) hidden rows of the forward
    float *moa_k, *moa_v;     // (seq_len, kv_dim) one layer's cache rows
    uint8_t *moa_nolog;       // (seq_len) zeros: the forward computes no logits
} loop_run;

// loop_data.c: the splits, the vocabulary, the cache's sequences.
// Cuts the cache into training and held-back chunks (held back: records
// chosen by a hash of their line, heldout of them). 0 or <0.
int loop_split(loop_run *r, char *err, size_t errlen);
// The draft vocabulary: the n most frequent target argmax tokens of the
// training split (ties: more frequent as an input token, then the lower id).
// ids: (n) out. *coverage: their share of the argmax mass. 0 or <0.
int loop_pick_vocab(loop_run *r, int n, int32_t *ids, double *coverage, char *err, size_t errlen);
// Coverage of the training split's argmax mass by h's vocabulary.
int loop_coverage(loop_run *r, const sd_head *h, double *coverage, char *err, size_t errlen);
// --init with a larger --draft-vocab: r->h becomes the init head with n
// tokens: its own (rows kept) and the tokens the target predicts most often
// in the training split that it lacks (loop_pick_vocab's order), their output
// rows the target's, scaled by the median ratio of the head's rows' norms to
// the target's rows of its tokens. EAGLE-3 and Medusa heads; 0 or <0.
int loop_extend_vocab(loop_run *r, int n, char *err, size_t errlen);
// --score answers: finds the model's assistant header and end-of-turn token
// (its chat template rendering one user message) and allocates the mask. 0 or
// <0 (no chat template, or one whose header cannot be found).
int loop_answers_init(loop_run *r, char *err, size_t errlen);
// Reads chunk c into the run's buffers and describes it in seq (with
// --score answers, seq->score marks the positions the assistant's text
// follows). 0 or <0.
int loop_read(loop_run *r, const loop_chunk *c, sd_train_seq *seq, char *err, size_t errlen);
// The next training chunk (advancing cursor, epoch and the shuffle).
const loop_chunk *loop_next_chunk(loop_run *r);
// Starts epoch st.epoch from the RNG state st.rng_epoch: redraws the order.
void loop_shuffle(loop_run *r);
// loop_moa.c: an MoA run's buffers (and, with LSA, the target session that
// recomputes); a sequence's MoA features into seq->feats (sd_moa_n_feat's
// layout): from the MoA cache's rows (no LSA; pos0: the chunk's offset in
// its window) or recomputed by a forward over its tokens. 0 or <0.
int loop_moa_uses_cache(const sd_head_hp *hp);
int loop_moa_init(loop_run *r, char *err, size_t errlen);
void loop_moa_free(loop_run *r);
int loop_moa_feats(loop_run *r, sd_train_seq *seq, int pos0, char *err, size_t errlen);
// Copies the target's output rows (the draft vocabulary's) and output norm
// into a new head, as docs/heads.md's initialisation says.
void loop_init_from_target(sd_head *h, const sd_model *m);

#endif
