// spec_check.h - shared harness of the speculative-decoding tests: collect
// the generated tokens, run plain greedy (sd_generate) and speculative
// (sd_generate with a drafter) decoding from a clean session, compare the outputs.
//
// Usage:
//   static sc_tokens a, b;
//   sd_gen_stats gs; sd_gen_stats st;
//   sc_run_plain(s, smp, prompt, np, 48, &a, &gs, err, sizeof err);
//   sc_run_spec(s, smp, d, prompt, np, 48, 16, &b, &st, err, sizeof err);
//   if (!sc_same_tokens(&a, &b)) ...
#ifndef SD_TEST_SPEC_CHECK_H
#define SD_TEST_SPEC_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "specdec_spec.h"
#include "synth.h"

#define SC_MAXTOK 1024

typedef struct sc_tokens {
    int32_t tok[SC_MAXTOK];   // [n] generated tokens, in order
    int n;                    // number stored, <= SC_MAXTOK (further tokens are dropped)
} sc_tokens;

// sd_token_cb appending to the sc_tokens at user; always returns 0.
int sc_collect_cb(int32_t t, void *user);

// Truncates s to empty, clears out, then runs sd_generate with n_predict
// tokens and n_batch 64. Returns sd_generate's code; fills *st.
int sc_run_plain(sd_session *s, sd_sampler *smp, const int32_t *prompt, int n_prompt, int n_predict,
                 sc_tokens *out, sd_gen_stats *st, char *err, size_t errlen);

// Truncates s to empty, resets d (if not NULL), clears out, then runs
// sd_generate with the drafter, n_predict, n_batch 64 and max_nodes. Returns its code.
int sc_run_spec(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                int n_predict, int max_nodes, sc_tokens *out, sd_gen_stats *st, char *err, size_t errlen);

// 1 when a and b hold the same token sequence, else 0.
int sc_same_tokens(const sc_tokens *a, const sc_tokens *b);

// New session on m with n_ctx, n_batch 64 and n_threads; NULL (message in err) on failure.
sd_session *sc_new_session(const sd_model *m, int n_ctx, int n_threads, char *err, size_t errlen);

// New sampler with default parameters except temp and repeat_penalty;
// NULL (message in err) on failure.
sd_sampler *sc_new_sampler(int n_vocab, float temp, float penalty, char *err, size_t errlen);

// Writes the synthetic model p to /tmp/specdec_test_<test>_<pid>_<tag>.gguf,
// loads it and removes the file. NULL (message in err) on failure.
sd_model *sc_synth_model(const synth_params *p, const char *test, const char *tag, char *err, size_t errlen);

// ---- sequence-distribution chi-square (sampled losslessness)
//
// With the sampler of sc_topk4_sampler every step has (at most) 4
// candidates, so the first 3 generated tokens take at most 64 values whose
// exact probabilities come from plain target forwards. A test enumerates
// them once (sc_seq3_enumerate), counts the outcome of each speculative run
// (sc_seq3_find), and compares with sc_seq3_chi2 (df 63).

#define SC_SEQ3_MAX 64

// The target's sampling distribution after seq[0..n): probs gets n_vocab values.
typedef void (*sc_probs_fn)(void *ud, const int32_t *seq, int n, float *probs);

typedef struct sc_seq3 {
    int32_t seqs[SC_SEQ3_MAX][3];   // [n_seq] the possible 3-token continuations
    double pexact[SC_SEQ3_MAX];     // [n_seq] their exact probabilities
    int n_seq;                      // number enumerated, <= SC_SEQ3_MAX
    int n_support1;                 // number of tokens with p > 0 at the first step (uncapped)
} sc_seq3;

// Sampler: temp 1.3, top_k 4, top_p 1, min_p 0, repeat_penalty 1.3;
// NULL (message in err) on failure.
sd_sampler *sc_topk4_sampler(int n_vocab, char *err, size_t errlen);

// Enumerates the 3-token continuations of prompt[0..n_prompt): at each step
// the first (by token id) 4 tokens of p > 0 for steps 1 and 2, and every
// token of p > 0 for step 3, until SC_SEQ3_MAX sequences. Returns 0, or -1
// when out of memory.
int sc_seq3_enumerate(sc_seq3 *e, sc_probs_fn probs_fn, void *ud, const int32_t *prompt, int n_prompt,
                      int n_vocab);

// Index of the sequence tok[0..3) in e, or -1 when it is not one of them.
int sc_seq3_find(const sc_seq3 *e, const int32_t *tok);

// Counts the outcome tok[0..3): cnt[k]++ for sequence k of e, else (*n_other)++.
void sc_seq3_tally(const sc_seq3 *e, const int32_t *tok, double *cnt, int *n_other);

// Pearson chi-square of the counts cnt[n_seq] of n_run runs against e->pexact.
double sc_seq3_chi2(const sc_seq3 *e, const double *cnt, int n_run);

// sc_probs_fn by one plain forward of the whole sequence on an emptied session.
typedef struct sc_fwd_probs {
    sd_session *ref;   // session on the target, n_ctx >= longest sequence
    sd_sampler *smp;   // sampler whose distribution is wanted
    char *err;         // forward errors go here
    size_t errlen;     // bytes at err
} sc_fwd_probs;
void sc_fwd_probs_fn(void *ud, const int32_t *seq, int n, float *probs);

#endif
