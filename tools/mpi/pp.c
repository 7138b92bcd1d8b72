// pp.c - pipeline parallelism over MPI (make MPI=1; docs/mpi.md): the
// launch (options, the checks every rank agrees on, the split of the
// layers) and rank 0's side. Rank 0 holds the tokenizer, the embeddings,
// the first layers, the output layer, the drafter, sampling and
// verification: the command runs there as in one process, on a session
// whose hooks (sd_session_set_hooks) send each forward round the ring of
// ranks (pp_worker.c) and queue each commit and truncation for the next
// forward. Every rank runs the same kernels on the same rows in the same
// order as one process would, so the output is the same, bit for bit.
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi/pp.h"
#include "mpi/pp_root.h"

pp_root pp0;
static char g_path[1024];   // the model the ranks loaded
static double g_held_mib, g_total_mib; // rank 0's weights held, and the whole model's (MiB)
static double g_ping_ms[3];   // --pp-stats: median time of a message of 1 and 16 rows round the ring, and of
                              // 1 row sent after rank 0 computed for 5 ms (the other ranks asleep in their waits) (ms)

// ---------------------------------------------------------------- the launch

typedef struct fact {
    int32_t ok, n_layer, n_embd, pad;
    uint64_t fsize, fp;
    double w_layer, w_output;   // weights of one layer and of the output matrix (their compute)
    int32_t pid, pad2;          // the process, and its host (a dead rank on rank 0's host is seen at once)
    char host[64];
    char msg[240];
} fact;

// FNV-1a of the file's first MiB and last 64 KiB (its header, the first and
// last tensors) and its size: two model files practically never share it.
static int file_fingerprint(const char *path, uint64_t *size, uint64_t *fp, char *msg, size_t len) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(msg, len, "cannot open the model '%s'", path);
        if (fd >= 0) close(fd);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    uint64_t h = 0xcbf29ce484222325ull;
    static unsigned char buf[1 << 20];
    const off_t offs[2] = {0, st.st_size > (1 << 16) ? st.st_size - (1 << 16) : 0};
    const size_t lens[2] = {sizeof buf, 1 << 16};
    for (int k = 0; k < 2; k++) {
        const ssize_t n = pread(fd, buf, lens[k], offs[k]);
        for (ssize_t i = 0; i < n; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
    }
    close(fd);
    *fp = h;
    return 0;
}

// The model path of the command line (-m, --model, --model=).
static const char *model_arg(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) return argv[i + 1];
        if (!strncmp(argv[i], "--model=", 8)) return argv[i] + 8;
    }
    return NULL;
}

// This rank's facts: the command, the model file, its layers.
static void my_facts(int argc, char **argv, int want_ranks, int size, fact *f) {
    memset(f, 0, sizeof *f);
    f->pid = (int32_t)getpid();
    gethostname(f->host, sizeof f->host - 1);
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "generate") && strcmp(cmd, "bench") && strcmp(cmd, "serve")) {
        snprintf(f->msg, sizeof f->msg, "--pp works with generate, bench and serve, not '%s'", cmd);
        return;
    }
    if (want_ranks != size) {
        snprintf(f->msg, sizeof f->msg, "the pipeline asks for %d ranks but mpirun started %d (mpirun -np %d ... --pp %d)",
                 want_ranks, size, want_ranks, want_ranks);
        return;
    }
    const char *path = model_arg(argc, argv);
    if (!path) {
        snprintf(f->msg, sizeof f->msg, "no model given (-m FILE)");
        return;
    }
    snprintf(g_path, sizeof g_path, "%s", path);
    if (file_fingerprint(path, &f->fsize, &f->fp, f->msg, sizeof f->msg) < 0) return;
    sd_model *m = NULL;
    char err[512];
    if (sd_model_load_part(&m, path, 0, 0, 0, err, sizeof err) < 0) {   // the header alone
        snprintf(f->msg, sizeof f->msg, "%.230s", err);
        return;
    }
    sd_model_info mi;
    sd_model_get_info(m, &mi);
    sd_model_free(m);
    f->n_layer = mi.n_layer;
    f->n_embd = mi.n_embd;
    const double E = mi.n_embd, Q = (double)mi.n_head * mi.head_dim, KV = (double)mi.n_head_kv * mi.head_dim;
    f->w_layer = 2 * E * Q + 2 * E * KV + 3 * E * mi.n_ff;
    f->w_output = E * mi.n_vocab;
    f->ok = 1;
}

// The layers of each rank: the --layers counts, or a split that balances
// the weights each rank reads per forward: rank 0 also runs the output
// matrix (w_output, as many weights as w_output / w_layer layers: 8 of
// SmolLM2's 30, about 1 of a 70B model's 80), so it takes that many fewer
// layers, and the others share the rest evenly (the remainder to the last
// ones). 0, or -1 with a message.
static int split_layers(const char *spec, int R, int n_layer, double w_layer, double w_output, int *lo, char *msg,
                        size_t len) {
    if (R > n_layer)
        return snprintf(msg, len, "%d ranks for a model of %d layers: at most one rank per layer (--pp %d or fewer)", R,
                        n_layer, n_layer), -1;
    lo[0] = 0;
    if (!spec) {
        int first = n_layer;
        if (R > 1) {
            const double share = (n_layer * w_layer + w_output) / R;
            first = (int)((share - w_output) / w_layer + 0.5);
            first = first < 1 ? 1 : first > n_layer - (R - 1) ? n_layer - (R - 1) : first;
        }
        lo[1] = first;
        const int rest = n_layer - first, base = R > 1 ? rest / (R - 1) : 0, rem = R > 1 ? rest % (R - 1) : 0;
        for (int k = 1; k < R; k++) lo[k + 1] = lo[k] + base + (k >= R - rem);
        return 0;
    }
    int k = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 100000 || (*end && *end != ','))
            return snprintf(msg, len, "--layers '%s': expected a count of layers per rank, each >= 1, e.g. 10,10,10",
                            spec), -1;
        if (k == R) return snprintf(msg, len, "--layers '%s' gives more entries than the %d ranks", spec, R), -1;
        lo[k + 1] = lo[k] + (int)v;
        k++;
        p = *end ? end + 1 : end;
    }
    if (k != R) return snprintf(msg, len, "--layers '%s' gives %d entries for %d ranks", spec, k, R), -1;
    if (lo[R] != n_layer)
        return snprintf(msg, len, "--layers '%s' covers %d layers, but the model has %d: the counts must sum to %d",
                        spec, lo[R], n_layer, n_layer), -1;
    return 0;
}

// The verdict every rank reaches from the same facts. 0, or -1 with a message.
static int verdict(const fact *all, int size, const char *spec, int R, int *lo, char *msg, size_t len) {
    for (int k = 0; k < size; k++)
        if (!all[k].ok) return snprintf(msg, len, "rank %d: %s", k, all[k].msg), -1;
    for (int k = 1; k < size; k++)
        if (all[k].fsize != all[0].fsize || all[k].fp != all[0].fp)
            return snprintf(msg, len,
                            "the model files differ between ranks: rank 0's has %llu bytes, rank %d's %llu bytes%s; "
                            "every rank must load the same file",
                            (unsigned long long)all[0].fsize, k, (unsigned long long)all[k].fsize,
                            all[k].fsize == all[0].fsize ? " and other contents" : ""), -1;
    return split_layers(spec, R, all[0].n_layer, all[0].w_layer, all[0].w_output, lo, msg, len);
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    const long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "specdec: %s needs an integer in %d..%d, got '%s'\n", flag, lo, hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

static void pp_finish(void);

// Each rank's clock against rank 0's (the busy time's intervals come in the
// other ranks' clocks): 5 exchanges with each, the one of the shortest trip.
#define PP_TAG_CLOCK 13
static void clock_offsets(pp_ctx *c) {
    for (int k = 1; k < c->size; k++) {
        double best = 1e30;
        for (int i = 0; i < 5; i++) {
            double t[2] = {pp_now_ms(), 0};
            if (c->rank == 0) {
                MPI_Send(t, 1, MPI_DOUBLE, k, PP_TAG_CLOCK, MPI_COMM_WORLD);
                MPI_Recv(t + 1, 1, MPI_DOUBLE, k, PP_TAG_CLOCK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                const double t1 = pp_now_ms();
                if (t1 - t[0] < best) best = t1 - t[0], c->clock_off[k] = t[1] - (t[0] + t1) / 2;
            } else if (c->rank == k) {
                MPI_Recv(t + 1, 1, MPI_DOUBLE, 0, PP_TAG_CLOCK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                t[0] = pp_now_ms();
                MPI_Send(t, 1, MPI_DOUBLE, 0, PP_TAG_CLOCK, MPI_COMM_WORLD);
            }
        }
    }
}

// Open MPI binds each rank to one core by default when it starts 2 ranks
// or fewer (to a socket with more): every thread of a rank with -t T > 1
// would then share that core, and a rank could not move off a core that
// other work uses (measured: R = 2 at about half the tokens/s of unbound
// ranks on the shared 2-core host, docs/mpi.md). So a rank bound by that
// default (no --bind-to / --map-by given: Open MPI then sets no binding or
// mapping policy in the environment) may run on every core; a binding the
// user asked for is kept (rank 0 warns when it leaves it fewer cores than
// threads, pp_attach).
static void unbind_default(void) {
    if (getenv("OMPI_MCA_hwloc_base_binding_policy") || getenv("OMPI_MCA_rmaps_base_mapping_policy")) return;
    cpu_set_t cs;
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1 || sched_getaffinity(0, sizeof cs, &cs) != 0 || CPU_COUNT(&cs) >= n) return;
    CPU_ZERO(&cs);
    for (long k = 0; k < n && k < CPU_SETSIZE; k++) CPU_SET((int)k, &cs);
    (void)sched_setaffinity(0, sizeof cs, &cs);   // a cpuset narrower than the host: the kernel keeps its part
}

int pp_main(int *argc, char **argv) {
    int R = 0, any = 0, timeout_s = 120, j = 1;
    const char *spec = NULL, *wait_mode = "auto";
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (!strcmp(a, "--pp") || !strcmp(a, "--layers") || !strcmp(a, "--pp-timeout") || !strcmp(a, "--pp-groups") ||
            !strcmp(a, "--pp-wait")) {
            v = i + 1 < *argc ? argv[++i] : NULL;
        } else if (!strncmp(a, "--pp=", 5) || !strncmp(a, "--layers=", 9) || !strncmp(a, "--pp-timeout=", 13) ||
                   !strncmp(a, "--pp-groups=", 12) || !strncmp(a, "--pp-wait=", 10)) {
            v = strchr(a, '=') + 1;
        } else if (!strcmp(a, "--pp-stats")) {
            pp0.c.stats = 1;
            continue;
        } else {
            argv[j++] = argv[i];
            continue;
        }
        if (!strncmp(a, "--pp-wait", 9)) {
            if (!v || (strcmp(v, "auto") && strcmp(v, "spin") && strcmp(v, "sleep"))) {
                const char *wr0 = getenv("OMPI_COMM_WORLD_RANK");   // one message, from rank 0
                if (!wr0 || !atoi(wr0)) fprintf(stderr, "specdec: --pp-wait takes auto, spin or sleep, got '%s'\n", v ? v : "");
                return 2;
            }
            wait_mode = v;
        } else if (!strncmp(a, "--pp-groups", 11)) {
            if (parse_int("--pp-groups", v, 1, PP_MAX_FLIGHT, &pp0.groups) < 0) return 2;
        } else if (!strncmp(a, "--pp-timeout", 12)) {
            if (parse_int("--pp-timeout", v, 1, 86400, &timeout_s) < 0) return 2;
        } else if (!strncmp(a, "--pp", 4)) {
            if (parse_int("--pp", v, 1, PP_MAX_RANKS, &R) < 0) return 2;
            any = 1;
        } else {
            if (!v) return fprintf(stderr, "specdec: --layers needs a value (layers per rank, e.g. 10,10,10)\n"), 2;
            spec = v;
            any = 1;
        }
    }
    argv[j] = NULL;
    *argc = j;
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *wr = getenv("OMPI_COMM_WORLD_RANK");
    const int world = ws ? atoi(ws) : 1, wrank = wr ? atoi(wr) : 0;
    if (!any) {
        if (world <= 1) return -1;
        if (wrank == 0)
            fprintf(stderr, "specdec: launched on %d MPI ranks without --pp: add --pp %d to split the model's layers "
                            "over them (or run one process)\n", world, world);
        return 2;
    }
    if (!R && spec) {   // --layers alone: one rank per entry
        R = 1;
        for (const char *p = spec; *p; p++) R += *p == ',';
    }
    unbind_default();
    int provided = 0;
    MPI_Init_thread(argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &pp0.c.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &pp0.c.size);
    pp0.c.timeout_ms = timeout_s * 1e3;
    pp0.c.wait_mode = !strcmp(wait_mode, "spin") ? PP_WAIT_SPIN : !strcmp(wait_mode, "sleep") ? PP_WAIT_SLEEP : 0;
    fact mine, all[PP_MAX_RANKS];
    if (pp0.c.size > PP_MAX_RANKS) {
        if (pp0.c.rank == 0) fprintf(stderr, "specdec: %d ranks: at most %d\n", pp0.c.size, PP_MAX_RANKS);
        MPI_Finalize();
        return 2;
    }
    my_facts(*argc, argv, R, pp0.c.size, &mine);
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
    char msg[600];
    if (verdict(all, pp0.c.size, spec, R, pp0.c.lo, msg, sizeof msg) < 0) {
        if (pp0.c.rank == 0) fprintf(stderr, "specdec: %s\n", msg);
        MPI_Finalize();
        return 2;
    }
    pp_fast_wakeups();
    for (int k = 0; k < pp0.c.size; k++) {
        pp0.c.pid[k] = all[k].pid;
        pp0.c.local[k] = !strcmp(all[k].host, all[pp0.c.rank].host);
    }
    clock_offsets(&pp0.c);
    pp0.c.watch = pp_recovery();
    pp0.c.n_layer = all[0].n_layer;
    pp0.c.n_embd = all[0].n_embd;
    if (pp0.c.rank > 0) {
        const int rc = pp_worker(&pp0.c, g_path);
        MPI_Finalize();
        return rc;
    }
    pp0.active = 1;
    atexit(pp_finish);
    return -1;
}

int pp_active(void) { return pp0.active; }

// ---------------------------------------------------------------- rank 0

static int attach_new(void *arg, sd_session *s, char *err, size_t errlen) {
    (void)arg;
    return pp_attach(s, err, errlen);
}

int pp_model_load(sd_model **out, const char *path, char *err, size_t errlen) {
    if (!pp0.active || pp0.c.size == 1) return sd_model_load(out, path, err, errlen);
    const int r = sd_model_load_part(out, path, 0, pp0.c.lo[1], 1, err, errlen);
    if (r == 0) {
        // every session of the part reaches every rank: the command's, a
        // server's slots, and those a drafter makes on the target (skip:)
        sd_model_set_session_hook(*out, attach_new, NULL);
        sd_model_info mi;
        sd_model_get_info(*out, &mi);
        g_held_mib = mi.n_bytes_held / 1048576.0;
        g_total_mib = mi.n_bytes / 1048576.0;
    }
    return r;
}

static size_t g_rcap;   // bytes of pp0.c.rbuf (pp_recv grows it)

// Sends the message in sbuf (bytes) to rank 1; with `answer`, receives the
// last rank's into rbuf (what: for the message naming the wait). The send
// is complete on return.
static void ring_trip(pp_ctx *c, size_t bytes, int answer, const char *what, double *waited) {
    MPI_Request sreq;
    c->t_sent = pp_now_ms();
    MPI_Isend(c->sbuf, (int)bytes, MPI_BYTE, 1, PP_TAG_RING, MPI_COMM_WORLD, &sreq);
    if (answer) {
        pp_recv(c, c->size - 1, &c->rbuf, &g_rcap, &sreq, c->timeout_ms, waited);
    } else {
        pp_wait(c, &sreq, 1, 1, what, c->timeout_ms, waited);
    }
}

// Sends the queued cache operations round the ring on their own.
static void flush_ops(void) {
    if (!pp0.n_ops) return;
    pp_hdr *h = (pp_hdr *)(void *)pp0.c.sbuf;
    memset(h, 0, sizeof *h);
    h->type = PP_OPS;
    h->n_ops = pp0.n_ops;
    pp_view v;
    pp_layout(pp0.c.sbuf, pp0.c.n_embd, &v);
    memcpy(v.ops, pp0.ops, sizeof(int32_t) * (size_t)pp0.n_ops);
    ring_trip(&pp0.c, v.bytes, 0, "sending to", NULL);
    pp0.n_ops = 0;
}

// Queues a cache operation of n_words for the next forward; a queue that
// would overflow goes round the ring on its own first.
static void queue_ops(const int32_t *w, int n_words) {
    if (pp0.n_ops + n_words > pp0.ops_cap) flush_ops();
    memcpy(pp0.ops + pp0.n_ops, w, sizeof(int32_t) * (size_t)n_words);
    pp0.n_ops += n_words;
}

// The layer-skip mask last sent for each session id (NULL: none).
static uint8_t *g_skip[PP_MAX_SESSIONS];

void pp_sync_skip(const sd_session *s, int sid) {
    const uint8_t *m = sd_session_layer_skip(s);
    const int nl = pp0.c.n_layer, nw = m ? (nl + 31) / 32 : 0;
    if (!m && !g_skip[sid]) return;
    if (m && g_skip[sid] && !memcmp(m, g_skip[sid], (size_t)nl)) return;
    if (m && !g_skip[sid] && !(g_skip[sid] = malloc((size_t)nl))) pp_die(&pp0.c, "out of memory");
    int32_t w[3 + 256] = {PP_OP_SKIP, sid, nw};
    if (nw > 256) pp_die(&pp0.c, "a layer-skip mask of %d layers (at most 8192)", nl);
    for (int l = 0; m && l < nl; l++)
        if (m[l]) w[3 + l / 32] = (int32_t)((uint32_t)w[3 + l / 32] | 1u << (l % 32));
    queue_ops(w, 3 + nw);
    if (m) {
        memcpy(g_skip[sid], m, (size_t)nl);
    } else {
        free(g_skip[sid]);
        g_skip[sid] = NULL;
    }
}

// A session rank 0 frees: its copies on the other ranks go too, its id
// becomes free.
static void hook_release(void *arg) {
    const int sid = (int)(intptr_t)arg;
    if (!pp0.active) return;
    const int32_t w[3] = {PP_OP_FREE, sid, 0};
    queue_ops(w, 3);
    pp0.sess[sid] = NULL;
    free(g_skip[sid]);
    g_skip[sid] = NULL;
}

static void hook_commit(void *arg, const int32_t *rows, int n) {
    const int sid = (int)(intptr_t)arg;
    if (!rows) {
        const int32_t w[3] = {PP_OP_COMMIT_ALL, sid, n};
        queue_ops(w, 3);
        return;
    }
    int32_t w[3 + 8192];
    w[0] = PP_OP_COMMIT;
    w[1] = sid;
    w[2] = n;
    memcpy(w + 3, rows, sizeof(int32_t) * (size_t)n);
    queue_ops(w, 3 + n);
}

static void hook_truncate(void *arg, int n) {
    const int32_t w[3] = {PP_OP_TRUNC, (int)(intptr_t)arg, n};
    queue_ops(w, 3);
}

// One forward round the ring: rank 0's layers into the message, the other
// ranks', the answer's hidden rows into the caller's buffer, the output.
static int hook_forward(void *arg, sd_session *s, const sd_batch *b, char *err, size_t errlen) {
    pp_ctx *c = &pp0.c;
    pp_sync_skip(s, (int)(intptr_t)arg);   // (may send the queue first: before the message is built)
    const int E = c->n_embd, first_remote = c->lo[1];
    pp_hdr *h = (pp_hdr *)(void *)c->sbuf;
    memset(h, 0, sizeof *h);
    h->type = PP_FWD;
    h->sid = (int)(intptr_t)arg;
    h->n = b->n;
    h->flags = (b->parent ? PP_F_PARENT : 0) | (b->pos ? PP_F_POS : 0) | (b->precise ? PP_F_PRECISE : 0);
    int remote_hid = 0;
    for (int k = 0; k < b->n_hidden_layers; k++)
        remote_hid |= b->hidden_layers[k] != SD_HIDDEN_NORM && b->hidden_layers[k] >= first_remote;
    if (remote_hid && b->n > 0) {
        h->n_hid = b->n_hidden_layers;
        memcpy(h->hid_layers, b->hidden_layers, sizeof(int32_t) * (size_t)h->n_hid);
        h->flags |= b->hidden ? PP_F_HIDDEN : 0;
        for (int i = 0; i < b->n; i++) h->n_wanted += !b->hidden || b->hidden[i];
    }
    h->n_ops = pp0.n_ops;
    pp_view v;
    pp_layout(c->sbuf, E, &v);
    if (v.bytes > c->cap) return snprintf(err, errlen, "pipeline: a message of %zu bytes exceeds %zu", v.bytes, c->cap), -1;
    memcpy(v.ops, pp0.ops, sizeof(int32_t) * (size_t)pp0.n_ops);
    for (int i = 0; i < b->n; i++) {
        if (v.parent) v.parent[i] = b->parent[i];
        if (v.pos) v.pos[i] = b->pos[i];
        if (v.hidden) v.hidden[i] = b->hidden[i];
    }
    double t0 = pp_now_ms();
    const sd_forward_part first = {.layer_lo = 0, .layer_hi = first_remote, .output = 0, .x_out = v.x};
    int r = sd_session_forward_part(s, b, &first, err, errlen);
    if (r < 0) return r;   // nothing sent: the queued operations wait for the next forward
    pp0.self_ms += pp_now_ms() - t0;
    pp_busy_add(0, t0, pp_now_ms());
    pp0.n_ops = 0;
    double waited = 0;
    ring_trip(c, v.bytes, 1, NULL, &waited);
    pp0.wait_ms += waited;
    pp_view a;
    pp_layout(c->rbuf, E, &a);
    if (a.h->type == PP_ERR) {
        snprintf(err, errlen, "pipeline: %.400s", c->rbuf + sizeof(pp_hdr));
        return SD_ERR_INPUT;
    }
    if (a.h->type != PP_FWD || a.h->n != b->n)
        pp_die(c, "an answer of type %d for %d nodes from rank %d", a.h->type, a.h->n, c->size - 1);
    for (int k = 1; k < c->size; k++) pp0.other_ms += a.h->rank_ms[k], pp0.rank_ms[k] += a.h->rank_ms[k];
    int solo = 1;   // alone in the ring unless a server's passes are in flight
    for (int k = 0; k < PP_MAX_FLIGHT && solo; k++) solo = !pp_group_in_flight(k);
    if (solo) {
        pp0.solo_wait_ms += waited;
        for (int k = 1; k < c->size; k++) pp0.solo_other_ms += a.h->rank_ms[k];
        pp0.n_solo++;
    }
    pp_busy_answer(a.h);
    pp0.n_fwd++;
    for (int k = 0; k < a.h->n_hid; k++) {
        const int l = a.h->hid_layers[k];
        if (l == SD_HIDDEN_NORM || l < first_remote) continue;
        for (int w = 0; w < a.h->n_wanted; w++)
            memcpy(b->hidden_out + ((size_t)w * a.h->n_hid + k) * E, a.hid + ((size_t)w * a.h->n_hid + k) * E,
                   sizeof(float) * (size_t)E);
    }
    sd_batch out = *b;
    out.tokens = NULL;
    out.embd = a.x;
    const sd_forward_part last = {.layer_lo = c->n_layer, .layer_hi = c->n_layer, .output = 1, .x_out = NULL};
    t0 = pp_now_ms();
    r = sd_session_forward_part(s, &out, &last, err, errlen);
    const double t1 = pp_now_ms();
    pp0.self_ms += t1 - t0;
    pp_busy_add(0, t0, t1);
    pp_busy_settle();
    return r;
}

void pp_metrics_text(char *buf, size_t n) {
    if (!n) return;
    buf[0] = 0;
    if (!pp0.active || pp0.c.size == 1) return;
    size_t o = 0;
#define PUT(...) (o += (size_t)snprintf(buf + o, o < n ? n - o : 0, __VA_ARGS__))
    PUT("# HELP specdec_pp_rank_forward_seconds_total Forward time of each pipeline rank (its layers; rank 0's with "
        "the output layer).\n# TYPE specdec_pp_rank_forward_seconds_total counter\n");
    for (int k = 0; k < pp0.c.size; k++)
        PUT("specdec_pp_rank_forward_seconds_total{rank=\"%d\",layers=\"%d-%d\"} %.4f\n", k, pp0.c.lo[k],
            pp0.c.lo[k + 1] - 1, (k ? pp0.rank_ms[k] : pp0.self_ms) / 1e3);
    PUT("# HELP specdec_pp_wait_seconds_total Rank 0's time waiting for the ring's answers.\n"
        "# TYPE specdec_pp_wait_seconds_total counter\nspecdec_pp_wait_seconds_total %.4f\n"
        "# HELP specdec_pp_network_seconds_total Rank 0's waiting that is not the other ranks' compute (messages, "
        "the network), over the passes alone in the ring (with several in flight their compute overlaps).\n# TYPE specdec_pp_network_seconds_total counter\nspecdec_pp_network_seconds_total %.4f\n"
        "# HELP specdec_pp_forwards_total Forwards round the ring.\n# TYPE specdec_pp_forwards_total counter\n"
        "specdec_pp_forwards_total %.0f\n",
        pp0.wait_ms / 1e3, (pp0.solo_wait_ms - pp0.solo_other_ms) / 1e3, pp0.n_fwd);
    PUT("# HELP specdec_pp_rank_wait_seconds_total Each rank's time waiting for messages: rank 0 for the ring's "
        "answers, the others for the previous rank's messages (idle time included).\n"
        "# TYPE specdec_pp_rank_wait_seconds_total counter\n");
    for (int k = 0; k < pp0.c.size; k++)
        PUT("specdec_pp_rank_wait_seconds_total{rank=\"%d\"} %.4f\n", k, (k ? pp0.rank_wait[k] : pp0.wait_ms) / 1e3);
    PUT("# HELP specdec_pp_ranks_busy_seconds_total Time during which exactly `busy` ranks computed a forward at "
        "once (micro-batches in flight overlap them).\n# TYPE specdec_pp_ranks_busy_seconds_total counter\n");
    for (int k = 0; k <= pp0.c.size; k++)
        PUT("specdec_pp_ranks_busy_seconds_total{busy=\"%d\"} %.4f\n", k, pp0.busy_ms[k] / 1e3);
    PUT("# HELP specdec_pp_groups Micro-batches the server keeps in flight (--pp-groups).\n# TYPE specdec_pp_groups "
        "gauge\nspecdec_pp_groups %d\n# HELP specdec_pp_passes_in_flight_mean Passes in flight when one began, on "
        "average.\n# TYPE specdec_pp_passes_in_flight_mean gauge\nspecdec_pp_passes_in_flight_mean %.3f\n",
        pp_groups(), pp0.flights ? (double)pp0.flight_sum / pp0.flights : 0.0);
#undef PUT
    if (o >= n) buf[n - 1] = 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The ring's transport alone: messages of a forward of 1 and 16 rows sent
// round it 41 times each (no rank computes), their median time; then 1
// row 41 times, each after rank 0 spun for 5 ms as if computing, so that
// the other ranks' waits have gone on as long as in a forward's (what a
// waiting rank takes to see a message, added to the transport).
static void ring_pings(pp_ctx *c) {
    const int sizes[3] = {1, 16, 1};
    for (int s = 0; s < 3; s++) {
        double t[41];
        for (int k = 0; k < 41; k++) {
            if (s == 2)
                for (const double t0 = pp_now_ms(); pp_now_ms() - t0 < 5.0;) {
                }
            pp_hdr *h = (pp_hdr *)(void *)c->sbuf;
            memset(h, 0, sizeof *h);
            h->type = PP_PING;
            h->n = sizes[s] < c->n_batch ? sizes[s] : c->n_batch;
            pp_view v;
            pp_layout(c->sbuf, c->n_embd, &v);
            memset(v.x, 0, sizeof(float) * (size_t)h->n * c->n_embd);
            const double t0 = MPI_Wtime();
            ring_trip(c, v.bytes, 1, NULL, NULL);
            t[k] = (MPI_Wtime() - t0) * 1e3;
        }
        qsort(t, 41, sizeof t[0], cmp_double);
        g_ping_ms[s] = t[20];
    }
}

// Message buffers for sessions of n_batch nodes (grown, never shrunk: no
// message is in flight between calls).
static int ensure_buffers(pp_ctx *c, int n_batch) {
    const size_t cap = pp_msg_cap(n_batch, c->n_embd, PP_OPS_WORDS(n_batch));
    if (cap > c->cap) {
        free(c->sbuf);
        c->sbuf = aligned_alloc(64, (cap + 63) / 64 * 64);
        c->cap = cap;
        c->n_batch = n_batch;
    }
    if (!pp0.ops) {
        pp0.ops_cap = PP_OPS_WORDS(8192);
        pp0.ops = malloc(sizeof(int32_t) * (size_t)pp0.ops_cap);
    }
    return c->sbuf && pp0.ops ? 0 : -1;
}

int pp_attach(sd_session *s, char *err, size_t errlen) {
    if (!pp0.active || pp0.c.size == 1) return 0;
    pp_ctx *c = &pp0.c;
    if (pp_sid_of(s) >= 0) return 0;   // attached when it was made (sd_model_set_session_hook)
    int sid = 0;
    while (sid < pp0.attached && pp0.sess[sid]) sid++;
    if (sid == PP_MAX_SESSIONS)
        return snprintf(err, errlen, "pipeline: at most %d sessions at once", PP_MAX_SESSIONS), -1;
    if (ensure_buffers(c, sd_session_n_batch(s)) < 0) return snprintf(err, errlen, "pipeline: out of memory"), -1;
    flush_ops();   // a freed session's id goes before it is set up again
    if (sid == pp0.attached) pp0.attached++;
    pp0.sess[sid] = s;
    pp_hdr *h = (pp_hdr *)(void *)c->sbuf;
    memset(h, 0, sizeof *h);
    h->type = PP_SETUP;
    h->sid = sid;
    h->n_ctx = sd_session_n_ctx(s);
    h->n_batch = sd_session_n_batch(s);
    h->n_threads = sd_threadpool_size(sd_session_pool(s));
    ring_trip(c, sizeof *h, 0, "sending to", NULL);
    static int pinged;
    if (!pinged) {   // the first session
        cpu_set_t cs;
        const int nt = h->n_threads;
        if (sched_getaffinity(0, sizeof cs, &cs) == 0 && CPU_COUNT(&cs) < nt)
            fprintf(stderr, "specdec: warning: rank 0 is bound to %d core(s) for %d threads (mpirun --bind-to or "
                            "--map-by): its threads share them; --bind-to none, or --map-by slot:PE=%d, gives them "
                            "cores of their own\n", CPU_COUNT(&cs), nt, nt);
        pp_short_slice(c, nt);
        if (c->stats) ring_pings(c);
        pinged = 1;
    }
    const sd_session_hooks hk = {.forward = hook_forward, .commit = hook_commit, .truncate = hook_truncate,
                                 .arg = (void *)(intptr_t)sid, .release = hook_release};
    sd_session_set_hooks(s, &hk);
    return 0;
}

// At exit: the quit goes round the ring and comes back with every rank's
// figures, printed as one JSON line with --pp-stats; then MPI ends.
static void pp_finish(void) {
    pp_ctx *c = &pp0.c;
    if (!pp0.active) return;
    const int groups = pp_groups();
    pp0.active = 0;
    if (c->size > 1) {
        if (ensure_buffers(c, 1) < 0) pp_die(c, "out of memory");
        pp_hdr *h = (pp_hdr *)(void *)c->sbuf;
        memset(h, 0, sizeof *h);
        h->type = PP_QUIT;
        memset(c->sbuf + sizeof(pp_hdr), 0, sizeof(pp_rank_stats) * PP_MAX_RANKS);
        ring_trip(c, sizeof(pp_hdr) + sizeof(pp_rank_stats) * PP_MAX_RANKS, 1, NULL, NULL);
    }
    if (c->stats && pp0.attached) {
        pp_rank_stats *st = (pp_rank_stats *)(void *)(c->rbuf + sizeof(pp_hdr));
        pp_mem(&st[0].rss_mib, &st[0].hwm_mib);
        st[0].compute_ms = pp0.self_ms;
        st[0].wait_ms = pp0.wait_ms;
        st[0].n_fwd = pp0.n_fwd;
        st[0].lo = 0;
        st[0].hi = c->lo[1];
        st[0].held_mib = g_held_mib;
        const double hop = pp0.n_solo > 0 ? (pp0.solo_wait_ms - pp0.solo_other_ms) / pp0.n_solo / c->size : 0;
        fprintf(stderr, "{\"pp\": {\"ranks\": %d, \"n_layer\": %d, \"forwards\": %.0f, \"hop_overhead_ms\": %.4f, "
                        "\"ring_hop_ms_1_row\": %.4f, \"ring_hop_ms_16_rows\": %.4f, \"ring_hop_ms_after_5_ms\": %.4f, "
                        "\"weights_mib\": %.1f, \"per_rank\": [",
                c->size, c->n_layer, pp0.n_fwd, hop, g_ping_ms[0] / c->size, g_ping_ms[1] / c->size,
                g_ping_ms[2] / c->size, g_total_mib);
        for (int k = 0; k < c->size; k++)
            fprintf(stderr, "%s{\"rank\": %d, \"layers\": [%.0f, %.0f], \"weights_mib\": %.1f, \"rss_mib\": %.1f, "
                            "\"hwm_mib\": %.1f, \"compute_ms\": %.1f, \"wait_ms\": %.1f, \"forwards\": %.0f}",
                    k ? ", " : "", k, st[k].lo, st[k].hi, st[k].held_mib, st[k].rss_mib, st[k].hwm_mib, st[k].compute_ms,
                    st[k].wait_ms, st[k].n_fwd);
        pp_busy_settle();
        double any = 0, more = 0;
        fprintf(stderr, "], \"groups\": %d, \"passes_in_flight_mean\": %.3f, \"ranks_busy_ms\": [", groups,
                pp0.flights ? (double)pp0.flight_sum / pp0.flights : 0.0);
        for (int k = 0; k <= c->size; k++) {
            fprintf(stderr, "%s%.1f", k ? ", " : "", pp0.busy_ms[k]);
            any += k >= 1 ? pp0.busy_ms[k] : 0;
            more += k >= 2 ? pp0.busy_ms[k] : 0;
        }
        fprintf(stderr, "], \"overlap\": %.4f}}\n", any > 0 ? more / any : 0.0);
    }
    MPI_Finalize();
}
