// quant_check.h - shared checks of the quantization tests.
//
// Usage (in a test program, where CHECK is available):
//   static void inv_fail(const char *msg) { CHECK(0, "%s", msg); }
//   n_bad += qc_matmul_invariance_case(pool, SD_TYPE_Q4_0, 576, 37, rnd_sym, inv_fail);
#ifndef SD_TEST_QUANT_CHECK_H
#define SD_TEST_QUANT_CHECK_H

#include <stdint.h>

#include "kernels/matmul.h"
#include "kernels/threadpool.h"

// Called once per failed check with its message (no trailing newline).
typedef void (*qc_fail_fn)(const char *msg);

// Batch invariance (bitwise): sd_matmul of one token gives the same bits as
// the same token inside a batch of n_tok = 2..19 (first, middle and tail of
// every tile). Random weights (rnd()) are quantized to type t (n_out rows of
// n_in); activations are 4 * rnd(); pool may be NULL. Calls fail() for an
// allocation failure and for every n_tok whose outputs differ; returns the
// number of such failures (0: invariant).
int qc_matmul_invariance_case(sd_pool *pool, int t, int64_t n_in, int64_t n_out, float (*rnd)(void),
                              qc_fail_fn fail);

// Random K-quant weight blocks (Q4_K, Q5_K, Q6_K): nb blocks of arbitrary
// bytes (every quant and scale pattern) with a sane fp16 d (and dmin) written
// in. u32: the caller's random generator.
void qc_k_random_blocks(int type, uint8_t *w, int64_t nb, uint32_t (*u32)(void));

// nb Q8_K activation blocks of extreme bytes (the full int8 range, -128 half
// of the time) with a positive d and consistent bsums.
void qc_q8_K_extreme(sd_block_q8_K *x, int64_t nb, uint32_t (*u32)(void));

#endif
