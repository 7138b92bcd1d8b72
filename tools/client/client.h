// client.h - specdec client (docs/split.md): drafts with the EAGLE-3 head on
// this machine, has a specdec server verify every tree (the verification
// API, tools/serve/split.h), and drafts on alone when the server cannot be
// reached, marking those tokens unverified until the server is back.
#ifndef SD_CLIENT_H
#define SD_CLIENT_H

#include <stdint.h>

#include "specdec.h"
#include "specdec_spec.h"
#include "client/net.h"
#include "stoptext.h"

typedef struct cl_opts {
    const char *server;      // http://HOST:PORT
    const char *api_key;     // or NULL
    int timeout_ms;          // a round's most time before the client drafts on alone (default 3000)
    int n_predict;           // tokens to generate
    int max_nodes;           // tree nodes per round, root included (<= the server's max)
    int offline_depth;       // tokens drafted per offline step (a chain)
    int retry_ms;            // the background probe's period while offline
    int final_wait_ms;       // at the end, how long to wait for the server to verify unverified tokens
    int states;              // 1: ask for the target's states (0: the drafter reads none)
    int kv;                  // the drafter is MoA: 1 the states are every layer's K,V rows, 2 LSA's outputs (the
                             // server's drafter) and the last tli layers' K,V rows, 3 (no LSA) the layers' mean
                             // K,V rows and the last tli layers'; 0: EAGLE-3's fused rows
    int tli;                 // kv 2, 3: the drafter's TLI
    int has_hidden;          // kv: the drafter also reads the target's states at hidden_layer (each position's rows
    int hidden_layer;        // end with one (n_embd) row; sd_drafter_hidden_layers)
    uint64_t drafter_fp;     // kv 2: sd_head_fingerprint of the drafter (the server's must be the same)
    int verbose;
    sd_sampler_params sp;    // the target's sampling (temp 0: greedy), sent with the open
    int greedy_drafts;       // sampling: draft the drafter's most likely tokens (0: its samples under the target's noise)
    const char *const *stop; // (n_stop) stop strings (--stop): the text ends where the first one starts
    int n_stop;
} cl_opts;

typedef struct cl_stats {
    int n_prompt;
    int n_generated;          // tokens of the final text after the prompt
    long rounds;              // verification rounds answered (open excluded)
    long calls;               // HTTP calls made (open, rounds, retries, close; failed ones included)
    long draft_nodes, accepted;
    int64_t bytes_sent, bytes_recv;          // on the wire (HTTP headers included)
    int64_t body_sent, body_recv;            // the API's messages
    double round_ms_sum, round_ms_max;
    double *round_ms;                        // (rounds) each answered round's latency
    long round_ms_cap;
    double open_ms;           // the open call (the prompt's evaluation on the server)
    double ttft_ms;           // start to the first token
    double total_ms;
    long unverified_emitted;  // tokens emitted unverified (offline)
    long confirmed;           // of those, verified later as they were
    long replaced;            // tokens replaced by the target's after the server came back
    long never_verified;      // tokens of the final text never verified (the generation ended offline)
    int offline_periods;      // times the client went offline
    int reopened;             // times the generation was opened again (lost on the server)
    char finish[16];          // "length", "eog", "ctx", "stopped" (a stop string), "offline"
    long stop_bytes;          // a stop string ended the text: the text's bytes (where it starts); else -1
    char last_error[256];
} cl_stats;

typedef struct cl_client cl_client;
// model: the client file (or the target) for its tokenizer, embeddings and
// vocabulary; d: an EAGLE-3 or MoA (o->kv) drafter made remote (sd_drafter_remote).
int cl_client_new(cl_client **out, const cl_opts *o, const sd_model *model, sd_drafter *d, char *err, size_t errlen);
void cl_client_free(cl_client *c);
// Generates after prompt; tokens through sink. prompt[0 .. n_private) is
// private: the drafter reads it, the server never receives it (its
// generation starts at prompt[n_private]). 0, or -1 with a message (the
// server refused the prompt, or could not be reached to open it).
int cl_client_run(cl_client *c, const int32_t *prompt, int n_prompt, int n_private, const tx_sink *sink, cl_stats *st,
                  char *err, size_t errlen);
// The final text's tokens (prompt excluded).
const int32_t *cl_client_tokens(const cl_client *c, int *n);

#endif
