// cmd_generate.c - specdec generate: prompt in, text streamed out.
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "specdec.h"
#include "specdec_spec.h"

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
    signal(SIGINT, SIG_DFL); // a second Ctrl-C ends the program at once
}

static void usage(FILE *f) {
    sd_sampler_params sp = sd_sampler_default_params();
    fprintf(f,
            "usage: specdec generate -m MODEL.gguf -p PROMPT [options]\n"
            "\n"
            "Generates text from PROMPT and streams it to stdout; a one-line speed summary\n"
            "goes to stderr. Ctrl-C stops generation (what was generated is kept).\n"
            "\n"
            "options:\n"
            "  -m, --model FILE      GGUF model (required)\n"
            "  -p, --prompt TEXT     prompt (required)\n"
            "  -n, --n-predict N     most tokens to generate (default 256; 0 = until end or context full)\n"
            "  --chat                wrap the prompt in the model's chat template (ChatML, Llama 3)\n"
            "  --system TEXT         system message for --chat (default: the template's own)\n"
            "  --temp T              temperature; 0 = greedy (default %.2f)\n"
            "  --top-k K             keep the K most likely tokens; 0 = off (default %d)\n"
            "  --top-p P             nucleus sampling mass; 1 = off (default %.2f)\n"
            "  --min-p P             drop tokens below P x the top probability; 0 = off (default %.2f)\n"
            "  --repeat-penalty R    penalty for recently seen tokens; 1 = off (default %.2f)\n"
            "  --repeat-last-n N     tokens of history the penalty looks at (default %d)\n"
            "  --seed S              random seed (default %llu)\n"
            "  -t, --threads N       threads (default: number of cores, %d here)\n"
            "  -c, --ctx N           context length in tokens (default: min(model's, 4096))\n"
            "  -b, --batch N         prompt tokens per forward pass (default 512)\n"
            "  --fast-prompt         evaluate the prompt with 8-bit activations like the generated\n"
            "                        tokens (about 2x faster prompt; by default the prompt uses\n"
            "                        float activations: a more accurate cache and first token)\n"
            "  --json                print one JSON object at the end instead of streaming:\n"
            "                        text, n_prompt_tokens, n_generated, tokens_per_second,\n"
            "                        prompt_ms, generate_ms, model, n_threads, finish_reason\n"
            "                        (with --draft also: draft, method, n_target_forwards,\n"
            "                        mean_accepted, acceptance_by_depth, draft_ms, verify_ms, ...)\n"
            "  -h, --help            show this help\n"
            "\n"
            "speculative decoding (same text as without it when greedy, same distribution\n"
            "when sampling):\n"
            "  --draft FILE          draft model (GGUF, same vocabulary as the target); repeat\n"
            "                        the flag for several drafts, whose trees are merged\n"
            "  --draft-max K         chain draft: most draft tokens per step (default 4)\n"
            "  --draft-p-min P       stop drafting below this top draft probability (default 0)\n"
            "  --tree W1,W2,...      tree draft: W1 children of the root, W2 of each of those, ...\n"
            "  --tree-dynamic B,D,M  dynamic (EAGLE-2) tree: expand the B best nodes per depth for\n"
            "                        D depths, keep the M best nodes (root included)\n"
            "  --max-nodes N         most tree nodes per target forward, root included (default:\n"
            "                        the tree's size, times the number of drafts; <= -b)\n"
            "  --draft-threads N     threads of the draft models; 0 (default) = share the target's\n"
            "                        worker threads (two pools of busy threads would fight for the cores)\n"
            "  --draft-ngram N,K     prompt lookup: continue the latest earlier occurrence of the\n"
            "                        last n <= N tokens by up to K tokens (no draft model needed;\n"
            "                        with --draft the trees are merged)\n"
            "  --datastore FILE      --draft-ngram also looks continuations up in this text corpus\n"
            "  --tree auto           hardware-aware tree (Sequoia-style) for --draft and/or\n"
            "                        --draft-ngram: the target's forward cost is measured at start-up\n"
            "                        (ms against tree nodes), acceptance by depth and sibling rank is\n"
            "                        learnt while generating, and the tree maximising expected tokens/s\n"
            "                        (at most %d nodes) is drafted; the choice is printed on stderr\n"
            "                        when made and when it changes. Alone: --draft-ngram 3,8 + auto tree\n"
            "  --draft-skip L1,L2,..|auto  self-speculation: the target with these layers (0-based;\n"
            "                        ranges A-B allowed) skipped drafts a chain (adaptive length); auto\n"
            "                        searches a set on built-in calibration prompts first (progress on\n"
            "                        stderr; tens of seconds)\n"
            "  --save-skip FILE      --draft-skip auto: save the chosen set to FILE\n"
            "  --load-skip FILE      --draft-skip auto: use the set saved in FILE instead of searching\n"
            "  --lookahead W,N,G     lookahead decoding: a Jacobi window of W columns x N-1 levels runs\n"
            "                        in the target's own forward and harvests N-grams; up to G of them\n"
            "                        are verified per step (no draft model needed)\n"
            "Without --json a one-line summary of the speculative statistics goes to stderr.\n"
            "\n"
            "Sampling order: repetition penalty, temperature, top-k, top-p, min-p.\n",
            (double)sp.temp, sp.top_k, (double)sp.top_p, (double)sp.min_p, (double)sp.repeat_penalty,
            sp.repeat_last_n, (unsigned long long)sp.seed, sd_n_cores(), SD_METHOD_AUTO_NODES);
}

// Progress of the layer-skip search and the automatic tree's choices, on stderr.
static void on_report(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "specdec: %s\n", line);
}

typedef struct {
    const sd_tokenizer *tok;
    int json;         // 1: collect text, 0: stream to stdout
    char *text;       // (cap) generated bytes (json) or pending partial UTF-8 (stream)
    size_t len, cap;  // bytes used / allocated
    char *piece;      // (piece_cap) scratch for one token's text
    int piece_cap;
    int oom;          // an allocation failed: text is incomplete
} gen_out;

static int out_append(gen_out *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (o->len + n + 1 > cap) cap *= 2;
        char *t = realloc(o->text, cap);
        if (!t) {
            o->oom = 1;
            return -1;
        }
        o->text = t;
        o->cap = cap;
    }
    memcpy(o->text + o->len, s, n);
    o->len += n;
    o->text[o->len] = 0;
    return 0;
}

// Prints the complete UTF-8 characters of the pending bytes, keeps the rest.
static void stream_flush(gen_out *o, int final) {
    size_t n = final ? o->len : cli_utf8_complete(o->text, o->len);
    if (n) {
        fwrite(o->text, 1, n, stdout);
        memmove(o->text, o->text + n, o->len - n);
        o->len -= n;
    }
    fflush(stdout);
}

static int on_token(int32_t t, void *user) {
    gen_out *o = user;
    int n = sd_token_to_piece(o->tok, t, 0, o->piece, o->piece_cap);
    if (n > o->piece_cap) {
        char *p = realloc(o->piece, (size_t)n);
        if (p) {
            o->piece = p;
            o->piece_cap = n;
            n = sd_token_to_piece(o->tok, t, 0, o->piece, o->piece_cap);
        } else {
            n = o->piece_cap;
        }
    }
    if (n > 0) {
        out_append(o, o->piece, (size_t)n);
        if (!o->json) stream_flush(o, 0);
    }
    return g_interrupted ? 1 : 0;
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *system = NULL;
    int n_predict = 256, chat = 0, json = 0, n_threads = 0, n_ctx = 0, n_batch = 512, fast_prompt = 0;
    sd_sampler_params sp = sd_sampler_default_params();
    // speculative decoding
    const char *draft_paths[SD_METHOD_MAX_DRAFTS];
    int n_drafts = 0, draft_max = 4, max_nodes = 0, draft_threads = 0;
    float p_min = 0.0f;
    const char *tree_flag = NULL, *dyn_flag = NULL, *draft_max_flag = NULL, *spec_only_flag = NULL,
               *p_min_flag = NULL;
    const char *ngram_flag = NULL, *datastore = NULL;
    const char *skip_flag = NULL, *save_skip = NULL, *load_skip = NULL, *lookahead_flag = NULL;
    int tree_auto = 0;
    char perr[256];
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
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            VAL();
            prompt = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            VAL();
            if (cli_int(a, v, 0, 1 << 30, &n_predict)) return 1;
        } else if (!strcmp(a, "--chat")) {
            chat = 1;
        } else if (!strcmp(a, "--system")) {
            VAL();
            system = v;
        } else if (!strcmp(a, "--temp")) {
            VAL();
            if (cli_float(a, v, 0.0, 100.0, &sp.temp)) return 1;
        } else if (!strcmp(a, "--top-k")) {
            VAL();
            if (cli_int(a, v, 0, 1 << 30, &sp.top_k)) return 1;
        } else if (!strcmp(a, "--top-p")) {
            VAL();
            if (cli_float(a, v, 0.0, 1.0, &sp.top_p)) return 1;
        } else if (!strcmp(a, "--min-p")) {
            VAL();
            if (cli_float(a, v, 0.0, 1.0, &sp.min_p)) return 1;
        } else if (!strcmp(a, "--repeat-penalty")) {
            VAL();
            if (cli_float(a, v, 0.01, 100.0, &sp.repeat_penalty)) return 1;
        } else if (!strcmp(a, "--repeat-last-n")) {
            VAL();
            if (cli_int(a, v, 0, 1 << 30, &sp.repeat_last_n)) return 1;
        } else if (!strcmp(a, "--seed")) {
            VAL();
            if (cli_u64(a, v, &sp.seed)) return 1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL();
            if (cli_int(a, v, 1, 1024, &n_threads)) return 1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            VAL();
            if (cli_int(a, v, 1, 1 << 24, &n_ctx)) return 1;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) {
            VAL();
            if (cli_int(a, v, 1, 1 << 16, &n_batch)) return 1;
        } else if (!strcmp(a, "--fast-prompt")) {
            fast_prompt = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--draft")) {
            VAL();
            if (n_drafts == SD_METHOD_MAX_DRAFTS) return cli_error("--draft: at most %d draft models", SD_METHOD_MAX_DRAFTS);
            draft_paths[n_drafts++] = v;
        } else if (!strcmp(a, "--draft-max")) {
            VAL();
            if (cli_int(a, v, 1, 64, &draft_max)) return 1;
            draft_max_flag = spec_only_flag = a;
        } else if (!strcmp(a, "--draft-p-min")) {
            VAL();
            if (cli_float(a, v, 0.0, 1.0, &p_min)) return 1;
            p_min_flag = a;
        } else if (!strcmp(a, "--tree") && i + 1 < argc && !strcmp(argv[i + 1], "auto")) {
            VAL();
            tree_auto = 1;
        } else if (!strcmp(a, "--tree")) {
            VAL();
            int w[16];
            if (sd_parse_ints(a, v, ',', w, 16, 1, 64, perr, sizeof perr) < 0)
                return cli_error("%s", perr);
            tree_flag = spec_only_flag = v;
        } else if (!strcmp(a, "--tree-dynamic")) {
            VAL();
            int t[3];
            if (sd_parse_ints(a, v, ',', t, 3, 1, 1024, perr, sizeof perr) != 3 || t[0] > 16 || t[1] > 16 ||
                t[2] < 2)
                return cli_error("--tree-dynamic: expected B,D,M with B and D in 1..16 and M >= 2, got '%s'", v);
            dyn_flag = spec_only_flag = v;
        } else if (!strcmp(a, "--max-nodes")) {
            VAL();
            if (cli_int(a, v, 1, 1 << 16, &max_nodes)) return 1;
        } else if (!strcmp(a, "--draft-threads")) {
            VAL();
            if (cli_int(a, v, 0, 1024, &draft_threads)) return 1;
        } else if (!strcmp(a, "--draft-ngram")) {
            VAL();
            int t[2];
            if (sd_parse_ints(a, v, ',', t, 2, 1, 256, perr, sizeof perr) != 2 || t[0] > 8)
                return cli_error("--draft-ngram: expected N,K with N in 1..%d and K in 1..256, got '%s'",
                                 8, v);
            ngram_flag = v;
        } else if (!strcmp(a, "--datastore")) {
            VAL();
            datastore = v;
        } else if (!strcmp(a, "--draft-skip")) {
            VAL();
            if (!*v || strlen(v) >= sizeof ((sd_method *)0)->skip_list)
                return cli_error("--draft-skip: expected a layer list L1,L2,... (0-based, ranges A-B) or 'auto', got '%s'", v);
            skip_flag = v;
        } else if (!strcmp(a, "--save-skip")) {
            VAL();
            save_skip = v;
        } else if (!strcmp(a, "--load-skip")) {
            VAL();
            load_skip = v;
        } else if (!strcmp(a, "--lookahead")) {
            VAL();
            int t[3];
            if (sd_parse_ints(a, v, ',', t, 3, 1, 64, perr, sizeof perr) != 3 || t[1] < 2 || t[1] > 16)
                return cli_error("--lookahead: expected W,N,G with W and G in 1..64 and N in 2..16, got '%s'", v);
            lookahead_flag = v;
        } else {
            return cli_error("generate: unknown option '%s' (see specdec generate --help)", a);
        }
#undef VAL
    }
    if (!model_path) return cli_error("generate: a model is required (-m MODEL.gguf; see specdec generate --help)");
    if (!prompt) return cli_error("generate: a prompt is required (-p PROMPT)");
    if (system && !chat) return cli_error("generate: --system needs --chat");
    if (!cli_file_ok("model file", model_path)) return 1;
    if (n_threads <= 0) n_threads = sd_n_cores();
    // the speculative method, as a method string of spec_cli.h
    sd_method method, ngram_method, solo_method;   // solo: skip or lookahead (alone)
    char label[2 * SD_METHOD_NAME_MAX + 16] = "";   // e.g. "chain:4", "ngram:3-8", "tree:2-2+ngram:3-8"
    if ((save_skip || load_skip) && !(skip_flag && !strcmp(skip_flag, "auto")))
        return cli_error("generate: %s needs --draft-skip auto", save_skip ? "--save-skip" : "--load-skip");
    if (save_skip && load_skip) return cli_error("generate: --save-skip and --load-skip cannot be used together");
    if (skip_flag && lookahead_flag) return cli_error("generate: --draft-skip and --lookahead cannot be used together");
    const char *solo_flag = skip_flag ? "--draft-skip" : lookahead_flag ? "--lookahead" : NULL;
    if (solo_flag && (n_drafts || ngram_flag || tree_auto || spec_only_flag))
        return cli_error("generate: %s drafts on its own; it cannot be combined with %s", solo_flag,
                         n_drafts ? "--draft" : ngram_flag ? "--draft-ngram" : tree_auto ? "--tree auto" : spec_only_flag);
    if (tree_auto && !n_drafts && !ngram_flag) ngram_flag = "3,8";   // --tree auto alone: n-gram lookup
    if (tree_auto && (tree_flag || dyn_flag || draft_max_flag))
        return cli_error("generate: --tree auto chooses the tree; it cannot be combined with %s",
                         tree_flag ? "--tree" : dyn_flag ? "--tree-dynamic" : "--draft-max");
    int spec = n_drafts > 0 || ngram_flag || solo_flag;
    if (datastore && !ngram_flag) return cli_error("generate: --datastore needs --draft-ngram N,K");
    if (max_nodes > 0 && !spec)
        return cli_error("generate: --max-nodes needs a drafter (--draft, --draft-ngram, --draft-skip, --lookahead)");
    if (max_nodes == 1) return cli_error("--max-nodes: a tree needs at least 2 nodes, got 1");
    const int auto_nodes = max_nodes > 0 ? SD_MIN(max_nodes, SD_METHOD_AUTO_NODES) : SD_METHOD_AUTO_NODES;
    if (p_min_flag && !n_drafts && !skip_flag)
        return cli_error("generate: --draft-p-min needs a draft model (--draft D.gguf) or --draft-skip");
    if (!n_drafts && spec_only_flag)
        return cli_error("generate: %s needs a draft model (--draft D.gguf)",
                         spec_only_flag == tree_flag ? "--tree" : spec_only_flag == dyn_flag ? "--tree-dynamic"
                                                                                             : spec_only_flag);
    if (tree_flag && dyn_flag) return cli_error("generate: --tree and --tree-dynamic cannot be used together");
    if (draft_max_flag && (tree_flag || dyn_flag))
        return cli_error("generate: --draft-max sets the chain length; it cannot be combined with %s",
                         tree_flag ? "--tree" : "--tree-dynamic");
    if (ngram_flag) {
        char mname[SD_METHOD_NAME_MAX];
        snprintf(mname, sizeof mname, "ngram:%s%s", ngram_flag, tree_auto ? ":auto" : "");
        for (char *c = mname; *c; c++)
            if (*c == ',') *c = '-';
        if (sd_method_parse(mname, &ngram_method, perr, sizeof perr) < 0) return cli_error("%s", perr);
        if (datastore && !cli_file_ok("datastore file", datastore)) return 1;
        if (tree_auto) ngram_method.tree_nodes = SD_MIN(ngram_method.tree_nodes, auto_nodes);
    }
    if (solo_flag) {
        char mname[SD_METHOD_NAME_MAX];
        snprintf(mname, sizeof mname, "%s:%s", skip_flag ? "skip" : "lookahead", skip_flag ? "auto" : lookahead_flag);
        for (char *c = mname; *c; c++)
            if (*c == ',') *c = '-';
        if (sd_method_parse(mname, &solo_method, perr, sizeof perr) < 0) return cli_error("%s", perr);
        if (skip_flag) snprintf(solo_method.skip_list, sizeof solo_method.skip_list, "%s", skip_flag);
        if (load_skip && !cli_file_ok("skip file", load_skip)) return 1;
        int nodes = solo_method.tree_nodes;
        if (max_nodes > 0) {
            if (max_nodes > n_batch)
                return cli_error("--max-nodes %d is larger than the batch size (-b %d)", max_nodes, n_batch);
        } else {
            max_nodes = SD_MIN(nodes, n_batch);
        }
        if (nodes + solo_method.extra_nodes > n_batch)
            return cli_error("%s: %d tree nodes and %d window nodes per step do not fit the batch size (-b %d)",
                             solo_flag, nodes, solo_method.extra_nodes, n_batch);
        snprintf(label, sizeof label, "%s", skip_flag ? "skip" : solo_method.name);
    } else if (spec) {
        char mname[SD_METHOD_NAME_MAX];
        if (!n_drafts) {
            snprintf(mname, sizeof mname, "ar");   // no model drafts: only the n-gram drafter
        } else if (tree_auto) {
            snprintf(mname, sizeof mname, "tree:auto");
        } else if (tree_flag) {
            snprintf(mname, sizeof mname, "tree:%s", tree_flag);
            for (char *c = mname; *c; c++)
                if (*c == ',') *c = '-';
        } else if (dyn_flag) {
            snprintf(mname, sizeof mname, "dyn:%s", dyn_flag);
            for (char *c = mname; *c; c++)
                if (*c == ',') *c = '-';
        } else {
            snprintf(mname, sizeof mname, "chain:%d", draft_max);
        }
        if (sd_method_parse(mname, &method, perr, sizeof perr) < 0) return cli_error("%s", perr);
        if (tree_auto && n_drafts) method.tree_nodes = auto_nodes;
        for (int i = 0; i < n_drafts; i++)
            if (!cli_file_ok("draft model file", draft_paths[i])) return 1;
        const char *shape = tree_auto ? "--tree auto" : tree_flag ? "--tree" : dyn_flag ? "--tree-dynamic" : "--draft-max";
        // A draft model's tree must fit; the n-gram tree is a most and is cut to the limit.
        int nodes = n_drafts ? method.tree_nodes : 2, ng_nodes = ngram_flag ? ngram_method.tree_nodes : 1;
        if (max_nodes > 0) {
            if (max_nodes < 2) return cli_error("--max-nodes: a tree needs at least 2 nodes, got %d", max_nodes);
            if (max_nodes > n_batch)
                return cli_error("--max-nodes %d is larger than the batch size (-b %d)", max_nodes, n_batch);
            if (nodes > max_nodes)
                return cli_error("%s: the tree has %d nodes (root included), more than --max-nodes %d", shape, nodes,
                                 max_nodes);
        } else {
            if (nodes > n_batch)
                return cli_error("%s: the tree has %d nodes (root included), more than the batch size (-b %d)",
                                 shape, nodes, n_batch);
            // room for every drafter's tree when they are merged
            int total = (n_drafts ? sd_method_default_nodes(&method, n_drafts) : 1) + ng_nodes - 1;
            max_nodes = SD_MIN(total, n_batch);
        }
        snprintf(label, sizeof label, "%s%s%s%s", n_drafts ? method.name : "", n_drafts && ngram_flag ? "+" : "",
                 ngram_flag ? ngram_method.name : "", tree_auto && !n_drafts ? "+tree:auto" : "");
    }

    char err[512];
    int rc = 1;
    sd_model *m = NULL;
    sd_session *s = NULL;
    sd_sampler *smp = NULL;
    sd_model *drafts[SD_METHOD_MAX_DRAFTS] = {0};
    sd_drafter *drafter = NULL;
    sd_cost_curve *cost = NULL;
    int32_t *ids = NULL;
    char *formatted = NULL;
    gen_out o = {0};

    if (sd_model_load(&m, model_path, err, sizeof err) < 0) {
        cli_error("cannot load model '%s': %s", model_path, err);
        goto out;
    }
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    sd_model_info info;
    sd_model_get_info(m, &info);

    // the text to tokenize
    const char *text = prompt;
    if (chat) {
        size_t cap = strlen(prompt) + (system ? strlen(system) : 0) + 4096;
        formatted = malloc(cap);
        if (!formatted) {
            cli_error("out of memory");
            goto out;
        }
        if (sd_chat_format(tok, system, prompt, formatted, cap, err, sizeof err) < 0) {
            cli_error("--chat: %s", err);
            goto out;
        }
        text = formatted;
    }
    int max_ids = (int)strlen(text) + 16;
    ids = malloc((size_t)max_ids * sizeof(int32_t));
    int n_ids = ids ? sd_tokenize(tok, text, strlen(text), 1, chat, ids, max_ids) : -1;
    if (n_ids > max_ids) {
        int32_t *t = realloc(ids, (size_t)n_ids * sizeof(int32_t));
        if (t) {
            ids = t;
            max_ids = n_ids;
            n_ids = sd_tokenize(tok, text, strlen(text), 1, chat, ids, max_ids);
        } else {
            n_ids = -1;
        }
    }
    if (n_ids < 0) {
        cli_error("cannot tokenize the prompt");
        goto out;
    }
    if (n_ids == 0) {
        cli_error("generate: the prompt is empty (no tokens)");
        goto out;
    }

    sd_session_params ssp = sd_session_default_params();
    ssp.n_ctx = n_ctx;
    ssp.n_batch = n_batch;
    ssp.n_threads = n_threads;
    if (sd_session_new(&s, m, &ssp, err, sizeof err) < 0) {
        cli_error("cannot create a session: %s", err);
        goto out;
    }
    if (n_ids > sd_session_n_ctx(s)) {
        cli_error("prompt has %d tokens but the context is %d (-c)", n_ids, sd_session_n_ctx(s));
        goto out;
    }
    if (sd_sampler_new(&smp, &sp, info.n_vocab, err, sizeof err) < 0) {
        cli_error("%s", err);
        goto out;
    }
    if (spec) {
        sd_method_env env = sd_method_env_default(m);
        env.drafts = (const sd_model *const *)drafts;
        env.n_drafts = n_drafts;
        env.n_ctx = sd_session_n_ctx(s);
        env.n_threads = draft_threads;
        env.pool = draft_threads ? NULL : sd_session_pool(s);
        env.p_min = p_min;
        env.datastore = datastore;
        env.skip_save = save_skip;
        env.skip_load = load_skip;
        env.auto_nodes = auto_nodes;
        env.report = on_report;
        if (tree_auto) {   // the target's cost curve, measured on the empty session before the prompt
            double t0 = sd_time_ms();
            if (sd_cost_curve_new(&cost, s, max_nodes, err, sizeof err) < 0) {
                cli_error("--tree auto: %s", err);
                goto out;
            }
            env.cost = cost;
            char cdesc[128];
            sd_cost_curve_describe(cost, cdesc, sizeof cdesc);
            fprintf(stderr, "specdec: tree auto: target cost measured in %.0f ms: %s\n", sd_time_ms() - t0, cdesc);
        }
        if (solo_flag) {
            double est = 0;
            if (skip_flag && sd_method_prepare(&solo_method, &env, &est, err, sizeof err) < 0) {
                cli_error("--draft-skip: %s", err);
                goto out;
            }
            if (skip_flag && !strcmp(skip_flag, "auto")) {
                if (load_skip) {
                    fprintf(stderr, "specdec: skip set loaded from %s: {%s}\n", load_skip, solo_method.skip_list);
                } else {
                    fprintf(stderr, "specdec: skip set chosen: {%s} (estimated %.2fx)\n", solo_method.skip_list, est);
                    if (est < 1.0)
                        fprintf(stderr, "specdec: warning: layer skipping is not expected to pay on this model "
                                        "(estimated %.2fx of plain decoding)\n", est);
                    if (save_skip) fprintf(stderr, "specdec: skip set saved to %s\n", save_skip);
                }
            }
            if (skip_flag) snprintf(label, sizeof label, "skip:%.*s", (int)sizeof label - 8, solo_method.skip_list);
            if (sd_method_make(&solo_method, &env, &drafter, err, sizeof err) < 0) {
                cli_error("%s: %s", solo_flag, err);
                goto out;
            }
        }
        for (int i = 0; i < n_drafts; i++) {
            if (sd_model_load(&drafts[i], draft_paths[i], err, sizeof err) < 0) {
                cli_error("cannot load draft model '%s': %s", draft_paths[i], err);
                goto out;
            }
        }
        if (!solo_flag) {   // draft model(s) and/or n-gram lookup, merged
            sd_method all;
            char mname[2 * SD_METHOD_NAME_MAX + 2];
            snprintf(mname, sizeof mname, "%s%s%s", n_drafts ? method.name : "", n_drafts && ngram_flag ? "+" : "",
                     ngram_flag ? ngram_method.name : "");
            if (sd_method_parse(mname, &all, err, sizeof err) < 0 ||
                sd_method_make(&all, &env, &drafter, err, sizeof err) < 0) {
                cli_error("%s: %s", n_drafts ? "--draft" : "--draft-ngram", err);
                goto out;
            }
            if (datastore && !json) fprintf(stderr, "specdec: %s\n", sd_drafter_note(drafter));
        }
    }

    o.tok = tok;
    o.json = json;
    o.piece_cap = 256;
    o.piece = malloc((size_t)o.piece_cap);
    if (!o.piece) {
        cli_error("out of memory");
        goto out;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n_predict;
    gp.n_batch = n_batch;
    gp.fast_prompt = fast_prompt;
    gp.max_nodes = spec ? max_nodes : 1;
    sd_gen_stats st;
    int grc = sd_generate(s, smp, drafter, ids, n_ids, &gp, on_token, &o, &st, err, sizeof err);
    const sd_gen_stats sst = st;
    signal(SIGINT, SIG_DFL);
    if (!json) stream_flush(&o, 1);
    if (grc < 0) {
        if (!json) fputc('\n', stdout);
        cli_error("%s", err);
        goto out;
    }
    const char *finish = g_interrupted ? "interrupted" : sd_finish_name(st.finish);
    if (json) {
        printf("{\"model\": ");
        cli_json_string(stdout, model_path, strlen(model_path));
        printf(", \"n_threads\": %d, \"n_prompt_tokens\": %d, \"n_generated\": %d, "
               "\"tokens_per_second\": %.3f, \"prompt_ms\": %.3f, \"generate_ms\": %.3f, "
               "\"finish_reason\": \"%s\", \"text\": ",
               n_threads, st.n_prompt_tokens, st.n_generated, st.tokens_per_second, st.prompt_ms,
               st.generate_ms, finish);
        cli_json_string(stdout, o.text ? o.text : "", o.len);
        if (spec) {
            printf(", \"draft\": [");
            for (int i = 0; i < n_drafts; i++) {
                if (i) printf(", ");
                cli_json_string(stdout, draft_paths[i], strlen(draft_paths[i]));
            }
            printf("], \"method\": ");
            cli_json_string(stdout, label, strlen(label));
            printf(", \"max_nodes\": %d, \"n_target_forwards\": %d, \"mean_accepted\": %.4f, "
                   "\"n_draft_nodes\": %d, \"n_draft_accepted\": %d, \"acceptance_by_depth\": [",
                   max_nodes, sst.n_target_forwards, sst.mean_accepted, sst.n_draft_nodes, sst.n_draft_accepted);
            for (int k = 1; k <= sst.max_depth && k <= SD_SPEC_MAX_DEPTH; k++)
                printf("%s%.4f", k > 1 ? ", " : "", sst.acceptance_by_depth[k]);
            printf("], \"draft_ms\": %.3f, \"verify_ms\": %.3f", sst.draft_ms, sst.verify_ms);
        }
        printf("}\n");
        fflush(stdout);
    } else {
        printf("\n");
        fflush(stdout);
        fprintf(stderr,
                "specdec: prompt %d tokens in %.1f ms (%.1f tok/s) | generated %d tokens in %.1f ms "
                "(%.2f tok/s) | %d threads | finish: %s\n",
                st.n_prompt_tokens, st.prompt_ms,
                st.prompt_ms > 0 ? st.n_prompt_tokens * 1000.0 / st.prompt_ms : 0.0, st.n_generated,
                st.generate_ms, st.tokens_per_second, n_threads, finish);
        if (spec) {
            char acc[256];
            size_t ao = 0;
            acc[0] = 0;
            for (int k = 1; k <= sst.max_depth && k <= SD_SPEC_MAX_DEPTH && ao < sizeof acc - 16; k++)
                ao += (size_t)snprintf(acc + ao, sizeof acc - ao, "%s%.2f", k > 1 ? " " : "", sst.acceptance_by_depth[k]);
            fprintf(stderr,
                    "specdec: speculative %s (%d draft model%s, max %d nodes): %d target forwards, mean accepted %.2f "
                    "tokens/forward | acceptance by depth [%s] | draft %.1f ms, verify %.1f ms\n",
                    label, n_drafts, n_drafts == 1 ? "" : "s", max_nodes, sst.n_target_forwards,
                    sst.mean_accepted, acc, sst.draft_ms, sst.verify_ms);
        }
    }
    if (o.oom) fprintf(stderr, "specdec: warning: out of memory, the text is incomplete\n");
    rc = 0;
out:
    free(o.text);
    free(o.piece);
    free(ids);
    free(formatted);
    sd_drafter_free(drafter);
    sd_cost_curve_free(cost);
    for (int i = 0; i < n_drafts; i++) sd_model_free(drafts[i]);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
    return rc;
}
