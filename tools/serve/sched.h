// sched.h - internal to the scheduler (sched.c: the thread and the queue;
// slots.c: a slot's life; rounds.c: a round's pass; prefill.c: the prompt
// chunks): a slot, the scheduler's sizes, and the functions the files
// share. Only the scheduler thread touches slots (serve.h).
#ifndef SD_SERVE_SCHED_H
#define SD_SERVE_SCHED_H

#include "serve/budget.h"
#include "serve/serve.h"

// What a slot is doing. FREE: no request (r NULL). STARTING: a request
// assigned this round, not yet started (no generation yet). PROMPT: its
// prompt is being evaluated, a chunk per round. STEPPING: generating, one
// step per round. Transitions: assign FREE -> STARTING; slot_start
// STARTING -> PROMPT; sv_prefill_end PROMPT -> STEPPING (the prompt in the cache); sv_slot_finish
// any -> FREE.
typedef enum sv_slot_state { SV_SLOT_FREE = 0, SV_SLOT_STARTING, SV_SLOT_PROMPT, SV_SLOT_STEPPING } sv_slot_state;

struct sv_slot {
    int id;
    sd_session *s;           // the slot's KV cache and scratch, on the server's pool
    int32_t *cache;          // (n_ctx) tokens of the session's committed rows
    int n_cache;
    sd_drafter *d;           // drafter of d_name, kept between requests (NULL for ar)
    char d_name[SD_METHOD_NAME_MAX];   // "" until the first request
    sv_req *r;               // request being served, or NULL (free)
    sv_slot_state state;     // free, starting, prompt or stepping (below)
    sd_sampler *smp;         // (per request)
    sd_gen *g;               // (per request)
    char *text;              // (text_len, cap text_cap) text generated for r
    size_t text_len, text_cap;
    char *kind;              // (kind_len == text_len, cap kind_cap) per byte of text: how its token came
                             // ('A' accepted draft, 'T' the target's own; lower case after a token's first byte)
    size_t kind_len, kind_cap;
    size_t released;         // bytes of text handed to the client
    size_t *ends;            // (n_batch + 1) text length after each token of the last step
    int max_stop;            // longest stop string of r (bytes)
    double last_used;        // sd_time_ms() when the slot last finished (least recently used wins ties)
    sd_batch b;              // this round's batch (valid between begin and end)
    int in_step;             // 1: begin succeeded this round
    sv_accept acc;           // measured acceptance of the slot's drafter (the draft budget)
    int max_nodes;           // nodes per step of the request's method (1: no drafter)
    struct sv_split *split;  // a split generation's pass entry (split.h), NULL for slots
    int flight;              // 1: its batch is in a pipeline's group in flight, the answer not back (rounds.c)
};

// The server's own pool size for prompt chunks and tree nodes.
#define SV_N_BATCH 512
// Prompt tokens a prefilling slot evaluates per round, so that a long
// prompt does not stall the other slots' streams for long.
#define SV_PREFILL_CHUNK 64
// Most prompt tokens of all prefilling slots together per round while other
// slots are generating (a round's pass waits for them): 8-bit prompt rows
// cost what step rows cost, float-activation rows (the default) several
// times more on CPUs without AVX-512. With nothing generating, the larger.
#define SV_PREFILL_BUDGET 128
#define SV_PREFILL_BUDGET_PRECISE 16
// Most nodes of one batched pass (the batcher's rows of logits cost n_vocab
// floats each); a round with more is split into several passes.
#define SV_PASS_MAX_NODES 512

// sched.c
// Ends the slot's request: statistics, cache bookkeeping, metrics, and the
// request marked done (error NULL: finished normally; else its HTTP status).
void sv_slot_finish(sv_server *s, sv_slot *sl, const char *error, int status);
// Evaluates the batches s->pass_bs[0..n) on the sessions s->pass_ss[0..n)
// (all precise or none) in as few sd_batcher_forward passes as the
// batcher's size allows; s->pass_ok[i] says whether batch i was evaluated
// (its error in errs[i]). When a pass names the batch that failed
// (sd_batcher_failed_batch), that batch fails alone and the others go again
// without it; the entries of the pass arrays may be reordered then (pass_sl
// with them). A pass that fails as a whole is redone slot by slot with
// sd_session_forward.
// step: 1 for generation steps (counted in the pass metrics).
void sv_forward_many(sv_server *s, int n, char (*errs)[256], int step);

// slots.c
// Starts a STARTING slot's request: prefix reuse, drafter, sampler, the
// generation and its prompt (the slot is then PROMPT), or finishes it with
// an error.
void sv_slot_start(sv_server *s, sv_slot *sl);
// Tokens a[0..) and b[0..) share at the start.
int sv_common_prefix(const int32_t *a, int na, const int32_t *b, int nb);
// The tokens of step st go to the slot's request (stop strings cut the
// generation; text is released at UTF-8 boundaries). 0, or -1 with a message.
int sv_slot_emit(sv_server *s, sv_slot *sl, const sd_step *st, char *err, size_t errlen);

// rounds.c
// One round: every stepping slot drafts, the planned prompt chunks join, one
// pass evaluates all, every slot verifies and emits.
void sv_round_step(sv_server *s);

// The groups in flight of a pipeline's rank 0 (s->n_groups > 1): their
// state, freed with the slots.
typedef struct sv_pipe sv_pipe;
void sv_pipe_free(sv_pipe *p, int n_groups);
// A pipeline's fault (tools/mpi/pp.h pp_on_fault; arg: the sv_server): new
// requests are refused, every request queued or in a slot is answered with
// msg (HTTP 503, or an error event in a stream), and the connection threads
// get up to SV_FAULT_DRAIN_MS to send those answers; then the job ends.
#define SV_FAULT_MAX 1024
#define SV_FAULT_DRAIN_MS 3000
void sv_pipe_fault(void *arg, const char *msg);

// prefill.c
// Plans this round's prompt chunks into pf_len (s->n_slots); returns the
// number of slots with a chunk.
int sv_prefill_plan(sv_server *s, int *pf_len);
// Begins slot sl's prompt step over its next len tokens (its generation's
// prompt chunk, sd_gen_set_prompt) and puts it in the round's pass arrays at
// index n; returns the new count (n when the slot failed, or had nothing to
// evaluate and its step ended at once).
int sv_prefill_join(sv_server *s, sv_slot *sl, int len, int n);
// Ends it after the pass (ok: evaluated; else ferr says why): the chunk is
// committed and the drafter hears its rows (sd_gen_step_end); when the
// prompt is all in the cache the slot steps (its first token comes with its
// next step, without a forward).
void sv_prefill_end(sv_server *s, sv_slot *sl, int ok, const char *ferr);
// Prompts before a round: cancelled ones end; with --precise-prompt the
// planned chunks go through a float pass of their own (with 8-bit prompts
// they ride in round_step's pass). stopping: the server is shutting down.
void sv_prefill_round(sv_server *s, int stopping);

#endif
