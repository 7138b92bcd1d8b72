// loop_moa.c - the MoA drafter's training data inside the loop (docs/moa.md,
// "Training"). Two sources:
// - without LSA (TLI up to SD_CACHE_MAX_MOA_TLI), the MoA feature cache
//   (cache.h): per position the layers' mean K,V row, the TLI layers' rows
//   and the target states, a few KB a token, read as EAGLE-3 reads its
//   cache; the rows sit at their window's positions (seq->pos0);
// - with LSA, every layer's K,V rows (23 KB a token for SmolLM2 in f16, too
//   much to store for millions of tokens) are recomputed per training
//   sequence by the target's batched 8-bit forward over the sequence's
//   tokens (positions from 0), which also gives the states the SmoothL1
//   terms compare with; the cache is the Medusa one (tokens, labels).
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/moa.h"
#include "model/model.h"
#include "runtime/session.h"
#include "train/cache.h"
#include "train/loop_impl.h"
#include "train/moa_train.h"

int loop_moa_uses_cache(const sd_head_hp *hp) { return hp->moa_no_lsa && hp->moa_tli <= SD_CACHE_MAX_MOA_TLI; }

int loop_moa_init(loop_run *r, char *err, size_t errlen) {
    const int T = r->P.seq_len, E = r->m->hp.n_embd, nf = sd_moa_n_feat(r->h);
    const size_t kvd = (size_t)r->h->hp.moa_kv_width / 2;
    r->moa_feat = malloc(sizeof(float) * (size_t)T * (size_t)nf);
    if (!r->moa_feat) return sd_err(err, errlen, "out of memory");
    if (loop_moa_uses_cache(&r->h->hp)) return 0;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = T;
    sp.n_batch = T;
    sp.pool = r->pool;
    sp.gpu = -1;   // on the CPU: the rows are read from the session's host cache (sd_session_kv_rows)
    if (sd_session_new(&r->moa_s, r->m, &sp, err, errlen) < 0) return -1;
    r->moa_hid = malloc(sizeof(float) * (size_t)T * 2 * (size_t)E);
    r->moa_k = malloc(sizeof(float) * (size_t)T * kvd);
    r->moa_nolog = calloc((size_t)T, 1);   // no logits wanted: the labels come from the cache
    r->moa_v = malloc(sizeof(float) * (size_t)T * kvd);
    if (!r->moa_hid || !r->moa_k || !r->moa_v || !r->moa_nolog) return sd_err(err, errlen, "out of memory");
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

// The trainer's features from the MoA cache's rows (cache.h: a cache that
// keeps Nc >= N TLI layers): the mean row, the last N layers' rows, the
// state entering layer L-N (zeros for N = 0), the final state.
static void from_cache(loop_run *r, sd_train_seq *seq) {
    const int T = seq->T, E = r->m->hp.n_embd, N = r->h->hp.moa_tli, ekv = r->h->hp.moa_kv_width;
    const int nf = sd_moa_n_feat(r->h), nfc = sd_cache_n_feat(r->cache), Nc = nfc / (ekv + E) - 1;
    for (int p = 0; p < T; p++) {
        const float *c = seq->feats + (size_t)p * nfc;
        float *o = r->moa_feat + (size_t)p * nf;
        memcpy(o, c, sizeof(float) * (size_t)ekv);
        memcpy(o + ekv, c + (size_t)(1 + Nc - N) * ekv, sizeof(float) * (size_t)N * ekv);
        float *h = o + (size_t)(1 + N) * ekv;
        const float *hc = c + (size_t)(1 + Nc) * ekv;
        if (N > 0) memcpy(h, hc + (size_t)(Nc - N) * E, sizeof(float) * (size_t)E);
        else memset(h, 0, sizeof(float) * (size_t)E);
        memcpy(h + E, hc + (size_t)Nc * E, sizeof(float) * (size_t)E);
    }
    seq->feats = r->moa_feat;
}

int loop_moa_feats(loop_run *r, sd_train_seq *seq, int pos0, char *err, size_t errlen) {
    if (loop_moa_uses_cache(&r->h->hp)) {
        from_cache(r, seq);
        seq->pos0 = pos0;
        return 0;
    }
    const sd_model *m = r->m;
    const int T = seq->T, L = m->hp.n_layer, E = m->hp.n_embd, N = r->h->hp.moa_tli;
    const int ekv = r->h->hp.moa_kv_width, kvd = ekv / 2, nf = sd_moa_n_feat(r->h), no_lsa = r->h->hp.moa_no_lsa;
    const int kvf = no_lsa ? (1 + N) * ekv : L * ekv;
    // the state entering layer L-N (N > 0: the stream after block L-N-1) and the final normed state
    int32_t layers[2] = {N > 0 ? L - N - 1 : SD_HIDDEN_NORM, SD_HIDDEN_NORM};
    char e2[256];
    if (sd_session_truncate(r->moa_s, 0, e2, sizeof e2) < 0) return sd_err(err, errlen, "moa data: %s", e2);
    sd_batch b = {.n = T, .tokens = seq->tokens, .logits = r->moa_nolog, .hidden_layers = layers, .n_hidden_layers = 2,
                  .hidden_out = r->moa_hid};
    if (sd_session_forward(r->moa_s, &b, e2, sizeof e2) < 0 || sd_session_commit(r->moa_s, NULL, 0, e2, sizeof e2) < 0)
        return sd_err(err, errlen, "moa data: the target's forward failed: %s", e2);
    if (no_lsa)
        for (int p = 0; p < T; p++) memset(r->moa_feat + (size_t)p * nf, 0, sizeof(float) * (size_t)ekv);
    for (int l = 0; l < L; l++) {
        if (sd_session_kv_rows(r->moa_s, l, 0, T, r->moa_k, r->moa_v) < 0)
            return sd_err(err, errlen, "moa data: cannot read the target's cache rows of layer %d", l);
        for (int p = 0; p < T; p++) {
            const float *k = r->moa_k + (size_t)p * kvd, *v = r->moa_v + (size_t)p * kvd;
            float *o = r->moa_feat + (size_t)p * nf;
            if (no_lsa) {   // the reduced form, as the MoA cache holds it
                sd_moa_reduced_add(o, l, L, N, kvd, k, v);
                continue;
            }
            memcpy(o + (size_t)l * ekv, k, sizeof(float) * (size_t)kvd);
            memcpy(o + (size_t)l * ekv + kvd, v, sizeof(float) * (size_t)kvd);
        }
    }
    for (int p = 0; p < T; p++) {
        float *row = r->moa_feat + (size_t)p * nf + kvf;
        const float *h = r->moa_hid + (size_t)p * 2 * E;
        if (N > 0) memcpy(row, h, sizeof(float) * (size_t)E);
        else memset(row, 0, sizeof(float) * (size_t)E);
        memcpy(row + E, h + E, sizeof(float) * (size_t)E);
    }
    seq->feats = r->moa_feat;
    seq->pos0 = 0;
    return 0;
}
