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
// Evaluates token at position pos (-1: pos = n_past), appends its K/V rows and
// writes n_vocab logits. Returns 0, or -1 if the cache is full or the token is
// out of range.
int ref_eval(ref_state *r, int32_t token, int pos, float *logits);
// Same, and the token's hidden states into hidden, (n_layer + 1, n_embd):
// row l the residual stream after block l, row n_layer the final RMS-normed
// state (the output matrix's input). hidden may be NULL.
int ref_eval_hidden(ref_state *r, int32_t token, int pos, float *logits, float *hidden);

#endif
