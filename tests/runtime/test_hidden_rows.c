// test_hidden_rows.c - hidden-state rows out of a forward (sd_batch.hidden_layers)
// and embedding rows in (sd_batch.embd): the rows equal the scalar reference
// forward's (tests/lib/ref_forward.h) on synthetic models (one of the tiny
// stories260K's shape) and the default model; asking for them changes no
// logit bit; a chain and a tree give the same bits for the same path; skipped
// layers pass their input on; embedding rows of the tokens give the token
// batch's bits; bad requests fail with a message.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "lib/ref_forward.h"
#include "lib/synth.h"
#include "model/model.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];

// ---------------------------------------------------------------- models

static sd_model *load_synth(const synth_params *p, const char *tag) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_hidden_%d_%s.gguf", (int)getpid(), tag);
    sd_model *m = NULL;
    if (synth_write(path, p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

static sd_session *new_session(const sd_model *m, int n_ctx, int n_batch, int n_threads) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.n_threads = n_threads;
    sd_session *s = NULL;
    if (sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return NULL;
    return s;
}

// The four layers the tests ask for: 0, the middle, the last, the final norm.
static void four_layers(const sd_model *m, int32_t out[4]) {
    out[0] = 0;
    out[1] = m->hp.n_layer / 2;
    out[2] = m->hp.n_layer - 1;
    out[3] = SD_HIDDEN_NORM;
}

// ---------------------------------------------------------------- against the reference

// A prompt of n tokens as one batch with the rows of four_layers for every
// node, each compared with the reference run token by token (act_quant: the
// reference rounds activations as the 8-bit path does). tol: allowed
// |row - ref| / |ref| (Euclidean norms, worst row): the residual stream of a
// real model has outlier dims of a few hundred next to dims of order one, so
// an absolute bound would say little.
static void hidden_vs_ref(const sd_model *m, const char *what, int act_quant, float tol) {
    const int E = m->hp.n_embd, V = m->hp.n_vocab, L = m->hp.n_layer, n = 6;
    int32_t layers[4];
    four_layers(m, layers);
    int32_t toks[6];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    sd_session *s = new_session(m, 64, 16, 2);
    ref_state *r = ref_new(m, 64);
    float *hid = malloc(sizeof(float) * (size_t)n * 4 * E), *ref = malloc(sizeof(float) * (size_t)(L + 1) * E);
    float *lg = malloc(sizeof(float) * (size_t)V);
    CHECK(s && r && hid && ref && lg, "setup: %s", g_err);
    if (!s || !r || !hid || !ref || !lg) goto out;
    ref_set_act_quant(r, act_quant);
    sd_batch b = {.n = n, .tokens = toks, .hidden_layers = layers, .n_hidden_layers = 4, .hidden_out = hid};
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) == 0, "forward: %s", g_err);
    float worst[4] = {0};
    for (int i = 0; i < n; i++) {
        ref_eval_hidden(r, toks[i], -1, lg, ref);
        for (int k = 0; k < 4; k++) {
            const float *got = hid + ((size_t)i * 4 + k) * E;
            const float *want = ref + (size_t)(layers[k] == SD_HIDDEN_NORM ? L : layers[k]) * E;
            double d2 = 0, r2 = 0;
            for (int e = 0; e < E; e++) {
                d2 += ((double)got[e] - want[e]) * ((double)got[e] - want[e]);
                r2 += (double)want[e] * want[e];
            }
            const float rel = (float)sqrt(d2 / (r2 > 0 ? r2 : 1));
            if (!(rel <= worst[k])) worst[k] = rel; // NaN propagates as a failure
        }
    }
    for (int k = 0; k < 4; k++)
        CHECK(worst[k] <= tol, "%s: layer %d: |row - ref| / |ref| = %g > tol %g", what, layers[k], worst[k], tol);
    printf("  info: %s vs %s reference, |row - ref| / |ref| at layers 0, %d, %d, norm: %.1e %.1e %.1e %.1e "
           "(tol %.1g)\n",
           what, act_quant ? "act-quant" : "float", layers[1], layers[2], worst[0], worst[1], worst[2], worst[3], tol);
out:
    free(hid);
    free(ref);
    free(lg);
    ref_free(r);
    sd_session_free(s);
}

// Tolerances (|row - ref| / |ref|), from measurements. Float weights
// multiply float activations in both paths, only the summation order
// differs: measured <= 1e-6; tol 1e-4. Quantized weights (the default model)
// against the reference that rounds activations the same way: float-order
// differences flip the rounding of single activations (test_forward_vs_reference.c,
// VSREF_FLIP) and the flips compound over 30 layers: measured 6e-7 at
// layer 0, 1.8e-2 at 15, 3.2e-2 at 29 and after the norm (4.6e-2 against
// the float reference). tol 8e-2 stays below what wrong rows give: adjacent
// layers of this model differ by 0.13..1.2, other tokens' rows by 1..40.
static void test_hidden_vs_reference_synth(void) {
    synth_params p = synth_default_params();
    p.n_layer = 4;
    sd_model *m = load_synth(&p, "ref");
    CHECK(m != NULL, "%s", g_err);
    if (!m) return;
    hidden_vs_ref(m, "synthetic F32", 0, 1e-4f);
    sd_model_free(m);
}

// A synthetic F32 model of stories260K's shape (the tiny llama2.c model these
// cases used; a clone has no ../shared): 5 layers, 8 heads of 8 over 4 KV
// heads, a feed-forward of 172 (no multiple of any block or vector width) and
// a vocabulary of 512.
static sd_model *load_tiny(void) {
    synth_params p = synth_default_params();
    p.n_layer = 5;
    p.n_head = 8;
    p.n_head_kv = 4;
    p.n_ff = 172;
    p.n_vocab = 512;
    return load_synth(&p, "tiny");
}

static void test_hidden_vs_reference_tiny(void) {
    sd_model *m = load_tiny();
    CHECK(m != NULL, "%s", g_err);
    if (!m) return;
    hidden_vs_ref(m, "stories260K-shaped F32", 0, 1e-4f);
    sd_model_free(m);
}

static void test_hidden_vs_reference_default(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s absent (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    hidden_vs_ref(m, "SmolLM2", 1, 8e-2f);
    sd_model_free(m);
}

// ---------------------------------------------------------------- same bits

// Logits of a forward with and without hidden rows asked (every node, a
// subset, all layers incl. the norm, a 8-bit and a precise forward): the same
// bits.
static void logits_unchanged(const sd_model *m, const char *what) {
    const int E = m->hp.n_embd, V = m->hp.n_vocab, n = 7;
    int32_t toks[7];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((i * 131 + 5) % V);
    int32_t layers[SD_MAX_HIDDEN_LAYERS];
    four_layers(m, layers);
    layers[4] = m->hp.n_layer - 1; // a repeat
    const uint8_t some[7] = {0, 1, 0, 0, 1, 1, 0};
    const uint8_t want_logits[7] = {1, 0, 1, 0, 0, 1, 1};
    sd_session *a = new_session(m, 64, 16, 2), *b = new_session(m, 64, 16, 2);
    float *hid = malloc(sizeof(float) * (size_t)n * 5 * E);
    CHECK(a && b && hid, "setup: %s", g_err);
    if (!a || !b || !hid) goto out;
    for (int precise = 0; precise < 2; precise++)
        for (int variant = 0; variant < 2; variant++) {
            const uint8_t *lmask = variant ? want_logits : NULL;
            sd_batch plain = {.n = n, .tokens = toks, .logits = lmask, .precise = precise};
            sd_batch asked = plain;
            asked.hidden_layers = layers;
            asked.n_hidden_layers = 5;
            asked.hidden = variant ? some : NULL;
            asked.hidden_out = hid;
            CHECK(sd_session_forward(a, &plain, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_session_forward(b, &asked, g_err, sizeof g_err) == 0, "%s", g_err);
            int n_diff = 0;
            for (int i = 0; i < n; i++) {
                const float *la = sd_session_logits(a, i), *lb = sd_session_logits(b, i);
                CHECK(!la == !lb, "logits presence differs at node %d", i);
                if (la && lb && memcmp(la, lb, sizeof(float) * (size_t)V)) n_diff++;
            }
            CHECK(n_diff == 0, "%s precise %d variant %d: %d logit rows differ with hidden rows asked", what,
                  precise, variant, n_diff);
            // the repeated layer's rows are copies of each other
            const int nw = variant ? 3 : n;
            for (int r = 0; r < nw; r++)
                CHECK(memcmp(hid + ((size_t)r * 5 + 2) * E, hid + ((size_t)r * 5 + 4) * E, sizeof(float) * E) == 0,
                      "%s: repeated layer rows differ (node rank %d)", what, r);
        }
out:
    free(hid);
    sd_session_free(a);
    sd_session_free(b);
}

static void test_hidden_logits_unchanged(void) {
    synth_params p = synth_default_params();
    p.wtype = SD_TYPE_Q4_1;
    p.n_layer = 3;
    sd_model *m = load_synth(&p, "same");
    CHECK(m != NULL, "%s", g_err);
    if (m) logits_unchanged(m, "synthetic Q4_1");
    sd_model_free(m);
    p = synth_default_params(); // NEOX rotation, biases, mixed types (one matmul per type)
    p.arch = "qwen2";
    p.wtype = SD_TYPE_Q4_1;
    p.mix_type = SD_TYPE_Q8_0;
    m = load_synth(&p, "same_qwen2");
    CHECK(m != NULL, "%s", g_err);
    if (m) logits_unchanged(m, "synthetic qwen2 Q4_1+Q8_0");
    sd_model_free(m);
    if (access(DEFAULT_MODEL, R_OK) != 0) {
        printf("  info: %s absent: checked on the synthetic model only\n", DEFAULT_MODEL);
        return;
    }
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    logits_unchanged(m, "SmolLM2");
    sd_model_free(m);
}

// A tree whose path 0 -> 2 -> 5 -> 6 is a chain's 4 tokens, with
// distractor siblings, only the path's rows asked (hidden mask): the same
// bits as the chain's rows, after the same prefix.
static void chain_vs_tree(const sd_model *m, const char *what) {
    const int E = m->hp.n_embd, V = m->hp.n_vocab, np = 5;
    int32_t layers[4];
    four_layers(m, layers);
    int32_t pre[5], c[4];
    for (int i = 0; i < np; i++) pre[i] = (int32_t)((i * 97 + 3) % V);
    for (int i = 0; i < 4; i++) c[i] = (int32_t)((i * 61 + 200) % V);
    sd_session *s = new_session(m, 64, 16, 2);
    float *hc = malloc(sizeof(float) * 4 * 4 * E), *ht = malloc(sizeof(float) * 4 * 4 * E);
    CHECK(s && hc && ht, "setup: %s", g_err);
    if (!s || !hc || !ht) goto out;
    sd_batch bp = {.n = np, .tokens = pre};
    CHECK(sd_session_forward(s, &bp, g_err, sizeof g_err) == 0 && sd_session_commit(s, NULL, 0, g_err, sizeof g_err) == 0,
          "%s", g_err);
    sd_batch ch = {.n = 4, .tokens = c, .hidden_layers = layers, .n_hidden_layers = 4, .hidden_out = hc};
    CHECK(sd_session_forward(s, &ch, g_err, sizeof g_err) == 0, "%s", g_err);
    const int32_t tt[7] = {c[0], 5, c[1], 9, 17, c[2], c[3]};
    const int32_t par[7] = {-1, 0, 0, 1, 2, 2, 5};
    const uint8_t on_path[7] = {1, 0, 1, 0, 0, 1, 1};
    sd_batch tr = {.n = 7, .tokens = tt, .parent = par, .hidden_layers = layers, .n_hidden_layers = 4,
                   .hidden = on_path, .hidden_out = ht};
    CHECK(sd_session_forward(s, &tr, g_err, sizeof g_err) == 0, "%s", g_err);
    int n_diff = 0;
    for (int r = 0; r < 4 * 4; r++)
        if (memcmp(hc + (size_t)r * E, ht + (size_t)r * E, sizeof(float) * E)) n_diff++;
    CHECK(n_diff == 0, "%s: %d of 16 tree-path rows differ from the chain's", what, n_diff);
out:
    free(hc);
    free(ht);
    sd_session_free(s);
}

static void test_hidden_chain_vs_tree(void) {
    synth_params p = synth_default_params();
    p.wtype = SD_TYPE_Q8_0;
    p.n_layer = 3;
    sd_model *m = load_synth(&p, "tree");
    CHECK(m != NULL, "%s", g_err);
    if (m) chain_vs_tree(m, "synthetic Q8_0");
    sd_model_free(m);
    m = load_tiny();
    CHECK(m != NULL, "%s", g_err);
    if (m) chain_vs_tree(m, "stories260K-shaped F32");
    sd_model_free(m);
    if (access(DEFAULT_MODEL, R_OK) != 0) {
        printf("  info: %s absent: not checked on it\n", DEFAULT_MODEL);
        return;
    }
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    chain_vs_tree(m, "SmolLM2");
    sd_model_free(m);
}

// Skipped layers pass their input on: with layers 0 and 2 of 4 skipped,
// layer 0's row is the token's embedding row and layer 2's equals layer 1's.
static void test_hidden_skipped_layers(void) {
    synth_params p = synth_default_params();
    p.n_layer = 4;
    sd_model *m = load_synth(&p, "skip");
    CHECK(m != NULL, "%s", g_err);
    if (!m) return;
    const int E = m->hp.n_embd;
    sd_session *s = new_session(m, 32, 8, 2);
    float *hid = malloc(sizeof(float) * 3 * 5 * E), *emb = malloc(sizeof(float) * E);
    CHECK(s && hid && emb, "setup: %s", g_err);
    if (s && hid && emb) {
        const uint8_t skip[4] = {1, 0, 1, 0};
        CHECK(sd_session_set_layer_skip(s, skip, g_err, sizeof g_err) == 2, "%s", g_err);
        const int32_t toks[3] = {7, 300, 42};
        const int32_t layers[5] = {0, 1, 2, 3, SD_HIDDEN_NORM};
        sd_batch b = {.n = 3, .tokens = toks, .hidden_layers = layers, .n_hidden_layers = 5, .hidden_out = hid};
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) == 0, "%s", g_err);
        for (int i = 0; i < 3; i++) {
            const float *row = hid + (size_t)i * 5 * E;
            CHECK(sd_model_token_embd(m, toks[i], emb, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(memcmp(row, emb, sizeof(float) * E) == 0, "node %d: skipped layer 0's row is not the embedding", i);
            CHECK(memcmp(row + 2 * E, row + E, sizeof(float) * E) == 0, "node %d: skipped layer 2's row != layer 1's", i);
            CHECK(memcmp(row + 3 * E, row + 2 * E, sizeof(float) * E) != 0, "node %d: layer 3 changed nothing", i);
        }
    }
    free(hid);
    free(emb);
    sd_session_free(s);
    sd_model_free(m);
}

static void test_hidden_errors(void) {
    synth_params p = synth_default_params();
    sd_model *m = load_synth(&p, "err");
    CHECK(m != NULL, "%s", g_err);
    if (!m) return;
    sd_session *s = new_session(m, 32, 8, 1);
    float hid[9 * 64 * 2];
    CHECK(s != NULL, "%s", g_err);
    if (s) {
        const int32_t toks[2] = {5, 6};
        int32_t layers[9] = {0, 1, SD_HIDDEN_NORM, 0, 1, 0, 1, 0, 1};
        sd_batch b = {.n = 2, .tokens = toks, .hidden_layers = layers, .n_hidden_layers = 3, .hidden_out = hid};
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) == 0, "a good request fails: %s", g_err);
        layers[1] = m->hp.n_layer;
        g_err[0] = 0;
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "out of range"),
              "layer n_layer accepted: '%s'", g_err);
        layers[1] = -2;
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0, "layer -2 accepted");
        layers[1] = 1;
        b.n_hidden_layers = SD_MAX_HIDDEN_LAYERS + 1;
        g_err[0] = 0;
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "SD_MAX_HIDDEN_LAYERS"),
              "9 layers accepted: '%s'", g_err);
        b.n_hidden_layers = -1;
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0, "-1 layers accepted");
        b.n_hidden_layers = 2;
        b.hidden_out = NULL;
        g_err[0] = 0;
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "hidden_out"),
              "hidden_out NULL accepted: '%s'", g_err);
        b.hidden_out = hid;
        b.hidden_layers = NULL;
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0, "hidden_layers NULL accepted");
        // nothing asked: the other fields are ignored
        b.n_hidden_layers = 0;
        b.hidden_out = NULL;
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) == 0, "%s", g_err);
    }
    sd_session_free(s);
    sd_model_free(m);
}

// ---------------------------------------------------------------- embedding rows in

// A chain and a tree batch given as the tokens' embedding rows
// (sd_model_token_embd) give the token batches' logits, bit for bit.
static void embd_same_bits(const sd_model *m, const char *what) {
    const int E = m->hp.n_embd, V = m->hp.n_vocab, n = 7;
    int32_t toks[7];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((i * 211 + 9) % V);
    const int32_t par[7] = {-1, 0, 0, 1, 2, 2, 5};
    float *emb = malloc(sizeof(float) * (size_t)n * E);
    sd_session *a = new_session(m, 64, 16, 2), *b = new_session(m, 64, 16, 2);
    CHECK(a && b && emb, "setup: %s", g_err);
    if (!a || !b || !emb) goto out;
    for (int i = 0; i < n; i++)
        CHECK(sd_model_token_embd(m, toks[i], emb + (size_t)i * E, g_err, sizeof g_err) == 0, "%s", g_err);
    for (int tree = 0; tree < 2; tree++) {
        sd_batch bt = {.n = n, .tokens = toks, .parent = tree ? par : NULL};
        sd_batch be = {.n = n, .embd = emb, .parent = tree ? par : NULL};
        CHECK(sd_session_forward(a, &bt, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_session_forward(b, &be, g_err, sizeof g_err) == 0, "%s", g_err);
        int n_diff = 0;
        for (int i = 0; i < n; i++)
            if (memcmp(sd_session_logits(a, i), sd_session_logits(b, i), sizeof(float) * (size_t)V)) n_diff++;
        CHECK(n_diff == 0, "%s %s: %d of %d logit rows differ between embedding rows and tokens", what,
              tree ? "tree" : "chain", n_diff, n);
        if (!tree) { // commit the chain, so the tree runs after a cached prefix
            CHECK(sd_session_commit(a, NULL, 0, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_session_commit(b, NULL, 0, g_err, sizeof g_err) == 0, "%s", g_err);
        }
    }
out:
    free(emb);
    sd_session_free(a);
    sd_session_free(b);
}

static void test_embd_input(void) {
    synth_params p = synth_default_params();
    p.wtype = SD_TYPE_Q4_0; // token_embd quantized too: the rows are dequantized
    sd_model *m = load_synth(&p, "embd");
    CHECK(m != NULL, "%s", g_err);
    if (m) embd_same_bits(m, "synthetic Q4_0");
    sd_model_free(m);
    if (access(DEFAULT_MODEL, R_OK) != 0) {
        printf("  info: %s absent: checked on the synthetic model only\n", DEFAULT_MODEL);
        return;
    }
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    embd_same_bits(m, "SmolLM2");
    sd_model_free(m);
}

static void test_embd_errors(void) {
    synth_params p = synth_default_params();
    sd_model *m = load_synth(&p, "embd_err");
    CHECK(m != NULL, "%s", g_err);
    if (!m) return;
    sd_session *s = new_session(m, 32, 8, 1);
    float emb[2 * 64];
    CHECK(s != NULL && m->hp.n_embd == 64, "%s", g_err);
    if (s) {
        const int32_t toks[2] = {5, 6};
        g_err[0] = 0;
        CHECK(sd_model_token_embd(m, m->hp.n_vocab, emb, g_err, sizeof g_err) < 0 && strstr(g_err, "range"),
              "token n_vocab accepted: '%s'", g_err);
        CHECK(sd_model_token_embd(m, -1, emb, g_err, sizeof g_err) < 0, "token -1 accepted");
        CHECK(sd_model_token_embd(m, 5, emb, g_err, sizeof g_err) == 0 &&
                  sd_model_token_embd(m, 6, emb + 64, g_err, sizeof g_err) == 0,
              "%s", g_err);
        sd_batch both = {.n = 2, .tokens = toks, .embd = emb};
        g_err[0] = 0;
        CHECK(sd_session_forward(s, &both, g_err, sizeof g_err) < 0 && strstr(g_err, "both"),
              "tokens and embd both set accepted: '%s'", g_err);
        sd_batch neither = {.n = 2};
        g_err[0] = 0;
        CHECK(sd_session_forward(s, &neither, g_err, sizeof g_err) < 0 && strstr(g_err, "neither"),
              "neither tokens nor embd accepted: '%s'", g_err);
        sd_batch ok = {.n = 2, .embd = emb};
        CHECK(sd_session_forward(s, &ok, g_err, sizeof g_err) == 0, "%s", g_err);
    }
    sd_session_free(s);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_hidden_errors);
    T_RUN(test_hidden_vs_reference_synth);
    T_RUN(test_hidden_vs_reference_tiny);
    T_RUN(test_hidden_vs_reference_default);
    T_RUN(test_hidden_logits_unchanged);
    T_RUN(test_hidden_chain_vs_tree);
    T_RUN(test_hidden_skipped_layers);
    T_RUN(test_embd_input);
    T_RUN(test_embd_errors);
    T_EXIT();
}
