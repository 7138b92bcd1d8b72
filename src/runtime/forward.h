// forward.h - internal: one forward pass over the nodes of one or several
// sessions (forward.c). sd_session_forward runs a pass over one session's
// batch on that session's own scratch; sd_batcher_forward (batcher.c) runs
// one pass over the batches of several sessions on the batcher's scratch:
// the rows of all nodes of all sessions in one activation matrix, so every
// weight matrix is read once for all of them, while each session's nodes
// attend only to that session's cache (attention.c, per segment).
#ifndef SD_FORWARD_H
#define SD_FORWARD_H

#include "runtime/session.h"

// One session's nodes in a pass: its batch node i is row t0 + i of the
// pass's matrices, and its r-th logit row (sd_session.out_rows order) is
// output row o0 + r.
typedef struct sd_fwd_seg {
    sd_session *s;
    int t0, n;          // rows [t0, t0 + n)
    int o0, n_out;      // output (logit) rows [o0, o0 + n_out)
} sd_fwd_seg;

// A pass: the segments in row order and the buffers it computes in. The
// sessions' batch structure (parents, ancestor lists, positions, logit and
// hidden rows) was recorded by sd_fwd_record; their KV rows are written at
// their own n_past.
typedef struct sd_fwd_pass {
    const sd_model *m;
    sd_mm_ctx *mm;            // matmul scratch for n rows (its act_f32 is set during the run)
    const sd_fwd_seg *seg;    // (n_seg) in row order, contiguous from row 0
    int n_seg;
    int n;                    // rows: sum of seg[j].n
    int precise;              // 1: float activations (sd_batch.precise) for every matmul of the pass
    int l_lo, l_hi;           // the layers the pass runs, [l_lo, l_hi) (a whole forward: 0, n_layer)
    int head;                 // 1: the output stage after them (final norm, logits, SD_HIDDEN_NORM rows)
    float *x_out;             // (n, n_embd) or NULL: every row's residual stream after layer l_hi - 1
    int any_hid;              // 1: some session asked for hidden rows
    const uint8_t *layer_skip; // (n_layer) 1: layer skipped, common to every session; NULL: none
    const int32_t *out_rows;  // (n_out) rows whose logits are wanted, increasing
    int n_out;
    // Scratch, row t for node t of the pass (shapes as in struct sd_session).
    float *x, *xn, *q, *k, *att, *ff_g, *ff_u;
    const float *rope_cs;     // (n, n_rot / 2, 2) cos, sin of each row's angles
    // V rows land in v (n, kv_dim), and the threads that computed them store
    // their columns, as fp16, into each session's cache rows (as they do K's).
    // Several segments: the logits land in logits (n_out, n_vocab) and the
    // threads that computed them copy their columns to each session's logits
    // (scatter = 1). One segment (scatter = 0): logits is the session's own.
    int scatter;
    float *v;
    float *logits;
} sd_fwd_pass;

// Checks batch b for session s (tokens, parents, positions, sizes, hidden
// requests, room in the context) without changing anything: 0, or <0 with a
// message.
int sd_fwd_check(const sd_session *s, const sd_batch *b, char *err, size_t errlen);
// Records a checked batch in s (drops the previous pending rows; parents,
// ancestor lists, positions and their RoPE angles, logit rows, hidden rows)
// and returns the number of nodes that asked for logits.
int sd_fwd_record(sd_session *s, const sd_batch *b);
// The input rows of b's n nodes (token embeddings, or its embd rows) into x (n, n_embd).
void sd_fwd_embed(const sd_model *m, const sd_batch *b, float *x);
// Runs the layers and the output matrix over the pass's rows (x holds the
// inputs), on mm's pool (whose busy flag the caller holds); then each
// session holds its n pending rows, logits and hidden rows as after its own
// forward.
void sd_fwd_run(const sd_fwd_pass *p);
// sd_session_forward without the pool's busy flag (the caller holds it): a
// pass of one segment on s's own scratch. 0, or <0 with a message (s untouched).
int sd_fwd_session(sd_session *s, const sd_batch *b, char *err, size_t errlen);
// Checks a part of the layers against s's model and the batch (layers held,
// output held, embd rows for a part after layer 0): 0, or <0 with a message.
int sd_fwd_part_check(const sd_session *s, const sd_batch *b, const sd_forward_part *part, char *err, size_t errlen);
// The same for a part of the layers (sd_session_forward_part); part NULL: the whole model.
int sd_fwd_part(sd_session *s, const sd_batch *b, const sd_forward_part *part, char *err, size_t errlen);

// Attention of a pass (attention.c): layer `layer` for every segment, each
// node against its own session's committed cache and its ancestors (their K
// rows already in the sessions' kt, V rows in their v_cache), queries in
// p->q, outputs into p->att and, unless out is NULL, converted into out (row
// t of the pass). sd_attention_parallel says whether the work is worth
// splitting among the pool's threads; sd_attention_part is thread ith's part
// (all parts together, on nth threads at once, equal sd_attention).
void sd_attention(const sd_fwd_pass *p, int layer, const sd_mm_act *out);
int sd_attention_parallel(const sd_fwd_pass *p);
void sd_attention_part(const sd_fwd_pass *p, int layer, const sd_mm_act *out, int ith, int nth);

#endif
