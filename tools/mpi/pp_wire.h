// pp_wire.h - what the ranks of a pipeline (pp.c: launch and rank 0,
// pp_worker.c: the other ranks) share: the context, the messages and the
// wait with a deadline. Messages go round a ring, rank 0 -> 1 -> ... -> R-1
// -> 0, so that every rank sees them in rank 0's order (MPI keeps the order
// of messages between two ranks): a forward carries the commits and
// truncations rank 0 made since the last one ahead of its batch, and the
// activations; the last rank's answer carries the final residual rows back.
#ifndef SD_TOOLS_PP_WIRE_H
#define SD_TOOLS_PP_WIRE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "specdec.h"

#define PP_MAX_RANKS 16
#define PP_MAX_SESSIONS 256   // sessions of rank 0 attached to the pipeline (a server's slots)
#define PP_TAG_RING 12        // rank k -> k + 1 (and R-1 -> 0)
#define PP_TAG_FAULT 14       // a worker -> rank 0: "rank k died" (its text), when rank 0 cannot see it
#define PP_FAULT_GRACE_MS 10000.0 // a worker that saw a rank die stops the job itself if nothing ended it by then

// PP_SETUP: a new session (rank 0 attached one), made alike on every rank.
// PP_GROUP: the batches of several sessions in one pass (a server's round,
// sd_batcher_forward_part): the header (n = the sessions, seq = the
// batcher's nodes), the ops, then one PP_FWD message per session, each at a
// multiple of 64 bytes (pp_group_first, pp_group_next).
enum pp_type { PP_FWD = 1, PP_OPS = 2, PP_QUIT = 3, PP_ERR = 4, PP_SETUP = 5, PP_PING = 6, PP_GROUP = 7, PP_ALIVE = 8 };
// PP_ALIVE: rank 0 is alive and idle (a server sends one every PP_KEEPALIVE_MS
// it sent nothing else); every rank passes it on but the last. A worker
// that has seen one, or a PP_SETUP (generate and bench keep the ring busy),
// waits for each next message at most --pp-timeout plus
// PP_KEEPALIVE_MISS keep-alives, then stops every rank (rank 0, or a rank
// before it, is gone: on another host nothing else would tell).
#define PP_KEEPALIVE_MS 5000.0
#define PP_KEEPALIVE_MISS 3
#define PP_MAX_GROUP 256
// PP_PING: a forward's message that every rank passes on without computing (--pp-stats
// times the ring's transport alone with it)
// Cache operations (op, session, n, n words): a commit of n rows (the words),
// of all n pending rows, a truncation to n; PP_OP_SKIP: the session's
// layer-skip mask (n words of 32 layers' bits, n = 0: none); PP_OP_FREE: the
// session is gone (its id may be set up again).
enum pp_op { PP_OP_COMMIT = 1, PP_OP_COMMIT_ALL = 2, PP_OP_TRUNC = 3, PP_OP_SKIP = 4, PP_OP_FREE = 5 };
enum pp_flag { PP_F_PARENT = 1, PP_F_POS = 2, PP_F_HIDDEN = 4, PP_F_PRECISE = 8 };

// A message: this header, then n_ops op words (op, session, n, rows...), the batch's parent, pos and
// hidden mask (n int32 each, when flagged), n rows of n_embd floats (the
// residual stream), n_wanted x n_hid rows of n_embd floats (hidden rows of
// the layers past rank 0's, filled by the ranks that hold them). A PP_QUIT
// carries a pp_rank_stats per rank instead; a PP_ERR a message.
typedef struct pp_hdr {
    int32_t type, n, flags, n_hid;
    int32_t hid_layers[SD_MAX_HIDDEN_LAYERS];
    int32_t n_wanted, n_ops, seq, sid;   // sid: the session (pp_attach's order)
    int32_t n_ctx, n_batch, n_threads, pad; // PP_SETUP: the session's size
    float rank_ms[PP_MAX_RANKS];  // this forward's compute time on each rank (ms)
    double rank_t0[PP_MAX_RANKS]; // when each rank began computing it (ms, that rank's pp_now_ms clock)
    double rank_wait[PP_MAX_RANKS]; // each rank's time waiting for messages so far (ms; idle time included)
} pp_hdr;

typedef struct pp_rank_stats {
    double hwm_mib, rss_mib;      // peak and current resident memory (MiB)
    double compute_ms, wait_ms;   // forward time and time waiting for messages, summed (ms)
    double n_fwd;                 // forwards run
    double lo, hi;                // its layers
    double held_mib;              // weights it holds (sd_model_info.n_bytes_held, MiB)
} pp_rank_stats;

typedef struct pp_ctx {
    int rank, size;
    int lo[PP_MAX_RANKS + 1];     // rank k holds layers [lo[k], lo[k + 1])
    int n_layer, n_embd;
    double timeout_ms;            // rank 0: longest wait for an answer
    int stats;                    // --pp-stats: rank 0 prints every rank's figures at the end
    char *sbuf, *rbuf;            // send and receive buffers (cap bytes)
    size_t cap;
    int n_batch;
    pp_rank_stats mine;           // this rank's figures
    int pid[PP_MAX_RANKS];        // each rank's process id
    char local[PP_MAX_RANKS];     // 1: rank k runs on this rank's host (its pid can be watched)
    double clock_off[PP_MAX_RANKS]; // rank 0: rank k's pp_now_ms minus rank 0's (ms, measured at launch)
    double t_alive;               // when the other ranks on this host were last seen alive (pp_now_ms)
    double t_sent;                // rank 0: when it last sent a message (pp_now_ms)
    int keepalive;                // a worker: rank 0 sends keep-alives (PP_ALIVE seen), so its waits have a deadline
    int watch;                    // a worker: watch the other ranks' pids too (mpirun --enable-recovery)
    double t_fault;               // a worker: when it saw another rank die (pp_now_ms; 0: never)
    void (*on_fault)(void *arg, const char *msg); // rank 0: called once before a fault stops every rank, or NULL
    void *fault_arg;
    int wait_mode;                // --pp-wait: 0 auto, PP_WAIT_SPIN, PP_WAIT_SLEEP
    int spin;                     // 1: the waits poll without sleeping (pp_short_slice decides, by wait_mode)
} pp_ctx;
#define PP_WAIT_SPIN 1
#define PP_WAIT_SLEEP 2

// Where the parts of a message in buf lie, from its header (n, flags,
// n_ops, n_wanted, n_hid must be set); bytes: its size.
typedef struct pp_view {
    pp_hdr *h;
    int32_t *ops, *parent, *pos, *hidden; // (n_ops), (n), (n), (n); NULL when not flagged
    float *x;                             // (n, n_embd)
    float *hid;                           // (n_wanted, n_hid, n_embd)
    size_t bytes;
} pp_view;
void pp_layout(char *buf, int n_embd, pp_view *v);
// A group's first session message, and the one after sub (whose view is v).
char *pp_group_first(char *buf);
char *pp_group_next(char *sub, const pp_view *v);
// Bytes a forward message of n_batch nodes may take (ops_words of ops).
size_t pp_msg_cap(int n_batch, int n_embd, int ops_words);
#define PP_OPS_WORDS(n_batch) (4 * (n_batch) + 256)
// Receives the next message from rank `from` into *buf (grown to its
// size; *cap its bytes), polling like pp_wait with sreq (a send still in
// flight, or MPI_REQUEST_NULL) completed too. Returns the bytes received.
size_t pp_recv(pp_ctx *c, int from, char **buf, size_t *cap, MPI_Request *sreq, double timeout_ms, double *waited);
// Waits for the n requests, polling (with c->spin for the first 20 ms; else a short spin, then sleeps of up to
// ~150 us: ranks that share cores do not steal them from the one computing;
// pp_worker.c says what else was measured), at most timeout_ms (<= 0: forever). Time waited is added to *waited. 0,
// or stops every rank with a message naming the peer (an MPI error, or the
// deadline passed).
int pp_wait(pp_ctx *c, MPI_Request *rq, int n, int peer, const char *what, double timeout_ms, double *waited);
// Shortens this thread's timer slack to 1 us (Linux), so that the waits'
// short sleeps end when they should.
void pp_fast_wakeups(void);
// Asks the scheduler for a short time slice (PP_SLICE_NS) for this thread,
// so that a rank woken by its message runs at once, unless this host's
// ranks of n_threads threads need more cores than it has (pp_worker.c);
// and sets c->spin by --pp-wait (auto: spin exactly then).
#define PP_SLICE_NS 300000u
void pp_short_slice(pp_ctx *c, int n_threads);
// CLOCK_MONOTONIC in ms.
double pp_now_ms(void);
// Inside every rank's waits: every 50 ms, whether each other rank on its
// host is still alive (its /proc entry); one that died stops every rank
// with a message naming it (on rank 0 through the fault callback first).
void pp_check_alive(pp_ctx *c);
// Stops every process of the job with one message from this rank (rank 0:
// the fault callback first, once, so that a server answers its requests in
// flight; it must return within a few seconds).
void pp_die(pp_ctx *c, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
// This process's resident and peak resident memory (MiB), from /proc.
void pp_mem(double *rss_mib, double *hwm_mib);
// The worker's life on ranks > 0: wait for the setup, load its part, serve
// the ring until the quit. Returns the process's exit code.
int pp_worker(pp_ctx *c, const char *model_path);

#endif
