// matmul.c - the batched matrix multiply y = x W^T over quantized weights.
//
// One call, one sd_pool_run, for one matrix (sd_matmul) or several that share
// the input and the weight type (sd_matmul_multi: Q, K, V; gate and up, with
// a post hook applying SwiGLU in the same run): fewer, fatter pool runs, and
// the activations converted once. (1) The n_tok input rows are produced (the
// pre hook, e.g. residual add + RMSNorm) and converted to the weight type's
// activation format (into ctx->wbuf): by the calling thread before the run
// for batches below SD_MM_PAR_PRE_MIN_TOK (no barrier inside the run), else by
// all threads, each a share of the tokens, followed by a spin-then-yield
// barrier; (2) the threads split the output rows of each matrix among
// themselves in chunks of SD_MM_ROW_ALIGN rows, and each thread runs the
// type's tile kernel (gemm) over its rows for all tokens (then the post or
// rows hook on them, while they are in its cache), so
// every weight block is read from memory once for the whole batch. Types
// without a tile kernel fall back to one vec_dot per (row, token).
//
// Batch invariance: y[t][r] has the same bits whatever n_tok, the place of
// token t in the batch and the number of threads. The conversion of a token
// does not depend on the others, and the tile kernels (kernels_x86.c,
// kernels_avx2.c, quant_k_x86.c, quant_k_avx2.c) run the same float
// operations for every (row, token) in every tile shape; the vec_dot
// fallback is per (row, token) anyway. Checked by
// tests/kernels/test_quant_legacy.c, tests/kernels/test_quant_k.c and tests/runtime/test_batch_invariance.c.
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/matmul.h"

// Row chunks given to threads are multiples of this (the panel height of the
// legacy-quant kernels, a multiple of the K-quant tiles' 4), so no panel
// straddles two threads.
#define SD_MM_ROW_ALIGN 16

// Batches of at least this many tokens use the activation packer of the
// weight type (if any), whose rows feed the tile kernel without per-token
// shuffling; smaller batches use plain vec_dot_type rows. 1 (always pack):
// on hot caches the fused 1-token path is faster, but on weights streamed
// from memory (the normal case of a forward) the packed (panel) path is.
// Must stay 1: the packed and the fused paths give different bits, and a
// token must get the same bits alone as in a batch (batch invariance).
#define SD_MM_PACK_MIN_TOK 1

// Batches of at least this many tokens are prepared (pre hook) and converted
// by all threads of the pool (then a barrier); smaller ones by the calling
// thread alone. Measured on the default model, 2 threads: at 16 tokens the
// serial preparation was a tenth of a forward.
#define SD_MM_PAR_PRE_MIN_TOK 4

// quant.c (internal): fastest quantizer into activation format t, and the
// activation packer of weight type t (NULL if none; dst NULL returns the size).
sd_from_float_fn sd_quant_act_quantizer(int t);
sd_act_pack_fn sd_quant_act_packer(int t);

// Most matrices one sd_matmul_multi call takes.
#define SD_MM_MULTI_MAX 4

typedef struct {
    // input rows and their conversion, before the multiply
    const float *x;          // (n_tok, n_in) input activations
    sd_mm_pre_fn pre;        // produces rows of x first, or NULL
    void *pre_arg;
    sd_from_float_fn quant;  // plain conversion, or NULL when pack is used (or no conversion)
    sd_act_pack_fn pack;     // packed conversion, or NULL
    int pre_in_task;         // 1: the pool threads prepare and convert (larger batches), 0: done before the run
    atomic_int n_pre_done;   // threads done with that (a one-shot barrier)
    atomic_int n_rows_done;  // threads done with their rows and hooks (the barrier before after)
    sd_task_fn after;        // NULL, or run on every thread once all rows are done
    void *after_arg;
    const sd_type_traits *tr;
    sd_mm_post_fn post;      // NULL, or: all n_out equal, a thread computes the same rows of every matrix, then post
    void *post_arg;
    sd_mm_rows_fn rows;      // NULL, or (without post) called on each range of a matrix's rows a thread computed
    void *rows_arg;
    int n_mats;                        // matrices sharing x and the weight type (1..SD_MM_MULTI_MAX)
    const void *W[SD_MM_MULTI_MAX];    // (n_out[i], w_row_bytes) each
    int64_t n_out[SD_MM_MULTI_MAX];    // rows of each matrix
    float *y[SD_MM_MULTI_MAX];         // (n_tok, n_out[i]) each
    size_t w_row_bytes;
    int64_t n_in;
    const void *xq;   // (n_tok, x_row_bytes) activations in vec_dot_type
    size_t x_row_bytes;
    int64_t n_tok;
    int64_t align;    // thread row ranges start at multiples of this (SD_MM_ROW_ALIGN or hooks->align)
    int f32;          // 1: x stays float, each weight row is dequantized (ctx->act_f32)
    int f32_level;    // then the kernel family's version (sd_quant_simd_level)
    sd_mm_next next;  // the next run's weights (a prefetch hint), W NULL if unknown
} mm_job;

// ---- float activations (ctx->act_f32) -------------------------------------
// Weight rows are dequantized (type's to_float) RF at a time, then every
// (row, token) dot runs in 16 float lanes over the row in order and ends with
// a fixed tree over the lanes: the same operations whatever the tile, so the
// result does not depend on the batch either.
#ifndef SD_F32_RF
#define SD_F32_RF 4            // rows per tile
#endif
#ifndef SD_F32_TF
#define SD_F32_TF 4            // tokens per tile
#endif
#define SD_F32_MAX_IN 16384    // longest row (the row buffers live on the stack)
#ifndef SD_F32_R2
#define SD_F32_R2 4            // AVX2: rows per register tile (times SD_F32_TF tokens; 4: 15% faster than 2)
#endif

static float lanes16_sum(float *a) {
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) a[l] += a[l + w];
    return a[0];
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

// y[t * ldy + r] for R rows (wrow[r], n floats) and T tokens (x + t * n),
// one version per kernel family (sd_quant_simd_level: the family installed);
// an AVX-512 build has all three, so any host runs the ones it can.
#define F32_TILE_FN static inline __attribute__((always_inline)) void
#if defined(__AVX512F__)
F32_TILE_FN f32_tile_avx512(int R, int T, const float *const *wrow, const float *x, int64_t n, float *y, int64_t ldy) {
    __m512 acc[SD_F32_RF][SD_F32_TF];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 xv[SD_F32_TF];
        for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(x + t * n + k);
        for (int r = 0; r < R; r++) {
            __m512 wv = _mm512_loadu_ps(wrow[r] + k);
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    const __mmask16 km = (__mmask16)((1u << (n - k)) - 1);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            if (k < n)
                acc[r][t] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, wrow[r] + k), _mm512_maskz_loadu_ps(km, x + t * n + k),
                                            acc[r][t]);
            float l[16];
            _mm512_storeu_ps(l, acc[r][t]);
            y[t * ldy + r] = lanes16_sum(l);
        }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
F32_TILE_FN f32_tile_avx2(int R, int T, const float *const *wrow, const float *x, int64_t n, float *y, int64_t ldy) {
    // the 16 lanes as two halves of 8, which never mix before lanes16_sum:
    // lanes 0-7 take k = 16i + 0..7, lanes 8-15 k = 16i + 8..15, one FMA each
    float l[SD_F32_RF][SD_F32_TF][16];
    const int64_t nv = n / 16 * 16;
    for (int h = 0; h < 2; h++)
        for (int r0 = 0; r0 < R; r0 += SD_F32_R2) {
            const int R2 = SD_MIN(SD_F32_R2, R - r0);
            __m256 acc[SD_F32_R2][SD_F32_TF];
            for (int r = 0; r < R2; r++)
                for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
            for (int64_t k = 8 * h; k < nv; k += 16) {
                __m256 xv[SD_F32_TF];
                for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + t * n + k);
                for (int r = 0; r < R2; r++) {
                    const __m256 wv = _mm256_loadu_ps(wrow[r0 + r] + k);
                    for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
                }
            }
            for (int r = 0; r < R2; r++)
                for (int t = 0; t < T; t++) _mm256_storeu_ps(l[r0 + r][t] + 8 * h, acc[r][t]);
        }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            for (int64_t k = nv; k < n; k++) l[r][t][k % 16] = fmaf(wrow[r][k], x[t * n + k], l[r][t][k % 16]);
            y[t * ldy + r] = lanes16_sum(l[r][t]);
        }
}
#endif

F32_TILE_FN f32_tile_c(int R, int T, const float *const *wrow, const float *x, int64_t n, float *y, int64_t ldy) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float l[16] = {0};
            for (int64_t k = 0; k < n; k++) l[k % 16] += wrow[r][k] * x[t * n + k];
            y[t * ldy + r] = lanes16_sum(l);
        }
}

// The tile of level lv (a constant where this is inlined).
F32_TILE_FN f32_tile(const int lv, int R, int T, const float *const *wrow, const float *x, int64_t n, float *y,
                     int64_t ldy) {
#if defined(__AVX512F__)
    if (lv >= 2) {
        f32_tile_avx512(R, T, wrow, x, n, y, ldy);
        return;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (lv >= 1) {
        f32_tile_avx2(R, T, wrow, x, n, y, ldy);
        return;
    }
#endif
    (void)lv;
    f32_tile_c(R, T, wrow, x, n, y, ldy);
}

static inline __attribute__((always_inline)) void f32_rows_lv(const int lv, const void *W, size_t wrb,
                                                              sd_to_float_fn to_float, int64_t n_in, int64_t r0,
                                                              int64_t r1, const float *x, int64_t n_tok, float *y,
                                                              int64_t ldy) {
    float buf[SD_F32_RF][SD_F32_MAX_IN];
    for (int64_t r = r0; r < r1; r += SD_F32_RF) {
        const int R = (int)SD_MIN((int64_t)SD_F32_RF, r1 - r);
        const float *wrow[SD_F32_RF];
        for (int i = 0; i < R; i++) {
            to_float((const char *)W + (size_t)(r + i) * wrb, buf[i], n_in);
            wrow[i] = buf[i];
        }
        for (int64_t t = 0; t < n_tok; t += SD_F32_TF) {
            const int T = (int)SD_MIN((int64_t)SD_F32_TF, n_tok - t);
            if (R == SD_F32_RF && T == SD_F32_TF) // the full tile, with constant bounds
                f32_tile(lv, SD_F32_RF, SD_F32_TF, wrow, x + t * n_in, n_in, y + t * ldy + r, ldy);
            else
                f32_tile(lv, R, T, wrow, x + t * n_in, n_in, y + t * ldy + r, ldy);
        }
    }
}

// The float-activation rows of the kernel family installed (level: see
// sd_quant_simd_level; a level this build lacks takes the next one down).
static void f32_rows(int level, const void *W, size_t wrb, sd_to_float_fn to_float, int64_t n_in, int64_t r0,
                     int64_t r1, const float *x, int64_t n_tok, float *y, int64_t ldy) {
    if (level >= 2) f32_rows_lv(2, W, wrb, to_float, n_in, r0, r1, x, n_tok, y, ldy);
    else if (level == 1) f32_rows_lv(1, W, wrb, to_float, n_in, r0, r1, x, n_tok, y, ldy);
    else f32_rows_lv(0, W, wrb, to_float, n_in, r0, r1, x, n_tok, y, ldy);
}

// Rows [r0, r1) of matrix m of the job, all tokens.
static void mm_rows(const mm_job *j, int m, int64_t r0, int64_t r1) {
    if (r0 >= r1) return;
    const int64_t n_out = j->n_out[m];
    float *y = j->y[m];
    if (j->f32) {
        f32_rows(j->f32_level, j->W[m], j->w_row_bytes, j->tr->to_float, j->n_in, r0, r1, j->x, j->n_tok, y, n_out);
        return;
    }
    if (j->tr->gemm) {
        j->tr->gemm(j->n_in, j->W[m], j->w_row_bytes, r0, r1, j->xq, j->x_row_bytes, j->n_tok, y, n_out);
        return;
    }
    sd_vec_dot_fn dot = j->tr->vec_dot;
    for (int64_t r = r0; r < r1; r++) {
        const char *w = (const char *)j->W[m] + (size_t)r * j->w_row_bytes;
        for (int64_t t = 0; t < j->n_tok; t++)
            y[t * n_out + r] = dot(j->n_in, w, (const char *)j->xq + (size_t)t * j->x_row_bytes);
    }
}

// Prepares (pre hook) and converts activation rows [t0, t1) of the job.
static void mm_prepare(const mm_job *j, long t0, long t1) {
    if (t0 >= t1) return;
    if (j->pre) j->pre(j->pre_arg, t0, t1);
    for (long t = t0; t < t1; t++) {
        if (j->pack) j->pack(j->x + t * j->n_in, (void *)j->xq, j->n_in, t, j->n_tok, 0, j->n_in / SD_QK);
        else if (j->quant) j->quant(j->x + t * j->n_in, (char *)j->xq + (size_t)t * j->x_row_bytes, j->n_in);
    }
}

// Most bytes of a thread's next share read ahead while it waits: enough for
// a few microseconds of hand-over at full bandwidth; small against L2.
#define SD_MM_PF_MAX (64 << 10)

// Thread ith's rows [*r0, *r1) of a matrix of n_out rows: its part of the
// matrix's chunks of align rows, counted from thread rot (the threads that
// took the extra chunk of earlier matrices come last; rot 0 for the first).
static void mm_range(int64_t n_out, int64_t align, int rot, int ith, int nth, int64_t *r0, int64_t *r1) {
    long lo, hi;
    sd_split_range((long)((n_out + align - 1) / align), (ith + nth - rot) % nth, nth, &lo, &hi);
    *r0 = (int64_t)lo * align;
    *r1 = SD_MIN((int64_t)hi * align, n_out);
}

// Sets this thread's read-ahead window to the start of its share of the
// matrix nx (none if nx->W is NULL).
static void mm_read_ahead(const sd_mm_next *nx, int ith, int nth) {
    int64_t r0 = 0, r1 = 0;
    if (nx->W) mm_range(nx->n_out, SD_MM_ROW_ALIGN, 0, ith, nth, &r0, &r1);
    const size_t bytes = r1 > r0 ? (size_t)(r1 - r0) * nx->wrb : 0;
    sd_pool_prefetch(bytes ? (const char *)nx->W + (size_t)r0 * nx->wrb : NULL, SD_MIN(bytes, (size_t)SD_MM_PF_MAX));
}

static void mm_task_rows(mm_job *j, int ith, int nth);

// Adds this thread to *count, then waits (reading ahead) until all nth have.
static void mm_barrier(atomic_int *count, int nth) {
    atomic_fetch_add_explicit(count, 1, memory_order_acq_rel);
    sd_pool_wait_until(count, nth);
}

static void mm_task(void *arg, int ith, int nth) {
    mm_job *j = arg;
    mm_task_rows(j, ith, nth);
    if (j->after) {
        if (nth > 1) mm_barrier(&j->n_rows_done, nth);
        j->after(j->after_arg, ith, nth);
    }
    mm_read_ahead(&j->next, ith, nth); // consumed while this thread waits for the next run
}

static void mm_task_rows(mm_job *j, int ith, int nth) {
    if (j->pre_in_task) {
        // while waiting for the others' rows: the start of our own weights
        const sd_mm_next cur = {.W = j->W[0], .n_out = j->n_out[0], .wrb = j->w_row_bytes};
        mm_read_ahead(&cur, ith, nth);
        long t0, t1;
        sd_split_range((long)j->n_tok, ith, nth, &t0, &t1);
        mm_prepare(j, t0, t1);
        mm_barrier(&j->n_pre_done, nth);
    }
    // Each matrix's row chunks are split evenly (the matrices share the
    // weight type and n_in, so a chunk costs the same in all of them): each
    // thread gets its part of every matrix, and of whatever the rows hook
    // does with them. With a post hook (all n_out equal) a thread takes the
    // same rows of every matrix, then applies post to them. (Measured:
    // handing chunks out dynamically, through atomic counters, was no faster.)
    int rot = 0;
    int64_t p0 = 0, p1 = 0;
    for (int m = 0; m < j->n_mats; m++) {
        int64_t r0, r1;
        mm_range(j->n_out[m], j->align, j->post ? 0 : rot, ith, nth, &r0, &r1);
        rot = (int)((rot + (j->n_out[m] + j->align - 1) / j->align) % nth);
        if (m == 0) p0 = r0, p1 = r1;
        if (r0 >= r1) continue;
        mm_rows(j, m, r0, r1);
        if (j->rows) j->rows(j->rows_arg, m, r0, r1);
    }
    if (j->post && p0 < p1) j->post(j->post_arg, p0, p1);
}

// True if activations are used as float without conversion.
static int act_is_f32(int vdt) { return vdt == SD_TYPE_F32; }

size_t sd_matmul_wsize(int wtype, int64_t n_in, int64_t n_tok) {
    const sd_type_traits *tr = sd_type_get(wtype);
    if (!tr || !tr->supported || act_is_f32(tr->vec_dot_type)) return 0;
    size_t rb = sd_row_size(tr->vec_dot_type, n_in);
    sd_act_pack_fn pack = sd_quant_act_packer(wtype);
    if (pack) rb = SD_MAX(rb, pack(NULL, NULL, n_in, 0, 1, 0, 0));
    return (size_t)n_tok * rb + 64; // + 64: alignment of the buffer start
}

// The conversion of n_tok activation rows of n_in elements for a matmul of
// weight type wtype (a non-float vec_dot_type): the type's packer, or else
// the vec_dot_type's quantizer, and the bytes per row. Returns where the rows
// go, the 64-byte aligned start of mem (size bytes), or NULL if they do not
// fit there.
static void *act_format(void *mem, size_t size, int wtype, int64_t n_in, int64_t n_tok, sd_act_pack_fn *pack,
                        sd_from_float_fn *quant, size_t *row_bytes) {
    const int vdt = sd_type_get(wtype)->vec_dot_type;
    *pack = n_tok >= SD_MM_PACK_MIN_TOK ? sd_quant_act_packer(wtype) : NULL;
    *quant = *pack ? NULL : sd_quant_act_quantizer(vdt);
    *row_bytes = *pack ? (*pack)(NULL, NULL, n_in, 0, 1, 0, 0) : sd_row_size(vdt, n_in);
    if (!mem || size < 64) return NULL;
    char *buf = (char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    return size - (size_t)(buf - (char *)mem) >= (size_t)n_tok * *row_bytes ? buf : NULL;
}

// Common body of sd_matmul and sd_matmul_multi: n_mats matrices of type
// wtype with rows of n_in elements, all applied to the same x, or to
// activations already converted (hooks->act).
static void matmul_run(sd_mm_ctx *ctx, int wtype, int n_mats, const void *const *W, int64_t n_in,
                       const int64_t *n_out, const float *x, int64_t n_tok, float *const *y,
                       const sd_mm_hooks *hooks) {
    const sd_mm_act *act = hooks ? hooks->act : NULL;
    const sd_type_traits *tr = sd_type_get(wtype);
    SD_ASSERT(tr && tr->supported && n_in % tr->blck == 0 && n_mats >= 1 && n_mats <= SD_MM_MULTI_MAX);
    sd_mm_next next = {0};
    if (ctx) { // the hint is for this run only
        next = ctx->next;
        ctx->next.W = NULL;
    }
    if (n_tok <= 0) return;
    mm_job j = {.next = next, .x = x, .tr = tr, .n_mats = n_mats, .w_row_bytes = sd_row_size(wtype, n_in), .n_in = n_in,
                .xq = x, .x_row_bytes = (size_t)n_in * sizeof(float), .n_tok = n_tok, .align = SD_MM_ROW_ALIGN};
    if (hooks) {
        j.pre = hooks->pre;
        j.pre_arg = hooks->pre_arg;
        j.post = hooks->post;
        j.post_arg = hooks->post_arg;
        j.rows = hooks->post ? NULL : hooks->rows;
        j.rows_arg = hooks->rows_arg;
        j.after = hooks->after;
        j.after_arg = hooks->after_arg;
        if (hooks->align > 0) {
            SD_ASSERT(hooks->align % SD_MM_ROW_ALIGN == 0);
            j.align = hooks->align;
        }
    }
    long nc = 0; // row chunks in all
    for (int m = 0; m < n_mats; m++) {
        j.W[m] = W[m];
        j.n_out[m] = n_out[m] > 0 ? n_out[m] : 0;
        j.y[m] = y[m];
        nc += (long)((j.n_out[m] + SD_MM_ROW_ALIGN - 1) / SD_MM_ROW_ALIGN);
    }
    atomic_init(&j.n_pre_done, 0);
    atomic_init(&j.n_rows_done, 0);
    int vdt = tr->vec_dot_type;
    // float activations: x is used as it is, no conversion
    j.f32 = !act && ctx && ctx->act_f32 && tr->to_float && n_in <= SD_F32_MAX_IN;
    j.f32_level = j.f32 ? sd_quant_simd_level() : 0;
    if (act) {
        SD_ASSERT(act->wtype == wtype && act->n_in == n_in && act->n_tok == n_tok && !j.pre);
        j.xq = act->buf;
        j.x_row_bytes = act->row_bytes;
    } else if (!j.f32 && !act_is_f32(vdt)) {
        sd_act_pack_fn pack;
        sd_from_float_fn quant;
        size_t xrb;
        j.xq = act_format(ctx ? ctx->wbuf : NULL, ctx ? ctx->wbuf_size : 0, wtype, n_in, n_tok, &pack, &quant, &xrb);
        SD_ASSERT(j.xq != NULL);
        j.pack = pack;
        j.quant = quant;
        j.x_row_bytes = xrb;
    }
    // Small batches are prepared and converted here, by the caller (a few
    // us), which saves the threads a barrier; larger ones by all threads.
    if (nc > 0 && n_tok >= SD_MM_PAR_PRE_MIN_TOK && (j.pre || j.quant || j.pack) && ctx && ctx->pool &&
        sd_pool_size(ctx->pool) > 1)
        j.pre_in_task = 1;
    else
        mm_prepare(&j, 0, (long)n_tok);
    if (nc == 0) {
        if (j.after) sd_pool_run(ctx ? ctx->pool : NULL, j.after, j.after_arg);
        return;
    }
    sd_pool_run(ctx ? ctx->pool : NULL, mm_task, &j);
}

void sd_matmul(sd_mm_ctx *ctx, int wtype, const void *W, int64_t n_in, int64_t n_out,
               const float *x, int64_t n_tok, float *y) {
    matmul_run(ctx, wtype, 1, &W, n_in, &n_out, x, n_tok, &y, NULL);
}

void sd_matmul_multi(sd_mm_ctx *ctx, int n_mats, const int *wtypes, const void *const *W, int64_t n_in,
                     const int64_t *n_out, const float *x, int64_t n_tok, float *const *y, const sd_mm_hooks *hooks) {
    SD_ASSERT(n_mats >= 1 && n_mats <= SD_MM_MULTI_MAX);
    int same = 1;
    for (int m = 1; m < n_mats; m++) {
        same = same && wtypes[m] == wtypes[0];
        SD_ASSERT(!(hooks && hooks->post) || n_out[m] == n_out[0]);
    }
    if (same) {
        matmul_run(ctx, wtypes[0], n_mats, W, n_in, n_out, x, n_tok, y, hooks);
        return;
    }
    // Mixed types: the activations need one conversion per type anyway.
    SD_ASSERT(!(hooks && hooks->act));
    if (n_tok <= 0) return;
    if (hooks && hooks->pre) hooks->pre(hooks->pre_arg, 0, n_tok);
    for (int m = 0; m < n_mats; m++) {
        sd_matmul(ctx, wtypes[m], W[m], n_in, n_out[m], x, n_tok, y[m]);
        if (hooks && !hooks->post && hooks->rows && n_out[m] > 0) hooks->rows(hooks->rows_arg, m, 0, n_out[m]);
    }
    if (hooks && hooks->post && n_out[0] > 0) hooks->post(hooks->post_arg, 0, n_out[0]);
    if (hooks && hooks->after) sd_pool_run(ctx ? ctx->pool : NULL, hooks->after, hooks->after_arg);
}

int sd_mm_act_begin(sd_mm_ctx *ctx, sd_mm_act *a, int wtype, int64_t n_in, int64_t n_tok) {
    memset(a, 0, sizeof(*a));
    const sd_type_traits *tr = sd_type_get(wtype);
    if (!ctx || !ctx->abuf || ctx->act_f32 || !tr || !tr->supported || n_tok <= 0 || n_in % tr->blck) return -1;
    const int vdt = tr->vec_dot_type;
    const sd_type_traits *vt = sd_type_get(vdt);
    if (act_is_f32(vdt) || !vt || vt->blck <= 0 || n_in % vt->blck) return -1;
    sd_act_pack_fn pack;
    sd_from_float_fn quant;
    size_t xrb;
    void *buf = act_format(ctx->abuf, ctx->abuf_size, wtype, n_in, n_tok, &pack, &quant, &xrb);
    if (!buf) return -1;
    *a = (sd_mm_act){.wtype = wtype, .n_in = n_in, .n_tok = n_tok, .blk = pack ? SD_QK : vt->blck, .buf = buf,
                     .row_bytes = xrb, .pack = pack, .quant = quant, .qbytes = vt->tsize};
    return 0;
}

void sd_mm_act_put(const sd_mm_act *a, const float *x, int64_t t, int64_t c0, int64_t c1) {
    SD_ASSERT(t >= 0 && t < a->n_tok && c0 >= 0 && c0 % a->blk == 0 && c1 <= a->n_in &&
              (c1 % a->blk == 0 || c1 == a->n_in));
    if (c0 >= c1) return;
    if (a->pack) {
        a->pack(x, a->buf, a->n_in, t, a->n_tok, c0 / SD_QK, c1 / SD_QK);
        return;
    }
    a->quant(x + c0, (char *)a->buf + (size_t)t * a->row_bytes + (size_t)(c0 / a->blk) * a->qbytes, c1 - c0);
}

void sd_matmul_ref(int wtype, const void *W, int64_t n_in, int64_t n_out,
                   const float *x, int64_t n_tok, float *y) {
    const sd_type_traits *tr = sd_type_get(wtype);
    SD_ASSERT(tr && tr->supported && n_in % tr->blck == 0);
    const sd_type_traits *vt = sd_type_get(tr->vec_dot_type);
    size_t wrb = sd_row_size(wtype, n_in), xrb = sd_row_size(tr->vec_dot_type, n_in);
    char *xq = malloc(xrb ? xrb : 1);
    SD_ASSERT(xq != NULL);
    for (int64_t t = 0; t < n_tok; t++) {
        vt->from_float(x + t * n_in, xq, n_in);
        for (int64_t r = 0; r < n_out; r++)
            y[t * n_out + r] = tr->vec_dot_ref(n_in, (const char *)W + (size_t)r * wrb, xq);
    }
    free(xq);
}

int sd_matmul_weights(int wtype, const float *w, int64_t n_in, int64_t n_out, void *dst) {
    const size_t rb = sd_row_size(wtype, n_in), n = rb * (size_t)n_out;
    if (wtype == SD_TYPE_F32) {
        memcpy(dst, w, n);
        return wtype;
    }
    const sd_type_traits *tr = sd_type_get(wtype);
    const int rt = sd_quant_repack_type(wtype, n_in);
    uint8_t *q = rt >= 0 ? malloc(n ? n : 1) : NULL;
    if (!q) { // no repacked form (or no memory for the temporary copy): the file layout
        for (int64_t r = 0; r < n_out; r++) tr->from_float(w + r * n_in, (uint8_t *)dst + (size_t)r * rb, n_in);
        return wtype;
    }
    for (int64_t r = 0; r < n_out; r++) tr->from_float(w + r * n_in, q + (size_t)r * rb, n_in);
    const int ok = sd_type_get(rt)->repack(q, dst, n_in, n_out) == 0;
    if (!ok) memcpy(dst, q, n); // the kernel refused these rows: the file layout
    free(q);
    return ok ? rt : wtype;
}
