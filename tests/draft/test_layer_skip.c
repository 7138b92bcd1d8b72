// test_layer_skip.c - self-speculative layer skipping: the per-session skip mask
// (no skip = bit-identical forward; skipping layer l = the model whose layer l
// has zero output projections), greedy losslessness of the skip drafter
// (synthetic models and the default model), the adaptive threshold rule, the
// skip-set search (it must find the layers that are exact identities), skip
// lists and skip files.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "common.h"
#include "draft/draft_skip.h"
#include "draft/skip_search.h"
#include "specdec_spec.h"
#include "model/gguf.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];

typedef sc_tokens collect_t;

static void tmp_path(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "/tmp/specdec_test_skip_%d_%s", (int)getpid(), tag);
}

static sd_model *load_path(const char *path) {
    sd_model *m = NULL;
    if (sd_model_load(&m, path, g_err, sizeof g_err) < 0) return NULL;
    return m;
}

// Writes a synthetic model; zero_layers (n_layer bytes or NULL): layers whose
// attention output and FFN down projections are overwritten with zeros in the
// file, which makes them exact identities on the residual stream.
static int write_model(const char *path, uint64_t seed, int n_layer, const uint8_t *zero_layers) {
    synth_params p = synth_default_params();
    p.seed = seed;
    p.n_layer = n_layer;
    if (synth_write(path, &p, g_err, sizeof g_err) < 0) return -1;
    if (!zero_layers) return 0;
    sd_model *m = load_path(path);
    if (!m) return -1;
    FILE *f = fopen(path, "r+b");
    int rc = f ? 0 : -1;
    for (int l = 0; l < n_layer && rc == 0; l++) {
        if (!zero_layers[l]) continue;
        const sd_tensor *ts[2] = {m->layers[l].wo, m->layers[l].w_down};
        for (int k = 0; k < 2 && rc == 0; k++) {
            long off = (long)((const uint8_t *)ts[k]->data - m->gguf->base);
            static uint8_t zeros[1 << 16];
            if (ts[k]->nbytes > sizeof zeros || fseek(f, off, SEEK_SET) != 0 ||
                fwrite(zeros, 1, ts[k]->nbytes, f) != ts[k]->nbytes)
                rc = -1;
        }
    }
    if (f) fclose(f);
    sd_model_free(m);
    if (rc < 0) snprintf(g_err, sizeof g_err, "could not zero layers of %s", path);
    return rc;
}

static sd_model *synth_model(uint64_t seed, int n_layer, const uint8_t *zero_layers, const char *tag) {
    char path[256];
    tmp_path(path, sizeof path, tag);
    sd_model *m = write_model(path, seed, n_layer, zero_layers) == 0 ? load_path(path) : NULL;
    remove(path);
    return m;
}

static sd_session *new_session(const sd_model *m, int n_ctx, int n_threads) {
    return sc_new_session(m, n_ctx, n_threads, g_err, sizeof g_err);
}

static void make_prompt(int32_t *p, int n, uint64_t seed, int n_vocab) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = 3 + (int32_t)((seed >> 33) % (uint64_t)(n_vocab - 3));
    }
}

// Runs a prompt chain then a small tree; copies every logit row into out
// (room for 24 rows of n_vocab). Returns rows written or -1.
static int forward_rows(sd_session *s, const int32_t *prompt, int np, float *out, int n_vocab) {
    int rows = 0;
    sd_session_truncate(s, 0, NULL, 0);
    sd_batch b = {.n = np, .tokens = prompt};
    if (sd_session_forward(s, &b, g_err, sizeof g_err) < 0 || sd_session_commit(s, NULL, 0, g_err, sizeof g_err) < 0)
        return -1;
    for (int i = 0; i < np && rows < 16; i++) memcpy(out + (size_t)rows++ * n_vocab, sd_session_logits(s, i), sizeof(float) * (size_t)n_vocab);
    int32_t tt[6] = {5, 9, 11, 13, 17, 19}, par[6] = {-1, 0, 0, 1, 1, 2};
    sd_batch t = {.n = 6, .tokens = tt, .parent = par};
    if (sd_session_forward(s, &t, g_err, sizeof g_err) < 0) return -1;
    for (int i = 0; i < 6; i++) memcpy(out + (size_t)rows++ * n_vocab, sd_session_logits(s, i), sizeof(float) * (size_t)n_vocab);
    int32_t keep[2] = {0, 2};
    if (sd_session_commit(s, keep, 2, g_err, sizeof g_err) < 0) return -1;
    sd_batch one = {.n = 1, .tokens = tt + 3};
    if (sd_session_forward(s, &one, g_err, sizeof g_err) < 0) return -1;
    memcpy(out + (size_t)rows++ * n_vocab, sd_session_logits(s, 0), sizeof(float) * (size_t)n_vocab);
    return rows;
}

static float g_la[24 * 320], g_lb[24 * 320];

// No skipped layer: the same bits as a session that never heard of skipping,
// also after a mask was set and removed again.
static void test_no_skip_bit_identical(void) {
    sd_model *m = synth_model(4321, 4, NULL, "noskip");
    if (!m) SKIP("synthetic model: %.200s", g_err);
    sd_session *a = new_session(m, 128, 2), *b = new_session(m, 128, 2);
    CHECK(a && b, "sessions: %s", g_err);
    if (a && b) {
        int32_t prompt[12];
        make_prompt(prompt, 12, 7, 320);
        int ra = forward_rows(a, prompt, 12, g_la, 320);
        uint8_t zero[4] = {0, 0, 0, 0}, one[4] = {0, 1, 0, 0};
        CHECK(sd_session_set_layer_skip(b, zero, g_err, sizeof g_err) == 0 && sd_session_layer_skip(b) == NULL,
              "all-zero mask is no mask");
        CHECK(sd_session_set_layer_skip(b, one, g_err, sizeof g_err) == 1, "one layer: %s", g_err);
        CHECK(sd_session_layer_skip(b) != NULL && sd_session_layer_skip(b)[1] == 1, "mask copied");
        CHECK(sd_session_set_layer_skip(b, NULL, g_err, sizeof g_err) == 0, "cleared");
        int rb = forward_rows(b, prompt, 12, g_lb, 320);
        CHECK(ra > 0 && ra == rb, "rows %d %d: %s", ra, rb, g_err);
        CHECK(ra > 0 && memcmp(g_la, g_lb, sizeof(float) * (size_t)ra * 320) == 0, "logits differ after mask cleared");
        uint8_t all[4] = {1, 1, 1, 1};
        char err[256] = "";
        CHECK(sd_session_set_layer_skip(b, all, err, sizeof err) < 0 && strstr(err, "all 4"), "all skipped: %s", err);
    }
    sd_session_free(a);
    sd_session_free(b);
    sd_model_free(m);
}

// Skipping layers of model M gives, bit for bit, the logits of M with those
// layers' output projections zeroed (an exact identity layer), for chains,
// trees and commits.
static void test_skip_equals_identity_layers(void) {
    const uint8_t sets[3][4] = {{0, 1, 0, 0}, {1, 0, 0, 1}, {0, 1, 1, 0}};
    for (int k = 0; k < 3; k++) {
        char tag[16];
        snprintf(tag, sizeof tag, "z%d", k);
        sd_model *m = synth_model(4321, 4, NULL, "full"), *z = synth_model(4321, 4, sets[k], tag);
        if (!m || !z) {
            sd_model_free(m);
            sd_model_free(z);
            SKIP("synthetic model: %.200s", g_err);
        }
        sd_session *a = new_session(m, 128, 2), *b = new_session(z, 128, 2);
        CHECK(a && b, "sessions: %s", g_err);
        if (a && b) {
            CHECK(sd_session_set_layer_skip(a, sets[k], g_err, sizeof g_err) > 0, "%s", g_err);
            int32_t prompt[12];
            make_prompt(prompt, 12, 11 + (uint64_t)k, 320);
            int ra = forward_rows(a, prompt, 12, g_la, 320);
            int rb = forward_rows(b, prompt, 12, g_lb, 320);
            CHECK(ra > 0 && ra == rb, "rows %d %d: %s", ra, rb, g_err);
            double md = 0;
            for (int i = 0; i < ra * 320; i++) md = SD_MAX(md, fabs((double)g_la[i] - g_lb[i]));
            CHECK(ra > 0 && md == 0.0, "set %d: skipped vs zeroed-layer model differ by %g", k, md);
            // And the full model really differs (the layers matter).
            sd_session_set_layer_skip(a, NULL, NULL, 0);
            forward_rows(a, prompt, 12, g_lb, 320);
            CHECK(memcmp(g_la, g_lb, sizeof(float) * 320 * 12) != 0, "set %d: skipping changed nothing", k);
        }
        sd_session_free(a);
        sd_session_free(b);
        sd_model_free(m);
        sd_model_free(z);
    }
}

static void test_adapt_rule(void) {
    sd_draft_model_params p = sd_draft_skip_default_params();
    float x = 0.5f;
    x = sd_draft_adapt_p_min(x, 4, 2, &p);
    CHECK(fabsf(x - 0.55f) < 1e-6f, "rejection raises: %g", (double)x);
    x = sd_draft_adapt_p_min(x, 4, 4, &p);
    CHECK(fabsf(x - 0.53f) < 1e-6f, "full acceptance lowers: %g", (double)x);
    x = sd_draft_adapt_p_min(x, 0, 0, &p);
    CHECK(fabsf(x - 0.51f) < 1e-6f, "nothing proposed lowers: %g", (double)x);
    for (int i = 0; i < 100; i++) x = sd_draft_adapt_p_min(x, 3, 0, &p);
    CHECK(x == p.p_min_hi, "upper bound: %g", (double)x);
    for (int i = 0; i < 100; i++) x = sd_draft_adapt_p_min(x, 3, 3, &p);
    CHECK(x == p.p_min_lo, "lower bound: %g", (double)x);
}

// Plain greedy vs speculative with drafter d on session s.
static int compare_greedy(const sd_model *m, sd_session *s, sd_drafter *d, const int32_t *prompt, int np, int n_predict,
                          int max_nodes, sd_gen_stats *st, int *same) {
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_sampler *smp = sc_new_sampler(info.n_vocab, 0.0f, 1.0f, g_err, sizeof g_err);
    if (!smp) return -1;
    static collect_t a, b;
    sd_gen_stats gs;
    int rc = sc_run_plain(s, smp, prompt, np, n_predict, &a, &gs, g_err, sizeof g_err);
    int np_plain = sd_session_n_past(s);
    if (rc == 0) rc = sc_run_spec(s, smp, d, prompt, np, n_predict, max_nodes, &b, st, g_err, sizeof g_err);
    *same = rc == 0 && sc_same_tokens(&a, &b) &&
            sd_session_n_past(s) == np_plain && st->finish == gs.finish;
    sd_sampler_free(smp);
    return rc;
}

static void test_greedy_lossless_synth(void) {
    sd_model *m = synth_model(1234, 4, NULL, "tgt");
    if (!m) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = new_session(m, 512, 1);
    CHECK(s != NULL, "%s", g_err);
    const char *sets[] = {"1", "2,3", "0-2", "none"};
    for (int si = 0; s && si < 4; si++) {
        for (int mode = 0; mode < 3; mode++) {
            uint8_t skip[4];
            CHECK(sd_skip_parse(sets[si], 4, skip, g_err, sizeof g_err) >= 0, "%s", g_err);
            sd_draft_model_params dp = sd_draft_skip_default_params();
            dp.n_ctx = 512;
            dp.n_threads = 1;
            if (mode == 1) dp.adapt = 0, dp.p_min = 0.0f, dp.k = 4;   // fixed chain
            if (mode == 2) {                                          // width tree
                dp.shape = SD_DRAFT_WIDTHS;
                dp.n_widths = 3;
                dp.widths[0] = 2, dp.widths[1] = 2, dp.widths[2] = 1;
            }
            sd_drafter *d = NULL;
            CHECK(sd_draft_skip_new(&d, m, skip, &dp, g_err, sizeof g_err) == 0, "%s", g_err);
            if (!d) continue;
            int tok = 0, fwd = 0;
            for (int pr = 0; pr < 4; pr++) {
                int32_t prompt[40];
                int np = 4 + pr * 9;
                make_prompt(prompt, np, 100 + (uint64_t)pr, 320);
                sd_gen_stats st;
                int same = 0;
                CHECK(compare_greedy(m, s, d, prompt, np, 40, 16, &st, &same) == 0, "%s", g_err);
                CHECK(same, "skip {%s} mode %d prompt %d: speculative output differs from plain greedy", sets[si], mode,
                      pr);
                tok += st.n_generated;
                fwd += st.n_target_forwards;
                if (si == 3 && mode == 1)   // no layer skipped: the draft is the target, all accepted
                    CHECK(st.n_draft_accepted == st.n_draft_nodes, "self-draft rejected %d of %d",
                          st.n_draft_nodes - st.n_draft_accepted, st.n_draft_nodes);
            }
            printf("  skip {%-5s} %-11s %4d tokens in %4d target forwards (%.2f per forward)\n", sets[si],
                   mode == 0 ? "adaptive" : mode == 1 ? "chain k=4" : "widths", tok, fwd, fwd ? (double)tok / fwd : 0.0);
            sd_drafter_free(d);
        }
    }
    // Errors.
    uint8_t all[4] = {1, 1, 1, 1};
    sd_drafter *d = NULL;
    char err[256] = "";
    CHECK(sd_draft_skip_new(&d, m, all, NULL, err, sizeof err) < 0 && d == NULL && strstr(err, "all 4"), "all: %s", err);
    CHECK(sd_draft_skip_new(&d, m, NULL, NULL, err, sizeof err) < 0, "NULL set refused");
    sd_session_free(s);
    sd_model_free(m);
}

static void test_stochastic_smoke(void) {
    sd_model *m = synth_model(1234, 4, NULL, "sto");
    if (!m) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = new_session(m, 512, 1);
    uint8_t skip[4] = {0, 1, 0, 0};
    sd_draft_model_params dp = sd_draft_skip_default_params();
    dp.n_ctx = 512;
    dp.n_threads = 1;
    sd_drafter *d = NULL;
    sd_draft_skip_new(&d, m, skip, &dp, g_err, sizeof g_err);
    sd_sampler_params spp = sd_sampler_default_params();
    sd_sampler *smp = NULL;
    sd_sampler_new(&smp, &spp, 320, g_err, sizeof g_err);
    CHECK(s && d && smp, "setup: %s", g_err);
    if (s && d && smp) {
        int32_t prompt[10];
        make_prompt(prompt, 10, 5, 320);
        collect_t c = {.n = 0};
        sd_gen_params sp = sd_gen_default_params();
        sp.n_predict = 64;
        sp.n_batch = 64;
        sd_gen_stats st;
        CHECK(sd_generate(s, smp, d, prompt, 10, &sp, sc_collect_cb, &c, &st, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(c.n == 64 || st.finish != SD_FINISH_LENGTH, "tokens %d", c.n);
        printf("  sampled: %d tokens, %.2f per forward\n", c.n, st.mean_accepted);
    }
    sd_sampler_free(smp);
    sd_drafter_free(d);
    sd_session_free(s);
    sd_model_free(m);
}

static void progress_cb(void *user, const sd_skip_progress *pr) {
    int *n = user;
    (*n)++;
    (void)pr;
}

// Layers 2 and 4 of a 6-layer model are exact identities (zeroed output
// projections): skipping them costs no acceptance and saves time, so the
// search must skip both.
static void test_search_finds_identity_layers(void) {
    uint8_t zl[6] = {0, 0, 1, 0, 1, 0};
    sd_model *m = synth_model(2024, 6, zl, "search");
    if (!m) SKIP("synthetic model: %.200s", g_err);
    int32_t p0[12], p1[20], p2[7];
    make_prompt(p0, 12, 1, 320);
    make_prompt(p1, 20, 2, 320);
    make_prompt(p2, 7, 3, 320);
    const int32_t *prompts[3] = {p0, p1, p2};
    int np[3] = {12, 20, 7};
    sd_skip_search_params sp = sd_skip_search_default_params();
    sp.n_predict = 40;
    sp.n_threads = 1;
    sp.max_seconds = 60;
    int n_progress = 0;
    sp.progress = progress_cb;
    sp.user = &n_progress;
    uint8_t skip[6];
    sd_skip_search_result res;
    int n = sd_skip_search(m, prompts, np, 3, &sp, skip, &res, g_err, sizeof g_err);
    CHECK(n >= 2, "search: %d: %s", n, g_err);
    char list[64];
    sd_skip_format(skip, 6, list, sizeof list);
    printf("  found {%s}: est. speedup %.2f, %.2f tokens per forward, draft cost %.2f, node cost %.3f, %d evals, %.2f s\n",
           list, res.speedup, res.accept_len, res.draft_cost, res.verify_node_cost, res.n_eval, res.seconds);
    CHECK(n >= 2 && skip[2] && skip[4], "identity layers 2 and 4 not both skipped: {%s}", list);
    CHECK(n_progress >= res.n_eval, "progress calls %d, evals %d", n_progress, res.n_eval);
    // (Tiny models are not memory-bound: tree nodes cost almost as much as
    // tokens, so the estimated speedup may well be below 1 here.)
    CHECK(res.speedup > 0.0 && res.accept_len > 1.0, "speedup estimate %g, accept %g", res.speedup, res.accept_len);
    // The set found is lossless too.
    if (n > 0) {
        sd_session *s = new_session(m, 512, 1);
        sd_drafter *d = NULL;
        sd_draft_model_params dp = sd_draft_skip_default_params();
        dp.n_ctx = 512;
        dp.n_threads = 1;
        CHECK(s && sd_draft_skip_new(&d, m, skip, &dp, g_err, sizeof g_err) == 0, "%s", g_err);
        if (s && d) {
            sd_gen_stats st;
            int same = 0;
            CHECK(compare_greedy(m, s, d, p1, 20, 40, 16, &st, &same) == 0 && same, "lossless with the found set: %s",
                  g_err);
            printf("  found set in the loop: %.2f tokens per forward\n", st.mean_accepted);
        }
        sd_drafter_free(d);
        sd_session_free(s);
    }
    // The text front end (built-in calibration set; the synthetic vocabulary
    // has no chat template, so the texts are used plain) finds them too.
    uint8_t skip2[6];
    sp.progress = NULL;
    int n2 = sd_skip_search_texts(m, NULL, 0, 1, &sp, skip2, NULL, g_err, sizeof g_err);
    CHECK(n2 >= 2 && skip2[2] && skip2[4], "texts: %d: %s", n2, g_err);
    // Bad arguments.
    char err[256] = "";
    CHECK(sd_skip_search(m, prompts, np, 0, &sp, skip, NULL, err, sizeof err) < 0 && strstr(err, "prompt"), "%s", err);
    int bad_np[3] = {12, 0, 7};
    CHECK(sd_skip_search(m, prompts, bad_np, 3, &sp, skip, NULL, err, sizeof err) < 0 && strstr(err, "empty"), "%s", err);
    sd_model_free(m);
}

static void test_parse_format(void) {
    uint8_t s[10];
    char err[256], buf[64];
    CHECK(sd_skip_parse("1,3-5, 8", 10, s, err, sizeof err) == 5, "%s", err);
    sd_skip_format(s, 10, buf, sizeof buf);
    CHECK(!strcmp(buf, "1,3,4,5,8"), "format: %s", buf);
    CHECK(sd_skip_parse("none", 10, s, err, sizeof err) == 0, "none");
    CHECK(sd_skip_parse("", 10, s, err, sizeof err) == 0, "empty");
    sd_skip_format(s, 10, buf, sizeof buf);
    CHECK(!strcmp(buf, "none"), "format empty: %s", buf);
    CHECK(sd_skip_parse("2,2,2", 10, s, err, sizeof err) == 1, "duplicates counted once");
    const char *bad[] = {"1,", "a", "10", "3-1", "1-", "1;2", "-1", "0-9"};
    for (int i = 0; i < 8; i++) {
        err[0] = 0;
        CHECK(sd_skip_parse(bad[i], 10, s, err, sizeof err) < 0 && err[0], "'%s' accepted", bad[i]);
        printf("  '%s': %s\n", bad[i], err);
    }
    CHECK(sd_skip_format(s, 10, buf, 3) >= 3, "truncated length reported");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_save_load(void) {
    sd_model *m = synth_model(1234, 4, NULL, "file");
    if (!m) SKIP("synthetic model: %.200s", g_err);
    char path[256], err[256] = "";
    tmp_path(path, sizeof path, "skipfile.txt");
    uint8_t a[4] = {0, 1, 0, 1}, b[4] = {9, 9, 9, 9};
    CHECK(sd_skip_save(path, m, a, err, sizeof err) == 2, "save: %s", err);
    CHECK(sd_skip_load(path, m, b, err, sizeof err) == 2 && !memcmp(a, b, 4), "round trip: %s", err);
    uint8_t none[4] = {0, 0, 0, 0};
    CHECK(sd_skip_save(path, m, none, err, sizeof err) == 0 && sd_skip_load(path, m, b, err, sizeof err) == 0 &&
              !memcmp(none, b, 4), "empty set round trip: %s", err);
    struct {
        const char *text, *want;
    } cases[] = {
        {"", "empty file"},
        {"hello\n", "not a specdec skip file"},
        {"specdec-skip 1\nmodel synthetic\nn_layer 30\nskip 1,2\n", "30 layers, this model has 4"},
        {"specdec-skip 1\nmodel synthetic\nn_layer 4\nskip 1,7\n", "out of range"},
        {"specdec-skip 1\nmodel other\nn_layer 4\nskip 1\n", "for model 'other'"},
        {"specdec-skip 1\nn_layer 4\n", "no 'skip' line"},
        {"specdec-skip 1\nskip 1\nn_layer 4\n", "before 'n_layer'"},
        {"specdec-skip 1\nn_layer x\nskip 1\n", "bad n_layer"},
        {"specdec-skip 1\nlayers 1\n", "unknown line"},
        {"specdec-skip 1\nn_layer 4\nskip 0-3\n", "all 4 layers"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_text(path, cases[i].text);
        err[0] = 0;
        int rc = sd_skip_load(path, m, b, err, sizeof err);
        CHECK(rc < 0 && strstr(err, cases[i].want) && strstr(err, path), "case %d: rc %d, message '%s'", (int)i, rc, err);
        printf("  %s\n", err + strlen(path));
    }
    // Comments and a missing model name are fine.
    write_text(path, "# made by hand\nspecdec-skip 1\nmodel\nn_layer 4\nskip 2\n");
    CHECK(sd_skip_load(path, m, b, err, sizeof err) == 1 && b[2] == 1, "hand-written: %s", err);
    remove(path);
    CHECK(sd_skip_load(path, m, b, err, sizeof err) < 0 && strstr(err, "cannot open"), "missing: %s", err);
    CHECK(sd_skip_save("/nonexistent-dir/x", m, a, err, sizeof err) < 0 && strstr(err, "cannot write"), "%s", err);
    sd_model_free(m);
}

static void test_default_model(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = load_path(DEFAULT_MODEL);
    if (!m) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    sd_session *s = new_session(m, 256, 2);
    CHECK(s != NULL, "session: %s", g_err);
    // "18": what sd_skip_search picked on this model; the other: a plausible
    // larger set of middle/late layers.
    const char *sets[] = {"18", "8,10,12,14,16,18,20,22"};
    const char *texts[] = {"The capital of France is", "Once upon a time, a little robot",
                           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"};
    for (int k = 0; s && k < 2; k++) {
        uint8_t skip[64];
        int n = sd_skip_parse(sets[k], m->hp.n_layer, skip, g_err, sizeof g_err);
        sd_draft_model_params dp = sd_draft_skip_default_params();
        dp.n_ctx = 256;
        dp.pool = sd_session_pool(s);
        sd_drafter *d = NULL;
        CHECK(n > 0 && sd_draft_skip_new(&d, m, skip, &dp, g_err, sizeof g_err) == 0, "setup: %s", g_err);
        for (int i = 0; d && i < 3; i++) {
            int32_t prompt[64];
            int np = sd_tokenize(sd_model_tokenizer(m), texts[i], strlen(texts[i]), 1, 0, prompt, 64);
            sd_gen_stats st;
            int same = 0;
            CHECK(compare_greedy(m, s, d, prompt, np, 32, 12, &st, &same) == 0, "%s", g_err);
            CHECK(same, "skip {%s} prompt %d: speculative output differs from plain greedy", sets[k], i);
            printf("  SmolLM2 skip {%s}: %d tokens, %.2f per forward, accepted %d of %d drafts\n", sets[k],
                   st.n_generated, st.mean_accepted, st.n_draft_accepted, st.n_draft_nodes);
        }
        sd_drafter_free(d);
    }
    sd_session_free(s);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_no_skip_bit_identical);
    T_RUN(test_skip_equals_identity_layers);
    T_RUN(test_adapt_rule);
    T_RUN(test_parse_format);
    T_RUN(test_save_load);
    T_RUN(test_greedy_lossless_synth);
    T_RUN(test_stochastic_smoke);
    T_RUN(test_search_finds_identity_layers);
    T_RUN(test_default_model);
    T_EXIT();
}
