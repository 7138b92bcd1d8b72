// eagle3_train.c - the loss of an EAGLE-3 head on one sequence and its
// gradient: the training-time test of docs/heads.md, forward step by step,
// backward in reverse.
//
// Rows. Step k (k = 0..K-1) has the rows j = 1..T-1-k; its row r is j = r+1
// at position p = j + k, with token x_p (its a row, shared by every step
// that reads that position) and state c: step 0 the fused g_{j-1} = fc
// [s_l0; s_l1; s_l2](j-1), step k >= 1 the output h of row r of step k-1 (the
// same j: step k-1 has one row more, so its first n_k rows). Rows of all steps
// are stored one step after the other (sd_tr_ttt_off), because the
// attention of step k reads the keys and values of steps 0..k.
//
// Forward of one step (n rows; shapes per row):
//   b = n(c) * hidden_norm                      (d)
//   u = [a; b]                                  (2d)
//   q, k, v = Wq u, Wk u, Wv u; RoPE(q, k) at p (n_head*hd, n_kv*hd, n_kv*hd)
//   o = attention under step k's mask           (n_head*hd)
//   r = (norm_before_residual ? b : c) + Wo o   (d)
//   m = n(r) * ffn_norm;  s = silu(Wgate m) * (Wup m)   (d, n_ff)
//   h = r + Wdown s;  z = n(h) * output_norm    (d)
//   logits = Wout z                             (V')
//   loss = 0.8^k mean over scored rows of softxent(logits, P'_p)
// The output layer's backward (dz, dWout) runs right after the loss, so
// only one step's logits are ever stored. The backward of step k then runs
// after that of step k+1 (whose gradient of c is the gradient of this
// step's h, and whose attention added into this step's keys and values).
#include <math.h>
#include <string.h>

#include "common.h"
#include "train/train_impl.h"

// One step's place in the workspace.
typedef struct e3_step {
    int n, o;                // rows, first row
    int nk;                  // keys it sees: the rows of steps 0..k
    int nnz;                 // mask entries
    int32_t *q_off, *q_key;  // its mask (query side)
    sd_tr_mask m;            // with the transpose
    float *P;                // (n_head, nnz) attention probabilities
} e3_step;

static size_t nnz_ttt(int T, int k) {
    const size_t n = (size_t)sd_tr_ttt_rows(T, k);
    return n * (n + 1) / 2 + (size_t)k * n;
}

void sd_e3_sizes(const sd_head *h, int T_max, int K, size_t *nf, size_t *ni) {
    const sd_head_hp *hp = &h->hp;
    const size_t d = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, nff = (size_t)hp->n_ff, V = (size_t)hp->n_draft_vocab;
    const size_t n0 = (size_t)T_max - 1, R = (size_t)sd_tr_ttt_off(T_max, K), Tm = (size_t)T_max;
    size_t nnz = 0, keys = 0;
    for (int k = 0; k < K; k++) {
        nnz += nnz_ttt(T_max, k);
        keys += (size_t)sd_tr_ttt_off(T_max, k + 1) + 1;
    }
    const size_t slack = 64 * 16;   // the 16-float rounding of every buffer
    *nf = 4 * Tm * d + n0 * d + R * (d + 1) + R * 2 * d + 2 * R * qd + 2 * R * kvd + hp->n_head * nnz +
          R * (2 * d + 1) + 3 * R * nff + R * (d + 1) + 2 * R * d + n0 * V + R * d + 2 * R * kvd + 5 * n0 * d +
          3 * n0 * nff + 2 * n0 * qd + n0 * 2 * d + hp->n_head * nnz_ttt(T_max, 0) +
          (Tm + K) * (size_t)hp->head_dim + n0 + slack;
    *ni = R + (R + K) + 3 * nnz + keys + n0 + slack;
}

void sd_e3_carve(sd_trainer *tr, float *f, int32_t *i) {
    const sd_head_hp *hp = &tr->h->hp;
    const int T = tr->T_max, K = tr->K;
    const size_t d = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, nff = (size_t)hp->n_ff, V = (size_t)hp->n_draft_vocab;
    const size_t n0 = (size_t)T - 1, R = (size_t)sd_tr_ttt_off(T, K);
    size_t nnz = 0, keys = 0;
    for (int k = 0; k < K; k++) {
        nnz += nnz_ttt(T, k);
        keys += (size_t)sd_tr_ttt_off(T, k + 1) + 1;
    }
    e3_ws *w = &tr->e3;
    w->E = tr_take(&f, (size_t)T * d);
    w->En = tr_take(&f, (size_t)T * d);
    w->A = tr_take(&f, (size_t)T * d);
    w->dA = tr_take(&f, (size_t)T * d);
    w->G = tr_take(&f, n0 * d);
    w->Bn = tr_take(&f, R * d);
    w->rs_c = tr_take(&f, R);
    w->U = tr_take(&f, R * 2 * d);
    w->Q = tr_take(&f, R * qd);
    w->Kr = tr_take(&f, R * kvd);
    w->Vr = tr_take(&f, R * kvd);
    w->Oa = tr_take(&f, R * qd);
    w->P = tr_take(&f, (size_t)hp->n_head * nnz);
    w->Rr = tr_take(&f, R * d);
    w->rs_r = tr_take(&f, R);
    w->M = tr_take(&f, R * d);
    w->Gt = tr_take(&f, R * nff);
    w->Up = tr_take(&f, R * nff);
    w->S = tr_take(&f, R * nff);
    w->H = tr_take(&f, R * d);
    w->rs_h = tr_take(&f, R);
    w->Z = tr_take(&f, R * d);
    w->dZ = tr_take(&f, R * d);
    w->Lg = tr_take(&f, n0 * V);
    w->dH = tr_take(&f, R * d);
    w->dKr = tr_take(&f, R * kvd);
    w->dVr = tr_take(&f, R * kvd);
    w->dR = tr_take(&f, n0 * d);
    w->dM = tr_take(&f, n0 * d);
    w->dB = tr_take(&f, n0 * d);
    w->dC = tr_take(&f, n0 * d);
    w->dG = tr_take(&f, n0 * d);
    w->dS = tr_take(&f, n0 * nff);
    w->dGt = tr_take(&f, n0 * nff);
    w->dUp = tr_take(&f, n0 * nff);
    w->dOa = tr_take(&f, n0 * qd);
    w->dQ = tr_take(&f, n0 * qd);
    w->dU = tr_take(&f, n0 * 2 * d);
    w->dSc = tr_take(&f, (size_t)hp->n_head * nnz_ttt(T, 0));
    w->rope_cs = tr_take(&f, (size_t)(T + K) * hp->head_dim);
    w->loss_row = tr_take(&f, n0);
    w->pos = tr_take_i(&i, R);
    w->q_off = tr_take_i(&i, R + K);
    w->q_key = tr_take_i(&i, nnz);
    w->k_ent = tr_take_i(&i, nnz);
    w->k_q = tr_take_i(&i, nnz);
    w->k_off = tr_take_i(&i, keys);
    w->argmax = tr_take_i(&i, n0);
    sd_tr_rope_table(w->rope_cs, T + K, hp->head_dim, hp->rope_base);
}

// ---------------------------------------------------------------- forward

// Steps with rows for a sequence of T (at most K), their masks and places.
static int e3_layout(sd_trainer *tr, int T, e3_step *sp) {
    e3_ws *w = &tr->e3;
    const int K = SD_MIN(tr->K, T - 1);
    int32_t *qo = w->q_off, *qk = w->q_key, *ke = w->k_ent, *kq = w->k_q, *ko = w->k_off;
    float *P = w->P;
    for (int k = 0; k < K; k++) {
        e3_step *s = &sp[k];
        s->n = sd_tr_ttt_rows(T, k);
        s->o = sd_tr_ttt_off(T, k);
        s->nk = sd_tr_ttt_off(T, k + 1);
        s->q_off = qo;
        s->q_key = qk;
        s->nnz = sd_tr_mask_ttt(T, k, qo, qk);
        s->m = (sd_tr_mask){.n_q = s->n, .n_k = s->nk, .q_off = qo, .q_key = qk};
        sd_tr_mask_transpose(&s->m, ko, ke, kq);
        s->P = P;
        for (int r = 0; r < s->n; r++) w->pos[s->o + r] = r + 1 + k;
        qo += s->n + 1;
        qk += s->nnz;
        ke += s->nnz;
        kq += s->nnz;
        ko += s->nk + 1;
        P += (size_t)tr->h->hp.n_head * s->nnz;
    }
    return K;
}

// a = n(E[x_p]) * attn_norm for p = 1..T-1.
static int e3_embed(sd_trainer *tr, const sd_train_seq *seq, char *err, size_t errlen) {
    e3_ws *w = &tr->e3;
    const sd_head *h = tr->h;
    const int d = h->hp.n_embd, T = seq->T;
    for (int p = 1; p < T; p++)
        if (sd_model_token_embd(tr->target, seq->tokens[p], w->E + (size_t)p * d, err, errlen) < 0) return -1;
    sd_tr_rmsnorm(T - 1, d, w->E + d, NULL, h->hp.rms_eps, w->En + d, w->rs_c);   // rs_c: scratch here
    memcpy(w->A + d, w->En + d, sizeof(float) * (size_t)(T - 1) * d);
    const float *g = sd_head_w(h, SD_E3_ATTN_NORM);
    for (int p = 1; p < T; p++)
        for (int i = 0; i < d; i++) w->A[(size_t)p * d + i] *= g[i];
    return 0;
}

// Step k's forward up to the loss; with grad, the output layer's backward
// too (dZ of its rows, dWout). Returns the step's weighted loss.
static double e3_step_fwd(sd_trainer *tr, const sd_train_seq *seq, const e3_step *s, int k, float *grad,
                          sd_train_stats *st) {
    e3_ws *w = &tr->e3;
    const sd_head *h = tr->h;
    const sd_head_hp *hp = &h->hp;
    const sd_tr_ctx *cx = &tr->ctx;
    const int d = hp->n_embd, nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim, nff = hp->n_ff;
    const int qd = nh * hd, kvd = nkv * hd, V = hp->n_draft_vocab, n = s->n, o = s->o;
    const float eps = hp->rms_eps;
    const float *C = k == 0 ? w->G : w->H + (size_t)(s->o - sd_tr_ttt_rows(seq->T, k - 1)) * d;
    float *Bn = w->Bn + (size_t)o * d, *U = w->U + (size_t)o * 2 * d, *Q = w->Q + (size_t)o * qd;
    float *Kr = w->Kr + (size_t)o * kvd, *Vr = w->Vr + (size_t)o * kvd, *Oa = w->Oa + (size_t)o * qd;
    float *Rr = w->Rr + (size_t)o * d, *M = w->M + (size_t)o * d, *H = w->H + (size_t)o * d, *Z = w->Z + (size_t)o * d;
    float *Gt = w->Gt + (size_t)o * nff, *Up = w->Up + (size_t)o * nff, *S = w->S + (size_t)o * nff;
    const int32_t *pos = w->pos + o;

    sd_tr_rmsnorm(n, d, C, sd_head_w(h, SD_E3_HIDDEN_NORM), eps, Bn, w->rs_c + o);
    for (int r = 0; r < n; r++) {
        memcpy(U + (size_t)r * 2 * d, w->A + (size_t)(r + 1 + k) * d, sizeof(float) * d);
        memcpy(U + (size_t)r * 2 * d + d, Bn + (size_t)r * d, sizeof(float) * d);
    }
    sd_tr_linear(cx, n, 2 * d, qd, U, sd_head_w(h, SD_E3_WQ), Q, 0);
    sd_tr_linear(cx, n, 2 * d, kvd, U, sd_head_w(h, SD_E3_WK), Kr, 0);
    sd_tr_linear(cx, n, 2 * d, kvd, U, sd_head_w(h, SD_E3_WV), Vr, 0);
    sd_tr_rope(n, nh, hd, pos, w->rope_cs, Q, 0, 0);
    sd_tr_rope(n, nkv, hd, pos, w->rope_cs, Kr, 0, 0);
    sd_tr_attn(cx, &s->m, nh, nkv, hd, Q, w->Kr, w->Vr, Oa, s->P);
    sd_tr_linear(cx, n, qd, d, Oa, sd_head_w(h, SD_E3_WO), Rr, 0);
    sd_tr_acc((size_t)n * d, hp->norm_before_residual ? Bn : C, Rr);
    sd_tr_rmsnorm(n, d, Rr, sd_head_w(h, SD_E3_FFN_NORM), eps, M, w->rs_r + o);
    sd_tr_linear(cx, n, d, nff, M, sd_head_w(h, SD_E3_GATE), Gt, 0);
    sd_tr_linear(cx, n, d, nff, M, sd_head_w(h, SD_E3_UP), Up, 0);
    sd_tr_swiglu((size_t)n * nff, Gt, Up, S);
    memcpy(H, Rr, sizeof(float) * (size_t)n * d);
    sd_tr_linear(cx, n, nff, d, S, sd_head_w(h, SD_E3_DOWN), H, 1);
    sd_tr_rmsnorm(n, d, H, sd_head_w(h, SD_E3_OUT_NORM), eps, Z, w->rs_h + o);
    sd_tr_linear(cx, n, d, V, Z, sd_head_w(h, SD_E3_OUT), w->Lg, 0);

    // Row r's target is the distribution at p = r + 1 + k.
    const int nt = seq->topk;
    int n_sc = 0;
    for (int r = 0; r < n; r++) n_sc += tr->scored[r + 1 + k];
    const double wk = pow(0.8, k);
    const float wg = n_sc ? (float)((tr->fault == SD_TR_FAULT_NO_WEIGHT ? 1.0 : wk) / n_sc) : 0.0f;
    const double sum = sd_tr_softxent(cx, n, V, w->Lg, tr->tid + (size_t)(1 + k) * nt, tr->tp + (size_t)(1 + k) * nt,
                                      nt, wg, grad ? w->Lg : NULL, w->loss_row, w->argmax, NULL);
    if (st && k < SD_HEAD_MAX_MEDUSA)
        for (int r = 0; r < n; r++)
            if (tr->scored[r + 1 + k]) {
                st->n[k]++;
                st->agree[k] += h->d2t[w->argmax[r]] == seq->top_ids[(size_t)(r + 1 + k) * nt];
            }
    if (grad && n_sc) {
        float *dZ = w->dZ + (size_t)o * d;
        memset(dZ, 0, sizeof(float) * (size_t)n * d);
        sd_tr_linear_dx(cx, n, d, V, w->Lg, sd_head_w(h, SD_E3_OUT), dZ);
        sd_tr_linear_dw(cx, n, d, V, w->Lg, Z, grad + h->t[SD_E3_OUT].off);
    } else if (grad) {
        memset(w->dZ + (size_t)o * d, 0, sizeof(float) * (size_t)n * d);
    }
    return n_sc ? wk * sum / n_sc : 0.0;
}

// ---------------------------------------------------------------- backward

// Step k's backward, from dZ (its rows) and dH (its rows: what step k+1's
// states passed back): the layer's parameter gradients, the gradients of
// the keys and values this step's queries read (dKr, dVr of steps 0..k),
// dA at its positions, and the gradient of its state c (into step k-1's
// dH, or dG for step 0).
static void e3_step_bwd(sd_trainer *tr, const sd_train_seq *seq, const e3_step *s, int k, float *grad) {
    e3_ws *w = &tr->e3;
    const sd_head *h = tr->h;
    const sd_head_hp *hp = &h->hp;
    const sd_tr_ctx *cx = &tr->ctx;
    const int d = hp->n_embd, nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim, nff = hp->n_ff;
    const int qd = nh * hd, kvd = nkv * hd, n = s->n, o = s->o;
    const size_t nd = (size_t)n * d;
    const int prev = k == 0 ? 0 : s->o - sd_tr_ttt_rows(seq->T, k - 1);   // step k-1's first row
    const float *C = k == 0 ? w->G : w->H + (size_t)prev * d;
    const float *U = w->U + (size_t)o * 2 * d, *Oa = w->Oa + (size_t)o * qd, *Rr = w->Rr + (size_t)o * d;
    const float *M = w->M + (size_t)o * d, *H = w->H + (size_t)o * d;
    const float *Gt = w->Gt + (size_t)o * nff, *Up = w->Up + (size_t)o * nff, *S = w->S + (size_t)o * nff;
    float *dH = w->dH + (size_t)o * d, *dKr = w->dKr + (size_t)o * kvd, *dVr = w->dVr + (size_t)o * kvd;
#define GW(i) (grad + h->t[i].off)

    // z = n(h) * output_norm
    sd_tr_rmsnorm_bwd(n, d, H, sd_head_w(h, SD_E3_OUT_NORM), w->rs_h + o, w->dZ + (size_t)o * d, dH,
                      GW(SD_E3_OUT_NORM));
    // h = r + Wdown s, s = silu(Wgate m) * (Wup m), m = n(r) * ffn_norm
    memcpy(w->dR, dH, sizeof(float) * nd);
    memset(w->dS, 0, sizeof(float) * (size_t)n * nff);
    sd_tr_linear_dx(cx, n, nff, d, dH, sd_head_w(h, SD_E3_DOWN), w->dS);
    sd_tr_linear_dw(cx, n, nff, d, dH, S, GW(SD_E3_DOWN));
    sd_tr_swiglu_bwd((size_t)n * nff, Gt, Up, w->dS, w->dGt, w->dUp);
    memset(w->dM, 0, sizeof(float) * nd);
    sd_tr_linear_dx(cx, n, d, nff, w->dGt, sd_head_w(h, SD_E3_GATE), w->dM);
    sd_tr_linear_dx(cx, n, d, nff, w->dUp, sd_head_w(h, SD_E3_UP), w->dM);
    sd_tr_linear_dw(cx, n, d, nff, w->dGt, M, GW(SD_E3_GATE));
    sd_tr_linear_dw(cx, n, d, nff, w->dUp, M, GW(SD_E3_UP));
    sd_tr_rmsnorm_bwd(n, d, Rr, sd_head_w(h, SD_E3_FFN_NORM), w->rs_r + o, w->dM, w->dR, GW(SD_E3_FFN_NORM));
    // r = residual + Wo o
    memset(w->dOa, 0, sizeof(float) * (size_t)n * qd);
    sd_tr_linear_dx(cx, n, qd, d, w->dR, sd_head_w(h, SD_E3_WO), w->dOa);
    sd_tr_linear_dw(cx, n, qd, d, w->dR, Oa, GW(SD_E3_WO));
    memset(w->dB, 0, sizeof(float) * nd);
    memset(w->dC, 0, sizeof(float) * nd);
    if (tr->fault != SD_TR_FAULT_NO_RESID) memcpy(hp->norm_before_residual ? w->dB : w->dC, w->dR, sizeof(float) * nd);
    // o = attention(q; keys and values of steps 0..k)
    sd_tr_attn_bwd(cx, &s->m, nh, nkv, hd, w->Q + (size_t)o * qd, w->Kr, w->Vr, s->P, w->dOa, w->dQ, w->dKr, w->dVr,
                   w->dSc);
    // RoPE; this step's keys have all their gradient now (later steps ran first).
    sd_tr_rope(n, nh, hd, w->pos + o, w->rope_cs, w->dQ, 1, 0);
    sd_tr_rope(n, nkv, hd, w->pos + o, w->rope_cs, dKr, 1, 0);
    // q, k, v = Wq u, Wk u, Wv u
    memset(w->dU, 0, sizeof(float) * nd * 2);
    sd_tr_linear_dx(cx, n, 2 * d, qd, w->dQ, sd_head_w(h, SD_E3_WQ), w->dU);
    sd_tr_linear_dx(cx, n, 2 * d, kvd, dKr, sd_head_w(h, SD_E3_WK), w->dU);
    sd_tr_linear_dx(cx, n, 2 * d, kvd, dVr, sd_head_w(h, SD_E3_WV), w->dU);
    sd_tr_linear_dw(cx, n, 2 * d, qd, w->dQ, U, GW(SD_E3_WQ));
    sd_tr_linear_dw(cx, n, 2 * d, kvd, dKr, U, GW(SD_E3_WK));
    sd_tr_linear_dw(cx, n, 2 * d, kvd, dVr, U, GW(SD_E3_WV));
    // u = [a; b]
    for (int r = 0; r < n; r++) {
        sd_tr_acc((size_t)d, w->dU + (size_t)r * 2 * d, w->dA + (size_t)(r + 1 + k) * d);
        sd_tr_acc((size_t)d, w->dU + (size_t)r * 2 * d + d, w->dB + (size_t)r * d);
    }
    // b = n(c) * hidden_norm
    sd_tr_rmsnorm_bwd(n, d, C, sd_head_w(h, SD_E3_HIDDEN_NORM), w->rs_c + o, w->dB, w->dC, GW(SD_E3_HIDDEN_NORM));
    if (k > 0)
        sd_tr_acc(nd, w->dC, w->dH + (size_t)prev * d);
    else
        memcpy(w->dG, w->dC, sizeof(float) * nd);
#undef GW
}

double sd_e3_loss(sd_trainer *tr, const sd_train_seq *seq, float *grad, sd_train_stats *st, char *err,
                  size_t errlen) {
    e3_ws *w = &tr->e3;
    const sd_head *h = tr->h;
    const sd_head_hp *hp = &h->hp;
    const int d = hp->n_embd, T = seq->T, n0 = T - 1, kvd = hp->n_head_kv * hp->head_dim;
    e3_step sp[SD_HEAD_MAX_MEDUSA];
    const int K = e3_layout(tr, T, sp);
    if (e3_embed(tr, seq, err, errlen) < 0) return -1;
    // g_{j-1} for j = 1..T-1: the states of positions 0..T-2.
    sd_tr_linear(&tr->ctx, n0, 3 * d, d, seq->feats, sd_head_w(h, SD_E3_FC), w->G, 0);
    double loss = 0;
    for (int k = 0; k < K; k++) loss += e3_step_fwd(tr, seq, &sp[k], k, grad, st);
    if (!grad) return loss;

    const size_t R = (size_t)sd_tr_ttt_off(T, K);
    memset(w->dH, 0, sizeof(float) * R * d);
    memset(w->dKr, 0, sizeof(float) * R * kvd);
    memset(w->dVr, 0, sizeof(float) * R * kvd);
    memset(w->dA, 0, sizeof(float) * (size_t)T * d);
    for (int k = K - 1; k >= 0; k--) e3_step_bwd(tr, seq, &sp[k], k, grad);
    // g = fc [s_l0; s_l1; s_l2]; a = n(E) * attn_norm (E frozen).
    sd_tr_linear_dw(&tr->ctx, n0, 3 * d, d, w->dG, seq->feats, grad + h->t[SD_E3_FC].off);
    float *dg = grad + h->t[SD_E3_ATTN_NORM].off;
    for (int p = 1; p < T; p++)
        for (int i = 0; i < d; i++) dg[i] += w->dA[(size_t)p * d + i] * w->En[(size_t)p * d + i];
    return loss;
}
