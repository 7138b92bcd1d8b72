// spec.h - the speculative generation loop: draft a token tree, evaluate it
// with ONE target forward, verify, keep the accepted rows, repeat.
//
// It behaves like sd_generate (generate.h) token for token: same prompt
// handling, same callback, same end conditions (EOG token reported then
// stop, n_predict, full context, callback stop), so greedy output is
// identical to plain greedy decoding and sampled output has the same
// distribution. Usage from a program:
//
//   sd_drafter *d;  sd_draft_model_new(&d, draft_model, target_model, &dp, err, sizeof err);
//   sd_spec_params sp = sd_spec_default_params();  sp.n_predict = 200;
//   sd_spec_stats st;
//   sd_spec_generate(session, sampler, d, prompt, n_prompt, &sp, on_token, user, &st, err, sizeof err);
//   sd_drafter_free(d);
#ifndef SD_SPEC_H
#define SD_SPEC_H

#include <stdint.h>

#include "draft/drafter.h"
#include "spec/generate.h"

#define SD_SPEC_MAX_DEPTH 64   // depths tracked by the acceptance statistics

typedef struct sd_spec_params {
    int n_predict;   // most tokens to generate (EOG included); <= 0: until EOG or context full
    int n_batch;     // prompt tokens per forward call; 0 = 512; must not exceed the session's n_batch
    int max_nodes;   // tree size per target forward, root included; default 16 (<= session n_batch)
    int fast_prompt; // as sd_gen_params.fast_prompt (default 0: precise prompt, like sd_generate)
} sd_spec_params;

typedef struct sd_spec_stats {
    sd_gen_stats gen;             // the same numbers sd_generate reports (tokens_per_second etc.)
    int n_target_forwards;        // tree forwards of the target after the prompt
    int n_draft_nodes;            // draft nodes proposed in total (roots excluded)
    int n_draft_accepted;         // draft tokens accepted in total
    double mean_accepted;         // tokens emitted per target tree forward, bonus included
    int n_depth_proposed[SD_SPEC_MAX_DEPTH + 1];  // steps whose tree reached depth d
    int n_depth_accepted[SD_SPEC_MAX_DEPTH + 1];  // steps that accepted a draft token at depth d
    double acceptance_by_depth[SD_SPEC_MAX_DEPTH + 1]; // accepted / proposed at depth d (index 0 unused)
    int max_depth;                // deepest depth seen
    double draft_ms;              // time in the drafter (propose + accept), ms
    double verify_ms;             // target tree forwards + verification + commit, ms
    long n_aux_nodes;             // auxiliary batch nodes (drafter aux(), e.g. the lookahead branch) in total
} sd_spec_stats;

sd_spec_params sd_spec_default_params(void);

// Evaluates the prompt after the session's committed tokens (like
// sd_generate), samples the first token from the prompt's logits, then loops:
// the drafter proposes a tree whose root is the last token (not yet in the
// target cache); one target forward evaluates the whole tree; greedy
// (sampler temp <= 0) or stochastic verification picks the accepted path and
// bonus token; the path rows are committed in the target session; the
// drafter is told; accepted tokens and the bonus are reported through cb in
// order, checking the end conditions after each. A NULL drafter decodes one
// token per forward. The drafter must be fresh or reset for a new text. The
// only allocations happen before the loop. Returns 0 (stats filled) or <0
// with a message.
//
// Drafters with the optional aux_vt (drafter.h: aux/observe) add auxiliary
// nodes after the tree in the same forward (bounded by the session's n_batch
// and the context room, not by max_nodes) and read the logits of the whole
// batch after it; only the verified tree path is committed.
int sd_spec_generate(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                     const sd_spec_params *p, sd_token_cb cb, void *user, sd_spec_stats *out, char *err,
                     size_t errlen);

#endif
