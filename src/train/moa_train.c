// moa_train.c - the loss of an MoA drafter on one sequence and its gradient
// (docs/moa.md, "Training"): forward layer by layer, backward in reverse.
//
// Rows. Position i of a sequence of T (token x_i, label: the target's
// distribution of x_{i+1}, rows 0..T-2 scored) belongs to the block that
// starts at its last verified point r_i = k floor(i/k) (k: sd_moa_block).
// Every row is one drafting step as inference runs it: SA sees the rows
// r_i..i (the tree root r_i and the drafted tokens after it; sa_full: 0..i,
// the whole text, for the sequences its curriculum draws), CA the LSA
// outputs of positions 0..r_i-1 (the verified text), and a TLI layer the
// target's own K,V rows of positions 0..r_i-1 and its predicted rows
// r_i..i.
//
// Forward (shapes per row; n(.) RMSNorm; every layer pre-norm, SwiGLU):
//   LSA   (T L rows of Ekv): Z = Layer_lsa(KV) (RoPE by layer index, each
//         position's L rows see each other); m = mean_l Z; c = P m + b  (E)
//         (no-LSA: m = mean_l KV)
//         (ca_hidden: c += H h/rms(h), h the target's state entering layer L-N, TLI 0 its final normed state)
//   SA    s = Layer_sa(emb(x) [sa_hidden: + G s h_v/rms(h_v), v = r_i - 1 the last verified position,
//         s = sd_moa_sa_scale])   (E)
//   CA    y = s + Wo attn(q = rope(Wq n(s)), k = rope(Wk n(c)), v = Wv n(c)); y += FFN(y)   (E)
//   TLI   y = TargetLayer_t(y) for the last N target layers (frozen)
//   z = n(y) * g_out (target's);  logits = W_out z (the draft vocabulary's rows, frozen)
//   loss = 0.1 CE(logits, P_i) + SL1(z, z_target) [N > 0: 0.5 SL1(z, z_t) + 0.5 SL1(y_ca, h_{L-N})]
// each term averaged over the rows (CE over the scored ones), SL1 = SmoothL1
// (beta 1) averaged over the E dimensions.
#include "train/moa_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/moa.h"
#include "model/model.h"
#include "specdec_train.h"
#include "train/train_impl.h"

enum { SELF = 0, CROSS, TLI };

// A decoder layer's weights; gradients NULL when frozen (the target's).
typedef struct lw {
    const float *an, *wq, *wk, *wv, *wo, *fn, *wg, *wu, *wd, *bq, *bk, *bv;
    float *g[SD_MOA_PER_LAYER];   // gradient of each tensor (SD_MOA_* order), or NULL
    int w, nh, nkv, hd, nff;
    int neox;                     // RoPE pairs (i, i + hd/2): a NEOX target's TLI layer
} lw;

// One layer instance's saved activations and mask.
typedef struct la {
    int nq, nk, mode;
    float *A, *rsA;          // (nq, w), (nq) n(x) * an
    float *Ck, *rsC;         // CROSS: (nk, w), (nk) n(kv input) * an
    float *Q, *K, *V, *O;    // (nq, qd), (nk, kd) x2, (nq, qd)
    float *X1, *B, *rsB;     // (nq, w) x2, (nq)
    float *G, *U, *S;        // (nq, nff)
    float *Y;                // (nq, w) output
    float *P;                // (nh, nnz)
    int32_t *q_off, *q_key, *k_off, *k_ent, *k_q, *qpos, *kpos;
    int nnz, cap;            // mask entries: in use, carved
    sd_tr_mask m;
    const float *cs;         // its RoPE table
} la;

struct sd_moa_tr {
    const sd_head *h;
    const sd_model *m;
    int T_max, E, L, ekv, N, V;
    lw sa, ca, lsa, *tl;     // tl: (N) frozen target layers
    la a_sa, a_ca, a_lsa, *a_tl;
    float *tw;               // the target weights' floats (TLI layers, output rows, norm)
    const float *out_norm, *out_w;   // (E), (V, E)
    float *cs_sa, *cs_lsa, *cs_t;    // RoPE tables
    int cs_t_pos0;                   // cs_t covers the target positions cs_t_pos0 .. + T_max - 1
    int kmin, kmax;                  // the block length's range (sd_moa_block)
    float sa_p;                      // sa_full: the share of sequences whose SA sees the whole text
    uint64_t sa_salt;                //   (sd_moa_sa_full_draw's salt)
    float sa_scale;                  // sa_hidden: sd_moa_sa_scale of the target
    // loss and LSA output
    float *X0, *M, *C, *Hn, *Hsel, *Emb, *Z, *rsZ, *Lg, *loss_row;   // Hn: the scaled states; Hsel: sa_hidden's
    int32_t *argmax;
    // backward scratch (rows up to T_max L)
    float *dY, *dX, *dX1, *dB, *dS, *dG, *dU, *dO, *dQ, *dK, *dV, *dA, *dCk, *dSc, *dC, *dM, *dZ, *dKV;
    float *arena;
    int32_t *iarena;
};

// Floats of a position's K,V part: every layer's rows, or (no LSA) their
// mean and the TLI layers' rows.
static int kv_feat(const sd_head *h) {
    return (h->hp.moa_no_lsa ? 1 + h->hp.moa_tli : h->hp.target_n_layer) * h->hp.moa_kv_width;
}

int sd_moa_n_feat(const sd_head *h) { return kv_feat(h) + 2 * h->hp.n_embd; }

void sd_moa_reduced_add(float *row, int l, int L, int N, int kvd, const float *k, const float *v) {
    for (int j = 0; j < kvd; j++) row[j] += k[j] / (float)L, row[kvd + j] += v[j] / (float)L;
    if (l < L - N) return;
    float *t = row + (size_t)(1 + l - (L - N)) * 2 * kvd;
    memcpy(t, k, sizeof(float) * (size_t)kvd);
    memcpy(t + kvd, v, sizeof(float) * (size_t)kvd);
}

int sd_moa_block(const int32_t *tokens, int T, int kmin, int kmax) {
    uint64_t x = 1469598103934665603ull;
    for (int i = 0; i < T; i++) x = (x ^ (uint32_t)tokens[i]) * 1099511628211ull;
    x ^= x >> 31;
    return kmin + (int)(x % (uint64_t)(kmax - kmin + 1));
}

int sd_moa_sa_full_draw(const int32_t *tokens, int T, uint64_t salt, float p) {
    if (p >= 1.0f) return 1;
    if (!(p > 0.0f)) return 0;
    uint64_t x = 1469598103934665603ull;
    for (int i = 0; i < T; i++) x = (x ^ (uint32_t)tokens[i]) * 1099511628211ull;
    x ^= salt;   // splitmix64's finaliser
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0) < (double)p;
}

void sd_moa_tr_set_sa_full(sd_moa_tr *w, float p, uint64_t salt) {
    w->sa_p = p;
    w->sa_salt = salt;
}

void sd_moa_tr_set_block(sd_moa_tr *w, int kmin, int kmax) {
    SD_ASSERT(kmin >= 1 && kmax >= kmin && kmax <= SD_TRAIN_MOA_MAX_BLOCK);
    w->kmin = kmin;
    w->kmax = kmax;
}

// ---------------------------------------------------------------- workspace

// Carves n floats (or ints) off *p; with *p NULL, counts them in *cnt.
static float *take(float **p, size_t *cnt, size_t n) {
    n = (n + 15) / 16 * 16;
    *cnt += n;
    if (!*p) return NULL;
    float *r = *p;
    *p += n;
    return r;
}
static int32_t *take_i(int32_t **p, size_t *cnt, size_t n) {
    n = (n + 15) / 16 * 16;
    *cnt += n;
    if (!*p) return NULL;
    int32_t *r = *p;
    *p += n;
    return r;
}

static void carve_la(la *a, const lw *W, int nq, int nk, int nnz, int mode, float **f, size_t *nf, int32_t **ip,
                     size_t *ni) {
    const size_t qd = (size_t)W->nh * W->hd, kd = (size_t)W->nkv * W->hd, w = (size_t)W->w;
    a->nq = nq, a->nk = nk, a->mode = mode, a->cap = nnz;
    a->A = take(f, nf, (size_t)nq * w);
    a->rsA = take(f, nf, (size_t)nq);
    a->Ck = mode == CROSS ? take(f, nf, (size_t)nk * w) : NULL;
    a->rsC = mode == CROSS ? take(f, nf, (size_t)nk) : NULL;
    a->Q = take(f, nf, (size_t)nq * qd);
    a->K = take(f, nf, (size_t)nk * kd);
    a->V = take(f, nf, (size_t)nk * kd);
    a->O = take(f, nf, (size_t)nq * qd);
    a->X1 = take(f, nf, (size_t)nq * w);
    a->B = take(f, nf, (size_t)nq * w);
    a->rsB = take(f, nf, (size_t)nq);
    a->G = take(f, nf, (size_t)nq * W->nff);
    a->U = take(f, nf, (size_t)nq * W->nff);
    a->S = take(f, nf, (size_t)nq * W->nff);
    a->Y = take(f, nf, (size_t)nq * w);
    a->P = take(f, nf, (size_t)W->nh * nnz);
    a->q_off = take_i(ip, ni, (size_t)nq + 1);
    a->q_key = take_i(ip, ni, (size_t)nnz);
    a->k_off = take_i(ip, ni, (size_t)nk + 1);
    a->k_ent = take_i(ip, ni, (size_t)nnz);
    a->k_q = take_i(ip, ni, (size_t)nnz);
    a->qpos = take_i(ip, ni, (size_t)nq);
    a->kpos = take_i(ip, ni, (size_t)nk);
}

static void carve(sd_moa_tr *w, float *f, int32_t *ip, size_t *nf, size_t *ni) {
    const int T = w->T_max, L = w->L, E = w->E, ekv = w->ekv;
    // SA: a row sees its block up to itself, at most (k + 1) / 2 entries a row on average
    // (sa_full: the whole text up to itself); TLI's rows: CA's plus the block's
    const size_t TL = (size_t)T * L, nblk = (size_t)T * ((SD_TRAIN_MOA_MAX_BLOCK + 1) / 2 + 1),
                 nca = (size_t)T * (T + 1) / 2, nsa = w->h->hp.moa_sa_full ? nca : nblk;
    const size_t TLx = w->h->hp.moa_no_lsa ? 0 : TL;   // LSA's rows (none without it)
    *nf = *ni = 0;
    carve_la(&w->a_sa, &w->sa, T, T, (int)nsa, SELF, &f, nf, &ip, ni);
    carve_la(&w->a_ca, &w->ca, T, T, (int)nca, CROSS, &f, nf, &ip, ni);
    if (!w->h->hp.moa_no_lsa) carve_la(&w->a_lsa, &w->lsa, (int)TL, (int)TL, (int)(TL * L), SELF, &f, nf, &ip, ni);
    for (int t = 0; t < w->N; t++) carve_la(&w->a_tl[t], &w->tl[t], T, 2 * T, (int)(nca + nblk), TLI, &f, nf, &ip, ni);
    size_t wmax = (size_t)SD_MAX(E, ekv), qmax = wmax, ffmax = (size_t)SD_MAX(w->sa.nff, w->lsa.nff);
    qmax = SD_MAX(qmax, (size_t)w->sa.nh * w->sa.hd);
    // (the attention backward's scratch: one layer's mask entries times its heads)
    size_t pmax = SD_MAX(SD_MAX(nca, nsa), TLx * L) * (size_t)SD_MAX(w->sa.nh, SD_MAX(w->lsa.nh, 1));
    for (int t = 0; t < w->N; t++) {
        ffmax = SD_MAX(ffmax, (size_t)w->tl[t].nff);
        qmax = SD_MAX(qmax, (size_t)w->tl[t].nh * w->tl[t].hd);
        pmax = SD_MAX(pmax, (nca + nblk) * (size_t)w->tl[t].nh);
    }
    const size_t R = SD_MAX(TLx, 2 * (size_t)T);
    w->X0 = w->h->hp.moa_no_lsa ? NULL : take(&f, nf, TL * ekv);   // LSA's input
    w->M = take(&f, nf, (size_t)T * ekv);
    w->C = take(&f, nf, (size_t)T * E);
    w->Hn = sd_moa_reads_states(&w->h->hp) ? take(&f, nf, (size_t)T * E) : NULL;
    w->Hsel = w->h->hp.moa_sa_hidden ? take(&f, nf, (size_t)T * E) : NULL;
    w->Emb = take(&f, nf, (size_t)T * E);
    w->Z = take(&f, nf, (size_t)T * E);
    w->rsZ = take(&f, nf, (size_t)T);
    w->Lg = take(&f, nf, (size_t)T * w->V);
    w->loss_row = take(&f, nf, (size_t)T);
    w->argmax = take_i(&ip, ni, (size_t)T);
    float **sc[] = {&w->dY, &w->dX, &w->dX1, &w->dB, &w->dO, &w->dQ, &w->dK, &w->dV, &w->dA, &w->dCk};
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) *sc[i] = take(&f, nf, R * SD_MAX(wmax, qmax));
    w->dS = take(&f, nf, R * ffmax);
    w->dG = take(&f, nf, R * ffmax);
    w->dU = take(&f, nf, R * ffmax);
    w->dSc = take(&f, nf, pmax);
    w->dC = take(&f, nf, (size_t)T * E);
    w->dM = take(&f, nf, (size_t)T * ekv);
    w->dZ = take(&f, nf, (size_t)T * E);
    w->dKV = take(&f, nf, SD_MAX(TLx * ekv, (size_t)T * E));
    const int hd_max = SD_MAX(w->sa.hd, w->lsa.hd);
    w->cs_sa = take(&f, nf, (size_t)T * w->sa.hd);
    w->cs_lsa = take(&f, nf, (size_t)L * SD_MAX(hd_max, 2));
    w->cs_t = take(&f, nf, (size_t)T * (w->N ? w->tl[0].hd : 2));
}

static void lw_head(lw *W, const sd_head *h, int base, int w, int nh, int nkv, int hd, int nff) {
    W->an = sd_head_w(h, base + SD_MOA_ATTN_NORM), W->wq = sd_head_w(h, base + SD_MOA_Q);
    W->wk = sd_head_w(h, base + SD_MOA_K), W->wv = sd_head_w(h, base + SD_MOA_V);
    W->wo = sd_head_w(h, base + SD_MOA_O), W->fn = sd_head_w(h, base + SD_MOA_FFN_NORM);
    W->wg = sd_head_w(h, base + SD_MOA_GATE), W->wu = sd_head_w(h, base + SD_MOA_UP);
    W->wd = sd_head_w(h, base + SD_MOA_DOWN);
    W->bq = W->bk = W->bv = NULL;
    W->w = w, W->nh = nh, W->nkv = nkv, W->hd = hd, W->nff = nff;
}

void sd_moa_tr_free(sd_moa_tr *w) {
    if (!w) return;
    free(w->tl);
    free(w->a_tl);
    free(w->tw);
    free(w->arena);
    free(w->iarena);
    free(w);
}

// The frozen target weights: the last N layers, the output rows and norm, as floats in w->tw.
static int target_weights(sd_moa_tr *w, char *err, size_t errlen) {
    const sd_model *m = w->m;
    const sd_hparams *hp = &m->hp;
    const size_t E = (size_t)w->E, qd = (size_t)hp->n_head * hp->head_dim, kd = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t per = 2 * E + 2 * qd * E + 2 * kd * E + 3 * E * (size_t)hp->n_ff + qd + 2 * kd;
    w->tw = malloc(sizeof(float) * (per * (size_t)w->N + E + (size_t)w->V * E));
    if (!w->tw) return sd_err(err, errlen, "moa trainer: out of memory for the target's layers");
    float *p = w->tw;
    for (int t = 0; t < w->N; t++) {
        const sd_layer *ly = &m->layers[w->L - w->N + t];
        lw *W = &w->tl[t];
        memset(W, 0, sizeof *W);
        W->w = (int)E, W->nh = hp->n_head, W->nkv = hp->n_head_kv, W->hd = hp->head_dim, W->nff = hp->n_ff;
        W->neox = hp->rope_type == SD_ROPE_NEOX;
        const sd_tensor *ts[] = {ly->attn_norm, ly->wq, ly->wk, ly->wv, ly->wo, ly->ffn_norm, ly->w_gate, ly->w_up,
                                 ly->w_down, ly->bq, ly->bk, ly->bv};
        const float **dst[] = {&W->an, &W->wq, &W->wk, &W->wv, &W->wo, &W->fn, &W->wg, &W->wu, &W->wd,
                               &W->bq, &W->bk, &W->bv};
        const size_t n[] = {E, qd * E, kd * E, kd * E, qd * E, E, E * hp->n_ff, E * hp->n_ff, E * hp->n_ff, qd, kd, kd};
        for (int i = 0; i < 12; i++) {
            if (!ts[i]) continue;
            if (sd_moa_dequant(m, ts[i], NULL, 0, p, err, errlen) < 0) return -1;
            *dst[i] = p;
            p += n[i];
        }
    }
    if (sd_moa_dequant(m, m->out_norm, NULL, 0, p, err, errlen) < 0) return -1;
    w->out_norm = p;
    p += E;
    if (sd_moa_dequant(m, m->output, w->h->d2t, w->V, p, err, errlen) < 0) return -1;
    w->out_w = p;
    return 0;
}

int sd_moa_tr_new(sd_moa_tr **out, const sd_head *h, const sd_model *target, int T_max, char *err, size_t errlen) {
    *out = NULL;
    const sd_head_hp *hp = &h->hp;
    if (!target) return sd_err(err, errlen, "moa trainer: the target is needed (embeddings, output, TLI layers)");
    if (sd_head_check_target(h, target, err, errlen) < 0) return -1;
    if (hp->moa_tli >= target->hp.n_layer)
        return sd_err(err, errlen, "moa trainer: TLI %d must leave a target layer before it (the target has %d)",
                      hp->moa_tli, target->hp.n_layer);
    if (hp->moa_tli > 0 && (target->hp.n_rot != target->hp.head_dim || target->hp.rope_scale != 1.0f))
        return sd_err(err, errlen, "moa trainer: TLI > 0 needs a target whose RoPE turns whole heads without "
                      "scaling (this one: %d of %d dims, scale %g); train with TLI 0", target->hp.n_rot,
                      target->hp.head_dim, (double)target->hp.rope_scale);
    sd_moa_tr *w = calloc(1, sizeof *w);
    if (!w) return sd_err(err, errlen, "moa trainer: out of memory");
    w->kmin = SD_MOA_BLOCK_MIN, w->kmax = SD_MOA_BLOCK_MAX;
    w->sa_scale = hp->moa_sa_hidden ? sd_moa_sa_scale(target) : 0.0f;
    w->h = h, w->m = target, w->T_max = T_max;
    w->E = hp->n_embd, w->L = target->hp.n_layer, w->ekv = hp->moa_kv_width, w->N = hp->moa_tli;
    w->V = hp->n_draft_vocab;
    lw_head(&w->sa, h, SD_MOA_SA, w->E, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff);
    lw_head(&w->ca, h, SD_MOA_CA, w->E, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff);
    if (!hp->moa_no_lsa)
        lw_head(&w->lsa, h, SD_MOA_LSA, w->ekv, hp->moa_lsa_n_head, hp->moa_lsa_n_head_kv, hp->moa_lsa_head_dim,
                hp->moa_lsa_n_ff);
    w->tl = calloc((size_t)SD_MAX(w->N, 1), sizeof *w->tl);
    w->a_tl = calloc((size_t)SD_MAX(w->N, 1), sizeof *w->a_tl);
    if (!w->tl || !w->a_tl || target_weights(w, err, errlen) < 0) {
        sd_moa_tr_free(w);
        return err && *err ? -1 : sd_err(err, errlen, "moa trainer: out of memory");
    }
    size_t nf, ni;
    carve(w, NULL, NULL, &nf, &ni);
    w->arena = aligned_alloc(64, (nf * sizeof(float) + 63) / 64 * 64);
    w->iarena = aligned_alloc(64, (ni * sizeof(int32_t) + 63) / 64 * 64);
    if (!w->arena || !w->iarena) {
        sd_moa_tr_free(w);
        return sd_err(err, errlen, "moa trainer: out of memory for a workspace of %.0f MiB (T_max %d)",
                      (double)(nf + ni) * 4 / (1 << 20), T_max);
    }
    memset(w->arena, 0, nf * sizeof(float));
    carve(w, w->arena, w->iarena, &nf, &ni);
    sd_tr_rope_table(w->cs_sa, T_max, hp->head_dim, hp->rope_base);
    if (!hp->moa_no_lsa) sd_tr_rope_table(w->cs_lsa, w->L, hp->moa_lsa_head_dim, 10000.0f);
    if (w->N > 0) sd_tr_rope_table_at(w->cs_t, 0, T_max, target->hp.head_dim, target->hp.rope_base);
    *out = w;
    return 0;
}

// ---------------------------------------------------------------- one layer

static void add_bias(float *Y, const float *b, int n, int d) {
    if (b)
        for (int i = 0; i < n; i++) sd_tr_acc((size_t)d, b, Y + (size_t)i * d);
}

static void bias_grad(float *g, const float *dY, int n, int d) {
    if (g)
        for (int i = 0; i < n; i++) sd_tr_acc((size_t)d, dY + (size_t)i * d, g);
}

// Forward of a layer over X (nq, w). CROSS: K,V from n(Xkv) (nk rows);
// TLI: K,V rows 0..nq-1 are the target's (the caller wrote them), rows nq.. from A.
static void la_fwd(const sd_tr_ctx *cx, const lw *W, la *a, const float *X, const float *Xkv, float eps) {
    const int nq = a->nq, w = W->w, qd = W->nh * W->hd, kd = W->nkv * W->hd;
    sd_tr_rmsnorm(nq, w, X, W->an, eps, a->A, a->rsA);
    sd_tr_linear(cx, nq, w, qd, a->A, W->wq, a->Q, 0);
    add_bias(a->Q, W->bq, nq, qd);
    float *K = a->K, *V = a->V;
    const float *kin = a->A;
    int nkin = nq;
    if (a->mode == CROSS) {
        sd_tr_rmsnorm(a->nk, w, Xkv, W->an, eps, a->Ck, a->rsC);
        kin = a->Ck, nkin = a->nk;
    } else if (a->mode == TLI) {
        K += (size_t)nq * kd, V += (size_t)nq * kd;
    }
    sd_tr_linear(cx, nkin, w, kd, kin, W->wk, K, 0);
    sd_tr_linear(cx, nkin, w, kd, kin, W->wv, V, 0);
    add_bias(K, W->bk, nkin, kd);
    add_bias(V, W->bv, nkin, kd);
    sd_tr_rope(nq, W->nh, W->hd, a->qpos, a->cs, a->Q, 0, W->neox);
    sd_tr_rope(nkin, W->nkv, W->hd, a->mode == TLI ? a->kpos + nq : a->kpos, a->cs, K, 0, W->neox);
    sd_tr_attn(cx, &a->m, W->nh, W->nkv, W->hd, a->Q, a->K, a->V, a->O, a->P);
    memcpy(a->X1, X, sizeof(float) * (size_t)nq * w);
    sd_tr_linear(cx, nq, qd, w, a->O, W->wo, a->X1, 1);
    sd_tr_rmsnorm(nq, w, a->X1, W->fn, eps, a->B, a->rsB);
    sd_tr_linear(cx, nq, w, W->nff, a->B, W->wg, a->G, 0);
    sd_tr_linear(cx, nq, w, W->nff, a->B, W->wu, a->U, 0);
    sd_tr_swiglu((size_t)nq * W->nff, a->G, a->U, a->S);
    memcpy(a->Y, a->X1, sizeof(float) * (size_t)nq * w);
    sd_tr_linear(cx, nq, W->nff, w, a->S, W->wd, a->Y, 1);
}

// Backward: dY (nq, w) in; dX (nq, w) +=; CROSS: dXkv (nk, w) +=. Weight
// gradients where W->g[] is set. Uses the trainer's scratch.
static void la_bwd(sd_moa_tr *s, const sd_tr_ctx *cx, const lw *W, la *a, const float *X, const float *Xkv,
                   const float *dY, float *dX, float *dXkv, float eps, int fault) {
    (void)eps;   // (the norms' backward reads their saved 1/rms)
    const int nq = a->nq, w = W->w, qd = W->nh * W->hd, kd = W->nkv * W->hd, nff = W->nff;
    const size_t nw = (size_t)nq * w, nf = (size_t)nq * nff;
    float *dX1 = s->dX1, *dB = s->dB, *dS = s->dS, *dG = s->dG, *dU = s->dU, *dO = s->dO, *dQ = s->dQ;
    memcpy(dX1, dY, sizeof(float) * nw);
    memset(dS, 0, sizeof(float) * nf);
    sd_tr_linear_dx(cx, nq, nff, w, dY, W->wd, dS);
    if (W->g[SD_MOA_DOWN]) sd_tr_linear_dw(cx, nq, nff, w, dY, a->S, W->g[SD_MOA_DOWN]);
    sd_tr_swiglu_bwd(nf, a->G, a->U, dS, dG, dU);
    memset(dB, 0, sizeof(float) * nw);
    sd_tr_linear_dx(cx, nq, w, nff, dG, W->wg, dB);
    sd_tr_linear_dx(cx, nq, w, nff, dU, W->wu, dB);
    if (W->g[SD_MOA_GATE]) sd_tr_linear_dw(cx, nq, w, nff, dG, a->B, W->g[SD_MOA_GATE]);
    if (W->g[SD_MOA_UP]) sd_tr_linear_dw(cx, nq, w, nff, dU, a->B, W->g[SD_MOA_UP]);
    sd_tr_rmsnorm_bwd(nq, w, a->X1, W->fn, a->rsB, dB, dX1, W->g[SD_MOA_FFN_NORM]);
    memset(dO, 0, sizeof(float) * (size_t)nq * qd);
    sd_tr_linear_dx(cx, nq, qd, w, dX1, W->wo, dO);
    if (W->g[SD_MOA_O]) sd_tr_linear_dw(cx, nq, qd, w, dX1, a->O, W->g[SD_MOA_O]);
    if (fault != SD_TR_FAULT_NO_RESID) sd_tr_acc(nw, dX1, dX);
    memset(s->dK, 0, sizeof(float) * (size_t)a->nk * kd);
    memset(s->dV, 0, sizeof(float) * (size_t)a->nk * kd);
    sd_tr_attn_bwd(cx, &a->m, W->nh, W->nkv, W->hd, a->Q, a->K, a->V, a->P, dO, dQ, s->dK, s->dV, s->dSc);
    sd_tr_rope(nq, W->nh, W->hd, a->qpos, a->cs, dQ, 1, W->neox);
    const int off = a->mode == TLI ? nq : 0, nkin = a->mode == CROSS ? a->nk : nq;
    float *dK = s->dK + (size_t)off * kd, *dV = s->dV + (size_t)off * kd;
    sd_tr_rope(nkin, W->nkv, W->hd, a->kpos + off, a->cs, dK, 1, W->neox);
    float *dA = s->dA;
    memset(dA, 0, sizeof(float) * nw);
    sd_tr_linear_dx(cx, nq, w, qd, dQ, W->wq, dA);
    if (W->g[SD_MOA_Q]) sd_tr_linear_dw(cx, nq, w, qd, dQ, a->A, W->g[SD_MOA_Q]);
    const float *kin = a->mode == CROSS ? a->Ck : a->A;
    float *dKin = a->mode == CROSS ? s->dCk : dA;
    if (a->mode == CROSS) memset(dKin, 0, sizeof(float) * (size_t)nkin * w);
    sd_tr_linear_dx(cx, nkin, w, kd, dK, W->wk, dKin);
    sd_tr_linear_dx(cx, nkin, w, kd, dV, W->wv, dKin);
    if (W->g[SD_MOA_K]) sd_tr_linear_dw(cx, nkin, w, kd, dK, kin, W->g[SD_MOA_K]);
    if (W->g[SD_MOA_V]) sd_tr_linear_dw(cx, nkin, w, kd, dV, kin, W->g[SD_MOA_V]);
    if (a->mode == CROSS) sd_tr_rmsnorm_bwd(nkin, w, Xkv, W->an, a->rsC, dKin, dXkv, W->g[SD_MOA_ATTN_NORM]);
    sd_tr_rmsnorm_bwd(nq, w, X, W->an, a->rsA, dA, dX, W->g[SD_MOA_ATTN_NORM]);
}

// ---------------------------------------------------------------- masks

static void mask_done(la *a, int nnz) {
    SD_ASSERT(nnz <= a->cap);   // (carve sizes the masks for every block length up to SD_TRAIN_MOA_MAX_BLOCK)
    a->nnz = nnz;
    a->m = (sd_tr_mask){.n_q = a->nq, .n_k = a->nk, .q_off = a->q_off, .q_key = a->q_key};
    sd_tr_mask_transpose(&a->m, a->k_off, a->k_ent, a->k_q);
}

// Row i's block start.
static inline int blk(int i, int k) { return i / k * k; }

static void masks(sd_moa_tr *w, int T, int k, int full) {
    int e = 0;
    la *a = &w->a_sa;   // SA: r_i .. i (full: 0 .. i)
    a->nq = a->nk = T;
    for (int i = 0; i < T; i++) {
        a->q_off[i] = e;
        for (int j = full ? 0 : blk(i, k); j <= i; j++) a->q_key[e++] = j;
        a->qpos[i] = a->kpos[i] = i;
    }
    a->q_off[T] = e;
    mask_done(a, e);
    a = &w->a_ca;   // CA: 0 .. r_i - 1
    a->nq = a->nk = T;
    e = 0;
    for (int i = 0; i < T; i++) {
        a->q_off[i] = e;
        for (int j = 0; j < blk(i, k); j++) a->q_key[e++] = j;
        a->qpos[i] = a->kpos[i] = i;
    }
    a->q_off[T] = e;
    mask_done(a, e);
    for (int t = 0; t < w->N; t++) {   // TLI: the target's rows 0 .. r_i - 1, then its own r_i .. i
        a = &w->a_tl[t];
        a->nq = T, a->nk = 2 * T;
        e = 0;
        for (int i = 0; i < T; i++) {
            a->q_off[i] = e;
            for (int j = 0; j < blk(i, k); j++) a->q_key[e++] = j;
            for (int j = blk(i, k); j <= i; j++) a->q_key[e++] = T + j;
            a->qpos[i] = a->kpos[i] = a->kpos[T + i] = i;
        }
        a->q_off[T] = e;
        mask_done(a, e);
    }
    if (!w->h->hp.moa_no_lsa) {   // LSA: a position's L rows see each other
        a = &w->a_lsa;
        const int L = w->L;
        a->nq = a->nk = T * L;
        e = 0;
        for (int r = 0; r < T * L; r++) {
            a->q_off[r] = e;
            for (int j = 0; j < L; j++) a->q_key[e++] = r / L * L + j;
            a->qpos[r] = a->kpos[r] = r % L;
        }
        a->q_off[T * L] = e;
        mask_done(a, e);
    }
    w->a_sa.cs = w->a_ca.cs = w->cs_sa;
    w->a_lsa.cs = w->cs_lsa;
    for (int t = 0; t < w->N; t++) w->a_tl[t].cs = w->cs_t;
}


// ---------------------------------------------------------------- the loss

static inline float sl1(float x) { return fabsf(x) < 1.0f ? 0.5f * x * x : fabsf(x) - 0.5f; }
static inline float sl1_d(float x) { return fabsf(x) < 1.0f ? x : (x > 0 ? 1.0f : -1.0f); }

// SmoothL1 of rows (n, E) of Y against rows of the features at offset foff,
// weight wt per row (averaged over E); dY += its gradient when dY.
static double feat_loss(const float *Y, const float *F, int nfeat, int foff, int n, int E, float wt, float *dY) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        const float *y = Y + (size_t)i * E, *t = F + (size_t)i * nfeat + foff;
        double r = 0;
        for (int j = 0; j < E; j++) {
            const float x = y[j] - t[j];
            r += sl1(x);
            if (dY) dY[(size_t)i * E + j] += wt * sl1_d(x) / (float)E;
        }
        sum += wt * r / E;
    }
    return sum;
}

static void set_grads(lw *W, const sd_head *h, int base, float *grad) {
    for (int i = 0; i < SD_MOA_PER_LAYER; i++) W->g[i] = grad ? grad + h->t[base + i].off : NULL;
}

double sd_moa_tr_loss(sd_moa_tr *w, const sd_tr_ctx *cx, const sd_train_seq *seq, const int32_t *tid,
                      const float *tp, const uint8_t *scored, float *grad, sd_train_stats *st, int fault) {
    const sd_head *h = w->h;
    const int T = seq->T, L = w->L, E = w->E, ekv = w->ekv, V = w->V, nt = seq->topk, n0 = T - 1;
    const int nfeat = sd_moa_n_feat(h), no_lsa = h->hp.moa_no_lsa, hoff = kv_feat(h);
    const float eps = h->hp.rms_eps, teps = w->m->hp.rms_eps, *F = seq->feats;
    const int k = sd_moa_block(seq->tokens, T, w->kmin, w->kmax);
    masks(w, T, k, h->hp.moa_sa_full && sd_moa_sa_full_draw(seq->tokens, T, w->sa_salt, w->sa_p));
    if (w->N > 0 && seq->pos0 != w->cs_t_pos0) {   // the target's rows sit at positions pos0.. (TLI's RoPE)
        sd_tr_rope_table_at(w->cs_t, seq->pos0, w->T_max, w->m->hp.head_dim, w->m->hp.rope_base);
        w->cs_t_pos0 = seq->pos0;
    }
    set_grads(&w->sa, h, SD_MOA_SA, grad);
    set_grads(&w->ca, h, SD_MOA_CA, grad);
    if (!no_lsa) set_grads(&w->lsa, h, SD_MOA_LSA, grad);
    // LSA: c = P mean_l Layer(KV) + b; no LSA: the features hold mean_l KV
    if (no_lsa) {
        for (int p = 0; p < T; p++) memcpy(w->M + (size_t)p * ekv, F + (size_t)p * nfeat, sizeof(float) * (size_t)ekv);
    } else {
        for (int p = 0; p < T; p++)
            memcpy(w->X0 + (size_t)p * L * ekv, F + (size_t)p * nfeat, sizeof(float) * (size_t)L * ekv);
        la_fwd(cx, &w->lsa, &w->a_lsa, w->X0, NULL, eps);
        for (int p = 0; p < T; p++) {
            float *m = w->M + (size_t)p * ekv;
            memset(m, 0, sizeof(float) * (size_t)ekv);
            for (int l = 0; l < L; l++) sd_tr_acc((size_t)ekv, w->a_lsa.Y + ((size_t)p * L + l) * ekv, m);
            for (int j = 0; j < ekv; j++) m[j] /= (float)L;
        }
    }
    const float *Pw = sd_head_w(h, SD_MOA_PROJ), *Pb = sd_head_w(h, SD_MOA_PROJ_B);
    sd_tr_linear(cx, T, ekv, E, w->M, Pw, w->C, 0);
    add_bias(w->C, Pb, T, E);
    // ca_hidden: c += H h / rms(h), h the state entering layer L-N (TLI 0: the final normed state)
    const float *Hw = h->hp.moa_ca_hidden ? sd_head_w(h, sd_moa_hidden_t(&h->hp)) : NULL;
    const float *Gw = h->hp.moa_sa_hidden ? sd_head_w(h, sd_moa_sa_hidden_t(&h->hp)) : NULL;
    if (w->Hn) {
        const int hsrc = hoff + (w->N > 0 ? 0 : E);
        for (int p = 0; p < T; p++) sd_moa_hidden_scale(F + (size_t)p * nfeat + hsrc, E, w->Hn + (size_t)p * E);
    }
    if (Hw) sd_tr_linear(cx, T, E, E, w->Hn, Hw, w->C, 1);
    // SA over the embeddings, CA over c, the TLI layers
    for (int p = 0; p < T; p++) sd_model_token_embd(w->m, seq->tokens[p], w->Emb + (size_t)p * E, NULL, 0);
    if (Gw) {   // sa_hidden: every row adds G h/rms(h) of its block's last verified position (none in the first block)
        for (int p = 0; p < T; p++) {
            const int v = blk(p, k) - 1;
            float *hs = w->Hsel + (size_t)p * E;
            if (v >= 0)
                for (int j = 0; j < E; j++) hs[j] = w->sa_scale * w->Hn[(size_t)v * E + j];
            else memset(hs, 0, sizeof(float) * (size_t)E);
        }
        sd_tr_linear(cx, T, E, E, w->Hsel, Gw, w->Emb, 1);
    }
    la_fwd(cx, &w->sa, &w->a_sa, w->Emb, NULL, eps);
    la_fwd(cx, &w->ca, &w->a_ca, w->a_sa.Y, w->C, eps);
    const float *y = w->a_ca.Y;
    for (int t = 0; t < w->N; t++) {
        la *a = &w->a_tl[t];
        const int l = no_lsa ? 1 + t : L - w->N + t, kd = ekv / 2;   // its K,V rows in the features
        for (int p = 0; p < T; p++) {
            const float *row = F + (size_t)p * nfeat + (size_t)l * ekv;
            memcpy(a->K + (size_t)p * kd, row, sizeof(float) * (size_t)kd);
            memcpy(a->V + (size_t)p * kd, row + kd, sizeof(float) * (size_t)kd);
        }
        la_fwd(cx, &w->tl[t], a, y, NULL, teps);
        y = a->Y;
    }
    // output: z = n(y) g_out, logits over the draft vocabulary
    sd_tr_rmsnorm(n0, E, y, w->out_norm, teps, w->Z, w->rsZ);
    sd_tr_linear(cx, n0, E, V, w->Z, w->out_w, w->Lg, 0);
    int n_sc = 0;
    for (int i = 0; i < n0; i++) n_sc += scored[i];
    const float wce = n_sc ? 0.1f / (float)n_sc : 0.0f;
    const double ce = sd_tr_softxent(cx, n0, V, w->Lg, tid, tp, nt, wce, grad ? w->Lg : NULL, w->loss_row, w->argmax,
                                     NULL);
    if (st)
        for (int i = 0; i < n0; i++)
            if (scored[i]) {
                const int d = SD_MIN(i - blk(i, k), SD_HEAD_MAX_MEDUSA - 1);
                st->n[d]++;
                st->agree[d] += h->d2t[w->argmax[i]] == seq->top_ids[(size_t)i * nt];
            }
    float *dY = w->dY, *dX = w->dX;
    memset(w->dZ, 0, sizeof(float) * (size_t)T * E);
    const float wf = (w->N > 0 ? 0.5f : 1.0f) / (float)n0;
    double loss = (n_sc ? 0.1 * ce / n_sc : 0.0) +
                  feat_loss(w->Z, F, nfeat, hoff + E, n0, E, wf, grad ? w->dZ : NULL);
    if (w->N > 0) loss += feat_loss(w->a_ca.Y, F, nfeat, hoff, n0, E, wf, NULL);
    if (!grad) return loss;
    // backward
    if (n_sc) sd_tr_linear_dx(cx, n0, E, V, w->Lg, w->out_w, w->dZ);
    memset(dY, 0, sizeof(float) * (size_t)T * E);
    sd_tr_rmsnorm_bwd(n0, E, y, w->out_norm, w->rsZ, w->dZ, dY, NULL);
    for (int t = w->N - 1; t >= 0; t--) {
        const float *Xt = t == 0 ? w->a_ca.Y : w->a_tl[t - 1].Y;
        memset(dX, 0, sizeof(float) * (size_t)T * E);
        la_bwd(w, cx, &w->tl[t], &w->a_tl[t], Xt, NULL, dY, dX, NULL, teps, fault);
        float *tmp = dY;
        dY = dX, dX = tmp;
    }
    if (w->N > 0) feat_loss(w->a_ca.Y, F, nfeat, hoff, n0, E, wf, dY);
    memset(dX, 0, sizeof(float) * (size_t)T * E);
    memset(w->dC, 0, sizeof(float) * (size_t)T * E);
    la_bwd(w, cx, &w->ca, &w->a_ca, w->a_sa.Y, w->C, dY, dX, w->dC, eps, fault);
    if (Gw) memset(w->dKV, 0, sizeof(float) * (size_t)T * E);
    la_bwd(w, cx, &w->sa, &w->a_sa, w->Emb, NULL, dX, w->dKV, NULL, eps, fault);   // (the embeddings' gradient is dropped)
    if (Gw) sd_tr_linear_dw(cx, T, E, E, w->dKV, w->Hsel, grad + h->t[sd_moa_sa_hidden_t(&h->hp)].off);
    bias_grad(grad + h->t[SD_MOA_PROJ_B].off, w->dC, T, E);
    sd_tr_linear_dw(cx, T, ekv, E, w->dC, w->M, grad + h->t[SD_MOA_PROJ].off);
    if (Hw) sd_tr_linear_dw(cx, T, E, E, w->dC, w->Hn, grad + h->t[sd_moa_hidden_t(&h->hp)].off);
    if (!no_lsa) {
        memset(w->dM, 0, sizeof(float) * (size_t)T * ekv);
        sd_tr_linear_dx(cx, T, ekv, E, w->dC, Pw, w->dM);
        float *dZl = dY;   // (T L, ekv): each layer row gets 1/L of its position's mean gradient
        for (int p = 0; p < T; p++)
            for (int l = 0; l < L; l++)
                for (int j = 0; j < ekv; j++) dZl[((size_t)p * L + l) * ekv + j] = w->dM[(size_t)p * ekv + j] / (float)L;
        la_bwd(w, cx, &w->lsa, &w->a_lsa, w->X0, NULL, dZl, w->dKV, NULL, eps, fault);
    }
    return loss;
}
