// moa.h - internal: the Mixture of Attentions drafter (seed 000, docs/moa.md)
// as an sd_head of type SD_HEAD_MOA: its tensor table, hyper-parameters,
// GGUF keys (moa_io.c), the target weights it borrows (moa.c), and the
// inference runner (moa_run.c).
//
// The math, per drafted row at position p with token x (E = target width,
// L = target layers, Ekv = one layer's K,V row):
//   LSA (once per verified position j): R_j (L, Ekv) = the target's K,V rows
//     of j in every layer; Z = Layer_lsa(R_j) (a pre-norm decoder layer over
//     the L rows, no mask, RoPE by layer index); c_j = P mean_l(Z) + b (E).
//     no-LSA: c_j = P mean_l(R_j) + b.
//     ca_hidden: c_j += H h_j / rms(h_j), h_j the target's state entering
//     layer L-N at j (TLI 0: its final normed state, the output's input).
//     sa_hidden: SA's input rows add G h_v / rms(h_v), v the last verified
//     position (none: nothing added).
//   SA: s = Layer_sa over the token embeddings after the last verified
//     position (the tree root, then its drafted descendants), causal.
//   CA: u = s + Wo attn(q = rope(Wq n(s), p); k_j = rope(Wk n(c_j), j),
//     v_j = Wv n(c_j) for every verified j), then u += FFN(u) (pre-norm;
//     n is one RMSNorm gain for queries and keys alike).
//   TLI = N: u runs through the target's last N layers (their K,V of the
//     verified positions are the target's own cache rows), then the
//     target's final norm and the draft-vocabulary rows of its output
//     matrix give the draft logits. N = 0: the norm and output directly.
#ifndef SD_MOA_H
#define SD_MOA_H

#include <stddef.h>
#include <stdint.h>

#include "head/head.h"
#include "kernels/threadpool.h"
#include "model/gguf.h"
#include "model/model.h"

// A decoder layer's tensors, at block base + one of these.
enum { SD_MOA_ATTN_NORM = 0, SD_MOA_Q, SD_MOA_K, SD_MOA_V, SD_MOA_O, SD_MOA_FFN_NORM, SD_MOA_GATE, SD_MOA_UP,
       SD_MOA_DOWN, SD_MOA_PER_LAYER };
// Blocks of sd_head.t for an MoA head (the LSA layer absent with no-LSA).
enum {
    SD_MOA_SA = 0,                       // sa.*: width E, Q/K/V read E
    SD_MOA_CA = SD_MOA_PER_LAYER,        // ca.*: width E; K/V read the LSA outputs c_j
    SD_MOA_PROJ = 2 * SD_MOA_PER_LAYER,  // lsa.proj.weight (E, Ekv)
    SD_MOA_PROJ_B,                       // lsa.proj.bias (E)
    SD_MOA_LSA,                          // lsa.*: width Ekv (9 tensors)
    SD_MOA_N_TENSORS = SD_MOA_LSA + SD_MOA_PER_LAYER
};

// The index of ca.hidden.weight (E, E) in an MoA head's table (present
// with hp->moa_ca_hidden): after the LSA layer, or after the projection
// without LSA; sa.hidden.weight (E, E) (hp->moa_sa_hidden) after it.
static inline int sd_moa_hidden_t(const sd_head_hp *hp) { return hp->moa_no_lsa ? SD_MOA_LSA : SD_MOA_N_TENSORS; }
static inline int sd_moa_sa_hidden_t(const sd_head_hp *hp) { return sd_moa_hidden_t(hp) + (hp->moa_ca_hidden != 0); }
// 1 when the drafter reads the target's states (ca_hidden or sa_hidden).
static inline int sd_moa_reads_states(const sd_head_hp *hp) { return hp->moa_ca_hidden || hp->moa_sa_hidden; }
// The target state a drafter reading states (ca_hidden, sa_hidden) reads (as sd_batch.hidden_layers):
// the stream after block L-N-1, or SD_HIDDEN_NORM for TLI 0.
int sd_moa_hidden_layer(const sd_head_hp *hp);
// h_j / rms(h_j) into out (n floats; zeros stay zeros).
void sd_moa_hidden_scale(const float *h, int n, float *out);
// The scale of sa_hidden's state in SA's input: the target's embedding
// rows' mean RMS (over its first 4096 tokens) / sqrt(E). The input is
// emb(x) + G (s h/rms(h)): with s = 1 an optimiser step on G moved the row
// by about lr E (a unit-RMS state against embeddings of a few hundredths:
// the token was drowned); with s the step is about the embedding's own size.
float sd_moa_sa_scale(const sd_model *m);

// Default MoA hyper-parameters for target m (hp already has the common
// fields of sd_head_default_hp): SA/CA copy the target's attention shape and
// n_ff; LSA heads of 64 (or the target's head size when 64 does not divide
// Ekv), as many KV heads, n_ff = 2 Ekv; TLI 0, LSA on.
void sd_moa_default_hp(sd_head_hp *hp, const sd_model *m);
// 0 if hp's MoA fields are consistent, else <0 naming the field.
int sd_moa_check_hp(const sd_head_hp *hp, char *err, size_t errlen);
// Appends the MoA tensors to h's table (h->n_t == 0 on entry); *off counts floats.
void sd_moa_build_table(sd_head *h, size_t *off);
// 0 if h (MoA) fits target m beyond sd_head_check_target's common checks
// (K,V row width, TLI within the layers), else <0 with the reason.
int sd_moa_check_target(const sd_head *h, const sd_model *m, char *err, size_t errlen);

// moa_io.c: the `moa` GGUF keys (docs/moa.md). write: every MoA key of hp.
// read: fills hp's MoA fields and SA/CA shape from g, each key checked.
void sd_moa_write_hp(sd_gguf_writer *w, const sd_head_hp *hp);
int sd_moa_read_hp(const sd_gguf *g, sd_head_hp *hp, char *err, size_t errlen);

// A float copy of target matrix t (n_out rows of n_in), rows `rows` (NULL:
// all, n_rows ignored) into dst (n_rows or ne1 rows of ne0 floats). Returns
// 0 or <0 (a type without a reference conversion).
int sd_moa_dequant(const sd_model *m, const sd_tensor *t, const int32_t *rows, int n_rows, float *dst, char *err,
                   size_t errlen);

// RoPE angle table of the target (as its session computes it): freq (n_rot/2)
// theta_i = base^(-2i/n_rot) / scale, in double.
void sd_moa_target_freq(const sd_model *m, double *freq);
// Rotates n_heads heads of hd dims of one row at position pos: the first
// n_rot dims, NORM pairs (2i, 2i+1) or NEOX pairs (i, i + n_rot/2).
void sd_moa_rope(float *row, int n_heads, int hd, int n_rot, int neox, const double *freq, int pos);

// ---------------------------------------------------------------- runner

typedef struct sd_moa_run sd_moa_run;
// A runner's parameters in its compute type (moa_run.c); freed with the head
// when shared (sd_head.moa_shared).
typedef struct sd_moa_w sd_moa_w;
void sd_moa_w_free(sd_moa_w *w);

// A runner for MoA head h (must outlive it) and target m: n_ctx verified
// positions of context (CA keys and values, the TLI layers' K,V rows), at
// most max_pending drafted rows between resets, at most 64 rows a call.
// wtype: SD_TYPE_Q8_0, Q5_0, Q4_1 or Q4_0 (speed; --head-bits) or
// SD_TYPE_F32 (exact float, tests) for the matrices (the MoA's own and the
// target's borrowed ones: the TLI layers, the draft-vocabulary output rows;
// rows that do not fill blocks stay F32). share: computes with the head's
// shared copy of those parameters (made by the first runner that asks for
// target m and type wtype, freed with the head; a runner of another target
// or type makes its own): a head that never changes once loaded; tests
// that change a head's parameters make runners of their own (share 0).
// pool may be NULL.
int sd_moa_run_new(sd_moa_run **out, const sd_head *h, const sd_model *m, int n_ctx, int max_pending, int wtype,
                   int share, sd_pool *pool, char *err, size_t errlen);
void sd_moa_run_free(sd_moa_run *r);
// Rows per call.
#define SD_MOA_ROWS 64
// Appends n <= SD_MOA_ROWS verified positions (the next n_cached ..): kv
// (n, L, Ekv) each position's K,V rows of every target layer (K with the
// target's RoPE, as cached; the last N of them are the TLI layers' own);
// hid (n, E) their target states at sd_moa_hidden_layer (a drafter that
// reads them; else ignored, may be NULL); tok (n) their tokens (a drafter
// whose SA reads the whole text, sa_full; else ignored, may be NULL). Runs
// LSA and stores the CA keys and values (sa_full: and SA's). Returns 0 or <0
// (full; no states or tokens for a drafter reading them).
int sd_moa_run_context(sd_moa_run *r, const float *kv, const float *hid, const int32_t *tok, int n, char *err,
                       size_t errlen);
// 1 when the drafter reads the target's states (ca_hidden, sa_hidden).
int sd_moa_run_needs_hidden(const sd_moa_run *r);
// As sd_moa_run_context from LSA's outputs computed elsewhere (a split
// server, docs/split.md): rows (n, E + N Ekv), each position's c (without
// the states' terms: sd_moa_run_lsa) then the K,V rows of the last N layers;
// hid and tok as sd_moa_run_context's.
int sd_moa_run_context_lsa(sd_moa_run *r, const float *rows, const float *hid, const int32_t *tok, int n, char *err,
                           size_t errlen);
// As sd_moa_run_context for a drafter without LSA from each position's mean
// over the target's layers of its K,V rows (what it reads of them): rows
// (n, (1 + N) Ekv), the mean then the last N layers' K,V rows (a split
// server's "mean" states, docs/split.md); hid and tok as sd_moa_run_context's.
int sd_moa_run_context_mean(sd_moa_run *r, const float *rows, const float *hid, const int32_t *tok, int n, char *err,
                            size_t errlen);
int sd_moa_run_n_cached(const sd_moa_run *r);
int sd_moa_run_n_ctx(const sd_moa_run *r);
// Keeps the first n verified positions; drops the pending rows.
void sd_moa_run_truncate(sd_moa_run *r, int n);
// LSA alone: c (n, E) from kv (n, L, Ekv), n <= SD_MOA_ROWS, without the
// target states' terms of a drafter reading them (the client adds them: a
// split server runs this, docs/split.md; tests).
void sd_moa_run_lsa(sd_moa_run *r, const float *kv, int n, float *c);
// Evaluates n <= SD_MOA_ROWS drafted rows: tok[i] at position pos[i], parent
// [i] -1 (the first row after the verified text: the tree root) or the
// pending slot of an earlier row (its SA and TLI attention see that row's
// chain). Rows become pending slots n_pending.. in order. Writes the draft
// logits (n, n_draft_vocab) and, when h_out is given, each row's CA output
// (n, E). Returns 0 or <0.
int sd_moa_run_eval(sd_moa_run *r, const int32_t *tok, const int32_t *pos, const int32_t *parent, int n,
                    float *logits, float *h_out, char *err, size_t errlen);
int sd_moa_run_n_pending(const sd_moa_run *r);
void sd_moa_run_drop_pending(sd_moa_run *r);
// Keeps the first n pending rows (slots 0 .. n-1), drops the rest.
void sd_moa_run_keep_pending(sd_moa_run *r, int n);

#endif
