// matmul.h - the batched matrix multiply y = x W^T over the weight types of
// kernels/quant.h, split among the threads of a pool (kernels/threadpool.h):
// one matrix (sd_matmul) or several sharing their input (sd_matmul_multi),
// with hooks that run the forward's element-wise steps inside the same pool
// run, and activations converted ahead by their producers (sd_mm_act).
#ifndef SD_MATMUL_H
#define SD_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"
#include "kernels/threadpool.h"

// The first matrix the next matrix run will read, as a hint (W NULL: none):
// each thread, once done with its rows of a run, reads the start of its share
// of that matrix into cache while it waits for the others and for the
// caller's work between the runs (sd_pool_prefetch), so that memory stays
// busy across the hand-over.
typedef struct sd_mm_next {
    const void *W;    // (n_out, wrb) the weights, in the layout the next call reads; NULL: no hint
    int64_t n_out;    // rows
    size_t wrb;       // bytes per row
} sd_mm_next;

typedef struct sd_mm_ctx {
    sd_pool *pool;    // may be NULL (single thread)
    void *wbuf;       // scratch for converted activations
    size_t wbuf_size; // bytes; at least sd_matmul_wsize(...) of every call
    int act_f32;      // 1: float activations against dequantized weights (types with
                      // to_float; the file's layouts only), no 8-bit rounding; 0: normal
    sd_mm_next next;  // optional hint for the next run; every run consumes (clears) it
    void *abuf;       // optional: room for activations converted ahead (sd_mm_act)
    size_t abuf_size; // bytes
} sd_mm_ctx;
// Bytes of ctx->wbuf a call with these arguments needs.
size_t sd_matmul_wsize(int wtype, int64_t n_in, int64_t n_tok);
// Batched matrix multiply: y[t][r] = sum_k W[r][k] * x[t][k] for t < n_tok,
// r < n_out. W has type wtype with rows of n_in elements (ne[0] = n_in).
// x is (n_tok, n_in) float, y is (n_tok, n_out) float. Activations are
// converted to the vec_dot_type once per call; every weight block is read once
// for the whole batch; threads of the pool split the output rows.
void sd_matmul(sd_mm_ctx *ctx, int wtype, const void *W, int64_t n_in, int64_t n_out,
               const float *x, int64_t n_tok, float *y);
// Float weights (n_out rows of n_in) made ready for sd_matmul as type wtype
// (for heads and other matrices built at run time; a model's are repacked at
// load): returns the type to pass to sd_matmul -- wtype's repacked form when
// this CPU's kernels have one, else wtype -- and writes the rows to dst
// (sd_row_size(wtype, n_in) * n_out bytes) in that type's layout. wtype
// must have a from_float; F32 is copied. Without memory for a temporary copy
// the file layout is written (and wtype returned).
int sd_matmul_weights(int wtype, const float *w, int64_t n_in, int64_t n_out, void *dst);
// Produces input rows [t0, t1) of a sd_matmul_multi's x (e.g. the residual add
// and RMSNorm before Q, K, V). Must give each row the same bits whatever t0, t1.
typedef void (*sd_mm_pre_fn)(void *arg, int64_t t0, int64_t t1);
// Element-wise step over the columns [r0, r1) of the outputs of a
// sd_matmul_multi (all tokens); must give each element the same bits whatever
// r0, r1.
typedef void (*sd_mm_post_fn)(void *arg, int64_t r0, int64_t r1);
// Step over the columns [r0, r1) of matrix m's output (all tokens), e.g.
// RoPE on Q and K; must give each element the same bits whatever r0, r1.
typedef void (*sd_mm_rows_fn)(void *arg, int m, int64_t r0, int64_t r1);
// Work done inside a sd_matmul_multi's pool run (fields may be NULL):
//  - pre(pre_arg, t0, t1) before the multiply: the threads' token ranges
//    partition [0, n_tok) and every thread waits until all rows are ready;
//  - post(post_arg, r0, r1) after it, on the rows [r0, r1) a thread computed
//    of every matrix (the ranges partition [0, n_out); all n_out must be
//    equal, e.g. gate and up followed by SwiGLU), without a barrier;
//  - rows(rows_arg, m, r0, r1) (runs without post) after a thread computed
//    rows [r0, r1) of matrix m, on those rows: whoever computed an output
//    also finishes it, while it is in that core's cache;
//  - after(after_arg, ith, nth) once all threads are done with all of the
//    above (a barrier), on every thread of the pool (n_tok >= 1): work that
//    needs every output (e.g. the attention after Q, K, V), without a new
//    pool run;
//  - align (0: 16): the threads' row ranges start at multiples of it (a
//    multiple of 16), e.g. the block size of a conversion the post hook does;
//  - act: the input was converted ahead (sd_mm_act; x may be NULL, pre must
//    be NULL, all types equal).
// The result has the same bits as pre(pre_arg, 0, n_tok), the multiply, then
// post(post_arg, 0, n_out) or rows(rows_arg, m, 0, n_out[m]) for every m,
// then after(after_arg, ith, nth) on the pool's threads.
typedef struct sd_mm_hooks {
    sd_mm_pre_fn pre;
    void *pre_arg;
    sd_mm_post_fn post;
    void *post_arg;
    sd_mm_rows_fn rows;
    void *rows_arg;
    sd_task_fn after;
    void *after_arg;
    int64_t align;
    const struct sd_mm_act *act;
} sd_mm_hooks;
// Several matrices applied to the same x (e.g. Q, K and V): matrix m has type
// wtypes[m], rows of n_in elements, n_out[m] rows, and its result goes to
// y[m], (n_tok, n_out[m]) float. When all types are equal, x is converted once
// and one pool run computes all of them (the threads split each matrix's
// rows), else it is one sd_matmul per matrix. 1 <= n_mats <= 4. Every y[m]
// has the same bits as sd_matmul(ctx, wtypes[m], W[m], ...) would give.
// hooks may be NULL.
void sd_matmul_multi(sd_mm_ctx *ctx, int n_mats, const int *wtypes, const void *const *W, int64_t n_in,
                     const int64_t *n_out, const float *x, int64_t n_tok, float *const *y, const sd_mm_hooks *hooks);
// Activations converted ahead of their matmul: whoever produces columns of
// the input x converts them with sd_mm_act_put as it goes (e.g. each thread
// its own columns, while they are in its cache, instead of every thread
// reading the others' floats in the matmul's preparation), then
// sd_matmul_multi with hooks->act multiplies without a conversion step. The
// outputs have the same bits as with x itself.
typedef struct sd_mm_act {
    int wtype;             // the weight type they are converted for
    int64_t n_in, n_tok;
    int64_t blk;           // put's column ranges start at multiples of this (elements)
    void *buf;             // n_tok rows of row_bytes, in ctx->abuf
    size_t row_bytes;
    sd_act_pack_fn pack;   // the weight type's packer, or NULL:
    sd_from_float_fn quant; // rows of its vec_dot_type (blocks of blk elements, qbytes each)
    size_t qbytes;
} sd_mm_act;
// Sets a up for a matmul of weight type wtype over n_tok rows of n_in
// elements in ctx->abuf (so the run whose hooks fill it must not read it:
// its own input is in wbuf). Returns 0, or -1 when that matmul takes no
// converted activations (float activations: ctx->act_f32 or a float
// vec_dot_type; no abuf or too small): then give it x as floats.
int sd_mm_act_begin(sd_mm_ctx *ctx, sd_mm_act *a, int wtype, int64_t n_in, int64_t n_tok);
// Converts columns [c0, c1) of token t (x: the token's n_in floats); c0 a
// multiple of a->blk, c1 too or n_in. Calls on disjoint ranges may run in
// parallel. Every column of every token must be put before the run that reads them.
void sd_mm_act_put(const sd_mm_act *a, const float *x, int64_t t, int64_t c0, int64_t c1);
// Same, scalar reference path (for tests).
void sd_matmul_ref(int wtype, const void *W, int64_t n_in, int64_t n_out,
                   const float *x, int64_t n_tok, float *y);

#endif
