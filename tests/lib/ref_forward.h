// ref_forward.h - a plain scalar reference forward pass, for tests only.
//
// One token at a time with a simple float KV cache whose entries are rounded
// through fp16 as the engine's are; weights are dequantized
// row by row with the reference to_float of their type, every dot product and
// norm accumulates in double, activations are never quantized. Slow but
// obviously right: the optimized batched forward (src/runtime/forward.c) is checked
// against it.
#ifndef SD_TEST_REF_FORWARD_H
#define SD_TEST_REF_FORWARD_H

#include <stdint.h>

#include "model/model.h"

typedef struct ref_state ref_state;

// Creates a reference state for model m with room for n_ctx tokens. NULL on
// allocation failure.
ref_state *ref_new(const sd_model *m, int n_ctx);
void ref_free(ref_state *r);
// Tokens currently cached.
int ref_n_past(const ref_state *r);
// act_quant = 1: before every matrix product with a quantized weight, round
// the activation row through the weight's vec_dot_type (Q8_0 / Q8_1 / Q8_K)
// with the reference quantizer, as the optimized sd_matmul does. This
// isolates kernel and plumbing errors from activation-quantization noise.
void ref_set_act_quant(ref_state *r, int act_quant);
// Forgets cached tokens beyond n (n <= n_past).
void ref_truncate(ref_state *r, int n);

// Near ties. An activation quantized to 8 bits (act_quant) or a K / V element
// rounded to fp16 that lies this close to the midpoint between its two
// rounding candidates may round either way in an implementation whose float
// operations differ from these in order or precision (the engine's float sums
// against these double ones: about 1e-6 relative): a "near-tie site". Such a
// flip moves one activation by a whole quantization step, and through the KV
// cache every later token, by far more than the 1e-6 the two otherwise agree
// to. REF_TIE_*: the closeness, in quantization steps (|v - tie| <= REL * |v|
// + ABS, v the value in steps) and relative to the value (fp16).
#define REF_TIE_Q8_REL 2e-5f
#define REF_TIE_Q8_ABS 1e-4f
#define REF_TIE_F16_REL 2e-5f
// Evaluations round the near-tie sites listed (their indices in the order
// an evaluation meets them, from 0; at most REF_TIE_FLIPS_MAX) the other way;
// n = 0 (the default): the plain rounding everywhere.
#define REF_TIE_FLIPS_MAX 4
void ref_set_tie_flips(ref_state *r, const int *sites, int n);
// Near-tie sites the last evaluation met.
int ref_last_ties(const ref_state *r);
// Evaluates token as ref_eval does (pos as there), and when its logits are
// further than tol (max |difference|) from want (n_vocab floats, e.g. the
// engine's), again with near-tie sites of the evaluation rounded the other
// way: each of the first REF_TIE_SITES_MAX alone, then pairs and triples of
// the REF_TIE_SEARCH that came closest alone, until one comes within tol.
// Keeps a combination within tol, else the plain rounding: its logits in
// logits, its K / V in the cache (so later tokens see that choice). Returns
// the near-tie sites the plain evaluation met, or -1 as ref_eval; *flips
// (may be NULL): the number of sites the kept evaluation rounded the other
// way. REF_TIE_DEBUG=1 in the environment prints them.
#define REF_TIE_SITES_MAX 64
#define REF_TIE_SEARCH 6
int ref_eval_nearest(ref_state *r, int32_t token, int pos, const float *want, float tol, float *logits, int *flips);
// Evaluates token at position pos (-1: pos = n_past), appends its K/V rows and
// writes n_vocab logits. Returns 0, or -1 if the cache is full or the token is
// out of range.
int ref_eval(ref_state *r, int32_t token, int pos, float *logits);
// Same, and the token's hidden states into hidden, (n_layer + 1, n_embd):
// row l the residual stream after block l, row n_layer the final RMS-normed
// state (the output matrix's input). hidden may be NULL.
int ref_eval_hidden(ref_state *r, int32_t token, int pos, float *logits, float *hidden);

#endif
