// ops.h - internal: the layers of draft-head training (docs/heads.md), each a
// forward / backward pair over float rows (house rule 13).
//
// Conventions. Matrices are row-major. A weight W of the head is (n_out,
// n_in): n_out rows of n_in floats, y = W x reads one row per output (the
// layout of sd_head_tensor). "Rows" are the positions of a sequence (or of
// one training-time-test step). Backward functions ADD into the gradients of
// their inputs (dX +=, dW +=), so a tensor that feeds several consumers
// collects their gradients by being passed to each; where a backward
// overwrites instead, its contract says so.
//
// Determinism (house rule 13): every output element is a sum in a fixed
// order that depends on the shapes only, never on how the threads split the
// work, so the results have the same bits for any pool size. The matrix
// products and the row-wise ops that run on the pool split over output rows
// or output columns, never over a summed dimension.
//
// Every vectorised kernel (AVX2 + FMA) has the plain C version beside it
// (house rule 11): sd_tr_gemm_ref is the definition of the products, and the
// element-wise kernels are written with vmath.h's vf, whose one-lane build
// (no AVX2) is the scalar fallback. tests/train/test_train_ops.c compares them and
// checks every backward against finite differences.
#ifndef SD_TRAIN_OPS_H
#define SD_TRAIN_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/threadpool.h"

// a * b + c in one rounding where the CPU fuses it (the vector lanes do,
// so a vector loop's scalar tail matches its lanes); plain otherwise (a
// build without FMA would emulate fmaf in software, a hundred times slower).
#if defined(__FMA__)
#define SD_FMAF(a, b, c) fmaf(a, b, c)
#else
#define SD_FMAF(a, b, c) ((a) * (b) + (c))
#endif

// ---------------------------------------------------------------- context

// Blocking of the matrix products (floats): a thread packs MC x KC of A
// (L2) and KC x NR of B (one panel, L1) at a time; the register tile is MR x NR.
#define SD_TR_MR 6
#define SD_TR_NR 16
#define SD_TR_MC 264
#define SD_TR_KC 320

// What the ops need beyond their operands: the pool and each thread's
// packing space, allocated once (house rule 3).
typedef struct sd_tr_ctx {
    sd_pool *pool;           // NULL: the caller's thread alone
    int nth;                 // threads of pool (1 for NULL)
    float *pack;             // (nth, SD_TR_PACK_FLOATS) packing space of each thread
} sd_tr_ctx;
#define SD_TR_PACK_FLOATS ((size_t)SD_TR_MC * SD_TR_KC + (size_t)SD_TR_KC * SD_TR_NR)

// Allocates ctx's packing space for pool's threads (pool may be NULL; it is
// borrowed, not referenced). Returns 0 or <0 with a message.
int sd_tr_ctx_init(sd_tr_ctx *ctx, sd_pool *pool, char *err, size_t errlen);
void sd_tr_ctx_free(sd_tr_ctx *ctx);

// ---------------------------------------------------------------- matrix products

// C (M, N) = A (M, K) B (K, N), or C += A B when acc != 0. A and B are read
// through strides: A(i, k) = A[i * rsa + k * csa], B(k, j) = B[k * rsb + j *
// csb], so transposed operands need no copy. C is row-major with row stride
// ldc. Element (i, j) is the sum over k in equal blocks of at most SD_TR_KC
// (their size a function of K alone), each block
// summed in k order (fused multiply-adds) and added to C in block order.
// Splits C among ctx's threads by rows when M > N, else by columns (each
// thread packs all of the operand the split does not divide).
void sd_tr_gemm(const sd_tr_ctx *ctx, int M, int N, int K, const float *A, long rsa, long csa, const float *B,
                long rsb, long csb, float *C, long ldc, int acc);
// The definition: the plain triple loop, summed in double, one thread.
void sd_tr_gemm_ref(int M, int N, int K, const float *A, long rsa, long csa, const float *B, long rsb, long csb,
                    float *C, long ldc, int acc);

// The three products of a linear layer y = W x over n rows.
// Forward: Y (n, n_out) = X (n, n_in) W^T  (acc: Y +=).
void sd_tr_linear(const sd_tr_ctx *ctx, int n, int n_in, int n_out, const float *X, const float *W, float *Y,
                  int acc);
// Backward to the input: dX (n, n_in) += dY (n, n_out) W.
void sd_tr_linear_dx(const sd_tr_ctx *ctx, int n, int n_in, int n_out, const float *dY, const float *W, float *dX);
// Backward to the weight: dW (n_out, n_in) += dY^T X.
void sd_tr_linear_dw(const sd_tr_ctx *ctx, int n, int n_in, int n_out, const float *dY, const float *X, float *dW);

// ---------------------------------------------------------------- element-wise layers (one thread)

// RMSNorm with gain over n rows of d: Y = X * rstd * g, rstd = 1 / sqrt(mean(X^2) + eps)
// per row (saved for the backward, (n)). g may be NULL (gain 1).
void sd_tr_rmsnorm(int n, int d, const float *X, const float *g, float eps, float *Y, float *rstd);
// dX (n, d) += the gradient through the norm of dY; dg (d) += sum over rows of
// dY * X * rstd (dg NULL: not wanted; g NULL: gain 1).
void sd_tr_rmsnorm_bwd(int n, int d, const float *X, const float *g, const float *rstd, const float *dY, float *dX,
                       float *dg);

// RoPE table: cs (n_pos, hd/2, 2) the (cos, sin) of pos * theta_i,
// theta_i = base^(-2i/hd) (computed in double, as the inference forward does).
void sd_tr_rope_table(float *cs, int n_pos, int hd, float base);
// The same for positions p0 .. p0 + n_pos - 1 (entry p: position p0 + p).
void sd_tr_rope_table_at(float *cs, int p0, int n_pos, int hd, float base);
// Rotates X (n, n_h, hd) in place: the pair (2i, 2i+1) of every head of row r
// turns by the angle of position pos[r] (cs from sd_tr_rope_table, covering
// every pos); neox != 0: the pair (i, i + hd/2) instead (NEOX, Qwen2).
// inverse != 0 turns back (the transpose): the backward of RoPE applied to a
// gradient, in place.
void sd_tr_rope(int n, int n_h, int hd, const int32_t *pos, const float *cs, float *X, int inverse, int neox);

// SwiGLU: S = silu(G) * U over n elements, silu(x) = x / (1 + e^-x).
void sd_tr_swiglu(size_t n, const float *G, const float *U, float *S);
// dG = dS * U * silu'(G), dU = dS * silu(G) (both OVERWRITTEN).
void sd_tr_swiglu_bwd(size_t n, const float *G, const float *U, const float *dS, float *dG, float *dU);
// Y = silu(X) (Medusa's residual block), and dX += dY * silu'(X).
void sd_tr_silu(size_t n, const float *X, float *Y);
void sd_tr_silu_bwd(size_t n, const float *X, const float *dY, float *dX);

// Residual adds: Y = A + B; Y += X.
void sd_tr_add(size_t n, const float *A, const float *B, float *Y);
void sd_tr_acc(size_t n, const float *X, float *Y);

// ---------------------------------------------------------------- attention

// Which keys each query may see, as compressed rows, and the transpose the
// backward needs. Entry e (0 <= e < nnz) is the pair (query i, key q_key[e])
// for q_off[i] <= e < q_off[i + 1]; a query's entries are its softmax's
// terms in order. k_ent lists the entries of each key: k_ent[k_off[j] ..
// k_off[j + 1]) in ascending order, k_q[x] the query of entry k_ent[x].
typedef struct sd_tr_mask {
    int n_q, n_k;
    const int32_t *q_off;    // (n_q + 1)
    const int32_t *q_key;    // (nnz) key rows in [0, n_k)
    const int32_t *k_off;    // (n_k + 1)
    const int32_t *k_ent;    // (nnz)
    const int32_t *k_q;      // (nnz)
} sd_tr_mask;
// Fills k_off (n_k + 1), k_ent and k_q (nnz each, caller memory) from m's
// query side and points m at them.
void sd_tr_mask_transpose(sd_tr_mask *m, int32_t *k_off, int32_t *k_ent, int32_t *k_q);

// EAGLE-3's training-time test (docs/heads.md) as masks, one per step k of
// a sequence of T positions. Step k has rows j = 1 .. T-1-k
// (sd_tr_ttt_rows(T, k) = max(0, T-1-k) of them, row r <-> j = r + 1), and
// the rows of all steps are numbered step after step (step k's first row is
// sd_tr_ttt_off(T, k)). Step k's query r sees the keys of step 0's rows
// 0..r (causal), then those of row r in steps 1..k (its own draft chain, in
// step order). sd_tr_mask_ttt fills q_off (rows + 1) and q_key (at most
// (r+1) + k per row) with step k's mask over the keys of steps 0..k (global
// row numbers: n_k = sd_tr_ttt_off(T, k + 1)) and returns the entry count.
int sd_tr_ttt_rows(int T, int k);
int sd_tr_ttt_off(int T, int k);
int sd_tr_mask_ttt(int T, int k, int32_t *q_off, int32_t *q_key);

// Attention over m: Q (n_q, n_head*hd), K, V (n_k, n_kv*hd); head h reads
// KV head h / (n_head / n_kv) (GQA). For query i and head h: scores
// q.k * scale (scale = 1/sqrt(hd)) over the keys it may see, softmax, O row
// = the probabilities times those V rows. P (n_head, nnz) keeps the
// probabilities for the backward. A query with no keys gets O = 0. Split
// over queries among ctx's threads.
void sd_tr_attn(const sd_tr_ctx *ctx, const sd_tr_mask *m, int n_head, int n_kv, int hd, const float *Q,
                const float *K, const float *V, float *O, float *P);
// Backward: dQ (n_q, n_head*hd) OVERWRITTEN; dK, dV (n_k, n_kv*hd) +=.
// dS (n_head, nnz) is scratch (the gradient of the scores). Two passes: over
// queries (dS, dQ), then over keys (dK, dV), each key summing its entries
// in ascending order.
void sd_tr_attn_bwd(const sd_tr_ctx *ctx, const sd_tr_mask *m, int n_head, int n_kv, int hd, const float *Q,
                    const float *K, const float *V, const float *P, const float *dO, float *dQ, float *dK, float *dV,
                    float *dS);

// ---------------------------------------------------------------- output: soft cross-entropy

// Soft cross-entropy of n rows of logits L (n, V) against sparse targets:
// row r's target puts mass tp[r*nt + i] on class tid[r*nt + i] (tid -1: an
// unused entry; masses need not sum to 1, they are renormalised over the
// used entries). Row loss = logsumexp(L_r) - sum_i p_i L_r[tid_i]; a row
// whose target has no mass is skipped (loss_row exactly -1, gradient 0). When dL
// is non-NULL it receives w * (softmax(L_r) - p) (dL may be L: in place).
// argmax (n, or NULL) receives each row's largest logit's class (the first
// of ties). Rows split among ctx's threads. Returns the sum of the scored
// rows' losses (in row order, double) and *n_scored (may be NULL).
double sd_tr_softxent(const sd_tr_ctx *ctx, int n, int V, const float *L, const int32_t *tid, const float *tp,
                      int nt, float w, float *dL, float *loss_row, int32_t *argmax, int *n_scored);

#endif
