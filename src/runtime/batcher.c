// batcher.c - several sessions' batches in one forward pass (sd_batcher,
// include/specdec.h). The pass itself is forward.c's (sd_fwd_run): this file
// checks the sessions and their batches, records each batch in its session,
// lays the sessions' nodes out as the segments of one activation matrix in
// the batcher's scratch and runs the pass, whose threads copy each session's
// V rows and logits to it (sd_fwd_pass.scatter).
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime/forward.h"
#include "runtime/gpu_session.h"

struct sd_batcher {
    const sd_model *m;
    sd_pool *pool;       // the sessions' pool (a reference)
    int n_nodes;         // most rows of a pass
    int failed;          // the batch the last failed sd_batcher_forward named, -1: none (the whole call)
    sd_mm_ctx mm;        // wbuf and abuf sized for the largest matmul with n_nodes tokens
    // Scratch of a pass, row t for node t (shapes as in struct sd_session, with n_nodes rows).
    float *x, *xn, *q, *k, *v, *att, *ff_g, *ff_u;
    float *rope_cs;      // (n_nodes, n_rot / 2, 2)
    float *logits;       // (n_nodes, n_vocab) the output matrix's rows, before they go to the sessions
    int32_t *out_rows;   // (n_nodes) rows of the pass that asked for logits, increasing
    sd_fwd_seg *seg;     // (n_nodes) one per session of a pass
};

int sd_batcher_new(sd_batcher **out, const sd_model *m, sd_threadpool *pool, int n_nodes, char *err,
                   size_t errlen) {
    *out = NULL;
    if (!m || !pool) return sd_err(err, errlen, "batcher: a model and a thread pool are required");
    if (n_nodes < 1 || n_nodes > 8192)
        return sd_err(err, errlen, "batcher: n_nodes %d out of range (1..8192)", n_nodes);
    const sd_hparams *hp = &m->hp;
    const size_t N = (size_t)n_nodes, kvd = (size_t)hp->n_head_kv * hp->head_dim,
                 qd = (size_t)hp->n_head * hp->head_dim;
    sd_batcher *b = calloc(1, sizeof(*b));
    if (!b) return sd_err(err, errlen, "out of memory");
    b->m = m;
    b->n_nodes = n_nodes;
    b->failed = -1;
    b->pool = sd_pool_ref(pool);
    b->x = sd_line_alloc(N * hp->n_embd * sizeof(float), 0);
    b->xn = sd_line_alloc(N * SD_MAX((size_t)hp->n_embd, qd) * sizeof(float), 0);
    b->q = sd_line_alloc(N * qd * sizeof(float), 0);
    b->k = sd_line_alloc(N * kvd * sizeof(float), 0);
    b->v = sd_line_alloc(N * kvd * sizeof(float), 0);
    b->att = sd_line_alloc(N * qd * sizeof(float), 0);
    b->ff_g = sd_line_alloc(N * hp->n_ff * sizeof(float), 0);
    b->ff_u = sd_line_alloc(N * hp->n_ff * sizeof(float), 0);
    b->rope_cs = malloc(N * (size_t)(hp->n_rot / 2 + 1) * 2 * sizeof(float));
    b->logits = sd_line_alloc(N * (size_t)hp->n_vocab * sizeof(float), 0);
    b->out_rows = malloc(N * sizeof(int32_t));
    b->seg = malloc(N * sizeof(sd_fwd_seg));
    b->mm.pool = b->pool;
    b->mm.wbuf_size = sd_fwd_wsize(m, n_nodes);
    b->mm.wbuf = malloc(b->mm.wbuf_size ? b->mm.wbuf_size : 1);
    b->mm.abuf_size = b->mm.wbuf_size;
    b->mm.abuf = malloc(b->mm.abuf_size ? b->mm.abuf_size : 1);
    if (!b->x || !b->xn || !b->q || !b->k || !b->v || !b->att || !b->ff_g || !b->ff_u || !b->rope_cs ||
        !b->logits || !b->out_rows || !b->seg || !b->mm.wbuf || !b->mm.abuf) {
        sd_batcher_free(b);
        return sd_err(err, errlen, "out of memory allocating a batcher of %d nodes", n_nodes);
    }
    *out = b;
    return 0;
}

void sd_batcher_free(sd_batcher *b) {
    if (!b) return;
    free(b->x);
    free(b->xn);
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->att);
    free(b->ff_g);
    free(b->ff_u);
    free(b->rope_cs);
    free(b->logits);
    free(b->out_rows);
    free(b->seg);
    free(b->mm.wbuf);
    free(b->mm.abuf);
    sd_pool_free(b->pool);
    free(b);
}

int sd_batcher_n_nodes(const sd_batcher *b) { return b->n_nodes; }

// 1 if the layer-skip masks a and b (n bytes, NULL: none skipped) skip the same layers.
static int same_skip(const uint8_t *a, const uint8_t *b, int n) {
    for (int l = 0; l < n; l++)
        if ((a && a[l]) != (b && b[l])) return 0;
    return 1;
}

// Every check of sd_batcher_forward, before anything is written.
static int check_all(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen) {
    b->failed = -1;
    if (n < 0 || n > b->n_nodes)
        return sd_err(err, errlen, "batcher: %d sessions, expected 0..%d (n_nodes)", n, b->n_nodes);
    if (n > 0 && (!ss || !bs)) return sd_err(err, errlen, "batcher: no sessions or no batches");
    long total = 0;
    for (int i = 0; i < n; i++) {
        const sd_session *s = ss[i];
        if (!s) return b->failed = i, sd_err(err, errlen, "batcher: session %d is NULL", i);
        if (s->m != b->m) return b->failed = i, sd_err(err, errlen, "batcher: session %d belongs to another model", i);
        if (s->pool != b->pool)
            return b->failed = i, sd_err(err, errlen, "batcher: session %d runs on another thread pool than the batcher's", i);
        for (int j = 0; j < i; j++)
            if (ss[j] == s) return b->failed = i, sd_err(err, errlen, "batcher: session %d is listed twice (also as %d)", i, j);
        char msg[256];
        const int cr = sd_fwd_check(s, &bs[i], msg, sizeof msg);
        if (cr < 0) return b->failed = i, sd_errc(cr, err, errlen, "batcher: session %d: %s", i, msg);
        if (!bs[i].precise != !bs[0].precise)
            return b->failed = i, sd_err(err, errlen,
                          "batcher: batch %d is %s but batch 0 is %s: one pass cannot mix precise (float) and normal "
                          "batches",
                          i, bs[i].precise ? "precise" : "normal", bs[0].precise ? "precise" : "normal");
        if (!same_skip(s->layer_skip, ss[0]->layer_skip, b->m->hp.n_layer))
            return b->failed = i, sd_err(err, errlen, "batcher: session %d skips other layers than session 0", i);
        total += bs[i].n;
    }
    if (total > b->n_nodes)
        return sd_err(err, errlen, "batcher: %ld nodes in all, more than the batcher's %d (n_nodes)", total,
                      b->n_nodes);
    return 0;
}

// Records every batch in its session and lays the pass out: the sessions'
// nodes as consecutive segments, their inputs, RoPE angles and logit rows.
static void layout(sd_batcher *b, sd_fwd_pass *p, sd_session *const *ss, const sd_batch *bs, int n) {
    const sd_hparams *hp = &b->m->hp;
    const size_t E = (size_t)hp->n_embd, cs = (size_t)(hp->n_rot / 2) * 2;
    int t0 = 0, o0 = 0, any_hid = 0;
    for (int i = 0; i < n; i++) {
        sd_session *s = ss[i];
        const int n_out = sd_fwd_record(s, &bs[i]);
        sd_fwd_embed(b->m, &bs[i], b->x + (size_t)t0 * E);
        memcpy(b->rope_cs + (size_t)t0 * cs, s->rope_cs, (size_t)bs[i].n * cs * sizeof(float));
        for (int r = 0; r < n_out; r++) b->out_rows[o0 + r] = t0 + s->out_rows[r];
        b->seg[i] = (sd_fwd_seg){.s = s, .t0 = t0, .n = bs[i].n, .o0 = o0, .n_out = n_out};
        any_hid |= s->n_hid > 0;
        t0 += bs[i].n;
        o0 += n_out;
    }
    *p = (sd_fwd_pass){.m = b->m, .mm = &b->mm, .seg = b->seg, .n_seg = n, .n = t0, .precise = bs[0].precise,
                       .any_hid = any_hid, .layer_skip = ss[0]->layer_skip, .out_rows = b->out_rows, .n_out = o0,
                       .x = b->x, .xn = b->xn, .q = b->q, .k = b->k, .att = b->att, .ff_g = b->ff_g,
                       .ff_u = b->ff_u, .rope_cs = b->rope_cs, .scatter = 1, .v = b->v, .logits = b->logits,
                       .l_lo = 0, .l_hi = b->m->hp.n_layer, .head = 1};
}

int sd_batcher_forward(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err,
                       size_t errlen) {
    return sd_batcher_forward_part(b, ss, bs, n, NULL, err, errlen);
}

int sd_batcher_forward_part(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n,
                            const sd_forward_part *part, char *err, size_t errlen) {
    b->failed = -1;
    const sd_model *m = b->m;
    const sd_forward_part whole = {.layer_lo = 0, .layer_hi = m->hp.n_layer, .output = 1, .x_out = NULL};
    if (!part) {
        if (m->layer_lo != 0 || m->layer_hi != m->hp.n_layer || !m->has_output)
            return sd_errc(SD_ERR_INPUT, err, errlen,
                           "batcher: the model holds layers [%d, %d) of %d only (a part of a pipeline: "
                           "sd_batcher_forward_part)", m->layer_lo, m->layer_hi, m->hp.n_layer);
        part = &whole;
    }
    if (!sd_pool_try_acquire(b->pool))
        return sd_errc(SD_ERR_BUSY, err, errlen,
                      "batcher: the thread pool is in use by another forward or sd_threadpool_run (sessions sharing "
                      "a pool must take turns)");
    int r = check_all(b, ss, bs, n, err, errlen);
    for (int i = 0; r == 0 && i < n; i++) {
        char msg[256];
        const int pr = sd_fwd_part_check(ss[i], &bs[i], part, msg, sizeof msg);
        if (pr < 0) b->failed = i, r = sd_errc(pr, err, errlen, "batcher: session %d: %s", i, msg);
    }
    if (r == 0 && n == 1) {
        // One session: its own forward, on its own scratch (no copies).
        r = sd_fwd_part(ss[0], &bs[0], part == &whole ? NULL : part, err, errlen);
        if (r < 0) b->failed = 0;
    } else if (r == 0 && n > 1) {
        sd_fwd_pass p;
        layout(b, &p, ss, bs, n);
        p.l_lo = part->layer_lo;
        p.l_hi = part->layer_hi;
        p.head = part->output;
        p.x_out = part->x_out;
        if (!part->output) {
            p.n_out = 0;
            for (int i = 0; i < n; i++) b->seg[i].n_out = 0;
        }
        if (ss[0]->gkv)
            r = sd_gpu_fwd_run(&p, err, errlen); // whole models only (sd_gpu_session_init)
        else
            sd_fwd_run(&p);
        if (!part->output)
            for (int i = 0; i < n; i++)
                for (int k = 0; k < bs[i].n; k++) ss[i]->logit_row[k] = -1;
    }
    sd_pool_release(b->pool);
    return r;
}

int sd_batcher_failed_batch(const sd_batcher *b) { return b ? b->failed : -1; }
