// cmd_bench.c - specdec bench: Spec-Bench-style comparison of decoding
// methods (plain autoregressive, draft-model chains and trees, ...) on a set
// of prompts, with speedups measured against `ar` in the same run.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_agg.h"
#include "bench_prompts.h"
#include "cli_common.h"
#include "cli_head.h"
#include "cli_opts.h"
#include "mpi/pp.h"
#include "specdec.h"
#include "specdec_spec.h"

#define BENCH_MAX_METHODS 32
#define BENCH_BATCH 512   // target session batch: prompt chunks and tree nodes

// The automatic trees' choices: printed when the structure differs from the
// last one printed for the method being run (every run starts from the same
// prior choice, which is printed once).
typedef struct tree_reports {
    const char *method;   // the method being run
    char last[BENCH_MAX_METHODS][SD_METHOD_NAME_MAX];  // method names seen
    char shape[BENCH_MAX_METHODS][256];           // last shape printed per method
    int n;
    int in_run;           // 1: a progress line is open on stderr (start the report on a new line)
} tree_reports;

static void on_report(void *user, const char *line) {
    tree_reports *r = user;
    const char *pre = "tree auto: ";
    if (strncmp(line, pre, strlen(pre))) {   // the layer-skip search's progress
        fprintf(stderr, "%s\n", line);
        return;
    }
    const char *shape = line + strlen(pre);
    int k = 0;
    while (k < r->n && strcmp(r->last[k], r->method)) k++;
    if (k == r->n) {
        if (r->n == BENCH_MAX_METHODS) return;
        snprintf(r->last[r->n++], SD_METHOD_NAME_MAX, "%s", r->method);
    } else if (!strncmp(r->shape[k], shape, sizeof r->shape[k] - 1)) {
        return;
    }
    snprintf(r->shape[k], sizeof r->shape[k], "%s", shape);
    fprintf(stderr, "%stree auto (%s): %s\n", r->in_run ? "\n" : "", r->method, shape);
    r->in_run = 0;
}

// Collects generated tokens.
typedef struct tok_buf {
    int32_t *t;   // (cap)
    int n, cap;
} tok_buf;

static int collect(int32_t t, void *user) {
    tok_buf *b = user;
    if (b->n < b->cap) b->t[b->n] = t;
    b->n++;
    return 0;
}


// Prints the text of token t (escaped) into buf.
static void token_str(const sd_tokenizer *tok, int32_t t, char *buf, size_t n) {
    char piece[64];
    int k = sd_token_to_piece(tok, t, 1, piece, sizeof piece - 1);
    if (k < 0) k = 0;
    if (k > (int)sizeof piece - 1) k = (int)sizeof piece - 1;
    size_t o = 0;
    for (int i = 0; i < k && o + 5 < n; i++) {
        unsigned char c = (unsigned char)piece[i];
        if (c == '\n') o += (size_t)snprintf(buf + o, n - o, "\\n");
        else if (c < 0x20) o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = 0;
}

// ---------------------------------------------------------------- options
typedef struct bench_opts {
    const char *model_path, *prompts_path, *methods_arg, *out_path;
    const char *draft_paths[SD_METHOD_MAX_DRAFTS];  // (n_drafts)
    int n_drafts;
    const char *head_paths[3];  // (n_heads) --head files: an EAGLE-3 head, a Medusa head, an MoA drafter
    int n_heads;
    int n_predict;      // most tokens per prompt
    int limit;          // only the first limit prompts; 0 = all
    int n_threads;      // 0 = number of cores
    int chat;           // 1: prompts wrapped in the chat template
    int draft_threads;  // 0 = share the target's
    int fast_prompt;
    float temp, p_min;
    uint64_t seed;      // the sampler is reseeded with seed + prompt index before every run
    int draw;           // --sampling-draw (enum sd_sampling_draw)
    int head_online;    // --head-online: eagle3 methods keep one drafter over all prompts, adapting its head
    int head_bits;          // --head-bits
    int online_sync;    // --online-sync: windows trained inside the steps (deterministic)
    float online_lr;
    const char *save_head; // --save-head FILE: the first online method's head after the last prompt
    const char *datastore; // --datastore FILE|auto|none: ngram methods also look continuations up in this corpus
} bench_opts;

// argv -> o (defaults first). Returns a cli_parse result.
static int bench_parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.methods_arg = "ar,chain:4", .n_predict = 128, .chat = 1, .fast_prompt = 1,
                      .seed = sd_sampler_default_params().seed, .online_lr = sd_head_online_default_params().lr, .head_bits = 5};
    char methods_help[2048];
    snprintf(methods_help, sizeof methods_help,
             "comma-separated methods; ar is always run, first; every run gets fresh state (an empty KV cache and a "
             "new drafter). Methods: %s\n"
             "(chain:K = K draft tokens in a row; tree:W1-W2-.. = Wd children per node at depth d; dyn:B-D-M = "
             "EAGLE-2 dynamic tree, B expanded per depth, D depths, M nodes kept; ngram:N-K = prompt lookup, no draft "
             "model needed; skip:auto | skip:L1-L2-.. = layer-skip self-speculation: the target with those layers "
             "(0-based) skipped drafts a chain of up to 8 tokens (adaptive length); auto searches the set once per "
             "bench run, before the first prompt, on built-in calibration prompts (progress and the chosen set on "
             "stderr); lookahead:W-N-G = lookahead decoding: a Jacobi window of W columns x N-1 levels in the "
             "target's forward, up to G N-grams verified per step; auto = the best drafter available with an "
             "automatically sized tree (at most %d nodes), from the target's forward cost (measured once per bench "
             "run before the first prompt; min of 3 timings per size): with --draft the draft model(s), tree = the "
             "Sequoia-style optimum of expected tokens/s from the acceptance by depth and sibling rank learnt while "
             "generating (tree:auto is the same for draft models only); without it n-gram lookup (ngram:3-8) sized "
             "at every step: the candidates whose expected accepted tokens beat their forward cost, from acceptance "
             "rates by match length learnt while generating)",
             sd_methods_syntax(), SD_METHOD_AUTO_NODES);
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &o->model_path, .meta = "FILE", .what = "model file",
         .required = "a target model is required (-m MODEL.gguf; see specdec bench --help)",
         .help = "target model (required)"},
        {"--draft", NULL, CLI_LIST, o->draft_paths, .max = SD_METHOD_MAX_DRAFTS, .count = &o->n_drafts, .meta = "FILE",
         .what = "draft models", .help = "draft model; repeat for several (their trees are merged)"},
        {"--head", NULL, CLI_LIST, o->head_paths, .max = 3, .count = &o->n_heads, .meta = "FILE|auto",
         .what = "heads",
         .help = "a trained draft head for the eagle3:SHAPE (and medusa, moa) methods; 'auto': the files in heads/ "
                 "made for the model, one of each kind. Give it up to three times: an EAGLE-3 head, a Medusa head, "
                 "an MoA drafter"},
        {"--head-bits", NULL, CLI_INT, &o->head_bits, .lo = 4, .hi = 8, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "bits per weight of the head's matrices in memory: 8 (Q8_0), 5 (Q5_0) or 4 (Q4_1); fewer bits make "
                 "each drafted token cheaper (the head is read from memory after every target step) at a small "
                 "cost in acceptance (docs/heads.md)"},
        {"--head-online", NULL, CLI_FLAG, &o->head_online,
         .help = "online adaptation: each eagle3 method (and auto with a head) keeps ONE drafter over all the "
                 "prompts, in order, whose head keeps training on the verified text in a background thread (it "
                 "finishes its queued windows, untimed, before any other method runs); the summary shows tau and "
                 "tokens/s by quarter of the prompts"},
        {"--online-lr", NULL, CLI_FLOAT, &o->online_lr, .lo = 1e-7, .hi = 1.0, .meta = "LR", .def = CLI_DEF_VALUE,
         .help = "--head-online: AdamW learning rate, one step per 64 verified positions"},
        {"--online-sync", NULL, CLI_FLAG, &o->online_sync,
         .help = "--head-online: train each window inside the step that completes it (no thread: reproducible "
                 "drafts, slower steps)"},
        {"--save-head", NULL, CLI_STRING, &o->save_head, .meta = "FILE",
         .help = "--head-online: write the first online method's head, with what it learnt, to FILE at the end"},
        {"--datastore", NULL, CLI_STRING, &o->datastore, .meta = "FILE|auto",
         .help = "ngram methods (and auto without a draft model) also look continuations up in this text corpus "
                 "(REST-style retrieval; indexed to FILE.sdsa on first use); auto: data/datastore/NAME.txt made "
                 "for the model (make datastore). Unlike generate and serve, --head auto does not add it here: "
                 "each method runs as named"},
        {"--prompts", NULL, CLI_FILE, &o->prompts_path, .meta = "FILE", .what = "prompts file",
         .required = "a prompts file is required (--prompts FILE.jsonl)", .help = "prompts, JSON lines (required)"},
        {"--methods", NULL, CLI_STRING, &o->methods_arg, .meta = "LIST", .def = CLI_DEF_VALUE, .help = methods_help},
        {"--n-predict", "-n", CLI_INT, &o->n_predict, .lo = 1, .hi = 1 << 16, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "most tokens generated per prompt"},
        {"--temp", NULL, CLI_FLOAT, &o->temp, .lo = 0.0, .hi = 100.0, .meta = "T", .def = CLI_DEF_VALUE,
         .help = "temperature; 0 = greedy. Other sampling settings are generate's defaults"},
        {"--seed", NULL, CLI_U64, &o->seed, .meta = "S", .def = CLI_DEF_VALUE,
         .help = "random seed; the sampler is reseeded with S + prompt index before every run"},
        {"--sampling-draw", NULL, CLI_CUSTOM, &o->draw, .fn = cli_sampling_draw, .meta = "race|rejection",
         .def = "race", .help = CLI_SAMPLING_DRAW_HELP},
        {"--limit", NULL, CLI_INT, &o->limit, .lo = 1, .hi = 1 << 30, .meta = "N", .help = "only the first N prompts"},
        {"--draft-p-min", NULL, CLI_FLOAT, &o->p_min, .lo = 0.0, .hi = 1.0, .meta = "P", .def = CLI_DEF_VALUE,
         .help = "chain/tree drafts stop below this top probability"},
        {"--no-chat", NULL, CLI_FLAG, &o->chat, .off = 1,
         .help = "use the prompt text as is (models without a chat template)"},
        CLI_OPT_GPU,
        {"--precise-prompt", NULL, CLI_FLAG, &o->fast_prompt, .off = 1,
         .help = "prompts with float activations (as generate --precise-prompt; the default is 8-bit activations "
                 "like the generated tokens); prompt time is not part of tokens/s either way"},
        {"--fast-prompt", NULL, CLI_FLAG, &o->fast_prompt,
         .help = "prompts with 8-bit activations (the default; kept for scripts that pass it)"},
        {"--threads", "-t", CLI_INT, &o->n_threads, .lo = 1, .hi = 1024, .meta = "N",
         .help = "threads (default: number of cores)"},
        {"--draft-threads", NULL, CLI_INT, &o->draft_threads, .lo = 0, .hi = 1024, .meta = "N",
         .help = "threads of the draft models; 0 (default) = share the target's"},
        {"--out", NULL, CLI_STRING, &o->out_path, .meta = "FILE", .help = "write the full results as JSON"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "bench",
        .usage = "usage: specdec bench -m TARGET.gguf --prompts FILE.jsonl [options]",
        .intro = "Runs every method on every prompt of a Spec-Bench JSON-lines file (one object\n"
                 "per line: {\"question_id\", \"category\", \"turns\": [...]}; the first turn is the\n"
                 "prompt, wrapped in the model's chat template) and reports, per category and\n"
                 "overall, tokens/s, the speedup over ar measured in the same run, tau (tokens\n"
                 "per target forward, bonus included) and, when greedy or sampled with the race\n"
                 "draw, whether every method's text equals ar's token for token (a mismatch is\n"
                 "reported on stderr and makes the exit status 1). tokens/s = generated tokens /\n"
                 "generation time; prompt processing by the target is excluded (a draft model's\n"
                 "first pass over the prompt happens inside generation and is included). A\n"
                 "Markdown table goes to stdout, progress to stderr.\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
    };
    int r = cli_parse(&cmd, argc, argv);
    if (r == CLI_PARSE_OK && cli_gpu_setup() < 0) return CLI_PARSE_ERROR;
    if (r == CLI_PARSE_OK && o->n_threads <= 0) o->n_threads = sd_n_cores();
    return r;
}

// ---------------------------------------------------------------- build
// Everything a bench run owns.
typedef struct bench_state {
    sd_method methods[BENCH_MAX_METHODS];  // (nm) ar first
    int nm;
    char ds_path[4096];                      // --datastore's file ("": none)
    char auto_is[128];                       // what method auto runs with a head loaded ("": no head)
    int max_nodes[BENCH_MAX_METHODS];        // (nm) tree nodes per target forward
    bench_prompt *prompts;                   // (n_loaded) the file's prompts; the first np are run
    int n_loaded, np;
    const char **cats;                       // (n_cats) categories in order of first appearance
    int *cat_of;                             // (np) category of each prompt
    int n_cats;
    int32_t **ids;                           // (np) prompt tokens
    int *n_ids;                              // (np)
    run_res *res;                            // (np, nm) one per run
    int32_t *ar_tok;                         // (np, n_predict) ar's tokens, the greedy reference
    int *ar_n;                               // (np) tokens in ar_tok
    tok_buf tb;                              // tokens of the current run
    agg *by_cat;                             // (nm, n_cats)
    agg *overall;                            // (nm)
    int mismatch;                            // a greedy method differed from ar
    sd_model *m;
    const sd_tokenizer *tok;
    sd_session *s;
    sd_sampler *smp;
    sd_model *drafts[SD_METHOD_MAX_DRAFTS];
    sd_head *heads[3];                       // (n_heads) --head files, loaded (auto: one of each kind found)
    int n_heads;
    char notes[BENCH_MAX_METHODS][256];      // (nm) each method's drafter note after its last run
    sd_drafter *drafters[BENCH_MAX_METHODS];  // (nm) the current run's, NULL between runs (unless kept)
    int keep[BENCH_MAX_METHODS];             // (nm) 1: the drafter adapts online and is kept over all prompts
    int64_t cov_n[BENCH_MAX_METHODS], cov_in[BENCH_MAX_METHODS];  // (nm) draft-vocabulary coverage, all prompts
    sd_method_env env;
    sd_cost_curve *cost;                     // the target's forward cost (automatic trees), or NULL
    tree_reports *reports;
} bench_state;

static void bench_free(bench_state *b) {
    for (int k = 0; k < b->nm; k++) sd_drafter_free(b->drafters[k]);
    for (int i = 0; i < SD_METHOD_MAX_DRAFTS; i++) sd_model_free(b->drafts[i]);
    for (int i = 0; i < b->n_heads; i++) sd_head_free(b->heads[i]);
    sd_sampler_free(b->smp);
    sd_cost_curve_free(b->cost);
    sd_session_free(b->s);
    sd_model_free(b->m);
    if (b->ids)
        for (int p = 0; p < b->np; p++) free(b->ids[p]);
    free(b->ids);
    free(b->n_ids);
    free(b->res);
    free(b->ar_tok);
    free(b->ar_n);
    free(b->tb.t);
    free(b->reports);
    free(b->cats);
    free(b->cat_of);
    free(b->by_cat);
    free(b->overall);
    bench_prompts_free(b->prompts, b->n_loaded);
    free(b);
}

// The methods of --methods into b->methods (ar first), checked against the
// draft models and the batch. 0, or 1 after a message.
static int bench_validate(const bench_opts *o, bench_state *b) {
    char err[1024];
    int nm = sd_methods_parse(o->methods_arg, b->methods, BENCH_MAX_METHODS, err, sizeof err);
    if (nm < 0) return cli_error("%s", err);
    b->nm = nm;
    int ngram = 0;
    for (int k = 0; k < nm; k++) {
        const sd_method *me = &b->methods[k];
        ngram |= me->uses_ngram;
        if (me->needs_draft_model && o->n_drafts == 0)   // (before the model loads; the plan checks the rest)
            return cli_error("bench: method '%s' needs a draft model (--draft D.gguf)", me->name);
    }
    if (cli_datastore_resolve(o->datastore, NULL, o->model_path, 0, b->ds_path, sizeof b->ds_path)) return 1;
    if (b->ds_path[0] && !ngram)
        return cli_error("bench: --datastore needs an n-gram method in --methods (ngram:N-K, A/B or A+B with one, "
                         "or auto)");
    for (int i = 0; i < o->n_drafts; i++)
        if (!cli_file_ok("draft model file", o->draft_paths[i])) return 1;
    if ((o->online_sync || o->save_head) && !o->head_online)
        return cli_error("bench: %s needs --head-online", o->online_sync ? "--online-sync" : "--save-head");
    if (o->head_online && !o->n_heads) return cli_error("bench: --head-online needs an EAGLE-3 head (--head H.gguf)");
    return 0;
}

// Reads the prompts and allocates the per-prompt and per-run arrays. 0, or 1 after a message.
static int bench_alloc(const bench_opts *o, bench_state *b) {
    char err[1024];
    b->n_loaded = bench_prompts_load(o->prompts_path, &b->prompts, err, sizeof err);
    if (b->n_loaded < 0) {
        b->n_loaded = 0;
        return cli_error("%s", err);
    }
    const int np = b->np = o->limit > 0 && o->limit < b->n_loaded ? o->limit : b->n_loaded, nm = b->nm;
    b->ids = calloc((size_t)np, sizeof *b->ids);
    b->n_ids = calloc((size_t)np, sizeof *b->n_ids);
    b->res = calloc((size_t)np * (size_t)nm, sizeof *b->res);
    b->ar_tok = malloc(sizeof(int32_t) * (size_t)o->n_predict * (size_t)np);
    b->ar_n = calloc((size_t)np, sizeof *b->ar_n);
    b->tb = (tok_buf){malloc(sizeof(int32_t) * (size_t)o->n_predict), 0, o->n_predict};
    b->reports = calloc(1, sizeof *b->reports);
    b->cats = calloc((size_t)np, sizeof *b->cats);
    b->cat_of = calloc((size_t)np, sizeof *b->cat_of);
    if (!b->ids || !b->n_ids || !b->res || !b->ar_tok || !b->ar_n || !b->tb.t || !b->cats || !b->cat_of ||
        !b->reports)
        return cli_error("out of memory");
    for (int p = 0; p < np; p++) {
        int c = 0;
        while (c < b->n_cats && strcmp(b->cats[c], b->prompts[p].category)) c++;
        if (c == b->n_cats) b->cats[b->n_cats++] = b->prompts[p].category;
        b->cat_of[p] = c;
    }
    b->by_cat = calloc((size_t)nm * (size_t)b->n_cats, sizeof *b->by_cat);
    b->overall = calloc((size_t)nm, sizeof *b->overall);
    if (!b->by_cat || !b->overall) return cli_error("out of memory");
    return 0;
}

// Loads the target, tokenizes the prompts, creates the session (sized for
// the longest prompt and the largest tree) and the sampler. 0, or 1 after a message.
static int bench_load(const bench_opts *o, bench_state *b, int *auto_nodes) {
    char err[1024];
    if (pp_model_load(&b->m, o->model_path, err, sizeof err) < 0)
        return cli_error("cannot load model '%s': %s", o->model_path, err);
    b->tok = sd_model_tokenizer(b->m);
    sd_model_info info;
    sd_model_get_info(b->m, &info);
    int max_prompt = 0, max_tree = 1, max_extra = 0;
    for (int p = 0; p < b->np; p++) {
        b->n_ids[p] = cli_tokenize_prompt(b->tok, NULL, b->prompts[p].text, o->chat, &b->ids[p], err, sizeof err, NULL);
        if (b->n_ids[p] < 0)
            return cli_error("prompt %s (%s, line %d): %s%s", b->prompts[p].id, o->prompts_path, b->prompts[p].line,
                             err, o->chat ? " (--no-chat uses the text as is)" : "");
        max_prompt = SD_MAX(max_prompt, b->n_ids[p]);
    }
    sd_method_have have = {.n_drafts = o->n_drafts, .n_batch = BENCH_BATCH, .datastore = b->ds_path[0] != 0};
    for (int i = 0; i < o->n_heads; i++)
        if (cli_heads_load(o->head_paths[i], b->m, o->model_path, 0, b->heads, 3, &b->n_heads)) return 1;
    for (int i = 0; i < b->n_heads; i++) {
        const sd_head_type ty = sd_head_get_type(b->heads[i]);
        int *has = ty == SD_HEAD_MEDUSA ? &have.medusa_head : ty == SD_HEAD_MOA ? &have.moa_head : &have.eagle3_head;
        if (*has) return cli_error("--head: two %s heads given", sd_head_type_name(b->heads[i]));
        *has = 1;
        char desc[512];
        sd_head_describe(b->heads[i], desc, sizeof desc);
        fprintf(stderr, "head: %s\n", desc);
    }
    if (have.eagle3_head || have.moa_head) snprintf(b->auto_is, sizeof b->auto_is, "%s", sd_method_default(&have));
    *auto_nodes = 0;
    for (int k = 0; k < b->nm; k++) {   // what each method needs and takes (the library's plan)
        sd_method_plan pl;
        if (sd_method_plan_make(&b->methods[k], &have, &pl, err, sizeof err) < 0)
            return cli_error("bench: %s%s", err,
                             b->methods[k].needs_draft_model && !o->n_drafts ? " (--draft D.gguf)"
                             : b->methods[k].needs_head ? " (--head H.gguf)" : "");
        b->max_nodes[k] = pl.max_nodes;
        max_tree = SD_MAX(max_tree, pl.max_nodes);
        max_extra = SD_MAX(max_extra, pl.step_rows - pl.max_nodes);
        if (pl.uses_cost_curve) *auto_nodes = SD_MAX(*auto_nodes, pl.max_nodes);
    }
    sd_session_params ssp = sd_session_default_params();
    ssp.n_ctx = max_prompt + o->n_predict + max_tree + max_extra + 8;
    ssp.n_batch = BENCH_BATCH;
    ssp.n_threads = o->n_threads;
    if (sd_session_new(&b->s, b->m, &ssp, err, sizeof err) < 0) return cli_error("cannot create a session: %s", err);
    if (pp_attach(b->s, err, sizeof err) < 0) return cli_error("%s", err);
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = o->temp;
    sp.draw = o->draw;
    sp.seed = o->seed;
    if (sd_sampler_new(&b->smp, &sp, info.n_vocab, err, sizeof err) < 0) return cli_error("%s", err);
    return 0;
}

// The drafters' environment: the target's cost curve (once, on the empty
// session, when a method sizes its trees automatically), the draft models,
// and the once-per-run work of each method (the skip search). Every drafter
// is built once here to report problems (vocabulary mismatch, ...) before
// any run, then freed: each run builds a fresh one and frees it afterwards,
// so that no idle drafter (its session's worker threads) competes with the
// method being timed. 0, or 1 after a message.
static int bench_env(const bench_opts *o, bench_state *b, int auto_nodes) {
    char err[1024];
    b->env = sd_method_env_default(b->m);
    b->env.drafts = (const sd_model *const *)b->drafts;
    b->env.n_drafts = o->n_drafts;
    b->env.n_ctx = sd_session_n_ctx(b->s);
    b->env.n_threads = o->draft_threads;
    b->env.pool = o->draft_threads ? NULL : sd_session_pool(b->s);
    b->env.p_min = o->p_min;
    b->env.report = on_report;
    b->env.user = b->reports;
    b->env.head_online.on = o->head_online;
    b->env.head_bits = o->head_bits;
    b->env.datastore = b->ds_path[0] ? b->ds_path : NULL;
    b->env.head_online.lr = o->online_lr;
    b->env.head_online.deterministic = o->online_sync;
    if (auto_nodes > 0) {
        double t0 = sd_time_ms();
        if (sd_cost_curve_new(&b->cost, b->s, auto_nodes, err, sizeof err) < 0)
            return cli_error("automatic tree: %s", err);
        b->env.cost = b->cost;
        char desc[128];
        sd_cost_curve_describe(b->cost, desc, sizeof desc);
        fprintf(stderr, "tree auto: target cost measured in %.0f ms: %s\n", sd_time_ms() - t0, desc);
    }
    for (int i = 0; i < o->n_drafts; i++) {
        if (sd_model_load(&b->drafts[i], o->draft_paths[i], err, sizeof err) < 0)
            return cli_error("cannot load draft model '%s': %s", o->draft_paths[i], err);
    }
    for (int i = 0; i < b->n_heads; i++) cli_env_set_head(&b->env, b->heads[i]);   // (loaded and checked by bench_load)
    for (int k = 0; k < b->nm; k++) {
        sd_method *me = &b->methods[k];
        double est = 0;
        b->reports->method = me->name;
        if (sd_method_prepare(me, &b->env, &est, err, sizeof err) < 0)   // skip:auto: the search, once
            return cli_error("method '%s': %s", me->name, err);
        if (me->kind == SD_METHOD_SKIP && est > 0) {
            fprintf(stderr, "skip set chosen for %s: {%s} (estimated %.2fx)\n", me->name, me->skip_list, est);
            if (est < 1.0)
                fprintf(stderr, "warning: %s: layer skipping is not expected to pay on this model (estimated %.2fx "
                                "of plain decoding)\n", me->name, est);
        }
        if (sd_method_make(me, &b->env, &b->drafters[k], err, sizeof err) < 0)
            return cli_error("method '%s': %s", me->name, err);
        sd_head_online_stats hs;
        b->keep[k] = sd_drafter_online_stats(b->drafters[k], &hs);   // an online drafter learns over all prompts
        if (b->keep[k]) continue;
        sd_drafter_free(b->drafters[k]);
        b->drafters[k] = NULL;
    }
    int n_keep = 0;
    for (int k = 0; k < b->nm; k++) n_keep += b->keep[k];
    if (o->head_online && !n_keep)
        return cli_error("bench: --head-online: no method drafts with the EAGLE-3 head (eagle3:SHAPE, or auto)");
    return 0;
}

// ---------------------------------------------------------------- run
// Method k on prompt p from an empty cache, with a fresh drafter: tokens in
// b->tb, statistics in *r. 0, or -1 with a message in msg (printed by the
// caller once the progress line is ended).
static int bench_run_one(const bench_opts *o, bench_state *b, int p, int k, run_res *r, char *msg, size_t msg_len) {
    char err[1024];
    const sd_method *me = &b->methods[k];
    if (sd_session_truncate(b->s, 0, err, sizeof err) < 0) return snprintf(msg, msg_len, "%s", err), -1;
    b->reports->method = me->name;
    b->reports->in_run = 1;
    for (int j = 0; j < b->nm; j++)   // no other method's training runs while this one is timed
        if (j != k && b->keep[j] && sd_drafter_online_wait(b->drafters[j], err, sizeof err) < 0)
            return snprintf(msg, msg_len, "method '%s': %s", b->methods[j].name, err), -1;
    if (!b->keep[k] && sd_method_make(me, &b->env, &b->drafters[k], err, sizeof err) < 0)
        return snprintf(msg, msg_len, "method '%s': %s", me->name, err), -1;
    sd_sampler_reseed(b->smp, o->seed + (uint64_t)p);
    b->tb.n = 0;
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = o->n_predict;
    gp.n_batch = BENCH_BATCH;
    gp.fast_prompt = o->fast_prompt;
    gp.max_nodes = b->max_nodes[k];
    sd_gen_stats st;
    int grc = sd_generate(b->s, b->smp, b->drafters[k], b->ids[p], b->n_ids[p], &gp, collect, &b->tb, &st, err,
                          sizeof err);
    r->n_tokens = st.n_generated;
    r->gen_ms = st.generate_ms;
    r->n_forwards = st.n_target_forwards;
    r->n_step_tokens = st.n_generated > 0 ? st.n_generated - 1 : 0;
    r->draft_ms = st.draft_ms;
    r->n_draft = st.n_draft_nodes;
    r->n_accepted = st.n_draft_accepted;
    for (int d = 1; d <= BENCH_DEPTHS && d <= SD_SPEC_MAX_DEPTH; d++)
        r->dp[d] = st.n_depth_proposed[d], r->da[d] = st.n_depth_accepted[d];
    if (b->drafters[k]) snprintf(b->notes[k], sizeof b->notes[k], "%s", sd_drafter_note(b->drafters[k]));
    int64_t cn, ci;   // a kept drafter's counts run over all prompts already; a fresh one's are this prompt's
    if (sd_drafter_vocab_coverage(b->drafters[k], &cn, &ci))
        b->cov_n[k] = cn + (b->keep[k] ? 0 : b->cov_n[k]), b->cov_in[k] = ci + (b->keep[k] ? 0 : b->cov_in[k]);
    if (!b->keep[k]) {
        sd_drafter_free(b->drafters[k]);
        b->drafters[k] = NULL;
    }
    if (grc < 0) return snprintf(msg, msg_len, "method '%s' on prompt %s: %s", me->name, b->prompts[p].id, err), -1;
    return 0;
}

// 1 when every method must reproduce ar's text token for token: greedy, or
// sampled with the race draw (the text depends only on the seed).
static int bench_exact(const bench_opts *o) { return o->temp <= 0.0f || o->draw == SD_DRAW_RACE; }

// Compares run (p, k)'s tokens with ar's (greedy, or the race draw), or
// keeps them when k is ar; a mismatch message goes into mis ("" when none).
static void bench_compare(const bench_opts *o, bench_state *b, int p, int k, run_res *r, char *mis, size_t mis_len) {
    const sd_method *me = &b->methods[k];
    const int n_got = SD_MIN(b->tb.n, o->n_predict);
    const int32_t *got = b->tb.t, *ref = b->ar_tok + (size_t)p * o->n_predict;
    mis[0] = 0;
    if (k == 0) {   // ar
        memcpy(b->ar_tok + (size_t)p * o->n_predict, got, sizeof(int32_t) * (size_t)n_got);
        b->ar_n[p] = n_got;
        r->equal = 1;
        return;
    }
    if (!bench_exact(o)) return;
    const int n_ar = b->ar_n[p];
    int d = 0;
    while (d < n_got && d < n_ar && got[d] == ref[d]) d++;
    r->equal = d == n_got && d == n_ar;
    if (r->equal) return;
    char ta[96] = "(end)", tm[96] = "(end)";
    if (d < n_ar) token_str(b->tok, ref[d], ta, sizeof ta);
    if (d < n_got) token_str(b->tok, got[d], tm, sizeof tm);
    snprintf(mis, mis_len,
             "specdec: MISMATCH: method %.63s differs from ar on prompt %.63s (%.63s) at generated token "
             "%d: ar %d '%.95s', %.63s %d '%.95s' (ar %d tokens, %.63s %d tokens)\n",
             me->name, b->prompts[p].id, b->prompts[p].category, d, d < n_ar ? ref[d] : -1, ta, me->name,
             d < n_got ? got[d] : -1, tm, n_ar, me->name, n_got);
    b->mismatch = 1;
}

// Every method on every prompt, with a progress line per run on stderr. 0, or 1 after a message.
static int bench_run(const bench_opts *o, bench_state *b) {
    const int tty = isatty(2), nm = b->nm, total = b->np * nm;
    for (int p = 0; p < b->np; p++) {
        for (int k = 0; k < nm; k++) {
            run_res *r = &b->res[(size_t)p * nm + k];
            fprintf(stderr, "%s[%d/%d] %s %s q%s ...", tty ? "\r\033[K" : "", p * nm + k + 1, total,
                    b->methods[k].name, b->prompts[p].category, b->prompts[p].id);
            fflush(stderr);
            char msg[2048];
            if (bench_run_one(o, b, p, k, r, msg, sizeof msg) < 0) {
                fputc('\n', stderr);   // ends the progress line
                return cli_error("%s", msg);
            }
            char mis[1024];
            bench_compare(o, b, p, k, r, mis, sizeof mis);
            agg_add(&b->overall[k], r);
            agg_add(&b->by_cat[(size_t)k * b->n_cats + b->cat_of[p]], r);
            double tau = r->n_forwards > 0 ? (double)r->n_step_tokens / r->n_forwards : 1.0;
            if (!b->reports->in_run && !tty) fputs("   ", stderr);   // the run's result after the tree reports
            b->reports->in_run = 0;
            sd_head_online_stats hs;
            char onl[96] = "";
            if (b->keep[k] && sd_drafter_online_stats(b->drafters[k], &hs))
                snprintf(onl, sizeof onl, ", online %lld windows, agreement %.2f", (long long)hs.n_windows, hs.agree);
            fprintf(stderr, " %d tokens, %.2f tok/s, tau %.2f%s%s", r->n_tokens,
                    r->gen_ms > 0 ? r->n_tokens * 1000.0 / r->gen_ms : 0.0, tau, onl, tty && !mis[0] ? "" : "\n");
            if (mis[0]) fputs(mis, stderr);   // loudly, on a line of its own
            fflush(stderr);
        }
    }
    if (tty) fputc('\n', stderr);
    return 0;
}

// ---------------------------------------------------------------- report
// The Markdown tables on stdout.
static void bench_print(const bench_opts *o, const bench_state *b) {
    const int greedy = bench_exact(o), nm = b->nm, n_cats = b->n_cats;
    printf("## specdec bench\n\n");
    printf("target `%s`", o->model_path);
    for (int i = 0; i < o->n_drafts; i++) printf("%s`%s`", i ? ", " : ", draft ", o->draft_paths[i]);
    printf("; %d prompts from `%s`; n_predict %d; temp %g; %d threads (drafts: %d).\n", b->np, o->prompts_path,
           o->n_predict, (double)o->temp, o->n_threads, o->draft_threads);
    printf("tokens/s = generated tokens / generation time, target prompt processing excluded; "
           "tau = tokens per target forward (bonus included).\n");
    for (int k = 0; k < nm; k++) {
        const sd_method *me = &b->methods[k];
        if (me->kind == SD_METHOD_AUTO && b->auto_is[0])
            printf("%s = %s (the default method with the heads loaded).\n", me->name, b->auto_is);
        else if (me->kind == SD_METHOD_AUTO)
            printf("%s = %s with an automatically sized tree (at most %d nodes).\n", me->name,
                   o->n_drafts ? "the draft model(s)" : "n-gram lookup ngram:3-8", b->max_nodes[k]);
        if (me->kind == SD_METHOD_SKIP) printf("%s skips layers {%s}.\n", me->name, me->skip_list);
    }
    printf("\n");
    printf("| method | tokens/s | speedup | tau | tokens | time (s) | equal to ar | draft/node | acceptance by depth |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |\n");
    for (int k = 0; k < nm; k++) {
        const agg *a = &b->overall[k];
        double t0 = agg_tps(&b->overall[0]);
        char dep[128] = "";
        size_t o2 = 0;
        for (int d = 1; d <= BENCH_DEPTHS && a->dp[d] > 0 && o2 < sizeof dep - 8; d++)
            o2 += (size_t)snprintf(dep + o2, sizeof dep - o2, "%s%.2f", d > 1 ? " " : "", (double)a->da[d] / a->dp[d]);
        printf("| %s | %.2f | %.2fx | %.2f | %ld | %.1f | %s | %.1f%% | %s |\n", b->methods[k].name, agg_tps(a),
               t0 > 0 ? agg_tps(a) / t0 : 0.0, agg_tau(a), a->n_tokens, a->ms / 1000.0,
               !greedy ? "n/a (rejection draw)" : a->n_equal == a->n_runs ? "yes" : "**NO**",
               100.0 * agg_draft_cost(a, &b->overall[0]), dep);
    }
    printf("\ndraft/node = the drafter's time per drafted token as a share of a one-token target forward (ar's "
           "time per token).\n");
    for (int k = 0; k < nm; k++)
        if (b->cov_n[k] > 0)
            printf("%s: the draft vocabulary holds the target's choice %.1f%% of %lld verified positions (all "
                   "prompts)\n", b->methods[k].name, 100.0 * (double)b->cov_in[k] / (double)b->cov_n[k],
                   (long long)b->cov_n[k]);
        else if (b->notes[k][0]) printf("%s: %s\n", b->methods[k].name, b->notes[k]);
    printf("\nspeedup over ar by category (tau in parentheses):\n\n| method |");
    for (int c = 0; c < n_cats; c++) printf(" %s |", b->cats[c]);
    printf("\n| --- |");
    for (int c = 0; c < n_cats; c++) printf(" ---: |");
    printf("\n");
    for (int k = 0; k < nm; k++) {
        printf("| %s |", b->methods[k].name);
        for (int c = 0; c < n_cats; c++) {
            const agg *a = &b->by_cat[(size_t)k * n_cats + c], *a0 = &b->by_cat[c];
            double t0 = agg_tps(a0);
            printf(" %.2fx (%.2f) |", t0 > 0 ? agg_tps(a) / t0 : 0.0, agg_tau(a));
        }
        printf("\n");
    }
    fflush(stdout);
}

// --head-online: tau and tokens/s of ar and of each online method by
// quarter of the prompts (in the order run), so that the adaptation shows.
static void bench_print_online(const bench_state *b) {
    const int nq = SD_MIN(4, b->np), nm = b->nm;
    printf("\nonline adaptation: tokens/s (tau, speedup over ar) by quarter of the prompts, in order:\n\n| method |");
    for (int q = 0; q < nq; q++) {
        const int lo = q * b->np / nq + 1, hi = (q + 1) * b->np / nq;
        printf(lo == hi ? " prompt %d |" : " prompts %d-%d |", lo, hi);
    }
    printf("\n| --- |");
    for (int q = 0; q < nq; q++) printf(" ---: |");
    printf("\n");
    for (int k = 0; k < nm; k++) {
        if (k > 0 && !b->keep[k]) continue;
        printf("| %s |", b->methods[k].name);
        for (int q = 0; q < nq; q++) {
            agg a, a0;
            memset(&a, 0, sizeof a);
            memset(&a0, 0, sizeof a0);
            for (int p = q * b->np / nq; p < (q + 1) * b->np / nq; p++)
                agg_add(&a, &b->res[(size_t)p * nm + k]), agg_add(&a0, &b->res[(size_t)p * nm]);
            printf(" %.2f (%.2f, %.2fx) |", agg_tps(&a), agg_tau(&a), agg_tps(&a0) > 0 ? agg_tps(&a) / agg_tps(&a0) : 0.0);
        }
        printf("\n");
    }
    fflush(stdout);
}

// Method k's results: {"name", "max_nodes", "overall", "by_category"}; NULL
// when out of memory.
static json_t *method_json(const bench_state *b, int k, int greedy) {
    const int n_cats = b->n_cats;
    json_t *cats = json_object();
    for (int c = 0; cats && c < n_cats; c++) {
        json_t *a = agg_json(&b->by_cat[(size_t)k * n_cats + c], &b->by_cat[c], greedy);
        if (json_object_set_new(cats, b->cats[c], a)) {
            json_decref(cats);
            cats = NULL;
        }
    }
    const char *name = b->methods[k].name;
    json_t *j = json_pack("{s:o, s:i, s:o, s:o, s:o}", "name", cli_json_str(name, strlen(name)), "max_nodes",
                          b->max_nodes[k], "overall", agg_json(&b->overall[k], &b->overall[0], greedy), "by_category",
                          cats, "note", cli_json_str(b->notes[k], strlen(b->notes[k])));
    if (j && b->cov_n[k] > 0 &&
        (json_object_set_new(j, "vocab_checked", json_integer(b->cov_n[k])) ||
         json_object_set_new(j, "vocab_coverage", json_real((double)b->cov_in[k] / (double)b->cov_n[k])))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

// The full results as JSON (--out). 0, or 1 after a message.
static int bench_write_json(const bench_opts *o, const bench_state *b) {
    const int greedy = bench_exact(o);
    json_t *methods = json_array();
    for (int k = 0; methods && k < b->nm; k++)
        if (json_array_append_new(methods, method_json(b, k, greedy))) {
            json_decref(methods);
            methods = NULL;
        }
    // JSON integers are signed 64-bit: a larger seed is written as a string of its digits
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    json_t *j = json_pack(
        "{s:o, s:o, s:o, s:o, s:o, s:i, s:i, s:o, s:o, s:i, s:i, s:b, s:b, s:o, s:o}", "host", cli_json_host(), "model",
        cli_json_str(o->model_path, strlen(o->model_path)), "draft", cli_json_strs(o->draft_paths, o->n_drafts),
        "datastore", b->ds_path[0] ? cli_json_str(b->ds_path, strlen(b->ds_path)) : json_null(),
        "prompts", cli_json_str(o->prompts_path, strlen(o->prompts_path)), "n_threads", o->n_threads, "draft_threads",
        o->draft_threads, "temp", cli_json_num(o->temp, 6), "seed",
        o->seed <= (uint64_t)INT64_MAX ? json_integer((json_int_t)o->seed) : json_string(seed), "n_predict",
        o->n_predict, "n_prompts", b->np, "chat", o->chat, "time_excludes_prompt", 1, "all_equal_to_ar",
        greedy ? json_boolean(!b->mismatch) : json_null(), "methods", methods);
    if (j && b->auto_is[0]) json_object_set_new(j, "auto_method", json_string(b->auto_is));
    if (!j) return cli_error("out of memory writing the results");
    FILE *f = fopen(o->out_path, "w");
    if (!f) {
        json_decref(j);
        return cli_error("cannot write '%s'", o->out_path);
    }
    int wrc = cli_json_write(f, j);
    if (fclose(f) != 0 || wrc) return cli_error("cannot write '%s'", o->out_path);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    int r = bench_parse(argc, argv, &o);
    if (r != CLI_PARSE_OK) return cli_parse_exit(r);
    bench_state *b = calloc(1, sizeof *b);
    if (!b) return cli_error("out of memory");
    int auto_nodes = 0;
    int rc = bench_validate(&o, b);
    if (!rc) rc = bench_alloc(&o, b);
    if (!rc) rc = bench_load(&o, b, &auto_nodes);
    if (!rc) rc = bench_env(&o, b, auto_nodes);
    if (!rc) rc = bench_run(&o, b);
    if (!rc) bench_print(&o, b);
    if (!rc && o.head_online) bench_print_online(b);
    for (int k = 0; !rc && o.save_head && k < b->nm; k++)
        if (b->keep[k]) {   // the first online method's head
            rc = cli_head_online_end(b->drafters[k], o.save_head, 0);
            break;
        }
    if (!rc && o.out_path) rc = bench_write_json(&o, b);
    if (!rc && b->mismatch)
        rc = cli_error("MISMATCH: some method did not reproduce ar's text token for token (see above)");
    bench_free(b);
    return rc;
}
