// test_session_state.c - a session's state saved and restored
// (sd_session_state_*): a session loaded with a saved state continues with
// exactly the logits and tokens the original produces, in a buffer and
// through a file, into a session of another context size and thread count;
// the layer-skip mask travels with it; bad states are refused with the right
// code and leave the session untouched.
#include <stdint.h>
#include <unistd.h>

#include "specdec.h"
#include "t.h"
#include "lib/synth.h"

static char g_dir[256];
static char g_err[512];

static const char *tmp_path(const char *name) {
    static char p[4][320];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

static sd_model *synth_model(const char *name, uint64_t seed) {
    synth_params p = synth_default_params();
    p.wtype = 8;   // Q8_0: the 8-bit activation path of generated tokens
    p.n_layer = 3;
    p.seed = seed;
    const char *path = tmp_path(name);
    if (synth_write(path, &p, g_err, sizeof g_err) < 0) return NULL;
    sd_model *m = NULL;
    if (sd_model_load(&m, path, g_err, sizeof g_err) < 0) return NULL;
    return m;
}

static sd_session *new_session(const sd_model *m, int n_ctx, int n_threads) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_threads = n_threads;
    sd_session *s = NULL;
    if (sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return NULL;
    return s;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

// Greedy steps from token `next`: tokens out[0..n) and the logits of the
// last step in last (n_vocab floats). 0, or -1 with g_err.
static int greedy(sd_session *s, int32_t next, int n, int n_vocab, int32_t *out, float *last) {
    for (int i = 0; i < n; i++) {
        sd_batch b = {.n = 1, .tokens = &next};
        if (sd_session_forward(s, &b, g_err, sizeof g_err) < 0 || sd_session_commit(s, NULL, 1, g_err, sizeof g_err) < 0)
            return -1;
        const float *lg = sd_session_logits(s, 0);
        memcpy(last, lg, (size_t)n_vocab * sizeof *last);
        out[i] = next = argmax(lg, n_vocab);
    }
    return 0;
}

// A prompt of 20 tokens then 17 greedy ones: 37 committed rows (not a
// multiple of the cache's 16-position K blocks). *next: the token to feed.
static int prime(sd_session *s, int n_vocab, int32_t *next) {
    int32_t prompt[20], gen[17];
    for (int i = 0; i < 20; i++) prompt[i] = 3 + (i * 37) % (n_vocab - 3);
    sd_batch b = {.n = 20, .tokens = prompt};
    if (sd_session_forward(s, &b, g_err, sizeof g_err) < 0 || sd_session_commit(s, NULL, 20, g_err, sizeof g_err) < 0)
        return -1;
    float *last = malloc((size_t)n_vocab * sizeof *last);
    int rc = greedy(s, argmax(sd_session_logits(s, 19), n_vocab), 17, n_vocab, gen, last);
    free(last);
    *next = gen[16];
    return rc;
}

// The original continues 12 steps; a second session (other n_ctx and
// threads) loaded with the saved state continues with the same bits.
static void test_restore_continues_exactly(void) {
    sd_model *m = synth_model("a.gguf", 1);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_model_info info;
    sd_model_get_info(m, &info);
    const int nv = info.n_vocab;
    sd_session *a = new_session(m, 64, 1), *b = new_session(m, 128, 2), *c = new_session(m, 40, 1);
    CHECK(a && b && c, "%s", g_err);
    int32_t next = 0, ta[12], tb[12], tc[12];
    float *la = malloc((size_t)nv * 4), *lb = malloc((size_t)nv * 4), *lc = malloc((size_t)nv * 4);
    if (a && b && c && prime(a, nv, &next) == 0) {
        CHECK(sd_session_n_past(a) == 37, "n_past %d", sd_session_n_past(a));
        size_t n = sd_session_state_size(a);
        void *buf = malloc(n);
        int w = sd_session_state_save(a, buf, n, g_err, sizeof g_err);
        CHECK(w == (int)n, "save: %d of %zu bytes: %s", w, n, g_err);
        CHECK(sd_session_state_save_file(a, tmp_path("a.state"), g_err, sizeof g_err) == 0, "save file: %s", g_err);
        CHECK(greedy(a, next, 12, nv, ta, la) == 0, "%s", g_err);
        CHECK(sd_session_state_load(b, buf, n, g_err, sizeof g_err) == 0, "load: %s", g_err);
        CHECK(sd_session_n_past(b) == 37, "restored n_past %d", sd_session_n_past(b));
        CHECK(greedy(b, next, 12, nv, tb, lb) == 0, "%s", g_err);
        CHECK(!memcmp(ta, tb, sizeof ta), "restored session's tokens differ from the original's");
        CHECK(!memcmp(la, lb, (size_t)nv * 4), "restored session's logits differ in their bits");
        CHECK(sd_session_state_load_file(c, tmp_path("a.state"), g_err, sizeof g_err) == 0, "load file: %s", g_err);
        CHECK(greedy(c, next, 3, nv, tc, lc) == 0, "%s", g_err);
        CHECK(!memcmp(ta, tc, 3 * sizeof *tc), "state through a file: tokens differ");
        // Loaded back into the original after it moved on, the state rewinds it.
        CHECK(sd_session_state_load(a, buf, n, g_err, sizeof g_err) == 0, "reload: %s", g_err);
        CHECK(greedy(a, next, 12, nv, tc, lc) == 0, "%s", g_err);
        CHECK(!memcmp(ta, tc, sizeof ta) && !memcmp(la, lc, (size_t)nv * 4), "rewound session differs");
        free(buf);
    } else {
        CHECK(0, "prime: %s", g_err);
    }
    free(la);
    free(lb);
    free(lc);
    sd_session_free(a);
    sd_session_free(b);
    sd_session_free(c);
    sd_model_free(m);
}

// The layer-skip mask is part of the state.
static void test_skip_mask_travels(void) {
    sd_model *m = synth_model("a.gguf", 1);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_session *a = new_session(m, 64, 1), *b = new_session(m, 64, 1);
    uint8_t skip[3] = {0, 1, 0};
    CHECK(a && b && sd_session_set_layer_skip(a, skip, g_err, sizeof g_err) == 1, "%s", g_err);
    int32_t t[4] = {5, 6, 7, 8};
    sd_batch bt = {.n = 4, .tokens = t};
    CHECK(sd_session_forward(a, &bt, g_err, sizeof g_err) == 0 && sd_session_commit(a, NULL, 4, g_err, sizeof g_err) == 0,
          "%s", g_err);
    size_t n = sd_session_state_size(a);
    void *buf = malloc(n);
    CHECK(sd_session_state_save(a, buf, n, g_err, sizeof g_err) == (int)n, "%s", g_err);
    CHECK(sd_session_state_load(b, buf, n, g_err, sizeof g_err) == 0, "%s", g_err);
    const uint8_t *mk = sd_session_layer_skip(b);
    CHECK(mk && mk[0] == 0 && mk[1] == 1 && mk[2] == 0, "mask not restored");
    free(buf);
    sd_session_free(a);
    sd_session_free(b);
    sd_model_free(m);
}

// Bad states: each refused with its code and a message, the session unchanged.
static void test_bad_states_refused(void) {
    sd_model *m = synth_model("a.gguf", 1), *o = synth_model("other.gguf", 2);
    CHECK(m && o, "%s", g_err);
    if (!m || !o) return;
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_session *a = new_session(m, 64, 1), *small = new_session(m, 16, 1), *other = new_session(o, 64, 1);
    int32_t next;
    CHECK(a && small && other && prime(a, info.n_vocab, &next) == 0, "%s", g_err);
    size_t n = sd_session_state_size(a);
    uint8_t *buf = malloc(n + 8);
    CHECK(sd_session_state_save(a, buf, n - 1, g_err, sizeof g_err) == SD_ERR_INPUT && strstr(g_err, "needs"),
          "small buffer: %s", g_err);
    CHECK(sd_session_state_save(a, buf, n, g_err, sizeof g_err) == (int)n, "%s", g_err);
    struct {
        const char *what;
        sd_session *s;
        size_t size;
        int byte;   // byte to flip, -1 none
        int want;
        const char *msg;
    } cases[] = {
        {"truncated", a, n - 2, -1, SD_ERR_INPUT, "truncated"},
        {"too long", a, n + 8, -1, SD_ERR_INPUT, "truncated or corrupt"},
        {"header only", a, 12, -1, SD_ERR_INPUT, "too short"},
        {"bad magic", a, n, 0, SD_ERR_INPUT, "magic"},
        {"bad version", a, n, 4, SD_ERR_INPUT, "version"},
        {"another model", other, n, -1, SD_ERR_INPUT, "another model"},
        {"no room", small, n, -1, SD_ERR_NO_ROOM, "context is 16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *copy = malloc(n + 8);
        memcpy(copy, buf, n);
        memset(copy + n, 0, 8);
        if (cases[i].byte >= 0) copy[cases[i].byte] ^= 0x5a;
        const int before = sd_session_n_past(cases[i].s);
        g_err[0] = 0;
        int rc = sd_session_state_load(cases[i].s, copy, cases[i].size, g_err, sizeof g_err);
        CHECK(rc == cases[i].want && strstr(g_err, cases[i].msg), "%s: rc %d, message '%s'", cases[i].what, rc, g_err);
        CHECK(sd_session_n_past(cases[i].s) == before, "%s: the session changed", cases[i].what);
        free(copy);
    }
    CHECK(sd_session_state_load_file(a, tmp_path("missing.state"), g_err, sizeof g_err) == SD_ERR_IO &&
              strstr(g_err, "missing.state"),
          "missing file: %s", g_err);
    free(buf);
    sd_session_free(a);
    sd_session_free(small);
    sd_session_free(other);
    sd_model_free(m);
    sd_model_free(o);
}

// The kinds of failure the core functions report (sd_status).
static void test_status_codes(void) {
    sd_model *m = NULL;
    CHECK(sd_model_load(&m, tmp_path("missing.gguf"), g_err, sizeof g_err) == SD_ERR_IO && strstr(g_err, "cannot open"),
          "missing model: '%s'", g_err);
    m = synth_model("a.gguf", 1);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_session *s = new_session(m, 16, 1);
    CHECK(s, "%s", g_err);
    int32_t t[12] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    sd_batch b = {.n = 12, .tokens = t};
    CHECK(s && sd_session_forward(s, &b, g_err, sizeof g_err) == 0 && sd_session_commit(s, NULL, 12, g_err, sizeof g_err) == 0,
          "%s", g_err);
    CHECK(s && sd_session_forward(s, &b, g_err, sizeof g_err) == SD_ERR_NO_ROOM && strstr(g_err, "context full"),
          "past the context: '%s'", g_err);
    t[0] = 1 << 20;
    b.n = 1;
    CHECK(s && sd_session_forward(s, &b, g_err, sizeof g_err) == SD_ERR_INPUT && strstr(g_err, "out of range"),
          "bad token: '%s'", g_err);
    sd_session_free(s);
    sd_model_free(m);
}

static void test_version(void) {
    const char *v = sd_version();
    int a, b, c;
    CHECK(v && sscanf(v, "%d.%d.%d", &a, &b, &c) == 3 && !strcmp(v, SPECDEC_VERSION), "sd_version '%s'", v ? v : "");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/sd_test_state_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_RUN(test_restore_continues_exactly);
    T_RUN(test_skip_mask_travels);
    T_RUN(test_bad_states_refused);
    T_RUN(test_status_codes);
    T_RUN(test_version);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_EXIT();
}
