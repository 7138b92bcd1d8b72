// cmd_serve.c - specdec serve: options, start-up (model, drafts, pool, the
// default method, the scheduler, the HTTP daemon), and a clean shutdown on
// SIGINT / SIGTERM.
//
// The options are a table (name, kind, destination, range, help) read by a
// small parser of its own, shaped like the table-driven parser the other
// subcommands are moving to, so that porting is a change of struct name.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "serve/serve.h"

// ---------------------------------------------------------------- options

typedef enum { O_FLAG, O_INT, O_STR, O_FILE, O_LIST, O_HELP } sv_opt_kind;

typedef struct sv_opt {
    const char *name;        // "--port"
    const char *short_name;  // "-m" or NULL
    sv_opt_kind kind;
    void *dst;               // int * (O_INT, O_FLAG), const char ** (O_STR, O_FILE, O_LIST)
    long lo, hi;             // O_INT range
    int max;                 // O_LIST: most values
    int *count;              // O_LIST: values stored
    const char *meta;        // value placeholder in the help
    const char *help;
} sv_opt;

static void opt_help(FILE *f, const sv_opt *opts, int n) {
    fprintf(f,
            "usage: specdec serve -m MODEL.gguf [options]\n"
            "\n"
            "An OpenAI-compatible HTTP server with lossless speculative decoding. Endpoints:\n"
            "  POST /v1/chat/completions, /v1/completions (\"stream\": true for server-sent events),\n"
            "  GET /v1/models, /health, /metrics (Prometheus), POST /tokenize, /detokenize.\n"
            "Per request: temperature, top_p, top_k, min_p, seed, max_tokens, stop, and\n"
            "\"speculation\": a method string (below) or \"off\". usage.speculation reports the\n"
            "drafted and accepted tokens and tau (tokens per target forward).\n"
            "\n"
            "options:\n");
    for (int i = 0; i < n; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s%s", opts[i].short_name ? opts[i].short_name : "",
                 opts[i].short_name ? ", " : "", opts[i].name, opts[i].meta ? " " : "", opts[i].meta ? opts[i].meta : "");
        fprintf(f, "  %-24s %s", left, opts[i].help);
        if (opts[i].kind == O_INT) fprintf(f, " (default %d)", *(int *)opts[i].dst);
        if (opts[i].kind == O_STR && *(const char **)opts[i].dst) fprintf(f, " (default %s)", *(const char **)opts[i].dst);
        fputc('\n', f);
    }
    fprintf(f, "\nmethods: %s\n", sd_methods_syntax());
}

// Parses argv against the table. 0 ok, 1 help printed, -1 error printed.
static int opt_parse(const sv_opt *opts, int n, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const sv_opt *o = NULL;
        for (int k = 0; k < n && !o; k++)
            if (!strcmp(a, opts[k].name) || (opts[k].short_name && !strcmp(a, opts[k].short_name))) o = &opts[k];
        if (!o) return cli_error("serve: unknown option '%s' (see specdec serve --help)", a), -1;
        if (o->kind == O_HELP) {
            opt_help(stdout, opts, n);
            return 1;
        }
        if (o->kind == O_FLAG) {
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = cli_value(argc, argv, &i);
        if (!v) return -1;
        switch (o->kind) {
        case O_INT:
            if (cli_int(a, v, o->lo, o->hi, (int *)o->dst)) return -1;
            break;
        case O_FILE:
            if (!cli_file_ok("model file", v)) return -1;
            *(const char **)o->dst = v;
            break;
        case O_LIST:
            if (*o->count >= o->max) return cli_error("%s: at most %d values", a, o->max), -1;
            if (!cli_file_ok("draft model file", v)) return -1;
            ((const char **)o->dst)[(*o->count)++] = v;
            break;
        default:
            *(const char **)o->dst = v;
        }
    }
    return 0;
}

// ---------------------------------------------------------------- start-up

static void on_report(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "specdec serve: %s\n", line);
}

// The default method, checked and prepared once: the cost curve for
// automatic trees (on a scratch session), the layer search of skip:auto.
static int prepare_method(sv_server *s, const char *name) {
    char err[512];
    if (sd_method_parse(name, &s->def_method, err, sizeof err) < 0) return cli_error("--method: %s", err);
    sd_method *m = &s->def_method;
    if (m->needs_draft_model && !s->o->n_drafts)
        return cli_error("--method %s needs a draft model (--draft D.gguf)", name);
    sd_method_env env = sd_method_env_default(s->model);
    env.drafts = (const sd_model *const *)s->drafts;
    env.n_drafts = s->o->n_drafts;
    env.pool = s->pool;
    env.report = on_report;
    if (m->uses_cost_curve) {
        sd_session *tmp = NULL;
        sd_session_params sp = sd_session_default_params();
        sp.n_ctx = 256;
        sp.pool = s->pool;
        if (sd_session_new(&tmp, s->model, &sp, err, sizeof err) < 0 ||
            sd_cost_curve_new(&s->cost, tmp, SD_METHOD_AUTO_NODES, err, sizeof err) < 0) {
            sd_session_free(tmp);
            return cli_error("--method %s: %s", name, err);
        }
        sd_session_free(tmp);
        env.cost = s->cost;
    }
    double est = 0;
    if (sd_method_prepare(m, &env, &est, err, sizeof err) < 0) return cli_error("--method %s: %s", name, err);
    if (m->kind == SD_METHOD_SKIP) fprintf(stderr, "specdec serve: skip set {%s}\n", m->skip_list);
    return 0;
}

static int load_models(sv_server *s) {
    char err[512];
    if (sd_model_load(&s->model, s->o->model, err, sizeof err) < 0)
        return cli_error("cannot load model '%s': %s", s->o->model, err);
    s->tok = sd_model_tokenizer(s->model);
    const char *base = strrchr(s->o->model, '/');
    snprintf(s->model_id, sizeof s->model_id, "%s", base ? base + 1 : s->o->model);
    for (int i = 0; i < s->o->n_drafts; i++)
        if (sd_model_load(&s->drafts[i], s->o->drafts[i], err, sizeof err) < 0)
            return cli_error("cannot load draft model '%s': %s", s->o->drafts[i], err);
    if (sd_threadpool_new(&s->pool, s->o->n_threads, err, sizeof err) < 0) return cli_error("%s", err);
    return 0;
}

static void server_free(sv_server *s, sv_http *h) {
    sv_http_quiesce(h);
    sv_sched_stop(s);   // ends the streams in flight, fails the queue
    sv_http_stop(h);    // waits for the connection threads
    sd_cost_curve_free(s->cost);
    sd_threadpool_free(s->pool);
    for (int i = 0; i < s->o->n_drafts; i++) sd_model_free(s->drafts[i]);
    sd_model_free(s->model);
}

int cmd_serve(int argc, char **argv) {
    sv_opts o = {.host = "127.0.0.1", .port = 8080, .n_slots = 4, .n_ctx = 2048, .n_queue = 16,
                 .max_tokens = 1024, .max_conn = 64, .timeout_s = 60};
    int help = 0;
    const sv_opt opts[] = {
        {"--model", "-m", O_FILE, &o.model, .meta = "FILE", .help = "GGUF model (required)"},
        {"--method", NULL, O_STR, &o.method, .meta = "M",
         .help = "default speculation method (default ngram:3-8, or chain:4 with --draft)"},
        {"--draft", NULL, O_LIST, o.drafts, .max = SD_METHOD_MAX_DRAFTS, .count = &o.n_drafts, .meta = "D.gguf",
         .help = "draft model (same vocabulary); repeat for several"},
        {"--host", NULL, O_STR, &o.host, .meta = "ADDR", .help = "address to listen on"},
        {"--port", NULL, O_INT, &o.port, 0, 65535, .meta = "N", .help = "TCP port; 0 = any free port (printed)"},
        {"--parallel", "-np", O_INT, &o.n_slots, 1, 256, .meta = "N", .help = "slots: requests generated at once"},
        {"--ctx", "-c", O_INT, &o.n_ctx, 16, 1 << 20, .meta = "N", .help = "KV cache per slot in tokens"},
        {"--api-key", NULL, O_STR, &o.api_key, .meta = "KEY",
         .help = "require 'Authorization: Bearer KEY' (all endpoints but /health)"},
        {"--threads", "-t", O_INT, &o.n_threads, 0, 1024, .meta = "N", .help = "threads; 0 = number of cores"},
        {"--queue", NULL, O_INT, &o.n_queue, 0, 1 << 16, .meta = "N",
         .help = "requests waiting for a slot; more get 503"},
        {"--max-tokens", NULL, O_INT, &o.max_tokens, 1, 1 << 24, .meta = "N",
         .help = "default and largest max_tokens of a request"},
        {"--max-conn", NULL, O_INT, &o.max_conn, 1, 1 << 16, .meta = "N", .help = "most simultaneous connections"},
        {"--timeout", NULL, O_INT, &o.timeout_s, 1, 1 << 20, .meta = "S", .help = "idle connection timeout (s)"},
        {"--help", "-h", O_HELP, &help, .help = "show this help"},
    };
    int pr = opt_parse(opts, (int)(sizeof opts / sizeof *opts), argc, argv);
    if (pr) return pr > 0 ? 0 : 1;
    if (!o.model) return cli_error("serve: a model is required (-m MODEL.gguf; see specdec serve --help)");
    if (!o.method) o.method = o.n_drafts ? "chain:4" : "ngram:3-8";

    // SIGINT / SIGTERM are taken by sigwait in this thread only: every
    // thread started from here on inherits the blocked mask.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    sv_server s;
    memset(&s, 0, sizeof s);
    s.o = &o;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    sv_http *h = NULL;
    int rc = 1;
    char err[512];
    if (load_models(&s) || prepare_method(&s, o.method)) goto out;
    if (sv_sched_start(&s, err, sizeof err) < 0) {
        cli_error("serve: %s", err);
        goto out;
    }
    int port = o.port;
    if (sv_http_start(&h, &s, &port, err, sizeof err) < 0) {
        cli_error("serve: %s", err);
        goto out;
    }
    fprintf(stderr, "specdec serve: model %s, %d slots x %d tokens, method %s, %d threads\n", s.model_id, s.n_slots,
            s.n_ctx, s.def_method.name, sd_threadpool_size(s.pool));
    fprintf(stderr, "specdec serve: listening on http://%s:%d\n", o.host, port);
    fflush(stderr);
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    fprintf(stderr, "specdec serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
out:
    server_free(&s, h);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    if (rc == 0) fprintf(stderr, "specdec serve: stopped\n");
    return rc;
}
