// cmd_generate.c - specdec generate: prompt in, text streamed out.
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "gen_out.h"
#include "cli_head.h"
#include "cli_opts.h"
#include "mpi/pp.h"
#include "specdec.h"
#include "specdec_spec.h"

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
    signal(SIGINT, SIG_DFL); // a second Ctrl-C ends the program at once
}

// Progress of the layer-skip search and the automatic tree's choices, on
// stderr with -v (user points to the verbose flag); silent otherwise.
static void on_report(void *user, const char *line) {
    if (user && *(const int *)user) fprintf(stderr, "specdec: %s\n", line);
}

static int on_token(int32_t t, void *user) { return gen_out_token(user, t) || g_interrupted ? 1 : 0; }

// ---------------------------------------------------------------- options
// The command line as given (parse), before the cross-flag checks.
typedef struct gen_opts {
    const char *model_path, *prompt, *system;
    const char *stops[TX_MAX_STOP];  // (n_stops) --stop strings
    int n_stops;
    int n_predict;      // most tokens generated (0 = until end or context full)
    int chat, json, fast_prompt;  // fast_prompt: 1 by default (8-bit activations), 0 with --precise-prompt
    int verbose;        // -v: the drafter's reports and the detailed statistics on stderr
    int n_threads;      // 0 = number of cores (resolved by gen_validate)
    int n_ctx;          // tokens; 0 = min(model's, 4096)
    int n_batch;        // prompt tokens per forward; also the most tree nodes
    sd_sampler_params sp;
    // speculative decoding
    const char *draft_paths[SD_METHOD_MAX_DRAFTS];  // (n_drafts) --draft files
    int n_drafts;
    const char *method;     // --method: a method string (specdec_spec.h), or NULL
    int draft_max;          // --draft-max K (chain:K)
    int max_nodes;          // tree nodes per target forward; 0 = the tree's size
    int draft_threads;      // 0 = share the target's threads
    float p_min;
    const char *tree;       // --tree W1,W2,... (NULL, or "auto" with tree_auto)
    int tree_auto;          // --tree auto
    const char *dyn;        // --tree-dynamic B,D,M
    const char *ngram;      // --draft-ngram N,K
    const char *datastore;  // --datastore FILE|auto|none, or NULL
    char ds_path[4096];     // the datastore used ("": none): --datastore, or what auto (or --head auto) found
    const char *skip;       // --draft-skip L1,L2,..|auto
    const char *save_skip, *load_skip;
    const char *lookahead;  // --lookahead W,N,G
    const char *head;       // --head FILE|auto: an EAGLE-3 head drafts (eagle3:SHAPE)
    int head_online;        // --head-online: the head keeps training while it drafts
    int head_bits;          // --head-bits
    float online_lr;        // --online-lr
    const char *save_head;  // --save-head FILE: the head as it is after the run
    // the spellings of the flags given, NULL when absent (for the cross-flag checks)
    const char *method_given, *draft_max_given, *p_min_given, *tree_given, *dyn_given, *ngram_given, *skip_given,
        *lookahead_given, *head_given;
} gen_opts;

// --tree W1,W2,...|auto; dst is the gen_opts.
static int parse_tree_flag(const char *flag, const char *v, void *dst) {
    gen_opts *o = dst;
    char err[256];
    int w[16];   // the most depths a tree has
    if (!strcmp(v, "auto")) {
        o->tree_auto = 1;
        return 0;
    }
    if (sd_parse_ints(flag, v, ',', w, 16, 1, 64, err, sizeof err) < 0) {
        cli_error("%s", err);
        return -1;
    }
    o->tree = v;
    return 0;
}

// --tree-dynamic B,D,M; dst is a const char *.
static int parse_dyn_flag(const char *flag, const char *v, void *dst) {
    char err[256];
    int t[3];
    if (sd_parse_ints(flag, v, ',', t, 3, 1, 1024, err, sizeof err) != 3 || t[0] > 16 || t[1] > 16 || t[2] < 2) {
        cli_error("%s: expected B,D,M with B and D in 1..16 and M >= 2, got '%s'", flag, v);
        return -1;
    }
    *(const char **)dst = v;
    return 0;
}

// --draft-ngram N,K: two positive integers, in the ranges the method
// registry gives ngram:N-K; dst is a const char *.
static int parse_ngram_flag(const char *flag, const char *v, void *dst) {
    char err[512], name[64];
    int t[2];
    sd_method m;
    if (sd_parse_ints(flag, v, ',', t, 2, 1, 256, err, sizeof err) != 2) {
        cli_error("%s: expected N,K (two positive integers, K <= 256), got '%s'", flag, v);
        return -1;
    }
    snprintf(name, sizeof name, "ngram:%d-%d", t[0], t[1]);
    if (sd_method_parse(name, &m, err, sizeof err) < 0) {
        cli_error("%s: %s", flag, err);
        return -1;
    }
    *(const char **)dst = v;
    return 0;
}

// --draft-skip L1,L2,..|auto (the layers are checked against the model later); dst is a const char *.
static int parse_skip_flag(const char *flag, const char *v, void *dst) {
    if (!*v || strlen(v) >= sizeof ((sd_method *)0)->skip_list) {
        cli_error("%s: expected a layer list L1,L2,... (0-based, ranges A-B) or 'auto', got '%s'", flag, v);
        return -1;
    }
    *(const char **)dst = v;
    return 0;
}

// --lookahead W,N,G; dst is a const char *.
static int parse_lookahead_flag(const char *flag, const char *v, void *dst) {
    char err[256];
    int t[3];
    if (sd_parse_ints(flag, v, ',', t, 3, 1, 64, err, sizeof err) != 3 || t[1] < 2 || t[1] > 16) {
        cli_error("%s: expected W,N,G with W and G in 1..64 and N in 2..16, got '%s'", flag, v);
        return -1;
    }
    *(const char **)dst = v;
    return 0;
}

// --method STR: the registry's message for a bad string; dst is a const char *.
static int parse_method_flag(const char *flag, const char *v, void *dst) {
    char err[1024];
    sd_method m;
    if (sd_method_parse(v, &m, err, sizeof err) < 0) {
        cli_error("%s: %s", flag, err);
        return -1;
    }
    *(const char **)dst = v;
    return 0;
}

static const char *const GEN_INTRO =
    "Generates text from PROMPT and streams it to stdout; a one-line speed summary\n"
    "goes to stderr (-v adds the drafter's reports and the detailed statistics).\n"
    "Ctrl-C stops generation (what was generated is kept).\n";
static const char *const GEN_NOTES =
    "\n"
    "Sampling order: repetition penalty, temperature, top-k, top-p, min-p.\n";

// argv -> o (defaults first). Returns a cli_parse result.
static int gen_parse(int argc, char **argv, gen_opts *o) {
    *o = (gen_opts){.n_predict = 256, .n_batch = 512, .draft_max = 4, .sp = sd_sampler_default_params(), .fast_prompt = 1,
                    .online_lr = sd_head_online_default_params().lr, .head_bits = 5};
    char method_help[1024], tree_help[1024];
    snprintf(method_help, sizeof method_help,
             "speculative method, a method string as bench --methods takes: %s. The flags below are shorthands "
             "(--draft-max K = chain:K, --tree W1,W2 = tree:W1-W2, --tree-dynamic B,D,M = dyn:B-D-M, --draft-ngram "
             "N,K = ngram:N-K, --draft-skip auto = skip:auto, --lookahead W,N,G = lookahead:W-N-G, --tree auto alone "
             "= ngram:3-8:auto) and cannot be combined with it",
             sd_methods_syntax());
    snprintf(tree_help, sizeof tree_help,
             "tree draft: W1 children of the root, W2 of each of those, ...\n"
             "--tree auto: hardware-aware tree (Sequoia-style) for --draft and/or --draft-ngram: the target's "
             "forward cost is measured at start-up (ms against tree nodes), acceptance by depth and sibling rank is "
             "learnt while generating, and the tree maximising expected tokens/s (at most %d nodes) is drafted; the "
             "choice is printed on stderr when made and when it changes. Alone: --draft-ngram 3,8 + auto tree",
             SD_METHOD_AUTO_NODES);
    sd_sampler_params *sp = &o->sp;
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &o->model_path, .meta = "FILE", .what = "model file",
         .help = "GGUF model (required)",
         .required = "a model is required (-m MODEL.gguf; see specdec generate --help)"},
        {"--prompt", "-p", CLI_STRING, &o->prompt, .meta = "TEXT", .help = "prompt (required), plain text: special-token texts in it are not parsed",
         .required = "a prompt is required (-p PROMPT)"},
        {"--n-predict", "-n", CLI_INT, &o->n_predict, .lo = 0, .hi = 1 << 30, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "most tokens to generate; 0 = until end or context full"},
        {"--stop", NULL, CLI_LIST, o->stops, .max = TX_MAX_STOP, .count = &o->n_stops, .meta = "TEXT",
         .what = "stop strings",
         .help = "end the text where TEXT first appears (repeatable; the first match wins): nothing from it on is "
                 "printed, finish_reason \"stopped\""},
        {"--chat", NULL, CLI_FLAG, &o->chat, .help = "wrap the prompt in the model's chat template (ChatML, Llama 3)"},
        {"--system", NULL, CLI_STRING, &o->system, .meta = "TEXT",
         .help = "system message for --chat (default: the template's own)"},
        {"--temp", NULL, CLI_FLOAT, &sp->temp, .lo = 0.0, .hi = 100.0, .meta = "T", .def = CLI_DEF_VALUE,
         .help = "temperature; 0 = greedy"},
        {"--top-k", NULL, CLI_INT, &sp->top_k, .lo = 0, .hi = 1 << 30, .meta = "K", .def = CLI_DEF_VALUE,
         .help = "keep the K most likely tokens; 0 = off"},
        {"--top-p", NULL, CLI_FLOAT, &sp->top_p, .lo = 0.0, .hi = 1.0, .meta = "P", .def = CLI_DEF_VALUE,
         .help = "nucleus sampling mass; 1 = off"},
        {"--min-p", NULL, CLI_FLOAT, &sp->min_p, .lo = 0.0, .hi = 1.0, .meta = "P", .def = CLI_DEF_VALUE,
         .help = "drop tokens below P x the top probability; 0 = off"},
        {"--repeat-penalty", NULL, CLI_FLOAT, &sp->repeat_penalty, .lo = 0.01, .hi = 100.0, .meta = "R",
         .def = CLI_DEF_VALUE, .help = "penalty for recently seen tokens; 1 = off"},
        {"--repeat-last-n", NULL, CLI_INT, &sp->repeat_last_n, .lo = 0, .hi = 1 << 30, .meta = "N",
         .def = CLI_DEF_VALUE, .help = "tokens of history the penalty looks at"},
        {"--seed", NULL, CLI_U64, &sp->seed, .meta = "S", .def = CLI_DEF_VALUE, .help = "random seed"},
        {"--sampling-draw", NULL, CLI_CUSTOM, &sp->draw, .fn = cli_sampling_draw, .meta = "race|rejection",
         .def = "race", .help = CLI_SAMPLING_DRAW_HELP},
        {"--threads", "-t", CLI_INT, &o->n_threads, .lo = 1, .hi = 1024, .meta = "N",
         .help = "threads (default: number of cores)"},
        {"--ctx", "-c", CLI_INT, &o->n_ctx, .lo = 1, .hi = 1 << 24, .meta = "N",
         .help = "context length in tokens (default: min(model's, 4096))"},
        {"--batch", "-b", CLI_INT, &o->n_batch, .lo = 1, .hi = 1 << 16, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "prompt tokens per forward pass"},
        CLI_OPT_GPU,
        {"--precise-prompt", NULL, CLI_FLAG, &o->fast_prompt, .off = 1,
         .help = "evaluate the prompt with float activations (several times slower; by default the prompt uses "
                 "8-bit activations like the generated tokens, as llama.cpp does; docs/numerics.md measures the "
                 "difference)"},
        {"--fast-prompt", NULL, CLI_FLAG, &o->fast_prompt,
         .help = "the prompt with 8-bit activations (the default; kept for scripts that pass it)"},
        {"--verbose", "-v", CLI_FLAG, &o->verbose,
         .help = "print the drafter's reports (automatic tree sizes, skip search, head) and the detailed "
                 "statistics on stderr"},
        {"--json", NULL, CLI_FLAG, &o->json,
         .help = "print one JSON object at the end instead of streaming: text, n_prompt_tokens, n_generated, "
                 "tokens_per_second, prompt_ms, generate_ms, model, n_threads, finish_reason (with a drafter also: "
                 "draft, method, n_target_forwards, mean_accepted, acceptance_by_depth, draft_ms, verify_ms, ...)"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
        {.kind = CLI_SECTION,
         .help = "\nspeculative decoding (same text as without it when greedy, same distribution\nwhen sampling):"},
        {"--draft", NULL, CLI_LIST, o->draft_paths, .max = SD_METHOD_MAX_DRAFTS, .count = &o->n_drafts, .meta = "FILE",
         .what = "draft models",
         .help = "draft model (GGUF, same vocabulary as the target); repeat the flag for several drafts, whose "
                 "trees are merged"},
        {"--method", NULL, CLI_CUSTOM, &o->method, .fn = parse_method_flag, .given = &o->method_given,
         .meta = "STR", .help = method_help},
        {"--head", NULL, CLI_STRING, &o->head, .given = &o->head_given, .meta = "FILE|auto",
         .help = "draft with a trained EAGLE-3 head (specdec train-head); 'auto': the head in heads/ made for this "
                 "model, if any (the kind --method needs: moa:... an MoA drafter; else the EAGLE-3 head). The tree "
                 "flags (--draft-max, --tree, --tree-dynamic) shape its drafts; default "
                 "ngram:5-8:auto/eagle3:auto with the model's datastore (make datastore), else "
                 "ngram:3-8/eagle3:auto: prompt lookup where the text repeats, else the head's automatic tree "
                 "(sized by the measured costs of head and target). With an MoA drafter file (docs/moa.md) the "
                 "same flags draft with it (ngram:3-8/moa:auto, moa:chain:K, ...)"},
        {"--head-bits", NULL, CLI_INT, &o->head_bits, .lo = 4, .hi = 8, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "bits per weight of the head's matrices in memory: 8 (Q8_0), 5 (Q5_0) or 4 (Q4_1); fewer bits make "
                 "each drafted token cheaper (the head is read from memory after every target step) at a small "
                 "cost in acceptance (docs/heads.md)"},
        {"--head-online", NULL, CLI_FLAG, &o->head_online,
         .help = "online adaptation: the EAGLE-3 head keeps training on the target's states and distributions of "
                 "the verified text, in a background thread (docs/heads.md); the head file is not changed"},
        {"--online-lr", NULL, CLI_FLOAT, &o->online_lr, .lo = 1e-7, .hi = 1.0, .meta = "LR", .def = CLI_DEF_VALUE,
         .help = "--head-online: AdamW learning rate, one step per 64 verified positions"},
        {"--save-head", NULL, CLI_STRING, &o->save_head, .meta = "FILE",
         .help = "--head-online: write the head with what it learnt to FILE after the run (Q8_0)"},
        {"--draft-max", NULL, CLI_INT, &o->draft_max, .lo = 1, .hi = 64, .given = &o->draft_max_given, .meta = "K",
         .def = CLI_DEF_VALUE, .help = "chain draft: most draft tokens per step"},
        {"--draft-p-min", NULL, CLI_FLOAT, &o->p_min, .lo = 0.0, .hi = 1.0, .given = &o->p_min_given, .meta = "P",
         .def = CLI_DEF_VALUE, .help = "stop drafting below this top draft probability"},
        {"--tree", NULL, CLI_CUSTOM, o, .fn = parse_tree_flag, .given = &o->tree_given, .meta = "W1,W2,...|auto",
         .help = tree_help},
        {"--tree-dynamic", NULL, CLI_CUSTOM, &o->dyn, .fn = parse_dyn_flag, .given = &o->dyn_given,
         .meta = "B,D,M",
         .help = "dynamic (EAGLE-2) tree: expand the B best nodes per depth for D depths, keep the M best nodes "
                 "(root included)"},
        {"--max-nodes", NULL, CLI_INT, &o->max_nodes, .lo = 1, .hi = 1 << 16, .meta = "N",
         .help = "most tree nodes per target forward, root included (default: the tree's size, times the number "
                 "of drafts; <= -b)"},
        {"--draft-threads", NULL, CLI_INT, &o->draft_threads, .lo = 0, .hi = 1024, .meta = "N",
         .help = "threads of the draft models; 0 (default) = share the target's worker threads (two pools of busy "
                 "threads would fight for the cores)"},
        {"--draft-ngram", NULL, CLI_CUSTOM, &o->ngram, .fn = parse_ngram_flag, .given = &o->ngram_given,
         .meta = "N,K",
         .help = "prompt lookup: continue the latest earlier occurrence of the last n <= N tokens by up to K "
                 "tokens (no draft model needed; with --draft the trees are merged)"},
        {"--datastore", NULL, CLI_STRING, &o->datastore, .meta = "FILE|auto|none",
         .help = "the n-gram lookup also looks continuations up in this text corpus (indexed to FILE.sdsa on "
                 "first use); auto: data/datastore/NAME.txt made for the model (make datastore), which --head "
                 "auto also takes unless none is given"},
        {"--draft-skip", NULL, CLI_CUSTOM, &o->skip, .fn = parse_skip_flag, .given = &o->skip_given,
         .meta = "L1,L2,..|auto",
         .help = "self-speculation: the target with these layers (0-based; ranges A-B allowed) skipped drafts a "
                 "chain (adaptive length); auto searches a set on built-in calibration prompts first (progress on "
                 "stderr; tens of seconds)"},
        {"--save-skip", NULL, CLI_STRING, &o->save_skip, .meta = "FILE",
         .help = "--draft-skip auto: save the chosen set to FILE"},
        {"--load-skip", NULL, CLI_FILE, &o->load_skip, .what = "skip file",
         .meta = "FILE", .help = "--draft-skip auto: use the set saved in FILE instead of searching"},
        {"--lookahead", NULL, CLI_CUSTOM, &o->lookahead, .fn = parse_lookahead_flag, .given = &o->lookahead_given,
         .meta = "W,N,G",
         .help = "lookahead decoding: a Jacobi window of W columns x N-1 levels runs in the target's own forward "
                 "and harvests N-grams; up to G of them are verified per step (no draft model needed)"},
    };
    const cli_cmd cmd = {.name = "generate",
                         .usage = "usage: specdec generate -m MODEL.gguf -p PROMPT [options]",
                         .intro = GEN_INTRO,
                         .notes = GEN_NOTES,
                         .opts = opts,
                         .n_opts = CLI_N(opts)};
    const int r = cli_parse(&cmd, argc, argv);
    if (r == CLI_PARSE_OK && cli_gpu_setup() < 0) return CLI_PARSE_ERROR;
    return r;
}

// ---------------------------------------------------------------- validate
// The speculative setup: one method (a method string of specdec_spec.h, the
// shorthand flags' combination merged with '+'), and what the checks of its
// tree sizes need to know about it.
typedef struct gen_plan {
    int spec;                // 1: speculative decoding (some drafter)
    sd_method m;             // the method; m.name is its string ("chain:4", "tree:2-2+ngram:3-8", ...)
    const char *flag;        // the flag that chose it, for messages ("--method", "--draft-skip", ...)
    const char *shape_flag;  // the flag that set the draft-model tree's shape, for messages
    sd_method_plan pl;       // what it needs and takes (the library's plan)
    char label[SD_METHOD_NAME_MAX + 16];  // the method as reported (skip: the layers chosen)
} gen_plan;

// The shorthand flags (--draft-max, --tree, --tree-dynamic, --draft-ngram,
// --draft-skip, --lookahead) as one method string in s. 0, or 1 after a message.
static int gen_method_of_flags(const gen_opts *o, gen_plan *p, char *s, size_t n) {
    const char *solo = o->skip ? "--draft-skip" : o->lookahead ? "--lookahead" : NULL;
    const char *spec_only = o->tree ? "--tree" : o->dyn ? "--tree-dynamic" : o->draft_max_given;
    if (o->skip && o->lookahead) return cli_error("generate: --draft-skip and --lookahead cannot be used together");
    if (solo && (o->n_drafts || o->ngram || o->tree_auto || spec_only))
        return cli_error("generate: %s drafts on its own; it cannot be combined with %s", solo,
                         o->n_drafts ? "--draft"
                         : o->ngram  ? "--draft-ngram"
                         : o->tree_auto ? "--tree auto"
                                        : spec_only);
    if (o->tree_auto && (o->tree || o->dyn || o->draft_max_given))
        return cli_error("generate: --tree auto chooses the tree; it cannot be combined with %s",
                         o->tree ? "--tree" : o->dyn ? "--tree-dynamic" : "--draft-max");
    if (o->head && (o->n_drafts || o->ngram || solo))
        return cli_error("generate: --head drafts on its own; it cannot be combined with %s",
                         o->n_drafts ? "--draft" : o->ngram ? "--draft-ngram" : solo);
    if (!o->n_drafts && !o->head && spec_only)
        return cli_error("generate: %s needs a draft model (--draft D.gguf) or a head (--head H.gguf)", spec_only);
    if (o->tree && o->dyn) return cli_error("generate: --tree and --tree-dynamic cannot be used together");
    if (o->draft_max_given && (o->tree || o->dyn))
        return cli_error("generate: --draft-max sets the chain length; it cannot be combined with %s",
                         o->tree ? "--tree" : "--tree-dynamic");
    char model[SD_METHOD_NAME_MAX] = "", ngram[SD_METHOD_NAME_MAX] = "";
    if (o->head) {
        if (o->tree_auto) snprintf(model, sizeof model, "eagle3:auto");
        else if (o->tree) snprintf(model, sizeof model, "eagle3:tree:%s", o->tree);
        else if (o->dyn) snprintf(model, sizeof model, "eagle3:dyn:%s", o->dyn);
        else if (o->draft_max_given) snprintf(model, sizeof model, "eagle3:chain:%d", o->draft_max);
        else   // the library's default: prompt lookup (sized with a datastore), else the head
            snprintf(model, sizeof model, "%s",
                     sd_method_default(&(sd_method_have){.eagle3_head = 1, .datastore = o->ds_path[0] != 0}));
    } else if (o->n_drafts) {
        if (o->tree_auto) snprintf(model, sizeof model, "tree:auto");
        else if (o->tree) snprintf(model, sizeof model, "tree:%s", o->tree);
        else if (o->dyn) snprintf(model, sizeof model, "dyn:%s", o->dyn);
        else snprintf(model, sizeof model, "chain:%d", o->draft_max);
    }
    // --tree auto alone: n-gram lookup with an automatic tree
    const char *ng = o->ngram ? o->ngram : o->tree_auto && !o->n_drafts && !o->head ? "3,8" : NULL;
    if (ng) snprintf(ngram, sizeof ngram, "ngram:%s%s", ng, o->tree_auto ? ":auto" : "");
    if (o->skip) snprintf(s, n, "skip:auto");   // the layer list replaces "auto" once parsed
    else if (o->lookahead) snprintf(s, n, "lookahead:%s", o->lookahead);
    else snprintf(s, n, "%.60s%s%.60s", model, model[0] && ngram[0] ? "+" : "", ngram);
    for (char *c = s; *c; c++)
        if (*c == ',') *c = '-';
    p->flag = solo ? solo : o->head ? "--head" : o->n_drafts ? "--draft" : "--draft-ngram";
    p->shape_flag = o->tree_auto ? "--tree auto" : o->tree ? "--tree" : o->dyn ? "--tree-dynamic" : "--draft-max";
    return 0;
}

// The shorthand flags with an MoA drafter loaded: their method with moa: in
// place of eagle3: (the file's type is known only once it is loaded). 0, or 1.
static int gen_plan_moa(const gen_opts *o, gen_plan *p) {
    char s[SD_METHOD_NAME_MAX], err[1024], *e;
    snprintf(s, sizeof s, "%s", p->m.name);
    while ((e = strstr(s, "eagle3")) != NULL) memmove(e + 3, e + 6, strlen(e + 6) + 1), memcpy(e, "moa", 3);
    sd_method_have have = {.n_drafts = o->n_drafts, .n_batch = o->n_batch, .max_nodes = o->max_nodes, .moa_head = 1};
    if (sd_method_parse(s, &p->m, err, sizeof err) < 0 || sd_method_plan_make(&p->m, &have, &p->pl, err, sizeof err) < 0)
        return cli_error("%s: %s", p->flag, err);
    snprintf(p->label, sizeof p->label, "%s", p->m.name);
    return 0;
}

// --method or the shorthand flags -> p->m. 0, or 1 after a message.
static int gen_plan_method(const gen_opts *o, gen_plan *p) {
    char s[SD_METHOD_NAME_MAX] = "", err[1024];
    if (o->method) {
        const char *alias = o->draft_max_given ? o->draft_max_given : o->tree_given ? o->tree_given
                          : o->dyn_given ? o->dyn_given : o->ngram_given ? o->ngram_given
                          : o->skip_given ? o->skip_given : o->lookahead_given;
        if (alias) return cli_error("generate: %s and %s cannot be used together", o->method_given, alias);
        snprintf(s, sizeof s, "%s", o->method);
        p->flag = p->shape_flag = o->method_given;
    } else if (gen_method_of_flags(o, p, s, sizeof s)) {
        return 1;
    }
    if (!s[0]) return 0;   // no drafter
    if (sd_method_parse(s, &p->m, err, sizeof err) < 0) return cli_error("%s: %s", p->flag, err);
    // a layer list may hold ranges A-B, which a method string cannot: the flag's list is kept as given
    if (o->skip) snprintf(p->m.skip_list, sizeof p->m.skip_list, "%s", o->skip);
    // what the method needs and takes (the library's plan; --head FILE is taken for the kind the method
    // needs here and checked when loaded)
    sd_method_have have = {.n_drafts = o->n_drafts, .eagle3_head = o->head != NULL, .n_batch = o->n_batch,
                           .max_nodes = o->max_nodes, .moa_head = o->head != NULL, .medusa_head = o->head != NULL};
    const int prc = sd_method_plan_make(&p->m, &have, &p->pl, err, sizeof err);
    if (prc == SD_ERR_NO_ROOM)
        return cli_error("%s: the tree has %d nodes (root included), more than %s %d", p->shape_flag,
                         p->pl.model_nodes ? p->pl.model_nodes : p->pl.step_rows,
                         o->max_nodes > 0 ? "--max-nodes" : "the batch size, -b", o->max_nodes > 0 ? o->max_nodes : o->n_batch);
    if (prc < 0)
        return cli_error("generate: %s: %s%s", p->flag, err,
                         p->m.needs_draft_model && !o->n_drafts ? " (--draft D.gguf)"
                         : (p->m.needs_head == SD_HEAD_EAGLE3 || p->m.needs_head == SD_HEAD_MOA) && !o->head
                             ? " (--head H.gguf or --head auto)"
                                                                            : "");
    p->spec = p->pl.spec;
    if (o->method && o->head && !p->m.needs_head && p->m.kind != SD_METHOD_AUTO)
        return cli_error("generate: %s %s does not draft with a head; drop --head", o->method_given, o->method);
    if (o->method && !p->pl.uses_drafts && o->n_drafts)
        return cli_error("generate: %s %s does not use a draft model; drop --draft (--draft-ngram N,K with --draft "
                         "merges n-gram and draft-model trees)", o->method_given, o->method);
    snprintf(p->label, sizeof p->label, "%s", p->m.name);
    return 0;
}

// Cross-flag checks; the flags become p. 0, or 1 after a message.
static int gen_validate(gen_opts *o, gen_plan *p) {
    memset(p, 0, sizeof *p);
    if (o->system && !o->chat) return cli_error("generate: --system needs --chat");
    if (o->n_threads <= 0) o->n_threads = sd_n_cores();
    if (o->max_nodes == 1) return cli_error("--max-nodes: a tree needs at least 2 nodes, got 1");
    if (o->max_nodes > o->n_batch)
        return cli_error("--max-nodes %d is larger than the batch size (-b %d)", o->max_nodes, o->n_batch);
    const int ds_quiet = o->json ? 1 : o->verbose ? 0 : CLI_HEAD_QUIET_FOUND;
    if (cli_datastore_resolve(o->datastore, o->head, o->model_path, ds_quiet, o->ds_path, sizeof o->ds_path)) return 1;
    if (gen_plan_method(o, p)) return 1;
    if (o->save_head && !o->head_online) return cli_error("generate: --save-head needs --head-online");
    if (o->head_online && (!o->head || !p->spec || (p->m.needs_head != SD_HEAD_EAGLE3 && p->m.kind != SD_METHOD_AUTO)))
        return cli_error("generate: --head-online needs an EAGLE-3 head drafting (--head H.gguf)");
    const int skip_auto = p->m.kind == SD_METHOD_SKIP && !strcmp(p->m.skip_list, "auto");
    if ((o->save_skip || o->load_skip) && !skip_auto)
        return cli_error("generate: %s needs --draft-skip auto (or --method skip:auto)",
                         o->save_skip ? "--save-skip" : "--load-skip");
    if (o->save_skip && o->load_skip) return cli_error("generate: --save-skip and --load-skip cannot be used together");
    if (o->ds_path[0] && !p->pl.uses_ngram) {
        if (o->datastore) return cli_error("generate: --datastore needs an n-gram lookup (--draft-ngram N,K, or a --method with ngram)");
        o->ds_path[0] = 0;   // found for --head auto, but the method does no lookup
    }
    if (o->max_nodes > 0 && !p->spec)
        return cli_error("generate: --max-nodes needs a drafter (--draft, --draft-ngram, --draft-skip, --lookahead, "
                         "--method)");
    if (o->p_min_given && !p->pl.model_nodes && p->m.kind != SD_METHOD_SKIP)
        return cli_error("generate: --draft-p-min needs a draft model (--draft D.gguf) or --draft-skip");
    for (int i = 0; i < o->n_drafts; i++)
        if (!cli_file_ok("draft model file", o->draft_paths[i])) return 1;
    return 0;
}

// ---------------------------------------------------------------- build
// Everything a run owns.
typedef struct gen_state {
    sd_model *m;
    sd_model_info info;
    sd_session *s;
    sd_sampler *smp;
    sd_model *drafts[SD_METHOD_MAX_DRAFTS];  // (n_drafts) loaded draft models
    sd_head *head;                           // --head, or NULL
    sd_drafter *drafter;                     // NULL without speculative decoding
    sd_cost_curve *cost;                     // the target's forward cost (automatic trees), or NULL
    int32_t *ids;                            // (n_ids) prompt tokens
    int n_ids;
    gen_out out;
} gen_state;

static void gen_free(gen_state *g) {
    gen_out_free(&g->out);
    free(g->ids);
    sd_drafter_free(g->drafter);
    sd_cost_curve_free(g->cost);
    sd_head_free(g->head);
    for (int i = 0; i < SD_METHOD_MAX_DRAFTS; i++) sd_model_free(g->drafts[i]);
    sd_sampler_free(g->smp);
    sd_session_free(g->s);
    sd_model_free(g->m);
}

// The prompt (chat-formatted with --chat) as tokens in g->ids. 0, or 1 after a message.
// A plain prompt is text: special-token texts in it are not parsed (as the
// server's completions); with --chat the template's markers are the special
// tokens and the messages are text (sd_chat_tokenize).
static int gen_tokenize(const gen_opts *o, gen_state *g) {
    char err[512];
    int chat_failed = 0;
    g->n_ids = cli_tokenize_prompt(sd_model_tokenizer(g->m), o->system, o->prompt, o->chat, &g->ids, err, sizeof err,
                                   &chat_failed);
    if (g->n_ids < 0) return cli_error("%s%s", chat_failed ? "--chat: " : "generate: ", err);
    return 0;
}

// Layer skipping: the search for skip:auto (or --load-skip) once, before the
// drafter is built, and the set chosen in the label. 0, or 1 after a message.
static int gen_prepare_skip(const gen_opts *o, gen_plan *p, const sd_method_env *env) {
    char err[512];
    const int searched = !strcmp(p->m.skip_list, "auto");
    double est = 0;
    if (sd_method_prepare(&p->m, env, &est, err, sizeof err) < 0) return cli_error("%s: %s", p->flag, err);
    if (searched && o->load_skip) {
        fprintf(stderr, "specdec: skip set loaded from %s: {%s}\n", o->load_skip, p->m.skip_list);
    } else if (searched) {
        fprintf(stderr, "specdec: skip set chosen: {%s} (estimated %.2fx)\n", p->m.skip_list, est);
        if (est < 1.0)
            fprintf(stderr, "specdec: warning: layer skipping is not expected to pay on this model "
                            "(estimated %.2fx of plain decoding)\n", est);
        if (o->save_skip) fprintf(stderr, "specdec: skip set saved to %s\n", o->save_skip);
    }
    snprintf(p->label, sizeof p->label, "skip:%.*s", (int)sizeof p->label - 8, p->m.skip_list);
    return 0;
}

// The drafter of plan p in g->drafter: the target's cost curve first for
// automatic trees, the draft models, the skip search. 0, or 1 after a message.
static int gen_build_drafter(const gen_opts *o, gen_plan *p, gen_state *g) {
    char err[512];
    sd_method_env env = sd_method_env_default(g->m);
    env.drafts = (const sd_model *const *)g->drafts;
    env.n_drafts = o->n_drafts;
    env.n_ctx = sd_session_n_ctx(g->s);
    env.n_threads = o->draft_threads;
    env.pool = o->draft_threads ? NULL : sd_session_pool(g->s);
    env.p_min = o->p_min;
    env.datastore = o->ds_path[0] ? o->ds_path : NULL;
    env.skip_save = o->save_skip;
    env.skip_load = o->load_skip;
    env.auto_nodes = p->pl.auto_nodes;
    env.report = on_report;
    env.user = (void *)&o->verbose;
    cli_env_set_head(&env, g->head);
    env.head_online.on = o->head_online;
    env.head_bits = o->head_bits;
    env.head_online.lr = o->online_lr;
    if (p->m.uses_cost_curve) {   // the target's cost curve, measured on the empty session before the prompt
        double t0 = sd_time_ms();
        if (sd_cost_curve_new(&g->cost, g->s, p->pl.max_nodes, err, sizeof err) < 0)
            return cli_error("%s: %s", o->method ? o->method_given : "--tree auto", err);
        env.cost = g->cost;
        char desc[128];
        sd_cost_curve_describe(g->cost, desc, sizeof desc);
        if (o->verbose) fprintf(stderr, "specdec: tree auto: target cost measured in %.0f ms: %s\n", sd_time_ms() - t0, desc);
    }
    if (p->m.kind == SD_METHOD_SKIP && gen_prepare_skip(o, p, &env)) return 1;
    for (int i = 0; i < o->n_drafts; i++)
        if (sd_model_load(&g->drafts[i], o->draft_paths[i], err, sizeof err) < 0)
            return cli_error("cannot load draft model '%s': %s", o->draft_paths[i], err);
    if (sd_method_make(&p->m, &env, &g->drafter, err, sizeof err) < 0) return cli_error("%s: %s", p->flag, err);
    if (o->ds_path[0] && o->verbose && !o->json) fprintf(stderr, "specdec: %s\n", sd_drafter_note(g->drafter));
    return 0;
}

// Loads the model, tokenizes the prompt, creates the session, the sampler
// and the drafter. 0, or 1 after a message.
static int gen_build(const gen_opts *o, gen_plan *p, gen_state *g) {
    char err[512];
    if (pp_model_load(&g->m, o->model_path, err, sizeof err) < 0)
        return cli_error("cannot load model '%s': %s", o->model_path, err);
    sd_model_get_info(g->m, &g->info);
    if (gen_tokenize(o, g)) return 1;
    sd_session_params ssp = sd_session_default_params();
    ssp.n_ctx = o->n_ctx;
    ssp.n_batch = o->n_batch;
    ssp.n_threads = o->n_threads;
    if (sd_session_new(&g->s, g->m, &ssp, err, sizeof err) < 0) return cli_error("cannot create a session: %s", err);
    if (pp_attach(g->s, err, sizeof err) < 0) return cli_error("%s", err);
    if (g->n_ids > sd_session_n_ctx(g->s))
        return cli_error("prompt has %d tokens but the context is %d (-c)", g->n_ids, sd_session_n_ctx(g->s));
    if (sd_sampler_new(&g->smp, &o->sp, g->info.n_vocab, err, sizeof err) < 0) return cli_error("%s", err);
    if (o->head) {
        // auto: the kind the method needs (an EAGLE-3 head when it names none). Said on stderr: the file
        // found, with -v; none found, always (then plain decoding, whose summary line names no method),
        // except for a method that needs a head, which stops with its own message below
        const sd_head_type need = o->method ? p->m.needs_head : SD_HEAD_NONE;
        const int quiet = o->json || need ? 1 : o->verbose ? 0 : CLI_HEAD_QUIET_FOUND;
        if (cli_head_load_type(o->head, g->m, o->model_path, need, quiet, &g->head))
            return 1;
        if (!g->head && need)
            return cli_error("generate: method '%s' needs %s %s: --head auto found none made for %s in heads/ "
                             "(name a file with --head, or train one: specdec train-head --type %s)", p->m.name,
                             need == SD_HEAD_MEDUSA ? "a" : "an", cli_head_kind_name(need), o->model_path,
                             cli_head_kind_arg(need));
        if (!g->head) {   // --head auto found none and the method is the default: plain decoding
            p->spec = 0;
            p->pl.max_nodes = 1;
        } else if (!o->json) {
            char desc[512];
            sd_head_describe(g->head, desc, sizeof desc);
            if (o->verbose && strcmp(o->head, "auto")) fprintf(stderr, "specdec: %s\n", desc);
        }
        if (g->head && sd_head_get_type(g->head) == SD_HEAD_MOA && !o->method && gen_plan_moa(o, p)) return 1;
    }
    if (p->spec && gen_build_drafter(o, p, g)) return 1;
    if (gen_out_init(&g->out, sd_model_tokenizer(g->m), o->json, o->stops, o->n_stops, sd_session_n_ctx(g->s), err,
                     sizeof err) < 0)
        return cli_error("%s", err);
    return 0;
}

// ---------------------------------------------------------------- run
// The result as one JSON object on stdout (--json). 0, or -1 when it could
// not be built or written.
static int gen_print_json(const gen_opts *o, const gen_plan *p, const gen_state *g, const sd_gen_stats *st,
                          const char *finish) {
    json_t *j = json_pack("{s:o, s:i, s:i, s:i, s:o, s:o, s:o, s:s, s:o}", "model",
                          cli_json_str(o->model_path, strlen(o->model_path)), "n_threads", o->n_threads,
                          "n_prompt_tokens", st->n_prompt_tokens, "n_generated", st->n_generated, "tokens_per_second",
                          cli_json_num(st->tokens_per_second, 3), "prompt_ms", cli_json_num(st->prompt_ms, 3),
                          "generate_ms", cli_json_num(st->generate_ms, 3), "finish_reason", finish, "text",
                          cli_json_str(g->out.text ? g->out.text : "", g->out.len));
    if (j && p->spec) {
        json_t *acc = json_array();
        for (int k = 1; acc && k <= st->max_depth && k <= SD_SPEC_MAX_DEPTH; k++)
            if (json_array_append_new(acc, cli_json_num(st->acceptance_by_depth[k], 4))) {
                json_decref(acc);
                acc = NULL;
            }
        json_t *spec = json_pack("{s:o, s:o, s:i, s:i, s:o, s:i, s:i, s:o, s:o, s:o}", "draft",
                                 cli_json_strs(o->draft_paths, o->n_drafts), "method",
                                 cli_json_str(p->label, strlen(p->label)), "max_nodes", p->pl.max_nodes,
                                 "n_target_forwards", st->n_target_forwards, "mean_accepted",
                                 cli_json_num(st->mean_accepted, 4), "n_draft_nodes", st->n_draft_nodes,
                                 "n_draft_accepted", st->n_draft_accepted, "acceptance_by_depth", acc, "draft_ms",
                                 cli_json_num(st->draft_ms, 3), "verify_ms", cli_json_num(st->verify_ms, 3));
        if (!spec || json_object_update_new(j, spec)) {
            json_decref(j);
            j = NULL;
        }
    }
    return cli_json_write(stdout, j);
}

// One line on stderr; -v: the prompt's and the drafter's statistics in detail.
static void gen_print_summary(const gen_opts *o, const gen_plan *p, const sd_gen_stats *st, const char *finish) {
    printf("\n");
    fflush(stdout);
    const double pp = st->prompt_ms > 0 ? st->n_prompt_tokens * 1000.0 / st->prompt_ms : 0.0;
    if (!o->verbose) {
        char spec[SD_METHOD_NAME_MAX + 96] = "";
        if (p->spec)
            snprintf(spec, sizeof spec, " | %s: %.2f tokens/forward", p->label, st->mean_accepted);
        fprintf(stderr, "specdec: %d tokens in %.0f ms (%.1f tok/s) | prompt %d tokens (%.0f tok/s)%s | %d threads | %s\n",
                st->n_generated, st->generate_ms, st->tokens_per_second, st->n_prompt_tokens, pp, spec, o->n_threads,
                finish);
        return;
    }
    fprintf(stderr,
            "specdec: prompt %d tokens in %.1f ms (%.1f tok/s, %s activations) | generated %d tokens in %.1f ms "
            "(%.2f tok/s) | %d threads | finish: %s\n",
            st->n_prompt_tokens, st->prompt_ms, pp, o->fast_prompt ? "8-bit" : "float", st->n_generated,
            st->generate_ms, st->tokens_per_second, o->n_threads, finish);
    if (!p->spec) return;
    char acc[256];
    size_t ao = 0;
    acc[0] = 0;
    for (int k = 1; k <= st->max_depth && k <= SD_SPEC_MAX_DEPTH && ao < sizeof acc - 16; k++)
        ao += (size_t)snprintf(acc + ao, sizeof acc - ao, "%s%.2f", k > 1 ? " " : "", st->acceptance_by_depth[k]);
    fprintf(stderr,
            "specdec: speculative %s (%d draft model%s, max %d nodes): %d target forwards, mean accepted %.2f "
            "tokens/forward | acceptance by depth [%s] | draft %.1f ms, verify %.1f ms\n",
            p->label, o->n_drafts, o->n_drafts == 1 ? "" : "s", p->pl.max_nodes, st->n_target_forwards,
            st->mean_accepted, acc, st->draft_ms, st->verify_ms);
}

// Generates (Ctrl-C stops it) and prints the text and the statistics. 0, or 1 after a message.
static int gen_run(const gen_opts *o, const gen_plan *p, gen_state *g) {
    char err[512];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = o->n_predict;
    gp.n_batch = o->n_batch;
    gp.fast_prompt = o->fast_prompt;
    gp.max_nodes = p->spec ? p->pl.max_nodes : 1;
    sd_gen_stats st;
    int grc = sd_generate(g->s, g->smp, g->drafter, g->ids, g->n_ids, &gp, on_token, &g->out, &st, err, sizeof err);
    signal(SIGINT, SIG_DFL);
    gen_out_finish(&g->out);
    if (grc < 0) {
        if (!o->json) fputc('\n', stdout);
        return cli_error("%s", err);
    }
    const char *finish = g_interrupted ? "interrupted" : sd_finish_name(st.finish);
    if (o->json) {
        if (gen_print_json(o, p, g, &st, finish)) return cli_error("cannot write the JSON result");
    } else {
        gen_print_summary(o, p, &st, finish);
    }
    if (g->out.oom) fprintf(stderr, "specdec: warning: out of memory, the text is incomplete\n");
    return o->head_online && g->drafter ? cli_head_online_end(g->drafter, o->save_head, o->json) : 0;
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    gen_plan p;
    int r = gen_parse(argc, argv, &o);
    if (r != CLI_PARSE_OK) return cli_parse_exit(r);
    if (gen_validate(&o, &p)) return 1;
    gen_state g;
    memset(&g, 0, sizeof g);
    int rc = gen_build(&o, &p, &g);
    if (!rc) rc = gen_run(&o, &p, &g);
    gen_free(&g);
    return rc;
}
