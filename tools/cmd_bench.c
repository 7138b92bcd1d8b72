// cmd_bench.c - specdec bench: Spec-Bench-style comparison of decoding
// methods (plain autoregressive, draft-model chains and trees, ...) on a set
// of prompts, with speedups measured against `ar` in the same run.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_prompts.h"
#include "cli_common.h"
#include "specdec.h"
#include "specdec_spec.h"

#define BENCH_MAX_METHODS 32
#define BENCH_BATCH 512   // target session batch: prompt chunks and tree nodes

static void usage(FILE *f) {
    fprintf(f,
            "usage: specdec bench -m TARGET.gguf --prompts FILE.jsonl [options]\n"
            "\n"
            "Runs every method on every prompt of a Spec-Bench JSON-lines file (one object\n"
            "per line: {\"question_id\", \"category\", \"turns\": [...]}; the first turn is the\n"
            "prompt, wrapped in the model's chat template) and reports, per category and\n"
            "overall, tokens/s, the speedup over ar measured in the same run, tau (tokens\n"
            "per target forward, bonus included) and, when greedy, whether every method's\n"
            "text equals ar's token for token (a mismatch is reported on stderr and makes\n"
            "the exit status 1). tokens/s = generated tokens / generation time; prompt\n"
            "processing by the target is excluded (a draft model's first pass over the\n"
            "prompt happens inside generation and is included). A Markdown table goes to\n"
            "stdout, progress to stderr.\n"
            "\n"
            "options:\n"
            "  -m, --model FILE    target model (required)\n"
            "  --draft FILE        draft model; repeat for several (their trees are merged)\n"
            "  --prompts FILE      prompts, JSON lines (required)\n"
            "  --methods LIST      comma-separated methods (default ar,chain:4); ar is always\n"
            "                      run, first; every run gets fresh state (an empty KV cache\n"
            "                      and a new drafter). Methods: %s\n"
            "                      (chain:K = K draft tokens in a row; tree:W1-W2-.. = Wd\n"
            "                      children per node at depth d; dyn:B-D-M = EAGLE-2 dynamic\n"
            "                      tree, B expanded per depth, D depths, M nodes kept;\n"
            "                      ngram:N-K = prompt lookup, no draft model needed;\n"
            "                      skip:auto | skip:L1-L2-.. = layer-skip self-speculation: the\n"
            "                      target with those layers (0-based) skipped drafts a chain of\n"
            "                      up to 8 tokens (adaptive length); auto searches the set once per\n"
            "                      bench run, before the first prompt, on built-in calibration\n"
            "                      prompts (progress and the chosen set on stderr);\n"
            "                      lookahead:W-N-G = lookahead decoding: a Jacobi window of W\n"
            "                      columns x N-1 levels in the target's forward, up to G N-grams\n"
            "                      verified per step;\n"
            "                      auto = the best drafter available with an automatically sized\n"
            "                      tree (at most %d nodes), from the target's forward cost\n"
            "                      (measured once per bench run before the first prompt; min of 3\n"
            "                      timings per size): with --draft the draft model(s), tree =\n"
            "                      the Sequoia-style optimum of expected tokens/s from the\n"
            "                      acceptance by depth and sibling rank learnt while generating\n"
            "                      (tree:auto is the same for draft models only); without it\n"
            "                      n-gram lookup (ngram:3-8) sized at every step: the candidates\n"
            "                      whose expected accepted tokens beat their forward cost, from\n"
            "                      acceptance rates by match length learnt while generating\n"
            "  -n, --n-predict N   most tokens generated per prompt (default 128)\n"
            "  --temp T            temperature; 0 = greedy (default 0). Other sampling\n"
            "                      settings are generate's defaults\n"
            "  --seed S            random seed; the sampler is reseeded with S + prompt index\n"
            "                      before every run (default 12648430)\n"
            "  --limit N           only the first N prompts\n"
            "  --draft-p-min P     chain/tree drafts stop below this top probability (default 0)\n"
            "  --no-chat           use the prompt text as is (models without a chat template)\n"
            "  --fast-prompt       prompts with 8-bit activations (as generate --fast-prompt);\n"
            "                      prompt time is not part of tokens/s either way\n"
            "  -t, --threads N     threads (default: number of cores)\n"
            "  --draft-threads N   threads of the draft models; 0 (default) = share the target's\n"
            "  --out FILE          write the full results as JSON\n"
            "  -h, --help          show this help\n",
            sd_methods_syntax(), SD_METHOD_AUTO_NODES);
}

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

// Result of one method on one prompt.
typedef struct run_res {
    int n_tokens;       // tokens generated
    int n_forwards;     // target forwards after the prompt (spec); n_tokens - 1 for ar
    int n_step_tokens;  // tokens those forwards produced (n_tokens - 1)
    double gen_ms;      // generation time, prompt excluded
    int equal;          // 1: same tokens as ar (greedy only)
} run_res;

// Sums over a set of runs.
typedef struct agg {
    long n_tokens, n_forwards, n_step_tokens;
    double ms;
    int n_runs, n_equal;
} agg;

static void agg_add(agg *a, const run_res *r) {
    a->n_tokens += r->n_tokens;
    a->n_forwards += r->n_forwards;
    a->n_step_tokens += r->n_step_tokens;
    a->ms += r->gen_ms;
    a->n_runs++;
    a->n_equal += r->equal;
}

static double agg_tps(const agg *a) { return a->ms > 0 ? a->n_tokens * 1000.0 / a->ms : 0.0; }
static double agg_tau(const agg *a) { return a->n_forwards > 0 ? (double)a->n_step_tokens / a->n_forwards : 1.0; }

static void json_agg(FILE *f, const agg *a, const agg *ar, int greedy) {
    double tps = agg_tps(a), tar = agg_tps(ar);
    fprintf(f, "{\"tokens_per_s\": %.3f, \"speedup\": %.4f, \"tau\": %.4f, \"equal_to_ar\": %s, \"n_tokens\": %ld, "
               "\"time_ms\": %.3f, \"n_target_forwards\": %ld, \"n_prompts\": %d}",
            tps, tar > 0 ? tps / tar : 0.0, agg_tau(a), greedy ? (a->n_equal == a->n_runs ? "true" : "false") : "null",
            a->n_tokens, a->ms, a->n_forwards, a->n_runs);
}

// Tokenizes text (chat-formatted unless raw) into a malloc'd array; <0 on error.
static int tokenize_prompt(const sd_tokenizer *tok, const char *text, int chat, int32_t **out, char *err,
                           size_t errlen) {
    *out = NULL;
    char *formatted = NULL;
    if (chat) {
        size_t cap = strlen(text) + 4096;
        formatted = malloc(cap);
        if (!formatted) return snprintf(err, errlen, "out of memory"), -1;
        if (sd_chat_format(tok, NULL, text, formatted, cap, err, errlen) < 0) {
            free(formatted);
            return -1;
        }
        text = formatted;
    }
    size_t len = strlen(text);
    int max = (int)len + 16;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)max);
    int n = ids ? sd_tokenize(tok, text, len, 1, chat, ids, max) : -1;
    if (n > max) {
        int32_t *t = realloc(ids, sizeof(int32_t) * (size_t)n);
        if (t) {
            ids = t;
            n = sd_tokenize(tok, text, len, 1, chat, ids, n);
        } else {
            n = -1;
        }
    }
    free(formatted);
    if (n < 0) {
        free(ids);
        return snprintf(err, errlen, "cannot tokenize the prompt"), -1;
    }
    if (n == 0) {
        free(ids);
        return snprintf(err, errlen, "the prompt is empty (no tokens)"), -1;
    }
    *out = ids;
    return n;
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

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *prompts_path = NULL, *methods_arg = "ar,chain:4", *out_path = NULL;
    const char *draft_paths[SD_METHOD_MAX_DRAFTS];
    int n_drafts = 0, n_predict = 128, limit = 0, n_threads = 0, chat = 1, draft_threads = 0, fast_prompt = 0;
    float temp = 0.0f, p_min = 0.0f;
    uint64_t seed = sd_sampler_default_params().seed;
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
        } else if (!strcmp(a, "--draft")) {
            VAL();
            if (n_drafts == SD_METHOD_MAX_DRAFTS) return cli_error("--draft: at most %d draft models", SD_METHOD_MAX_DRAFTS);
            draft_paths[n_drafts++] = v;
        } else if (!strcmp(a, "--prompts")) {
            VAL();
            prompts_path = v;
        } else if (!strcmp(a, "--methods")) {
            VAL();
            methods_arg = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            VAL();
            if (cli_int(a, v, 1, 1 << 16, &n_predict)) return 1;
        } else if (!strcmp(a, "--temp")) {
            VAL();
            if (cli_float(a, v, 0.0, 100.0, &temp)) return 1;
        } else if (!strcmp(a, "--seed")) {
            VAL();
            if (cli_u64(a, v, &seed)) return 1;
        } else if (!strcmp(a, "--fast-prompt")) {
            fast_prompt = 1;
        } else if (!strcmp(a, "--limit")) {
            VAL();
            if (cli_int(a, v, 1, 1 << 30, &limit)) return 1;
        } else if (!strcmp(a, "--draft-p-min")) {
            VAL();
            if (cli_float(a, v, 0.0, 1.0, &p_min)) return 1;
        } else if (!strcmp(a, "--draft-threads")) {
            VAL();
            if (cli_int(a, v, 0, 1024, &draft_threads)) return 1;
        } else if (!strcmp(a, "--no-chat")) {
            chat = 0;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL();
            if (cli_int(a, v, 1, 1024, &n_threads)) return 1;
        } else if (!strcmp(a, "--out")) {
            VAL();
            out_path = v;
        } else {
            return cli_error("bench: unknown option '%s' (see specdec bench --help)", a);
        }
#undef VAL
    }
    if (!model_path) return cli_error("bench: a target model is required (-m MODEL.gguf; see specdec bench --help)");
    if (!prompts_path) return cli_error("bench: a prompts file is required (--prompts FILE.jsonl)");
    if (n_threads <= 0) n_threads = sd_n_cores();

    char err[1024];
    sd_method methods[BENCH_MAX_METHODS];
    int nm = sd_methods_parse(methods_arg, methods, BENCH_MAX_METHODS, err, sizeof err);
    if (nm < 0) return cli_error("%s", err);
    for (int k = 0; k < nm; k++) {
        if (methods[k].needs_draft_model && n_drafts == 0)
            return cli_error("bench: method '%s' needs a draft model (--draft D.gguf)", methods[k].name);
        if (methods[k].tree_nodes > BENCH_BATCH)
            return cli_error("bench: method '%s' makes trees of %d nodes, more than the batch (%d)", methods[k].name,
                             methods[k].tree_nodes, BENCH_BATCH);
    }
    if (!cli_file_ok("model file", model_path)) return 1;
    for (int i = 0; i < n_drafts; i++)
        if (!cli_file_ok("draft model file", draft_paths[i])) return 1;
    if (!cli_file_ok("prompts file", prompts_path)) return 1;
    bench_prompt *prompts = NULL;
    const int n_loaded = bench_prompts_load(prompts_path, &prompts, err, sizeof err);
    if (n_loaded < 0) return cli_error("%s", err);
    int np = limit > 0 && limit < n_loaded ? limit : n_loaded;

    int rc = 1, mismatch = 0;
    sd_model *m = NULL;
    sd_model *drafts[SD_METHOD_MAX_DRAFTS] = {0};
    sd_drafter *drafters[BENCH_MAX_METHODS] = {0};
    sd_session *s = NULL;
    sd_sampler *smp = NULL;
    int32_t **ids = calloc((size_t)np, sizeof *ids);
    int *n_ids = calloc((size_t)np, sizeof *n_ids);
    run_res *res = calloc((size_t)np * (size_t)nm, sizeof *res);
    int32_t *ar_tok = malloc(sizeof(int32_t) * (size_t)n_predict * (size_t)np);
    int *ar_n = calloc((size_t)np, sizeof *ar_n);
    tok_buf tb = {malloc(sizeof(int32_t) * (size_t)n_predict), 0, n_predict};
    tree_reports *reports = calloc(1, sizeof *reports);
    sd_cost_curve *cost = NULL;
    int max_nodes[BENCH_MAX_METHODS];
    // categories in order of first appearance
    const char **cats = calloc((size_t)np, sizeof *cats);
    int *cat_of = calloc((size_t)np, sizeof *cat_of);
    int n_cats = 0;
    agg *by_cat = NULL, *overall = NULL;
    if (!ids || !n_ids || !res || !ar_tok || !ar_n || !tb.t || !cats || !cat_of || !reports) {
        cli_error("out of memory");
        goto out;
    }
    for (int p = 0; p < np; p++) {
        int c = 0;
        while (c < n_cats && strcmp(cats[c], prompts[p].category)) c++;
        if (c == n_cats) cats[n_cats++] = prompts[p].category;
        cat_of[p] = c;
    }
    by_cat = calloc((size_t)nm * (size_t)n_cats, sizeof *by_cat);
    overall = calloc((size_t)nm, sizeof *overall);
    if (!by_cat || !overall) {
        cli_error("out of memory");
        goto out;
    }

    if (sd_model_load(&m, model_path, err, sizeof err) < 0) {
        cli_error("cannot load model '%s': %s", model_path, err);
        goto out;
    }
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    sd_model_info info;
    sd_model_get_info(m, &info);
    int max_prompt = 0, max_tree = 1;
    for (int p = 0; p < np; p++) {
        n_ids[p] = tokenize_prompt(tok, prompts[p].text, chat, &ids[p], err, sizeof err);
        if (n_ids[p] < 0) {
            cli_error("prompt %s (%s, line %d): %s%s", prompts[p].id, prompts_path, prompts[p].line, err,
                      chat ? " (--no-chat uses the text as is)" : "");
            goto out;
        }
        max_prompt = SD_MAX(max_prompt, n_ids[p]);
    }
    int max_extra = 0, auto_nodes = 0;
    for (int k = 0; k < nm; k++) {
        max_nodes[k] = SD_MIN(sd_method_default_nodes(&methods[k], n_drafts), BENCH_BATCH);
        max_tree = SD_MAX(max_tree, max_nodes[k]);
        max_extra = SD_MAX(max_extra, methods[k].extra_nodes);
        if (methods[k].uses_cost_curve) auto_nodes = SD_MAX(auto_nodes, max_nodes[k]);
    }
    sd_session_params ssp = sd_session_default_params();
    ssp.n_ctx = max_prompt + n_predict + max_tree + max_extra + 8;
    ssp.n_batch = BENCH_BATCH;
    ssp.n_threads = n_threads;
    if (sd_session_new(&s, m, &ssp, err, sizeof err) < 0) {
        cli_error("cannot create a session: %s", err);
        goto out;
    }
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = temp;
    sp.seed = seed;
    if (sd_sampler_new(&smp, &sp, info.n_vocab, err, sizeof err) < 0) {
        cli_error("%s", err);
        goto out;
    }
    sd_method_env env = sd_method_env_default(m);
    env.drafts = (const sd_model *const *)drafts;
    env.n_drafts = n_drafts;
    env.n_ctx = sd_session_n_ctx(s);
    env.n_threads = draft_threads;
    env.pool = draft_threads ? NULL : sd_session_pool(s);
    env.p_min = p_min;
    env.report = on_report;
    env.user = reports;
    if (auto_nodes > 0) {   // the target's cost curve, once, on the empty session
        double t0 = sd_time_ms();
        if (sd_cost_curve_new(&cost, s, auto_nodes, err, sizeof err) < 0) {
            cli_error("automatic tree: %s", err);
            goto out;
        }
        env.cost = cost;
        char cdesc[128];
        sd_cost_curve_describe(cost, cdesc, sizeof cdesc);
        fprintf(stderr, "tree auto: target cost measured in %.0f ms: %s\n", sd_time_ms() - t0, cdesc);
    }
    for (int i = 0; i < n_drafts; i++) {
        if (sd_model_load(&drafts[i], draft_paths[i], err, sizeof err) < 0) {
            cli_error("cannot load draft model '%s': %s", draft_paths[i], err);
            goto out;
        }
    }
    // Every drafter is built once here to report problems (vocabulary
    // mismatch, ...) before any run, then freed: each run builds a fresh one
    // and frees it afterwards, so that no idle drafter (its session's worker
    // threads) competes with the method being timed.
    for (int k = 0; k < nm; k++) {
        double est = 0;
        reports->method = methods[k].name;
        if (sd_method_prepare(&methods[k], &env, &est, err, sizeof err) < 0) {   // skip:auto: the search, once
            cli_error("method '%s': %s", methods[k].name, err);
            goto out;
        }
        if (methods[k].kind == SD_METHOD_SKIP && est > 0) {
            fprintf(stderr, "skip set chosen for %s: {%s} (estimated %.2fx)\n", methods[k].name, methods[k].skip_list,
                    est);
            if (est < 1.0)
                fprintf(stderr, "warning: %s: layer skipping is not expected to pay on this model (estimated %.2fx "
                                "of plain decoding)\n", methods[k].name, est);
        }
        if (sd_method_make(&methods[k], &env, &drafters[k], err, sizeof err) < 0) {
            cli_error("method '%s': %s", methods[k].name, err);
            goto out;
        }
        sd_drafter_free(drafters[k]);
        drafters[k] = NULL;
    }

    const int greedy = temp <= 0.0f;
    const int tty = isatty(2);
    const int total = np * nm;
    for (int p = 0; p < np; p++) {
        for (int k = 0; k < nm; k++) {
            const sd_method *me = &methods[k];
            run_res *r = &res[(size_t)p * nm + k];
            fprintf(stderr, "%s[%d/%d] %s %s q%s ...", tty ? "\r\033[K" : "", p * nm + k + 1, total, me->name,
                    prompts[p].category, prompts[p].id);
            fflush(stderr);
            if (sd_session_truncate(s, 0, err, sizeof err) < 0) {
                fputc('\n', stderr);
                cli_error("%s", err);
                goto out;
            }
            reports->method = me->name;
            reports->in_run = 1;
            if (sd_method_make(me, &env, &drafters[k], err, sizeof err) < 0) {
                fputc('\n', stderr);
                cli_error("method '%s': %s", me->name, err);
                goto out;
            }
            sd_sampler_reseed(smp, seed + (uint64_t)p);
            tb.n = 0;
            sd_gen_params gp = sd_gen_default_params();
            gp.n_predict = n_predict;
            gp.n_batch = BENCH_BATCH;
            gp.fast_prompt = fast_prompt;
            gp.max_nodes = max_nodes[k];
            sd_gen_stats st;
            int grc = sd_generate(s, smp, drafters[k], ids[p], n_ids[p], &gp, collect, &tb, &st, err, sizeof err);
            r->n_tokens = st.n_generated;
            r->gen_ms = st.generate_ms;
            r->n_forwards = st.n_target_forwards;
            r->n_step_tokens = st.n_generated > 0 ? st.n_generated - 1 : 0;
            sd_drafter_free(drafters[k]);
            drafters[k] = NULL;
            if (grc < 0) {
                fputc('\n', stderr);
                cli_error("method '%s' on prompt %s: %s", me->name, prompts[p].id, err);
                goto out;
            }
            int n_got = SD_MIN(tb.n, n_predict);
            char mis[1024];
            mis[0] = 0;
            if (k == 0) {   // ar
                memcpy(ar_tok + (size_t)p * n_predict, tb.t, sizeof(int32_t) * (size_t)n_got);
                ar_n[p] = n_got;
                r->equal = 1;
            } else if (greedy) {
                const int32_t *ref = ar_tok + (size_t)p * n_predict;
                int d = 0;
                while (d < n_got && d < ar_n[p] && tb.t[d] == ref[d]) d++;
                r->equal = d == n_got && d == ar_n[p];
                if (!r->equal) {
                    char ta[96] = "(end)", tm[96] = "(end)";
                    if (d < ar_n[p]) token_str(tok, ref[d], ta, sizeof ta);
                    if (d < n_got) token_str(tok, tb.t[d], tm, sizeof tm);
                    snprintf(mis, sizeof mis,
                             "specdec: MISMATCH: method %.63s differs from ar on prompt %.63s (%.63s) at generated token "
                             "%d: ar %d '%.95s', %.63s %d '%.95s' (ar %d tokens, %.63s %d tokens)\n",
                             me->name, prompts[p].id, prompts[p].category, d, d < ar_n[p] ? ref[d] : -1, ta,
                             me->name, d < n_got ? tb.t[d] : -1, tm, ar_n[p], me->name, n_got);
                    mismatch = 1;
                }
            }
            agg_add(&overall[k], r);
            agg_add(&by_cat[(size_t)k * n_cats + cat_of[p]], r);
            double tau = r->n_forwards > 0 ? (double)r->n_step_tokens / r->n_forwards : 1.0;
            if (!reports->in_run && !tty) fputs("   ", stderr);   // the run's result after the tree reports
            reports->in_run = 0;
            fprintf(stderr, " %d tokens, %.2f tok/s, tau %.2f%s", r->n_tokens,
                    r->gen_ms > 0 ? r->n_tokens * 1000.0 / r->gen_ms : 0.0, tau, tty && !mis[0] ? "" : "\n");
            if (mis[0]) fputs(mis, stderr);   // loudly, on a line of its own
            fflush(stderr);
        }
    }
    if (tty) fputc('\n', stderr);

    // ---------------------------------------------------------------- report
    printf("## specdec bench\n\n");
    printf("target `%s`", model_path);
    for (int i = 0; i < n_drafts; i++) printf("%s`%s`", i ? ", " : ", draft ", draft_paths[i]);
    printf("; %d prompts from `%s`; n_predict %d; temp %g; %d threads (drafts: %d).\n", np, prompts_path,
           n_predict, (double)temp, n_threads, draft_threads);
    printf("tokens/s = generated tokens / generation time, target prompt processing excluded; "
           "tau = tokens per target forward (bonus included).\n");
    for (int k = 0; k < nm; k++) {
        if (methods[k].kind == SD_METHOD_AUTO)
            printf("%s = %s with an automatically sized tree (at most %d nodes).\n", methods[k].name,
                   n_drafts ? "the draft model(s)" : "n-gram lookup ngram:3-8", max_nodes[k]);
        if (methods[k].kind == SD_METHOD_SKIP) printf("%s skips layers {%s}.\n", methods[k].name, methods[k].skip_list);
    }
    printf("\n");
    printf("| method | tokens/s | speedup | tau | tokens | time (s) | equal to ar |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for (int k = 0; k < nm; k++) {
        const agg *a = &overall[k];
        double t0 = agg_tps(&overall[0]);
        printf("| %s | %.2f | %.2fx | %.2f | %ld | %.1f | %s |\n", methods[k].name, agg_tps(a),
               t0 > 0 ? agg_tps(a) / t0 : 0.0, agg_tau(a), a->n_tokens, a->ms / 1000.0,
               !greedy ? "n/a (sampled)" : a->n_equal == a->n_runs ? "yes" : "**NO**");
    }
    printf("\nspeedup over ar by category (tau in parentheses):\n\n| method |");
    for (int c = 0; c < n_cats; c++) printf(" %s |", cats[c]);
    printf("\n| --- |");
    for (int c = 0; c < n_cats; c++) printf(" ---: |");
    printf("\n");
    for (int k = 0; k < nm; k++) {
        printf("| %s |", methods[k].name);
        for (int c = 0; c < n_cats; c++) {
            const agg *a = &by_cat[(size_t)k * n_cats + c], *a0 = &by_cat[c];
            double t0 = agg_tps(a0);
            printf(" %.2fx (%.2f) |", t0 > 0 ? agg_tps(a) / t0 : 0.0, agg_tau(a));
        }
        printf("\n");
    }
    fflush(stdout);

    if (out_path) {
        FILE *f = fopen(out_path, "w");
        if (!f) {
            cli_error("cannot write '%s'", out_path);
            goto out;
        }
        fprintf(f, "{\"model\": ");
        cli_json_string(f, model_path, strlen(model_path));
        fprintf(f, ", \"draft\": [");
        for (int i = 0; i < n_drafts; i++) {
            if (i) fprintf(f, ", ");
            cli_json_string(f, draft_paths[i], strlen(draft_paths[i]));
        }
        fprintf(f, "], \"prompts\": ");
        cli_json_string(f, prompts_path, strlen(prompts_path));
        fprintf(f, ", \"n_threads\": %d, \"draft_threads\": %d, \"temp\": %g, \"seed\": %llu, \"n_predict\": %d, \"n_prompts\": %d, "
                   "\"chat\": %s, \"time_excludes_prompt\": true, \"all_equal_to_ar\": %s, \"methods\": [",
                n_threads, draft_threads, (double)temp, (unsigned long long)seed, n_predict, np, chat ? "true" : "false",
                greedy ? (mismatch ? "false" : "true") : "null");
        for (int k = 0; k < nm; k++) {
            fprintf(f, "%s\n  {\"name\": ", k ? "," : "");
            cli_json_string(f, methods[k].name, strlen(methods[k].name));
            fprintf(f, ", \"max_nodes\": %d, \"overall\": ", max_nodes[k]);
            json_agg(f, &overall[k], &overall[0], greedy);
            fprintf(f, ", \"by_category\": {");
            for (int c = 0; c < n_cats; c++) {
                fprintf(f, "%s", c ? ", " : "");
                cli_json_string(f, cats[c], strlen(cats[c]));
                fprintf(f, ": ");
                json_agg(f, &by_cat[(size_t)k * n_cats + c], &by_cat[c], greedy);
            }
            fprintf(f, "}}");
        }
        fprintf(f, "\n]}\n");
        if (fclose(f) != 0) {
            cli_error("cannot write '%s'", out_path);
            goto out;
        }
    }
    if (mismatch) {
        cli_error("MISMATCH: some greedy method did not reproduce ar's text token for token (see above)");
        goto out;
    }
    rc = 0;
out:
    for (int k = 0; k < nm; k++) sd_drafter_free(drafters[k]);
    for (int i = 0; i < n_drafts; i++) sd_model_free(drafts[i]);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
    if (ids)
        for (int p = 0; p < np; p++) free(ids[p]);
    free(ids);
    free(n_ids);
    free(res);
    free(ar_tok);
    free(ar_n);
    free(tb.t);
    free(reports);
    free(cats);
    free(cat_of);
    free(by_cat);
    free(overall);
    bench_prompts_free(prompts, n_loaded);
    return rc;
}
