// session.h - internal: the mutable state of one sequence (KV cache, scratch,
// logits), shared by session.c (lifetime, commit, truncate) and forward.c
// (the batched tree-masked forward pass). Everything is sized at creation
// (docs/house-rules.md, rule 3): a forward call allocates nothing.
#ifndef SD_SESSION_H
#define SD_SESSION_H

#include <stdint.h>

#include "model/model.h"
#include "kernels/matmul.h"
#include "kernels/threadpool.h"

// Most queries of one KV head that the attention processes together
// (attention.c): every key and value row load serves all of them. 24 = 3
// score tiles of 8 = 4 output tiles of 6 (AVX-512); measured on the default
// model at 16 tokens (2 threads): 7% off the forward against 8; 16 and 48 no
// better than 24. Scratch: n_threads * SD_ATT_QB * n_ctx floats per session.
#define SD_ATT_QB 24
// Positions per block of the transposed K cache.
#define SD_KT_W 16

struct sd_session {
    const sd_model *m;
    int n_ctx;          // KV slots per layer
    int n_batch;        // most nodes per forward
    int n_threads;      // threads of pool (caller included)
    int n_past;         // committed rows, slots [0, n_past)
    int n_pending;      // rows of the last forward, at slots [n_past, n_past + n_pending); 0 after commit/truncate
    int kv_dim;         // n_head_kv * head_dim
    int q_dim;          // n_head * head_dim
    int l0, n_lay;      // the layers cached, [l0, l0 + n_lay): the model's held range (sd_model_load_part);
                        // layer l's rows are at index l - l0 of kt and v_cache

    // KV cache, fp16 (IEEE half, rounded to nearest even: half the bytes
    // that every attention reads), RoPE already applied to K. K is kept transposed in
    // blocks of SD_KT_W positions (attention.c): dimension c of positions
    // 16 b .. 16 b + 15 of KV head g is kt[l][g][b][c][0..16), contiguous.
    // V is by positions.
    uint16_t *kt;       // (n_lay, n_head_kv, kt_nblk, head_dim, SD_KT_W)
    int kt_nblk;        // blocks per layer and KV head: n_ctx / SD_KT_W rounded up
    uint16_t *v_cache;  // (n_lay, n_ctx, kv_dim)

    // Per-forward scratch.
    float *x;           // (n_batch, n_embd) residual stream
    float *xn;          // (n_batch, n_embd) normalised input of a block / projection output
    float *q;           // (n_batch, q_dim) queries (RoPE applied)
    float *k;           // (n_batch, kv_dim) keys of the batch before they go to kt
    float *v;           // (n_batch, kv_dim) values of the batch before they go to v_cache
    float *att;         // (n_batch, q_dim) attention output
    float *ff_g;        // (n_batch, n_ff) gate, then silu(gate) * up
    float *ff_u;        // (n_batch, n_ff) up
    float *rope_cs;     // (n_batch, n_rot / 2, 2) cos, sin of each node's angles
    float *att_scores;  // (n_threads, SD_ATT_QB, kt_nblk * SD_KT_W) scores / probabilities per thread and query
    int32_t *anc;       // (n_batch, n_batch) tree mask as lists: row i = ancestors of node i and i itself, increasing
    int32_t *n_anc;     // (n_batch) count of anc[i]
    int32_t *parent;    // (n_batch) parent of each node of the last forward (-1: root)
    int32_t *pos;       // (n_batch) position of each node of the last forward
    int32_t *out_rows;  // (n_batch) nodes that asked for logits, in order
    int32_t *logit_row; // (n_batch) row of logits for node i, -1 if none
    float *logits;      // (n_batch, n_vocab)
    double *rope_freq;  // (n_rot / 2) angle per position of each rotary pair (radians; linear scaling folded in)

    // Hidden-state rows of the current forward (sd_batch.hidden_layers),
    // copied out where the residual stream holds them (forward.c).
    int32_t *hid_row;   // (n_batch) rank of node i among the nodes whose rows are wanted, -1: not wanted
    int32_t hid_layers[SD_MAX_HIDDEN_LAYERS]; // (n_hid) layer indices or SD_HIDDEN_NORM
    int n_hid;          // entries of hid_layers; 0: no rows asked (nothing is copied)
    float *hid_out;     // (wanted nodes, n_hid, n_embd) the caller's buffer, valid during the forward only

    // Layer skipping (self-speculative drafting, sd_session_set_layer_skip).
    uint8_t *layer_skip; // (n_layer) 1: the layer is skipped (residual passes through, no KV written); NULL: none
    int n_skip;          // layers with layer_skip[l] == 1

    // The CUDA path (runtime/gpu.c): this session's KV cache on the device;
    // NULL: the session computes on the CPU.
    struct sd_cu_kv *gkv;

    sd_session_hooks hooks; // a program's forward / commit / truncate hooks (sd_session_set_hooks); zero: none
    sd_pool *pool;      // worker threads, owned or shared (a reference); held (busy flag) during a forward
    sd_mm_ctx mm;       // wbuf and abuf sized for the largest matmul with n_batch tokens
};

// attention.c: the copy of n key rows (n, kv_dim) into a layer's kt at
// slots n_past.. (all dims, or dims [d0, d1) of every row), and the move of a
// layer's kt slot src to slot dst (commit). The attention itself is in
// runtime/forward.h.
void sd_kt_store(sd_session *s, int layer, const float *k, int n);
void sd_kt_store_dims(sd_session *s, int layer, const float *k, int n, int d0, int d1);
void sd_kt_move(sd_session *s, int layer, int dst, int src);

// kv_read.c: the committed K and V rows of positions pos .. pos+n-1 of
// layer (pos + n <= n_past), converted to float: k and v (n, kv_dim) each,
// K with RoPE applied as cached. For drafters that read the target's cache
// (the MoA drafter's LSA, docs/moa.md). Returns 0, or <0 when the rows are
// not committed or the layer is out of range.
int sd_session_kv_rows(const sd_session *s, int layer, int pos, int n, float *k, float *v);

// session.c: the largest sd_matmul_wsize over the model's matrices for n_tok
// tokens (the size of a forward's wbuf and abuf), and cache-line aligned
// memory (zeroed if zero; free with free), the per-forward buffers' allocator.
size_t sd_fwd_wsize(const sd_model *m, int64_t n_tok);
void *sd_line_alloc(size_t n, int zero);

#endif
