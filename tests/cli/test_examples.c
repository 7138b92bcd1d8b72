// test_examples.c - examples/step.c, the program that uses only the public
// headers, runs and generates what `specdec generate` generates: its text,
// with the step brackets removed, equals generate's greedy text for the same
// prompt and token budget (default model; skipped when it is absent); so do
// the texts of examples/batch.c, which steps several generations together
// with one forward per step for all of them, and of examples/own_drafter.c,
// whose drafter is the program's own.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "lib/cli_run.h"
#include "t.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define PROMPT "The cat sat on the mat. The cat sat on the"

static char g_out[1 << 15], g_ref[1 << 15];

static void test_example_runs(void) {
    struct stat st;
    if (stat("build/examples/step", &st) != 0) SKIP("build/examples/step was not built");
    int rc = cli_run("build/examples/step", "/nonexistent.gguf", 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "step: "), "missing model: exit %d, output '%.200s'", rc, g_out);
    rc = cli_run("build/examples/step", "x.gguf nope:1", 1, g_out, sizeof g_out);
    CHECK(rc == 1, "bad arguments accepted: '%.200s'", g_out);
    if (stat(MODEL, &st) != 0) SKIP("%s is absent (run scripts/fetch-models.sh)", MODEL);
    rc = cli_run("build/examples/step", MODEL " ngram:3-8 '" PROMPT "'", 0, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "tokens in") && strstr(g_out, "finish"), "exit %d, output '%.300s'", rc, g_out);
    CHECK(strchr(g_out, '['), "no step accepted a draft token: '%.300s'", g_out);
    // the text without brackets and without the summary line
    char text[sizeof g_out];
    size_t n = 0;
    for (const char *c = g_out; *c && n + 1 < sizeof text; c++)
        if (*c != '[' && *c != ']') text[n++] = *c;
    text[n] = 0;
    char *last_nl = strrchr(text, '\n');
    if (last_nl) *last_nl = 0;
    last_nl = strrchr(text, '\n');
    if (last_nl) *last_nl = 0;   // "...\n<summary>\n"
    rc = cli_run("./build/specdec", "generate -m " MODEL " -p '" PROMPT "' -n 48 --temp 0 --json", 0, g_ref,
                 sizeof g_ref);
    CHECK(rc == 0, "specdec generate failed: '%.200s'", g_ref);
    // the JSON text field: the example prints prompt + generated text
    const char *t = strstr(g_ref, "\"text\": \"");
    CHECK(t != NULL, "no text in '%.200s'", g_ref);
    if (!t) return;
    t += 9;
    char gen[sizeof g_ref];
    size_t k = 0;
    for (; *t && *t != '"' && k + 1 < sizeof gen; t++) {
        if (*t == '\\' && t[1]) {
            t++;
            gen[k++] = *t == 'n' ? '\n' : *t == 't' ? '\t' : *t;
        } else {
            gen[k++] = *t;
        }
    }
    gen[k] = 0;
    CHECK(strlen(text) >= strlen(PROMPT) && !strcmp(text + strlen(PROMPT), gen),
          "example text differs from generate's:\n  example: '%s'\n  generate: '%s'", text + strlen(PROMPT), gen);
}

// The "text" field of generate --json in g_ref, unescaped (the simple
// escapes only) into out. 0 if absent.
static int json_text(char *out, size_t size) {
    const char *t = strstr(g_ref, "\"text\": \"");
    if (!t) return 0;
    t += 9;
    size_t k = 0;
    for (; *t && *t != '"' && k + 1 < size; t++) {
        if (*t == '\\' && t[1]) {
            t++;
            out[k++] = *t == 'n' ? '\n' : *t == 't' ? '\t' : *t;
        } else {
            out[k++] = *t;
        }
    }
    out[k] = 0;
    return 1;
}

static void test_batch_example(void) {
    struct stat st;
    if (stat("build/examples/batch", &st) != 0) SKIP("build/examples/batch was not built");
    int rc = cli_run("build/examples/batch", "x.gguf", 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "usage"), "no prompts: exit %d, output '%.200s'", rc, g_out);
    if (stat(MODEL, &st) != 0) SKIP("%s is absent (run scripts/fetch-models.sh)", MODEL);
    static const char *prompts[3] = {PROMPT, "Once upon a time, there was a", "The capital of France is"};
    char args[1024];
    snprintf(args, sizeof args, "%s ngram:3-8 '%s' '%s' '%s'", MODEL, prompts[0], prompts[1], prompts[2]);
    rc = cli_run("build/examples/batch", args, 0, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "3 generations"), "exit %d, output '%.300s'", rc, g_out);
    if (rc != 0) return;
    for (int i = 0; i < 3; i++) {
        char head[16], next[16], text[1 << 14], gen[1 << 14];
        snprintf(head, sizeof head, "--- %d\n", i);
        snprintf(next, sizeof next, "\n--- %d\n", i + 1);
        const char *a = strstr(g_out, head), *b = a ? strstr(a, i < 2 ? next : "\n3 generations") : NULL;
        CHECK(a && b, "generation %d not found in '%.300s'", i, g_out);
        if (!a || !b) continue;
        a += strlen(head);
        snprintf(text, sizeof text, "%.*s", (int)(b - a), a);
        snprintf(args, sizeof args, "generate -m " MODEL " -p '%s' -n 32 --temp 0 --json", prompts[i]);
        rc = cli_run("./build/specdec", args, 0, g_ref, sizeof g_ref);
        CHECK(rc == 0 && json_text(gen, sizeof gen), "specdec generate failed: '%.200s'", g_ref);
        CHECK(!strcmp(text, gen), "generation %d differs from generate's:\n  batch: '%s'\n  generate: '%s'", i, text,
              gen);
    }
}

// examples/own_drafter.c: a drafter of the program's own (callbacks) gives
// generate's greedy text, and its guesses are accepted on a repeating text.
static void test_own_drafter_example(void) {
    struct stat st;
    if (stat("build/examples/own_drafter", &st) != 0) SKIP("build/examples/own_drafter was not built");
    int rc = cli_run("build/examples/own_drafter", "/nonexistent.gguf", 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "own_drafter: "), "missing model: exit %d, output '%.200s'", rc, g_out);
    if (stat(MODEL, &st) != 0) SKIP("%s is absent (run scripts/fetch-models.sh)", MODEL);
    rc = cli_run("build/examples/own_drafter", MODEL " '" PROMPT "' 48", 0, g_out, sizeof g_out);
    int n_tok = 0, n_fwd = 0, n_acc = 0, n_prop = 0;
    char *line = strrchr(g_out, '\n');
    while (line && line > g_out && line[1] == 0) {   // the last non-empty line: the statistics
        *line = 0;
        line = strrchr(g_out, '\n');
    }
    CHECK(rc == 0 && line && sscanf(line + 1, "%d tokens, %d target forwards, %d of %d drafts", &n_tok, &n_fwd, &n_acc,
                                    &n_prop) == 4,
          "exit %d, output '%.300s'", rc, g_out);
    if (!line) return;
    *line = 0;   // the text alone
    rc = cli_run("./build/specdec", "generate -m " MODEL " -p '" PROMPT "' -n 48 --temp 0 --json", 0, g_ref,
                 sizeof g_ref);
    char gen[sizeof g_ref];
    CHECK(rc == 0 && json_text(gen, sizeof gen), "specdec generate failed: '%.200s'", g_ref);
    CHECK(!strcmp(g_out, gen), "own drafter's text differs from generate's:\n  own: '%s'\n  generate: '%s'", g_out, gen);
    CHECK(n_tok == 48 && n_acc > 0 && n_fwd < n_tok && n_fwd + n_acc + 1 >= n_tok && n_prop >= n_acc,
          "%d tokens, %d forwards, %d of %d drafts accepted", n_tok, n_fwd, n_acc, n_prop);
}

int main(void) {
    T_RUN(test_example_runs);
    T_RUN(test_batch_example);
    T_RUN(test_own_drafter_example);
    T_EXIT();
}
