// trainer.c - sd_trainer (train.h): creation, the checks every sequence
// passes, the targets restricted to the draft vocabulary, and the dispatch
// to the head types (eagle3_train.c, medusa_train.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/model.h"
#include "train/moa_train.h"
#include "train/train_impl.h"

int sd_trainer_new(sd_trainer **out, const sd_head *h, const sd_model *target, int T_max, int K, sd_pool *pool,
                   char *err, size_t errlen) {
    *out = NULL;
    const sd_head_hp *hp = &h->hp;
    if (T_max < 2 || T_max > (1 << 20)) return sd_err(err, errlen, "trainer: T_max %d out of range [2, 2^20]", T_max);
    if (hp->type == SD_HEAD_EAGLE3) {
        if (K < 1 || K > SD_HEAD_MAX_MEDUSA)
            return sd_err(err, errlen, "trainer: %d training-time-test steps (1..%d)", K, SD_HEAD_MAX_MEDUSA);
        if (!target) return sd_err(err, errlen, "trainer: an EAGLE-3 head needs the target (its token embedding)");
        if (target->hp.n_embd != hp->n_embd || target->hp.n_vocab != hp->target_n_vocab)
            return sd_err(err, errlen, "trainer: the target (width %d, %d tokens) is not the head's (width %d, %d tokens)",
                          target->hp.n_embd, target->hp.n_vocab, hp->n_embd, hp->target_n_vocab);
    } else if (hp->type == SD_HEAD_MEDUSA) {
        K = hp->n_medusa;
    } else if (hp->type == SD_HEAD_MOA) {
        K = SD_HEAD_MAX_MEDUSA;   // agreement by draft depth 0..7
    } else {
        return sd_err(err, errlen, "trainer: unknown head type %d", hp->type);
    }
    sd_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return sd_err(err, errlen, "trainer: out of memory");
    tr->h = h;
    tr->target = target;
    tr->T_max = T_max;
    tr->K = K;
    size_t nf = 0, ni = 0;
    if (hp->type == SD_HEAD_EAGLE3)
        sd_e3_sizes(h, T_max, K, &nf, &ni);
    else if (hp->type == SD_HEAD_MEDUSA)
        sd_md_sizes(h, T_max, &nf, &ni);
    else if (sd_moa_tr_new(&tr->moa, h, target, T_max, err, errlen) < 0) {
        sd_trainer_free(tr);
        return -1;
    }
    const size_t nt = (size_t)T_max * SD_TRAIN_MAX_TOPK;
    // (C11: the size a multiple of the alignment)
    tr->arena = aligned_alloc(64, ((nf + nt) * sizeof(float) + 63) / 64 * 64 + 64);
    tr->iarena = aligned_alloc(64, ((ni + nt) * sizeof(int32_t) + 63) / 64 * 64 + 64);
    tr->scored = malloc((size_t)T_max);
    if (!tr->arena || !tr->iarena || !tr->scored || sd_tr_ctx_init(&tr->ctx, pool, err, errlen) < 0) {
        sd_trainer_free(tr);
        return sd_err(err, errlen, "trainer: out of memory for a workspace of %.0f MiB (T_max %d)",
                      (double)(nf + ni + 2 * nt) * 4 / (1 << 20), T_max);
    }
    memset(tr->arena, 0, nf * sizeof(float));
    tr->tp = tr->arena + nf;
    tr->tid = tr->iarena + ni;
    if (hp->type == SD_HEAD_EAGLE3)
        sd_e3_carve(tr, tr->arena, tr->iarena);
    else if (hp->type == SD_HEAD_MEDUSA)
        sd_md_carve(tr, tr->arena, tr->iarena);
    *out = tr;
    return 0;
}

void sd_trainer_free(sd_trainer *tr) {
    if (!tr) return;
    sd_tr_ctx_free(&tr->ctx);
    sd_moa_tr_free(tr->moa);
    free(tr->arena);
    free(tr->iarena);
    free(tr->scored);
    free(tr);
}

void sd_trainer_set_fault(sd_trainer *tr, int fault) { tr->fault = fault; }

// Checks seq against the trainer and the head, then restricts every
// position's target to the draft vocabulary (tr->tid, tr->tp; entries
// outside it dropped; softxent renormalises) and marks the positions left
// with mass.
static int prepare(sd_trainer *tr, const sd_train_seq *seq, char *err, size_t errlen) {
    const sd_head_hp *hp = &tr->h->hp;
    if (!seq || !seq->tokens || !seq->feats || !seq->top_ids || !seq->top_p)
        return sd_err(err, errlen, "trainer: the sequence lacks tokens, states or target distributions");
    if (seq->T < 2 || seq->T > tr->T_max)
        return sd_err(err, errlen, "trainer: sequence of %d positions (2..T_max = %d)", seq->T, tr->T_max);
    if (seq->topk < 1 || seq->topk > SD_TRAIN_MAX_TOPK)
        return sd_err(err, errlen, "trainer: top-k of %d (1..%d)", seq->topk, SD_TRAIN_MAX_TOPK);
    const int T = seq->T, nt = seq->topk;
    for (int p = 0; p < T; p++)
        if (seq->tokens[p] < 0 || seq->tokens[p] >= hp->target_n_vocab)
            return sd_err(err, errlen, "trainer: token %d at position %d is outside the target's %d", seq->tokens[p],
                          p, hp->target_n_vocab);
    for (int p = 0; p < T; p++) {
        double mass = 0;
        for (int i = 0; i < nt; i++) {
            const int32_t t = seq->top_ids[(size_t)p * nt + i];
            const float q = seq->top_p[(size_t)p * nt + i];
            if (t < -1 || t >= hp->target_n_vocab)
                return sd_err(err, errlen, "trainer: target id %d at position %d is outside the target's %d", t, p,
                              hp->target_n_vocab);
            if (t >= 0 && !(q >= 0.0f && q <= 1.001f))   // (also refuses NaN)
                return sd_err(err, errlen, "trainer: target probability %g at position %d", (double)q, p);
            const int32_t di = t >= 0 && (!seq->score || seq->score[p]) ? tr->h->t2d[t] : -1;
            tr->tid[(size_t)p * nt + i] = di;
            tr->tp[(size_t)p * nt + i] = di >= 0 ? q : 0.0f;
            if (di >= 0) mass += q;
        }
        tr->scored[p] = mass > 0;   // (a position seq->score leaves out has no mass)
    }
    return 0;
}

void sd_trainer_set_moa_block(sd_trainer *tr, int kmin, int kmax) {
    if (tr->moa) sd_moa_tr_set_block(tr->moa, kmin, kmax);
}

void sd_trainer_set_moa_sa_full(sd_trainer *tr, float p, uint64_t salt) {
    if (tr->moa) sd_moa_tr_set_sa_full(tr->moa, p, salt);
}

double sd_trainer_loss(sd_trainer *tr, const sd_train_seq *seq, float *grad, sd_train_stats *st, char *err,
                       size_t errlen) {
    if (st) memset(st, 0, sizeof *st);
    if (prepare(tr, seq, err, errlen) < 0) return -1;
    sd_pool_acquire(tr->ctx.pool);   // a shared pool: take our turn (house rule 8)
    const int ty = tr->h->hp.type;
    double loss = ty == SD_HEAD_EAGLE3 ? sd_e3_loss(tr, seq, grad, st, err, errlen)
                  : ty == SD_HEAD_MOA  ? sd_moa_tr_loss(tr->moa, &tr->ctx, seq, tr->tid, tr->tp, tr->scored, grad, st,
                                                        tr->fault)
                                       : sd_md_loss(tr, seq, grad, st);
    sd_pool_release(tr->ctx.pool);
    if (st && loss >= 0) st->loss = loss;
    return loss;
}
