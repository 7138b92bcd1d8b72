// test_batch_invariance.c - batch invariance: the engine must compute the same bits
// for a token whether it is evaluated alone or inside a batch (a chain or a
// tree). Greedy speculative decoding is token-for-token identical to plain
// decoding only if this holds: a near-tie between two logits would otherwise
// be broken differently by the verifier's batched forward and by one-token
// decoding.
#include "t.h"

#include <stdint.h>
#include <unistd.h>

#include "specdec.h"
#include "lib/synth.h"
#include "kernels/matmul.h"
#include "kernels/threadpool.h"

static uint64_t rng_state = 0x1234567;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

// sd_matmul of n_tok tokens equals, bit for bit, n_tok calls of one token,
// for every supported weight type, with and without a 2-thread pool.
static void test_matmul_batch_invariance(void) {
    sd_pool *pool = sd_pool_new(2);
    const int n_tok = 19;
    for (int t = 0; t < SD_TYPE_FILE_COUNT; t++) {
        const sd_type_traits *tr = sd_type_get(t);
        if (!tr || !tr->supported || t == SD_TYPE_Q8_K || t == SD_TYPE_Q8_1) continue;
        const int64_t n_in = tr->blck == 256 ? 768 : 576, n_out = 45;
        float *wf = malloc(sizeof(float) * n_in * n_out);
        float *x = malloc(sizeof(float) * n_in * n_tok);
        float *yb = malloc(sizeof(float) * n_out * n_tok), *y1 = malloc(sizeof(float) * n_out);
        void *w = malloc(sd_row_size(t, n_in) * n_out);
        for (int64_t i = 0; i < n_in * n_out; i++) wf[i] = frand();
        for (int64_t i = 0; i < n_in * n_tok; i++) x[i] = frand() * 3.0f;
        for (int64_t r = 0; r < n_out; r++)
            tr->from_float(wf + r * n_in, (char *)w + r * sd_row_size(t, n_in), n_in);
        for (int use_pool = 0; use_pool < 2; use_pool++) {
            sd_mm_ctx ctx = {.pool = use_pool ? pool : NULL};
            ctx.wbuf_size = sd_matmul_wsize(t, n_in, n_tok);
            ctx.wbuf = malloc(ctx.wbuf_size);
            sd_matmul(&ctx, t, w, n_in, n_out, x, n_tok, yb);
            int n_diff = 0;
            for (int k = 0; k < n_tok; k++) {
                sd_matmul(&ctx, t, w, n_in, n_out, x + k * n_in, 1, y1);
                for (int r = 0; r < n_out; r++)
                    if (memcmp(&y1[r], &yb[k * n_out + r], sizeof(float)) != 0) n_diff++;
            }
            CHECK(n_diff == 0, "type %s pool %d: %d of %d outputs differ between batched and one-token matmul",
                  tr->name, use_pool, n_diff, n_tok * (int)n_out);
            free(ctx.wbuf);
        }
        free(wf), free(x), free(yb), free(y1), free(w);
    }
    sd_pool_free(pool);
}

// Logits of a chain batch and of a tree batch equal, bit for bit, the logits
// of one-token decoding along the same path.
static void check_model_invariance(const char *path, int n_threads) {
    char err[512];
    sd_model *m = NULL;
    if (sd_model_load(&m, path, err, sizeof err) < 0) {
        CHECK(0, "load %s: %s", path, err);
        return;
    }
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 256;
    sp.n_batch = 32;
    sp.n_threads = n_threads;
    sd_session *a = NULL, *b = NULL;
    CHECK(sd_session_new(&a, m, &sp, err, sizeof err) == 0, "%s", err);
    CHECK(sd_session_new(&b, m, &sp, err, sizeof err) == 0, "%s", err);
    if (!a || !b) goto out;
    const int n_prefix = 11, n_chain = 9;
    int32_t toks[64];
    for (int i = 0; i < n_prefix + n_chain; i++) toks[i] = (int32_t)((i * 7919 + 13) % info.n_vocab);
    // a: prefix as one batch, then the chain token by token
    sd_batch bt = {.n = n_prefix, .tokens = toks};
    CHECK(sd_session_forward(a, &bt, err, sizeof err) == 0, "%s", err);
    sd_session_commit(a, NULL, 0, err, sizeof err);
    float *ref = malloc(sizeof(float) * (size_t)info.n_vocab * n_chain);
    for (int i = 0; i < n_chain; i++) {
        sd_batch one = {.n = 1, .tokens = toks + n_prefix + i};
        CHECK(sd_session_forward(a, &one, err, sizeof err) == 0, "%s", err);
        memcpy(ref + (size_t)i * info.n_vocab, sd_session_logits(a, 0), sizeof(float) * info.n_vocab);
        sd_session_commit(a, NULL, 0, err, sizeof err);
    }
    // b: prefix, then the chain as one batch
    CHECK(sd_session_forward(b, &bt, err, sizeof err) == 0, "%s", err);
    sd_session_commit(b, NULL, 0, err, sizeof err);
    sd_batch ch = {.n = n_chain, .tokens = toks + n_prefix};
    CHECK(sd_session_forward(b, &ch, err, sizeof err) == 0, "%s", err);
    int n_diff = 0;
    for (int i = 0; i < n_chain; i++)
        if (memcmp(ref + (size_t)i * info.n_vocab, sd_session_logits(b, i), sizeof(float) * info.n_vocab)) n_diff++;
    CHECK(n_diff == 0, "%s: %d of %d chain rows differ from one-token decoding", path, n_diff, n_chain);
    // b again: a tree whose path 0 -> 2 -> 5 -> 6 is the chain's first 4 tokens,
    // with distractor siblings, evaluated after the prefix.
    sd_session_truncate(b, n_prefix, err, sizeof err);
    const int32_t *c = toks + n_prefix;
    int32_t tt[7] = {c[0], 5, c[1], 9, 17, c[2], c[3]};
    int32_t par[7] = {-1, 0, 0, 1, 2, 2, 5};
    sd_batch tr = {.n = 7, .tokens = tt, .parent = par};
    CHECK(sd_session_forward(b, &tr, err, sizeof err) == 0, "%s", err);
    const int path_nodes[4] = {0, 2, 5, 6};
    n_diff = 0;
    for (int i = 0; i < 4; i++)
        if (memcmp(ref + (size_t)i * info.n_vocab, sd_session_logits(b, path_nodes[i]), sizeof(float) * info.n_vocab))
            n_diff++;
    CHECK(n_diff == 0, "%s: %d of 4 tree-path rows differ from one-token decoding", path, n_diff);
    free(ref);
out:
    sd_session_free(a);
    sd_session_free(b);
    sd_model_free(m);
}

static void test_synthetic_model_invariance(void) {
    static const int types[] = {SD_TYPE_F32, SD_TYPE_F16, SD_TYPE_Q8_0, SD_TYPE_Q4_0, SD_TYPE_Q4_1,
                                SD_TYPE_Q5_0, SD_TYPE_Q5_1, SD_TYPE_Q4_K, SD_TYPE_Q5_K, SD_TYPE_Q6_K};
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        char path[256], err[256];
        snprintf(path, sizeof path, "/tmp/sd_inv_%d_%d.gguf", (int)getpid(), types[k]);
        synth_params p = synth_default_params();
        p.wtype = types[k];
        if (types[k] == SD_TYPE_Q4_K || types[k] == SD_TYPE_Q5_K || types[k] == SD_TYPE_Q6_K) {
            p.n_embd = 256;
            p.n_ff = 512;
        }
        if (synth_write(path, &p, err, sizeof err) < 0) {
            CHECK(0, "synth_write: %s", err);
            continue;
        }
        check_model_invariance(path, 2);
        if (types[k] == SD_TYPE_F32) { // GQA 7:1: the attention's query blocks mix heads of different nodes
            p.n_embd = 112;
            p.n_head = 7;
            p.n_head_kv = 1;
            if (synth_write(path, &p, err, sizeof err) < 0) CHECK(0, "synth_write: %s", err);
            else check_model_invariance(path, 2);
            p.n_embd = 256; // head dim 128 (Qwen2.5), GQA 2:1
            p.n_head = 2;
            if (synth_write(path, &p, err, sizeof err) < 0) CHECK(0, "synth_write: %s", err);
            else check_model_invariance(path, 2);
        }
        unlink(path);
    }
    // Mixed types (as in Q4_K_M files): attn_v and ffn_up of another type, so
    // Q, K, V and gate, up take one matmul per type after a shared RMSNorm.
    static const int mixes[][2] = {{SD_TYPE_Q4_K, SD_TYPE_Q6_K}, {SD_TYPE_Q4_1, SD_TYPE_Q8_0}};
    for (size_t k = 0; k < sizeof mixes / sizeof *mixes; k++) {
        char path[256], err[256];
        snprintf(path, sizeof path, "/tmp/sd_inv_mix_%d_%d.gguf", (int)getpid(), (int)k);
        synth_params p = synth_default_params();
        p.wtype = mixes[k][0];
        p.mix_type = mixes[k][1];
        p.n_embd = 256;
        p.n_ff = 512;
        if (synth_write(path, &p, err, sizeof err) < 0) CHECK(0, "synth_write: %s", err);
        else check_model_invariance(path, 2);
        unlink(path);
    }
}

static void test_default_model_invariance(void) {
    if (t_slow_family()) SKIP("%s", t_slow_family());
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK) != 0) SKIP("%s absent (run scripts/fetch-models.sh)", path);
    check_model_invariance(path, 2);
}

int main(int argc, char **argv) {
    (void)argc;
    t_families(argv); // every case under each kernel family this CPU has
    T_RUN(test_matmul_batch_invariance);
    T_RUN(test_synthetic_model_invariance);
    T_RUN(test_default_model_invariance);
    T_EXIT();
}
