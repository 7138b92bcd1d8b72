// train_impl.h - internal to src/train/: the trainer behind train.h, shared
// by its two head types (eagle3_train.c, medusa_train.c; the dispatch and
// the checks common to both in trainer.c).
#ifndef SD_TRAIN_IMPL_H
#define SD_TRAIN_IMPL_H

#include "train/ops.h"
#include "train/train.h"

// Most top-k entries per position a sequence may carry (sd_train_seq.topk).
#define SD_TRAIN_MAX_TOPK 256

// Deliberate faults for the tests (tests/train/test_gradients.c shows that the
// gradient check catches a wrong backward): never set outside tests.
enum {
    SD_TR_FAULT_NONE = 0,
    SD_TR_FAULT_NO_RESID,    // EAGLE-3: the gradient through the attention's residual is dropped
    SD_TR_FAULT_NO_WEIGHT,   // the gradient leaves out the loss weights 0.8^k (the loss keeps them)
};

// EAGLE-3 workspace (docs/heads.md): the rows of every training-time-test
// step, step after step (step k's rows j = 1..T-1-k start at row
// sd_tr_ttt_off(T, k); R = sd_tr_ttt_off(T_max, K) rows in all), and the
// per-step scratch of the backward (n0 = T_max - 1 rows).
typedef struct e3_ws {
    float *E, *En, *A;       // (T_max, d) token embeddings, n(E), a = n(E) * attn_norm, by position
    float *dA;               // (T_max, d) gradient of a, by position (summed over steps)
    float *G;                // (n0, d) fused states g_{j-1} of rows j = 1..T-1
    float *Bn, *rs_c;        // (R, d), (R) b = n(c) * hidden_norm and 1/rms(c)
    float *U;                // (R, 2d) [a; b]
    float *Q;                // (R, n_head*hd) after RoPE
    float *Kr, *Vr;          // (R, n_kv*hd) keys (after RoPE) and values of every row of every step
    float *Oa;               // (R, n_head*hd) attention outputs
    float *P;                // (n_head, nnz of all steps) attention probabilities, step after step
    float *Rr, *rs_r;        // (R, d), (R) r = residual + Wo o, 1/rms(r)
    float *M;                // (R, d) n(r) * ffn_norm
    float *Gt, *Up, *S;      // (R, n_ff) gate, up, silu(gate) * up
    float *H, *rs_h;         // (R, d), (R) h = r + Wdown s, 1/rms(h)
    float *Z;                // (R, d) n(h) * output_norm
    float *dZ;               // (R, d) gradient of z (from the loss, during the forward)
    float *Lg;               // (n0, V') logits of one step, then their gradient
    float *dH;               // (R, d) gradient of h
    float *dKr, *dVr;        // (R, n_kv*hd) gradients of keys and values
    float *dR, *dM, *dB, *dC; // (n0, d) one step's scratch
    float *dG;               // (n0, d) gradient of the fused states
    float *dS, *dGt, *dUp;   // (n0, n_ff)
    float *dOa, *dQ;         // (n0, n_head*hd)
    float *dU;               // (n0, 2d)
    float *dSc;              // (n_head, nnz of the largest step) gradient of the scores
    float *rope_cs;          // (T_max + K, hd/2, 2)
    int32_t *pos;            // (R) position of each row
    int32_t *q_off;          // (R + K) each step's query offsets, step after step (n_k + 1 each)
    int32_t *q_key, *k_ent, *k_q; // (nnz of all steps)
    int32_t *k_off;          // (sum over steps of (keys + 1))
    int32_t *argmax;         // (n0) one step's argmax per row
    float *loss_row;         // (n0)
} e3_ws;

// Medusa workspace: one head at a time, n0 = T_max - 1 rows.
typedef struct md_ws {
    float *Upre;             // (n0, d) W f + b
    float *Zs;               // (n0, d) z = f + silu(W f + b)
    float *Lg;               // (n0, V') logits, then their gradient
    float *dZ, *dU;          // (n0, d)
    int32_t *argmax;         // (n0)
    float *loss_row;         // (n0)
} md_ws;

struct sd_trainer {
    const sd_head *h;        // borrowed: must outlive the trainer; its w is read at every call
    const sd_model *target;  // borrowed (EAGLE-3's token embedding)
    int T_max, K;            // K: training-time-test steps (EAGLE-3) or heads (Medusa)
    sd_tr_ctx ctx;
    int fault;               // SD_TR_FAULT_*; 0 outside tests
    int32_t *tid;            // (T_max, SD_TRAIN_MAX_TOPK) draft ids of each position's target (-1: none)
    float *tp;               // (T_max, SD_TRAIN_MAX_TOPK) their masses
    uint8_t *scored;         // (T_max) 1: the position's target has mass in the draft vocabulary
    float *arena;            // every float buffer of the workspace, one allocation
    int32_t *iarena;         // every int buffer
    e3_ws e3;
    md_ws md;
    struct sd_moa_tr *moa;   // MoA heads: their workspace (train/moa_train.h), else NULL
};

// Carves n floats (64-byte multiples) off *p.
static inline float *tr_take(float **p, size_t n) {
    float *r = *p;
    *p += (n + 15) / 16 * 16;
    return r;
}
static inline int32_t *tr_take_i(int32_t **p, size_t n) {
    int32_t *r = *p;
    *p += (n + 15) / 16 * 16;
    return r;
}

// Per type: sizes (floats, ints) of the workspace; carving; the loss.
void sd_e3_sizes(const sd_head *h, int T_max, int K, size_t *nf, size_t *ni);
void sd_e3_carve(sd_trainer *tr, float *f, int32_t *i);
double sd_e3_loss(sd_trainer *tr, const sd_train_seq *seq, float *grad, sd_train_stats *st, char *err, size_t errlen);
void sd_md_sizes(const sd_head *h, int T_max, size_t *nf, size_t *ni);
void sd_md_carve(sd_trainer *tr, float *f, int32_t *i);
double sd_md_loss(sd_trainer *tr, const sd_train_seq *seq, float *grad, sd_train_stats *st);

// AdamW's update of n parameters with coefficients fixed for one step
// (adamw.c): the AVX2 loop and its scalar reference, same bits.
typedef struct sd_adamw_coef {
    float gscale;            // clipping factor of the gradient (1: none)
    float b1, nb1, b2, nb2;  // beta1, 1 - beta1, beta2, 1 - beta2
    float ibc1, ibc2;        // 1 / (1 - beta^t): bias corrections
    float eps, lr, wd;       // wd: decoupled decay of these parameters (0 for gains and biases)
} sd_adamw_coef;
void sd_adamw_update(float *w, float *m, float *v, const float *g, size_t n, const sd_adamw_coef *c);
void sd_adamw_update_ref(float *w, float *m, float *v, const float *g, size_t n, const sd_adamw_coef *c);

// Test hook: sets tr->fault (SD_TR_FAULT_*).
void sd_trainer_set_fault(sd_trainer *tr, int fault);

#endif
