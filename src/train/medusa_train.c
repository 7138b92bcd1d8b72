// medusa_train.c - the loss of a Medusa head on one sequence and its
// gradient (docs/heads.md). Head k reads the target's final normed state
// f_j at rows j = 0..T-2-k and is scored against the target's distribution
// at position j + k + 1 (it drafts x_{j+k+2}); heads are independent, so
// each runs its forward and backward before the next, on one workspace.
//
// Per row:  u = W_k f + b_k (d);  z = f + silu(u) (d);  logits = Wout_k z (V');
//   loss = 0.8^k mean over scored rows of softxent(logits, P'_{j+k+1}).
// f is the target's and frozen: no gradient flows into it.
#include <math.h>
#include <string.h>

#include "common.h"
#include "train/train_impl.h"

void sd_md_sizes(const sd_head *h, int T_max, size_t *nf, size_t *ni) {
    const size_t d = (size_t)h->hp.n_embd, V = (size_t)h->hp.n_draft_vocab, n0 = (size_t)T_max - 1;
    *nf = 4 * n0 * d + n0 * V + n0 + 8 * 16;
    *ni = n0 + 16;
}

void sd_md_carve(sd_trainer *tr, float *f, int32_t *i) {
    const size_t d = (size_t)tr->h->hp.n_embd, V = (size_t)tr->h->hp.n_draft_vocab, n0 = (size_t)tr->T_max - 1;
    md_ws *w = &tr->md;
    w->Upre = tr_take(&f, n0 * d);
    w->Zs = tr_take(&f, n0 * d);
    w->Lg = tr_take(&f, n0 * V);
    w->dZ = tr_take(&f, n0 * d);
    w->dU = tr_take(&f, n0 * d);
    w->loss_row = tr_take(&f, n0);
    w->argmax = tr_take_i(&i, n0);
}

// Head k: its weighted loss; with grad, its gradients.
static double md_head(sd_trainer *tr, const sd_train_seq *seq, int k, float *grad, sd_train_stats *st) {
    md_ws *w = &tr->md;
    const sd_head *h = tr->h;
    const sd_tr_ctx *cx = &tr->ctx;
    const int d = h->hp.n_embd, V = h->hp.n_draft_vocab, n = seq->T - 1 - k, nt = seq->topk;
    const float *F = seq->feats, *b = sd_head_w(h, SD_MD_BIAS(k));
    const size_t nd = (size_t)n * d;

    sd_tr_linear(cx, n, d, d, F, sd_head_w(h, SD_MD_FC(k)), w->Upre, 0);
    for (int r = 0; r < n; r++) sd_tr_acc((size_t)d, b, w->Upre + (size_t)r * d);
    sd_tr_silu(nd, w->Upre, w->Zs);
    sd_tr_acc(nd, F, w->Zs);
    sd_tr_linear(cx, n, d, V, w->Zs, sd_head_w(h, SD_MD_OUT(k)), w->Lg, 0);

    int n_sc = 0;
    for (int r = 0; r < n; r++) n_sc += tr->scored[r + k + 1];
    const double wk = pow(0.8, k);
    const float wg = n_sc ? (float)((tr->fault == SD_TR_FAULT_NO_WEIGHT ? 1.0 : wk) / n_sc) : 0.0f;
    const double sum = sd_tr_softxent(cx, n, V, w->Lg, tr->tid + (size_t)(k + 1) * nt, tr->tp + (size_t)(k + 1) * nt,
                                      nt, wg, grad ? w->Lg : NULL, w->loss_row, w->argmax, NULL);
    if (st)
        for (int r = 0; r < n; r++)
            if (tr->scored[r + k + 1]) {
                st->n[k]++;
                st->agree[k] += h->d2t[w->argmax[r]] == seq->top_ids[(size_t)(r + k + 1) * nt];
            }
    if (grad && n_sc) {
        memset(w->dZ, 0, sizeof(float) * nd);
        sd_tr_linear_dx(cx, n, d, V, w->Lg, sd_head_w(h, SD_MD_OUT(k)), w->dZ);
        sd_tr_linear_dw(cx, n, d, V, w->Lg, w->Zs, grad + h->t[SD_MD_OUT(k)].off);
        memset(w->dU, 0, sizeof(float) * nd);
        sd_tr_silu_bwd(nd, w->Upre, w->dZ, w->dU);
        sd_tr_linear_dw(cx, n, d, d, w->dU, F, grad + h->t[SD_MD_FC(k)].off);
        float *db = grad + h->t[SD_MD_BIAS(k)].off;
        for (int r = 0; r < n; r++) sd_tr_acc((size_t)d, w->dU + (size_t)r * d, db);
    }
    return n_sc ? wk * sum / n_sc : 0.0;
}

double sd_md_loss(sd_trainer *tr, const sd_train_seq *seq, float *grad, sd_train_stats *st) {
    const int K = SD_MIN(tr->K, seq->T - 1);
    double loss = 0;
    for (int k = 0; k < K; k++) loss += md_head(tr, seq, k, grad, st);
    return loss;
}
