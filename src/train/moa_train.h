// moa_train.h - internal to src/train/: the loss of an MoA drafter on one
// sequence and its gradient (docs/moa.md, "Training"); the trainer
// (trainer.c) dispatches here for SD_HEAD_MOA heads.
#ifndef SD_MOA_TRAIN_H
#define SD_MOA_TRAIN_H

#include "train/ops.h"
#include "train/train.h"

typedef struct sd_moa_tr sd_moa_tr;

// Floats per position of an MoA training sequence's feats (sd_train_seq):
// [K,V rows of every target layer (L, Ekv) | the target's state entering
// layer L-N (E; zeros when N = 0) | its final normed state (E)]; without
// LSA the K,V part is the layers' mean row and the N TLI layers' rows
// ((1 + N) Ekv), the reduced form the MoA feature cache stores. The K rows
// carry RoPE at the target positions seq->pos0 + i.
int sd_moa_n_feat(const sd_head *h);

// Adds layer l's K,V rows (kvd floats each; of L layers) to a reduced K,V
// part (no LSA: the mean row, then the last N layers' rows; zeroed by the
// caller before layer 0). The one definition of that layout: the MoA cache
// build and the recompute path both fill it here.
void sd_moa_reduced_add(float *row, int l, int L, int N, int kvd, const float *k, const float *v);

// The MoA workspace for sequences of up to T_max positions: activations,
// masks, and the frozen target weights it reads (the last N layers, the
// final norm, the draft vocabulary's output rows, dequantised once). h and
// target are borrowed. Returns 0 or <0 (out of memory; a TLI target whose
// RoPE the training ops do not have: NEOX pairs, partial rotation, scaling).
int sd_moa_tr_new(sd_moa_tr **out, const sd_head *h, const sd_model *target, int T_max, char *err, size_t errlen);
void sd_moa_tr_free(sd_moa_tr *w);

// The loss of seq (its target restricted to the draft vocabulary: tid, tp
// (T, nt), scored (T)); with grad, the gradient is ADDED into grad (n_w).
// st: agreement by draft depth (row i's depth: i minus its block start).
// fault: SD_TR_FAULT_* (tests). Returns the loss or <0.
double sd_moa_tr_loss(sd_moa_tr *w, const sd_tr_ctx *cx, const sd_train_seq *seq, const int32_t *tid,
                      const float *tp, const uint8_t *scored, float *grad, sd_train_stats *st, int fault);

// The block length k of a sequence (kmin..kmax, a hash of its tokens):
// verified points at 0, k, 2k, ...; row i's SA sees [k floor(i/k), i], CA
// the rows before. Row i drafts the token at depth i - k floor(i/k) + 1.
int sd_moa_block(const int32_t *tokens, int T, int kmin, int kmax);
// The range sd_moa_tr_loss draws k from (default SD_MOA_BLOCK_MIN..MAX).
void sd_moa_tr_set_block(sd_moa_tr *w, int kmin, int kmax);
// sa_full's curriculum: 1 when a sequence's SA sees the whole text, drawn
// with probability p from a hash of its tokens and salt (deterministic, so a
// resumed run draws the same; p >= 1: always, p <= 0: never).
int sd_moa_sa_full_draw(const int32_t *tokens, int T, uint64_t salt, float p);
// The p and salt sd_moa_tr_loss draws with for an sa_full drafter (default
// p 0: every sequence sees its block only, as without sa_full).
void sd_moa_tr_set_sa_full(sd_moa_tr *w, float p, uint64_t salt);

#endif
