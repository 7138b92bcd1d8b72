// cmd_serve.c - specdec serve: options, start-up (model, drafts, heads, pool,
// the default method, the scheduler, the HTTP daemon), and a clean shutdown
// on SIGINT / SIGTERM.
//
// The options are a table read by the subcommands' one parser (cli_opts.h).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_head.h"
#include "cli_opts.h"
#include "mpi/pp.h"
#include "serve/sched.h"
#include "serve/serve.h"
#include "serve/split.h"

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
    s->have = (sd_method_have){.n_drafts = s->o->n_drafts, .eagle3_head = s->head_eagle3 != NULL,
                               .medusa_head = s->head_medusa != NULL, .n_batch = SV_N_BATCH,
                               .moa_head = s->head_moa != NULL};
    if (sd_method_plan_make(m, &s->have, &s->def_plan, err, sizeof err) < 0)
        return cli_error("--method: %s%s", err,
                         m->needs_draft_model ? " (--draft D.gguf)"
                         : m->needs_head == SD_HEAD_EAGLE3 ? " (--head H.gguf or --head auto)"
                         : m->needs_head == SD_HEAD_MEDUSA ? " (--head M.gguf)"
                         : m->needs_head == SD_HEAD_MOA ? " (--head MOA.gguf)" : "");
    sd_method_env env = sv_method_env(s);
    env.report = on_report;
    if (m->uses_cost_curve) {
        sd_session *tmp = NULL;
        sd_session_params sp = sd_session_default_params();
        sp.n_ctx = 256;
        sp.pool = s->pool;
        if (sd_session_new(&tmp, s->model, &sp, err, sizeof err) < 0 || pp_attach(tmp, err, sizeof err) < 0 ||
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

// --datastore: opened here, once (indexed when needed), and shared by the
// slots' n-gram drafters: one copy in memory, none re-read per drafter.
static int open_datastore(sv_server *s) {
    char err[512];
    if (sd_datastore_open(&s->datastore, s->o->datastore, sd_model_tokenizer(s->model), err, sizeof err) < 0)
        return cli_error("--datastore %s: %s", s->o->datastore, err);
    fprintf(stderr, "specdec serve: %s\n", sd_datastore_note(s->datastore));
    return 0;
}

static int load_models(sv_server *s) {
    char err[512];
    if (pp_model_load(&s->model, s->o->model, err, sizeof err) < 0)
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

// --head FILE|auto (at most one of each type; auto: the first file of each
// type made for the model). `auto` that finds no head for the model leaves
// a note (cli_heads_load) and nothing loaded.
static int load_heads(sv_server *s) {
    for (int i = 0; i < s->o->n_heads; i++)
        if (cli_heads_load(s->o->heads[i], s->model, s->o->model, 0, s->heads, 3, &s->n_loaded)) return 1;
    for (int i = 0; i < s->n_loaded; i++) {
        const char *type = sd_head_type_name(s->heads[i]);
        const sd_head_type ty = sd_head_get_type(s->heads[i]);
        const sd_head **slot = ty == SD_HEAD_MEDUSA ? &s->head_medusa : ty == SD_HEAD_MOA ? &s->head_moa : &s->head_eagle3;
        if (*slot)
            return cli_error("--head: two %s heads given (one EAGLE-3, one Medusa and one MoA head at most)", type);
        *slot = s->heads[i];
        char desc[512];
        sd_head_describe(s->heads[i], desc, sizeof desc);
        fprintf(stderr, "specdec serve: head: %s\n", desc);
    }
    return 0;
}

// The default method when --method is not given: the library's for what is
// loaded (sd_method_default: lookup, else the head's tree, with an EAGLE-3
// head; a draft model's chain; else prompt lookup).
static const char *default_method(const sv_server *s) {
    const sd_method_have have = {.n_drafts = s->o->n_drafts, .eagle3_head = s->head_eagle3 != NULL,
                                 .moa_head = s->head_moa != NULL, .datastore = s->o->datastore != NULL};
    return sd_method_default(&have);
}

static void server_free(sv_server *s, sv_http *h) {
    sv_http_quiesce(h);
    sv_sched_stop(s);   // ends the streams in flight, fails the queue
    sv_http_stop(h);    // waits for the connection threads
    sv_split_free(s);   // the verification API's generations (after every connection thread)
    sd_cost_curve_free(s->cost);
    sd_datastore_free(s->datastore);
    sd_threadpool_free(s->pool);
    for (int i = 0; i < s->o->n_drafts; i++) sd_model_free(s->drafts[i]);
    for (int i = 0; i < s->n_loaded; i++) sd_head_free(s->heads[i]);   // after the slots' drafters
    sd_model_free(s->model);
}

int cmd_serve(int argc, char **argv) {
    sv_opts o = {.fast_prompt = 1, .host = "127.0.0.1", .port = 8080, .n_slots = 4, .n_ctx = 2048, .n_queue = 16,
                 .max_tokens = 1024, .max_conn = 64, .timeout_s = 60, .split_max = 8, .split_idle = 600, .online_lr = sd_head_online_default_params().lr,
                 .head_bits = 5};
    const char *budget = "auto";
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &o.model, .meta = "FILE", .what = "model file",
         .required = "a model is required (-m MODEL.gguf; see specdec serve --help)", .help = "GGUF model"},
        {"--method", NULL, CLI_STRING, &o.method, .meta = "M",
         .help = "default speculation method (default ngram:3-8; chain:4 with --draft; ngram:3-8/eagle3:auto "
                 "with an EAGLE-3 --head, ngram:5-8:auto/eagle3:auto when the model's datastore is loaded too)"},
        {"--draft", NULL, CLI_LIST, o.drafts, .max = SD_METHOD_MAX_DRAFTS, .count = &o.n_drafts, .meta = "D.gguf",
         .what = "draft models", .help = "draft model (same vocabulary); repeat for several"},
        {"--head", NULL, CLI_LIST, o.heads, .max = 3, .count = &o.n_heads, .meta = "FILE|auto", .what = "heads",
         .help = "a trained draft head (specdec train-head) for the eagle3:SHAPE and auto methods, or a Medusa head "
                 "for medusa:W1-W2-...; 'auto': the files in heads/ made for the model, one of each kind (none "
                 "found: a note, and the usual default), or an MoA drafter for moa:SHAPE (docs/moa.md). Give it up to three times: an "
                 "EAGLE-3 head, a Medusa head, an MoA drafter"},
        {"--head-bits", NULL, CLI_INT, &o.head_bits, .lo = 4, .hi = 8, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "bits per weight of the head's matrices in memory: 8 (Q8_0), 5 (Q5_0) or 4 (Q4_1); fewer bits make "
                 "each drafted token cheaper (the head is read from memory after every target step) at a small "
                 "cost in acceptance (docs/heads.md)"},
        {"--head-online", NULL, CLI_FLAG, &o.head_online,
         .help = "online adaptation: each slot's EAGLE-3 drafter keeps training its own copy of the head on the "
                 "text it verifies, over all the requests the slot serves with the same method (a training thread "
                 "and a copy of the head with its optimiser state per slot; docs/heads.md)"},
        {"--online-lr", NULL, CLI_FLOAT, &o.online_lr, .lo = 1e-7, .hi = 1.0, .meta = "LR", .def = CLI_DEF_VALUE,
         .help = "--head-online: AdamW learning rate, one step per 64 verified positions"},
        {"--datastore", NULL, CLI_STRING, &o.datastore, .meta = "FILE|auto|none",
         .help = "the n-gram methods (ngram:N-K, and the n-gram part of A/B and A+B methods) also retrieve "
                 "continuations from this text corpus, REST-style (indexed to FILE.sdsa at start-up; "
                 "scripts/make-datastore.py makes one of the model's own answers); auto: data/datastore/NAME.txt "
                 "made for the model (make datastore), which --head auto also takes unless none is given"},
        {"--sampling-draw", NULL, CLI_CUSTOM, &o.draw, .fn = cli_sampling_draw, .meta = "race|rejection",
         .def = "race", .help = CLI_SAMPLING_DRAW_HELP},
        {"--host", NULL, CLI_STRING, &o.host, .meta = "ADDR", .def = "127.0.0.1", .help = "address to listen on"},
        {"--port", NULL, CLI_INT, &o.port, 0, 65535, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "TCP port; 0 = any free port (printed)"},
        {"--parallel", "-np", CLI_INT, &o.n_slots, 1, 256, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "slots: requests generated at once"},
        {"--ctx", "-c", CLI_INT, &o.n_ctx, 16, 1 << 20, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "KV cache per slot in tokens"},
        {"--api-key", NULL, CLI_STRING, &o.api_key, .meta = "KEY",
         .help = "require 'Authorization: Bearer KEY' (all endpoints but /health)"},
        {"--threads", "-t", CLI_INT, &o.n_threads, 0, 1024, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "threads; 0 = number of cores"},
        {"--queue", NULL, CLI_INT, &o.n_queue, 0, 1 << 16, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "requests waiting for a slot; more get 503"},
        {"--max-tokens", NULL, CLI_INT, &o.max_tokens, 1, 1 << 24, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "default and largest max_tokens of a request"},
        {"--max-conn", NULL, CLI_INT, &o.max_conn, 1, 1 << 16, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "most simultaneous connections"},
        {"--timeout", NULL, CLI_INT, &o.timeout_s, 1, 1 << 20, .meta = "S", .def = CLI_DEF_VALUE,
         .help = "idle connection timeout, and the most time a request's headers and body may take to arrive "
                 "(s); when the connections near --max-conn, requests still arriving after 2 s are cut"},
        {"--draft-budget", NULL, CLI_STRING, &budget, .meta = "auto|off", .def = "auto",
         .help = "auto: when several slots share a pass, each round keeps only the draft nodes whose measured "
                 "acceptance pays for their rows at the target's cost curve (measured at start-up), so that "
                 "speculation never slows a busy server; off: every slot drafts its method's full shape"},
        CLI_OPT_GPU,
        {"--precise-prompt", NULL, CLI_FLAG, &o.fast_prompt, .off = 1,
         .help = "evaluate prompts with float activations (as generate --precise-prompt), in chunks of their own; "
                 "by default prompts use 8-bit activations like generated tokens, their chunks batched with the "
                 "other slots' steps"},
        {"--fast-prompt", NULL, CLI_FLAG, &o.fast_prompt,
         .help = "prompts with 8-bit activations (the default; kept for scripts that pass it)"},
        {"--split", NULL, CLI_INT, &o.split_max, 0, 1024, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "the verification API (POST /v1/split/open, /v1/split/round, /v1/split/close) for N "
                 "generations at once: a client (specdec client) drafts with the EAGLE-3 head, the server keeps "
                 "the target's state and verifies its trees batched with the other users; 0: off "
                 "(docs/split.md). The client's drafter gets the target's states fused by --head"},
        {"--split-idle", NULL, CLI_INT, &o.split_idle, 1, 1 << 20, .meta = "S", .def = CLI_DEF_VALUE,
         .help = "a split generation idle this many seconds expires (its client re-opens it)"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    static char notes[1024];
    snprintf(notes, sizeof notes, "methods: %s\n", sd_methods_syntax());
    const cli_cmd cmd = {
        .name = "serve",
        .usage = "usage: specdec serve -m MODEL.gguf [options]",
        .intro = "An OpenAI-compatible HTTP server with lossless speculative decoding. Endpoints:\n"
                 "  POST /v1/chat/completions, /v1/completions (\"stream\": true for server-sent events),\n"
                 "  GET /v1/models, /health, /metrics (Prometheus), POST /tokenize, /detokenize.\n"
                 "Per request: temperature, top_p, top_k, min_p, seed, max_tokens, stop, and\n"
                 "\"speculation\": a method string (below) or \"off\". usage.speculation reports the\n"
                 "drafted and accepted tokens and tau (tokens per target forward).\n"
                 "Over MPI (make MPI=1): `mpirun -mca orte_abort_on_non_zero_status 0 -np R specdec serve ...\n"
                 "--pp R` splits the model's layers over R ranks and keeps groups of slots in flight\n"
                 "(--pp-groups G; by default R, or 1 when the ranks share too few cores); the -mca setting\n"
                 "(or --enable-recovery) lets rank 0 answer the requests in flight with an error (503) when\n"
                 "a rank dies, instead of mpirun stopping every process at once (docs/mpi.md).\n",
        .notes = notes,
        .opts = opts,
        .n_opts = CLI_N(opts),
    };
    int pr = cli_parse(&cmd, argc, argv);
    if (pr != CLI_PARSE_OK) return cli_parse_exit(pr);
    if (cli_gpu_setup() < 0) return 1;
    if (strcmp(budget, "auto") != 0 && strcmp(budget, "off") != 0)
        return cli_error("--draft-budget: expected auto or off, got '%s'", budget);
    o.draft_budget = !strcmp(budget, "auto");

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
    s.on_session = pp_attach;   // a pipeline's rank 0 (--pp, docs/mpi.md): each slot reaches every rank
    if (pp_active()) {   // micro-batches in flight, and the requests answered when a rank fails
        s.metrics_extra = pp_metrics_text, s.forward_many = pp_forward_many;
        s.group_begin = pp_group_begin, s.group_end = pp_group_end;
        s.on_idle = pp_keepalive;
        pp_on_fault(sv_pipe_fault, &s);
        if (!pp_recovery())
            fprintf(stderr, "specdec serve: note: launched without `mpirun -mca orte_abort_on_non_zero_status 0`: if a "
                            "rank dies, mpirun "
                            "stops every process at once and the requests in flight lose their connection "
                            "(docs/mpi.md)\n");
    }
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    sv_http *h = NULL;
    int rc = 1;
    char err[512];
    if (load_models(&s) || load_heads(&s)) goto out;
    // --datastore, or --head auto's: the file found (lives as long as the server)
    static char ds_path[4096];
    const char *head_auto = NULL;
    for (int i = 0; i < o.n_heads; i++)
        if (!strcmp(o.heads[i], "auto")) head_auto = "auto";
    if (cli_datastore_resolve(o.datastore, head_auto, o.model, 0, ds_path, sizeof ds_path)) goto out;
    o.datastore = ds_path[0] ? ds_path : NULL;
    if (pp_active()) {   // the groups of slots in flight, for ranks of this many threads
        char note[256];
        s.n_groups = pp_groups_pick(sd_threadpool_size(s.pool), note, sizeof note);
        fprintf(stderr, "specdec serve: %s\n", note);
    }
    if (o.head_online && !s.head_eagle3) {
        cli_error("serve: --head-online needs an EAGLE-3 head (--head H.gguf)");
        goto out;
    }
    if (!o.method) o.method = default_method(&s);
    if ((o.datastore && open_datastore(&s)) || prepare_method(&s, o.method)) goto out;
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
    pp_on_fault(NULL, NULL);   // a fault from here on stops the job without the server
    server_free(&s, h);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    if (rc == 0) fprintf(stderr, "specdec serve: stopped\n");
    return rc;
}
