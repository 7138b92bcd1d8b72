// test_generate_bench.c - the Spec-Bench prompt reader (unit tests) and `specdec
// bench` / `specdec generate --draft` run on a small synthetic model drafting
// for itself (tests/lib/synth.h: 5 layers, random weights, written under
// /tmp; its greedy text is words, never an end of text, so every run makes
// its n tokens): greedy speculative text must equal plain decoding, tau must
// be high, the JSON results must parse, and a malformed prompts file must
// fail cleanly.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/cli_run.h"
#include "lib/synth.h"
#include "t.h"
// the prompt reader is unit-tested here directly
#include "tools/bench_prompts.c"

// SPECDEC_BIN overrides the program under test.
static const char *specdec_bin(void) {
    const char *e = getenv("SPECDEC_BIN");
    return e && *e ? e : "./build/specdec";
}

static char g_out[1 << 17];   // output of the last run
static char g_dir[256];       // scratch directory of this process
static char g_model[320];     // the synthetic model's GGUF ("" if unavailable)
static char g_why[256];       // why g_model is unavailable

// Runs `SPECDEC args` through the shell with stdout and stderr together (or
// only stdout when merge == 0). Returns the exit status, -1 if it did not exit.
static int run(const char *args, int merge) { return cli_run(specdec_bin(), args, merge, g_out, sizeof g_out); }

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

static char *read_file_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

// Writes the synthetic model once; fills g_model or g_why. Five layers (the
// layer-skip methods need some; the messages below name them), no chat
// template (bench needs --no-chat), words only (see synth.h).
static void prepare_model(void) {
    struct stat st;
    if (stat(specdec_bin(), &st) != 0) {
        snprintf(g_why, sizeof g_why, "%s is missing: build it with make", specdec_bin());
        return;
    }
    synth_params p = synth_default_params();
    p.n_layer = 5;
    p.words_only = 1;
    char err[256];
    snprintf(g_model, sizeof g_model, "%s/synth.gguf", g_dir);
    if (synth_write(g_model, &p, err, sizeof err) < 0) {
        snprintf(g_why, sizeof g_why, "synthetic model: %.200s", err);
        g_model[0] = 0;
    }
}

// ------------------------------------------------------------ JSON helpers
// The value after "key": at or after p (NULL if absent).
static const char *json_after(const char *p, const char *key) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *q = p ? strstr(p, pat) : NULL;
    if (!q) return NULL;
    q += strlen(pat);
    while (*q == ' ') q++;
    return q;
}

// Checks that s is one well-formed JSON value (parsed by jansson).
static int json_valid(const char *s) {
    json_error_t je;
    json_t *v = json_loads(s, JSON_DECODE_ANY, &je);
    if (!v) printf("  invalid JSON: line %d, column %d: %s\n", je.line, je.column, je.text);
    json_decref(v);
    return v != NULL;
}

// ------------------------------------------------------------ unit tests
static void test_prompt_parse(void) {
    bench_prompt p;
    char err[256];
    const char *ok = "{\"question_id\": 12, \"category\": \"coding\", \"extra\": {\"a\": [1, -2.5e+3, null, true, false, "
                     "{}]}, \"turns\": [\"a\\nb \\\"q\\\" \\\\ \\/ \\t\\u00e9\\u20ac\\ud83d\\ude00\", \"second\"]}";
    int rc = bench_prompt_parse(ok, strlen(ok), 3, &p, err, sizeof err);
    CHECK(rc == 0, "parse failed: %s", err);
    if (rc == 0) {
        CHECK(!strcmp(p.id, "12"), "id '%s'", p.id);
        CHECK(!strcmp(p.category, "coding"), "category '%s'", p.category);
        CHECK(!strcmp(p.text, "a\nb \"q\" \\ / \t\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"), "text '%s'", p.text);
        CHECK(p.line == 3, "line %d", p.line);
        bench_prompt_clear(&p);
    }
    const char *noid = "  {\"turns\": [\"x\"]}  ";
    rc = bench_prompt_parse(noid, strlen(noid), 7, &p, err, sizeof err);
    CHECK(rc == 0 && !strcmp(p.id, "line7") && !strcmp(p.category, "uncategorized"), "defaults: %s",
          rc ? err : p.id);
    if (rc == 0) bench_prompt_clear(&p);
    const char *sid = "{\"question_id\": \"abc\", \"turns\": [\"x\"]}";
    rc = bench_prompt_parse(sid, strlen(sid), 1, &p, err, sizeof err);
    CHECK(rc == 0 && !strcmp(p.id, "abc"), "string id: %s", rc ? err : p.id);
    if (rc == 0) bench_prompt_clear(&p);
    const char *rid = "{\"question_id\": 2.5, \"category\": \"\", \"turns\": [\"x\", 3]}";
    rc = bench_prompt_parse(rid, strlen(rid), 1, &p, err, sizeof err);
    CHECK(rc == 0 && !strcmp(p.id, "2.5") && !strcmp(p.category, "uncategorized"), "real id: %s", rc ? err : p.id);
    if (rc == 0) bench_prompt_clear(&p);

    struct {
        const char *line, *msg;
    } bad[] = {
        {"{\"turns\": [\"x\"]", "invalid JSON at column 15: '}' expected near end of file"},
        {"{\"turns\": [\"x\"] \"a\": 1}", "'}' expected"},
        {"{\"turns\" [\"x\"]}", "invalid JSON at column 10: ':' expected"},
        {"{\"turns\": []}", "\"turns\" is empty"},
        {"{\"turns\": [1]}", "array of strings"},
        {"{\"turns\": \"x\"}", "array of strings, not a string"},
        {"{\"category\": \"c\"}", "\"turns\" is missing"},
        {"{\"turns\": [\"x\"], \"category\": 5}", "\"category\" must be a string"},
        {"{\"turns\": [\"x\"], \"question_id\": null}", "\"question_id\" must be a number or a string"},
        {"{\"turns\": [\"\\ud83d\"]}", "invalid Unicode"},
        {"{\"turns\": [\"\\ude00\"]}", "invalid Unicode '\\uDE00'"},
        {"{\"turns\": [\"\\u12g4\"]}", "invalid escape"},
        {"{\"turns\": [\"\\q\"]}", "invalid escape"},
        {"{\"turns\": [\"\\u0000\"]}", "\\u0000 is not allowed"},
        {"{\"turns\": [\"abc]}", "premature end of input"},
        {"{\"turns\": [\"x\"]} extra", "end of file expected"},
        {"[1, 2]", "expected a JSON object ('{'), not an array"},
        {"{\"turns\": [\"x\"], \"n\": 01}", "invalid token"},
        {"{\"turns\": [\"x\"], \"n\": tru}", "invalid token"},
        {"{\"turns\": [\"a\tb\"]}", "control character 0x9"},
        {"{\"turns\": [\"\xC3(\"]}", "unable to decode byte 0xc3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        rc = bench_prompt_parse(bad[i].line, strlen(bad[i].line), 1, &p, err, sizeof err);
        CHECK(rc < 0 && strstr(err, bad[i].msg), "'%s': rc %d, message '%s' (want '%s')", bad[i].line, rc, err,
              bad[i].msg);
        if (rc == 0) bench_prompt_clear(&p);
    }
}

static void test_prompts_load(void) {
    char path[320], err[512];
    snprintf(path, sizeof path, "%s/load.jsonl", g_dir);
    write_file(path, "{\"question_id\": 1, \"category\": \"a\", \"turns\": [\"one\"]}\r\n\n   \n"
                     "{\"question_id\": 2, \"category\": \"b\", \"turns\": [\"two\"]}");
    bench_prompt *ps = NULL;
    int n = bench_prompts_load(path, &ps, err, sizeof err);
    CHECK(n == 2, "n = %d: %s", n, err);
    if (n == 2) {
        CHECK(!strcmp(ps[0].text, "one") && !strcmp(ps[1].text, "two") && ps[1].line == 4, "contents: '%s' '%s' %d",
              ps[0].text, ps[1].text, ps[1].line);
        bench_prompts_free(ps, n);
    }
    write_file(path, "{\"turns\": [\"one\"]}\n{\"turns\": [\"two\"]}\n{\"turns\": [\"th\n");
    n = bench_prompts_load(path, &ps, err, sizeof err);
    CHECK(n < 0 && strstr(err, "line 3") && strstr(err, "premature end of input"), "bad line 3: %d '%s'", n, err);
    write_file(path, "\n\n");
    n = bench_prompts_load(path, &ps, err, sizeof err);
    CHECK(n < 0 && strstr(err, "no prompts"), "empty file: %d '%s'", n, err);
    unlink(path);
    n = bench_prompts_load("/nonexistent/p.jsonl", &ps, err, sizeof err);
    CHECK(n < 0 && strstr(err, "cannot open"), "missing file: %d '%s'", n, err);
}

// ------------------------------------------------------------ the program
static void test_bench_self_draft(void) {
    if (!g_model[0]) SKIP("%s", g_why);
    char pj[320], out[320], args[2048];
    snprintf(pj, sizeof pj, "%s/prompts.jsonl", g_dir);
    snprintf(out, sizeof out, "%s/results.json", g_dir);
    write_file(pj, "{\"question_id\": 1, \"category\": \"story\", \"turns\": [\"Once upon a time\"]}\n"
                   "{\"question_id\": 2, \"category\": \"story\", \"turns\": [\"Lily and Tom went to the park.\", \"x\"]}\n"
                   "\n"
                   "{\"question_id\": \"q3\", \"category\": \"other\", \"turns\": [\"The dog said \\\"hi\\\" \\u00e9\"]}\n");
    snprintf(args, sizeof args,
             "bench -m %s --draft %s --prompts %s --methods ar,chain:3,tree:2-2,dyn:2-3-6 -n 40 --no-chat -t 1 "
             "--out %s",
             g_model, g_model, pj, out);
    unlink(out);
    int rc = run(args, 1);
    CHECK(rc == 0, "exit %d:\n%s", rc, g_out);
    CHECK(strstr(g_out, "| method |") && strstr(g_out, "| chain:3 |") && strstr(g_out, "| dyn:2-3-6 |"),
          "Markdown table missing:\n%s", g_out);
    CHECK(strstr(g_out, "[12/12] dyn:2-3-6 other qq3") != NULL, "progress line missing:\n%s", g_out);
    CHECK(strstr(g_out, "MISMATCH") == NULL, "mismatch reported:\n%s", g_out);
    const char *js = read_file_all(out);
    CHECK(js != NULL, "no results file %s", out);
    if (!js) return;
    CHECK(json_valid(js), "results are not valid JSON:\n%s", js);
    const char *v = json_after(js, "n_prompts");
    CHECK(v && atoi(v) == 3, "n_prompts: %s", v ? v : "(none)");
    v = json_after(js, "n_predict");
    CHECK(v && atoi(v) == 40, "n_predict");
    v = json_after(js, "draft");
    CHECK(v && *v == '[', "draft list");
    v = json_after(js, "host");   // the machine the figures come from
    CHECK(v && *v == '{' && json_after(v, "cpu") && json_after(v, "cores") && atoi(json_after(v, "cores")) >= 1 &&
              json_after(v, "kernels") && json_after(v, "os"),
          "host: %.200s", v ? v : "(none)");
    const char *names[] = {"ar", "chain:3", "tree:2-2", "dyn:2-3-6"};
    const char *prev = js;
    for (int k = 0; k < 4; k++) {
        char pat[64];
        snprintf(pat, sizeof pat, "{\"name\": \"%s\"", names[k]);
        const char *m = strstr(prev, pat);
        CHECK(m != NULL, "method %s missing (or out of order)", names[k]);
        if (!m) continue;
        prev = m;
        const char *ov = json_after(m, "overall");
        const char *eq = json_after(ov, "equal_to_ar");
        CHECK(eq && !strncmp(eq, "true", 4), "%s: equal_to_ar %.8s", names[k], eq ? eq : "(none)");
        const char *tau = json_after(ov, "tau");
        double t = tau ? atof(tau) : 0;
        if (k == 0) CHECK(t == 1.0, "ar: tau %g", t);
        else CHECK(t > 1.5, "%s: tau %g (self-draft should accept nearly everything)", names[k], t);
        const char *nt = json_after(ov, "n_tokens");
        CHECK(nt && atoi(nt) == 120, "%s: n_tokens %s", names[k], nt ? nt : "(none)");
        const char *sp = json_after(ov, "speedup");
        CHECK(sp && atof(sp) > 0, "%s: speedup", names[k]);
        const char *bc = json_after(m, "by_category");
        CHECK(bc && strstr(bc, "\"story\": {\"tokens_per_s\"") && strstr(bc, "\"other\": {"), "%s: by_category",
              names[k]);
    }
}

static void test_bench_errors(void) {
    if (!g_model[0]) SKIP("%s", g_why);
    char pj[320], args[2048];
    snprintf(pj, sizeof pj, "%s/bad.jsonl", g_dir);
    write_file(pj, "{\"question_id\": 1, \"category\": \"story\", \"turns\": [\"Once upon a time\"]}\n"
                   "{\"question_id\": 2, \"category\": \"story\", \"turns\": [\"bad \\x escape\"]}\n");
    snprintf(args, sizeof args, "bench -m %s --draft %s --prompts %s --methods chain:2 -n 8 --no-chat", g_model,
             g_model, pj);
    int rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "line 2") && strstr(g_out, "invalid escape"), "malformed line: exit %d:\n%s", rc,
          g_out);
    snprintf(args, sizeof args, "bench -m %s --prompts %s --methods chain:2 --no-chat", g_model, pj);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "needs a draft model"), "no --draft: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "bench -m %s --draft %s --prompts %s --methods chain:x --no-chat", g_model, g_model,
             pj);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "chain:K"), "bad method: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "bench -m %s --prompts %s --methods ar,bogus:1 --no-chat", g_model, pj);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "unknown method 'bogus:1'"), "unknown method: exit %d:\n%s", rc, g_out);
    // the model has no chat template: without --no-chat the prompt cannot be formatted
    write_file(pj, "{\"question_id\": 1, \"category\": \"story\", \"turns\": [\"Once upon a time\"]}\n");
    snprintf(args, sizeof args, "bench -m %s --prompts %s --methods ar -n 4", g_model, pj);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--no-chat"), "no chat template: exit %d:\n%s", rc, g_out);
    rc = run("bench --help", 1);
    CHECK(rc == 0 && strstr(g_out, "--methods") && strstr(g_out, "--no-chat") && strstr(g_out, "--out"),
          "bench --help: exit %d", rc);
}

static void test_generate_draft(void) {
    if (!g_model[0]) SKIP("%s", g_why);
    char args[2048], plain[4096];
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --json", g_model);
    int rc = run(args, 0);
    CHECK(rc == 0, "plain generate: exit %d", rc);
    const char *t = json_after(g_out, "text");
    snprintf(plain, sizeof plain, "%s", t ? t : "");
    char *e = strstr(plain, "\"}");
    if (e) *e = 0;
    snprintf(args, sizeof args,
             "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --draft %s --draft-max 3 --json", g_model,
             g_model);
    rc = run(args, 0);
    CHECK(rc == 0, "generate --draft: exit %d:\n%s", rc, g_out);
    CHECK(json_valid(g_out), "not JSON:\n%s", g_out);
    const char *nf = json_after(g_out, "n_target_forwards");
    const char *ma = json_after(g_out, "mean_accepted");
    CHECK(nf && atoi(nf) > 0 && atoi(nf) < 40, "n_target_forwards: %s", nf ? nf : "(none)");
    CHECK(ma && atof(ma) > 1.5, "mean_accepted: %s", ma ? ma : "(none)");
    CHECK(json_after(g_out, "acceptance_by_depth") && json_after(g_out, "draft_ms") && json_after(g_out, "verify_ms"),
          "fields missing:\n%s", g_out);
    t = json_after(g_out, "text");
    CHECK(t && plain[0] && !strncmp(t, plain, strlen(plain)), "greedy text differs:\nplain %s\nspec  %s", plain,
          t ? t : "(none)");
    // prompt lookup alone (no draft model): same greedy text
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --draft-ngram 2,3 --json",
             g_model);
    rc = run(args, 0);
    CHECK(rc == 0 && strstr(g_out, "\"method\": \"ngram:2-3\"") && json_after(g_out, "n_target_forwards"),
          "--draft-ngram: exit %d:\n%s", rc, g_out);
    t = json_after(g_out, "text");
    CHECK(t && plain[0] && !strncmp(t, plain, strlen(plain)), "ngram greedy text differs:\nplain %s\nspec  %s", plain,
          t ? t : "(none)");
    // a tree, several drafts, and a summary line without --json: one line, the details with -v
    snprintf(args, sizeof args,
             "generate -m %s -p \"Once upon a time\" -n 20 --temp 0 -t 1 --draft %s --draft %s --tree 2,2", g_model,
             g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 0 && strstr(g_out, "tree:2-2: ") && strstr(g_out, "tokens/forward") && !strstr(g_out, "mean accepted"),
          "tree: exit %d:\n%s", rc, g_out);
    strcat(args, " -v");
    rc = run(args, 1);
    CHECK(rc == 0 && strstr(g_out, "target forwards") && strstr(g_out, "mean accepted"), "tree -v: exit %d:\n%s", rc,
          g_out);
    // errors
    snprintf(args, sizeof args, "generate -m %s -p hi --draft %s --tree 4,x", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--tree: expected comma-separated positive integers, got '4,x'"),
          "bad --tree: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft %s --tree 2 --tree-dynamic 2,2,4", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "cannot be used together"), "--tree + --tree-dynamic: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft %s --tree 4,4,4 --max-nodes 16", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "85 nodes") && strstr(g_out, "--max-nodes 16"), "tree too big: exit %d:\n%s", rc,
          g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft %s --tree 8,8,8 -b 64", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "batch size"), "tree > batch: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --tree 2,2", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "needs a draft model"), "--tree without --draft: exit %d:\n%s", rc, g_out);
}

// The drafters without a draft model (n-gram, layer skip, automatic tree,
// lookahead) and auto with a draft model: every method reproduces ar.
static void test_bench_methods(void) {
    if (!g_model[0]) SKIP("%s", g_why);
    char pj[320], out[320], args[2048];
    snprintf(pj, sizeof pj, "%s/methods.jsonl", g_dir);
    snprintf(out, sizeof out, "%s/methods.json", g_dir);
    write_file(pj, "{\"question_id\": 1, \"category\": \"story\", \"turns\": [\"Once upon a time\"]}\n"
                   "{\"question_id\": 2, \"category\": \"story\", \"turns\": [\"Lily and Tom went to the park. Lily\"]}\n");
    const char *names[] = {"ar", "ngram:3-4", "skip:1-2", "auto", "lookahead:3-3-3", "skip:auto"};
    const int nn = 6;
    snprintf(args, sizeof args,
             "bench -m %s --prompts %s --methods ar,ngram:3-4,skip:1-2,auto,lookahead:3-3-3,skip:auto -n 40 --no-chat "
             "-t 1 --out %s",
             g_model, pj, out);
    unlink(out);
    int rc = run(args, 1);
    CHECK(rc == 0, "exit %d:\n%s", rc, g_out);
    CHECK(strstr(g_out, "MISMATCH") == NULL, "mismatch reported:\n%s", g_out);
    CHECK(strstr(g_out, "tree auto: target cost measured") && strstr(g_out, "tree auto (auto): n="),
          "automatic tree not reported:\n%s", g_out);
    CHECK(strstr(g_out, "skip set chosen for skip:auto: {"), "skip search result not reported:\n%s", g_out);
    const char *sk = strstr(g_out, "skip search [");
    CHECK(sk && !strstr(strstr(sk, "[1/12]") ? strstr(sk, "[1/12]") : sk, "skip search ["),
          "the skip search must run once, before the first prompt:\n%s", g_out);
    const char *js = read_file_all(out);
    CHECK(js != NULL && json_valid(js), "no / invalid results file %s", out);
    if (!js) return;
    const char *prev = js;
    for (int k = 0; k < nn; k++) {
        char pat[64];
        snprintf(pat, sizeof pat, "{\"name\": \"%s\"", names[k]);
        const char *m = strstr(prev, pat);
        CHECK(m != NULL, "method %s missing (or out of order)", names[k]);
        if (!m) continue;
        prev = m;
        const char *eq = json_after(json_after(m, "overall"), "equal_to_ar");
        CHECK(eq && !strncmp(eq, "true", 4), "%s: equal_to_ar %.8s", names[k], eq ? eq : "(none)");
        const char *nt = json_after(json_after(m, "overall"), "n_tokens");
        CHECK(nt && atoi(nt) == 80, "%s: n_tokens %s", names[k], nt ? nt : "(none)");
    }
    // auto with a draft model: the draft model's automatic tree
    snprintf(args, sizeof args, "bench -m %s --draft %s --prompts %s --methods auto,tree:auto -n 24 --no-chat -t 1",
             g_model, g_model, pj);
    rc = run(args, 1);
    CHECK(rc == 0 && strstr(g_out, "| auto |") && strstr(g_out, "| tree:auto |") && !strstr(g_out, "MISMATCH") &&
              strstr(g_out, "auto = the draft model(s)"),
          "auto with --draft: exit %d:\n%s", rc, g_out);
    // errors
    snprintf(args, sizeof args, "bench -m %s --prompts %s --methods skip:1-9 --no-chat -n 4", g_model, pj);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "out of range") && strstr(g_out, "5 layers"), "skip:1-9: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "bench -m %s --prompts %s --methods lookahead:3-1-2 --no-chat -n 4", g_model, pj);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "lookahead:W-N-G"), "lookahead:3-1-2: exit %d:\n%s", rc, g_out);
    rc = run("bench --help", 1);
    CHECK(rc == 0 && strstr(g_out, "skip:auto") && strstr(g_out, "lookahead:W-N-G") && strstr(g_out, "auto = the best"),
          "bench --help lacks the new methods:\n%s", g_out);
}

// generate --draft-skip / --save-skip / --load-skip / --lookahead / --tree auto.
static void test_generate_methods(void) {
    if (!g_model[0]) SKIP("%s", g_why);
    char args[2048], plain[4096], skf[320];
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --json", g_model);
    int rc = run(args, 0);
    CHECK(rc == 0, "plain generate: exit %d", rc);
    const char *t = json_after(g_out, "text");
    snprintf(plain, sizeof plain, "%s", t ? t : "");
    char *e = strstr(plain, "\"}");
    if (e) e[1] = 0;   // the JSON string, quotes included
    const char *variants[] = {"--draft-skip 1,2", "--draft-skip 1-3", "--lookahead 3,3,3", "--tree auto",
                              "--draft-ngram 2,4 --tree auto"};
    for (int v = 0; v < 5; v++) {
        snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 %s --json", g_model,
                 variants[v]);
        rc = run(args, 0);
        t = json_after(g_out, "text");
        CHECK(rc == 0 && json_after(g_out, "n_target_forwards"), "%s: exit %d:\n%s", variants[v], rc, g_out);
        CHECK(t && plain[0] && !strncmp(t, plain, strlen(plain)), "%s: greedy text differs:\nplain %s\nspec  %s", variants[v], plain,
              t ? t : "(none)");
    }
    // --tree auto prints the chosen tree with -v; without it stderr has one line, the summary
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 20 -t 1 --draft %s --tree auto -v", g_model,
             g_model);
    rc = run(args, 1);
    CHECK(rc == 0 && strstr(g_out, "tree auto: n=") && strstr(g_out, "depth=") && strstr(g_out, "tree:auto"),
          "--tree auto -v: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 20 -t 1 --draft %s --tree auto", g_model, g_model);
    rc = run(args, 1);
    {
        int lines = 0;   // lines of specdec's own on stderr
        for (const char *c = strstr(g_out, "specdec:"); c; c = strstr(c + 1, "specdec:")) lines++;
        CHECK(rc == 0 && !strstr(g_out, "tree auto:") && lines == 1 && strstr(g_out, "tokens/forward"),
              "--tree auto without -v: exit %d, want one summary line on stderr:\n%s", rc, g_out);
    }
    // the skip search, saved and loaded
    snprintf(skf, sizeof skf, "%s/skip.txt", g_dir);
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 20 -t 1 --draft-skip auto --save-skip %s -v",
             g_model, skf);
    rc = run(args, 1);
    CHECK(rc == 0 && strstr(g_out, "skip search [") && strstr(g_out, "skip set chosen: {") &&
              strstr(g_out, "(estimated "),
          "--draft-skip auto: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 20 -t 1 --draft-skip auto --load-skip %s",
             g_model, skf);
    rc = run(args, 1);
    CHECK(rc == 0 && strstr(g_out, "skip set loaded from") && !strstr(g_out, "skip search ["),
          "--load-skip: exit %d:\n%s", rc, g_out);
    // errors
    snprintf(args, sizeof args, "generate -m %s -p hi --draft-skip 1,9", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--draft-skip") && strstr(g_out, "9 out of range") && strstr(g_out, "5 layers"),
          "--draft-skip 1,9: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft-skip x", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--draft-skip"), "--draft-skip x: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft-skip 0,1,2,3,4", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--draft-skip"), "all layers skipped: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft-skip 1 --save-skip %s", g_model, skf);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "needs --draft-skip auto"), "--save-skip without auto: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft %s --draft-skip 1", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "cannot be combined"), "--draft + --draft-skip: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --lookahead 3,1,2", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--lookahead: expected W,N,G"), "--lookahead 3,1,2: exit %d:\n%s", rc, g_out);
    rc = run("generate --help", 1);
    CHECK(rc == 0 && strstr(g_out, "--draft-skip") && strstr(g_out, "--save-skip") && strstr(g_out, "--load-skip") &&
              strstr(g_out, "--lookahead W,N,G") && strstr(g_out, "--tree auto"),
          "generate --help lacks the new flags:\n%s", g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft %s --tree auto --tree-dynamic 2,2,4", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--tree auto"), "--tree auto + --tree-dynamic: exit %d:\n%s", rc, g_out);
}

// generate --method: a method string as bench --methods takes; the shorthand
// flags give the same runs; conflicts and bad strings are named.
static void test_generate_method_flag(void) {
    if (!g_model[0]) SKIP("%s", g_why);
    char args[2048], plain[4096];
    static char alias[sizeof g_out];
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --json", g_model);
    int rc = run(args, 0);
    CHECK(rc == 0, "plain generate: exit %d", rc);
    const char *t = json_after(g_out, "text");
    snprintf(plain, sizeof plain, "%s", t ? t : "");
    char *e = strstr(plain, "\"}");
    if (e) e[1] = 0;   // the JSON string, quotes included
    // --method chain:4 --draft D is --draft D --draft-max 4: same text, same forwards
    snprintf(args, sizeof args,
             "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --draft %s --draft-max 4 --json", g_model,
             g_model);
    rc = run(args, 0);
    CHECK(rc == 0 && strstr(g_out, "\"method\": \"chain:4\""), "--draft-max 4: exit %d:\n%s", rc, g_out);
    snprintf(alias, sizeof alias, "%s", g_out);
    snprintf(args, sizeof args,
             "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --method chain:4 --draft %s --json", g_model,
             g_model);
    rc = run(args, 0);
    CHECK(rc == 0 && strstr(g_out, "\"method\": \"chain:4\""), "--method chain:4: exit %d:\n%s", rc, g_out);
    const char *ta = json_after(alias, "text"), *tm = json_after(g_out, "text");
    const char *fa = json_after(alias, "n_target_forwards"), *fm = json_after(g_out, "n_target_forwards");
    CHECK(ta && tm && plain[0] && !strncmp(ta, plain, strlen(plain)) && !strncmp(tm, plain, strlen(plain)),
          "greedy text differs:\nplain %s\nalias %s\nmethod %s", plain, ta ? ta : "(none)", tm ? tm : "(none)");
    CHECK(fa && fm && atoi(fa) == atoi(fm) && atoi(fm) > 0, "target forwards: alias %s, method %s", fa ? fa : "-",
          fm ? fm : "-");
    // every kind of method reproduces plain decoding
    const char *methods[] = {"tree:2-2", "dyn:2-3-6", "ngram:2-3", "skip:1-2", "lookahead:3-3-3", "auto"};
    for (int v = 0; v < 6; v++) {
        int drafts = v < 2;
        snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 40 --temp 0 -t 1 --method %s%s%s --json",
                 g_model, methods[v], drafts ? " --draft " : "", drafts ? g_model : "");
        rc = run(args, 0);
        t = json_after(g_out, "text");
        CHECK(rc == 0 && json_after(g_out, "n_target_forwards"), "--method %s: exit %d:\n%s", methods[v], rc, g_out);
        CHECK(t && plain[0] && !strncmp(t, plain, strlen(plain)), "--method %s: greedy text differs:\nplain %s\nspec  %s",
              methods[v], plain, t ? t : "(none)");
    }
    // errors
    snprintf(args, sizeof args, "generate -m %s -p hi --method chain:x --draft %s", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--method: method chain:K needs K in 1..64, got 'chain:x'"),
          "bad method: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --method bogus:1", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "unknown method 'bogus:1'"), "unknown method: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --method chain:4 --draft %s --draft-max 3", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--method and --draft-max cannot be used together"), "conflict: exit %d:\n%s", rc,
          g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --draft-ngram 2,3 --method ngram:3-4", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "--method and --draft-ngram cannot be used together"), "conflict: exit %d:\n%s",
          rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --method tree:2-2", g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "needs a draft model"), "no --draft: exit %d:\n%s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p hi --method lookahead:3-3-3 --draft %s", g_model, g_model);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "does not use a draft model"), "unused --draft: exit %d:\n%s", rc, g_out);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/specdec_test_bench_%d", (int)getpid());
    mkdir(g_dir, 0700);
    T_RUN(test_prompt_parse);
    T_RUN(test_prompts_load);
    prepare_model();
    T_RUN(test_bench_self_draft);
    T_RUN(test_bench_errors);
    T_RUN(test_generate_draft);
    T_RUN(test_bench_methods);
    T_RUN(test_generate_methods);
    T_RUN(test_generate_method_flag);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) printf("  note: could not remove %s\n", g_dir);
    T_EXIT();
}
