// pp_flight.c - rank 0's passes of several sessions round the ring
// (docs/mpi.md), in flight: pp_group_begin runs rank 0's layers over a
// group's batches and sends the message on without waiting, with a receive
// for its answer posted at once (MPI matches the answers to the receives in
// the order they were posted, which is the order they come round the ring);
// pp_group_end waits for one group's answer and runs the output layer. A
// server keeps several groups in flight (micro-batches), so that while rank
// k works on one group, rank k-1 works on the next. Also here: each rank's
// busy time, and how long several ranks computed at once.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/pp.h"
#include "mpi/pp_root.h"

typedef struct pp_flight {
    int used;
    char *sbuf, *rbuf;        // (scap), (rcap) bytes: the message sent, its answer
    size_t scap, rcap, bytes;
    MPI_Request sreq, rreq;
    int n;                    // sessions
    sd_session *ss[PP_MAX_GROUP];
    sd_batch bs[PP_MAX_GROUP];// the batches (copies; what they point to lives until pp_group_end)
    sd_batch ob[PP_MAX_GROUP];// the output stage's batches
    double t_send;            // pp_now_ms when it was sent
    int solo;                 // 1 while no other pass has been in flight with it
} pp_flight;

static pp_flight *g_fl[PP_MAX_FLIGHT];
static float *g_xs;           // (g_x_cap floats) a group's residual rows out of rank 0's layers
static size_t g_x_cap;

int pp_group_in_flight(int k) { return k >= 0 && k < PP_MAX_FLIGHT && g_fl[k] && g_fl[k]->used; }

int pp_sid_of(const sd_session *s) {
    for (int i = 0; i < pp0.attached; i++)
        if (pp0.sess[i] == s) return i;
    return -1;
}

int pp_groups(void) {
    if (!pp0.active || pp0.c.size == 1) return 1;
    return pp0.groups > 0 ? pp0.groups : pp0.c.size;
}

int pp_groups_pick(int n_threads, char *note, size_t len) {
    if (len) note[0] = 0;
    if (!pp0.active || pp0.c.size == 1) return 1;
    if (pp0.groups > 0) {
        snprintf(note, len, "pipeline of %d ranks, %d group%s of slots in flight (--pp-groups)", pp0.c.size, pp0.groups,
                 pp0.groups > 1 ? "s" : "");
        return pp0.groups;
    }
    int here = 0;
    for (int k = 0; k < pp0.c.size; k++) here += pp0.c.local[k];
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && (long)here * n_threads > cores) {   // groups in flight would only take turns on the cores
        pp0.groups = 1;
        snprintf(note, len, "pipeline of %d ranks, 1 group of slots in flight: the %d ranks on this host need %d "
                 "cores of its %ld, so groups in flight could not compute at once (--pp-groups G to choose)",
                 pp0.c.size, here, here * n_threads, cores);
    } else {
        pp0.groups = pp0.c.size;
        snprintf(note, len, "pipeline of %d ranks, %d groups of slots in flight (--pp-groups G to choose)", pp0.c.size,
                 pp0.groups);
    }
    return pp0.groups;
}

void pp_on_fault(void (*fn)(void *arg, const char *msg), void *arg) {
    pp0.c.on_fault = fn;
    pp0.c.fault_arg = arg;
}

void pp_keepalive(void) {
    pp_ctx *c = &pp0.c;
    if (!pp0.active || c->size == 1 || pp_now_ms() - c->t_sent < PP_KEEPALIVE_MS) return;
    for (int k = 0; k < PP_MAX_FLIGHT; k++)
        if (pp_group_in_flight(k)) return;
    static pp_hdr h;   // its own buffer: nothing else is in flight
    memset(&h, 0, sizeof h);
    h.type = PP_ALIVE;
    MPI_Request rq;
    c->t_sent = pp_now_ms();
    MPI_Isend(&h, (int)sizeof h, MPI_BYTE, 1, PP_TAG_RING, MPI_COMM_WORLD, &rq);
    pp_wait(c, &rq, 1, 1, "sending a keep-alive to", c->timeout_ms, NULL);
}

int pp_recovery(void) {
    // mpirun --enable-recovery, or -mca orte_abort_on_non_zero_status 0: both reach the ranks' environment
    const char *v = getenv("OMPI_MCA_orte_enable_recovery"), *a = getenv("OMPI_MCA_orte_abort_on_non_zero_status");
    return (v && (!strcmp(v, "1") || !strcmp(v, "true"))) || (a && (!strcmp(a, "0") || !strcmp(a, "false")));
}

// ---------------------------------------------------------------- busy time

void pp_busy_add(int k, double t0, double t1) {
    if (t1 <= t0) return;
    if (pp0.n_busy == PP_BUSY_MAX) {   // cannot happen with PP_MAX_FLIGHT passes; drop the oldest
        memmove(pp0.busy_iv, pp0.busy_iv + 1, sizeof pp0.busy_iv[0] * (PP_BUSY_MAX - 1));
        memmove(pp0.busy_rank, pp0.busy_rank + 1, sizeof pp0.busy_rank[0] * (PP_BUSY_MAX - 1));
        pp0.n_busy--;
    }
    pp0.busy_iv[pp0.n_busy][0] = t0;
    pp0.busy_iv[pp0.n_busy][1] = t1;
    pp0.busy_rank[pp0.n_busy++] = k;
}

void pp_busy_answer(const pp_hdr *a) {
    for (int k = 1; k < pp0.c.size; k++)
        if (a->rank_ms[k] > 0) {
            pp0.rank_wait[k] = a->rank_wait[k];
            const double t0 = a->rank_t0[k] - pp0.c.clock_off[k];
            pp_busy_add(k, t0, t0 + a->rank_ms[k]);
        }
}

static int cmp_ev(const void *a, const void *b) {
    const double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? -1 : x > y;
}

void pp_busy_settle(void) {
    double wm = pp_now_ms();
    for (int f = 0; f < PP_MAX_FLIGHT; f++)
        if (g_fl[f] && g_fl[f]->used && g_fl[f]->t_send < wm) wm = g_fl[f]->t_send;
    if (pp0.busy_wm == 0) pp0.busy_wm = wm;
    if (wm <= pp0.busy_wm) return;
    // the intervals' ends within [busy_wm, wm) as events (+1 / -1), swept in time order
    static double ev[2 * PP_BUSY_MAX][2];
    int ne = 0;
    for (int i = 0; i < pp0.n_busy; i++) {
        const double a = pp0.busy_iv[i][0] > pp0.busy_wm ? pp0.busy_iv[i][0] : pp0.busy_wm;
        const double b = pp0.busy_iv[i][1] < wm ? pp0.busy_iv[i][1] : wm;
        if (b <= a) continue;
        ev[ne][0] = a, ev[ne++][1] = 1;
        ev[ne][0] = b, ev[ne++][1] = -1;
    }
    qsort(ev, (size_t)ne, sizeof ev[0], cmp_ev);
    double t = pp0.busy_wm;
    int busy = 0;
    for (int i = 0; i < ne; i++) {
        const int k = busy < 0 ? 0 : busy > pp0.c.size ? pp0.c.size : busy;
        pp0.busy_ms[k] += ev[i][0] - t;
        t = ev[i][0];
        busy += (int)ev[i][1];
    }
    pp0.busy_ms[0] += wm - t;
    int j = 0;   // keep what ends after the watermark
    for (int i = 0; i < pp0.n_busy; i++)
        if (pp0.busy_iv[i][1] > wm) {
            pp0.busy_iv[j][0] = pp0.busy_iv[i][0], pp0.busy_iv[j][1] = pp0.busy_iv[i][1];
            pp0.busy_rank[j++] = pp0.busy_rank[i];
        }
    pp0.n_busy = j;
    pp0.busy_wm = wm;
}

// ---------------------------------------------------------------- passes

// The remote hidden layers a batch asks for: its n_hid entries travel when
// one of them lies past rank 0's layers.
static int remote_hidden(const sd_batch *b, int first_remote) {
    for (int k = 0; k < b->n_hidden_layers; k++)
        if (b->hidden_layers[k] != SD_HIDDEN_NORM && b->hidden_layers[k] >= first_remote) return 1;
    return 0;
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    free(*buf);
    *cap = (need + 4095) / 4096 * 4096;
    *buf = aligned_alloc(64, *cap);
    return *buf ? 0 : -1;
}

int pp_group_begin(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen) {
    pp_ctx *c = &pp0.c;
    const int E = c->n_embd, first_remote = c->lo[1];
    if (n < 1 || n > PP_MAX_GROUP) return snprintf(err, errlen, "pipeline: a pass of %d sessions (1..%d)", n, PP_MAX_GROUP), -1;
    int fi = 0;
    while (fi < PP_MAX_FLIGHT && g_fl[fi] && g_fl[fi]->used) fi++;
    if (fi == PP_MAX_FLIGHT) return snprintf(err, errlen, "pipeline: %d passes in flight already", PP_MAX_FLIGHT), -1;
    if (!g_fl[fi] && !(g_fl[fi] = calloc(1, sizeof(pp_flight)))) return snprintf(err, errlen, "pipeline: out of memory"), -1;
    pp_flight *f = g_fl[fi];
    for (int i = 0; i < n; i++) {   // the sessions' layer-skip masks (queued: before the message is built)
        const int sid = pp_sid_of(ss[i]);
        if (sid >= 0) pp_sync_skip(ss[i], sid);
    }
    // the message's size, then its headers and batch structure
    size_t need = (sizeof(pp_hdr) + sizeof(int32_t) * (size_t)pp0.n_ops + 63) / 64 * 64, total = 0;
    for (int i = 0; i < n; i++) {
        const int nh = remote_hidden(&bs[i], first_remote) ? bs[i].n_hidden_layers : 0;
        need += sizeof(pp_hdr) + sizeof(int32_t) * 3 * (size_t)bs[i].n + 128 +
                sizeof(float) * (size_t)bs[i].n * E * (1 + (size_t)nh);
        total += (size_t)bs[i].n;
    }
    if (total * E > g_x_cap) {
        free(g_xs);
        g_x_cap = total * E;
        g_xs = malloc(sizeof(float) * g_x_cap);
    }
    if (grow(&f->sbuf, &f->scap, need) < 0 || grow(&f->rbuf, &f->rcap, need > sizeof(pp_hdr) + 512 ? need : sizeof(pp_hdr) + 512) < 0 || !g_xs)
        return snprintf(err, errlen, "pipeline: out of memory"), -1;
    pp_hdr *h = (pp_hdr *)(void *)f->sbuf;
    memset(h, 0, sizeof *h);
    h->type = PP_GROUP;
    h->n = n;
    h->seq = sd_batcher_n_nodes(b);
    h->n_ops = pp0.n_ops;
    memcpy(f->sbuf + sizeof(pp_hdr), pp0.ops, sizeof(int32_t) * (size_t)pp0.n_ops);
    pp_view vs[PP_MAX_GROUP];
    char *sub = pp_group_first(f->sbuf);
    for (int i = 0; i < n; i++) {
        const sd_batch *bi = &bs[i];
        pp_hdr *sh = (pp_hdr *)(void *)sub;
        memset(sh, 0, sizeof *sh);
        sh->type = PP_FWD;
        sh->sid = pp_sid_of(ss[i]);
        if (sh->sid < 0) return snprintf(err, errlen, "pipeline: session %d of the pass is not attached", i), -1;
        sh->n = bi->n;
        sh->flags = (bi->parent ? PP_F_PARENT : 0) | (bi->pos ? PP_F_POS : 0) | (bi->precise ? PP_F_PRECISE : 0);
        if (remote_hidden(bi, first_remote)) {
            sh->n_hid = bi->n_hidden_layers;
            memcpy(sh->hid_layers, bi->hidden_layers, sizeof(int32_t) * (size_t)sh->n_hid);
            sh->flags |= bi->hidden ? PP_F_HIDDEN : 0;
            for (int k = 0; k < bi->n; k++) sh->n_wanted += !bi->hidden || bi->hidden[k];
        }
        pp_layout(sub, E, &vs[i]);
        for (int k = 0; k < bi->n; k++) {
            if (vs[i].parent) vs[i].parent[k] = bi->parent[k];
            if (vs[i].pos) vs[i].pos[k] = bi->pos[k];
            if (vs[i].hidden) vs[i].hidden[k] = bi->hidden[k];
        }
        sub = pp_group_next(sub, &vs[i]);
    }
    f->bytes = (size_t)(sub - f->sbuf);
    // rank 0's layers over every batch in one pass (a refused batch: nothing sent)
    const double t0 = pp_now_ms();
    const sd_forward_part first = {.layer_lo = 0, .layer_hi = first_remote, .output = 0, .x_out = g_xs};
    int r = sd_batcher_forward_part(b, ss, bs, n, &first, err, errlen);
    if (r < 0) return r;
    const double t1 = pp_now_ms();
    pp0.self_ms += t1 - t0;
    pp_busy_add(0, t0, t1);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        memcpy(vs[i].x, g_xs + off * E, sizeof(float) * (size_t)bs[i].n * E);
        off += (size_t)bs[i].n;
    }
    pp0.n_ops = 0;
    f->n = n;
    memcpy(f->ss, ss, sizeof(sd_session *) * (size_t)n);
    memcpy(f->bs, bs, sizeof(sd_batch) * (size_t)n);
    f->t_send = c->t_sent = pp_now_ms();
    MPI_Irecv(f->rbuf, (int)f->rcap, MPI_BYTE, c->size - 1, PP_TAG_RING, MPI_COMM_WORLD, &f->rreq);
    MPI_Isend(f->sbuf, (int)f->bytes, MPI_BYTE, 1, PP_TAG_RING, MPI_COMM_WORLD, &f->sreq);
    f->used = 1;
    int in_flight = 0;
    for (int k = 0; k < PP_MAX_FLIGHT; k++) in_flight += g_fl[k] && g_fl[k]->used;
    for (int k = 0; k < PP_MAX_FLIGHT; k++)
        if (g_fl[k] && g_fl[k]->used) g_fl[k]->solo = in_flight == 1;
    pp0.flights++;
    pp0.flight_sum += in_flight;
    return fi;
}

int pp_group_end(sd_batcher *b, int ticket, char *err, size_t errlen) {
    pp_ctx *c = &pp0.c;
    const int E = c->n_embd, first_remote = c->lo[1], L = c->n_layer;
    if (ticket < 0 || ticket >= PP_MAX_FLIGHT || !g_fl[ticket] || !g_fl[ticket]->used)
        return snprintf(err, errlen, "pipeline: no pass %d in flight", ticket), -1;
    pp_flight *f = g_fl[ticket];
    MPI_Request rq[2] = {f->rreq, f->sreq};
    double waited = 0;
    if (c->timeout_ms > 0) {   // the answer within --pp-timeout of the send, or every rank stops
        const double left = c->timeout_ms - (pp_now_ms() - f->t_send);
        pp_wait(c, rq, 2, c->size - 1, NULL, left > 1 ? left : 1, &waited);
    } else {
        pp_wait(c, rq, 2, c->size - 1, NULL, 0, &waited);
    }
    pp0.wait_ms += waited;
    f->used = 0;
    const pp_hdr *a = (const pp_hdr *)(const void *)f->rbuf;
    if (a->type == PP_ERR) {
        snprintf(err, errlen, "pipeline: %.400s", f->rbuf + sizeof(pp_hdr));
        pp_busy_settle();
        return SD_ERR_INPUT;
    }
    if (a->type != PP_GROUP || a->n != f->n)
        pp_die(c, "an answer of type %d for %d sessions from rank %d", a->type, a->n, c->size - 1);
    for (int k = 1; k < c->size; k++) pp0.other_ms += a->rank_ms[k], pp0.rank_ms[k] += a->rank_ms[k];
    if (f->solo) {
        pp0.solo_wait_ms += waited;
        for (int k = 1; k < c->size; k++) pp0.solo_other_ms += a->rank_ms[k];
        pp0.n_solo++;
    }
    pp_busy_answer(a);
    pp0.n_fwd++;
    char *sub = pp_group_first(f->rbuf);
    for (int i = 0; i < f->n; i++) {
        pp_view v;
        pp_layout(sub, E, &v);
        for (int k = 0; k < v.h->n_hid; k++) {
            const int l = v.h->hid_layers[k];
            if (l == SD_HIDDEN_NORM || l < first_remote) continue;
            for (int w = 0; w < v.h->n_wanted; w++)
                memcpy(f->bs[i].hidden_out + ((size_t)w * v.h->n_hid + k) * E, v.hid + ((size_t)w * v.h->n_hid + k) * E,
                       sizeof(float) * (size_t)E);
        }
        f->ob[i] = f->bs[i];
        f->ob[i].tokens = NULL;
        f->ob[i].embd = v.x;
        sub = pp_group_next(sub, &v);
    }
    const sd_forward_part last = {.layer_lo = L, .layer_hi = L, .output = 1, .x_out = NULL};
    const double t0 = pp_now_ms();
    const int r = sd_batcher_forward_part(b, f->ss, f->ob, f->n, &last, err, errlen);
    const double t1 = pp_now_ms();
    pp0.self_ms += t1 - t0;
    pp_busy_add(0, t0, t1);
    pp_busy_settle();
    return r;
}

int pp_forward_many(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen) {
    const int t = pp_group_begin(b, ss, bs, n, err, errlen);
    return t < 0 ? t : pp_group_end(b, t, err, errlen);
}
