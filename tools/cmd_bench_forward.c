// cmd_bench_forward.c - specdec bench-forward: what a forward pass of n
// tokens costs relative to one token (the quantity speculative decoding lives
// on), plain decode speed, and the memory-bandwidth floor of one decode step.
// A program like any other: the public API only.
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_opts.h"
#include "specdec.h"

#define MAX_BATCHES 32

// One pause in the hand-over probe's spin loops.
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// Part ith of nth nearly equal contiguous parts of [0, n): [*lo, *hi).
static void split_range(long n, int ith, int nth, long *lo, long *hi) {
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

// ---------------------------------------------------------------- bandwidth probe
typedef struct {
    const uint64_t *buf;  // (n) words to read
    long n;
    uint64_t sink[64];    // per-thread results, so the reads are not optimised away
} bw_task;

static void bw_read(void *arg, int ith, int nth) {
    bw_task *t = arg;
    long lo, hi;
    split_range(t->n / 8, ith, nth, &lo, &hi);
    const uint64_t *p = t->buf;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (long i = lo * 8; i < hi * 8; i += 8) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
        a4 += p[i + 4];
        a5 += p[i + 5];
        a6 += p[i + 6];
        a7 += p[i + 7];
    }
    t->sink[ith & 63] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

static void bw_fill(void *arg, int ith, int nth) {
    bw_task *t = arg;
    long lo, hi;
    split_range(t->n, ith, nth, &lo, &hi);
    uint64_t *p = (uint64_t *)t->buf;
    for (long i = lo; i < hi; i++) p[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull;
}

// The probe's buffer, written once by the threads that read it.
static int bw_init(bw_task *t, sd_threadpool *pool, int mb) {
    size_t bytes = (size_t)mb << 20;
    t->buf = aligned_alloc(64, bytes);
    t->n = (long)(bytes / 8);
    if (!t->buf) return -1;
    sd_threadpool_run(pool, bw_fill, t);
    return 0;
}

// One pass over the buffer by all threads: GB/s (0 if too fast to time).
static double bw_pass(bw_task *t, sd_threadpool *pool) {
    double t0 = sd_time_ms();
    sd_threadpool_run(pool, bw_read, t);
    double ms = sd_time_ms() - t0;
    uint64_t s = 0;
    for (int i = 0; i < 64; i++) s += t->sink[i];
    if (s == 42) fputc(' ', stderr); // keep the sums alive
    return ms > 0 ? (double)t->n * 8 / (ms * 1e6) : 0.0;
}

// ---------------------------------------------------------------- hand-over probe
// Threads 0 and 1 pass a counter back and forth through one cache line; the
// others return at once.
#define HO_TRIPS 256
typedef struct {
    _Alignas(64) atomic_int turn;
    double ns; // per round trip, written by thread 0
} ho_task;

static void ho_run(void *arg, int ith, int nth) {
    ho_task *h = arg;
    if (nth < 2 || ith > 1) return;
    if (ith == 0) {
        const double t0 = sd_time_ms();
        for (int i = 0; i < HO_TRIPS; i++) {
            atomic_store_explicit(&h->turn, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(&h->turn, memory_order_acquire) != 2 * i + 2) cpu_relax();
        }
        h->ns = (sd_time_ms() - t0) * 1e6 / HO_TRIPS;
    } else {
        for (int i = 0; i < HO_TRIPS; i++) {
            while (atomic_load_explicit(&h->turn, memory_order_acquire) != 2 * i + 1) cpu_relax();
            atomic_store_explicit(&h->turn, 2 * i + 2, memory_order_release);
        }
    }
}

// One probe: ns per round trip between the pool's threads 0 and 1 (0 with one thread).
static double ho_pass(sd_threadpool *pool) {
    ho_task h = {.ns = 0};
    atomic_init(&h.turn, 0);
    sd_threadpool_run(pool, ho_run, &h);
    return h.ns;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

// Sorts t[0..n) (n >= 1) and returns its median.
static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

// ---------------------------------------------------------------- options
typedef struct bf_opts {
    const char *model_path;
    int n_threads;     // 0 = number of cores
    int ctx;           // committed tokens before each timed forward
    int reps;          // timed forwards per batch size
    int n_decode;      // tokens of greedy decoding
    int bw_mb;         // bandwidth probe buffer (MiB)
    int json;
    int batches[MAX_BATCHES];  // (n_batches) forward sizes in tokens
    int n_batches;
} bf_opts;

// --batch LIST: dst is the bf_opts.
static int parse_batches(const char *flag, const char *s, void *dst) {
    bf_opts *o = dst;
    o->n_batches = 0;
    const char *p = s;
    while (*p) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || o->n_batches == MAX_BATCHES) {
            cli_error("%s: expected a comma-separated list of at most %d sizes, got '%s'", flag, MAX_BATCHES, s);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (cli_int(flag, item, 1, 4096, &o->batches[o->n_batches])) return -1;
        o->n_batches++;
        p += len;
        if (*p == ',') p++;
    }
    if (o->n_batches == 0) {
        cli_error("%s: empty list", flag);
        return -1;
    }
    return 0;
}

// --kernels NAME: selects the kernels at once (dst unused).
static int parse_kernels(const char *flag, const char *v, void *dst) {
    (void)dst;
    char err[256];
    if (sd_backend_select(v, err, sizeof err) == 0) return 0;
    cli_error("%s %s: %s", flag, v, err);
    return -1;
}

// argv -> o. Returns CLI_PARSE_OK, or the exit status's cli_parse result.
static int bf_parse(int argc, char **argv, bf_opts *o) {
    *o = (bf_opts){.ctx = 128, .reps = 21, .n_decode = 64, .bw_mb = 256,
                   .batches = {1, 2, 4, 8, 16, 32, 64}, .n_batches = 7};
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &o->model_path, .meta = "FILE", .what = "model file",
         .required = "a model is required (-m MODEL.gguf)", .help = "GGUF model (required)"},
        CLI_OPT_GPU,
        {"--threads", "-t", CLI_INT, &o->n_threads, .lo = 1, .hi = 1024, .meta = "N",
         .help = "threads (default: number of cores)"},
        {"--batch", NULL, CLI_CUSTOM, o, .fn = parse_batches, .meta = "LIST", .def = "1,2,4,8,16,32,64",
         .help = "comma-separated batch sizes"},
        {"--ctx", NULL, CLI_INT, &o->ctx, .lo = 0, .hi = 1 << 20, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "committed context before each timed forward"},
        {"--reps", NULL, CLI_INT, &o->reps, .lo = 1, .hi = 10000, .meta = "R", .def = CLI_DEF_VALUE,
         .help = "timed repetitions per batch size; the median is reported"},
        {"--decode", NULL, CLI_INT, &o->n_decode, .lo = 1, .hi = 1 << 16, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "tokens of greedy decoding for decode_tokens_per_s"},
        {"--bw-mb", NULL, CLI_INT, &o->bw_mb, .lo = 1, .hi = 1 << 16, .meta = "MB", .def = CLI_DEF_VALUE,
         .help = "buffer size of the bandwidth probe"},
        {"--kernels", NULL, CLI_CUSTOM, NULL, .fn = parse_kernels, .meta = "NAME",
         .help = "auto (default: the best this CPU has), avx2 or scalar"},
        {"--json", NULL, CLI_FLAG, &o->json,
         .help = "print one JSON object: model_bytes, mem_bw_gbs, floor_ms, mem_bw_median_gbs, floor_median_ms, "
                 "handover_ns, n_threads, decode_tokens_per_s, batches [{n, ms}], ratio_N_over_1"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "bench-forward",
        .usage = "usage: specdec bench-forward -m MODEL.gguf [options]",
        .intro = "Times one forward pass of n chained tokens (logits for every token, as\n"
                 "verification needs) after a context of --ctx committed tokens, for each n of\n"
                 "--batch; measures plain greedy decoding speed and the memory read bandwidth.\n"
                 "The batch sizes take turns (one forward of each per round, after one pass of\n"
                 "the bandwidth probe), so that drifting conditions on a shared machine affect\n"
                 "all of them alike. mem_bw_gbs is the best probe pass (floor_ms = model bytes\n"
                 "over it), mem_bw_median_gbs the median one (the bandwidth while the forwards ran).\n",
        .notes = "handover_ns is the median time for a cache line to go from the first thread to\n"
                 "the second and back (one probe per round; absent with one thread). On a VM\n"
                 "whose two vCPUs sometimes sit on distant cores it is several times its usual\n"
                 "value: memory bandwidth is then higher, every hand-over between the threads\n"
                 "slower, and a batched forward costs more relative to one token.\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
    };
    int r = cli_parse(&cmd, argc, argv);
    if (r == CLI_PARSE_OK && cli_gpu_setup() < 0) return CLI_PARSE_ERROR;
    if (r == CLI_PARSE_OK && o->n_threads <= 0) o->n_threads = sd_n_cores();
    return r;
}

// ---------------------------------------------------------------- build
// What the measurements run on.
typedef struct bf_state {
    sd_model *m;
    sd_model_info info;
    sd_threadpool *pool;   // the session's threads, which the probes run on too
    sd_session *s;
    int n_batch;           // the session's batch (tokens)
    int32_t *toks;         // (ctx + max batch) fixed input tokens
    uint8_t *no_logits;    // (n_batch) zeros: context forwards need no logits
    double *times;         // (n_batches, reps) ms of each timed forward
    double *bw_passes;     // (reps) GB/s of each probe pass
    double *ho_passes;     // (reps) ns of each hand-over probe
    bw_task bwt;
} bf_state;

static void bf_free(bf_state *st) {
    free(st->toks);
    free(st->times);
    free(st->bw_passes);
    free(st->ho_passes);
    free((void *)st->bwt.buf);
    free(st->no_logits);
    sd_session_free(st->s);
    sd_threadpool_free(st->pool);
    sd_model_free(st->m);
}

// Loads the model, creates the session and buffers, and commits the context
// (ctx fixed tokens). Returns 0, or 1 after a message.
static int bf_build(const bf_opts *o, bf_state *st) {
    char err[512];
    int max_b = 1;
    for (int i = 0; i < o->n_batches; i++) max_b = SD_MAX(max_b, o->batches[i]);
    if (sd_model_load(&st->m, o->model_path, err, sizeof err) < 0)
        return cli_error("cannot load model '%s': %s", o->model_path, err);
    sd_model_get_info(st->m, &st->info);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = o->ctx + SD_MAX(max_b, o->n_decode) + 1;
    sp.n_batch = SD_MAX(max_b, 64);
    if (sd_threadpool_new(&st->pool, o->n_threads, err, sizeof err) < 0)
        return cli_error("cannot start %d threads: %s", o->n_threads, err);
    sp.pool = st->pool;
    if (sd_session_new(&st->s, st->m, &sp, err, sizeof err) < 0) return cli_error("cannot create a session: %s", err);
    st->n_batch = sp.n_batch;
    int n_tok = o->ctx + max_b;
    st->toks = malloc((size_t)n_tok * sizeof(int32_t));
    st->times = malloc((size_t)o->reps * (size_t)o->n_batches * sizeof(double));
    st->bw_passes = malloc((size_t)o->reps * sizeof(double));
    st->ho_passes = malloc((size_t)o->reps * sizeof(double));
    st->no_logits = calloc((size_t)sp.n_batch, 1);
    if (!st->toks || !st->times || !st->bw_passes || !st->ho_passes || !st->no_logits)
        return cli_error("out of memory");
    // arbitrary but fixed tokens, away from the special ids at the start
    for (int i = 0; i < n_tok; i++) st->toks[i] = (int32_t)((1000 + (int64_t)i * 7919) % st->info.n_vocab);

    // committed context
    for (int i = 0; i < o->ctx; i += sp.n_batch) {
        int n = SD_MIN(sp.n_batch, o->ctx - i);
        sd_batch b = {.n = n, .tokens = st->toks + i, .logits = st->no_logits};
        if (sd_session_forward(st->s, &b, err, sizeof err) < 0 ||
            sd_session_commit(st->s, NULL, 0, err, sizeof err) < 0)
            return cli_error("forward failed while filling the context: %s", err);
    }
    if (bw_init(&st->bwt, st->pool, o->bw_mb) != 0)
        return cli_error("out of memory for the bandwidth probe (--bw-mb %d)", o->bw_mb);
    return 0;
}

// ---------------------------------------------------------------- run
typedef struct bf_result {
    double ms_med[MAX_BATCHES];  // median ms per forward, per batch size
    double decode_tps;           // greedy decoding tokens/s
    double bw, bw_med;           // GB/s: best and median probe pass
    double floor_ms, floor_med_ms;  // model bytes over bw, bw_med
    int has_ho;                  // the pool has a second thread to hand over to
    double ho_med;               // median hand-over round trip (ns)
} bf_result;

// The batch sizes take turns, one forward each per round, so that all of
// them see the same conditions (on a shared machine the memory bandwidth and
// the cores' speed drift over seconds): their ratios compare like with like.
// Each round starts with a pass of the bandwidth probe (on the session's own
// threads) and an untimed forward that brings the weights back into the
// caches the probe flushed: the probe's passes sample the same period as the
// forwards. Nothing is committed: each forward's pending rows are dropped by
// the next one, and the cache stays at ctx rows. Returns 0, or 1 after a message.
static int bf_time_forwards(const bf_opts *o, bf_state *st) {
    char err[512];
    const int32_t *in = st->toks + o->ctx;
    for (int r = -1; r < o->reps; r++) { // r = -1: warm-up
        const double ho = ho_pass(st->pool), gbs = bw_pass(&st->bwt, st->pool);
        if (r >= 0) st->bw_passes[r] = gbs, st->ho_passes[r] = ho;
        sd_batch warm = {.n = o->batches[0], .tokens = in};
        if (sd_session_forward(st->s, &warm, err, sizeof err) < 0)
            return cli_error("forward of %d tokens failed: %s", o->batches[0], err);
        for (int bi = 0; bi < o->n_batches; bi++) {
            const int n = o->batches[bi];
            sd_batch b = {.n = n, .tokens = in}; // chain, logits for every node
            double t0 = sd_time_ms();
            if (sd_session_forward(st->s, &b, err, sizeof err) < 0)
                return cli_error("forward of %d tokens failed: %s", n, err);
            double ms = sd_time_ms() - t0;
            if (r >= 0) st->times[(size_t)bi * o->reps + r] = ms;
        }
    }
    if (sd_session_truncate(st->s, o->ctx, err, sizeof err) < 0) return cli_error("truncate failed: %s", err);
    return 0;
}

// Plain greedy decoding after the same context: tokens/s in *tps. 0, or 1 after a message.
static int bf_time_decode(const bf_opts *o, bf_state *st, double *tps) {
    char err[512];
    double t0 = sd_time_ms();
    int32_t cur = st->toks[o->ctx];
    for (int i = 0; i < o->n_decode; i++) {
        sd_batch b = {.n = 1, .tokens = &cur};
        if (sd_session_forward(st->s, &b, err, sizeof err) < 0 ||
            sd_session_commit(st->s, NULL, 0, err, sizeof err) < 0)
            return cli_error("decode failed: %s", err);
        const float *lg = sd_session_logits(st->s, 0);
        cur = lg ? argmax(lg, st->info.n_vocab) : cur;
    }
    double ms = sd_time_ms() - t0;
    *tps = ms > 0 ? o->n_decode * 1000.0 / ms : 0.0;
    if (sd_session_truncate(st->s, o->ctx, err, sizeof err) < 0) return cli_error("truncate failed: %s", err);
    return 0;
}

// Medians and floors of the measurements.
static void bf_summarise(const bf_opts *o, bf_state *st, bf_result *res) {
    for (int bi = 0; bi < o->n_batches; bi++) res->ms_med[bi] = median(st->times + (size_t)bi * o->reps, o->reps);
    // the machine's bandwidth: the best pass; the bandwidth while the forwards ran: the median pass
    res->bw_med = median(st->bw_passes, o->reps);
    res->bw = st->bw_passes[o->reps - 1]; // median() sorted them
    const double bytes = (double)st->info.n_bytes;
    res->floor_ms = res->bw > 0 ? bytes / (res->bw * 1e6) : 0.0;
    res->floor_med_ms = res->bw_med > 0 ? bytes / (res->bw_med * 1e6) : 0.0;
    res->has_ho = sd_threadpool_size(st->pool) > 1;
    res->ho_med = res->has_ho ? median(st->ho_passes, o->reps) : 0.0;
}

// ---------------------------------------------------------------- report
// The results as one JSON object on stdout (--json). 0, or -1 when they could
// not be built or written.
static int bf_print_json(const bf_opts *o, const bf_state *st, const bf_result *r, int i1) {
    json_t *batches = json_array();
    for (int i = 0; batches && i < o->n_batches; i++)
        if (json_array_append_new(batches,
                                  json_pack("{s:i, s:o}", "n", o->batches[i], "ms", cli_json_num(r->ms_med[i], 4)))) {
            json_decref(batches);
            batches = NULL;
        }
    json_t *j = json_pack("{s:o, s:s, s:I, s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:o}", "model",
                          cli_json_str(o->model_path, strlen(o->model_path)), "kernels", sd_backend_name(),
                          "model_bytes", (json_int_t)st->info.n_bytes, "mem_bw_gbs", cli_json_num(r->bw, 3), "floor_ms",
                          cli_json_num(r->floor_ms, 4), "mem_bw_median_gbs", cli_json_num(r->bw_med, 3),
                          "floor_median_ms", cli_json_num(r->floor_med_ms, 4), "n_threads", o->n_threads, "ctx", o->ctx,
                          "reps", o->reps, "decode_tokens_per_s", cli_json_num(r->decode_tps, 3));
    int bad = !j || !batches;
    if (!bad && r->has_ho) bad = json_object_set_new(j, "handover_ns", json_integer((json_int_t)llround(r->ho_med)));
    if (!bad) bad = json_object_set_new(j, "batches", batches);
    else json_decref(batches);
    if (!bad) bad = json_object_set_new(j, "host", cli_json_host());
    if (!bad && i1 >= 0 && r->ms_med[i1] > 0)
        for (int i = 0; !bad && i < o->n_batches; i++)
            if (o->batches[i] != 1) {
                char key[48];
                snprintf(key, sizeof key, "ratio_%d_over_1", o->batches[i]);
                bad = json_object_set_new(j, key, cli_json_num(r->ms_med[i] / r->ms_med[i1], 4));
            }
    if (bad) {
        json_decref(j);
        j = NULL;
    }
    return cli_json_write(stdout, j);
}

static void bf_print_text(const bf_opts *o, const bf_state *st, const bf_result *r, int i1) {
    printf("model          %s (%.1f MB of weights)\n", o->model_path, st->info.n_bytes / 1e6);
    printf("threads        %d\n", o->n_threads);
    printf("memory read    %.2f GB/s best pass   ->  floor %.3f ms per pass over the weights\n", r->bw, r->floor_ms);
    printf("               %.2f GB/s median pass ->  %.3f ms\n", r->bw_med, r->floor_med_ms);
    if (r->has_ho) printf("hand-over      %.0f ns per round trip between threads 0 and 1 (median)\n", r->ho_med);
    printf("decode         %.2f tokens/s (greedy, %d tokens after %d of context)\n", r->decode_tps, o->n_decode,
           o->ctx);
    printf("\n%8s %12s %14s %12s\n", "batch n", "ms/forward", "ms per token", "vs n=1");
    for (int i = 0; i < o->n_batches; i++) {
        printf("%8d %12.3f %14.4f", o->batches[i], r->ms_med[i], r->ms_med[i] / o->batches[i]);
        if (i1 >= 0 && r->ms_med[i1] > 0)
            printf(" %11.2fx\n", r->ms_med[i] / r->ms_med[i1]);
        else
            printf(" %12s\n", "-");
    }
}

int cmd_bench_forward(int argc, char **argv) {
    bf_opts o;
    int r = bf_parse(argc, argv, &o);
    if (r != CLI_PARSE_OK) return cli_parse_exit(r);
    bf_state st = {0};
    bf_result res = {0};
    int rc = bf_build(&o, &st);
    if (!rc && !o.json) fprintf(stderr, "specdec: %s, %d threads, context %d\n", o.model_path, o.n_threads, o.ctx);
    if (!rc) rc = bf_time_forwards(&o, &st);
    if (!rc) rc = bf_time_decode(&o, &st, &res.decode_tps);
    if (!rc) {
        bf_summarise(&o, &st, &res);
        int i1 = -1;
        for (int i = 0; i < o.n_batches; i++)
            if (o.batches[i] == 1) i1 = i;
        if (!o.json) bf_print_text(&o, &st, &res, i1);
        else if (bf_print_json(&o, &st, &res, i1)) rc = cli_error("cannot write the JSON result");
        fflush(stdout);
    }
    bf_free(&st);
    return rc;
}
