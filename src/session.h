// session.h - internal: the mutable state of one sequence (KV cache, scratch,
// logits), shared by session.c (lifetime, commit, truncate) and forward.c
// (the batched tree-masked forward pass). Everything is sized at creation
// (house rule 3): a forward call allocates nothing.
#ifndef SD_SESSION_H
#define SD_SESSION_H

#include <stdint.h>

#include "model.h"
#include "quant.h"
#include "threadpool.h"

// Query heads of one KV head that the attention processes together (forward.c).
#define SD_ATT_MQ 3

struct sd_session {
    const sd_model *m;
    int n_ctx;          // KV slots per layer
    int n_batch;        // most nodes per forward
    int n_threads;      // threads of pool (caller included)
    int n_past;         // committed rows, slots [0, n_past)
    int n_pending;      // rows of the last forward, at slots [n_past, n_past + n_pending); 0 after commit/truncate
    int kv_dim;         // n_head_kv * head_dim
    int q_dim;          // n_head * head_dim

    // KV cache, float32, RoPE already applied to K.
    float *k_cache;     // (n_layer, n_ctx, kv_dim)
    float *v_cache;     // (n_layer, n_ctx, kv_dim)

    // Per-forward scratch.
    float *x;           // (n_batch, n_embd) residual stream
    float *xn;          // (n_batch, n_embd) normalised input of a block / projection output
    float *q;           // (n_batch, q_dim) queries (RoPE applied)
    float *att;         // (n_batch, q_dim) attention output
    float *ff_g;        // (n_batch, n_ff) gate, then silu(gate) * up
    float *ff_u;        // (n_batch, n_ff) up
    float *rope_cs;     // (n_batch, n_rot / 2, 2) cos, sin of each node's angles
    float *att_scores;  // (n_threads, SD_ATT_MQ, n_ctx + 16) softmax scratch per thread and query
    int32_t *anc;       // (n_batch, n_batch) tree mask as lists: row i = ancestors of node i and i itself, increasing
    int32_t *n_anc;     // (n_batch) count of anc[i]
    int32_t *parent;    // (n_batch) parent of each node of the last forward (-1: root)
    int32_t *pos;       // (n_batch) position of each node of the last forward
    int32_t *out_rows;  // (n_batch) nodes that asked for logits, in order
    int32_t *logit_row; // (n_batch) row of logits for node i, -1 if none
    float *logits;      // (n_batch, n_vocab)
    double *rope_freq;  // (n_rot / 2) angle per position of each rotary pair (radians; linear scaling folded in)

    // Layer skipping (self-speculative drafting, sd_session_set_layer_skip).
    uint8_t *layer_skip; // (n_layer) 1: the layer is skipped (residual passes through, no KV written); NULL: none
    int n_skip;          // layers with layer_skip[l] == 1

    sd_pool *pool;
    sd_mm_ctx mm;       // wbuf sized for the largest matmul with n_batch tokens
};

#endif
