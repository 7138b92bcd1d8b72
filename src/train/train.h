// train.h - internal: training draft heads (docs/heads.md) in plain C.
// The loss and its gradient for one training sequence (forward and backward
// of every layer, EAGLE-3's training-time test, Medusa's per-head loss),
// AdamW with warm-up and cosine decay. The data these read (target states and
// target distributions) come from the feature cache (train/cache.h); the
// driver loop (batches, checkpoints, progress) is train/loop.c.
#ifndef SD_TRAIN_H
#define SD_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "head/head.h"
#include "kernels/threadpool.h"

// One training sequence: positions 0..T-1 of a text, with what the target
// computed there.
typedef struct sd_train_seq {
    int T;                    // positions (>= 2)
    const int32_t *tokens;    // (T) x_0..x_{T-1} (target vocabulary)
    // (T, n_feat) target states per position: EAGLE-3 [s_l0; s_l1; s_l2]
    // (n_feat = 3d), Medusa the final normed state (n_feat = d).
    const float *feats;
    // The target's next-token distribution at each position: top-k target
    // ids (-1: unused entry) and their probabilities (summing to ~1 over the
    // used entries). Restricted to the draft vocabulary and renormalised by
    // the trainer (docs/heads.md).
    const int32_t *top_ids;   // (T, topk)
    const float *top_p;       // (T, topk)
    int topk;
    int pos0;                 // the target position of tokens[0] (its cached K rows' RoPE; MoA TLI)
    const uint8_t *score;     // (T) or NULL: 0 leaves position p's distribution out of the loss and agreement
} sd_train_seq;

typedef struct sd_train_stats {
    double loss;              // the weighted loss of the sequence (as returned)
    // Per training-time-test step k (EAGLE-3) or head k (Medusa): rows
    // scored, and rows where the head's argmax (mapped to a target id) equals
    // the target's argmax (top_ids[.., 0]).
    int64_t n[SD_HEAD_MAX_MEDUSA], agree[SD_HEAD_MAX_MEDUSA];
} sd_train_stats;

// Workspace of forward and backward passes for sequences of up to T_max
// positions with K training-time-test steps (EAGLE-3; Medusa uses hp.n_medusa
// and ignores K). target: the model whose token embedding the head reads
// (EAGLE-3; frozen). pool: threads for the matrix kernels (NULL: one).
// h, target and pool are borrowed and must outlive the trainer; h->w is
// read afresh at every call (the optimiser updates it in place). Everything
// a call needs is allocated here, sized for T_max.
typedef struct sd_trainer sd_trainer;
int sd_trainer_new(sd_trainer **out, const sd_head *h, const sd_model *target, int T_max, int K, sd_pool *pool,
                   char *err, size_t errlen);
void sd_trainer_free(sd_trainer *tr);
// MoA: the range of the block length k (verified points every k positions,
// k a hash of the sequence's tokens in [kmin, kmax]; sd_moa_block). Default
// SD_MOA_BLOCK_MIN..SD_MOA_BLOCK_MAX, the reference's; no effect on other heads.
#define SD_MOA_BLOCK_MIN 6
#define SD_MOA_BLOCK_MAX 15
void sd_trainer_set_moa_block(sd_trainer *tr, int kmin, int kmax);
// MoA with sa_full (full-text SA): the share p of sequences whose SA sees the
// whole text, the others their block only (the curriculum; drawn by a hash of
// the tokens and salt); default 0. No effect on other heads.
void sd_trainer_set_moa_sa_full(sd_trainer *tr, float p, uint64_t salt);
// Loss of seq under the head's current parameters; when grad != NULL the
// gradient of that loss with respect to every parameter is ADDED into grad
// (n_w floats, the layout of sd_head.w). Deterministic for a given pool size
// (the bits are in fact the same for every size). Holds the pool's busy
// flag for the call (sd_pool_acquire: a pool shared with sessions takes
// turns; the caller must not hold it already).
// st may be NULL. Returns the loss (>= 0), or a negative value with a message
// (T outside [2, T_max], topk outside [1, 256], a token or target id outside
// the target's vocabulary, a missing array). Allocates nothing.
double sd_trainer_loss(sd_trainer *tr, const sd_train_seq *seq, float *grad, sd_train_stats *st, char *err,
                       size_t errlen);

// AdamW over the head's flat parameters.
typedef struct sd_adamw {
    float lr;                 // peak learning rate
    float beta1, beta2, eps;  // 0.9, 0.95, 1e-8
    float weight_decay;       // 0.0 by default; never applied to norm gains and biases
    float clip;               // global gradient-norm clip (<= 0: none)
    int64_t warmup, total;    // steps: linear warm-up then cosine decay to lr/10 at total
    int64_t t;                // steps taken
    float *m, *v;             // (n_w) moments
} sd_adamw;
// Sets the defaults (lr 1e-3, beta1 0.9, beta2 0.95, eps 1e-8, weight_decay
// 0, clip 1.0, warmup 0, total 0: no decay), t = 0, and allocates zeroed
// moments for n_w parameters (one allocation; the caller changes the
// fields it wants before the first step). Returns 0 or <0 with a message.
int sd_adamw_init(sd_adamw *o, size_t n_w, char *err, size_t errlen);
void sd_adamw_free(sd_adamw *o);
// The learning rate of step t (0-based): lr (t+1)/warmup during the
// warm-up, then cosine from lr down to lr/10 at t = total (lr/10 after it;
// constant lr if total <= warmup).
float sd_adamw_lr(const sd_adamw *o, int64_t t);
// One update of h->w with grad (n_w floats, already averaged over the batch;
// clipped here). Returns the gradient norm before clipping.
double sd_adamw_step(sd_adamw *o, sd_head *h, const float *grad);

#endif
