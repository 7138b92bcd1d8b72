// moa_run.c - the MoA drafter at inference (moa.h, docs/moa.md): LSA over
// each verified position's target K,V rows into CA's keys and values, and
// drafted rows through SA, CA, the target's last N layers and its output.
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/moa.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/vmath.h"

// One matrix in the runner's compute type.
typedef struct mmat {
    int type;          // the type W holds (sd_matmul_weights' answer)
    void *W;           // owned
    int64_t n_in, n_out;
} mmat;

// A pre-norm decoder layer in compute form.
typedef struct dlayer {
    mmat q, k, v, o, gate, up, down;
    float *attn_norm, *ffn_norm;   // (w) owned
    float *bq, *bk, *bv;           // biases (qwen2 target layers) or NULL; owned
    int w, nh, nkv, hd, nff;
} dlayer;

#define LSA_ROWS 256   // rows of one LSA matmul call (tokens x layers)

// The parameters a runner computes with, in its compute type: the MoA's
// own layers and projections and what it borrows from the target (its last
// N layers, its final norm, the draft vocabulary's output rows). A runner's
// own, or the head's shared copy (sd_head.moa_shared), made by the first
// runner of that target and type and freed with the head: a drafter of an
// MoA head (which never changes once loaded) is then made in a millisecond.
struct sd_moa_w {
    const sd_model *m;             // the target the borrowed parts come from
    int wtype;
    int N;
    dlayer sa, ca, lsa, *tl;       // tl: (N) the target's last N layers
    mmat proj, out, hid, sah;      // hid: ca.hidden, sah: sa.hidden (drafters reading states; else empty)
    float *proj_b;                 // (E)
    float *out_norm;               // (E) the target's final norm
};

struct sd_moa_run {
    const sd_head *h;
    const sd_model *m;
    sd_pool *pool;
    sd_mm_ctx mm;
    int E, L, ekv, N, V, n_ctx, max_pending;
    float eps, t_eps;
    sd_moa_w *w;                   // the parameters: its own, or the head's shared ones
    int w_shared;                  // 1: w is the head's (sd_head.moa_shared), not freed here
    double *lsa_freq, *sa_freq, *t_freq;
    int t_nrot, t_neox, t_kvd;
    // verified context
    float *ck, *cv;                // (n_ctx, ca kd) CA keys (RoPE applied) and values
    float *tk, *tv;                // (N, n_ctx, t_kvd) TLI layers' K,V rows (the target's)
    float *vk, *vv;                // sa_full: (n_ctx, sa kd) SA's keys (RoPE applied) and values of the
                                   //   verified positions (from their tokens alone; NULL otherwise)
    int n_cached;
    // pending drafted rows
    float *sk, *sv;                // (max_pending, sa kd)
    float *pk, *pv;                // (N, max_pending, t_kvd)
    int32_t *ppar;                 // (max_pending)
    int n_pend;
    // scratch
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u, *c, *sc;
    float *cl;                     // (SD_MOA_ROWS, E) LSA outputs of a context call
    float *hn;                     // (SD_MOA_ROWS, E) the scaled target states of a context call
    float *gh;                     // (n_ctx, E) sa_hidden: G s h/rms(h) of each verified position
    float sa_scale;                // sa_hidden: sd_moa_sa_scale of the target
    int32_t *chain;                // (max_pending)
};

static void mm_free(mmat *a) { free(a->W); }

static void layer_free(dlayer *l) {
    mmat *ms[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
    for (int i = 0; i < 7; i++) mm_free(ms[i]);
    free(l->attn_norm);
    free(l->ffn_norm);
    free(l->bq);
    free(l->bk);
    free(l->bv);
}

void sd_moa_w_free(sd_moa_w *w) {
    if (!w) return;
    layer_free(&w->sa);
    layer_free(&w->ca);
    layer_free(&w->lsa);
    for (int i = 0; w->tl && i < w->N; i++) layer_free(&w->tl[i]);
    free(w->tl);
    mm_free(&w->proj);
    mm_free(&w->out);
    mm_free(&w->hid);
    mm_free(&w->sah);
    free(w->proj_b);
    free(w->out_norm);
    free(w);
}

void sd_moa_run_free(sd_moa_run *r) {
    if (!r) return;
    if (!r->w_shared) sd_moa_w_free(r->w);
    void *bufs[] = {r->lsa_freq, r->sa_freq, r->t_freq, r->ck, r->cv, r->tk, r->tv, r->vk, r->vv,
                    r->sk, r->sv, r->pk, r->pv, r->ppar, r->x, r->xn, r->q, r->k, r->v, r->att, r->o,
                    r->g, r->u, r->c, r->sc, r->cl, r->hn, r->gh, r->chain, r->mm.wbuf};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    if (r->pool) sd_pool_free(r->pool);
    free(r);
}

// a from float rows w (n_out, n_in) in the runner's type (F32 where rows do not fill blocks).
static int mm_make(const sd_moa_w *pw, mmat *a, const float *w, int64_t n_in, int64_t n_out) {
    int base = pw->wtype;
    if (base != SD_TYPE_F32 && n_in % sd_type_get(base)->blck) base = SD_TYPE_F32;
    a->n_in = n_in;
    a->n_out = n_out;
    a->W = malloc(sd_row_size(base, n_in) * (size_t)n_out);
    if (!a->W) return -1;
    a->type = sd_matmul_weights(base, w, n_in, n_out, a->W);
    return 0;
}

static float *dup_f(const float *src, size_t n) {
    float *d = malloc(sizeof(float) * n);
    if (d) memcpy(d, src, sizeof(float) * n);
    return d;
}

// A layer from the head's tensor block at base.
static int layer_from_head(const sd_moa_w *r, const sd_head *h, dlayer *l, int base, int w, int nh, int nkv, int hd,
                           int nff) {
    l->w = w, l->nh = nh, l->nkv = nkv, l->hd = hd, l->nff = nff;
    mmat *ms[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
    const int ti[] = {SD_MOA_Q, SD_MOA_K, SD_MOA_V, SD_MOA_O, SD_MOA_GATE, SD_MOA_UP, SD_MOA_DOWN};
    for (int i = 0; i < 7; i++) {
        const sd_head_tensor *t = &h->t[base + ti[i]];
        if (mm_make(r, ms[i], sd_head_w(h, base + ti[i]), t->ne0, t->ne1) < 0) return -1;
    }
    l->attn_norm = dup_f(sd_head_w(h, base + SD_MOA_ATTN_NORM), (size_t)w);
    l->ffn_norm = dup_f(sd_head_w(h, base + SD_MOA_FFN_NORM), (size_t)w);
    return l->attn_norm && l->ffn_norm ? 0 : -1;
}

// Target layer li, dequantised.
static int layer_from_target(const sd_moa_w *r, dlayer *l, int li, char *err, size_t errlen) {
    const sd_model *m = r->m;
    const sd_hparams *hp = &m->hp;
    const sd_layer *tl = &m->layers[li];
    l->w = hp->n_embd, l->nh = hp->n_head, l->nkv = hp->n_head_kv, l->hd = hp->head_dim, l->nff = hp->n_ff;
    const sd_tensor *ts[] = {tl->wq, tl->wk, tl->wv, tl->wo, tl->w_gate, tl->w_up, tl->w_down};
    mmat *ms[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
    for (int i = 0; i < 7; i++) {
        const sd_tensor *ft = sd_model_file_tensor(m, ts[i]);
        float *tmp = malloc(sizeof(float) * (size_t)ft->ne[0] * (size_t)ft->ne[1]);
        if (!tmp) return sd_err(err, errlen, "moa: out of memory");
        int rc = sd_moa_dequant(m, ts[i], NULL, 0, tmp, err, errlen);
        if (rc == 0 && mm_make(r, ms[i], tmp, ft->ne[0], ft->ne[1]) < 0) rc = sd_err(err, errlen, "moa: out of memory");
        free(tmp);
        if (rc < 0) return -1;
    }
    const int qd = l->nh * l->hd, kd = l->nkv * l->hd;
    l->attn_norm = malloc(sizeof(float) * (size_t)l->w);
    l->ffn_norm = malloc(sizeof(float) * (size_t)l->w);
    if (!l->attn_norm || !l->ffn_norm) return sd_err(err, errlen, "moa: out of memory");
    if (sd_moa_dequant(m, tl->attn_norm, NULL, 0, l->attn_norm, err, errlen) < 0 ||
        sd_moa_dequant(m, tl->ffn_norm, NULL, 0, l->ffn_norm, err, errlen) < 0)
        return -1;
    const sd_tensor *bs[] = {tl->bq, tl->bk, tl->bv};
    float **bd[] = {&l->bq, &l->bk, &l->bv};
    const int bn[] = {qd, kd, kd};
    for (int i = 0; i < 3; i++) {
        if (!bs[i]) continue;
        *bd[i] = malloc(sizeof(float) * (size_t)bn[i]);
        if (!*bd[i]) return sd_err(err, errlen, "moa: out of memory");
        if (sd_moa_dequant(m, bs[i], NULL, 0, *bd[i], err, errlen) < 0) return -1;
    }
    return 0;
}

static size_t layer_wsize(const dlayer *l, int64_t rows) {
    const mmat *ms[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
    size_t s = 0;
    for (int i = 0; i < 7; i++)
        if (ms[i]->W) s = SD_MAX(s, sd_matmul_wsize(ms[i]->type, ms[i]->n_in, rows));
    return s;
}

// Fills w (zeroed) with h's parameters for target m in type wtype.
static int w_make(sd_moa_w *w, const sd_head *h, const sd_model *m, int wtype, char *err, size_t errlen) {
    const sd_head_hp *hp = &h->hp;
    const int E = hp->n_embd, ekv = hp->moa_kv_width, V = hp->n_draft_vocab, L = m->hp.n_layer;
    w->m = m, w->wtype = wtype, w->N = hp->moa_tli;
    int ok = layer_from_head(w, h, &w->sa, SD_MOA_SA, E, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff) == 0 &&
             layer_from_head(w, h, &w->ca, SD_MOA_CA, E, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff) == 0 &&
             (hp->moa_no_lsa || layer_from_head(w, h, &w->lsa, SD_MOA_LSA, ekv, hp->moa_lsa_n_head,
                                                hp->moa_lsa_n_head_kv, hp->moa_lsa_head_dim, hp->moa_lsa_n_ff) == 0) &&
             mm_make(w, &w->proj, sd_head_w(h, SD_MOA_PROJ), ekv, E) == 0 &&
             (!hp->moa_ca_hidden || mm_make(w, &w->hid, sd_head_w(h, sd_moa_hidden_t(hp)), E, E) == 0) &&
             (!hp->moa_sa_hidden || mm_make(w, &w->sah, sd_head_w(h, sd_moa_sa_hidden_t(hp)), E, E) == 0) &&
             (w->proj_b = dup_f(sd_head_w(h, SD_MOA_PROJ_B), (size_t)E)) != NULL;
    if (!ok) return sd_err(err, errlen, "moa: out of memory for the drafter's parameters");
    // Borrowed from the target: the last N layers, the final norm, the draft vocabulary's output rows.
    if (w->N > 0 && !(w->tl = calloc((size_t)w->N, sizeof *w->tl))) return sd_err(err, errlen, "moa: out of memory");
    for (int i = 0; i < w->N; i++)
        if (layer_from_target(w, &w->tl[i], L - w->N + i, err, errlen) < 0) return -1;
    float *orow = malloc(sizeof(float) * (size_t)V * (size_t)E);
    w->out_norm = malloc(sizeof(float) * (size_t)E);
    int rc = !orow || !w->out_norm ? sd_err(err, errlen, "moa: out of memory") : 0;
    if (rc == 0 && (sd_moa_dequant(m, m->out_norm, NULL, 0, w->out_norm, err, errlen) < 0 ||
                    sd_moa_dequant(m, m->output, h->d2t, V, orow, err, errlen) < 0))
        rc = -1;
    if (rc == 0 && mm_make(w, &w->out, orow, E, V) < 0) rc = sd_err(err, errlen, "moa: out of memory");
    free(orow);
    return rc;
}

// Guards every head's shared parameters (sd_head.moa_shared) while they are made.
static pthread_mutex_t g_share_mu = PTHREAD_MUTEX_INITIALIZER;

// The head's shared parameters for target m in type wtype (made now when it
// has none), or NULL (with no message) when it holds another target's or
// type's, or they cannot be made (the caller then makes its own and says why).
static sd_moa_w *shared_w(const sd_head *h, const sd_model *m, int wtype, char *err, size_t errlen) {
    sd_head *hm = (sd_head *)h;   // the cache is the only part of a head that changes after loading
    pthread_mutex_lock(&g_share_mu);
    if (!hm->moa_shared) {
        sd_moa_w *w = calloc(1, sizeof *w);
        if (w && w_make(w, h, m, wtype, err, errlen) == 0) hm->moa_shared = w;
        else sd_moa_w_free(w);
    }
    sd_moa_w *w = hm->moa_shared && hm->moa_shared->m == m && hm->moa_shared->wtype == wtype ? hm->moa_shared : NULL;
    pthread_mutex_unlock(&g_share_mu);
    return w;
}

int sd_moa_run_new(sd_moa_run **out, const sd_head *h, const sd_model *m, int n_ctx, int max_pending, int wtype,
                   int share, sd_pool *pool, char *err, size_t errlen) {
    *out = NULL;
    if (h->hp.type != SD_HEAD_MOA) return sd_err(err, errlen, "moa: not an MoA drafter");
    if (sd_head_check_target(h, m, err, errlen) < 0) return -1;
    if (wtype != SD_TYPE_F32 && wtype != SD_TYPE_Q8_0 && wtype != SD_TYPE_Q5_0 && wtype != SD_TYPE_Q4_1 &&
        wtype != SD_TYPE_Q4_0)
        return sd_err(err, errlen, "moa: weight type %d (f32, q8_0, q5_0, q4_1 or q4_0)", wtype);
    if (n_ctx < 1 || max_pending < SD_MOA_ROWS)
        return sd_err(err, errlen, "moa: bad sizes (n_ctx %d, pending %d)", n_ctx, max_pending);
    sd_moa_run *r = calloc(1, sizeof *r);
    if (!r) return sd_err(err, errlen, "moa: out of memory");
    const sd_head_hp *hp = &h->hp;
    r->h = h, r->m = m;
    r->pool = pool ? sd_pool_ref(pool) : NULL;
    r->E = hp->n_embd, r->L = m->hp.n_layer, r->ekv = hp->moa_kv_width, r->N = hp->moa_tli, r->V = hp->n_draft_vocab;
    r->n_ctx = n_ctx, r->max_pending = max_pending;
    r->eps = hp->rms_eps, r->t_eps = m->hp.rms_eps;
    r->t_nrot = m->hp.n_rot, r->t_neox = m->hp.rope_type == SD_ROPE_NEOX, r->t_kvd = r->ekv / 2;
    const int E = r->E, ekv = r->ekv, kd = hp->n_head_kv * hp->head_dim;
    if (share && (r->w = shared_w(h, m, wtype, err, errlen)) != NULL) r->w_shared = 1;
    else if (!(r->w = calloc(1, sizeof *r->w)) || w_make(r->w, h, m, wtype, err, errlen) < 0) {
        sd_moa_run_free(r);
        return -1;
    }
    r->lsa_freq = malloc(sizeof(double) * (size_t)SD_MAX(1, hp->moa_lsa_head_dim / 2));
    r->sa_freq = malloc(sizeof(double) * (size_t)(hp->head_dim / 2));
    r->t_freq = malloc(sizeof(double) * (size_t)SD_MAX(1, r->t_nrot / 2));
    const size_t nc = (size_t)n_ctx, mp = (size_t)max_pending, N = (size_t)r->N, tkvd = (size_t)r->t_kvd;
    r->ck = malloc(sizeof(float) * nc * (size_t)kd);
    r->cv = malloc(sizeof(float) * nc * (size_t)kd);
    r->tk = malloc(sizeof(float) * SD_MAX(N, 1) * nc * tkvd);
    r->tv = malloc(sizeof(float) * SD_MAX(N, 1) * nc * tkvd);
    if (hp->moa_sa_full) {
        r->vk = malloc(sizeof(float) * nc * (size_t)kd);
        r->vv = malloc(sizeof(float) * nc * (size_t)kd);
    }
    r->sk = malloc(sizeof(float) * mp * (size_t)kd);
    r->sv = malloc(sizeof(float) * mp * (size_t)kd);
    r->pk = malloc(sizeof(float) * SD_MAX(N, 1) * mp * tkvd);
    r->pv = malloc(sizeof(float) * SD_MAX(N, 1) * mp * tkvd);
    r->ppar = malloc(sizeof(int32_t) * mp);
    r->chain = malloc(sizeof(int32_t) * mp);
    // scratch rows: LSA_ROWS rows of the widest input
    const size_t R = LSA_ROWS;
    size_t wmax = (size_t)SD_MAX(E, ekv), ffmax = (size_t)SD_MAX(hp->n_ff, hp->moa_lsa_n_ff);
    for (int i = 0; i < r->N; i++) ffmax = SD_MAX(ffmax, (size_t)r->w->tl[i].nff);
    size_t qmax = SD_MAX((size_t)hp->n_head * hp->head_dim, wmax);
    if (r->N > 0) qmax = SD_MAX(qmax, (size_t)m->hp.n_head * m->hp.head_dim);
    r->x = malloc(sizeof(float) * R * wmax);
    r->xn = malloc(sizeof(float) * R * wmax);
    r->q = malloc(sizeof(float) * R * qmax);
    r->k = malloc(sizeof(float) * R * wmax);
    r->v = malloc(sizeof(float) * R * wmax);
    r->att = malloc(sizeof(float) * R * qmax);
    r->o = malloc(sizeof(float) * R * wmax);
    r->g = malloc(sizeof(float) * R * ffmax);
    r->u = malloc(sizeof(float) * R * ffmax);
    r->c = malloc(sizeof(float) * R * wmax);
    r->sc = malloc(sizeof(float) * (nc + mp + (size_t)r->L));
    r->cl = malloc(sizeof(float) * SD_MOA_ROWS * (size_t)E);
    r->hn = malloc(sizeof(float) * SD_MOA_ROWS * (size_t)E);
    r->gh = hp->moa_sa_hidden ? malloc(sizeof(float) * nc * (size_t)E) : NULL;
    r->sa_scale = hp->moa_sa_hidden ? sd_moa_sa_scale(m) : 0.0f;
    size_t ws = SD_MAX(layer_wsize(&r->w->sa, SD_MOA_ROWS), layer_wsize(&r->w->lsa, LSA_ROWS));
    ws = SD_MAX(ws, sd_matmul_wsize(r->w->proj.type, ekv, LSA_ROWS));
    ws = SD_MAX(ws, sd_matmul_wsize(r->w->out.type, E, SD_MOA_ROWS));
    if (r->w->hid.W) ws = SD_MAX(ws, sd_matmul_wsize(r->w->hid.type, E, SD_MOA_ROWS));
    if (r->w->sah.W) ws = SD_MAX(ws, sd_matmul_wsize(r->w->sah.type, E, SD_MOA_ROWS));
    ws = SD_MAX(ws, layer_wsize(&r->w->ca, SD_MOA_ROWS));
    for (int i = 0; i < r->N; i++) ws = SD_MAX(ws, layer_wsize(&r->w->tl[i], SD_MOA_ROWS));
    r->mm.wbuf = malloc(ws ? ws : 64);
    r->mm.wbuf_size = ws;
    r->mm.pool = r->pool;
    if (!r->lsa_freq || !r->sa_freq || !r->t_freq || !r->ck || !r->cv || !r->tk || !r->tv || !r->sk || !r->sv ||
        !r->pk || !r->pv || !r->ppar || !r->chain || !r->x || !r->xn || !r->q || !r->k || !r->v || !r->att ||
        !r->o || !r->g || !r->u || !r->c || !r->sc || !r->cl || !r->hn || (hp->moa_sa_hidden && !r->gh) ||
        (hp->moa_sa_full && (!r->vk || !r->vv)) || !r->mm.wbuf) {
        sd_moa_run_free(r);
        return sd_err(err, errlen, "moa: out of memory");
    }
    for (int i = 0; i < hp->moa_lsa_head_dim / 2; i++) r->lsa_freq[i] = pow(10000.0, -2.0 * i / hp->moa_lsa_head_dim);
    for (int i = 0; i < hp->head_dim / 2; i++) r->sa_freq[i] = pow((double)hp->rope_base, -2.0 * i / hp->head_dim);
    sd_moa_target_freq(m, r->t_freq);
    *out = r;
    return 0;
}

int sd_moa_run_n_cached(const sd_moa_run *r) { return r->n_cached; }
int sd_moa_run_n_ctx(const sd_moa_run *r) { return r->n_ctx; }
int sd_moa_run_n_pending(const sd_moa_run *r) { return r->n_pend; }
void sd_moa_run_drop_pending(sd_moa_run *r) { r->n_pend = 0; }
void sd_moa_run_keep_pending(sd_moa_run *r, int n) {
    if (n >= 0 && n < r->n_pend) r->n_pend = n;
}
void sd_moa_run_truncate(sd_moa_run *r, int n) {   // (every per-position row, SA's too, sits at its slot)
    if (n >= 0 && n < r->n_cached) r->n_cached = n;
    r->n_pend = 0;
}

// ---------------------------------------------------------------- pieces

static void mat(sd_moa_run *r, const mmat *a, const float *x, int n, float *y) {
    sd_pool_acquire(r->pool);
    sd_matmul(&r->mm, a->type, a->W, a->n_in, a->n_out, x, n, y);
    sd_pool_release(r->pool);
}

static void rms(float *out, const float *x, const float *w, int n, float eps) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    const float sc = (float)(1.0 / sqrt(s / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * sc * w[i];
}

// One query row q (nh heads of hd) over keys: na contiguous rows ka/va
// (stride ld, a row's KV head g at g*hd), then nb rows at slots chain[] of
// kb/vb (same stride). out (nh*hd); sc scratch (na + nb).
static void attend(const float *q, int nh, int nkv, int hd, const float *ka, const float *va, int na, const float *kb,
                   const float *vb, const int32_t *chain, int nb, int ld, float *out, float *sc) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int nk = na + nb;
    for (int h = 0; h < nh; h++) {
        const int g = h / (nh / nkv);
        const float *qh = q + (size_t)h * hd;
        float mx = -INFINITY;
        for (int j = 0; j < nk; j++) {
            const float *kr = j < na ? ka + (size_t)j * ld : kb + (size_t)chain[j - na] * ld;
            sc[j] = vf_dot(qh, kr + (size_t)g * hd, hd) * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        double sum = 0.0;
        for (int j = 0; j < nk; j++) sum += sc[j] = expf(sc[j] - mx);
        const float inv = (float)(1.0 / sum);
        float *oh = out + (size_t)h * hd;
        memset(oh, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j < nk; j++) {
            const float *vr = (j < na ? va + (size_t)j * ld : vb + (size_t)chain[j - na] * ld) + (size_t)g * hd;
            const float p = sc[j] * inv;
            for (int t = 0; t < hd; t++) oh[t] += p * vr[t];
        }
    }
}

static void add_bias(float *y, const float *b, int n, int d) {
    if (!b) return;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) y[(size_t)i * d + j] += b[j];
}

// x (n, w) += Wo att (n, qd); then x += down(silu(gate n2(x)) * up n2(x)).
static void layer_tail(sd_moa_run *r, const dlayer *l, float *x, int n, float eps) {
    const int w = l->w;
    mat(r, &l->o, r->att, n, r->o);
    for (size_t j = 0; j < (size_t)n * w; j++) x[j] += r->o[j];
    for (int i = 0; i < n; i++) rms(r->xn + (size_t)i * w, x + (size_t)i * w, l->ffn_norm, w, eps);
    mat(r, &l->gate, r->xn, n, r->g);
    mat(r, &l->up, r->xn, n, r->u);
    for (size_t j = 0; j < (size_t)n * l->nff; j++) {
        const float gv = r->g[j];
        r->g[j] = gv / (1.0f + expf(-gv)) * r->u[j];
    }
    mat(r, &l->down, r->g, n, r->o);
    for (size_t j = 0; j < (size_t)n * w; j++) x[j] += r->o[j];
}

// ---------------------------------------------------------------- LSA and context

// c (n, E) from kv (n, L, Ekv): LSA (or the no-LSA mean), mean over layers,
// projection (without the target states' terms: hidden_terms).
static void lsa_rows(sd_moa_run *r, const float *kv, int n, float *c) {
    const int L = r->L, ekv = r->ekv;
    float *mean = r->c;   // (n, ekv); c may not alias r->c
    if (r->h->hp.moa_no_lsa) {
        for (int i = 0; i < n; i++) {
            float *mr = mean + (size_t)i * ekv;
            memset(mr, 0, sizeof(float) * (size_t)ekv);
            for (int l = 0; l < L; l++)
                for (int j = 0; j < ekv; j++) mr[j] += kv[((size_t)i * L + l) * ekv + j];
            for (int j = 0; j < ekv; j++) mr[j] /= (float)L;
        }
    } else {
        const dlayer *ly = &r->w->lsa;
        const int tpc = SD_MAX(1, LSA_ROWS / L);   // tokens per call
        const int qd = ly->nh * ly->hd, kd = ly->nkv * ly->hd;
        for (int t0 = 0; t0 < n; t0 += tpc) {
            const int nt = SD_MIN(tpc, n - t0), nr = nt * L;
            float *x = r->x;
            memcpy(x, kv + (size_t)t0 * L * ekv, sizeof(float) * (size_t)nr * ekv);
            for (int i = 0; i < nr; i++) rms(r->xn + (size_t)i * ekv, x + (size_t)i * ekv, ly->attn_norm, ekv, r->eps);
            mat(r, &ly->q, r->xn, nr, r->q);
            mat(r, &ly->k, r->xn, nr, r->k);
            mat(r, &ly->v, r->xn, nr, r->v);
            for (int i = 0; i < nr; i++) {   // RoPE by layer index
                sd_moa_rope(r->q + (size_t)i * qd, ly->nh, ly->hd, ly->hd, 0, r->lsa_freq, i % L);
                sd_moa_rope(r->k + (size_t)i * kd, ly->nkv, ly->hd, ly->hd, 0, r->lsa_freq, i % L);
            }
            for (int t = 0; t < nt; t++)   // no mask: each layer row sees the token's L rows
                for (int l = 0; l < L; l++) {
                    const size_t ri = (size_t)t * L + l;
                    attend(r->q + ri * qd, ly->nh, ly->nkv, ly->hd, r->k + (size_t)t * L * kd,
                           r->v + (size_t)t * L * kd, L, NULL, NULL, NULL, 0, kd, r->att + ri * qd, r->sc);
                }
            layer_tail(r, ly, x, nr, r->eps);
            for (int t = 0; t < nt; t++) {
                float *mr = mean + (size_t)(t0 + t) * ekv;
                memset(mr, 0, sizeof(float) * (size_t)ekv);
                for (int l = 0; l < L; l++)
                    for (int j = 0; j < ekv; j++) mr[j] += x[((size_t)t * L + l) * ekv + j];
                for (int j = 0; j < ekv; j++) mr[j] /= (float)L;
            }
        }
    }
    mat(r, &r->w->proj, mean, n, c);
    add_bias(c, r->w->proj_b, n, r->E);
}

// The target states' terms of n new verified positions (the next n_cached ..),
// hid (n, E): ca_hidden c += H h / rms(h); sa_hidden G s h / rms(h) kept by
// position for the rows drafted after them.
static void hidden_terms(sd_moa_run *r, const float *hid, int n, float *c) {
    const size_t E = (size_t)r->E;
    if (!r->w->hid.W && !r->w->sah.W) return;
    for (int i = 0; i < n; i++) sd_moa_hidden_scale(hid + (size_t)i * E, r->E, r->hn + (size_t)i * E);
    if (r->w->hid.W) {
        mat(r, &r->w->hid, r->hn, n, r->o);
        for (size_t j = 0; j < (size_t)n * E; j++) c[j] += r->o[j];
    }
    if (r->w->sah.W) {   // (G s hn: the scale applied to G's output, a linear map)
        float *g = r->gh + (size_t)r->n_cached * E;
        mat(r, &r->w->sah, r->hn, n, g);
        for (size_t j = 0; j < (size_t)n * E; j++) g[j] *= r->sa_scale;
    }
}

void sd_moa_run_lsa(sd_moa_run *r, const float *kv, int n, float *c) { lsa_rows(r, kv, n, c); }

int sd_moa_run_needs_hidden(const sd_moa_run *r) { return r->w->hid.W || r->w->sah.W; }

// CA's keys and values of n positions from their LSA outputs cc (n, E), and
// the TLI layers' rows: tli (n, N, Ekv) with stride ld floats a position;
// sa_full: SA's keys and values of their tokens tok (n).
static void context_from(sd_moa_run *r, const float *cc, const float *tli, size_t ld, const int32_t *tok, int n) {
    const dlayer *ca = &r->w->ca;
    const int E = r->E, kd = ca->nkv * ca->hd, ekv = r->ekv, tkvd = r->t_kvd;
    for (int i = 0; i < n; i++) rms(r->xn + (size_t)i * E, cc + (size_t)i * E, ca->attn_norm, E, r->eps);
    float *kr = r->ck + (size_t)r->n_cached * kd, *vr = r->cv + (size_t)r->n_cached * kd;
    mat(r, &ca->k, r->xn, n, kr);
    mat(r, &ca->v, r->xn, n, vr);
    for (int i = 0; i < n; i++)
        sd_moa_rope(kr + (size_t)i * kd, ca->nkv, ca->hd, ca->hd, 0, r->sa_freq, r->n_cached + i);
    if (r->vk) {   // sa_full: a verified position's SA row, as a drafted row of that token at that position
        const dlayer *sa = &r->w->sa;
        const int skd = sa->nkv * sa->hd;
        for (int i = 0; i < n; i++) {
            sd_model_token_embd(r->m, tok[i], r->x + (size_t)i * E, NULL, 0);
            rms(r->xn + (size_t)i * E, r->x + (size_t)i * E, sa->attn_norm, E, r->eps);
        }
        float *sk = r->vk + (size_t)r->n_cached * skd, *sv = r->vv + (size_t)r->n_cached * skd;
        mat(r, &sa->k, r->xn, n, sk);
        mat(r, &sa->v, r->xn, n, sv);
        for (int i = 0; i < n; i++)
            sd_moa_rope(sk + (size_t)i * skd, sa->nkv, sa->hd, sa->hd, 0, r->sa_freq, r->n_cached + i);
    }
    for (int t = 0; t < r->N; t++) {   // the TLI layers' own rows: the target's, as cached
        for (int i = 0; i < n; i++) {
            const float *src = tli + (size_t)i * ld + (size_t)t * ekv;
            const size_t dst = ((size_t)t * r->n_ctx + r->n_cached + i) * tkvd;
            memcpy(r->tk + dst, src, sizeof(float) * (size_t)tkvd);
            memcpy(r->tv + dst, src + tkvd, sizeof(float) * (size_t)tkvd);
        }
    }
    r->n_cached += n;
}

// What every context call checks: n rows that fit, the states of a drafter
// reading them, the tokens (in range) of a full-text SA drafter.
static int check_context(const sd_moa_run *r, const float *hid, const int32_t *tok, int n, char *err, size_t errlen) {
    if (n < 1 || n > SD_MOA_ROWS) return sd_err(err, errlen, "moa: %d context rows (1..%d)", n, SD_MOA_ROWS);
    if (r->vk && !tok)
        return sd_err(err, errlen, "moa: this drafter's SA reads the whole text (sa_full): no tokens given");
    for (int i = 0; r->vk && i < n; i++)
        if (tok[i] < 0 || tok[i] >= r->m->hp.n_vocab) return sd_err(err, errlen, "moa: token %d out of range", tok[i]);
    if (sd_moa_run_needs_hidden(r) && !hid)
        return sd_err(err, errlen, "moa: this drafter reads the target's states (ca_hidden, sa_hidden): none given");
    if (r->n_cached + n > r->n_ctx) return sd_err(err, errlen, "moa: the drafter's context is full (%d)", r->n_ctx);
    return 0;
}

int sd_moa_run_context(sd_moa_run *r, const float *kv, const float *hid, const int32_t *tok, int n, char *err,
                       size_t errlen) {
    if (check_context(r, hid, tok, n, err, errlen) < 0) return -1;
    lsa_rows(r, kv, n, r->cl);   // (n, E) the LSA outputs
    if (hid) hidden_terms(r, hid, n, r->cl);
    context_from(r, r->cl, kv + (size_t)(r->L - r->N) * r->ekv, (size_t)r->L * r->ekv, tok, n);
    return 0;
}

int sd_moa_run_context_mean(sd_moa_run *r, const float *rows, const float *hid, const int32_t *tok, int n, char *err,
                            size_t errlen) {
    if (!r->h->hp.moa_no_lsa) return sd_err(err, errlen, "moa: the layers' mean serves a drafter without LSA only");
    if (check_context(r, hid, tok, n, err, errlen) < 0) return -1;
    const size_t ld = (size_t)(1 + r->N) * r->ekv;
    for (int i = 0; i < n; i++) memcpy(r->c + (size_t)i * r->ekv, rows + (size_t)i * ld, sizeof(float) * (size_t)r->ekv);
    mat(r, &r->w->proj, r->c, n, r->cl);   // what lsa_rows makes of the mean without LSA
    add_bias(r->cl, r->w->proj_b, n, r->E);
    if (hid) hidden_terms(r, hid, n, r->cl);
    context_from(r, r->cl, rows + r->ekv, ld, tok, n);
    return 0;
}

int sd_moa_run_context_lsa(sd_moa_run *r, const float *rows, const float *hid, const int32_t *tok, int n, char *err,
                           size_t errlen) {
    if (check_context(r, hid, tok, n, err, errlen) < 0) return -1;
    const size_t ld = (size_t)r->E + (size_t)r->N * r->ekv;
    for (int i = 0; i < n; i++) memcpy(r->cl + (size_t)i * r->E, rows + (size_t)i * ld, sizeof(float) * (size_t)r->E);
    if (hid) hidden_terms(r, hid, n, r->cl);
    context_from(r, r->cl, rows + r->E, ld, tok, n);
    return 0;
}

// ---------------------------------------------------------------- drafted rows

// The chain of pending slot s, root first, into r->chain; its length.
static int chain_of(sd_moa_run *r, int s) {
    int n = 0;
    for (int x = s; x >= 0; x = r->ppar[x]) n++;
    for (int x = s, i = n - 1; x >= 0; x = r->ppar[x], i--) r->chain[i] = x;
    return n;
}

int sd_moa_run_eval(sd_moa_run *r, const int32_t *tok, const int32_t *pos, const int32_t *parent, int n,
                    float *logits, float *h_out, char *err, size_t errlen) {
    if (n < 1 || n > SD_MOA_ROWS) return sd_err(err, errlen, "moa: %d rows (1..%d)", n, SD_MOA_ROWS);
    if (r->n_pend + n > r->max_pending) return sd_err(err, errlen, "moa: no room for %d more pending rows", n);
    for (int i = 0; i < n; i++) {
        if (parent[i] >= r->n_pend + i || parent[i] < -1)
            return sd_err(err, errlen, "moa: row %d has parent slot %d", i, parent[i]);
        if (tok[i] < 0 || tok[i] >= r->m->hp.n_vocab) return sd_err(err, errlen, "moa: token %d out of range", tok[i]);
        if (pos[i] < 0) return sd_err(err, errlen, "moa: position %d", pos[i]);
    }
    const int E = r->E, slot0 = r->n_pend;
    for (int i = 0; i < n; i++) r->ppar[slot0 + i] = parent[i];
    float *x = r->x;
    // SA over the token embeddings, each row seeing its chain of drafted rows.
    const dlayer *sa = &r->w->sa;
    const int sqd = sa->nh * sa->hd, skd = sa->nkv * sa->hd;
    const float *gv = r->w->sah.W && r->n_cached > 0 ? r->gh + (size_t)(r->n_cached - 1) * E : NULL;
    for (int i = 0; i < n; i++) {
        float *xi = x + (size_t)i * E;
        sd_model_token_embd(r->m, tok[i], xi, NULL, 0);
        if (gv)   // sa_hidden: G h/rms(h) of the last verified position
            for (int j = 0; j < E; j++) xi[j] += gv[j];
        rms(r->xn + (size_t)i * E, xi, sa->attn_norm, E, r->eps);
    }
    mat(r, &sa->q, r->xn, n, r->q);
    mat(r, &sa->k, r->xn, n, r->k);
    mat(r, &sa->v, r->xn, n, r->v);
    for (int i = 0; i < n; i++) {
        sd_moa_rope(r->q + (size_t)i * sqd, sa->nh, sa->hd, sa->hd, 0, r->sa_freq, pos[i]);
        sd_moa_rope(r->k + (size_t)i * skd, sa->nkv, sa->hd, sa->hd, 0, r->sa_freq, pos[i]);
        memcpy(r->sk + (size_t)(slot0 + i) * skd, r->k + (size_t)i * skd, sizeof(float) * (size_t)skd);
        memcpy(r->sv + (size_t)(slot0 + i) * skd, r->v + (size_t)i * skd, sizeof(float) * (size_t)skd);
    }
    for (int i = 0; i < n; i++) {
        const int nc = chain_of(r, slot0 + i);
        attend(r->q + (size_t)i * sqd, sa->nh, sa->nkv, sa->hd, r->vk, r->vv, r->vk ? r->n_cached : 0, r->sk, r->sv,
               r->chain, nc, skd, r->att + (size_t)i * sqd, r->sc);   // (sa_full: the verified rows first)
    }
    layer_tail(r, sa, x, n, r->eps);
    // CA: queries from SA, keys and values from the verified positions' LSA outputs.
    const dlayer *ca = &r->w->ca;
    const int cqd = ca->nh * ca->hd, ckd = ca->nkv * ca->hd;
    for (int i = 0; i < n; i++) rms(r->xn + (size_t)i * E, x + (size_t)i * E, ca->attn_norm, E, r->eps);
    mat(r, &ca->q, r->xn, n, r->q);
    for (int i = 0; i < n; i++) {
        sd_moa_rope(r->q + (size_t)i * cqd, ca->nh, ca->hd, ca->hd, 0, r->sa_freq, pos[i]);
        if (r->n_cached == 0) memset(r->att + (size_t)i * cqd, 0, sizeof(float) * (size_t)cqd);
        else
            attend(r->q + (size_t)i * cqd, ca->nh, ca->nkv, ca->hd, r->ck, r->cv, r->n_cached, NULL, NULL, NULL, 0,
                   ckd, r->att + (size_t)i * cqd, r->sc);
    }
    layer_tail(r, ca, x, n, r->eps);
    if (h_out) memcpy(h_out, x, sizeof(float) * (size_t)n * E);
    // TLI: the target's last N layers, their verified rows the target's own.
    for (int t = 0; t < r->N; t++) {
        const dlayer *tl = &r->w->tl[t];
        const int tqd = tl->nh * tl->hd, tkd = tl->nkv * tl->hd;
        float *pk = r->pk + (size_t)t * r->max_pending * tkd, *pv = r->pv + (size_t)t * r->max_pending * tkd;
        for (int i = 0; i < n; i++) rms(r->xn + (size_t)i * E, x + (size_t)i * E, tl->attn_norm, E, r->t_eps);
        mat(r, &tl->q, r->xn, n, r->q);
        mat(r, &tl->k, r->xn, n, r->k);
        mat(r, &tl->v, r->xn, n, r->v);
        add_bias(r->q, tl->bq, n, tqd);
        add_bias(r->k, tl->bk, n, tkd);
        add_bias(r->v, tl->bv, n, tkd);
        for (int i = 0; i < n; i++) {
            sd_moa_rope(r->q + (size_t)i * tqd, tl->nh, tl->hd, r->t_nrot, r->t_neox, r->t_freq, pos[i]);
            sd_moa_rope(r->k + (size_t)i * tkd, tl->nkv, tl->hd, r->t_nrot, r->t_neox, r->t_freq, pos[i]);
            memcpy(pk + (size_t)(slot0 + i) * tkd, r->k + (size_t)i * tkd, sizeof(float) * (size_t)tkd);
            memcpy(pv + (size_t)(slot0 + i) * tkd, r->v + (size_t)i * tkd, sizeof(float) * (size_t)tkd);
        }
        const float *ka = r->tk + (size_t)t * r->n_ctx * tkd, *va = r->tv + (size_t)t * r->n_ctx * tkd;
        for (int i = 0; i < n; i++) {
            const int nc = chain_of(r, slot0 + i);
            attend(r->q + (size_t)i * tqd, tl->nh, tl->nkv, tl->hd, ka, va, r->n_cached, pk, pv, r->chain, nc, tkd,
                   r->att + (size_t)i * tqd, r->sc);
        }
        layer_tail(r, tl, x, n, r->t_eps);
    }
    r->n_pend += n;
    if (logits) {
        for (int i = 0; i < n; i++) rms(r->xn + (size_t)i * E, x + (size_t)i * E, r->w->out_norm, E, r->t_eps);
        mat(r, &r->w->out, r->xn, n, logits);
    }
    return 0;
}
