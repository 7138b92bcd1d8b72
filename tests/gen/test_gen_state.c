// test_gen_state.c - a generation suspended and resumed (sd_gen_state_*):
// saved mid-prompt, right after the prompt (the first token pending) and
// mid-generation, then loaded into a fresh generation on another session
// (another context size and thread count, a fresh drafter), it continues
// with exactly the tokens the original produces -- greedy with prompt
// lookup and with a draft model, and sampled with the race draw; bad states
// are refused with their code.
#include <stdint.h>

#include "lib/spec_check.h"
#include "lib/synth.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

static char g_err[512];
static sd_model *g_m, *g_draft;
static int g_nv;

static sd_drafter *make_drafter(const char *method) {
    if (!method) return NULL;
    sd_method m;
    sd_method_env env = sd_method_env_default(g_m);
    const sd_model *drafts[1] = {g_draft};
    env.drafts = drafts;
    env.n_drafts = 1;
    sd_drafter *d = NULL;
    if (sd_method_parse(method, &m, g_err, sizeof g_err) < 0 || sd_method_make(&m, &env, &d, g_err, sizeof g_err) < 0)
        return NULL;
    return d;
}

// Steps g until it ends, appending the tokens to out.
static int run_to_end(sd_gen *g, sc_tokens *out) {
    sd_step st;
    do {
        if (sd_gen_step(g, &st, g_err, sizeof g_err) < 0) return -1;
        for (int i = 0; i < st.n_tokens && out->n < SC_MAXTOK; i++) out->tok[out->n++] = st.tokens[i];
    } while (st.finish == SD_FINISH_NONE);
    return 0;
}

// One case: the original runs `steps` steps (after giving its prompt with
// set_prompt and a chunk limit of 7, so that the prompt takes several
// steps), is saved, and runs to the end; a fresh generation loaded with the
// state runs to the end; both tails must be equal.
static void one_case(const char *method, float temp, int steps, const char *what) {
    int32_t prompt[30];
    for (int i = 0; i < 30; i++) prompt[i] = 3 + (i % 11) * 17 % (g_nv - 3);   // repeats: lookup has work
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = 40;
    gp.max_nodes = 8;
    sd_session *s1 = sc_new_session(g_m, 128, 1, g_err, sizeof g_err), *s2 = sc_new_session(g_m, 256, 2, g_err, sizeof g_err);
    sd_sampler *p1 = sc_new_sampler(g_nv, temp, 1.0f, g_err, sizeof g_err), *p2 = sc_new_sampler(g_nv, temp, 1.0f, g_err, sizeof g_err);
    sd_drafter *d1 = make_drafter(method), *d2 = make_drafter(method);
    sd_gen *g1 = NULL, *g2 = NULL;
    CHECK(s1 && s2 && p1 && p2 && (!method || (d1 && d2)), "%s: setup: %s", what, g_err);
    if (!s1 || !s2 || !p1 || !p2 || (method && (!d1 || !d2))) goto out;
    CHECK(sd_gen_new(&g1, s1, p1, d1, &gp, g_err, sizeof g_err) == 0 && sd_gen_new(&g2, s2, p2, d2, &gp, g_err, sizeof g_err) == 0,
          "%s: %s", what, g_err);
    if (!g1 || !g2) goto out;
    CHECK(sd_gen_set_prompt(g1, prompt, 30, 0, g_err, sizeof g_err) == 0, "%s: %s", what, g_err);
    sd_gen_set_step_limit(g1, 7);
    static sc_tokens a, b;
    a.n = b.n = 0;
    sd_step st;
    for (int k = 0; k < steps; k++) {
        CHECK(sd_gen_step(g1, &st, g_err, sizeof g_err) == 0, "%s: %s", what, g_err);
        if (k == 4) sd_gen_set_step_limit(g1, 0);   // the prompt's 30 tokens: steps 0..4 (7 + 7 + 7 + 7 + 2)
    }
    if (steps < 5) sd_gen_set_step_limit(g1, 0);
    size_t n = sd_gen_state_size(g1);
    void *buf = malloc(n);
    int w = sd_gen_state_save(g1, buf, n, g_err, sizeof g_err);
    CHECK(w == (int)n, "%s: saved %d of %zu bytes: %s", what, w, n, g_err);
    CHECK(run_to_end(g1, &a) == 0, "%s: %s", what, g_err);
    CHECK(sd_gen_state_load(g2, buf, n, g_err, sizeof g_err) == 0, "%s: load: %s", what, g_err);
    CHECK(run_to_end(g2, &b) == 0, "%s: %s", what, g_err);
    CHECK(a.n > 0 && sc_same_tokens(&a, &b), "%s: the resumed generation differs (%d tokens against %d)", what, b.n, a.n);
    CHECK(sd_gen_get_stats(g1)->n_generated == sd_gen_get_stats(g2)->n_generated, "%s: %d generated against %d", what,
          sd_gen_get_stats(g2)->n_generated, sd_gen_get_stats(g1)->n_generated);
    printf("  %-34s saved after %d steps (%zu bytes), %d tokens after it, equal\n", what, steps, n, a.n);
    // Loading twice, or into a generation that has its prompt, is refused.
    CHECK(sd_gen_state_load(g2, buf, n, g_err, sizeof g_err) == SD_ERR_INPUT && strstr(g_err, "fresh"), "%s: reload: %s",
          what, g_err);
    free(buf);
out:
    sd_gen_free(g1);
    sd_gen_free(g2);
    sd_drafter_free(d1);
    sd_drafter_free(d2);
    sd_sampler_free(p1);
    sd_sampler_free(p2);
    sd_session_free(s1);
    sd_session_free(s2);
}

static void test_resume_exactly(void) {
    one_case(NULL, 0.0f, 3, "plain, mid-prompt");
    one_case(NULL, 0.0f, 5, "plain, first token pending");
    one_case("ngram:3-8", 0.0f, 9, "ngram:3-8, mid-generation");
    one_case("chain:3", 0.0f, 12, "draft model chain:3, greedy");
    one_case("chain:3", 0.8f, 12, "draft model chain:3, race sampling");
    one_case("ngram:3-8", 0.8f, 6, "ngram:3-8, race sampling");
}

// The shipped EAGLE-3 head on the default model: the drafter restarts cold
// after a load (its own cache is not in the state) and the text stays the same.
static void test_resume_with_head(void) {
    const char *mp = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *hp = "heads/SmolLM2-135M-Instruct.eagle3.gguf";
    FILE *f1 = fopen(mp, "rb"), *f2 = fopen(hp, "rb");
    if (f1) fclose(f1);
    if (f2) fclose(f2);
    if (!f1 || !f2) SKIP("%s or %s is absent (scripts/fetch-models.sh)", mp, hp);
    sd_model *m = NULL;
    sd_head *h = NULL;
    CHECK(sd_model_load(&m, mp, g_err, sizeof g_err) == 0 && sd_head_load(&h, hp, m, g_err, sizeof g_err) == 0, "%s",
          g_err);
    if (!m || !h) goto out0;
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_method meth;
    sd_method_env env = sd_method_env_default(m);
    env.head_eagle3 = h;
    sd_drafter *d1 = NULL, *d2 = NULL;
    CHECK(sd_method_parse("eagle3:chain:3", &meth, g_err, sizeof g_err) == 0 &&
              sd_method_make(&meth, &env, &d1, g_err, sizeof g_err) == 0 &&
              sd_method_make(&meth, &env, &d2, g_err, sizeof g_err) == 0,
          "%s", g_err);
    sd_session *s1 = sc_new_session(m, 256, 2, g_err, sizeof g_err), *s2 = sc_new_session(m, 256, 2, g_err, sizeof g_err);
    sd_sampler *p1 = sc_new_sampler(info.n_vocab, 0.0f, 1.0f, g_err, sizeof g_err),
               *p2 = sc_new_sampler(info.n_vocab, 0.0f, 1.0f, g_err, sizeof g_err);
    sd_gen *g1 = NULL, *g2 = NULL;
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = 48;
    gp.max_nodes = 8;
    const char *text = "The cat sat on the mat. The cat sat on the";
    int32_t ids[64];
    int n = sd_tokenize(sd_model_tokenizer(m), text, strlen(text), 1, 0, ids, 64);
    CHECK(d1 && d2 && s1 && s2 && p1 && p2 && n > 4 && sd_gen_new(&g1, s1, p1, d1, &gp, g_err, sizeof g_err) == 0 &&
              sd_gen_new(&g2, s2, p2, d2, &gp, g_err, sizeof g_err) == 0 && sd_gen_prefill(g1, ids, n, g_err, sizeof g_err) == 0,
          "%s", g_err);
    if (g1 && g2) {
        sd_step st;
        for (int k = 0; k < 6; k++) sd_gen_step(g1, &st, g_err, sizeof g_err);
        size_t sz = sd_gen_state_size(g1);
        void *buf = malloc(sz);
        static sc_tokens a, b;
        a.n = b.n = 0;
        CHECK(sd_gen_state_save(g1, buf, sz, g_err, sizeof g_err) == (int)sz, "%s", g_err);
        CHECK(run_to_end(g1, &a) == 0 && sd_gen_state_load(g2, buf, sz, g_err, sizeof g_err) == 0 && run_to_end(g2, &b) == 0,
              "%s", g_err);
        CHECK(a.n > 0 && sc_same_tokens(&a, &b), "with the head: the resumed text differs (%d against %d tokens)", b.n, a.n);
        printf("  eagle3:chain:3 on SmolLM2: %d tokens after the save, equal; accepted %d (original), %d (resumed)\n", a.n,
               sd_gen_get_stats(g1)->n_draft_accepted, sd_gen_get_stats(g2)->n_draft_accepted);
        free(buf);
    }
    sd_gen_free(g1);
    sd_gen_free(g2);
    sd_drafter_free(d1);
    sd_drafter_free(d2);
    sd_sampler_free(p1);
    sd_sampler_free(p2);
    sd_session_free(s1);
    sd_session_free(s2);
out0:
    sd_head_free(h);
    sd_model_free(m);
}

static void test_bad_states(void) {
    sd_session *s = sc_new_session(g_m, 128, 1, g_err, sizeof g_err), *small = sc_new_session(g_m, 16, 1, g_err, sizeof g_err);
    sd_sampler *p = sc_new_sampler(g_nv, 0.0f, 1.0f, g_err, sizeof g_err);
    sd_gen *g = NULL, *h = NULL, *tiny = NULL;
    CHECK(s && small && p && sd_gen_new(&g, s, p, NULL, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!g) goto out;
    char buf0[8];
    CHECK(sd_gen_state_save(g, buf0, sizeof buf0, g_err, sizeof g_err) == SD_ERR_INPUT && strstr(g_err, "no prompt"),
          "no prompt: %s", g_err);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 5 + i;
    CHECK(sd_gen_prefill(g, prompt, 20, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_step st;
    for (int k = 0; k < 4; k++) sd_gen_step(g, &st, g_err, sizeof g_err);
    size_t n = sd_gen_state_size(g);
    uint8_t *buf = malloc(n), *bad = malloc(n);
    CHECK(sd_gen_state_save(g, buf, n - 1, g_err, sizeof g_err) == SD_ERR_INPUT && strstr(g_err, "needs"), "small: %s", g_err);
    CHECK(sd_gen_state_save(g, buf, n, g_err, sizeof g_err) == (int)n, "%s", g_err);
    const size_t sess = sd_session_state_size(s);   // the session's state closes the bytes
    sd_session_truncate(s, 0, NULL, 0);
    struct {
        const char *what;
        size_t off, size;
        int want;
        const char *msg;
    } cases[] = {
        {"magic", 0, n, SD_ERR_INPUT, "magic"},
        {"version", 4, n, SD_ERR_INPUT, "version"},
        {"truncated", (size_t)-1, n - 8, SD_ERR_INPUT, "truncated"},
        {"header", (size_t)-1, 16, SD_ERR_INPUT, "too short"},
        {"token", 64, n, SD_ERR_INPUT, "out of range"},
        {"session's magic", n - sess, n, SD_ERR_INPUT, "session state"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(bad, buf, n);
        if (cases[i].off != (size_t)-1) bad[cases[i].off] ^= 0x7f;
        if (cases[i].off == 64) memset(bad + 64, 0x7f, 4);
        sd_gen *f = NULL;
        CHECK(sd_gen_new(&f, s, p, NULL, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
        g_err[0] = 0;
        int rc = sd_gen_state_load(f, bad, cases[i].size, g_err, sizeof g_err);
        CHECK(rc == cases[i].want && strstr(g_err, cases[i].msg),
              "%s: rc %d, '%s'", cases[i].what, rc, g_err);
        sd_gen_free(f);
    }
    // the text does not fit a 16-token context
    CHECK(sd_gen_new(&tiny, small, p, NULL, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(tiny && sd_gen_state_load(tiny, buf, n, g_err, sizeof g_err) == SD_ERR_NO_ROOM, "no room: '%s'", g_err);
    // and the intact state still loads after all that
    CHECK(sd_gen_new(&h, s, p, NULL, NULL, g_err, sizeof g_err) == 0 && sd_gen_state_load(h, buf, n, g_err, sizeof g_err) == 0,
          "intact: %s", g_err);
    free(buf);
    free(bad);
out:
    sd_gen_free(g);
    sd_gen_free(h);
    sd_gen_free(tiny);
    sd_sampler_free(p);
    sd_session_free(s);
    sd_session_free(small);
}

int main(void) {
    synth_params sp = synth_default_params();
    sp.wtype = 8;
    g_m = sc_synth_model(&sp, "test_gen_state", "t", g_err, sizeof g_err);
    sp.seed = 99;   // a draft that agrees with the target only sometimes
    sp.n_layer = 1;
    g_draft = sc_synth_model(&sp, "test_gen_state", "d", g_err, sizeof g_err);
    if (!g_m || !g_draft) {
        printf("FAIL setup: %s\n", g_err);
        return 1;
    }
    sd_model_info info;
    sd_model_get_info(g_m, &info);
    g_nv = info.n_vocab;
    T_RUN(test_resume_exactly);
    T_RUN(test_resume_with_head);
    T_RUN(test_bad_states);
    sd_model_free(g_m);
    sd_model_free(g_draft);
    T_EXIT();
}
