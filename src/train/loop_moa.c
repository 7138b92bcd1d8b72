// loop_moa.c - the MoA drafter's training data inside the loop (docs/moa.md,
// "Training"): the feature cache holds tokens, the target's top-k
// distributions and its final normed states (the Medusa cache); the K,V
// rows of every layer (23 KB a token for SmolLM2 in f16, too much to store
// for millions of tokens) are recomputed per training sequence by the
// target's batched 8-bit forward over the sequence's tokens, which also
// gives the states the SmoothL1 terms compare with.
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/moa.h"
#include "model/model.h"
#include "runtime/session.h"
#include "train/loop_impl.h"
#include "train/moa_train.h"

int loop_moa_init(loop_run *r, char *err, size_t errlen) {
    const int T = r->P.seq_len, E = r->m->hp.n_embd, nf = sd_moa_n_feat(r->h);
    const size_t kvd = (size_t)r->h->hp.moa_kv_width / 2;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = T;
    sp.n_batch = T;
    sp.pool = r->pool;
    if (sd_session_new(&r->moa_s, r->m, &sp, err, errlen) < 0) return -1;
    r->moa_feat = malloc(sizeof(float) * (size_t)T * (size_t)nf);
    r->moa_hid = malloc(sizeof(float) * (size_t)T * 2 * (size_t)E);
    r->moa_k = malloc(sizeof(float) * (size_t)T * kvd);
    r->moa_nolog = calloc((size_t)T, 1);   // no logits wanted: the labels come from the cache
    r->moa_v = malloc(sizeof(float) * (size_t)T * kvd);
    if (!r->moa_feat || !r->moa_hid || !r->moa_k || !r->moa_v || !r->moa_nolog) return sd_err(err, errlen, "out of memory");
    return 0;
}

void loop_moa_free(loop_run *r) {
    sd_session_free(r->moa_s);
    free(r->moa_feat);
    free(r->moa_hid);
    free(r->moa_k);
    free(r->moa_v);
    free(r->moa_nolog);
}

int loop_moa_feats(loop_run *r, sd_train_seq *seq, char *err, size_t errlen) {
    const sd_model *m = r->m;
    const int T = seq->T, L = m->hp.n_layer, E = m->hp.n_embd, N = r->h->hp.moa_tli;
    const int ekv = r->h->hp.moa_kv_width, kvd = ekv / 2, nf = sd_moa_n_feat(r->h);
    // the state entering layer L-N (N > 0: the stream after block L-N-1) and the final normed state
    int32_t layers[2] = {N > 0 ? L - N - 1 : SD_HIDDEN_NORM, SD_HIDDEN_NORM};
    char e2[256];
    if (sd_session_truncate(r->moa_s, 0, e2, sizeof e2) < 0) return sd_err(err, errlen, "moa data: %s", e2);
    sd_batch b = {.n = T, .tokens = seq->tokens, .logits = r->moa_nolog, .hidden_layers = layers, .n_hidden_layers = 2,
                  .hidden_out = r->moa_hid};
    if (sd_session_forward(r->moa_s, &b, e2, sizeof e2) < 0 || sd_session_commit(r->moa_s, NULL, 0, e2, sizeof e2) < 0)
        return sd_err(err, errlen, "moa data: the target's forward failed: %s", e2);
    for (int l = 0; l < L; l++) {
        if (sd_session_kv_rows(r->moa_s, l, 0, T, r->moa_k, r->moa_v) < 0)
            return sd_err(err, errlen, "moa data: cannot read the target's cache rows of layer %d", l);
        for (int p = 0; p < T; p++) {
            float *row = r->moa_feat + (size_t)p * nf + (size_t)l * ekv;
            memcpy(row, r->moa_k + (size_t)p * kvd, sizeof(float) * (size_t)kvd);
            memcpy(row + kvd, r->moa_v + (size_t)p * kvd, sizeof(float) * (size_t)kvd);
        }
    }
    for (int p = 0; p < T; p++) {
        float *row = r->moa_feat + (size_t)p * nf + (size_t)L * ekv;
        const float *h = r->moa_hid + (size_t)p * 2 * E;
        if (N > 0) memcpy(row, h, sizeof(float) * (size_t)E);
        else memset(row, 0, sizeof(float) * (size_t)E);
        memcpy(row + E, h + E, sizeof(float) * (size_t)E);
    }
    seq->feats = r->moa_feat;
    return 0;
}
