// sampler.h - the sampler's internal entry points (the public ones are in
// include/specdec.h).
#ifndef SD_RUNTIME_SAMPLER_H
#define SD_RUNTIME_SAMPLER_H

#include <stdint.h>

#include "specdec.h"

// sd_sampler_probs for logits that are -inf outside a support: lsub[i] is
// the logit of token ids[i] (n of them, ids increasing). The same row as
// sd_sampler_probs of the full logits, in time for n rather than n_vocab (a
// draft head's row over its draft vocabulary) when no repetition penalty
// applies; otherwise it builds the full row. probs: (n_vocab) written.
void sd_sampler_probs_support(sd_sampler *s, const float *lsub, const int32_t *ids, int n, const int32_t *hist,
                              int n_hist, float *probs);

#endif
