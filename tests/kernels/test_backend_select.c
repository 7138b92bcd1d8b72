// test_backend_select.c - the kernel family is fixed once per process
// (sd_backend_select, or "auto" by the first model load). Each case runs in a
// child process of its own (fork), since the choice cannot be undone.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "specdec.h"
#include "kernels/quant.h"
#include "lib/synth.h"
#include "t.h"

static char g_err[512];

static sd_model *load_synth(const char *tag) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_backend_%d_%s.gguf", (int)getpid(), tag);
    synth_params p = synth_default_params();
    p.wtype = SD_TYPE_Q8_0; // a type with optimized kernels
    sd_model *m = NULL;
    if (synth_write(path, &p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

// Runs body in a child process; the case fails if any check there failed.
static void in_child(void (*body)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        t_case_failed = 0;
        body();
        fflush(stdout);
        _exit(t_case_failed ? 1 : 0);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid, "fork / wait failed");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: checks failed (status %d)", st);
}

static void body_select_then_load(void) {
    g_err[0] = 0;
    CHECK(sd_backend_select("no-such", g_err, sizeof g_err) < 0 && strstr(g_err, "no-such") && strstr(g_err, "scalar"),
          "unknown name: '%s'", g_err);
    const char *asked = sd_backend_name(); // asking fixes nothing
    CHECK(asked && asked[0], "no name before selection");
    CHECK(sd_backend_select("scalar", g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(strcmp(sd_backend_name(), "scalar") == 0, "name %s", sd_backend_name());
    CHECK(sd_backend_select("scalar", g_err, sizeof g_err) == 0, "the same family again: %s", g_err);
    g_err[0] = 0;
    CHECK(sd_backend_select("auto", g_err, sizeof g_err) < 0 && strstr(g_err, "already selected"),
          "another family accepted: '%s'", g_err);
    sd_model *m = load_synth("sel");
    CHECK(m != NULL, "%s", g_err);
    CHECK(strcmp(sd_backend_name(), "scalar") == 0, "the load changed the family to %s", sd_backend_name());
    g_err[0] = 0;
    CHECK(sd_backend_select("avx2", g_err, sizeof g_err) < 0 && strstr(g_err, "model"),
          "a family change after a load accepted: '%s'", g_err);
    sd_session *s = NULL;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 16;
    sp.n_threads = 1;
    CHECK(m && sd_session_new(&s, m, &sp, g_err, sizeof g_err) == 0, "%s", g_err);
    const int32_t toks[2] = {5, 6};
    sd_batch b = {.n = 2, .tokens = toks};
    CHECK(s && sd_session_forward(s, &b, g_err, sizeof g_err) == 0, "forward with the scalar kernels: %s", g_err);
    sd_session_free(s);
    sd_model_free(m);
}
static void test_select_then_load(void) { in_child(body_select_then_load); }

static void body_load_fixes_auto(void) {
    const char *before = sd_backend_name();
    sd_model *m = load_synth("auto");
    CHECK(m != NULL, "%s", g_err);
    CHECK(strcmp(sd_backend_name(), before) == 0, "auto gave %s, the name said %s", sd_backend_name(), before);
    CHECK(sd_backend_select("auto", g_err, sizeof g_err) == 0, "auto again after the load: %s", g_err);
    g_err[0] = 0;
    CHECK(sd_backend_select("scalar", g_err, sizeof g_err) < 0 && strstr(g_err, "model") && strstr(g_err, "auto"),
          "scalar after a load accepted: '%s'", g_err);
    printf("  info: auto: %s; after a load: %s\n", before, g_err);
    sd_model_free(m);
}
static void test_load_fixes_auto(void) { in_child(body_load_fixes_auto); }

// The named families: each is either available (selected, then reported by
// name) or refused with a message, and a refusal leaves nothing fixed.
static void body_named_family(const char *name) {
    g_err[0] = 0;
    if (sd_backend_select(name, g_err, sizeof g_err) == 0) {
        CHECK(strcmp(sd_backend_name(), name) == 0, "%s selected, name %s", name, sd_backend_name());
        printf("  info: %s: available\n", name);
    } else {
        CHECK(strstr(g_err, "not available") != NULL, "%s: '%s'", name, g_err);
        printf("  info: %s\n", g_err);
        CHECK(sd_backend_select("scalar", g_err, sizeof g_err) == 0, "a refused family fixed something: %s", g_err);
    }
}
static void body_avx2(void) { body_named_family("avx2"); }
static void body_avx512(void) { body_named_family("avx512-vnni"); }
static void test_named_families(void) {
    in_child(body_avx2);
    in_child(body_avx512);
}

int main(void) {
    T_RUN(test_select_then_load);
    T_RUN(test_load_fixes_auto);
    T_RUN(test_named_families);
    T_EXIT();
}
