// session.c - session lifetime, KV-cache commit / truncate, core count.
// The forward pass itself is in forward.c.
#include "runtime/gpu_session.h"
#include "runtime/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "specdec.h"

sd_session_params sd_session_default_params(void) {
    sd_session_params p;
    p.n_ctx = 0;
    p.n_batch = 0;
    p.n_threads = 0;
    p.pool = NULL;
    return p;
}

// Largest sd_matmul_wsize over every matrix of the model for n_tok tokens.
size_t sd_fwd_wsize(const sd_model *m, int64_t n_tok) {
    const sd_hparams *hp = &m->hp;
    size_t w = sd_matmul_wsize(m->output->type, hp->n_embd, n_tok);
    for (int l = 0; l < hp->n_layer; l++) {
        const sd_layer *L = &m->layers[l];
        const sd_tensor *ts[7] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; i < 7; i++) {
            size_t s = sd_matmul_wsize(ts[i]->type, ts[i]->ne[0], n_tok);
            if (s > w) w = s;
        }
    }
    return w;
}

// Cache-line aligned memory (zeroed if zero): the rows of the per-forward
// buffers are whole lines (their dims are multiples of 16 floats), so the
// threads that split a row's columns in chunks of 16 never write the same
// line. (malloc aligns large blocks to 16 bytes only: every row boundary
// would be a line both threads write.)
void *sd_line_alloc(size_t n, int zero) {
    const size_t r = n ? (n + 63) / 64 * 64 : 64;
    void *p = aligned_alloc(64, r);
    if (p && zero) memset(p, 0, r);
    return p;
}

int sd_session_new(sd_session **out, const sd_model *m, const sd_session_params *p,
                   char *err, size_t errlen) {
    *out = NULL;
    sd_session_params dp = sd_session_default_params();
    if (!p) p = &dp;
    const sd_hparams *hp = &m->hp;
    if (m->client)   // a split client's file (docs/split.md): embeddings for a drafter, no forward
        return sd_errc(SD_ERR_INPUT, err, errlen, "the model is a split client's file (no layers to run): it cannot run");
    int n_ctx = p->n_ctx > 0 ? p->n_ctx : SD_MIN(hp->n_ctx_train, 4096);
    int n_batch = p->n_batch > 0 ? p->n_batch : 512;
    int n_threads = p->n_threads > 0 ? p->n_threads : sd_n_cores();
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_threads < 0)
        return sd_err(err, errlen, "session parameters must be >= 0 (n_ctx %d, n_batch %d, n_threads %d)",
                      p->n_ctx, p->n_batch, p->n_threads);
    if (n_ctx > (1 << 24)) return sd_err(err, errlen, "n_ctx %d too large", n_ctx);
    if (n_batch > 8192) return sd_err(err, errlen, "n_batch %d too large (max 8192)", n_batch);
    if (n_threads > 256) n_threads = 256;
    if (n_batch > n_ctx) n_batch = n_ctx;

    sd_session *s = calloc(1, sizeof(*s));
    if (!s) return sd_errc(SD_ERR_OOM, err, errlen, "out of memory");
    s->m = m;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->kv_dim = hp->n_head_kv * hp->head_dim;
    s->q_dim = hp->n_head * hp->head_dim;
    s->l0 = m->layer_lo;
    s->n_lay = m->layer_hi - m->layer_lo;
    const size_t B = (size_t)n_batch;
    const size_t kv_elems = (size_t)s->n_lay * (size_t)n_ctx * (size_t)s->kv_dim;
    s->kt_nblk = (n_ctx + SD_KT_W - 1) / SD_KT_W;
    // zeroed: the slots past the written ones are read (and ignored) by the
    // score vectors, so they should hold numbers
    s->kt = sd_line_alloc((size_t)s->n_lay * (size_t)s->kv_dim * (size_t)s->kt_nblk * SD_KT_W * sizeof(uint16_t), 1);
    s->v_cache = sd_line_alloc(kv_elems * sizeof(uint16_t), 0);
    s->x = sd_line_alloc(B * hp->n_embd * sizeof(float), 0);
    s->xn = sd_line_alloc(B * SD_MAX(hp->n_embd, s->q_dim) * sizeof(float), 0);
    s->q = sd_line_alloc(B * s->q_dim * sizeof(float), 0);
    s->k = sd_line_alloc(B * s->kv_dim * sizeof(float), 0);
    s->v = sd_line_alloc(B * s->kv_dim * sizeof(float), 0);
    s->att = sd_line_alloc(B * s->q_dim * sizeof(float), 0);
    s->ff_g = sd_line_alloc(B * hp->n_ff * sizeof(float), 0);
    s->ff_u = sd_line_alloc(B * hp->n_ff * sizeof(float), 0);
    s->rope_cs = malloc(B * (size_t)(hp->n_rot / 2 + 1) * 2 * sizeof(float));
    s->rope_freq = malloc((size_t)(hp->n_rot / 2 + 1) * sizeof(double));
    s->anc = malloc(B * B * sizeof(int32_t));
    s->n_anc = malloc(B * sizeof(int32_t));
    s->parent = malloc(B * sizeof(int32_t));
    s->pos = malloc(B * sizeof(int32_t));
    s->out_rows = malloc(B * sizeof(int32_t));
    s->logit_row = malloc(B * sizeof(int32_t));
    s->hid_row = malloc(B * sizeof(int32_t));
    s->logits = sd_line_alloc(B * (size_t)hp->n_vocab * sizeof(float), 0);
    s->pool = p->pool ? sd_pool_ref(p->pool) : sd_pool_new(n_threads);
    s->n_threads = sd_pool_size(s->pool);
    s->att_scores = sd_line_alloc((size_t)s->n_threads * SD_ATT_QB * (size_t)s->kt_nblk * SD_KT_W * sizeof(float), 0);
    s->mm.pool = s->pool;
    s->mm.wbuf_size = sd_fwd_wsize(m, n_batch);
    s->mm.wbuf = malloc(s->mm.wbuf_size ? s->mm.wbuf_size : 1);
    s->mm.abuf_size = s->mm.wbuf_size;
    s->mm.abuf = malloc(s->mm.abuf_size ? s->mm.abuf_size : 1);
    if (!s->kt || !s->v_cache || !s->x || !s->xn || !s->q || !s->k || !s->v || !s->att || !s->ff_g || !s->ff_u ||
        !s->rope_cs || !s->rope_freq || !s->anc || !s->n_anc || !s->parent || !s->pos ||
        !s->out_rows || !s->logit_row || !s->hid_row || !s->logits || !s->pool || !s->att_scores || !s->mm.wbuf ||
        !s->mm.abuf) {
        sd_session_free(s);
        return sd_errc(SD_ERR_OOM, err, errlen, "out of memory allocating a session (n_ctx %d, n_batch %d: %.0f MiB of KV cache)",
                      n_ctx, n_batch, 2.0 * (double)kv_elems * sizeof(uint16_t) / (1 << 20));
    }
    for (int i = 0; i < hp->n_rot / 2; i++)
        s->rope_freq[i] = pow((double)hp->rope_base, -2.0 * i / hp->n_rot) / hp->rope_scale;
    for (int i = 0; i < n_batch; i++) s->logit_row[i] = -1;
    if (sd_gpu_session_init(s, p->gpu, err, errlen) < 0) {
        sd_session_free(s);
        return SD_ERR_INPUT;
    }
    if (m->on_session) {
        const int rc = m->on_session(m->on_session_arg, s, err, errlen);
        if (rc < 0) {
            sd_session_free(s);
            return rc;
        }
    }
    *out = s;
    return 0;
}

void sd_model_set_session_hook(sd_model *m, int (*fn)(void *arg, sd_session *s, char *err, size_t errlen),
                               void *arg) {
    if (!m) return;
    m->on_session = fn;
    m->on_session_arg = fn ? arg : NULL;
}

void sd_session_free(sd_session *s) {
    if (!s) return;
    if (s->hooks.release) s->hooks.release(s->hooks.arg);
    sd_gpu_session_free(s);
    free(s->kt);
    free(s->v_cache);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->ff_g);
    free(s->ff_u);
    free(s->rope_cs);
    free(s->rope_freq);
    free(s->att_scores);
    free(s->anc);
    free(s->n_anc);
    free(s->parent);
    free(s->pos);
    free(s->out_rows);
    free(s->logit_row);
    free(s->hid_row);
    free(s->logits);
    free(s->mm.wbuf);
    free(s->mm.abuf);
    free(s->layer_skip);
    sd_pool_free(s->pool);
    free(s);
}

const float *sd_session_logits(const sd_session *s, int i) {
    if (i < 0 || i >= s->n_batch || s->logit_row[i] < 0) return NULL;
    return s->logits + (size_t)s->logit_row[i] * (size_t)s->m->hp.n_vocab;
}

int sd_session_commit(sd_session *s, const int32_t *rows, int n_rows, char *err, size_t errlen) {
    const int np = s->n_pending;
    if (!rows) {
        // Keep every pending row: valid only if the last batch was a chain.
        for (int i = 0; i < np; i++)
            if (s->parent[i] != i - 1)
                return sd_err(err, errlen, "commit of all rows: the last batch is not a chain (node %d has parent %d)",
                              i, s->parent[i]);
        s->n_past += np;
        s->n_pending = 0;
        if (s->hooks.commit) s->hooks.commit(s->hooks.arg, NULL, np);
        return 0;
    }
    if (n_rows < 0 || n_rows > np)
        return sd_err(err, errlen, "commit of %d rows, but the last forward left %d pending rows", n_rows, np);
    for (int k = 0; k < n_rows; k++) {
        int r = rows[k];
        if (r < 0 || r >= np)
            return sd_err(err, errlen, "commit: row %d (index %d) is not a pending row (0..%d)", r, k, np - 1);
        int want = k == 0 ? -1 : rows[k - 1];
        if (s->parent[r] != want)
            return sd_err(err, errlen, "commit: rows are not a root-to-node chain (row %d has parent %d, expected %d)",
                          r, s->parent[r], want);
    }
    // rows[k] >= k and strictly increasing, so copying in increasing k never
    // overwrites a source row still to be read.
    const size_t kvd = (size_t)s->kv_dim;
    int first = 0; // rows before it stay where they are
    while (first < n_rows && rows[first] == first) first++;
    if (s->gkv) {
        const int r = sd_gpu_commit(s, rows, first, n_rows, err, errlen);
        if (r < 0) return r;
        first = n_rows; // moved on the device
    }
    for (int l = s->l0; l < s->l0 + s->n_lay && first < n_rows; l++) {
        if (s->layer_skip && s->layer_skip[l]) continue;   // no rows were written
        uint16_t *vc = s->v_cache + (size_t)(l - s->l0) * s->n_ctx * kvd;
        for (int k = first; k < n_rows; k++) {
            sd_kt_move(s, l, s->n_past + k, s->n_past + rows[k]);
            size_t dst = (size_t)(s->n_past + k) * kvd, src = (size_t)(s->n_past + rows[k]) * kvd;
            memcpy(vc + dst, vc + src, kvd * sizeof(uint16_t));
        }
    }
    s->n_past += n_rows;
    s->n_pending = 0;
    if (s->hooks.commit) s->hooks.commit(s->hooks.arg, rows, n_rows);
    return 0;
}

void sd_session_set_hooks(sd_session *s, const sd_session_hooks *h) {
    if (h) s->hooks = *h;
    else memset(&s->hooks, 0, sizeof s->hooks);
}

int sd_session_truncate(sd_session *s, int n, char *err, size_t errlen) {
    if (n < 0 || n > s->n_past)
        return sd_err(err, errlen, "truncate to %d rows, but the cache holds %d", n, s->n_past);
    s->n_past = n;
    s->n_pending = 0;
    if (s->hooks.truncate) s->hooks.truncate(s->hooks.arg, n);
    return 0;
}

int sd_session_set_layer_skip(sd_session *s, const uint8_t *skip, char *err, size_t errlen) {
    const int nl = s->m->hp.n_layer;
    int n = 0;
    if (skip)
        for (int l = 0; l < nl; l++) n += skip[l] != 0;
    if (n == 0) {
        free(s->layer_skip);
        s->layer_skip = NULL;
        s->n_skip = 0;
        return 0;
    }
    if (n == nl) return sd_err(err, errlen, "layer skip: all %d layers would be skipped", nl);
    if (!s->layer_skip) {
        s->layer_skip = malloc((size_t)nl);
        if (!s->layer_skip) return sd_errc(SD_ERR_OOM, err, errlen, "out of memory");
    }
    for (int l = 0; l < nl; l++) s->layer_skip[l] = skip[l] != 0;
    s->n_skip = n;
    s->n_pending = 0;   // pending rows were computed with the old mask
    return n;
}

const uint8_t *sd_session_layer_skip(const sd_session *s) { return s->layer_skip; }

int sd_session_n_past(const sd_session *s) { return s->n_past; }
int sd_session_n_ctx(const sd_session *s) { return s->n_ctx; }
int sd_session_n_batch(const sd_session *s) { return s->n_batch; }
const sd_model *sd_session_model(const sd_session *s) { return s->m; }
sd_threadpool *sd_session_pool(const sd_session *s) { return s->pool; }
