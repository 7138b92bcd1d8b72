// cmd_bench_batch.c - specdec bench-batch: what one forward over the trees
// of K sessions (sd_batcher_forward) costs against K separate forwards
// (sd_session_forward each), the quantity continuous batching in a server
// lives on. A program like any other: the public API only (house rule 17).
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_opts.h"
#include "specdec.h"

#define MAX_LIST 16

static int parse_list(const char *flag, const char *s, int *out, int *n, int lo, int hi) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi || (*end && *end != ',') || *n >= MAX_LIST)
            return cli_error("%s: expected up to %d comma-separated integers in %d..%d, got '%s'", flag, MAX_LIST, lo,
                             hi, s),
                   -1;
        out[(*n)++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *n > 0 ? 0 : (cli_error("%s: empty list", flag), -1);
}

// A list option's destination for the option table.
typedef struct int_list {
    int *v;   // (MAX_LIST)
    int *n;
} int_list;

static int opt_list(const char *flag, const char *value, void *dst) {
    int_list *l = dst;
    return parse_list(flag, value, l->v, l->n, 1, 64);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double med, min, max;
} stat3;

static stat3 stats(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    stat3 s = {n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2, t[0], t[n - 1]};
    return s;
}

// {"median": ..., "min": ..., "max": ...} in ms (NULL when out of memory)
static json_t *stat_json(stat3 s) {
    return json_pack("{s:o, s:o, s:o}", "median", cli_json_num(s.med, 3), "min", cli_json_num(s.min, 3), "max",
                     cli_json_num(s.max, 3));
}

typedef struct {
    sd_session **ss;     // (max_k) sessions with ctx committed tokens each
    sd_batch *bs;        // (max_k) their trees
    sd_batcher *bat;
} bench_state;

// One timed forward of the first k sessions' trees of n nodes, together (multi) or one by one. ms, or < 0.
static double time_once(bench_state *st, int k, int n, int multi, char *err, size_t errlen) {
    for (int i = 0; i < k; i++) st->bs[i].n = n;
    const double t0 = sd_time_ms();
    if (multi) {
        if (sd_batcher_forward(st->bat, st->ss, st->bs, k, err, errlen) < 0) return -1;
    } else {
        for (int i = 0; i < k; i++)
            if (sd_session_forward(st->ss[i], &st->bs[i], err, errlen) < 0) return -1;
    }
    return sd_time_ms() - t0;
}

// Sessions with ctx committed tokens each (chunks of 64 tokens, no logits).
// toks: (2 max_k, stride) random tokens, the contexts then the trees.
static int make_sessions(bench_state *st, const sd_model *m, sd_threadpool *pool, int max_k, int ctx, int max_n,
                         const int32_t *toks, int stride, const int32_t *parent, char *err, size_t errlen) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = ctx + max_n + 16;
    sp.n_batch = 64;
    sp.pool = pool;
    static const uint8_t no_logits[64];
    for (int i = 0; i < max_k; i++) {
        if (sd_session_new(&st->ss[i], m, &sp, err, errlen) < 0) return -1;
        for (int d = 0; d < ctx; d += 64) {
            sd_batch b = {.n = SD_MIN(64, ctx - d), .tokens = toks + (size_t)i * stride + d, .logits = no_logits};
            if (sd_session_forward(st->ss[i], &b, err, errlen) < 0 ||
                sd_session_commit(st->ss[i], NULL, 0, err, errlen) < 0)
                return -1;
        }
        st->bs[i] = (sd_batch){.tokens = toks + (size_t)(max_k + i) * stride, .parent = parent};
    }
    return 0;
}

int cmd_bench_batch(int argc, char **argv) {
    const char *model = NULL, *kernels = NULL;
    int n_threads = 0, ctx = 256, reps = 7, json = 0, ks[MAX_LIST] = {1, 2, 4, 8}, nk = 4, ns[MAX_LIST] = {4, 8},
        nn = 2;
    int_list kl = {ks, &nk}, nl = {ns, &nn};
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &model, .meta = "FILE", .what = "model file",
         .required = "-m MODEL is required (see --help)", .help = "GGUF model"},
        {"--threads", "-t", CLI_INT, &n_threads, 1, 1024, .meta = "N", .def = "number of cores", .help = "threads"},
        {"--sessions", NULL, CLI_CUSTOM, &kl, .fn = opt_list, .meta = "LIST", .def = "1,2,4,8",
         .help = "comma-separated session counts K"},
        {"--nodes", NULL, CLI_CUSTOM, &nl, .fn = opt_list, .meta = "LIST", .def = "4,8",
         .help = "comma-separated tree sizes N per session"},
        {"--ctx", NULL, CLI_INT, &ctx, 0, 1 << 20, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "committed context of every session"},
        {"--reps", NULL, CLI_INT, &reps, 1, 1000, .meta = "R", .def = CLI_DEF_VALUE, .help = "rounds"},
        {"--kernels", NULL, CLI_STRING, &kernels, .meta = "NAME",
         .help = "auto (default: the best this CPU has), avx2 or scalar"},
        {"--json", NULL, CLI_FLAG, &json,
         .help = "print one JSON object: model, kernels, n_threads, ctx, reps, cases [{sessions, nodes, "
                 "multi_ms, separate_ms (each with median, min, max), speedup (separate / multi, medians), "
                 "multi_nodes_per_s, separate_nodes_per_s}]"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "bench-batch",
        .usage = "usage: specdec bench-batch -m MODEL.gguf [options]",
        .intro = "Times one forward over the token trees of K sessions at once (sd_batcher_forward)\n"
                 "against K separate forwards of the same trees (sd_session_forward), for every K of\n"
                 "--sessions and tree size of --nodes, after a context of --ctx committed tokens in\n"
                 "every session. A tree of N nodes is binary (node i's parent is (i - 1) / 2) with\n"
                 "logits for every node, as verification needs. Each round times every case once,\n"
                 "both ways, the order alternating between rounds, so that drifting conditions on a\n"
                 "shared machine affect all alike; medians and ranges over the rounds are reported.\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
    };
    int pr = cli_parse(&cmd, argc, argv);
    if (pr != CLI_PARSE_OK) return cli_parse_exit(pr);
    char err[512];
    if (kernels && sd_backend_select(kernels, err, sizeof err) < 0) return cli_error("%s", err);
    int max_k = 0, max_n = 0;
    for (int i = 0; i < nk; i++) max_k = SD_MAX(max_k, ks[i]);
    for (int i = 0; i < nn; i++) max_n = SD_MAX(max_n, ns[i]);

    sd_model *m = NULL;
    sd_threadpool *pool = NULL;
    bench_state st = {0};
    sd_model_info info;
    int32_t *toks = NULL, *parent = NULL;
    double *times = NULL;
    int rc = 1;
    if (sd_model_load(&m, model, err, sizeof err) < 0 || sd_threadpool_new(&pool, n_threads, err, sizeof err) < 0)
        goto fail;
    sd_model_get_info(m, &info);
    const int n_ctx_tok = SD_MAX(ctx, max_n);
    toks = malloc(sizeof(int32_t) * (size_t)2 * max_k * n_ctx_tok);
    parent = malloc(sizeof(int32_t) * (size_t)max_n);
    st.ss = calloc((size_t)max_k, sizeof(sd_session *));
    st.bs = calloc((size_t)max_k, sizeof(sd_batch));
    times = malloc(sizeof(double) * (size_t)nk * nn * 2 * reps);
    if (!toks || !parent || !st.ss || !st.bs || !times) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    uint64_t r = 0x2545F4914F6CDD1DULL;
    for (size_t i = 0; i < (size_t)2 * max_k * n_ctx_tok; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        toks[i] = (int32_t)((r >> 33) % (uint64_t)info.n_vocab);
    }
    for (int i = 0; i < max_n; i++) parent[i] = i == 0 ? -1 : (i - 1) / 2;
    if (!json) fprintf(stderr, "bench-batch: %d sessions, %d committed tokens each...\n", max_k, ctx);
    if (make_sessions(&st, m, pool, max_k, ctx, max_n, toks, n_ctx_tok, parent, err, sizeof err) < 0 ||
        sd_batcher_new(&st.bat, m, pool, max_k * max_n, err, sizeof err) < 0)
        goto fail;
    // times[((c * 2 + multi) * reps) + rep], case c = ki * nn + ni
    for (int rep = 0; rep < reps; rep++)
        for (int c = 0; c < nk * nn; c++)
            for (int w = 0; w < 2; w++) {
                const int multi = (w + rep + c) % 2;
                const double t = time_once(&st, ks[c / nn], ns[c % nn], multi, err, sizeof err);
                if (t < 0) goto fail;
                times[((size_t)c * 2 + multi) * reps + rep] = t;
            }
    json_t *cases = json ? json_array() : NULL; // (nk nn) the cases of --json
    if (!json)
        printf("model %s, kernels %s, %d threads, context %d, %d rounds\n", model, sd_backend_name(),
               sd_threadpool_size(pool), ctx, reps);
    for (int c = 0; c < nk * nn; c++) {
        const int k = ks[c / nn], n = ns[c % nn];
        const stat3 mu = stats(times + ((size_t)c * 2 + 1) * reps, reps), se = stats(times + (size_t)c * 2 * reps, reps);
        if (json && cases &&
            json_array_append_new(cases, json_pack("{s:i, s:i, s:o, s:o, s:o, s:o, s:o}", "sessions", k, "nodes", n,
                                                   "multi_ms", stat_json(mu), "separate_ms", stat_json(se), "speedup",
                                                   cli_json_num(se.med / mu.med, 3), "multi_nodes_per_s",
                                                   cli_json_num(k * n * 1000.0 / mu.med, 1), "separate_nodes_per_s",
                                                   cli_json_num(k * n * 1000.0 / se.med, 1)))) {
            json_decref(cases);
            cases = NULL;
        }
        if (!json)
            printf("K %2d x %2d nodes: one pass %8.2f ms [%.2f .. %.2f], %2d forwards %8.2f ms [%.2f .. %.2f], "
                   "speedup %.2fx\n",
                   k, n, mu.med, mu.min, mu.max, k, se.med, se.min, se.max, se.med / mu.med);
    }
    if (json && cli_json_write(stdout, json_pack("{s:o, s:s, s:i, s:i, s:i, s:o, s:o}", "model",
                                                 cli_json_str(model, strlen(model)), "kernels", sd_backend_name(),
                                                 "n_threads", sd_threadpool_size(pool), "ctx", ctx, "reps", reps,
                                                 "cases", cases, "host", cli_json_host()))) {
        snprintf(err, sizeof err, "cannot write the JSON result");
        goto fail;
    }
    rc = 0;
    goto out;
fail:
    cli_error("bench-batch: %s", err);
out:
    for (int i = 0; st.ss && i < max_k; i++) sd_session_free(st.ss[i]);
    free(st.ss);
    free(st.bs);
    sd_batcher_free(st.bat);
    free(toks);
    free(parent);
    free(times);
    sd_threadpool_free(pool);
    sd_model_free(m);
    return rc;
}
