// test_drafter_callbacks.c - a drafter defined by the program through
// callbacks (sd_drafter_from_callbacks): whatever it proposes -- random
// tokens, wide trees, nothing, the exact future -- greedy output equals plain
// decoding's; an oracle's drafts are all accepted and step() hears them; the
// hidden rows asked for arrive with each step and with the prompt; bad
// callbacks are refused with SD_ERR_INPUT.
#include <math.h>
#include <stdint.h>

#include "lib/spec_check.h"
#include "lib/synth.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

static char g_err[512];

typedef struct fake {
    int mode;                 // 0 random chains, 1 wide random trees, 2 nothing, 3 the oracle (future tokens)
    uint64_t rng;
    const sc_tokens *future;  // mode 3: plain decoding's tokens
    int n_prompt;
    int steps, accepted, rows, prompt_rows, bad_rows, resets, freed;
    int n_embd, n_vocab;
} fake;

static uint32_t rnd(fake *f) {
    f->rng = f->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(f->rng >> 33);
}

static int propose(void *user, const sd_draft_request *req, sd_tree *tree, char *err, size_t errlen) {
    (void)err, (void)errlen;
    fake *f = user;
    if (f->mode == 2) return 0;
    if (f->mode == 3) {   // the exact continuation, as far as the room allows
        int parent = 0;
        for (int k = req->n_tokens - f->n_prompt; k < f->future->n && parent >= 0; k++)
            parent = sd_tree_add(tree, parent, f->future->tok[k], 1.0f);
        return 0;
    }
    for (int i = 1; i < req->max_nodes; i++) {
        int parent = f->mode == 0 ? i - 1 : (int)(rnd(f) % (uint32_t)sd_tree_size(tree));
        if (sd_tree_add(tree, parent, (int32_t)(rnd(f) % (uint32_t)f->n_vocab), 0.5f) < 0) return 0;
    }
    return 0;
}

static int step(void *user, const sd_draft_result *res, char *err, size_t errlen) {
    fake *f = user;
    f->steps++;
    f->accepted += res->n_accepted;
    if (res->hidden) {
        f->rows += 1 + res->n_accepted;
        for (int i = 0; i < (1 + res->n_accepted) * f->n_embd; i++) f->bad_rows += !isfinite(res->hidden[i]);
    }
    if (res->bonus < 0) return snprintf(err, errlen, "bonus %d", res->bonus), -1;
    return 0;
}

static int prompt_rows(void *user, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                       size_t errlen) {
    (void)tokens, (void)pos0, (void)err, (void)errlen;
    fake *f = user;
    f->prompt_rows += n;
    for (int i = 0; i < n * f->n_embd; i++) f->bad_rows += !isfinite(hidden[i]);
    return 0;
}

static void reset(void *user) { ((fake *)user)->resets++; }
static void release(void *user) { ((fake *)user)->freed++; }

static void test_lossless_whatever_proposed(void) {
    synth_params p = synth_default_params();
    p.wtype = 8;
    sd_model *m = sc_synth_model(&p, "test_drafter_callbacks", "a", g_err, sizeof g_err);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_session *s = sc_new_session(m, 256, 1, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(info.n_vocab, 0.0f, 1.0f, g_err, sizeof g_err);
    CHECK(s && smp, "%s", g_err);
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = 3 + (i * 29) % (info.n_vocab - 3);
    static sc_tokens plain, got;
    CHECK(sc_run_plain(s, smp, prompt, 12, 40, &plain, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    const char *names[] = {"random chains", "random trees", "nothing", "oracle"};
    for (int mode = 0; mode < 4; mode++) {
        fake f = {.mode = mode, .rng = 7 + (uint64_t)mode, .future = &plain, .n_prompt = 12, .n_embd = info.n_embd,
                  .n_vocab = info.n_vocab};
        sd_drafter_callbacks cb = {.name = "fake", .user = &f, .propose = propose, .step = step,
                                   .prompt = prompt_rows, .reset = reset, .free = release};
        if (mode == 1) cb.n_hidden_layers = 1, cb.hidden_layers[0] = SD_HIDDEN_NORM;
        sd_drafter *d = NULL;
        CHECK(sd_drafter_from_callbacks(&d, &cb, g_err, sizeof g_err) == 0, "%s", g_err);
        if (!d) continue;
        CHECK(!strcmp(sd_drafter_name(d), "fake"), "name '%s'", sd_drafter_name(d));
        sd_gen_stats st;
        CHECK(sc_run_spec(s, smp, d, prompt, 12, 40, 8, &got, &st, g_err, sizeof g_err) == 0, "%s: %s", names[mode],
              g_err);
        CHECK(sc_same_tokens(&plain, &got), "%s: the text differs from plain decoding's", names[mode]);
        CHECK(f.steps > 0 && f.accepted == st.n_draft_accepted, "%s: %d steps heard, %d accepted (stats %d)",
              names[mode], f.steps, f.accepted, st.n_draft_accepted);
        if (mode == 3)
            CHECK(st.n_target_forwards <= 40 / 7 + 2, "oracle: %d forwards for 40 tokens", st.n_target_forwards);
        if (mode == 1)
            CHECK(f.rows >= f.steps && f.prompt_rows == 12 && f.bad_rows == 0,
                  "hidden rows: %d over %d steps, %d prompt rows, %d not finite", f.rows, f.steps, f.prompt_rows,
                  f.bad_rows);
        else
            CHECK(f.rows == 0 && f.prompt_rows == 0, "rows given unasked");
        sd_drafter_reset(d);
        CHECK(f.resets >= 1, "reset not forwarded");
        sd_drafter_free(d);
        CHECK(f.freed == 1, "free called %d times", f.freed);
    }
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
}

static void test_bad_callbacks(void) {
    sd_drafter *d = NULL;
    sd_drafter_callbacks cb = {0};
    CHECK(sd_drafter_from_callbacks(&d, &cb, g_err, sizeof g_err) == SD_ERR_INPUT && !d && strstr(g_err, "propose"),
          "no propose: %s", g_err);
    cb.propose = propose;
    cb.n_hidden_layers = SD_MAX_HIDDEN_LAYERS + 1;
    CHECK(sd_drafter_from_callbacks(&d, &cb, g_err, sizeof g_err) == SD_ERR_INPUT && !d && strstr(g_err, "out of range"),
          "too many layers: %s", g_err);
}

int main(void) {
    T_RUN(test_lossless_whatever_proposed);
    T_RUN(test_bad_callbacks);
    T_EXIT();
}
