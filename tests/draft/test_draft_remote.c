// test_draft_remote.c - a drafter driven by hand (the split client's side,
// include/specdec_spec.h): an EAGLE-3 drafter made remote proposes for a
// text, hears the accepted path with fused states (sd_head_fuse of the
// target's rows) or none (its own predictions) and keeps proposing; the
// fused rows equal the drafter's own fusion; bad paths are refused; and a
// split client's file (sd_client_file_write) loads as a model with no layers
// whose tokenizer and embeddings give the drafter the very trees the target
// gives it, its head loaded back (sd_client_file_head). Needs the default
// model and its shipped head (skipped otherwise).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define HEAD "heads/SmolLM2-135M-Instruct.eagle3.gguf"

static char g_err[512];

static sd_drafter *make_remote(const sd_model *m, const sd_head *h) {
    sd_method meth;
    sd_drafter *d = NULL;
    sd_method_env env = sd_method_env_default(m);
    env.head_eagle3 = h;
    env.n_threads = 1;
    env.n_ctx = 512;
    if (sd_method_parse("eagle3:dyn:4-5-16", &meth, g_err, sizeof g_err) < 0 ||
        sd_method_make(&meth, &env, &d, g_err, sizeof g_err) < 0 || sd_drafter_remote(d, g_err, sizeof g_err) < 0) {
        sd_drafter_free(d);
        return NULL;
    }
    return d;
}

// The target's rows of the head's layers for text[0..n) and their fused states (n, d).
static float *target_states(sd_model *m, const sd_head *h, const sd_drafter *d, const int32_t *text, int n) {
    sd_session *s = NULL;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 256;
    sp.n_threads = 1;
    if (sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return NULL;
    sd_model_info info;
    sd_model_get_info(m, &info);
    int32_t layers[SD_MAX_HIDDEN_LAYERS];
    int nl = sd_drafter_hidden_layers(d, layers);
    float *rows = malloc(sizeof(float) * (size_t)n * 3 * (size_t)info.n_embd);
    float *fused = malloc(sizeof(float) * (size_t)n * (size_t)info.n_embd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i;
    sd_batch b = {0};
    b.n = n;
    b.tokens = text;
    b.pos = pos;
    b.n_hidden_layers = nl;
    b.hidden_layers = layers;
    b.hidden_out = rows;
    int ok = nl == 3 && sd_session_forward(s, &b, g_err, sizeof g_err) == 0 &&
             sd_head_fuse(h, rows, n, fused, g_err, sizeof g_err) == 0;
    free(rows);
    free(pos);
    sd_session_free(s);
    if (!ok) {
        free(fused);
        return NULL;
    }
    return fused;
}

static int same_tree(const sd_tree *a, const sd_tree *b) {
    if (sd_tree_size(a) != sd_tree_size(b)) return 0;
    for (int i = 0; i < sd_tree_size(a); i++)
        if (sd_tree_token(a, i) != sd_tree_token(b, i) || sd_tree_parent(a, i) != sd_tree_parent(b, i)) return 0;
    return 1;
}

static sd_model *g_m;
static sd_head *g_h;
static int32_t g_text[64];
static int g_n;

static void test_remote_draft_and_tell(void) {
    if (!g_m || !g_h) SKIP("needs %s and %s", MODEL, HEAD);
    sd_drafter *d = make_remote(g_m, g_h);
    CHECK(d, "%s", g_err);
    if (!d) return;
    float *st = target_states(g_m, g_h, d, g_text, g_n);
    CHECK(st, "%s", g_err);
    sd_tree *t = NULL;
    CHECK(sd_tree_new(&t, 16, sd_tokenizer_n_vocab(sd_model_tokenizer(g_m)), g_err, sizeof g_err) == 0, "%s", g_err);
    if (!st || !t) goto out;
    sd_model_info info;
    sd_model_get_info(g_m, &info);
    // the prompt's states but the last position's (the root), then a tree from the root
    CHECK(sd_drafter_tell_prompt(d, g_text, 0, g_n - 1, st, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_drafter_draft(d, g_text, g_n, 16, t, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_tree_size(t) > 1, "the drafter proposed nothing with the prompt's states");
    CHECK(sd_tree_token(t, 0) == g_text[g_n - 1], "root %d", sd_tree_token(t, 0));
    // a path that is not one: refused
    int32_t bad[2] = {0, 0};
    CHECK(sd_drafter_tell(d, t, bad, 2, 5, NULL, g_err, sizeof g_err) == SD_ERR_INPUT, "a bad path was taken");
    // the first child accepted, with the root's and the child's states (from the target's text when it agrees)
    int32_t path[2] = {0, 1};
    int32_t txt2[66];
    memcpy(txt2, g_text, sizeof(int32_t) * (size_t)g_n);
    txt2[g_n] = sd_tree_token(t, 1);
    txt2[g_n + 1] = 42;   // the bonus
    float *st2 = target_states(g_m, g_h, d, txt2, g_n + 1);
    CHECK(st2, "%s", g_err);
    if (st2) {
        CHECK(sd_drafter_tell(d, t, path, 2, 42, st2 + (size_t)(g_n - 1) * info.n_embd, g_err, sizeof g_err) == 0,
              "%s", g_err);
        CHECK(sd_drafter_draft(d, txt2, g_n + 2, 16, t, g_err, sizeof g_err) == 0 && sd_tree_size(t) > 1,
              "no draft after a told step: %s", g_err);
        free(st2);
    }
    // offline: no states, the head's own; it keeps drafting for several steps
    int32_t txt3[128];
    int n3 = g_n + 2;
    memcpy(txt3, txt2, sizeof(int32_t) * (size_t)n3);
    for (int k = 0; k < 6; k++) {
        CHECK(sd_drafter_draft(d, txt3, n3, 8, t, g_err, sizeof g_err) == 0, "%s", g_err);
        int n = sd_tree_size(t);
        CHECK(n > 1, "offline step %d proposed nothing", k);
        if (n <= 1) break;
        int best = 1;
        for (int i = 2; i < n; i++)
            if (sd_tree_parent(t, i) == 0 && sd_tree_p(t, i) > sd_tree_p(t, best)) best = i;
        int32_t p1[1] = {0};
        txt3[n3] = sd_tree_token(t, best);
        CHECK(sd_drafter_tell(d, t, p1, 1, txt3[n3], NULL, g_err, sizeof g_err) == 0, "%s", g_err);
        n3++;
    }
out:
    free(st);
    sd_tree_destroy(t);
    sd_drafter_free(d);
}

static void test_client_file(void) {
    if (!g_m || !g_h) SKIP("needs %s and %s", MODEL, HEAD);
    char path[] = "/tmp/sd_client_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) SKIP("no temporary file");
    close(fd);
    CHECK(sd_client_file_write(MODEL, HEAD, path, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_model *c = NULL;
    sd_head *h = NULL;
    CHECK(sd_model_load(&c, path, g_err, sizeof g_err) == 0, "%s", g_err);
    if (c) {
        sd_model_info a, b;
        sd_model_get_info(g_m, &a);
        sd_model_get_info(c, &b);
        CHECK(b.n_layer == a.n_layer && b.layer_lo == b.n_layer && b.layer_hi == b.n_layer && !b.has_output &&
                  b.n_vocab == a.n_vocab && b.n_embd == a.n_embd,
              "layers %d (held %d..%d) vocab %d embd %d", b.n_layer, b.layer_lo, b.layer_hi, b.n_vocab, b.n_embd);
        CHECK(sd_client_file_head(path, c, &h, g_err, sizeof g_err) == 0 && h, "%s", g_err);
        sd_session *ss = NULL;
        CHECK(sd_session_new(&ss, c, NULL, g_err, sizeof g_err) == SD_ERR_INPUT && !ss, "a session on a client file");
        int32_t ids[64];
        int n = sd_tokenize(sd_model_tokenizer(c), "Once upon a time", 16, 1, 0, ids, 64);
        int n2 = sd_tokenize(sd_model_tokenizer(g_m), "Once upon a time", 16, 1, 0, ids + 32, 32);
        CHECK(n > 0 && n == n2 && !memcmp(ids, ids + 32, sizeof(int32_t) * (size_t)n), "tokenizers differ");
        float e1[1024], e2[1024];
        CHECK(a.n_embd <= 1024 && sd_model_token_embd(c, 1234, e1, g_err, sizeof g_err) == 0 &&
                  sd_model_token_embd(g_m, 1234, e2, g_err, sizeof g_err) == 0 &&
                  !memcmp(e1, e2, sizeof(float) * (size_t)a.n_embd),
              "embeddings differ");
        // the same drafter's trees on the client file as on the target, with the same states
        sd_drafter *d1 = make_remote(g_m, g_h), *d2 = h ? make_remote(c, h) : NULL;
        CHECK(d1 && d2, "%s", g_err);
        float *st = d1 ? target_states(g_m, g_h, d1, g_text, g_n) : NULL;
        sd_tree *t1 = NULL, *t2 = NULL;
        sd_tree_new(&t1, 16, a.n_vocab, g_err, sizeof g_err);
        sd_tree_new(&t2, 16, a.n_vocab, g_err, sizeof g_err);
        if (d1 && d2 && st && t1 && t2) {
            CHECK(sd_drafter_tell_prompt(d1, g_text, 0, g_n - 1, st, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_drafter_tell_prompt(d2, g_text, 0, g_n - 1, st, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_drafter_draft(d1, g_text, g_n, 16, t1, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_drafter_draft(d2, g_text, g_n, 16, t2, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_tree_size(t1) > 1 && same_tree(t1, t2), "the client file's trees differ (%d vs %d nodes)",
                  sd_tree_size(t1), sd_tree_size(t2));
        }
        free(st);
        sd_tree_destroy(t1);
        sd_tree_destroy(t2);
        sd_drafter_free(d1);
        sd_drafter_free(d2);
    }
    // a client file is not a target for another client file; a missing head is an I/O error
    CHECK(sd_client_file_write(path, HEAD, "/tmp/sd_client_never.gguf", g_err, sizeof g_err) == SD_ERR_INPUT,
          "a client file taken as a target");
    CHECK(sd_client_file_write(MODEL, "/nonexistent.gguf", "/tmp/sd_client_never.gguf", g_err, sizeof g_err) ==
              SD_ERR_IO,
          "a missing head");
    // the target holds no client head
    sd_head *none = NULL;
    CHECK(sd_client_file_head(MODEL, g_m, &none, g_err, sizeof g_err) == 0 && !none, "a head in the target");
    sd_head_free(h);
    sd_model_free(c);
    unlink(path);
}

static void test_bad_input(void) {
    sd_tree *t = NULL;
    CHECK(sd_tree_new(&t, 0, 10, g_err, sizeof g_err) == SD_ERR_INPUT && !t, "a tree of 0 nodes");
    CHECK(sd_drafter_draft(NULL, g_text, 1, 4, NULL, g_err, sizeof g_err) == SD_ERR_INPUT, "no drafter");
    CHECK(sd_head_fuse(NULL, NULL, 0, NULL, g_err, sizeof g_err) == SD_ERR_INPUT, "no head");
    if (!g_m) return;
    sd_method meth;
    sd_drafter *d = NULL;
    sd_method_env env = sd_method_env_default(g_m);
    CHECK(sd_method_parse("ngram:3-8", &meth, g_err, sizeof g_err) == 0 &&
              sd_method_make(&meth, &env, &d, g_err, sizeof g_err) == 0,
          "%s", g_err);
    CHECK(sd_drafter_remote(d, g_err, sizeof g_err) == SD_ERR_INPUT, "an n-gram drafter made remote");
    sd_drafter_free(d);
}

int main(void) {
    if (access(MODEL, R_OK) == 0 && access(HEAD, R_OK) == 0 && sd_model_load(&g_m, MODEL, g_err, sizeof g_err) == 0 &&
        sd_head_load(&g_h, HEAD, g_m, g_err, sizeof g_err) < 0)
        g_h = NULL;
    if (g_m) g_n = sd_tokenize(sd_model_tokenizer(g_m), "The quick brown fox jumps over the lazy dog. The quick brown",
                               60, 1, 0, g_text, 64);
    T_RUN(test_remote_draft_and_tell);
    T_RUN(test_client_file);
    T_RUN(test_bad_input);
    sd_head_free(g_h);
    sd_model_free(g_m);
    T_EXIT();
}
