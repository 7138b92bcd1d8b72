// test_matmul.c - sd_matmul_multi's hooks, activations converted ahead, and
// the pool's read-ahead window.
//
// The forward pass leans on these contracts (forward.c): the pre hook prepares
// every input row exactly once before any thread multiplies; the post hook and
// the rows hook see every output row exactly once, after it was computed; the
// after hook runs once on every thread, when all of that is done;
// the result has the same bits as one sd_matmul per matrix whatever the
// thread count; and a prefetch hint for the next run changes nothing but
// timing. Each is checked with no pool, 2 and 3 threads, one token and
// batches that straddle the 16-token tiles, one type and mixed types.
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/matmul.h"
#include "t.h"
#include "kernels/threadpool.h"

#define N_IN 256
#define MAX_TOK 19
#define MAX_OUT 200

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

typedef struct {
    const float *src;                // the rows pre produces: x = src + 1
    float *x;                        // the matmul's input
    int64_t n_tok;
    atomic_int pre_count[MAX_TOK];   // times pre produced each token
    atomic_int rows_count[3][MAX_OUT];
    atomic_int post_count[MAX_OUT];
    atomic_int bad_order;            // a hook saw rows not yet computed
    atomic_int after_calls[4];       // after() calls per thread
    atomic_int after_nth;            // the nth after() saw
    atomic_int after_early;          // after() ran before every output and hook was done
    int n_mats;
    float *const *y;
    const float *const *ref;         // expected outputs
    const int64_t *n_out;
} hook_state;

static void pre_fn(void *arg, int64_t t0, int64_t t1) {
    hook_state *h = arg;
    for (int64_t t = t0; t < t1; t++) {
        for (int i = 0; i < N_IN; i++) h->x[t * N_IN + i] = h->src[t * N_IN + i] + 1.0f;
        atomic_fetch_add(&h->pre_count[t], 1);
    }
}

static void rows_fn(void *arg, int m, int64_t r0, int64_t r1) {
    hook_state *h = arg;
    for (int64_t r = r0; r < r1; r++) {
        atomic_fetch_add(&h->rows_count[m][r], 1);
        for (int64_t t = 0; t < h->n_tok; t++)
            if (memcmp(&h->y[m][t * h->n_out[m] + r], &h->ref[m][t * h->n_out[m] + r], sizeof(float)))
                atomic_store(&h->bad_order, 1);
    }
}

static void post_fn(void *arg, int64_t r0, int64_t r1) {
    hook_state *h = arg;
    for (int64_t r = r0; r < r1; r++) {
        atomic_fetch_add(&h->post_count[r], 1);
        for (int m = 0; m < 2; m++)
            for (int64_t t = 0; t < h->n_tok; t++)
                if (memcmp(&h->y[m][t * h->n_out[m] + r], &h->ref[m][t * h->n_out[m] + r], sizeof(float)))
                    atomic_store(&h->bad_order, 1);
    }
}

static void after_fn(void *arg, int ith, int nth) {
    hook_state *h = arg;
    atomic_fetch_add(&h->after_calls[ith & 3], 1);
    atomic_store(&h->after_nth, nth);
    for (int m = 0; m < h->n_mats; m++) {
        for (int64_t i = 0; i < h->n_out[m] * h->n_tok; i++)
            if (memcmp(&h->y[m][i], &h->ref[m][i], sizeof(float))) atomic_store(&h->after_early, 1);
        for (int64_t r = 0; r < h->n_out[m]; r++)
            if (h->rows_count[m][r] == 0 && h->post_count[r] == 0) atomic_store(&h->after_early, 1);
    }
}

// n_mats matrices of types[m] with n_out[m] rows; with_post: post hook (then
// all n_out are equal), else rows hook.
static void run_case(sd_pool *pool, int n_mats, const int *types, const int64_t *n_out, int with_post,
                     int64_t n_tok, int with_hint) {
    uint8_t *W[3] = {NULL, NULL, NULL};
    float *y[3], *ref[3];
    float *src = malloc(sizeof(float) * N_IN * MAX_TOK), *x = malloc(sizeof(float) * N_IN * MAX_TOK);
    float *xr = malloc(sizeof(float) * N_IN * MAX_TOK), wf[N_IN];
    size_t ws = 0;
    for (int64_t i = 0; i < N_IN * n_tok; i++) src[i] = frand(), xr[i] = src[i] + 1.0f;
    for (int m = 0; m < n_mats; m++) {
        const sd_type_traits *tr = sd_type_get(types[m]);
        const size_t wrb = sd_row_size(types[m], N_IN);
        W[m] = malloc(wrb * (size_t)n_out[m]);
        for (int64_t r = 0; r < n_out[m]; r++) {
            for (int i = 0; i < N_IN; i++) wf[i] = frand();
            tr->from_float(wf, W[m] + r * wrb, N_IN);
        }
        y[m] = malloc(sizeof(float) * (size_t)(n_out[m] * n_tok));
        ref[m] = malloc(sizeof(float) * (size_t)(n_out[m] * n_tok));
        for (int64_t i = 0; i < n_out[m] * n_tok; i++) y[m][i] = NAN;
        ws = SD_MAX(ws, sd_matmul_wsize(types[m], N_IN, n_tok));
    }
    sd_mm_ctx ctx = {.pool = pool, .wbuf_size = ws};
    ctx.wbuf = malloc(ws);
    // the reference: one sd_matmul per matrix on the prepared rows, no pool
    sd_mm_ctx c1 = {.wbuf = ctx.wbuf, .wbuf_size = ws};
    for (int m = 0; m < n_mats; m++) sd_matmul(&c1, types[m], W[m], N_IN, n_out[m], xr, n_tok, ref[m]);

    hook_state *h = calloc(1, sizeof *h);
    h->src = src, h->x = x, h->n_tok = n_tok, h->y = y, h->ref = (const float *const *)ref, h->n_out = n_out;
    h->n_mats = n_mats;
    sd_mm_hooks hooks = {.pre = pre_fn, .pre_arg = h, .after = after_fn, .after_arg = h};
    if (with_post) hooks.post = post_fn, hooks.post_arg = h;
    else hooks.rows = rows_fn, hooks.rows_arg = h;
    if (with_hint) { // the next run's first matrix: this one
        ctx.next.W = W[0];
        ctx.next.n_out = n_out[0];
        ctx.next.wrb = sd_row_size(types[0], N_IN);
    }
    const void *Wc[3] = {W[0], W[1], W[2]};
    sd_matmul_multi(&ctx, n_mats, types, Wc, N_IN, n_out, x, n_tok, y, &hooks);

    const int nth = sd_pool_size(pool);
    char what[96];
    snprintf(what, sizeof what, "%d mats (types %d..) post=%d n_tok=%lld threads=%d hint=%d", n_mats, types[0],
             with_post, (long long)n_tok, nth, with_hint);
    for (int64_t t = 0; t < n_tok; t++) CHECK(h->pre_count[t] == 1, "%s: pre made token %lld %d times", what, (long long)t, h->pre_count[t]);
    for (int m = 0; m < n_mats; m++) {
        int n_diff = 0;
        for (int64_t i = 0; i < n_out[m] * n_tok; i++) n_diff += memcmp(&y[m][i], &ref[m][i], sizeof(float)) != 0;
        CHECK(n_diff == 0, "%s: matrix %d: %d outputs differ from sd_matmul", what, m, n_diff);
        for (int64_t r = 0; r < n_out[m]; r++) {
            if (with_post) continue;
            CHECK(h->rows_count[m][r] == 1, "%s: rows hook saw row %lld of matrix %d %d times", what, (long long)r, m,
                  h->rows_count[m][r]);
        }
    }
    if (with_post)
        for (int64_t r = 0; r < n_out[0]; r++)
            CHECK(h->post_count[r] == 1, "%s: post saw row %lld %d times", what, (long long)r, h->post_count[r]);
    CHECK(!h->bad_order, "%s: a hook ran on rows before they were computed", what);
    CHECK(!h->after_early, "%s: after ran before every row and hook was done", what);
    CHECK(h->after_nth == nth, "%s: after saw nth %d", what, h->after_nth);
    for (int i = 0; i < nth; i++) CHECK(h->after_calls[i] == 1, "%s: after ran %d times on thread %d", what, h->after_calls[i], i);
    CHECK(ctx.next.W == NULL, "%s: the run did not consume the prefetch hint", what);
    for (int m = 0; m < n_mats; m++) free(W[m]), free(y[m]), free(ref[m]);
    free(src), free(x), free(xr), free(ctx.wbuf), free(h);
}

static void test_hooks(void) {
    sd_pool *pools[3] = {NULL, sd_pool_new(2), sd_pool_new(3)};
    const int64_t toks[] = {1, 3, 4, 17, 19};
    const int64_t qkv[3] = {160, 48, 48 + 5}, ffn[2] = {112, 112}, one[1] = {200};
    const int same3[3] = {SD_TYPE_Q4_1, SD_TYPE_Q4_1, SD_TYPE_Q4_1}, mixed3[3] = {SD_TYPE_Q4_1, SD_TYPE_Q8_0, SD_TYPE_Q4_1};
    const int same2[2] = {SD_TYPE_Q8_0, SD_TYPE_Q8_0}, k1[1] = {SD_TYPE_Q4_K};
    for (int p = 0; p < 3; p++)
        for (size_t ti = 0; ti < sizeof toks / sizeof *toks; ti++) {
            run_case(pools[p], 3, same3, qkv, 0, toks[ti], ti % 2);
            run_case(pools[p], 3, mixed3, qkv, 0, toks[ti], 1);
            run_case(pools[p], 2, same2, ffn, 1, toks[ti], ti % 2);
            run_case(pools[p], 1, k1, one, 0, toks[ti], 0);
        }
    sd_pool_free(pools[1]);
    sd_pool_free(pools[2]);
}

// Activations converted ahead (sd_mm_act): columns put in pieces, in any
// order, then a run on them (hooks->act, no x) gives the same bits as
// sd_matmul on the floats; the rows hook's ranges (one per thread at most)
// start at multiples of the run's alignment and cover every row once. Types with a packer (Q4_1, Q8_0), with plain
// Q8_K rows (Q4_K, Q6_K), and float activations (F16: no conversion, -1).
#define ACT_IN 512
typedef struct {
    atomic_int n;
    int64_t r0[8], r1[8];
} range_log;

static void log_rows(void *arg, int m, int64_t r0, int64_t r1) {
    (void)m;
    range_log *lg = arg;
    const int i = atomic_fetch_add(&lg->n, 1);
    if (i < 8) lg->r0[i] = r0, lg->r1[i] = r1;
}

static void act_case(sd_pool *pool, int type, int64_t n_tok, int64_t n_out, int64_t align) {
    const sd_type_traits *tr = sd_type_get(type);
    const size_t wrb = sd_row_size(type, ACT_IN);
    uint8_t *W = malloc(wrb * (size_t)n_out);
    float *x = malloc(sizeof(float) * ACT_IN * (size_t)n_tok), wf[ACT_IN];
    float *y = malloc(sizeof(float) * (size_t)(n_out * n_tok)), *ref = malloc(sizeof(float) * (size_t)(n_out * n_tok));
    for (int64_t r = 0; r < n_out; r++) {
        for (int i = 0; i < ACT_IN; i++) wf[i] = frand();
        tr->from_float(wf, W + r * wrb, ACT_IN);
    }
    for (int64_t i = 0; i < ACT_IN * n_tok; i++) x[i] = frand() * (i % 7 == 0 ? 30.0f : 1.0f);
    for (int64_t i = 0; i < n_out * n_tok; i++) y[i] = NAN;
    const size_t ws = sd_matmul_wsize(type, ACT_IN, n_tok);
    sd_mm_ctx ctx = {.pool = pool, .wbuf_size = ws, .abuf_size = ws};
    ctx.wbuf = malloc(ws);
    ctx.abuf = malloc(ws);
    sd_matmul(&ctx, type, W, ACT_IN, n_out, x, n_tok, ref);
    char what[96];
    snprintf(what, sizeof what, "%s n_tok=%lld threads=%d align=%lld", tr->name, (long long)n_tok, sd_pool_size(pool),
             (long long)align);

    sd_mm_act a;
    const int rc = sd_mm_act_begin(&ctx, &a, type, ACT_IN, n_tok);
    if (type == SD_TYPE_F16) {
        CHECK(rc == -1, "%s: float activations need no conversion ahead, begin gave %d", what, rc);
    } else {
        CHECK(rc == 0, "%s: sd_mm_act_begin failed", what);
        CHECK(a.blk > 0 && ACT_IN % a.blk == 0, "%s: block %lld", what, (long long)a.blk);
        // columns in pieces of 1..3 blocks, pieces in a shuffled order, tokens last to first
        int64_t cuts[ACT_IN / 16 + 2];
        int nc = 0;
        for (int64_t c = 0; c < ACT_IN; c += a.blk * (1 + (int64_t)(frand() + 1.0f))) cuts[nc++] = c;
        cuts[nc] = ACT_IN;
        for (int64_t t = n_tok - 1; t >= 0; t--) {
            int order[ACT_IN / 16 + 1];
            for (int k = 0; k < nc; k++) order[k] = k;
            for (int k = nc - 1; k > 0; k--) { // Fisher-Yates
                const int j = (int)((frand() + 1.0f) * 0.5f * (float)(k + 1)) % (k + 1), tmp = order[k];
                order[k] = order[j], order[j] = tmp;
            }
            for (int k = 0; k < nc; k++) sd_mm_act_put(&a, x + t * ACT_IN, t, cuts[order[k]], cuts[order[k] + 1]);
        }
        range_log lg = {0};
        const sd_mm_hooks hooks = {.rows = log_rows, .rows_arg = &lg, .align = align, .act = &a};
        sd_matmul_multi(&ctx, 1, &type, (const void *const *)&W, ACT_IN, &n_out, NULL, n_tok, &y, &hooks);
        int n_diff = 0;
        for (int64_t i = 0; i < n_out * n_tok; i++) n_diff += memcmp(&y[i], &ref[i], sizeof(float)) != 0;
        CHECK(n_diff == 0, "%s: %d outputs differ from sd_matmul on the floats", what, n_diff);
        const int nth = sd_pool_size(pool), n_logged = atomic_load(&lg.n);
        CHECK(n_logged >= 1 && n_logged <= nth, "%s: %d row ranges for %d threads", what, n_logged, nth);
        int64_t covered = 0;
        for (int i = 0; i < n_logged && i < 8; i++) {
            CHECK(lg.r0[i] % align == 0, "%s: a thread's rows start at %lld", what, (long long)lg.r0[i]);
            covered += lg.r1[i] - lg.r0[i];
            for (int k = 0; k < i; k++)
                CHECK(lg.r1[i] <= lg.r0[k] || lg.r1[k] <= lg.r0[i], "%s: two threads' row ranges overlap", what);
        }
        CHECK(covered == n_out, "%s: the row ranges cover %lld of %lld rows", what, (long long)covered,
              (long long)n_out);
    }
    ctx.act_f32 = 1;
    CHECK(sd_mm_act_begin(&ctx, &a, type, ACT_IN, n_tok) == -1, "%s: float activations (act_f32) need no conversion",
          what);
    ctx.act_f32 = 0;
    ctx.abuf_size = 64;
    CHECK(sd_mm_act_begin(&ctx, &a, type, ACT_IN, n_tok) == -1, "%s: a too small abuf accepted", what);
    free(W), free(x), free(y), free(ref), free(ctx.wbuf), free(ctx.abuf);
}

static void test_act_ahead(void) {
    sd_pool *pools[3] = {NULL, sd_pool_new(2), sd_pool_new(3)};
    const int types[] = {SD_TYPE_Q4_1, SD_TYPE_Q8_0, SD_TYPE_Q4_K, SD_TYPE_Q6_K, SD_TYPE_F16};
    const int64_t toks[] = {1, 3, 16, 19};
    for (int p = 0; p < 3; p++)
        for (size_t k = 0; k < sizeof types / sizeof *types; k++)
            for (size_t ti = 0; ti < sizeof toks / sizeof *toks; ti++)
                act_case(pools[p], types[k], toks[ti], 16 * 9 + 7, ti % 2 ? 32 : 16);
    sd_pool_free(pools[1]);
    sd_pool_free(pools[2]);
}

// sd_pool_prefetch sets a window that sd_pool_wait_step consumes one cache
// line per call; the pool's own waits consume it too.
static void test_read_ahead_window(void) {
    static char buf[4096];
    sd_pool_prefetch(buf, 200); // lines at 0, 64, 128, 192
    int n = 0;
    while (sd_pool_wait_step()) n++;
    CHECK(n == 4, "200 bytes: %d prefetch steps, expected 4", n);
    CHECK(sd_pool_wait_step() == 0, "an empty window pauses");
    sd_pool_prefetch(buf, sizeof buf);
    CHECK(sd_pool_wait_step() == 1, "a new window prefetches");
    sd_pool_prefetch(NULL, 0);
    CHECK(sd_pool_wait_step() == 0, "a cleared window pauses");
}

int main(int argc, char **argv) {
    (void)argc;
    t_families(argv); // every case under each kernel family this CPU has
    T_RUN(test_hooks);
    T_RUN(test_act_ahead);
    T_RUN(test_read_ahead_window);
    T_EXIT();
}
