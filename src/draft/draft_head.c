// draft_head.c - the pieces the head drafters share (draft_head.h).
#include "draft/draft_head.h"

#include <math.h>
#include <string.h>

#include "common.h"
#include "model/model.h"
#include "runtime/sampler.h"

int sd_draft_head_params(const char *who, const sd_draft_model_params *p, const sd_model *target, int tree_max,
                         sd_draft_model_params *dp, int *n_ctx, char *err, size_t errlen) {
    *dp = p ? *p : sd_draft_model_default_params();
    if (dp->shape == SD_DRAFT_CHAIN && (dp->k < 1 || dp->k > 64))
        return sd_err(err, errlen, "%s: chain length %d out of range 1..64", who, dp->k);
    if (dp->shape == SD_DRAFT_DYNAMIC && (dp->dyn_b < 1 || dp->dyn_b > 16 || dp->dyn_d < 1 || dp->dyn_d > 16 ||
                                          dp->dyn_m < 2 || 1 + dp->dyn_b * dp->dyn_b * dp->dyn_d > tree_max))
        return sd_err(err, errlen, "%s: dynamic tree B=%d D=%d M=%d out of range", who, dp->dyn_b, dp->dyn_d,
                      dp->dyn_m);
    *n_ctx = dp->n_ctx > 0 ? dp->n_ctx : SD_MIN(target->hp.n_ctx_train > 0 ? target->hp.n_ctx_train : 4096, 4096);
    return 0;
}

void sd_draft_head_dist(const sd_head *h, sd_sampler *smp, int stochastic, const float *lg, int nv,
                        const int32_t *hist, int n_hist, float *row) {
    if (stochastic && smp) {   // the draft vocabulary's logits only (the sampler's row is -inf elsewhere)
        sd_sampler_probs_support(smp, lg, h->d2t, h->hp.n_draft_vocab, hist, n_hist, row);
        return;
    }
    sd_head_draft_probs(h, lg, row, nv);
}

int sd_draft_node_hist(const sd_draft_ctx *ctx, const sd_tree *t, int node, int32_t *hist) {
    const int n = ctx->n_tokens + t->depth[node];
    memcpy(hist, ctx->tokens, sizeof(int32_t) * (size_t)ctx->n_tokens);
    for (int k = n - 1, i = node; k >= ctx->n_tokens; k--, i = t->parent[i]) hist[k] = t->token[i];
    return n;
}
