// pp_worker.c - the ranks after the first of a pipeline (docs/mpi.md), and
// what every rank uses: the messages' layout, the waits with a deadline, the
// stop with a message. A worker loads only its layers, makes a session for
// each one rank 0 attaches (a generation's, a server's slots) when rank 0
// says how large, all on one thread pool, then serves the ring: each
// message from the rank before applies rank 0's commits and truncations to
// its caches, runs its layers on the residual rows (writing the hidden rows
// of its layers that rank 0's drafter asked for) and goes on to the next
// rank, in place.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi/pp_wire.h"

double pp_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#define now_ms pp_now_ms

void pp_layout(char *buf, int n_embd, pp_view *v) {
    pp_hdr *h = (pp_hdr *)(void *)buf;
    char *p = buf + sizeof(pp_hdr);
    v->h = h;
    v->ops = (int32_t *)(void *)p;
    p += sizeof(int32_t) * (size_t)h->n_ops;
    v->parent = v->pos = v->hidden = NULL;
    if (h->flags & PP_F_PARENT) v->parent = (int32_t *)(void *)p, p += sizeof(int32_t) * (size_t)h->n;
    if (h->flags & PP_F_POS) v->pos = (int32_t *)(void *)p, p += sizeof(int32_t) * (size_t)h->n;
    if (h->flags & PP_F_HIDDEN) v->hidden = (int32_t *)(void *)p, p += sizeof(int32_t) * (size_t)h->n;
    p = buf + ((size_t)(p - buf) + 63) / 64 * 64;
    v->x = (float *)(void *)p;
    p += sizeof(float) * (size_t)h->n * n_embd;
    v->hid = (float *)(void *)p;
    p += sizeof(float) * (size_t)h->n_wanted * h->n_hid * n_embd;
    v->bytes = (size_t)(p - buf);
}

char *pp_group_first(char *buf) {
    const pp_hdr *h = (const pp_hdr *)(const void *)buf;
    return buf + (sizeof(pp_hdr) + sizeof(int32_t) * (size_t)h->n_ops + 63) / 64 * 64;
}

char *pp_group_next(char *sub, const pp_view *v) { return sub + (v->bytes + 63) / 64 * 64; }

size_t pp_msg_cap(int n_batch, int n_embd, int ops_words) {
    return sizeof(pp_hdr) + sizeof(int32_t) * ((size_t)ops_words + 3 * (size_t)n_batch) + 64 +
           sizeof(float) * (size_t)n_batch * n_embd * (1 + SD_MAX_HIDDEN_LAYERS) +
           sizeof(pp_rank_stats) * PP_MAX_RANKS + 1024;
}

void pp_fast_wakeups(void) {
    // the waits sleep for a few microseconds at a time: with the default
    // 50 us timer slack every sleep lasts 50 us or more, and each hop of a
    // forward would pay one
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}

void pp_short_slice(pp_ctx *c, int n_threads) {
    // Linux's EEVDF scheduler (6.12 and later) lets a fair task ask for a
    // shorter time slice (sched_attr.sched_runtime): its deadlines come
    // sooner, so a rank woken by its message takes the core from another
    // job's thread at once instead of after that thread's slice. Measured on
    // the shared 2-core host, R = 2: the hop 0.29 ms instead of 0.42, the
    // speculative tokens/s 0.77x one process's instead of 0.66x (medians of
    // 6, docs/mpi.md). Not when this host's ranks need more cores than it
    // has: there the waking rank would take the core from another rank
    // computing (R = 3 on 2 cores was slower with it). Older kernels ignore
    // it; nothing changes when the call fails.
    int here = 0;
    for (int k = 0; k < c->size; k++) here += c->local[k];
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int fits = cores >= 1 && (long)here * n_threads <= cores;
    c->spin = c->wait_mode == PP_WAIT_SPIN || (c->wait_mode == 0 && fits);
    if (!fits) return;
    struct {   // struct sched_attr (linux/sched/types.h), version 1
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t prio;
        uint64_t runtime, deadline, period;
        uint32_t util_min, util_max;
    } a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.policy = 0;   // SCHED_OTHER, as it is
    a.nice = getpriority(PRIO_PROCESS, 0);
    a.runtime = PP_SLICE_NS;
    (void)syscall(SYS_sched_setattr, 0, &a, 0);
}

void pp_die(pp_ctx *c, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    void (*fault)(void *, const char *) = c->on_fault;
    c->on_fault = NULL;   // once: a fault inside the callback goes straight on
    if (fault) {
        char line[800];
        snprintf(line, sizeof line, "pipeline rank %d: %s", c->rank, msg);
        fault(c->fault_arg, line);
    }
    fprintf(stderr, "specdec: rank %d: %s; stopping every rank\n", c->rank, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

// A worker's SIGINT / SIGTERM: when it came (0: none).
static volatile sig_atomic_t g_term;
static double g_term_ms;
#define PP_TERM_GRACE_MS 3000.0

// 1 when rank k's process on this host is gone (or a zombie).
static int rank_dead(const pp_ctx *c, int k) {
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%d/stat", c->pid[k]);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(st, 1, sizeof st - 1, f) : 0;
    if (f) fclose(f);
    st[n] = 0;
    const char *rp = strrchr(st, ')');
    const char state = rp && rp[1] == ' ' ? rp[2] : 'X';
    return !n || state == 'Z' || state == 'X' || state == 'x';
}

void pp_check_alive(pp_ctx *c) {
    const double now = now_ms();
    if (now - c->t_alive < 50.0) return;
    c->t_alive = now;
    if (c->rank == 0) {   // a rank on another host that saw a peer die tells rank 0 (PP_TAG_FAULT)
        int got = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, PP_TAG_FAULT, MPI_COMM_WORLD, &got, &st) == MPI_SUCCESS && got) {
            char msg[256] = {0};
            MPI_Recv(msg, sizeof msg - 1, MPI_CHAR, st.MPI_SOURCE, PP_TAG_FAULT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            pp_die(c, "%s (seen by rank %d)", msg, st.MPI_SOURCE);
        }
    }
    // the other ranks watch only when mpirun would not stop them (pp_recovery): else it does, and a rank
    // that stops the job itself (MPI_Abort) would be reported again by the others as it goes
    // (nor once mpirun is stopping this one: a signal came, the others go too)
    if (c->rank > 0 && (!c->watch || g_term)) return;
    for (int k = 0; k < c->size; k++) {
        if (k == c->rank || !c->local[k] || c->pid[k] <= 0 || !rank_dead(c, k)) continue;
        char msg[256];
        snprintf(msg, sizeof msg, "rank %d (pid %d, layers %d-%d) died", k, c->pid[k], c->lo[k], c->lo[k + 1] - 1);
        if (c->rank == 0) pp_die(c, "%s", msg);
        if (k == 0 || c->local[0]) {   // rank 0 gone, or it sees this death itself: mpirun ends this rank first,
            if (c->t_fault == 0) c->t_fault = now;   // or else this rank stops the job after a grace
            // (rank 0's death: rank r reports it after r s, so that the lowest one alive speaks alone)
            if (now - c->t_fault > (k == 0 ? 1000.0 * c->rank : PP_FAULT_GRACE_MS)) pp_die(c, "%s", msg);
        } else if (c->t_fault == 0) {   // rank 0 on another host: told, it answers its requests and ends the job
            c->t_fault = now;
            MPI_Send(msg, (int)strlen(msg) + 1, MPI_CHAR, 0, PP_TAG_FAULT, MPI_COMM_WORLD);
        } else if (now - c->t_fault > PP_FAULT_GRACE_MS) {
            pp_die(c, "%s (rank 0 did not stop the job)", msg);
        }
    }
}


static void on_term(int sig) {
    (void)sig;
    g_term = 1;
}

// The waits poll: a short spin (answers that come at once: cache
// operations, pings), then sleeps growing from 2 us by half each time up to
// ~150 us, with the timer slack cut to 1 us (pp_fast_wakeups). No spinning
// beyond the first polls: on a host whose cores are shared (ranks
// oversubscribed, or other jobs) a spinning rank takes the core of the one
// computing, and a sleeping one lets the scheduler give its core to other
// work meanwhile. Measured against this on the shared 2-core host (docs/mpi.md,
// Hop latency): spinning with sched_yield, sleeping until the message is due
// (from the last waits) and polling every 20 us from then on, or both, all
// made the hops slower and the split's tokens/s lower.
// With --pp-wait spin, or by default when this host has a core for every
// rank's threads (pp_short_slice), the waits only poll for their first
// PP_SPIN_MS (then sleep as above: an idle server's ranks do not keep their
// cores busy): measured on the idle 2-core host, R = 2, the hop 0.024 ms
// instead of 0.27 ms and the speculative tokens/s 0.955x one process's
// instead of 0.86x (docs/mpi.md); slower when other jobs share the cores
// (--pp-wait sleep then).
#define PP_SPIN_MS 20.0
static void waiter_pause(const pp_ctx *c, long *polls, long *sleep_ns, double t0) {
    if ((c->spin && now_ms() - t0 < PP_SPIN_MS) || ++*polls <= 64) return;
    const struct timespec ts = {0, *sleep_ns};
    nanosleep(&ts, NULL);
    if (*sleep_ns < 100000) *sleep_ns += *sleep_ns / 2;
}

size_t pp_recv(pp_ctx *c, int from, char **buf, size_t *cap, MPI_Request *sreq, double timeout_ms, double *waited) {
    const double t0 = now_ms();
    long spins = 0, polls = 0, sleep_ns = 2000;
    MPI_Status st;
    for (;;) {
        int got = 0, sent = 1;
        int rc = MPI_Iprobe(from, PP_TAG_RING, MPI_COMM_WORLD, &got, &st);
        if (rc == MPI_SUCCESS && *sreq != MPI_REQUEST_NULL) rc = MPI_Test(sreq, &sent, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char es[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, es, &len);
            pp_die(c, "the link with rank %d failed (%s)", from, es);
        }
        if (got && sent) break;
        pp_check_alive(c);
        ++spins;
        waiter_pause(c, &polls, &sleep_ns, t0);
        if (timeout_ms > 0 && (spins & 63) == 0 && now_ms() - t0 > timeout_ms) {
            if (c->rank == 0 && from == c->size - 1)
                pp_die(c, "no answer from ranks 1..%d within %.0f s (--pp-timeout): one of them is stuck, killed or "
                          "unreachable", c->size - 1, timeout_ms / 1e3);
            if (c->rank > 0 && c->keepalive && from == 0)
                pp_die(c, "nothing from rank 0 within %.0f s (--pp-timeout + %d keep-alives of rank 0): rank 0 is "
                          "stuck, killed or unreachable", timeout_ms / 1e3, PP_KEEPALIVE_MISS);
            if (c->rank > 0 && c->keepalive)
                pp_die(c, "nothing from rank %d within %.0f s (--pp-timeout + %d keep-alives of rank 0): one of ranks "
                          "0..%d is stuck, killed or unreachable", from, timeout_ms / 1e3, PP_KEEPALIVE_MISS, from);
            pp_die(c, "waiting for rank %d: no answer within %.0f s (a rank is stuck, killed or unreachable)", from,
                   timeout_ms / 1e3);
        }
        if (g_term && c->rank > 0) {
            if (g_term_ms == 0) g_term_ms = now_ms();
            if (now_ms() - g_term_ms > PP_TERM_GRACE_MS) {
                fprintf(stderr, "specdec: rank %d: stopped by a signal, no quit from rank 0 within %.0f s\n", c->rank,
                        PP_TERM_GRACE_MS / 1e3);
                _exit(4);
            }
        }
    }
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    if ((size_t)n > *cap) {
        free(*buf);
        *cap = ((size_t)n + 4095) / 4096 * 4096;
        *buf = aligned_alloc(64, *cap);
        if (!*buf) pp_die(c, "out of memory for a message of %d bytes", n);
    }
    if (MPI_Recv(*buf, n, MPI_BYTE, from, PP_TAG_RING, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        pp_die(c, "receiving from rank %d failed", from);
    if (waited) *waited += now_ms() - t0;
    return (size_t)n;
}

int pp_wait(pp_ctx *c, MPI_Request *rq, int n, int peer, const char *what, double timeout_ms, double *waited) {
    const double t0 = now_ms();
    long spins = 0, polls = 0, sleep_ns = 2000;
    for (;;) {
        int done = 0;
        const int rc = MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char es[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, es, &len);
            pp_die(c, "%s rank %d failed (%s)", what ? what : "the link with", peer, es);
        }
        if (done) break;
        pp_check_alive(c);
        ++spins;
        waiter_pause(c, &polls, &sleep_ns, t0);
        if (timeout_ms > 0 && (spins & 63) == 0 && now_ms() - t0 > timeout_ms) {
            if (!what)   // rank 0 waiting for the ring's answer
                pp_die(c, "no answer from ranks 1..%d within %.0f s (--pp-timeout): one of them is stuck, killed or "
                          "unreachable", c->size - 1, c->timeout_ms / 1e3);
            pp_die(c, "%s rank %d: no answer within %.0f s (a rank is stuck, killed or unreachable)", what, peer,
                   timeout_ms / 1e3);
        }
    }
    if (waited) *waited += now_ms() - t0;
    return 0;
}

void pp_mem(double *rss_mib, double *hwm_mib) {
    *rss_mib = *hwm_mib = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long kb = 0;
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) *rss_mib = kb / 1024.0;
        if (sscanf(line, "VmHWM: %ld", &kb) == 1) *hwm_mib = kb / 1024.0;
    }
    fclose(f);
}

// The worker's sessions, by rank 0's session id, on one pool.
typedef struct worker {
    sd_model *m;
    sd_threadpool *pool;
    sd_session *sess[PP_MAX_SESSIONS];
    sd_batcher *bat;         // groups' passes (made at the first, on pool)
    float *xs;               // (x_cap floats) a group's residual rows out
    size_t x_cap;
    uint8_t *mask;           // (PP_MAX_GROUP * 8192) the groups' hidden masks
    sd_session *gs[PP_MAX_GROUP];
    sd_batch gb[PP_MAX_GROUP];
} worker;

static sd_session *session_of(pp_ctx *c, worker *w, int sid) {
    if (sid < 0 || sid >= PP_MAX_SESSIONS || !w->sess[sid]) pp_die(c, "a message for an unknown session %d", sid);
    return w->sess[sid];
}

// A group: this rank's layers over every session's batch in one batcher
// pass, the residual rows back into each session's message. 0, or <0 with
// a message.
static int run_group(pp_ctx *c, worker *w, char *msg, char *err, size_t errlen) {
    pp_hdr *h = (pp_hdr *)(void *)msg;
    const int n = h->n, E = c->n_embd;
    if (n < 1 || n > PP_MAX_GROUP) return snprintf(err, errlen, "a group of %d sessions", n), -1;
    pp_view vs[PP_MAX_GROUP];
    char *sub = pp_group_first(msg);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        pp_layout(sub, E, &vs[i]);
        const pp_hdr *sh = vs[i].h;
        w->gs[i] = session_of(c, w, sh->sid);
        uint8_t *mask = NULL;
        if (vs[i].hidden) {
            mask = w->mask + (size_t)i * 8192;
            for (int k = 0; k < sh->n && k < 8192; k++) mask[k] = (uint8_t)(vs[i].hidden[k] != 0);
        }
        w->gb[i] = (sd_batch){.n = sh->n, .embd = vs[i].x, .parent = vs[i].parent, .pos = vs[i].pos,
                              .precise = !!(sh->flags & PP_F_PRECISE), .hidden_layers = sh->hid_layers,
                              .n_hidden_layers = sh->n_hid, .hidden = mask, .hidden_out = vs[i].hid};
        total += (size_t)sh->n;
        sub = pp_group_next(sub, &vs[i]);
    }
    if (!w->bat || sd_batcher_n_nodes(w->bat) < h->seq) {
        sd_batcher_free(w->bat);
        w->bat = NULL;
        if (sd_batcher_new(&w->bat, w->m, w->pool, h->seq, err, errlen) < 0) return -1;
    }
    if (total * E > w->x_cap) {
        free(w->xs);
        w->x_cap = total * E;
        w->xs = malloc(sizeof(float) * w->x_cap);
        if (!w->xs) return snprintf(err, errlen, "out of memory"), -1;
    }
    const sd_forward_part part = {.layer_lo = c->lo[c->rank], .layer_hi = c->lo[c->rank + 1], .output = 0,
                                  .x_out = w->xs};
    if (sd_batcher_forward_part(w->bat, w->gs, w->gb, n, &part, err, errlen) < 0) return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        memcpy(vs[i].x, w->xs + off * E, sizeof(float) * (size_t)vs[i].h->n * E);
        off += (size_t)vs[i].h->n;
    }
    return 0;
}


// Session s's layer-skip mask from n words of bits (n = 0: none).
static int set_skip(pp_ctx *c, sd_session *s, const int32_t *words, int n, char *err, size_t errlen) {
    if (!n) return sd_session_set_layer_skip(s, NULL, err, errlen);
    if (n != (c->n_layer + 31) / 32) return snprintf(err, errlen, "a layer-skip mask of %d words", n), -1;
    uint8_t *m = malloc((size_t)c->n_layer);
    if (!m) return snprintf(err, errlen, "out of memory"), -1;
    for (int l = 0; l < c->n_layer; l++) m[l] = (uint8_t)((uint32_t)words[l / 32] >> (l % 32) & 1u);
    const int r = sd_session_set_layer_skip(s, m, err, errlen);
    free(m);
    return r;
}

// Applies rank 0's cache operations (commits, truncations, layer-skip
// masks, sessions gone), in order.
static void apply_ops(pp_ctx *c, worker *w, const int32_t *ops, int n_ops) {
    char err[256];
    for (int i = 0; i < n_ops;) {
        const int op = ops[i], n = ops[i + 2];
        sd_session *s = session_of(c, w, ops[i + 1]);
        int r = 0;
        if (op == PP_OP_COMMIT) r = sd_session_commit(s, ops + i + 3, n, err, sizeof err), i += 3 + n;
        else if (op == PP_OP_COMMIT_ALL) r = sd_session_commit(s, NULL, n, err, sizeof err), i += 3;
        else if (op == PP_OP_TRUNC) r = sd_session_truncate(s, n, err, sizeof err), i += 3;
        else if (op == PP_OP_SKIP) r = set_skip(c, s, ops + i + 3, n, err, sizeof err), i += 3 + n;
        else if (op == PP_OP_FREE) sd_session_free(s), w->sess[ops[i + 1]] = NULL, i += 3;
        else pp_die(c, "unknown cache operation %d from rank 0", op);
        if (r < 0) pp_die(c, "its cache cannot follow rank 0's: %s", err);
    }
}

// A new session alike rank 0's (PP_SETUP).
static void new_session(pp_ctx *c, worker *w, const pp_hdr *h) {
    char err[512];
    if (h->sid < 0 || h->sid >= PP_MAX_SESSIONS || w->sess[h->sid]) pp_die(c, "a bad new session %d", h->sid);
    if (!w->pool) {
        if (sd_threadpool_new(&w->pool, h->n_threads, err, sizeof err) < 0)
            pp_die(c, "cannot start its threads: %s", err);
        pp_short_slice(c, h->n_threads);
    }
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = h->n_ctx;
    sp.n_batch = h->n_batch;
    sp.pool = w->pool;
    if (sd_session_new(&w->sess[h->sid], w->m, &sp, err, sizeof err) < 0)
        pp_die(c, "cannot make its session %d: %s", h->sid, err);
}

// One forward message, in place: the layers of this rank on the residual
// rows, the wanted hidden rows of its layers written into the message.
static int run_forward(pp_ctx *c, sd_session *s, pp_view *v, char *err, size_t errlen) {
    const pp_hdr *h = v->h;
    uint8_t *hidden = NULL;
    if (v->hidden) {
        hidden = malloc((size_t)h->n);
        if (!hidden) return snprintf(err, errlen, "out of memory"), -1;
        for (int i = 0; i < h->n; i++) hidden[i] = (uint8_t)(v->hidden[i] != 0);
    }
    const sd_batch b = {.n = h->n, .embd = v->x, .parent = v->parent, .pos = v->pos, .precise = !!(h->flags & PP_F_PRECISE),
                        .hidden_layers = h->hid_layers, .n_hidden_layers = h->n_hid, .hidden = hidden,
                        .hidden_out = v->hid};
    const sd_forward_part part = {.layer_lo = c->lo[c->rank], .layer_hi = c->lo[c->rank + 1], .output = 0,
                                  .x_out = v->x};
    const int r = sd_session_forward_part(s, &b, &part, err, errlen);
    free(hidden);
    return r;
}

// Serves the ring until the quit. PP_WBUFS buffers in turn: the messages
// just sent may still be in flight (the next rank busy with an earlier
// group, rank 0 computing) while the next one is received and computed, so
// that with micro-batches in flight this rank does not wait for the next.
#define PP_WBUFS 3
static int serve_ring(pp_ctx *c, worker *w) {
    const int prev = c->rank - 1, next = (c->rank + 1) % c->size;
    char *buf[PP_WBUFS] = {c->sbuf, c->rbuf, NULL};
    size_t cap[PP_WBUFS] = {c->cap, c->cap, 0};
    MPI_Request sreq[PP_WBUFS] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    char err[512];
    int rc = 0;
    for (int i = 0;; i = (i + 1) % PP_WBUFS) {
        // (rank r's deadline r - 1 s later than rank 1's: the first to see the silence speaks alone)
        const double deadline = c->keepalive ? c->timeout_ms + PP_KEEPALIVE_MISS * PP_KEEPALIVE_MS + 1000.0 * (c->rank - 1) : 0;
        const size_t got = pp_recv(c, prev, &buf[i], &cap[i], &sreq[i], deadline, &c->mine.wait_ms);
        char *msg = buf[i];
        pp_view v;
        pp_layout(msg, c->n_embd, &v);
        size_t bytes = v.bytes;
        const int type = v.h->type;
        if (type == PP_QUIT) {
            pp_mem(&c->mine.rss_mib, &c->mine.hwm_mib);
            c->mine.lo = c->lo[c->rank];
            c->mine.hi = c->lo[c->rank + 1];
            sd_model_info mi;
            sd_model_get_info(w->m, &mi);
            c->mine.held_mib = mi.n_bytes_held / 1048576.0;
            pp_rank_stats *st = (pp_rank_stats *)(void *)(msg + sizeof(pp_hdr));
            st[c->rank] = c->mine;
            bytes = sizeof(pp_hdr) + sizeof(pp_rank_stats) * PP_MAX_RANKS;
            MPI_Send(msg, (int)bytes, MPI_BYTE, next, PP_TAG_RING, MPI_COMM_WORLD);
            break;
        }
        if (type == PP_ERR) {
            bytes = sizeof(pp_hdr) + 512;
        } else if (type == PP_PING) {
            // passed on as it is
        } else if (type == PP_ALIVE) {
            c->keepalive = 1;
            if (next == 0) continue;
            bytes = sizeof(pp_hdr);
        } else if (type == PP_SETUP) {
            // from the first session on, rank 0 keeps the ring busy (generate, bench) or sends
            // keep-alives when idle (serve): a silence of --pp-timeout + the keep-alives means it is gone
            c->keepalive = 1;
            new_session(c, w, v.h);
            if (next == 0) continue;
            bytes = sizeof(pp_hdr);
        } else if (type == PP_GROUP || type == PP_OPS || type == PP_FWD) {
            apply_ops(c, w, v.ops, v.h->n_ops);
            if (type == PP_OPS && next == 0) continue;   // nothing goes back for cache operations alone
            if (type != PP_OPS) {
                const double t0 = MPI_Wtime(), t0_ms = now_ms();
                const int r = type == PP_GROUP ? run_group(c, w, msg, err, sizeof err)
                                               : run_forward(c, session_of(c, w, v.h->sid), &v, err, sizeof err);
                if (type == PP_GROUP) bytes = got;
                if (r < 0) {
                    v.h->type = PP_ERR;
                    snprintf(msg + sizeof(pp_hdr), 512, "rank %d: %.480s", c->rank, err);
                    bytes = sizeof(pp_hdr) + 512;
                } else {
                    const double ms = (MPI_Wtime() - t0) * 1e3;
                    v.h->rank_ms[c->rank] = (float)ms;
                    v.h->rank_t0[c->rank] = t0_ms;
                    v.h->rank_wait[c->rank] = c->mine.wait_ms;
                    c->mine.compute_ms += ms;
                    c->mine.n_fwd++;
                }
            }
        } else {
            pp_die(c, "unknown message type %d from rank %d", type, prev);
        }
        MPI_Isend(msg, (int)bytes, MPI_BYTE, next, PP_TAG_RING, MPI_COMM_WORLD, &sreq[i]);
    }
    for (int i = 0; i < PP_WBUFS; i++) {
        if (sreq[i] != MPI_REQUEST_NULL) MPI_Wait(&sreq[i], MPI_STATUS_IGNORE);
        if (i >= 2) free(buf[i]);
    }
    c->sbuf = buf[0], c->rbuf = buf[1];
    return rc;
}

int pp_worker(pp_ctx *c, const char *path) {
    char err[512];
    // Ctrl-C and SIGTERM (mpirun passes them to every rank) stop rank 0's
    // command, whose quit then ends the workers; a worker that hears no quit
    // within PP_TERM_GRACE_MS of the signal (mpirun stopping the job after a
    // rank died) exits on its own
    signal(SIGINT, on_term);
    signal(SIGTERM, on_term);
    worker w;
    memset(&w, 0, sizeof w);
    if (sd_model_load_part(&w.m, path, c->lo[c->rank], c->lo[c->rank + 1], 0, err, sizeof err) < 0)
        pp_die(c, "cannot load its layers [%d, %d) of '%s': %s", c->lo[c->rank], c->lo[c->rank + 1], path, err);
    c->cap = 1 << 16;
    c->sbuf = aligned_alloc(64, c->cap);
    c->rbuf = aligned_alloc(64, c->cap);
    if (!c->sbuf || !c->rbuf) pp_die(c, "out of memory for its message buffers");
    w.mask = malloc((size_t)PP_MAX_GROUP * 8192);
    if (!w.mask) pp_die(c, "out of memory");
    const int rc = serve_ring(c, &w);
    sd_batcher_free(w.bat);
    free(w.xs);
    free(w.mask);
    for (int i = 0; i < PP_MAX_SESSIONS; i++) sd_session_free(w.sess[i]);
    sd_threadpool_free(w.pool);
    sd_model_free(w.m);
    free(c->sbuf);
    free(c->rbuf);
    return rc;
}
