// step.c - speculative generation step by step through the public API only.
//
//   build/examples/step MODEL.gguf [METHOD] [PROMPT]
//
// Loads a model, builds a drafter from a method string (default
// "ngram:3-8", prompt lookup: no draft model needed), and generates greedily,
// printing what every step emitted: the accepted draft tokens in [brackets],
// then the target's own token.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specdec.h"
#include "specdec_spec.h"

static void print_token(const sd_tokenizer *tok, int32_t t) {
    char piece[256];
    int n = sd_token_to_piece(tok, t, 0, piece, sizeof piece);
    if (n > (int)sizeof piece) n = (int)sizeof piece;
    if (n > 0) fwrite(piece, 1, (size_t)n, stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [METHOD] [PROMPT]\n", argv[0]);
        return 1;
    }
    const char *method = argc > 2 ? argv[2] : "ngram:3-8";
    const char *prompt = argc > 3 ? argv[3] : "The cat sat on the mat. The cat sat on the";
    char err[512];
    sd_model *m = NULL;
    sd_session *s = NULL;
    sd_sampler *smp = NULL;
    sd_drafter *d = NULL;
    sd_gen *g = NULL;
    int32_t ids[512];
    int rc = 1;

    if (sd_model_load(&m, argv[1], err, sizeof err) < 0) goto fail;
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 1024;
    if (sd_session_new(&s, m, &sp, err, sizeof err) < 0) goto fail;
    sd_sampler_params smp_p = sd_sampler_default_params();
    smp_p.temp = 0.0f;   // greedy: the text equals plain decoding's
    if (sd_sampler_new(&smp, &smp_p, sd_tokenizer_n_vocab(tok), err, sizeof err) < 0) goto fail;

    sd_method meth;
    sd_method_env env = sd_method_env_default(m);
    if (sd_method_parse(method, &meth, err, sizeof err) < 0) goto fail;
    if (sd_method_make(&meth, &env, &d, err, sizeof err) < 0) goto fail;

    int n = sd_tokenize(tok, prompt, strlen(prompt), 1, 0, ids, 512);
    if (n < 1 || n > 512) {
        snprintf(err, sizeof err, "cannot tokenize the prompt");
        goto fail;
    }
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = 48;
    if (sd_gen_new(&g, s, smp, d, &gp, err, sizeof err) < 0) goto fail;
    if (sd_gen_prefill(g, ids, n, err, sizeof err) < 0) goto fail;

    printf("%s", prompt);
    sd_step st;
    int n_steps = 0;
    do {
        if (sd_gen_step(g, &st, err, sizeof err) < 0) goto fail;
        n_steps++;
        if (st.n_accepted > 0) printf("[");
        for (int k = 0; k < st.n_tokens; k++) {
            if (k == st.n_accepted && st.n_accepted > 0) printf("]");
            print_token(tok, st.tokens[k]);
        }
        if (st.n_accepted > 0 && st.n_tokens <= st.n_accepted) printf("]");   // ended inside the path
    } while (st.finish == SD_FINISH_NONE);
    const sd_gen_stats *gs = sd_gen_get_stats(g);
    printf("\n%d tokens in %d steps (%d target forwards, %.2f tokens per forward), method %s, finish %s\n",
           gs->n_generated, n_steps, gs->n_target_forwards, gs->mean_accepted, method, sd_finish_name(gs->finish));
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "step: %s\n", err);
out:
    sd_gen_free(g);
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
    return rc;
}
