// serve.h - specdec serve: an OpenAI-compatible HTTP server over the public
// step API (include/specdec_spec.h).
//
// Threads (house rule 14):
//   - ONE scheduler thread (sched.c) owns the model's sessions, the shared
//     sd_threadpool and N slots; each round runs one step of every active
//     slot. It never waits for a client: what it produces goes into the
//     request's output buffer (sv_req.out) under the request's mutex.
//   - libmicrohttpd's connection threads (http.c, api.c) parse JSON,
//     tokenize, enqueue (a bounded queue: 503 when full) and stream what the
//     scheduler hands them, waiting on the request's condition variable.
//   - the main thread (cmd_serve.c) parses options, loads the model, starts
//     both, waits for SIGINT/SIGTERM and shuts down.
#ifndef SD_SERVE_H
#define SD_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "specdec.h"
#include "specdec_spec.h"
#include "serve/budget.h"

#ifndef SD_MIN
#define SD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SD_MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

#define SV_MAX_STOP 16        // most stop strings per request
#define SV_STOP_MAX_LEN 256   // longest stop string (bytes)
#define SV_BODY_MAX (1 << 20) // largest request body (bytes): 413 beyond

// ---------------------------------------------------------------- options
typedef struct sv_opts {
    const char *model;        // target GGUF path (required)
    const char *method;       // default speculation method string ("ngram:3-8"; "ar" = none)
    const char *drafts[SD_METHOD_MAX_DRAFTS]; // (n_drafts) draft model paths
    int n_drafts;
    const char *heads[3];     // (n_heads) --head FILE|auto: an EAGLE-3 head, a Medusa head, an MoA drafter
    int n_heads;
    const char *host;         // address to bind ("127.0.0.1")
    int port;                 // TCP port (8080; 0 = any free port, printed at start)
    int n_slots;              // --parallel: generations at once (4)
    int n_ctx;                // KV cache per slot in tokens (2048)
    const char *api_key;      // Bearer key required on every endpoint but /health, or NULL
    int n_threads;            // threads of the shared pool (0 = cores)
    int n_queue;              // requests waiting for a slot beyond the active ones (16)
    int max_tokens;           // default and most tokens per request (1024)
    int max_conn;             // most simultaneous connections (64)
    int timeout_s;            // idle connection timeout, and deadline of a request's arrival (seconds, 60; guard.h)
    int fast_prompt;          // prompts with 8-bit activations (sd_gen_params.fast_prompt); their chunks
                              // then share the rounds' passes with the step batches
    int head_online;          // --head-online: each slot's EAGLE-3 drafter adapts its head (a training thread per slot)
    int head_bits;            // --head-bits: the heads' matrices in memory
    int draft_budget;         // --draft-budget auto (1, default) | off (0): budget.h
    float online_lr;          // --online-lr
    const char *datastore;    // --datastore: a text corpus the n-gram drafters also search, or NULL
    int draw;                 // --sampling-draw: every request's sd_sampler_params.draw
    int split_max;            // --split: split generations at once (verification API, split.h); 0: off
    int split_idle;           // --split-idle: seconds a split generation waits for its next round
} sv_opts;

// ---------------------------------------------------------------- requests
enum sv_kind { SV_CHAT = 0, SV_COMPLETION = 1 };

// One generation request, shared by its connection thread and the
// scheduler (reference-counted). Fields above `mu` are written by the
// connection thread before sv_submit and read-only afterwards.
typedef struct sv_req {
    int kind;                  // enum sv_kind
    int stream;                // 1: server-sent events
    int include_usage;         // stream_options.include_usage
    int32_t *prompt;           // (n_prompt) tokens
    int n_prompt;
    int n_predict;             // max_tokens (clamped to sv_opts.max_tokens)
    sd_sampler_params sp;      // temperature, top_p, top_k, min_p, seed
    char *stop[SV_MAX_STOP];   // (n_stop) stop strings (owned)
    int n_stop;
    char method[SD_METHOD_NAME_MAX]; // speculation method ("ar" when off)
    char id[48];               // "chatcmpl-N" / "cmpl-N"
    long created;              // unix time (s)
    double t_enqueue;          // sd_time_ms() at submission

    pthread_mutex_t mu;
    pthread_cond_t cv;         // signalled when out grows or done is set
    int refs;                  // owners: the connection and, once submitted, the scheduler
    char *out;                 // (out_len, cap out_cap) text released to the client so far
    size_t out_len, out_cap;
    char *how;                 // (how_len == out_len) per byte of out: 'A'/'T' first byte of an accepted draft /
    size_t how_len, how_cap;   // target token, 'a'/'t' its other bytes
    int done;                  // 1: no more text; finish/error/stats final
    int cancelled;             // the client went away: stop at once
    char finish[16];           // "stop" / "length" (OpenAI finish_reason)
    char error[256];           // non-empty: the generation failed
    int err_status;            // HTTP status of error (500 when not set)
    sd_gen *gen;               // the running generation (for sd_gen_stop from a connection thread), or NULL
    // statistics (final when done)
    int n_cached;              // prompt tokens reused from the slot's cache
    int n_gen;                 // completion tokens
    int n_drafted, n_accepted, n_forwards;
    double tau;                // tokens per target forward (bonus included)
    double ttft_ms;            // submission to first token (ms)
} sv_req;

sv_req *sv_req_new(void);
void sv_req_ref(sv_req *r);
void sv_req_unref(sv_req *r);  // frees at the last reference
// The client went away: the scheduler stops its generation at once.
void sv_req_cancel(sv_req *r);

// ---------------------------------------------------------------- metrics
typedef struct sv_metrics {
    long requests_ok;          // generations finished normally
    long requests_error;       // generations that failed or were cancelled
    long rejected_queue_full;  // 503s
    long prompt_tokens;        // prompt tokens of finished generations
    long prompt_tokens_cached; // of which reused from a slot's cache
    long generated_tokens;
    long drafted, accepted;    // draft nodes proposed / draft tokens accepted
    long forwards;             // target forwards of steps
    double step_tokens;        // tokens emitted by steps with a forward (for tau)
    int busy_slots, queued;    // now
    int n_slots;
    // continuous batching (sched.c's round): every call that evaluates
    // slots' batches (one sd_batcher_forward, or one sd_session_forward)
    long pass_forwards;        // calls of step batches
    long pass_rows;            // their nodes, all slots together
    long pass_slots;           // their slots
    long pass_fallbacks;       // batcher calls that failed and were redone slot by slot
    long budget_cut;           // draft nodes the draft budget withheld (budget.h)
    long prefill_chunks;       // prompt chunks evaluated between rounds
    long emitted_tokens;       // tokens emitted by steps, live (not only finished requests)
    double pass_ms;            // wall time in the step passes (the target's forwards)
    double prefill_ms;         // wall time evaluating prompts
    double round_ms;           // wall time in rounds (drafting, passes, verification, emitting)
    double tps;                // tokens/s over the last window of about a second (0 when idle)
    double tps_t0;             // sd_time_ms() when the window started
    long tps_tokens;           // tokens emitted in the window
    // time to first token of the most recent finished requests (ms)
#define SV_TTFT_RING 256
    double ttft_ring[SV_TTFT_RING];
    long ttft_count;           // requests with a first token, in all
    double ttft_sum_ms;
} sv_metrics;

// ---------------------------------------------------------------- the server
typedef struct sv_slot sv_slot;   // sched.c

typedef struct sv_server {
    const sv_opts *o;
    sd_model *model;
    sd_model *drafts[SD_METHOD_MAX_DRAFTS];
    sd_head *heads[3];         // (n_loaded) loaded --head files (auto: one of each type found)
    int n_loaded;
    const sd_head *head_eagle3;// the EAGLE-3 head among them (eagle3:* and auto methods), or NULL
    const sd_head *head_medusa;// the Medusa head among them (medusa:* methods), or NULL
    const sd_head *head_moa;   // the MoA drafter among them (moa:* methods), or NULL
    const sd_tokenizer *tok;
    char model_id[256];        // the name clients give as "model" (file name of the GGUF)
    sd_threadpool *pool;
    sd_method def_method;      // the default method, prepared (skip:auto searched once)
    sd_method_plan def_plan;   // what it needs and takes (the library's plan)
    sd_method_have have;       // what is loaded: draft models, heads, the batch (for the plans)
    sd_cost_curve *cost;       // for automatic trees, when the default method needs one; with
                               // --draft-budget auto and several slots always
    sd_datastore *datastore;   // --datastore, opened once and shared by the slots' n-gram drafters, or NULL
    void *budget_scratch;      // (sv_budget_scratch_size(n_slots)) the draft budget's ranking
    int *budget_caps;          // (n_slots) this round's caps, and the slots' method nodes
    int *budget_max;
    const sv_accept **budget_acc; // (n_slots) the stepping slots' estimates
    sv_accept budget_pool;     // all slots' acceptance together
    int n_ctx;                 // per slot (the sessions' actual n_ctx)

    pthread_mutex_t mu;        // guards everything below
    pthread_cond_t cv;         // scheduler wakes on new work or shutdown
    sv_req **queue;            // (n_queue_cap) FIFO ring of waiting requests
    int q_head, q_len, q_cap;
    int stopping;              // shutdown: fail the queue, stop the slots, exit the scheduler
    sv_metrics m;
    atomic_long next_id;
    atomic_int requests_open;  // HTTP requests whose reply is not fully sent (http.c; shutdown waits for them)

    sv_slot *slots;            // (n_slots)
    int n_slots;
    sd_batcher *batcher;       // one pass over the batches of several slots (scheduler thread only)
    // Called on every slot's session once it is made, before any forward
    // (a pipeline attaches it, tools/mpi/pp.h), or NULL. 0, or <0 with a message.
    int (*on_session)(sd_session *s, char *err, size_t errlen);
    // Replaces sd_batcher_forward for a pass of several slots (a pipeline's
    // rank 0 sends it round the ranks, tools/mpi/pp.h), or NULL.
    int (*forward_many)(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen);
    // A pipeline's pass in two halves (tools/mpi/pp.h: pp_group_begin, pp_group_end), so that
    // n_groups groups of slots are in flight at once (micro-batches, rounds.c), or NULL.
    int (*group_begin)(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen);
    int (*group_end)(sd_batcher *b, int ticket, char *err, size_t errlen);
    int n_groups;              // groups of slots in flight (1: one round of all slots at a time)
    struct sv_pipe *pipe;      // their state (rounds.c), or NULL
    // Called by the idle scheduler every couple of seconds (a pipeline's keep-alive, pp_keepalive), or NULL.
    void (*on_idle)(void);
    // Appends more Prometheus lines to /metrics (a pipeline's per-rank time), or NULL.
    void (*metrics_extra)(char *buf, size_t n);
    int batcher_nodes;         // its n_nodes
    sv_slot **pass_sl;         // (n_slots) scratch of a round's pass: slots,
    sd_session **pass_ss;      //   their sessions,
    sd_batch *pass_bs;         //   their batches,
    int *pass_ok;              //   whether each was evaluated,
    char (*pass_err)[256];     //   and why not (allocated once: a round allocates nothing)
    int *pf_len;               // (n_slots) prompt tokens each slot evaluates this round
    pthread_t thread;
    int thread_started;
    struct sv_splits *split;   // the verification API's generations (split.h), or NULL
} sv_server;

// sched.c: slots and the scheduler thread. The caller initialises s->mu
// and s->cv (they outlive the scheduler: connection threads may still call
// sv_submit, which then refuses, after sv_sched_stop).
int sv_sched_start(sv_server *s, char *err, size_t errlen);
// Stops the scheduler: queued requests fail, running ones are stopped, the
// thread is joined and the slots freed.
void sv_sched_stop(sv_server *s);
// Enqueues r (takes a reference). 0, or -1 when the queue is full or the
// server is stopping (the reason in err).
int sv_submit(sv_server *s, sv_req *r, char *err, size_t errlen);
// Checks a method string for a request: 0 with *m filled, or -1 with a
// message for a 400.
int sv_method_check(sv_server *s, const char *name, sd_method *m, sd_method_plan *pl, char *err, size_t errlen);
// What the server's drafters are built from: the target, the draft models,
// the heads, the pool, the slots' n_ctx (0 before sv_sched_start: the
// default) and the cost curve (NULL until measured). No report callback.
sd_method_env sv_method_env(const sv_server *s);
void sv_metrics_get(sv_server *s, sv_metrics *m);

// http.c: the HTTP daemon.
typedef struct sv_http sv_http;
int sv_http_start(sv_http **out, sv_server *s, int *port, char *err, size_t errlen);
void sv_http_quiesce(sv_http *h);   // stop accepting connections
void sv_http_stop(sv_http *h);      // close everything (waits for connection threads)

// req.c: text helpers shared by sched.c and api.c (cli_utf8_complete of
// tools/cli_common.h finds where complete UTF-8 characters end).
// Copies s[0..n) into a new NUL-terminated string with invalid UTF-8
// replaced by U+FFFD (jansson accepts only valid UTF-8). NULL on OOM.
char *sv_utf8_clean(const char *s, size_t n, size_t *out_len);
// Appends s[0..n) to a growing NUL-terminated buffer; -1 on OOM.
int sv_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

#endif
