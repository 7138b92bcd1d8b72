// batch.c - several generations stepped together, one target forward per
// step for all of them (sd_batcher_forward), through the public API only.
//
//   build/examples/batch MODEL.gguf METHOD PROMPT...
//
// METHOD is a method string ("ar": plain decoding; "ngram:3-8": prompt
// lookup, no draft model needed). Every prompt gets its own session, sampler
// (greedy) and drafter on one shared pool; each step drafts for every
// generation still running, evaluates all their trees in one pass, then
// verifies each. Prints each generation's text after a line "--- i", then a
// summary. Each text equals what that prompt generates alone.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specdec.h"
#include "specdec_spec.h"

#define MAX_GEN 8
#define N_PREDICT 32

int main(int argc, char **argv) {
    if (argc < 4 || argc - 3 > MAX_GEN) {
        fprintf(stderr, "usage: %s MODEL.gguf METHOD PROMPT... (1..%d prompts)\n", argv[0], MAX_GEN);
        return 1;
    }
    const int n_gen = argc - 3;
    char err[512];
    sd_model *m = NULL;
    sd_threadpool *pool = NULL;
    sd_batcher *bat = NULL;
    sd_session *s[MAX_GEN] = {0};
    sd_sampler *smp[MAX_GEN] = {0};
    sd_drafter *d[MAX_GEN] = {0};
    sd_gen *g[MAX_GEN] = {0};
    int32_t ids[512];
    int rc = 1, passes = 0, n_tokens = 0;
    sd_method meth;
    if (sd_model_load(&m, argv[1], err, sizeof err) < 0 || sd_method_parse(argv[2], &meth, err, sizeof err) < 0 ||
        sd_threadpool_new(&pool, 0, err, sizeof err) < 0 ||
        sd_batcher_new(&bat, m, pool, n_gen * 16, err, sizeof err) < 0)
        goto fail;
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 1024;
    sp.pool = pool; // one pool for all: the batcher's pass runs on it
    sd_sampler_params smp_p = sd_sampler_default_params();
    smp_p.temp = 0.0f;
    sd_method_env env = sd_method_env_default(m);
    env.pool = pool;
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = N_PREDICT;
    for (int i = 0; i < n_gen; i++) {
        const int n = sd_tokenize(tok, argv[3 + i], strlen(argv[3 + i]), 1, 0, ids, 512);
        if (n < 1 || n > 512) {
            snprintf(err, sizeof err, "cannot tokenize prompt %d", i);
            goto fail;
        }
        if (sd_session_new(&s[i], m, &sp, err, sizeof err) < 0 ||
            sd_sampler_new(&smp[i], &smp_p, sd_tokenizer_n_vocab(tok), err, sizeof err) < 0 ||
            sd_method_make(&meth, &env, &d[i], err, sizeof err) < 0 ||
            sd_gen_new(&g[i], s[i], smp[i], d[i], &gp, err, sizeof err) < 0 ||
            sd_gen_prefill(g[i], ids, n, err, sizeof err) < 0)
            goto fail;
    }
    const double t0 = sd_time_ms();
    for (int running = n_gen; running > 0;) {
        sd_session *ss[MAX_GEN];
        sd_batch bs[MAX_GEN];
        int k = 0;
        for (int i = 0; i < n_gen; i++) {   // draft
            sd_batch b;
            if (sd_gen_finished(g[i]) != SD_FINISH_NONE) continue;
            if (sd_gen_step_begin(g[i], &b, err, sizeof err) < 0) goto fail;
            if (b.n > 0) ss[k] = s[i], bs[k++] = b;
        }
        if (sd_batcher_forward(bat, ss, bs, k, err, sizeof err) < 0) goto fail;   // one pass for all
        passes += k > 0;
        running = 0;
        for (int i = 0; i < n_gen; i++) {   // verify, commit, emit
            sd_step st;
            if (sd_gen_finished(g[i]) != SD_FINISH_NONE) continue;
            if (sd_gen_step_end(g[i], &st, err, sizeof err) < 0) goto fail;
            n_tokens += st.n_tokens;
            running += st.finish == SD_FINISH_NONE;
        }
    }
    const double ms = sd_time_ms() - t0;
    for (int i = 0; i < n_gen; i++) {
        int n;
        const int32_t *t = sd_gen_tokens(g[i], &n);
        printf("--- %d\n", i);
        for (int k = sd_gen_get_stats(g[i])->n_prompt_tokens; k < n; k++) {
            char piece[256];
            const int len = sd_token_to_piece(tok, t[k], 0, piece, sizeof piece);
            if (len > 0) fwrite(piece, 1, (size_t)(len < 256 ? len : 256), stdout);
        }
        printf("\n");
    }
    printf("%d generations, %d tokens in %d passes, %.1f tokens/s in all, method %s\n", n_gen, n_tokens, passes,
           ms > 0 ? n_tokens * 1000.0 / ms : 0.0, argv[2]);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "batch: %s\n", err);
out:
    for (int i = 0; i < n_gen; i++) {
        sd_gen_free(g[i]);
        sd_drafter_free(d[i]);
        sd_sampler_free(smp[i]);
        sd_session_free(s[i]);
    }
    sd_batcher_free(bat);
    sd_threadpool_free(pool);
    sd_model_free(m);
    return rc;
}
