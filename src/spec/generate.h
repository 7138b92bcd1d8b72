// generate.h - the plain autoregressive generation loop (no drafting).
// Speculative decoding adds its own loop beside this one; both share the
// parameters and statistics defined here.
#ifndef SD_GENERATE_H
#define SD_GENERATE_H

#include <stdint.h>

#include "specdec.h"

enum sd_finish {
    SD_FINISH_LENGTH = 0,   // n_predict tokens generated
    SD_FINISH_EOG = 1,      // an end-of-generation token was sampled
    SD_FINISH_CTX = 2,      // the context (KV cache) is full
    SD_FINISH_STOPPED = 3,  // the callback asked to stop
};

typedef struct sd_gen_params {
    int n_predict;  // most tokens to generate (EOG included); <= 0: until EOG or context full
    int n_batch;    // prompt tokens per forward call; 0 = 512. Must not exceed the session's n_batch
    int fast_prompt; // 0 (default): the prompt is evaluated with float activations (sd_batch.precise:
                     // a more accurate cache and first token, slower prompt); 1: 8-bit like the rest
} sd_gen_params;

typedef struct sd_gen_stats {
    int n_prompt_tokens;       // tokens of the prompt (evaluated in this call)
    int n_generated;           // tokens sampled, the final EOG token included
    double prompt_ms;          // wall time of the prompt evaluation (ms)
    double generate_ms;        // wall time from the end of the prompt to the last token (ms)
    double tokens_per_second;  // n_generated / generate_ms * 1000 (0 if nothing was generated)
    int finish;                // enum sd_finish
} sd_gen_stats;

// Called once per generated token, in order (the EOG token too). A non-zero
// return stops generation after this token (Ctrl-C in the CLI).
typedef int (*sd_token_cb)(int32_t token, void *user);

sd_gen_params sd_gen_default_params(void);
// "length", "eog", "ctx", "stopped".
const char *sd_finish_name(int finish);

// Evaluates the prompt after the session's committed tokens (in chunks of
// n_batch), then samples, reports and evaluates one token at a time until
// n_predict tokens, an EOG token, a full context or a stop from the callback.
// Every evaluated token is committed to the session's cache (the last sampled
// token is not evaluated). The repetition penalty sees the prompt and the
// generated tokens. Returns 0 (stats filled, also when stopped early) or <0
// with a message: empty prompt, prompt longer than the free context, forward
// errors. Allocation: a history buffer and a prompt-logits mask, once per call,
// before the loop; nothing inside it.
int sd_generate(sd_session *s, sd_sampler *smp, const int32_t *prompt, int n_prompt,
                const sd_gen_params *p, sd_token_cb cb, void *user, sd_gen_stats *out,
                char *err, size_t errlen);

#endif
