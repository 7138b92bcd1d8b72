// cmd_client.c - `specdec client` (docs/split.md): drafts on this machine
// with the EAGLE-3 head and has a specdec server (serve --split) verify
// every tree; drafts on alone, marking the tokens unverified, while the
// server cannot be reached. The loop is tools/client/client.c.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "cli_head.h"
#include "cli_opts.h"
#include "client/client.h"
#include "stoptext.h"
#include "utf8.h"

typedef struct out_state {
    const sd_tokenizer *tok;
    int events, json, tty;
    char *pend;          // bytes not yet printed (an incomplete UTF-8 character)
    size_t len, cap;
    char piece[256];
    int unverified_open; // text mode: inside an unverified run
} out_state;

static int piece(out_state *o, int32_t t, char *buf, int cap) {
    int n = sd_token_to_piece(o->tok, t, 0, buf, cap);
    return n < 0 ? 0 : n > cap ? cap : n;
}

static void on_emit(void *user, const int32_t *toks, int n, int verified) {
    out_state *o = user;
    if (o->json) return;
    if (o->events) {
        json_t *a = json_array();
        size_t tl = 0;
        char *txt = NULL;
        for (int i = 0; i < n; i++) {
            json_array_append_new(a, json_integer(toks[i]));
            int k = piece(o, toks[i], o->piece, sizeof o->piece);
            char *t2 = realloc(txt, tl + (size_t)k + 1);
            if (!t2) break;
            txt = t2;
            memcpy(txt + tl, o->piece, (size_t)k);
            tl += (size_t)k;
        }
        cli_json_write(stdout, json_pack("{s:o, s:o, s:b}", "tokens", a, "text", cli_json_str(txt ? txt : "", tl),
                                         "verified", verified));
        free(txt);
        return;
    }
    if (o->tty && !verified && !o->unverified_open) fputs("\x1b[2m", stdout), o->unverified_open = 1;
    if (o->tty && verified && o->unverified_open) fputs("\x1b[0m", stdout), o->unverified_open = 0;
    for (int i = 0; i < n; i++) {
        int k = piece(o, toks[i], o->piece, sizeof o->piece);
        if (o->len + (size_t)k > o->cap) {
            size_t cap = (o->len + (size_t)k) * 2 + 64;
            char *p = realloc(o->pend, cap);
            if (!p) return;
            o->pend = p, o->cap = cap;
        }
        memcpy(o->pend + o->len, o->piece, (size_t)k);
        o->len += (size_t)k;
    }
    size_t c = utf8_complete(o->pend, o->len);
    fwrite(o->pend, 1, c, stdout);
    memmove(o->pend, o->pend + c, o->len - c);
    o->len -= c;
    fflush(stdout);
}

// The last token's text up to n bytes (a stop string starts there).
static void on_emit_part(void *user, int32_t t, int n, int verified) {
    out_state *o = user;
    if (o->json || n <= 0) return;
    int k = piece(o, t, o->piece, sizeof o->piece);
    if (n > k) n = k;
    if (o->events) {
        json_t *a = json_array();
        json_array_append_new(a, json_integer(t));
        cli_json_write(stdout, json_pack("{s:o, s:o, s:b, s:b}", "tokens", a, "text", cli_json_str(o->piece, (size_t)n),
                                         "verified", verified, "partial", 1));
        return;
    }
    if (o->tty && !verified && !o->unverified_open) fputs("\x1b[2m", stdout), o->unverified_open = 1;
    if (o->tty && verified && o->unverified_open) fputs("\x1b[0m", stdout), o->unverified_open = 0;
    fwrite(o->pend, 1, o->len, stdout);   // whatever waited for the rest of a UTF-8 character, then the part
    o->len = 0;
    fwrite(o->piece, 1, (size_t)n, stdout);
    fflush(stdout);
}

static void on_retract(void *user, int n, const char *why) {
    out_state *o = user;
    if (o->events) cli_json_write(stdout, json_pack("{s:i, s:s}", "retract", n, "why", why));
    else if (!o->json) {
        if (o->unverified_open) fputs("\x1b[0m", stdout), o->unverified_open = 0;
        fprintf(stdout, "\n[specdec client: the last %d unverified tokens were replaced by the server's]\n", n);
        fflush(stdout);
    }
}

static void on_note(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "specdec client: %s\n", line);
}

static double pct(double *v, long n, double q) {
    if (n <= 0) return 0;
    for (long i = 1; i < n; i++)   // insertion sort (a few hundred rounds)
        for (long j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    long k = (long)(q * (double)(n - 1) + 0.5);
    return v[k];
}

int cmd_client(int argc, char **argv) {
    const char *model_path = NULL, *head_spec = NULL, *prompt = NULL, *system = NULL, *method = NULL;
    int chat = 0, json = 0, events = 0, verbose = 0, n_threads = 1, no_states = 0, lsa_server = 0, kv_rows = 0;
    const char *temp_given = NULL, *private_text = NULL, *stops[TX_MAX_STOP];
    int n_stops = 0;
    cl_opts co = {.sp = sd_sampler_default_params(), .timeout_ms = 3000, .n_predict = 256, .max_nodes = 16, .offline_depth = 4, .retry_ms = 250,
                  .final_wait_ms = 3000, .states = 1};
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &model_path, .meta = "FILE", .what = "model file",
         .required = "a client file or the target model is required (-m CLIENT.gguf; see specdec client --help)",
         .help = "the client file (specdec split-client), or the target's GGUF (only its tokenizer and embeddings "
                 "are read)"},
        {"--head", NULL, CLI_STRING, &head_spec, .meta = "FILE|auto",
         .help = "the EAGLE-3 head or MoA drafter, with a target model as -m (a client file holds its own)"},
        {"--server", NULL, CLI_STRING, &co.server, .meta = "URL", .required = "--server URL is required",
         .help = "the specdec server (serve --split), e.g. http://127.0.0.1:8080"},
        {"--api-key", NULL, CLI_STRING, &co.api_key, .meta = "KEY", .help = "the server's --api-key"},
        {"--prompt", "-p", CLI_STRING, &prompt, .meta = "TEXT", .required = "a prompt is required (-p TEXT)",
         .help = "the prompt"},
        {"--private", NULL, CLI_STRING, &private_text, .meta = "TEXT",
         .help = "text only the client's drafter reads, never sent to the server (before the prompt): the answer "
                 "is the target's answer to the prompt alone; the private text only steers the drafts (speed), "
                 "never the text (docs/split.md)"},
        {"--chat", NULL, CLI_FLAG, &chat, .help = "wrap the prompt in the model's chat template"},
        {"--stop", NULL, CLI_LIST, stops, .max = TX_MAX_STOP, .count = &n_stops, .meta = "TEXT", .what = "stop strings",
         .help = "end the text where TEXT first appears in the verified text (repeatable; the server stops there "
                 "too): nothing from it on is printed"},
        {"--system", NULL, CLI_STRING, &system, .meta = "TEXT", .help = "--chat: the system message"},
        {"--n-predict", "-n", CLI_INT, &co.n_predict, 1, 4000, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "tokens to generate"},
        {"--temp", NULL, CLI_FLOAT, &co.sp.temp, 0, 100, .meta = "T", .given = &temp_given,
         .help = "sampling temperature (default 0: greedy); the server samples from the target's distribution "
                 "(the race draw: the text `generate --temp T --seed S` gives), the drafter drafts its own samples "
                 "under the same noise"},
        {"--top-k", NULL, CLI_INT, &co.sp.top_k, 0, 1 << 20, .meta = "K", .def = CLI_DEF_VALUE, .help = "top-k"},
        {"--top-p", NULL, CLI_FLOAT, &co.sp.top_p, 0, 1, .meta = "P", .def = CLI_DEF_VALUE, .help = "top-p"},
        {"--min-p", NULL, CLI_FLOAT, &co.sp.min_p, 0, 1, .meta = "P", .def = CLI_DEF_VALUE, .help = "min-p"},
        {"--seed", NULL, CLI_U64, &co.sp.seed, .meta = "S", .def = CLI_DEF_VALUE, .help = "sampling seed"},
        {"--method", NULL, CLI_STRING, &method, .meta = "KIND:SHAPE", .def = "eagle3:dyn:4-5-16 or moa:dyn:4-5-16",
         .help = "the drafter's trees (eagle3: or moa: then chain:K, tree:W1-W2-..., dyn:B-D-M), as the drafter is"},
        {"--nodes", NULL, CLI_INT, &co.max_nodes, 2, 64, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "most tree nodes per round, root included"},
        {"--timeout", NULL, CLI_INT, &co.timeout_ms, 50, 600000, .meta = "MS", .def = CLI_DEF_VALUE,
         .help = "a round with no answer after this long: the client drafts on alone"},
        {"--retry", NULL, CLI_INT, &co.retry_ms, 10, 60000, .meta = "MS", .def = CLI_DEF_VALUE,
         .help = "offline: how often the server is probed (GET /health) in the background"},
        {"--final-wait", NULL, CLI_INT, &co.final_wait_ms, 0, 3600000, .meta = "MS", .def = CLI_DEF_VALUE,
         .help = "a text that ends offline waits this long for the server to verify it"},
        {"--offline-depth", NULL, CLI_INT, &co.offline_depth, 1, 32, .meta = "K", .def = CLI_DEF_VALUE,
         .help = "offline: tokens drafted per head pass (a chain of the head's most likely tokens)"},
        {"--greedy-drafts", NULL, CLI_FLAG, &co.greedy_drafts,
         .help = "with --temp: draft the drafter's most likely tokens (default: its samples under the server's "
                 "race noise for the seed, accepted whenever they are the target's own draws)"},
        {"--lsa-on-server", NULL, CLI_FLAG, &lsa_server,
         .help = "MoA: the server runs LSA with its own copy of the drafter (serve --head MOA.gguf) and sends "
                 "LSA's outputs (and the TLI layers' K,V rows) instead of every layer's K,V rows: about 20x fewer "
                 "bytes, LSA's cost on the server"},
        {"--kv-rows", NULL, CLI_FLAG, &kv_rows,
         .help = "MoA without LSA: ask for every layer's K,V rows (default: their mean over layers and the TLI "
                 "layers' rows, all that such a drafter reads: L/(1+TLI) times fewer K,V bytes)"},
        {"--no-states", NULL, CLI_FLAG, &no_states,
         .help = "ask the server for no states (the drafter then drafts from tokens alone: a baseline)"},
        {"--threads", "-t", CLI_INT, &n_threads, 1, 256, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "the drafter's threads"},
        {"--json", NULL, CLI_FLAG, &json, .help = "print one JSON object at the end instead of the text"},
        {"--events", NULL, CLI_FLAG, &events,
         .help = "print JSON lines as the text comes: {tokens, text, verified}, {retract: N} when the server "
                 "replaced the last N unverified tokens, and the --json object last"},
        {"--verbose", "-v", CLI_FLAG, &verbose, .help = "more reports on stderr"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "client",
        .usage = "usage: specdec client -m CLIENT.gguf --server URL -p PROMPT [options]",
        .intro = "The client side of the split (docs/split.md): the EAGLE-3 head or the MoA drafter drafts here, a\n"
                 "specdec server (serve --split) verifies every tree and sends back the target's states the\n"
                 "drafter reads (EAGLE-3: fused rows; MoA: every layer's K,V rows of the accepted positions).\n"
                 "Greedy text equals the target's own. When the server cannot be reached the client drafts on\n"
                 "alone, emitting tokens marked unverified; when it is back they are verified, and the ones\n"
                 "the target disagrees with are replaced. The summary line (stderr) gives server calls and\n"
                 "bytes per token and the rounds' latency.\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
    };
    int pr = cli_parse(&cmd, argc, argv);
    if (pr != CLI_PARSE_OK) return cli_parse_exit(pr);
    co.states = !no_states;
    co.stop = stops;
    co.n_stop = n_stops;
    if (!temp_given) co.sp.temp = 0.0f;   // greedy unless --temp
    co.verbose = verbose;
    if (events) json = 0;
    char err[512];
    sd_model *m = NULL;
    sd_head *h = NULL;
    sd_drafter *d = NULL;
    cl_client *c = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    cl_stats st;
    memset(&st, 0, sizeof st);
    if (sd_model_load(&m, model_path, err, sizeof err) < 0) {
        cli_error("client: %s", err);
        goto out;
    }
    if (sd_client_file_head(model_path, m, &h, err, sizeof err) < 0) {
        cli_error("client: %s", err);
        goto out;
    }
    if (!h) {
        if (!head_spec) {
            cli_error("client: '%s' holds no head: give --head FILE (or make a client file: specdec split-client)",
                      model_path);
            goto out;
        }
        if (cli_head_load(head_spec, m, model_path, 0, &h) || !h) {
            if (!h) cli_error("client: no EAGLE-3 head found for '%s'", model_path);
            goto out;
        }
    }
    const int moa = sd_head_get_type(h) == SD_HEAD_MOA;
    if (!moa && sd_head_get_type(h) != SD_HEAD_EAGLE3) {
        cli_error("client: the drafter must be an EAGLE-3 head or an MoA drafter");
        goto out;
    }
    const char *kind = moa ? "moa:" : "eagle3:";
    if (!method) method = moa ? "moa:dyn:4-5-16" : "eagle3:dyn:4-5-16";
    sd_method meth;
    if (strncmp(method, kind, strlen(kind)) || strstr(method, "auto")) {
        cli_error("client: --method: expected %schain:K, %stree:W1-W2-... or %sdyn:B-D-M (the drafter is %s), got '%s'",
                  kind, kind, kind, moa ? "MoA" : "EAGLE-3", method);
        goto out;
    }
    if (moa && private_text) {
        cli_error("client: --private needs an EAGLE-3 drafter: the MoA drafter reads only the target's K,V rows, "
                  "which the server never computes for private text");
        goto out;
    }
    if (lsa_server && !moa) {
        cli_error("client: --lsa-on-server needs an MoA drafter");
        goto out;
    }
    if (kv_rows && (!moa || lsa_server || sd_head_moa_no_lsa(h) != 1)) {
        cli_error("client: --kv-rows is for an MoA drafter without LSA, without --lsa-on-server");
        goto out;
    }
    // an MoA drafter without LSA reads the layers' mean K,V rows: the server sends them ("mean")
    co.kv = moa ? (lsa_server ? 2 : !kv_rows && sd_head_moa_no_lsa(h) ? 3 : 1) : 0;
    co.tli = moa ? sd_head_moa_tli(h) : 0;
    co.drafter_fp = sd_head_fingerprint(h);
    sd_method_env env = sd_method_env_default(m);
    cli_env_set_head(&env, h);
    env.n_threads = n_threads;
    env.n_ctx = 4096;
    if (sd_method_parse(method, &meth, err, sizeof err) < 0 || sd_method_make(&meth, &env, &d, err, sizeof err) < 0 ||
        (co.kv == 2   ? sd_drafter_remote_lsa(d, err, sizeof err)
         : co.kv == 3 ? sd_drafter_remote_mean(d, err, sizeof err)
                      : sd_drafter_remote(d, err, sizeof err)) < 0) {
        cli_error("client: %s", err);
        goto out;
    }
    if (moa) {   // an MoA drafter trained with --ca-hidden / --sa-hidden: the server sends its states too
        int32_t ly[SD_MAX_HIDDEN_LAYERS];
        co.has_hidden = sd_drafter_hidden_layers(d, ly) == 1;
        co.hidden_layer = co.has_hidden ? ly[0] : 0;
    }
    int n = cli_tokenize_prompt(sd_model_tokenizer(m), system, prompt, chat, &ids, err, sizeof err, NULL);
    if (n < 0) {
        cli_error("client: %s", err);
        goto out;
    }
    int n_priv = 0;
    if (private_text) {   // the private part first: the drafter reads it, the server never gets it
        int32_t *pv = NULL;
        n_priv = cli_tokenize_prompt(sd_model_tokenizer(m), NULL, private_text, 0, &pv, err, sizeof err, NULL);
        int32_t *all = n_priv > 0 ? realloc(pv, sizeof(int32_t) * (size_t)(n_priv + n)) : NULL;
        if (!all) {
            free(pv);
            cli_error("client: --private: %s", n_priv < 0 ? err : "out of memory");
            goto out;
        }
        memcpy(all + n_priv, ids, sizeof(int32_t) * (size_t)n);
        free(ids);
        ids = all;
        n += n_priv;
    }
    if (cl_client_new(&c, &co, m, d, err, sizeof err) < 0) {
        cli_error("client: %s", err);
        goto out;
    }
    out_state os = {.tok = sd_model_tokenizer(m), .events = events, .json = json, .tty = isatty(1)};
    const tx_sink sink = {&os, on_emit, on_emit_part, on_retract, on_note};
    if (cl_client_run(c, ids, n, n_priv, &sink, &st, err, sizeof err) < 0) {
        if (!json && !events) fputc('\n', stdout);
        cli_error("client: %s", err);
        goto out;
    }
    if (os.len) fwrite(os.pend, 1, os.len, stdout);
    if (os.unverified_open) fputs("\x1b[0m", stdout);
    free(os.pend);
    int nt;
    const int32_t *toks = cl_client_tokens(c, &nt);
    const double per = nt > 0 ? 1.0 / nt : 0;
    const double tps = st.total_ms > 0 ? nt * 1000.0 / st.total_ms : 0;
    double p50 = pct(st.round_ms, SD_MIN(st.rounds, st.round_ms_cap), 0.5);
    double p90 = pct(st.round_ms, SD_MIN(st.rounds, st.round_ms_cap), 0.9);
    if (json || events) {
        size_t tl = 0, tc = 256;
        char *txt = malloc(tc), pc[256];
        for (int i = 0; txt && i < nt; i++) {
            int k = sd_token_to_piece(sd_model_tokenizer(m), toks[i], 0, pc, sizeof pc);
            if (k < 0) k = 0;
            if (k > (int)sizeof pc) k = sizeof pc;
            if (tl + (size_t)k + 1 > tc) {
                tc = (tl + (size_t)k + 1) * 2;
                char *t2 = realloc(txt, tc);
                if (!t2) break;
                txt = t2;
            }
            memcpy(txt + tl, pc, (size_t)k);
            tl += (size_t)k;
        }
        if (st.stop_bytes >= 0 && (size_t)st.stop_bytes < tl) tl = (size_t)st.stop_bytes;   // up to the stop string
        json_t *ta = json_array();
        for (int i = 0; i < nt; i++) json_array_append_new(ta, json_integer(toks[i]));
        json_t *o = json_pack(
            "{s:b, s:o, s:o, s:i, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:o, s:I, s:I, s:I, s:I, s:o, s:o,"
            " s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
            "done", 1, "text", cli_json_str(txt ? txt : "", tl), "tokens", ta, "n_prompt_tokens", st.n_prompt,
            "n_generated", nt, "finish_reason", st.finish, "unverified_emitted", (int)st.unverified_emitted,
            "confirmed", (int)st.confirmed, "replaced", (int)st.replaced, "never_verified", (int)st.never_verified,
            "offline_periods", st.offline_periods, "reopened", st.reopened, "rounds", (int)st.rounds, "calls",
            (json_int_t)st.calls, "calls_per_token", cli_json_num(st.calls * per, 4), "bytes_sent",
            (json_int_t)st.bytes_sent, "bytes_received", (json_int_t)st.bytes_recv, "body_bytes_sent",
            (json_int_t)st.body_sent, "body_bytes_received", (json_int_t)st.body_recv, "bytes_sent_per_token",
            cli_json_num(st.bytes_sent * per, 1), "bytes_received_per_token", cli_json_num(st.bytes_recv * per, 1),
            "tau", cli_json_num(st.rounds ? (double)(st.accepted + st.rounds) / st.rounds : 0, 3),
            "round_ms_mean", cli_json_num(st.rounds ? st.round_ms_sum / st.rounds : 0, 2), "round_ms_p50",
            cli_json_num(p50, 2), "round_ms_p90", cli_json_num(p90, 2), "ttft_ms", cli_json_num(st.ttft_ms, 2),
            "total_ms", cli_json_num(st.total_ms, 2), "tokens_per_second", cli_json_num(tps, 2));
        free(txt);
        if (cli_json_write(stdout, o) < 0) goto out;
    } else {
        fputc('\n', stdout);
        fflush(stdout);
    }
    fprintf(stderr,
            "specdec client: %d tokens, %.1f tok/s, first token %.0f ms; %ld rounds (tau %.2f), %.3f server calls/token, "
            "%.0f B sent and %.0f B received per token, round %.1f ms mean (p50 %.1f, p90 %.1f)",
            nt, tps, st.ttft_ms, st.rounds, st.rounds ? (double)(st.accepted + st.rounds) / st.rounds : 0,
            st.calls * per, st.bytes_sent * per, st.bytes_recv * per, st.rounds ? st.round_ms_sum / st.rounds : 0, p50,
            p90);
    if (st.unverified_emitted || st.never_verified)
        fprintf(stderr, "; offline %d times: %ld tokens unverified, %ld confirmed, %ld replaced, %ld never verified",
                st.offline_periods, st.unverified_emitted, st.confirmed, st.replaced, st.never_verified);
    fputc('\n', stderr);
    rc = 0;
out:
    free(st.round_ms);
    cl_client_free(c);
    free(ids);
    sd_drafter_free(d);
    sd_head_free(h);
    sd_model_free(m);
    return rc;
}
