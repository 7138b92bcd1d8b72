// test_cli.c - drives build/specdec (run from the repository root): help,
// version, bad flags, missing files, too-long prompts, and generate --json on
// the default model (skipped when it is absent).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/cli_run.h"
#include "t.h"
// the helpers of the program are unit-tested here directly
#include "../tools/cli_common.c"

// SPECDEC_BIN overrides the program under test.
static const char *specdec_bin(void) {
    const char *e = getenv("SPECDEC_BIN");
    return e && *e ? e : "./build/specdec";
}
#define SPECDEC specdec_bin()
#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_out[1 << 16]; // stdout and stderr of the last run

// Runs `SPECDEC args` through the shell, stdout and stderr together (or only
// stdout when merge == 0). Returns the exit status, -1 if it did not exit.
static int run(const char *args, int merge) { return cli_run(SPECDEC, args, merge, g_out, sizeof g_out); }

static int have_binary(void) {
    struct stat st;
    return stat(SPECDEC, &st) == 0;
}

// Skips the case (saying why) when the default model is absent.
#define NEED_MODEL()                                                                     \
    do {                                                                                 \
        struct stat st_;                                                                 \
        if (stat(MODEL, &st_) != 0) SKIP("%s is absent (run scripts/fetch-models.sh)", MODEL); \
    } while (0)

#define NEED_BINARY()                                                            \
    do {                                                                         \
        CHECK(have_binary(), "%s is missing: build it with make", SPECDEC); \
        if (!have_binary()) return;                                              \
    } while (0)

static void test_help(void) {
    NEED_BINARY();
    int rc = run("--help", 1);
    CHECK(rc == 0, "exit %d", rc);
    CHECK(strstr(g_out, "generate") && strstr(g_out, "bench-forward") && strstr(g_out, "convert-llama2c"),
          "help lists the commands:\n%s", g_out);
    rc = run("generate --help", 1);
    CHECK(rc == 0, "generate --help: exit %d", rc);
    const char *flags[] = {"-m", "-p", "-n", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                           "--seed", "--chat", "--system", "-t", "-c", "--json"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        CHECK(strstr(g_out, flags[i]) != NULL, "generate --help does not describe %s", flags[i]);
    rc = run("bench-forward --help", 1);
    CHECK(rc == 0 && strstr(g_out, "--batch") && strstr(g_out, "--reps"), "bench-forward --help: exit %d", rc);
    rc = run("convert-llama2c --help", 1);
    CHECK(rc == 0 && strstr(g_out, "TOKENIZER"), "convert-llama2c --help: exit %d", rc);
    rc = run("--version", 1);
    CHECK(rc == 0 && strncmp(g_out, "specdec ", 8) == 0, "--version: exit %d, '%s'", rc, g_out);
}

static void test_bad_usage(void) {
    NEED_BINARY();
    int rc = run("", 1);
    CHECK(rc == 1, "no command: exit %d", rc);
    rc = run("frobnicate", 1);
    CHECK(rc == 1 && strstr(g_out, "unknown command 'frobnicate'"), "unknown command: exit %d: %s", rc, g_out);
    rc = run("generate -m " MODEL " -p hi --temp abc", 1);
    CHECK(rc == 1 && strstr(g_out, "--temp: expected a number, got 'abc'"), "bad --temp: exit %d: %s", rc, g_out);
    rc = run("generate -m " MODEL " -p hi --top-k 1.5", 1);
    CHECK(rc == 1 && strstr(g_out, "--top-k: expected an integer, got '1.5'"), "bad --top-k: exit %d: %s", rc, g_out);
    rc = run("generate -m " MODEL " -p hi --top-p 2", 1);
    CHECK(rc == 1 && strstr(g_out, "--top-p"), "--top-p 2: exit %d: %s", rc, g_out);
    rc = run("generate -m " MODEL " -p hi --bogus", 1);
    CHECK(rc == 1 && strstr(g_out, "unknown option '--bogus'"), "unknown flag: exit %d: %s", rc, g_out);
    rc = run("generate -m " MODEL " -p", 1);
    CHECK(rc == 1 && strstr(g_out, "-p: missing value"), "missing value: exit %d: %s", rc, g_out);
    rc = run("generate -p hi", 1);
    CHECK(rc == 1 && strstr(g_out, "model"), "no model: exit %d: %s", rc, g_out);
    rc = run("bench-forward -m " MODEL " --batch 1,x", 1);
    CHECK(rc == 1 && strstr(g_out, "--batch"), "bad --batch: exit %d: %s", rc, g_out);
    rc = run("convert-llama2c a.bin", 1);
    CHECK(rc == 1, "convert with one argument: exit %d", rc);
}

static void test_missing_files(void) {
    NEED_BINARY();
    int rc = run("generate -m /nonexistent/model.gguf -p hi", 1);
    CHECK(rc == 1 && strstr(g_out, "'/nonexistent/model.gguf' not found"), "missing model: exit %d: %s", rc, g_out);
    rc = run("convert-llama2c /nonexistent/a.bin /nonexistent/t.bin /tmp/x.gguf", 1);
    CHECK(rc == 1 && strstr(g_out, "not found"), "missing checkpoint: exit %d: %s", rc, g_out);
    // a file that is not GGUF
    char path[64];
    snprintf(path, sizeof path, "/tmp/specdec_test_cli_%d.gguf", (int)getpid());
    FILE *f = fopen(path, "wb");
    fputs("this is not a gguf file", f);
    fclose(f);
    char args[256];
    snprintf(args, sizeof args, "generate -m %s -p hi", path);
    rc = run(args, 1);
    CHECK(rc == 1 && strstr(g_out, "cannot load model"), "bad model: exit %d: %s", rc, g_out);
    unlink(path);
}

// Number after "key": in g_out; 1 if found and a number.
static int json_num(const char *key, double *v) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(g_out, pat);
    if (!p) return 0;
    p += strlen(pat);
    char *end;
    *v = strtod(p, &end);
    return end != p;
}

static void test_generate_json(void) {
    NEED_BINARY();
    NEED_MODEL();
    int rc = run("generate -m " MODEL " -p \"The capital of France is\" -n 8 --temp 0 -t 2 --json", 0);
    CHECK(rc == 0, "exit %d: %s", rc, g_out);
    const char *keys[] = {"n_prompt_tokens", "n_generated", "tokens_per_second", "prompt_ms", "generate_ms", "n_threads"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        double v = -1;
        CHECK(json_num(keys[i], &v) && v >= 0, "field %s missing or not a number in:\n%s", keys[i], g_out);
    }
    double ng = 0, nt = 0;
    json_num("n_generated", &ng);
    json_num("n_threads", &nt);
    CHECK(ng >= 1 && ng <= 8, "n_generated %g", ng);
    CHECK(nt == 2, "n_threads %g", nt);
    CHECK(strstr(g_out, "\"text\": \"") != NULL, "no text field:\n%s", g_out);
    CHECK(strstr(g_out, "\"finish_reason\": \"") != NULL, "no finish_reason:\n%s", g_out);
    CHECK(g_out[0] == '{' && strchr(g_out, '}') != NULL, "not one JSON object:\n%s", g_out);

    // prompt longer than the context
    rc = run("generate -m " MODEL " -p \"one two three four five six seven eight nine ten eleven twelve\" -c 4", 1);
    CHECK(rc == 1 && strstr(g_out, "but the context is 4 (-c)"), "long prompt: exit %d: %s", rc, g_out);
}

// bench-forward --json: every field the issue lists, consistent with each
// other (a structure check: timings are the benchmark's business, not a test's)
static void test_bench_forward_json(void) {
    NEED_BINARY();
    NEED_MODEL();
    int rc = run("bench-forward -m " MODEL " -t 2 --batch 1,3 --reps 3 --ctx 16 --decode 4 --bw-mb 8 --json", 0);
    CHECK(rc == 0, "exit %d: %s", rc, g_out);
    const char *keys[] = {"model_bytes", "mem_bw_gbs", "floor_ms", "mem_bw_median_gbs", "floor_median_ms",
                          "n_threads", "decode_tokens_per_s", "ratio_3_over_1", "handover_ns"};
    double v[9];
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        CHECK(json_num(keys[i], &v[i]) && v[i] > 0, "field %s missing or not positive in:\n%s", keys[i], g_out);
    CHECK(v[3] <= v[1] && v[4] >= v[2], "median bandwidth %g above the best %g, or floors %g < %g", v[3], v[1], v[4], v[2]);
    CHECK(fabs(v[2] - v[0] / (v[1] * 1e6)) < 1e-3 * v[2] + 1e-4, "floor_ms %g != model_bytes / mem_bw", v[2]);
    CHECK(v[5] == 2, "n_threads %g", v[5]);
    CHECK(strstr(g_out, "\"batches\": [{\"n\": 1, \"ms\": ") && strstr(g_out, "{\"n\": 3, \"ms\": "),
          "batches missing:\n%s", g_out);
    CHECK(g_out[0] == '{' && strchr(g_out, '}') != NULL, "not one JSON object:\n%s", g_out);
    // one thread: no hand-over to time, and no field
    rc = run("bench-forward -m " MODEL " -t 1 --batch 1 --reps 1 --ctx 4 --decode 1 --bw-mb 8 --json", 0);
    CHECK(rc == 0 && json_num("n_threads", &v[5]) && v[5] == 1 && !strstr(g_out, "handover_ns"),
          "-t 1: exit %d: %s", rc, g_out);
}

// bench-batch: help, a bad list, and --json with every field per case (a
// structure check: the timings are the benchmark's business)
static void test_bench_batch_json(void) {
    NEED_BINARY();
    int rc = run("bench-batch --help", 1);
    CHECK(rc == 0 && strstr(g_out, "--sessions") && strstr(g_out, "--nodes"), "bench-batch --help: exit %d", rc);
    rc = run("bench-batch -m " MODEL " --sessions 1,x", 1);
    CHECK(rc == 1 && strstr(g_out, "--sessions"), "bad --sessions: exit %d: %s", rc, g_out);
    NEED_MODEL();
    rc = run("bench-batch -m " MODEL " -t 2 --sessions 1,2 --nodes 2 --ctx 8 --reps 2 --json", 0);
    CHECK(rc == 0, "exit %d: %s", rc, g_out);
    CHECK(g_out[0] == '{' && strchr(g_out, '}') != NULL, "not one JSON object:\n%s", g_out);
    CHECK(strstr(g_out, "{\"sessions\": 1, \"nodes\": 2, \"multi_ms\": {\"median\": ") &&
              strstr(g_out, "{\"sessions\": 2, \"nodes\": 2, "),
          "cases missing:\n%s", g_out);
    const char *keys[] = {"n_threads", "ctx", "speedup", "multi_nodes_per_s", "separate_nodes_per_s"};
    double v;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        CHECK(json_num(keys[i], &v) && v > 0, "field %s missing or not positive in:\n%s", keys[i], g_out);
}

// stories260K through the CLI: convert, then greedy generate
static void test_convert_and_generate(void) {
    NEED_BINARY();
    const char *sh = t_shared_dir();
    if (!sh) SKIP("../shared/models is absent (stories260K.bin)");
    char out[128], args[1024];
    snprintf(out, sizeof out, "/tmp/specdec_test_cli_%d_stories.gguf", (int)getpid());
    snprintf(args, sizeof args, "convert-llama2c %s/models/stories260K.bin %s/models/tok512.bin %s", sh, sh, out);
    int rc = run(args, 1);
    CHECK(rc == 0, "convert: exit %d: %s", rc, g_out);
    snprintf(args, sizeof args, "generate -m %s -p \"Once upon a time\" -n 24 --temp 0 -t 1", out);
    rc = run(args, 0);
    CHECK(rc == 0, "generate: exit %d", rc);
    CHECK(strstr(g_out, "there was a little girl") != NULL, "generated: '%s'", g_out);
    unlink(out);
}

static void test_utf8_and_json(void) {
    // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80
    CHECK(cli_utf8_complete("ab", 2) == 2, "ascii");
    CHECK(cli_utf8_complete("a\xC3", 2) == 1, "held back lead byte");
    CHECK(cli_utf8_complete("a\xC3\xA9", 3) == 3, "complete 2-byte");
    CHECK(cli_utf8_complete("\xE2\x82", 2) == 0, "incomplete 3-byte");
    CHECK(cli_utf8_complete("\xF0\x9F\x98\x80x", 5) == 5, "4-byte");
    CHECK(cli_utf8_complete("\xF0\x9F\x98", 3) == 0, "incomplete 4-byte");
    CHECK(cli_utf8_complete("\x80z", 2) == 2, "stray continuation passes through");
    char buf[256];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    cli_json_string(f, "a\"b\\c\n\x01\xC3\xA9\xFF", 10);
    fclose(f);
    CHECK(strcmp(buf, "\"a\\\"b\\\\c\\n\\u0001\xC3\xA9\xEF\xBF\xBD\"") == 0, "json: %s", buf);
    int v = 0;
    float x = 0;
    CHECK(cli_int("-n", "12", 0, 100, &v) == 0 && v == 12, "int");
    CHECK(cli_float("--temp", "0.5", 0, 2, &x) == 0 && x == 0.5f, "float");
}

int main(void) {
    T_RUN(test_utf8_and_json);
    T_RUN(test_help);
    T_RUN(test_bad_usage);
    T_RUN(test_missing_files);
    T_RUN(test_generate_json);
    T_RUN(test_bench_forward_json);
    T_RUN(test_bench_batch_json);
    T_RUN(test_convert_and_generate);
    T_EXIT();
}
