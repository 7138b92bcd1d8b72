// eagle3.c - the EAGLE-3 head at inference (docs/heads.md, eagle3.h).
#include "head/eagle3.h"

#include <math.h>
#include <pthread.h>

#include "common.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/vmath.h"
#include "model/model.h"

// One matrix in the runner's compute type.
typedef struct e3_mat {
    int base;          // the compute type asked for (F32 or Q8_0)
    int type;          // the type W holds: base, or its repacked form (sd_matmul_weights)
    void *W;           // (n_out rows of n_in values in type) owned
    int64_t n_in, n_out;
    int ti;            // tensor index in the head
} e3_mat;

enum { M_FC, M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_OUT, M_N };
enum { N_ATTN, N_HIDDEN, N_FFN, N_OUT, N_N };

struct sd_e3_pack {
    sd_head_hp hp;       // the shape it was made for
    int wtype;           // the compute type asked for
    e3_mat mat[M_N];
    float *norm;         // (N_N, n_embd) the norm gains: attn, hidden, ffn, output
};

static const int mat_tensor[M_N] = {SD_E3_FC, SD_E3_WQ, SD_E3_WK, SD_E3_WV, SD_E3_WO,
                                    SD_E3_GATE, SD_E3_UP, SD_E3_DOWN, SD_E3_OUT};
static const int norm_tensor[N_N] = {SD_E3_ATTN_NORM, SD_E3_HIDDEN_NORM, SD_E3_FFN_NORM, SD_E3_OUT_NORM};

struct sd_e3 {
    const sd_head *h;    // hyper-parameters (and sd_e3_sync's source)
    const sd_model *m;
    sd_pool *pool;
    sd_e3_pack *pk;      // the parameters in use (owned, or the head's shared pack)
    int pk_shared;       // 1: pk is the head's (sd_head.e3_shared), not freed here
    sd_mm_ctx mm;
    int d, qd, kd, hd, nh, nkv, nff, V;
    int n_ctx, max_rows, max_pending;
    // committed rows
    float *kc, *vc;      // (n_ctx, kd), keys after RoPE
    int n_cached;
    // pending rows
    float *kp, *vp;      // (max_pending, kd)
    int32_t *ppar;       // (max_pending) parent slot or -1
    int n_pend;
    // scratch for max_rows rows
    float *u, *q, *k, *v, *att, *o, *r, *mm_in, *gate, *up, *f, *hn, *e, *sc;
    size_t sc_cap;
    float *rope_freq;    // (hd/2)
};

void sd_e3_pack_free(sd_e3_pack *p) {
    if (!p) return;
    for (int i = 0; i < M_N; i++) free(p->mat[i].W);
    free(p->norm);
    free(p);
}

int sd_e3_pack_new(sd_e3_pack **out, const sd_head *h, int wtype, char *err, size_t errlen) {
    *out = NULL;
    if (h->hp.type != SD_HEAD_EAGLE3) return sd_err(err, errlen, "eagle3: not an EAGLE-3 head");
    if (wtype != SD_TYPE_F32 && wtype != SD_TYPE_Q8_0 && wtype != SD_TYPE_Q4_0 && wtype != SD_TYPE_Q4_1 &&
        wtype != SD_TYPE_Q5_0)
        return sd_err(err, errlen, "eagle3: weight type %d (f32, q8_0, q5_0, q4_1 or q4_0)", wtype);
    sd_e3_pack *p = calloc(1, sizeof *p);
    if (!p) return sd_err(err, errlen, "eagle3: out of memory");
    p->hp = h->hp;
    p->wtype = wtype;
    int ok = (p->norm = malloc(sizeof(float) * N_N * (size_t)h->hp.n_embd)) != NULL;
    for (int i = 0; i < M_N && ok; i++) {
        e3_mat *mt = &p->mat[i];
        const sd_head_tensor *t = &h->t[mat_tensor[i]];
        mt->ti = mat_tensor[i];
        mt->n_in = t->ne0;
        mt->n_out = t->ne1;
        mt->base = wtype;
        if (mt->base != SD_TYPE_F32 && t->ne0 % sd_type_get(mt->base)->blck) mt->base = SD_TYPE_F32;
        mt->type = mt->base;
        ok = (mt->W = malloc(sd_row_size(mt->base, t->ne0) * (size_t)t->ne1)) != NULL;
    }
    if (!ok) {
        sd_e3_pack_free(p);
        return sd_err(err, errlen, "eagle3: out of memory for the head's parameters");
    }
    sd_e3_pack_fill(p, h);
    *out = p;
    return 0;
}

void sd_e3_pack_fill(sd_e3_pack *p, const sd_head *h) {
    SD_ASSERT(h->hp.n_embd == p->hp.n_embd && h->hp.n_ff == p->hp.n_ff && h->hp.n_draft_vocab == p->hp.n_draft_vocab);
    for (int i = 0; i < M_N; i++) {
        e3_mat *mt = &p->mat[i];
        mt->type = sd_matmul_weights(mt->base, sd_head_w(h, mt->ti), mt->n_in, mt->n_out, mt->W);
    }
    const size_t d = (size_t)p->hp.n_embd;
    for (int i = 0; i < N_N; i++) memcpy(p->norm + i * d, sd_head_w(h, norm_tensor[i]), sizeof(float) * d);
}

sd_e3_pack *sd_e3_swap_pack(sd_e3 *e, sd_e3_pack *p) {
    SD_ASSERT(!e->pk_shared);   // a learner's runner has a pack of its own
    SD_ASSERT(p && p->hp.n_embd == e->d && p->hp.n_ff == e->nff && p->hp.n_draft_vocab == e->V);
    sd_e3_pack *old = e->pk;
    e->pk = p;
    return old;
}

void sd_e3_sync(sd_e3 *e) {
    SD_ASSERT(!e->pk_shared);
    sd_e3_pack_fill(e->pk, e->h);
}

const sd_head *sd_e3_head(const sd_e3 *e) { return e->h; }

void sd_e3_free(sd_e3 *e) {
    if (!e) return;
    if (!e->pk_shared) sd_e3_pack_free(e->pk);
    float *bufs[] = {e->kc, e->vc, e->kp, e->vp, e->u, e->q, e->k, e->v, e->att, e->o, e->r, e->mm_in,
                     e->gate, e->up, e->f, e->hn, e->e, e->sc, e->rope_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(e->ppar);
    free(e->mm.wbuf);
    if (e->pool) sd_pool_free(e->pool);
    free(e);
}

// Guards every head's shared pack (sd_head.e3_shared) while one is made.
static pthread_mutex_t g_share_mu = PTHREAD_MUTEX_INITIALIZER;

// The head's shared pack of weight type wtype (made now when it has none),
// or NULL when it holds another type or there is no memory.
static sd_e3_pack *shared_pack(const sd_head *h, int wtype) {
    sd_head *hm = (sd_head *)h;   // the cache is the only part of a head that changes after loading
    char err[64];
    pthread_mutex_lock(&g_share_mu);
    if (!hm->e3_shared) sd_e3_pack_new(&hm->e3_shared, h, wtype, err, sizeof err);
    sd_e3_pack *p = hm->e3_shared && hm->e3_shared->wtype == wtype ? hm->e3_shared : NULL;
    pthread_mutex_unlock(&g_share_mu);
    return p;
}

int sd_e3_new(sd_e3 **out, const sd_head *h, const sd_model *m, int n_ctx, int max_rows, int max_pending, int wtype,
              int share, sd_pool *pool, char *err, size_t errlen) {
    *out = NULL;
    if (h->hp.type != SD_HEAD_EAGLE3) return sd_err(err, errlen, "eagle3: not an EAGLE-3 head");
    if (h->hp.n_embd != m->hp.n_embd) return sd_err(err, errlen, "eagle3: head width differs from the model's");
    if (n_ctx < 1 || max_rows < 1 || max_pending < max_rows)
        return sd_err(err, errlen, "eagle3: bad sizes (n_ctx %d, rows %d, pending %d)", n_ctx, max_rows, max_pending);
    sd_e3 *e = calloc(1, sizeof *e);
    if (!e) return sd_err(err, errlen, "eagle3: out of memory");
    e->h = h;
    e->m = m;
    e->pool = pool ? sd_pool_ref(pool) : NULL;
    const sd_head_hp *hp = &h->hp;
    e->d = hp->n_embd;
    e->hd = hp->head_dim;
    e->nh = hp->n_head;
    e->nkv = hp->n_head_kv;
    e->qd = e->nh * e->hd;
    e->kd = e->nkv * e->hd;
    e->nff = hp->n_ff;
    e->V = hp->n_draft_vocab;
    e->n_ctx = n_ctx;
    e->max_rows = max_rows;
    e->max_pending = max_pending;
    if (share && (e->pk = shared_pack(h, wtype)) != NULL) e->pk_shared = 1;
    else if (sd_e3_pack_new(&e->pk, h, wtype, err, errlen) < 0) {
        sd_e3_free(e);
        return -1;
    }
    size_t R = (size_t)max_rows, d = (size_t)e->d;
    e->kc = malloc(sizeof(float) * (size_t)n_ctx * (size_t)e->kd);
    e->vc = malloc(sizeof(float) * (size_t)n_ctx * (size_t)e->kd);
    e->kp = malloc(sizeof(float) * (size_t)max_pending * (size_t)e->kd);
    e->vp = malloc(sizeof(float) * (size_t)max_pending * (size_t)e->kd);
    e->ppar = malloc(sizeof(int32_t) * (size_t)max_pending);
    e->u = malloc(sizeof(float) * R * 2 * d);
    e->q = malloc(sizeof(float) * R * (size_t)e->qd);
    e->k = malloc(sizeof(float) * R * (size_t)e->kd);
    e->v = malloc(sizeof(float) * R * (size_t)e->kd);
    e->att = malloc(sizeof(float) * R * (size_t)e->qd);
    e->o = malloc(sizeof(float) * R * d);
    e->r = malloc(sizeof(float) * R * d);
    e->mm_in = malloc(sizeof(float) * R * SD_MAX(3 * d, (size_t)e->nff));
    e->gate = malloc(sizeof(float) * R * (size_t)e->nff);
    e->up = malloc(sizeof(float) * R * (size_t)e->nff);
    e->f = malloc(sizeof(float) * R * d);
    e->hn = malloc(sizeof(float) * R * d);
    e->e = malloc(sizeof(float) * d);
    e->sc_cap = (size_t)n_ctx + (size_t)max_pending;   // scores of one row and head, per thread
    e->sc = malloc(sizeof(float) * e->sc_cap * (size_t)(e->pool ? sd_pool_size(e->pool) : 1));
    e->rope_freq = malloc(sizeof(float) * (size_t)(e->hd / 2));
    size_t ws = 0;   // (every pack of this shape has the same types: sd_e3_swap_pack keeps it valid)
    for (int i = 0; i < M_N; i++) ws = SD_MAX(ws, sd_matmul_wsize(e->pk->mat[i].type, e->pk->mat[i].n_in, max_rows));
    e->mm.wbuf = malloc(ws ? ws : 64);
    e->mm.wbuf_size = ws;
    e->mm.pool = e->pool;
    if (!e->kc || !e->vc || !e->kp || !e->vp || !e->ppar || !e->u || !e->q || !e->k || !e->v || !e->att ||
        !e->o || !e->r || !e->mm_in || !e->gate || !e->up || !e->f || !e->hn || !e->e || !e->sc || !e->rope_freq ||
        !e->mm.wbuf) {
        sd_e3_free(e);
        return sd_err(err, errlen, "eagle3: out of memory");
    }
    for (int i = 0; i < e->hd / 2; i++) e->rope_freq[i] = (float)pow(hp->rope_base, -2.0 * i / e->hd);
    *out = e;
    return 0;
}

static void mat_apply(sd_e3 *e, int i, const float *x, int n, float *y) {
    const e3_mat *mt = &e->pk->mat[i];
    sd_matmul(&e->mm, mt->type, mt->W, mt->n_in, mt->n_out, x, n, y);
}

void sd_e3_fuse(sd_e3 *e, const float *feats, int n, float *g) {
    for (int i = 0; i < n; i += e->max_rows) {
        int c = SD_MIN(e->max_rows, n - i);
        sd_pool_acquire(e->pool);
        mat_apply(e, M_FC, feats + (size_t)i * 3 * e->d, c, g + (size_t)i * e->d);
        sd_pool_release(e->pool);
    }
}

static void rms(float *out, const float *x, const float *w, int n, float eps) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    float sc = (float)(1.0 / sqrt(s / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * sc * w[i];
}

static void rope(float *v, int n_heads, int hd, int pos, const float *freq) {
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            float th = (float)pos * freq[i];
            float c = cosf(th), s = sinf(th);
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = a * s + b * c;
        }
    }
}

// Attention of one head h of the row in pending slot `slot` (query q, output
// out: that row's), scores in sc.
static void attend_head(const sd_e3 *e, const float *q, int slot, int h, float *out, float *sc) {
    const int hd = e->hd, kd = e->kd, kh = h / (e->nh / e->nkv);
    const float scale = 1.0f / sqrtf((float)hd);
    // The keys this row sees: committed 0..n_cached-1, then its pending chain (root first).
    int chain[512], nch = 0;
    for (int s = slot; s >= 0 && nch < 512; s = e->ppar[s]) chain[nch++] = s;
    const int nk = e->n_cached + nch;
    const float *qh = q + (size_t)h * hd;
    float mx = -INFINITY;
    for (int j = 0; j < nk; j++) {
        const float *kr = j < e->n_cached ? e->kc + (size_t)j * kd : e->kp + (size_t)chain[nk - 1 - j] * kd;
        float s = vf_dot(qh, kr + (size_t)kh * hd, hd) * scale;
        sc[j] = s;
        mx = s > mx ? s : mx;
    }
    int j = 0;
    for (; j + SD_VW <= nk; j += SD_VW) vf_store(sc + j, vf_exp(vf_sub(vf_load(sc + j), vf_set1(mx))));
    for (; j < nk; j++) sc[j] = expf(sc[j] - mx);
    double sum = 0.0;
    for (j = 0; j < nk; j++) sum += sc[j];
    float inv = (float)(1.0 / sum);
    float *oh = out + (size_t)h * hd;
    memset(oh, 0, sizeof(float) * (size_t)hd);
    for (j = 0; j < nk; j++) {
        const float *vr = j < e->n_cached ? e->vc + (size_t)j * kd : e->vp + (size_t)chain[nk - 1 - j] * kd;
        vr += (size_t)kh * hd;
        float p = sc[j] * inv;
        for (int t = 0; t < hd; t++) oh[t] += p * vr[t];
    }
}

// The attention of rows slot0.. slot0+n-1, (row, head) pairs shared by the threads.
typedef struct att_job {
    const sd_e3 *e;
    int slot0, n;
} att_job;

static void att_task(void *arg, int ith, int nth) {
    const att_job *j = arg;
    const sd_e3 *e = j->e;
    long lo, hi;
    sd_split_range((long)j->n * e->nh, ith, nth, &lo, &hi);
    for (long w = lo; w < hi; w++) {
        const int i = (int)(w / e->nh), h = (int)(w % e->nh);
        attend_head(e, e->q + (size_t)i * e->qd, j->slot0 + i, h, e->att + (size_t)i * e->qd, e->sc + (size_t)ith * e->sc_cap);
    }
}

// Rows 0..n-1 as sd_e3_eval; the rows from `first` on get their outputs
// (the query, attention, feed-forward and output layer), those before it
// only their keys and values, which no output of another row depends on but
// through attention. h_out and logits hold the rows from `first` on.
static int eval_rows(sd_e3 *e, const int32_t *tok, const float *c, const int32_t *pos, const int32_t *parent, int n,
                     int first, float *h_out, float *logits, char *err, size_t errlen) {
    if (n < 1 || n > e->max_rows) return sd_err(err, errlen, "eagle3: %d rows (1..%d)", n, e->max_rows);
    if (e->n_pend + n > e->max_pending) return sd_err(err, errlen, "eagle3: no room for %d more pending rows", n);
    if (e->n_cached + e->n_pend + n > e->n_ctx + e->max_pending)
        return sd_err(err, errlen, "eagle3: the head's cache is full");
    for (int i = 0; i < n; i++) {
        if (parent[i] >= e->n_pend + i || parent[i] < -1)
            return sd_err(err, errlen, "eagle3: row %d has parent slot %d", i, parent[i]);
        if (tok[i] < 0 || tok[i] >= e->m->hp.n_vocab) return sd_err(err, errlen, "eagle3: token %d out of range", tok[i]);
    }
    const sd_head *h = e->h;
    const int d = e->d;
    const float eps = h->hp.rms_eps;
    const float *g_attn = e->pk->norm + N_ATTN * d, *g_hid = e->pk->norm + N_HIDDEN * d;
    for (int i = 0; i < n; i++) {
        float *u = e->u + (size_t)i * 2 * d;
        sd_model_token_embd(e->m, tok[i], e->e, NULL, 0);
        rms(u, e->e, g_attn, d, eps);
        rms(u + d, c + (size_t)i * d, g_hid, d, eps);
    }
    const int no = n - first;   // rows with outputs
    sd_pool_acquire(e->pool);
    mat_apply(e, M_Q, e->u + (size_t)first * 2 * d, no, e->q);
    mat_apply(e, M_K, e->u, n, e->k);
    mat_apply(e, M_V, e->u, n, e->v);
    sd_pool_release(e->pool);
    const int slot0 = e->n_pend;
    for (int i = 0; i < n; i++) {
        if (i >= first) rope(e->q + (size_t)(i - first) * e->qd, e->nh, e->hd, pos[i], e->rope_freq);
        rope(e->k + (size_t)i * e->kd, e->nkv, e->hd, pos[i], e->rope_freq);
        int s = slot0 + i;
        memcpy(e->kp + (size_t)s * e->kd, e->k + (size_t)i * e->kd, sizeof(float) * (size_t)e->kd);
        memcpy(e->vp + (size_t)s * e->kd, e->v + (size_t)i * e->kd, sizeof(float) * (size_t)e->kd);
        e->ppar[s] = parent[i];
    }
    e->n_pend += n;
    att_job aj = {e, slot0 + first, no};
    sd_pool_acquire(e->pool);
    sd_pool_run(e->pool, att_task, &aj);
    mat_apply(e, M_O, e->att, no, e->o);
    sd_pool_release(e->pool);
    const float *g_ffn = e->pk->norm + N_FFN * d;
    for (int i = 0; i < no; i++) {
        float *r = e->r + (size_t)i * d;
        const size_t ri = (size_t)(first + i);
        const float *res = h->hp.norm_before_residual ? e->u + ri * 2 * d + d : c + ri * d;
        for (int j = 0; j < d; j++) r[j] = res[j] + e->o[(size_t)i * d + j];
        rms(e->mm_in + (size_t)i * d, r, g_ffn, d, eps);
    }
    sd_pool_acquire(e->pool);
    mat_apply(e, M_GATE, e->mm_in, no, e->gate);
    mat_apply(e, M_UP, e->mm_in, no, e->up);
    for (size_t j = 0; j < (size_t)no * (size_t)e->nff; j++) {
        float gv = e->gate[j];
        e->gate[j] = gv / (1.0f + expf(-gv)) * e->up[j];
    }
    mat_apply(e, M_DOWN, e->gate, no, e->f);
    sd_pool_release(e->pool);
    const float *g_out = e->pk->norm + N_OUT * d;
    for (int i = 0; i < no; i++) {
        float *r = e->r + (size_t)i * d, *f = e->f + (size_t)i * d;
        for (int j = 0; j < d; j++) f[j] += r[j];   // f is now the output state h
        if (h_out) memcpy(h_out + (size_t)i * d, f, sizeof(float) * (size_t)d);
        rms(e->hn + (size_t)i * d, f, g_out, d, eps);
    }
    if (logits) {
        sd_pool_acquire(e->pool);
        mat_apply(e, M_OUT, e->hn, no, logits);
        sd_pool_release(e->pool);
    }
    return 0;
}

int sd_e3_eval(sd_e3 *e, const int32_t *tok, const float *c, const int32_t *pos, const int32_t *parent, int n,
               float *h_out, float *logits, char *err, size_t errlen) {
    return eval_rows(e, tok, c, pos, parent, n, 0, h_out, logits, err, errlen);
}

int sd_e3_eval_last(sd_e3 *e, const int32_t *tok, const float *c, const int32_t *pos, const int32_t *parent, int n,
                    float *h_out, float *logits, char *err, size_t errlen) {
    return eval_rows(e, tok, c, pos, parent, n, n >= 1 ? n - 1 : 0, h_out, logits, err, errlen);
}

int sd_e3_n_pending(const sd_e3 *e) { return e->n_pend; }
int sd_e3_n_cached(const sd_e3 *e) { return e->n_cached; }
int sd_e3_n_ctx(const sd_e3 *e) { return e->n_ctx; }

int sd_e3_commit(sd_e3 *e, const int32_t *slots, int n, char *err, size_t errlen) {
    if (e->n_cached + n > e->n_ctx) return sd_err(err, errlen, "eagle3: the head's cache is full (%d rows)", e->n_ctx);
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        if (s < 0 || s >= e->n_pend || e->ppar[s] != (i ? slots[i - 1] : -1))
            return sd_err(err, errlen, "eagle3: pending slots to commit are not a chain");
    }
    for (int i = 0; i < n; i++) {
        memcpy(e->kc + (size_t)(e->n_cached + i) * e->kd, e->kp + (size_t)slots[i] * e->kd, sizeof(float) * (size_t)e->kd);
        memcpy(e->vc + (size_t)(e->n_cached + i) * e->kd, e->vp + (size_t)slots[i] * e->kd, sizeof(float) * (size_t)e->kd);
    }
    e->n_cached += n;
    e->n_pend = 0;
    return 0;
}

void sd_e3_drop_pending(sd_e3 *e) { e->n_pend = 0; }

void sd_e3_truncate(sd_e3 *e, int n) {
    if (n >= 0 && n < e->n_cached) e->n_cached = n;
    e->n_pend = 0;
}
