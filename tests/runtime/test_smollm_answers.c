// test_smollm_answers.c - end to end on the default model through the library:
// chat template, tokenizer, forward pass, greedy sampling and the generate
// loop must together answer a factual question.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "specdec_spec.h"
#include "specdec.h"
#include "t.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct {
    const sd_tokenizer *tok;
    char text[8192];
    size_t len;
} collect;

static int collect_cb(int32_t t, void *user) {
    collect *c = user;
    char buf[256];
    int n = sd_token_to_piece(c->tok, t, 0, buf, sizeof buf);
    if (n > 0 && n <= (int)sizeof buf && c->len + (size_t)n < sizeof c->text) {
        memcpy(c->text + c->len, buf, (size_t)n);
        c->len += (size_t)n;
        c->text[c->len] = 0;
    }
    return 0;
}

// Greedy chat answer to question (at most n tokens) into c; 0 on success.
static int chat_greedy_ex(sd_model *m, const char *question, int n, int fast_prompt, collect *c, sd_gen_stats *st) {
    char err[512] = "", prompt[4096];
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    int rc = sd_chat_format(tok, NULL, question, prompt, sizeof prompt, err, sizeof err);
    CHECK(rc > 0, "chat format: %s", err);
    if (rc <= 0) return -1;
    int32_t ids[1024];
    int n_ids = sd_tokenize(tok, prompt, strlen(prompt), 1, 1, ids, 1024);
    CHECK(n_ids > 0 && n_ids <= 1024, "tokenize: %d", n_ids);
    if (n_ids <= 0 || n_ids > 1024) return -1;
    sd_session *s = NULL;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 512;
    rc = sd_session_new(&s, m, &sp, err, sizeof err);
    CHECK(rc == 0, "session: %s", err);
    if (rc) return -1;
    sd_sampler_params pp = sd_sampler_default_params();
    pp.temp = 0.0f;
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_sampler *smp = NULL;
    rc = sd_sampler_new(&smp, &pp, info.n_vocab, err, sizeof err);
    CHECK(rc == 0, "sampler: %s", err);
    if (rc == 0) {
        memset(c, 0, sizeof *c);
        c->tok = tok;
        sd_gen_params gp = sd_gen_default_params();
        gp.n_predict = n;
        gp.fast_prompt = fast_prompt;
        rc = sd_generate(s, smp, NULL, ids, n_ids, &gp, collect_cb, c, st, err, sizeof err);
        CHECK(rc == 0, "generate: %s", err);
    }
    sd_sampler_free(smp);
    sd_session_free(s);
    return rc;
}

// The library's defaults (float activations for the prompt).
static int chat_greedy(sd_model *m, const char *question, int n, collect *c, sd_gen_stats *st) {
    return chat_greedy_ex(m, question, n, 0, c, st);
}

static void test_capital_of_france(void) {
    struct stat st;
    if (stat(MODEL, &st) != 0) SKIP("%s is absent (run scripts/fetch-models.sh)", MODEL);
    sd_model *m = NULL;
    char err[512] = "";
    int rc = sd_model_load(&m, MODEL, err, sizeof err);
    CHECK(rc == 0, "load: %s", err);
    if (rc) return;
    collect c;
    sd_gen_stats gs;
    // The question exactly as the issue asks it. Its first answer token is a
    // near-tie ("The" beats "L" by 0.08 in exact float arithmetic), and 8-bit
    // activations (before every quantized matmul) move logits by 0.15-0.2:
    // with the prompt evaluated in 8 bits too (--fast-prompt) the model starts
    // "L'Etoile ...". The default evaluates the prompt with float activations
    // (sd_batch.precise), which decides the first token as exact arithmetic
    // does; see docs/numerics.md.
    if (chat_greedy(m, "What is the capital of France?", 24, &c, &gs) == 0) {
        CHECK(strstr(c.text, "Paris") != NULL, "answer without 'Paris': '%s'", c.text);
        CHECK(gs.n_generated >= 1 && gs.n_generated <= 24, "n_generated %d", gs.n_generated);
        CHECK(gs.tokens_per_second > 0, "tokens_per_second %f", gs.tokens_per_second);
        printf("  answer: %s\n", c.text);
    }
    // A question whose answer has no near-tie (smallest top-two gap along the
    // greedy answer 0.46-0.66) gives Paris with the fast prompt path as well.
    if (chat_greedy_ex(m, "What is the capital of France? Answer in one word.", 24, 1, &c, &gs) == 0) {
        CHECK(strstr(c.text, "Paris") != NULL, "fast prompt: answer without 'Paris': '%s'", c.text);
        printf("  answer (fast prompt, one-word question): %s\n", c.text);
    }
    sd_model_free(m);
}

// The loop stops on the end-of-turn token and at n_predict.
static void test_stops(void) {
    struct stat st;
    if (stat(MODEL, &st) != 0) SKIP("%s is absent (run scripts/fetch-models.sh)", MODEL);
    sd_model *m = NULL;
    char err[512] = "";
    int rc = sd_model_load(&m, MODEL, err, sizeof err);
    CHECK(rc == 0, "load: %s", err);
    if (rc) return;
    collect c;
    sd_gen_stats gs;
    if (chat_greedy(m, "Say hello.", 3, &c, &gs) == 0)
        CHECK(gs.n_generated == 3 && gs.finish == SD_FINISH_LENGTH, "n_predict 3: %d tokens, finish %s",
              gs.n_generated, sd_finish_name(gs.finish));
    if (chat_greedy(m, "Say hello.", 200, &c, &gs) == 0)
        CHECK(gs.finish == SD_FINISH_EOG && gs.n_generated < 200, "no end of turn within 200 tokens: finish %s: '%s'",
              sd_finish_name(gs.finish), c.text);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_capital_of_france);
    T_RUN(test_stops);
    T_EXIT();
}
