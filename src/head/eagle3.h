// eagle3.h - internal: the EAGLE-3 head at inference (docs/heads.md): fusing
// the target's states, and evaluating head rows against the head's own KV
// cache (committed rows) plus pending rows (the draft tree's), with the
// matrices in an 8-bit or float copy of the head's parameters.
#ifndef SD_EAGLE3_H
#define SD_EAGLE3_H

#include <stddef.h>
#include <stdint.h>

#include "head/head.h"
#include "kernels/threadpool.h"

typedef struct sd_e3 sd_e3;

// The parameters of a head as a runner reads them: the matrices in its
// compute type (Q8_0 or float copies) and the norm gains, copied out of a
// head (sd_head.w) when filled. A pack belongs to no head: the online
// drafter fills one from the head it trains in a background thread, then
// hands it to the runner at the start of a step (sd_e3_swap_pack).
typedef struct sd_e3_pack sd_e3_pack;
// A pack shaped for h (EAGLE-3), filled from h. wtype: SD_TYPE_Q8_0 or
// SD_TYPE_F32 (matrices whose rows do not fill Q8_0 blocks stay float).
// Allocates everything; h is not kept.
int sd_e3_pack_new(sd_e3_pack **out, const sd_head *h, int wtype, char *err, size_t errlen);
// Copies (quantizes) h's parameters into p; h has p's shape. Allocates nothing.
void sd_e3_pack_fill(sd_e3_pack *p, const sd_head *h);
void sd_e3_pack_free(sd_e3_pack *p);

// A head runner for h (which must outlive it: its hyper-parameters are read,
// and sd_e3_sync re-reads h->w) and the target m it reads embeddings from: a
// KV cache of n_ctx committed rows, at most max_rows rows per call and
// max_pending pending rows between commits. Its parameters are a pack of its
// own made from h, or with share the head's shared pack (made by the first
// runner that asks, freed with the head, read only: runners of an unchanging
// head; a learner's runner, whose pack sd_e3_swap_pack replaces, has its
// own). wtype: SD_TYPE_Q8_0 (default speed) or SD_TYPE_F32 (exact float, for
// tests). pool may be NULL.
int sd_e3_new(sd_e3 **out, const sd_head *h, const sd_model *m, int n_ctx, int max_rows, int max_pending, int wtype,
              int share, sd_pool *pool, char *err, size_t errlen);
void sd_e3_free(sd_e3 *e);
// Re-reads the head's parameters into the runner's pack (after training changed them).
void sd_e3_sync(sd_e3 *e);
// The runner computes with p from now on (a pack of the same shape and
// weight type, made by sd_e3_pack_new); returns the pack it used, which the
// caller owns from now on. O(1). The committed rows keep the keys and values
// the old parameters made.
sd_e3_pack *sd_e3_swap_pack(sd_e3 *e, sd_e3_pack *p);
const sd_head *sd_e3_head(const sd_e3 *e);

// g (n, d) = fc * feats (n, 3d): the fused states of n target positions.
void sd_e3_fuse(sd_e3 *e, const float *feats, int n, float *g);

// Evaluates n new head rows (n <= max_rows). Row i: token tok[i], input
// state c + i*d, position pos[i], parent[i]: -1 (it sees the committed rows
// and itself) or the pending slot of an earlier row (it sees the committed
// rows, that row's ancestor chain and itself). The rows become pending slots
// sd_e3_n_pending() .. + n - 1 (in order). Writes each row's output state
// (n, d) into h_out and its draft logits (n, V') into logits (either may be
// NULL). Returns 0, or <0 (no room: n_ctx or max_pending; bad token).
int sd_e3_eval(sd_e3 *e, const int32_t *tok, const float *c, const int32_t *pos, const int32_t *parent, int n,
               float *h_out, float *logits, char *err, size_t errlen);
// The same rows, with the output state and logits of the last row only,
// into h_out (d) and logits (V'): the keys and values of the others are all
// a later row needs of them (a catch-up over the accepted text). Their keys
// and values, and the last row's outputs, are sd_e3_eval's to the bit.
int sd_e3_eval_last(sd_e3 *e, const int32_t *tok, const float *c, const int32_t *pos, const int32_t *parent, int n,
                    float *h_out, float *logits, char *err, size_t errlen);
int sd_e3_n_pending(const sd_e3 *e);
// Appends pending slots slots[0..n) (a chain from the committed rows, in
// order) to the committed rows and drops every pending row.
int sd_e3_commit(sd_e3 *e, const int32_t *slots, int n, char *err, size_t errlen);
// Drops the pending rows.
void sd_e3_drop_pending(sd_e3 *e);
// Keeps the first n committed rows (n <= sd_e3_n_cached).
void sd_e3_truncate(sd_e3 *e, int n);
int sd_e3_n_cached(const sd_e3 *e);
int sd_e3_n_ctx(const sd_e3 *e);

#endif
