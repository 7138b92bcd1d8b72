// split.h - the verification API of specdec serve (docs/split.md): a client
// drafts with the EAGLE-3 head, the server keeps the generation's target
// state and verifies the client's trees, batched with the other users.
//
// A split generation lives in a table (at most --split N of them), outside
// the slots: its own session, sampler, generation and a callbacks drafter
// whose tree is the client's. Connection threads (split_http.c) parse a
// request, hand the work to the scheduler under s->mu and wait; the
// scheduler (rounds.c) steps every split generation that has work in the
// round's one pass (sv_split_join, sv_split_end). Rounds carry a sequence
// number: the reply of the last round is kept, so a retry gets the same
// bytes and nothing is committed twice.
#ifndef SD_SERVE_SPLIT_H
#define SD_SERVE_SPLIT_H

#include "serve/sched.h"

#define SV_SPLIT_MAGIC_REQ 0x31524453u   // "SDR1": a round request
#define SV_SPLIT_MAGIC_REP 0x31414453u   // "SDA1": a round reply
#define SV_SPLIT_MAX_NODES 64            // most tree nodes per round, root included
#define SV_SPLIT_DEFAULT_IDLE 600        // seconds a generation waits for its next round
#define SV_SPLIT_EVICT_S 10              // a full table gives an open the generation idle longest, if this idle

enum sv_split_state { SPL_FREE = 0, SPL_OPENING, SPL_READY, SPL_ROUND, SPL_FAILED };
// The target's states a generation's replies carry (the open's "states"; the round reply's row type).
// SV_KIND_MEAN: an MoA drafter without LSA reads the layers' mean of the K,V rows (and its TLI layers' own).
enum sv_split_kind { SV_KIND_NONE = 0, SV_KIND_FUSED = 1, SV_KIND_KV = 2, SV_KIND_LSA = 3, SV_KIND_MEAN = 4 };

typedef struct sv_split {
    int state;             // enum sv_split_state (under s->mu)
    char id[40];           // "g" + hex
    sv_slot sl;            // the pass arrays' entry (sl.split points back here)
    sd_session *ss;        // kept between generations
    sd_sampler *smp;
    sd_gen *g;
    sd_drafter *d;         // callbacks: proposes the client's tree
    int n_predict;
    double last_used;      // sd_time_ms() of the last request
    int waiters;           // connection threads waiting on it
    int in_step;           // scheduler: a step begun this round
    // the round in work / the last one done
    uint32_t seq_done;     // sequence number of the last round answered (0: none yet)
    uint32_t seq_work;
    int32_t tree_tok[SV_SPLIT_MAX_NODES];
    int16_t tree_par[SV_SPLIT_MAX_NODES];
    int tree_n;
    int kind;              // the states this generation's rounds carry: enum sv_split_kind (set at open)
    int want_states;       // this round (or the open) sends them
    int root_pos;          // the round's root position (the text's length before it, less one)
    // the open's "hidden_layer" (an MoA drafter reading the target's states, with K,V or LSA rows):
    // each position's rows end with one more, the target's state at that layer (sd_batch.hidden_layers)
    int has_hidden, hidden_layer;
    int tli;               // SV_KIND_MEAN: the last tli layers' K,V rows follow the mean (the open's "tli")
    float *mk, *mv;        // (SV_SPLIT_MAX_NODES, kvd) SV_KIND_MEAN scratch: the layers' mean K and V rows
    float *hid;            // (cap_hid, d) the states of the generation's positions, as its steps bring them
    int cap_hid;           // positions allocated
    // states of the prompt (open) or the last step's path, int8 rows with a scale each:
    // SV_KIND_FUSED one row (4 + d) a position; SV_KIND_KV 2 L rows (4 + kvd) a position,
    // layer by layer its K row then its V row
    uint8_t *rows;         // (n_rows, sv_split_row_bytes)
    int n_rows;            // positions
    size_t cap_rows;       // bytes allocated
    float *fbuf;           // (SV_SPLIT_MAX_NODES, d) fused scratch
    float *kbuf, *vbuf;    // (SV_SPLIT_MAX_NODES, kvd) K,V scratch
    int first_token;       // open: the target's first token
    uint8_t *reply;        // (reply_len) the last reply (round: binary; open: JSON)
    size_t reply_len;
    int reply_status;      // its HTTP status
    char error[256];
    long n_rounds, n_tokens;
    // stop strings (the open's "stop"): the generation ends after the token completing one, as the
    // OpenAI API's does; text: the generated text's bytes (text_len), where they are looked for
    char *stop[SV_MAX_STOP];
    int n_stop, max_stop;
    char *text;
    size_t text_len, text_cap;
} sv_split;

typedef struct sv_splits {
    sv_split *e;           // (n)
    int n;
    int idle_s;            // a generation idle this long is gone
    int extract[3];        // the head's layers (fused by sd_head_fuse)
    int n_extract;         // 0: no EAGLE-3 head: rounds send no states
    int d;                 // n_embd
    int n_layer, kvd;      // the target's layers and K (or V) row width n_head_kv * head_dim (SV_KIND_KV)
    // SV_KIND_LSA: the server's MoA drafter (serve --head moa.gguf, with LSA) runs LSA for its clients
    sd_moa_lsa *lsa;       // or NULL
    int tli;               // its TLI: the last tli layers' K,V rows go with each position's LSA output
    uint64_t moa_fp;       // its sd_head_fingerprint (a client's drafter must be the same)
    float *kvf, *cf;       // (SV_SPLIT_MAX_NODES, L, 2 kvd), (SV_SPLIT_MAX_NODES, d): scheduler scratch
    pthread_cond_t cv;     // broadcast when some split generation's work is done
    long next;             // id counter
} sv_splits;

// At start (before the scheduler): the table. n 0: no split API (404).
int sv_split_init(sv_server *s, int n, int idle_s, char *err, size_t errlen);
void sv_split_free(sv_server *s);
// Scheduler: 1 when some split generation has work (under s->mu).
int sv_split_has_work(const sv_server *s);
// Scheduler round: begins the step of every split generation with work and
// appends its batch to the pass arrays at n; returns the new count.
int sv_split_join(sv_server *s, int n);
// After the pass over n entries: ends those steps and answers.
void sv_split_end(sv_server *s, int n);
// Scheduler, at shutdown: every waiting split request fails.
void sv_split_fail_all(sv_server *s, const char *why);

// split_http.c: one request of the API. which: 0 open, 1 round, 2 close;
// id the ?id= argument (or NULL). *out (malloc'd, *out_len bytes, type
// *ctype) is the reply body; returns the HTTP status.
// Bytes of one position's states in e's replies (0 for SV_KIND_NONE).
size_t sv_split_row_bytes(const sv_splits *t, const sv_split *e);

int sv_split_request(sv_server *s, int which, const char *id, const char *body, size_t len, char **out,
                     size_t *out_len, const char **ctype);

#endif
