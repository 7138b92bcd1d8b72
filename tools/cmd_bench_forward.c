// cmd_bench_forward.c - specdec bench-forward: what a forward pass of n
// tokens costs relative to one token (the quantity speculative decoding lives
// on), plain decode speed, and the memory-bandwidth floor of one decode step.
// A program like any other: the public API only.
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "specdec.h"

#define MAX_BATCHES 32
#define MIN_(a, b) ((a) < (b) ? (a) : (b))
#define MAX_(a, b) ((a) > (b) ? (a) : (b))

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

static void usage(FILE *f) {
    fprintf(f,
            "usage: specdec bench-forward -m MODEL.gguf [options]\n"
            "\n"
            "Times one forward pass of n chained tokens (logits for every token, as\n"
            "verification needs) after a context of --ctx committed tokens, for each n of\n"
            "--batch; measures plain greedy decoding speed and the memory read bandwidth.\n"
            "The batch sizes take turns (one forward of each per round, after one pass of\n"
            "the bandwidth probe), so that drifting conditions on a shared machine affect\n"
            "all of them alike. mem_bw_gbs is the best probe pass (floor_ms = model bytes\n"
            "over it), mem_bw_median_gbs the median one (the bandwidth while the forwards ran).\n"
            "\n"
            "options:\n"
            "  -m, --model FILE   GGUF model (required)\n"
            "  -t, --threads N    threads (default: number of cores)\n"
            "  --batch LIST       comma-separated batch sizes (default 1,2,4,8,16,32,64)\n"
            "  --ctx N            committed context before each timed forward (default 128)\n"
            "  --reps R           timed repetitions per batch size; the median is reported (default 21)\n"
            "  --decode N         tokens of greedy decoding for decode_tokens_per_s (default 64)\n"
            "  --bw-mb MB         buffer size of the bandwidth probe (default 256)\n"
            "  --kernels NAME     auto (default: the best this CPU has), avx2 or scalar\n"
            "  --json             print one JSON object: model_bytes, mem_bw_gbs, floor_ms,\n"
            "                     mem_bw_median_gbs, floor_median_ms, handover_ns,\n"
            "                     n_threads, decode_tokens_per_s, batches [{n, ms}], ratio_N_over_1\n"
            "  -h, --help         show this help\n"
            "\n"
            "handover_ns is the median time for a cache line to go from the first thread to\n"
            "the second and back (one probe per round; absent with one thread). On a VM\n"
            "whose two vCPUs sometimes sit on distant cores it is several times its usual\n"
            "value: memory bandwidth is then higher, every hand-over between the threads\n"
            "slower, and a batched forward costs more relative to one token.\n");
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

static int parse_batches(const char *s, int *out, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || *n == MAX_BATCHES) {
            cli_error("--batch: expected a comma-separated list of at most %d sizes, got '%s'", MAX_BATCHES, s);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (cli_int("--batch", item, 1, 4096, &out[*n])) return -1;
        (*n)++;
        p += len;
        if (*p == ',') p++;
    }
    if (*n == 0) {
        cli_error("--batch: empty list");
        return -1;
    }
    return 0;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int cmd_bench_forward(int argc, char **argv) {
    const char *model_path = NULL;
    int n_threads = 0, ctx = 128, reps = 21, n_decode = 64, bw_mb = 256, json = 0;
    int batches[MAX_BATCHES] = {1, 2, 4, 8, 16, 32, 64}, n_batches = 7;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() \
    if (!(v = cli_value(argc, argv, &i))) return 1
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VAL();
            model_path = v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL();
            if (cli_int(a, v, 1, 1024, &n_threads)) return 1;
        } else if (!strcmp(a, "--batch")) {
            VAL();
            if (parse_batches(v, batches, &n_batches)) return 1;
        } else if (!strcmp(a, "--ctx")) {
            VAL();
            if (cli_int(a, v, 0, 1 << 20, &ctx)) return 1;
        } else if (!strcmp(a, "--reps")) {
            VAL();
            if (cli_int(a, v, 1, 10000, &reps)) return 1;
        } else if (!strcmp(a, "--decode")) {
            VAL();
            if (cli_int(a, v, 1, 1 << 16, &n_decode)) return 1;
        } else if (!strcmp(a, "--bw-mb")) {
            VAL();
            if (cli_int(a, v, 1, 1 << 16, &bw_mb)) return 1;
        } else if (!strcmp(a, "--kernels")) {
            VAL();
            char kerr[256];
            if (sd_backend_select(v, kerr, sizeof kerr) != 0) return cli_error("--kernels %s: %s", v, kerr);
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            return cli_error("bench-forward: unknown option '%s' (see specdec bench-forward --help)", a);
        }
#undef VAL
    }
    if (!model_path) return cli_error("bench-forward: a model is required (-m MODEL.gguf)");
    if (!cli_file_ok("model file", model_path)) return 1;
    if (n_threads <= 0) n_threads = sd_n_cores();
    int max_b = 1;
    for (int i = 0; i < n_batches; i++) max_b = MAX_(max_b, batches[i]);

    char err[512];
    int rc = 1;
    sd_model *m = NULL;
    sd_session *s = NULL;
    sd_threadpool *pool = NULL; // the session's threads, which the probes run on too
    int32_t *toks = NULL;
    uint8_t *no_logits = NULL;
    double *times = NULL, *bw_passes = NULL, *ho_passes = NULL, ms_med[MAX_BATCHES];
    bw_task bwt = {0};
    if (sd_model_load(&m, model_path, err, sizeof err) < 0) {
        cli_error("cannot load model '%s': %s", model_path, err);
        goto out;
    }
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = ctx + MAX_(max_b, n_decode) + 1;
    sp.n_batch = MAX_(max_b, 64);
    if (sd_threadpool_new(&pool, n_threads, err, sizeof err) < 0) {
        cli_error("cannot start %d threads: %s", n_threads, err);
        goto out;
    }
    sp.pool = pool;
    if (sd_session_new(&s, m, &sp, err, sizeof err) < 0) {
        cli_error("cannot create a session: %s", err);
        goto out;
    }
    int n_tok = ctx + max_b;
    toks = malloc((size_t)n_tok * sizeof(int32_t));
    times = malloc((size_t)reps * (size_t)n_batches * sizeof(double));
    bw_passes = malloc((size_t)reps * sizeof(double));
    ho_passes = malloc((size_t)reps * sizeof(double));
    no_logits = calloc((size_t)sp.n_batch, 1);
    if (!toks || !times || !bw_passes || !ho_passes || !no_logits) {
        cli_error("out of memory");
        goto out;
    }
    // arbitrary but fixed tokens, away from the special ids at the start
    for (int i = 0; i < n_tok; i++) toks[i] = (int32_t)((1000 + (int64_t)i * 7919) % info.n_vocab);

    // committed context
    for (int i = 0; i < ctx; i += sp.n_batch) {
        int n = MIN_(sp.n_batch, ctx - i);
        sd_batch b = {.n = n, .tokens = toks + i, .logits = no_logits};
        if (sd_session_forward(s, &b, err, sizeof err) < 0 || sd_session_commit(s, NULL, 0, err, sizeof err) < 0) {
            cli_error("forward failed while filling the context: %s", err);
            goto out;
        }
    }
    if (!json) fprintf(stderr, "specdec: %s, %d threads, context %d\n", model_path, n_threads, ctx);

    // The batch sizes take turns, one forward each per round, so that all of
    // them see the same conditions (on a shared machine the memory bandwidth
    // and the cores' speed drift over seconds): their ratios compare like with
    // like. Each round starts with a pass of the bandwidth probe (on the
    // session's own threads) and an untimed forward that brings the weights
    // back into the caches the probe flushed: the probe's passes sample the
    // same period as the forwards. Nothing is committed: each forward's
    // pending rows are dropped by the next one, and the cache stays at ctx rows.
    if (bw_init(&bwt, pool, bw_mb) != 0) {
        cli_error("out of memory for the bandwidth probe (--bw-mb %d)", bw_mb);
        goto out;
    }
    for (int r = -1; r < reps; r++) { // r = -1: warm-up
        const double ho = ho_pass(pool), gbs = bw_pass(&bwt, pool);
        if (r >= 0) bw_passes[r] = gbs, ho_passes[r] = ho;
        {
            sd_batch b = {.n = batches[0], .tokens = toks + ctx};
            if (sd_session_forward(s, &b, err, sizeof err) < 0) {
                cli_error("forward of %d tokens failed: %s", batches[0], err);
                goto out;
            }
        }
        for (int bi = 0; bi < n_batches; bi++) {
            const int n = batches[bi];
            sd_batch b = {.n = n, .tokens = toks + ctx}; // chain, logits for every node
            double t0 = sd_time_ms();
            if (sd_session_forward(s, &b, err, sizeof err) < 0) {
                cli_error("forward of %d tokens failed: %s", n, err);
                goto out;
            }
            double ms = sd_time_ms() - t0;
            if (r >= 0) times[(size_t)bi * reps + r] = ms;
        }
    }
    if (sd_session_truncate(s, ctx, err, sizeof err) < 0) {
        cli_error("truncate failed: %s", err);
        goto out;
    }
    for (int bi = 0; bi < n_batches; bi++) ms_med[bi] = median(times + (size_t)bi * reps, reps);

    // plain greedy decoding after the same context
    double t0 = sd_time_ms();
    int32_t cur = toks[ctx];
    for (int i = 0; i < n_decode; i++) {
        sd_batch b = {.n = 1, .tokens = &cur};
        if (sd_session_forward(s, &b, err, sizeof err) < 0 || sd_session_commit(s, NULL, 0, err, sizeof err) < 0) {
            cli_error("decode failed: %s", err);
            goto out;
        }
        const float *lg = sd_session_logits(s, 0);
        cur = lg ? argmax(lg, info.n_vocab) : cur;
    }
    double decode_ms = sd_time_ms() - t0;
    double decode_tps = decode_ms > 0 ? n_decode * 1000.0 / decode_ms : 0.0;
    if (sd_session_truncate(s, ctx, err, sizeof err) < 0) {
        cli_error("truncate failed: %s", err);
        goto out;
    }
    // the machine's bandwidth: the best pass; the bandwidth while the forwards
    // ran: the median pass
    const double bw_med = median(bw_passes, reps), bw = bw_passes[reps - 1]; // median() sorted them
    const double floor_ms = bw > 0 ? (double)info.n_bytes / (bw * 1e6) : 0.0;
    const double floor_med_ms = bw_med > 0 ? (double)info.n_bytes / (bw_med * 1e6) : 0.0;
    const int has_ho = sd_threadpool_size(pool) > 1; // a second thread to hand over to
    const double ho_med = has_ho ? median(ho_passes, reps) : 0.0;
    int i1 = -1;
    for (int i = 0; i < n_batches; i++)
        if (batches[i] == 1) i1 = i;

    if (json) {
        printf("{\"model\": ");
        cli_json_string(stdout, model_path, strlen(model_path));
        printf(", \"kernels\": ");
        cli_json_string(stdout, sd_backend_name(), strlen(sd_backend_name()));
        printf(", \"model_bytes\": %zu, \"mem_bw_gbs\": %.3f, \"floor_ms\": %.4f, \"mem_bw_median_gbs\": %.3f, "
               "\"floor_median_ms\": %.4f, \"n_threads\": %d, \"ctx\": %d, \"reps\": %d, \"decode_tokens_per_s\": %.3f, ",
               info.n_bytes, bw, floor_ms, bw_med, floor_med_ms, n_threads, ctx, reps, decode_tps);
        if (has_ho) printf("\"handover_ns\": %.0f, ", ho_med);
        printf("\"batches\": [");
        for (int i = 0; i < n_batches; i++)
            printf("%s{\"n\": %d, \"ms\": %.4f}", i ? ", " : "", batches[i], ms_med[i]);
        printf("]");
        if (i1 >= 0 && ms_med[i1] > 0)
            for (int i = 0; i < n_batches; i++)
                if (batches[i] != 1) printf(", \"ratio_%d_over_1\": %.4f", batches[i], ms_med[i] / ms_med[i1]);
        printf("}\n");
    } else {
        printf("model          %s (%.1f MB of weights)\n", model_path, info.n_bytes / 1e6);
        printf("threads        %d\n", n_threads);
        printf("memory read    %.2f GB/s best pass   ->  floor %.3f ms per pass over the weights\n", bw, floor_ms);
        printf("               %.2f GB/s median pass ->  %.3f ms\n", bw_med, floor_med_ms);
        if (has_ho) printf("hand-over      %.0f ns per round trip between threads 0 and 1 (median)\n", ho_med);
        printf("decode         %.2f tokens/s (greedy, %d tokens after %d of context)\n", decode_tps, n_decode, ctx);
        printf("\n%8s %12s %14s %12s\n", "batch n", "ms/forward", "ms per token", "vs n=1");
        for (int i = 0; i < n_batches; i++) {
            printf("%8d %12.3f %14.4f", batches[i], ms_med[i], ms_med[i] / batches[i]);
            if (i1 >= 0 && ms_med[i1] > 0)
                printf(" %11.2fx\n", ms_med[i] / ms_med[i1]);
            else
                printf(" %12s\n", "-");
        }
    }
    fflush(stdout);
    rc = 0;
out:
    free(toks);
    free(times);
    free(bw_passes);
    free(ho_passes);
    free((void *)bwt.buf);
    free(no_logits);
    sd_session_free(s);
    sd_threadpool_free(pool);
    sd_model_free(m);
    return rc;
}
