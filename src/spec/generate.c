// generate.c - the plain autoregressive generation loop.
#include "spec/generate.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

sd_gen_params sd_gen_default_params(void) {
    sd_gen_params p;
    p.n_predict = 256;
    p.n_batch = 0;
    p.fast_prompt = 0;
    return p;
}

const char *sd_finish_name(int finish) {
    switch (finish) {
    case SD_FINISH_LENGTH: return "length";
    case SD_FINISH_EOG: return "eog";
    case SD_FINISH_CTX: return "ctx";
    case SD_FINISH_STOPPED: return "stopped";
    default: return "unknown";
    }
}

int sd_generate(sd_session *s, sd_sampler *smp, const int32_t *prompt, int n_prompt,
                const sd_gen_params *p, sd_token_cb cb, void *user, sd_gen_stats *out,
                char *err, size_t errlen) {
    sd_gen_params gp = p ? *p : sd_gen_default_params();
    sd_gen_stats st;
    memset(&st, 0, sizeof st);
    if (out) *out = st;
    if (!s || !smp) return sd_err(err, errlen, "generate: session and sampler are required");
    if (!prompt || n_prompt <= 0) return sd_err(err, errlen, "generate: the prompt is empty");
    const int n_ctx = sd_session_n_ctx(s);
    const int n_past0 = sd_session_n_past(s);
    if (n_past0 + n_prompt > n_ctx)
        return sd_err(err, errlen, "prompt has %d tokens but the context is %d%s", n_prompt, n_ctx,
                      n_past0 ? " (including the tokens already in the cache)" : "");
    const sd_model *m = sd_session_model(s);
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    const int n_batch = gp.n_batch > 0 ? gp.n_batch : 512;
    const int n_gen_max = gp.n_predict > 0 ? gp.n_predict : n_ctx;

    // history for the repetition penalty: prompt + generated tokens
    size_t n_hist_max = (size_t)n_prompt + (size_t)n_gen_max + 1;
    int32_t *hist = malloc(n_hist_max * sizeof(int32_t));
    uint8_t *want = malloc((size_t)n_batch);
    if (!hist || !want) {
        free(hist);
        free(want);
        return sd_err(err, errlen, "generate: out of memory");
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n_hist = n_prompt;
    int rc = 0;
    char ferr[256];

    // prompt, in chunks; logits only for the very last prompt token
    double t0 = sd_time_ms(), t1 = t0;
    const float *logits = NULL;
    for (int i = 0; i < n_prompt; i += n_batch) {
        int n = SD_MIN(n_batch, n_prompt - i);
        memset(want, 0, (size_t)n);
        if (i + n == n_prompt) want[n - 1] = 1;
        sd_batch b = {.n = n, .tokens = prompt + i, .parent = NULL, .pos = NULL, .logits = want,
                      .precise = !gp.fast_prompt};
        if (sd_session_forward(s, &b, ferr, sizeof ferr) < 0 ||
            sd_session_commit(s, NULL, 0, ferr, sizeof ferr) < 0) {
            rc = sd_err(err, errlen, "generate: prompt evaluation failed: %s", ferr);
            goto done;
        }
        if (i + n == n_prompt) logits = sd_session_logits(s, n - 1);
    }
    t1 = sd_time_ms();
    st.n_prompt_tokens = n_prompt;
    st.prompt_ms = t1 - t0;

    for (;;) {
        if (!logits) {
            rc = sd_err(err, errlen, "generate: the forward pass returned no logits");
            goto done;
        }
        int32_t t = sd_sampler_sample(smp, logits, hist, n_hist);
        hist[n_hist++] = t;
        st.n_generated++;
        int stop = cb ? cb(t, user) : 0;
        if (sd_token_is_eog(tok, t)) {
            st.finish = SD_FINISH_EOG;
            break;
        }
        if (stop) {
            st.finish = SD_FINISH_STOPPED;
            break;
        }
        if (st.n_generated >= n_gen_max) {
            st.finish = gp.n_predict > 0 ? SD_FINISH_LENGTH : SD_FINISH_CTX;
            break;
        }
        if (sd_session_n_past(s) >= n_ctx) {
            st.finish = SD_FINISH_CTX;
            break;
        }
        sd_batch b = {.n = 1, .tokens = &hist[n_hist - 1], .parent = NULL, .pos = NULL, .logits = NULL};
        if (sd_session_forward(s, &b, ferr, sizeof ferr) < 0 ||
            sd_session_commit(s, NULL, 0, ferr, sizeof ferr) < 0) {
            rc = sd_err(err, errlen, "generate: forward failed after %d tokens: %s", st.n_generated, ferr);
            goto done;
        }
        logits = sd_session_logits(s, 0);
    }
    st.generate_ms = sd_time_ms() - t1;
    st.tokens_per_second = st.generate_ms > 0 ? st.n_generated * 1000.0 / st.generate_ms : 0.0;

done:
    if (rc < 0 && st.n_prompt_tokens) st.generate_ms = sd_time_ms() - t1;
    free(hist);
    free(want);
    if (out) *out = st;
    return rc;
}
