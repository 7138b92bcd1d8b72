// gpu.h - internal: the device side of the CUDA path, as plain C that both
// the C compiler and nvcc read. The engine's structures stay on the host:
// gpu.c (always built) translates a model and a forward pass (sd_fwd_pass)
// into the descriptions below and calls the sd_cu_* functions, which the
// CUDA build implements in src/runtime/cuda/ and every other build stubs in
// gpu_none.c (they fail, saying how to build with CUDA).
//
// The design (docs/gpu.md): weights are dequantised once at load to bf16 on
// the device (the file's blocks are uploaded and expanded there with
// kernels/elem.h); Q, K, V and gate, up are fused into one matrix each; every
// projection is one cuBLAS bf16 GEMM with f32 accumulation; RMSNorm with the
// residual add, bias + RoPE + the KV append, the tree attention over the
// cache and SwiGLU are own kernels; the embedding rows are gathered on the
// host (the CPU engine's exact rows) and uploaded with the pass's metadata.
// Only the logit rows that verification reads come back. The KV cache is
// fp16, as the CPU engine's. The layer stack of a pass can be captured in a
// CUDA graph per row bucket (1, 2, 4, ... 64 rows).
#ifndef SD_GPU_H
#define SD_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_cu_model sd_cu_model; // a model's weights and scratch on the device
typedef struct sd_cu_kv sd_cu_kv;       // one session's KV cache on the device

// A tensor as the file holds it: type (GGUF's id), n_out rows of n_in elements
// (a vector: n_out = 1), its host bytes. type < 0: absent.
typedef struct sd_cu_tensor {
    int type;
    int64_t n_in, n_out;
    const void *data;
} sd_cu_tensor;

typedef struct sd_cu_layer_desc {
    sd_cu_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, gate, up, down;
} sd_cu_layer_desc;

typedef struct sd_cu_model_desc {
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    int rope_neox;      // 1: pairs (i, i + n_rot/2); 0: pairs (2i, 2i+1)
    float rms_eps;
    sd_cu_tensor out_norm, output;
    const sd_cu_layer_desc *layers; // (n_layer)
    int max_rows;       // most rows of one pass
} sd_cu_model_desc;

// A session's rows in a pass (rows [t0, t0 + n) of the pass).
typedef struct sd_cu_seg {
    sd_cu_kv *kv;
    int t0, n;
    int n_past;             // committed cache rows: the batch's rows go to slots n_past + i
    int chain;              // 1: row i sees the segment's rows 0..i; 0: anc says
    const uint64_t *anc;    // (n) when !chain (n <= 64): bit j set when row i sees row j of the segment
    // Hidden rows (the engine's sd_batch.hidden_layers): n_hid layer indices
    // (SD_HIDDEN_NORM = -1: the final normed state), the rank of each row among
    // those wanted (-1: not wanted), the caller's buffer (wanted rows, n_hid, n_embd).
    int n_hid;
    const int32_t *hid_layers;
    const int32_t *hid_row;
    float *hid_out;
    int o0, n_out;          // output (logit) rows [o0, o0 + n_out) of the pass
    float *logits;          // host (n_out, n_vocab): this session's logit rows
} sd_cu_seg;

typedef struct sd_cu_pass {
    int n;                  // rows
    int n_seg;
    const sd_cu_seg *seg;   // in row order
    const float *x;         // host (n, n_embd): the input rows
    const float *rope_cs;   // host (n, n_rot / 2, 2): cos, sin of each row's angles (the engine's)
    const uint8_t *layer_skip; // (n_layer) 1: skipped; NULL: none
    const int32_t *out_rows;   // (n_out) rows whose logits are wanted, increasing
    int n_out;
} sd_cu_pass;

// Whether this build and machine can run the CUDA path: 0, or <0 with the reason.
int sd_cu_available(char *info, size_t infolen);
int sd_cu_model_new(const sd_cu_model_desc *d, sd_cu_model **out, char *err, size_t errlen);
void sd_cu_model_free(sd_cu_model *g);
// Bytes of device memory the model's weights take.
size_t sd_cu_model_bytes(const sd_cu_model *g);
int sd_cu_kv_new(sd_cu_model *g, int n_ctx, sd_cu_kv **out, char *err, size_t errlen);
void sd_cu_kv_free(sd_cu_kv *kv);
// Pins the first bytes of the session's host logits buffer p, so that passes
// copy their logit rows straight into it at full speed (rows beyond go
// through pageable memory); unpinned by sd_cu_kv_free. 0, or <0 when the
// driver refuses (every copy then goes through pageable memory).
int sd_cu_kv_pin_logits(sd_cu_kv *kv, void *p, size_t bytes);
// Commit: for k = 0.. n-1 in order, cache slot src[k] moves to slot dst[k]
// (dst[k] <= src[k], increasing) in every layer not skipped.
int sd_cu_kv_move(sd_cu_kv *kv, const int32_t *dst, const int32_t *src, int n, const uint8_t *layer_skip, char *err,
                  size_t errlen);
// Copies cache slots [0, n) of layer l to the host as fp16 rows (n, kv_dim), K then V (state save).
int sd_cu_kv_read(sd_cu_kv *kv, int l, int n, uint16_t *k, uint16_t *v, char *err, size_t errlen);
int sd_cu_kv_write(sd_cu_kv *kv, int l, int n, const uint16_t *k, const uint16_t *v, char *err, size_t errlen);
// One forward pass: the segments' logit rows and hidden rows land in their
// host buffers; the K, V rows in their caches. 0, or <0 with a message.
int sd_cu_forward(sd_cu_model *g, const sd_cu_pass *p, char *err, size_t errlen);
// CUDA graphs for the layer stack (default on; SPECDEC_CUDA_GRAPHS=0 turns them off).
void sd_cu_set_graphs(sd_cu_model *g, int on);
// Runs every kernel on random inputs against host code (kernels/elem.h and
// double-precision references) and prints one line per op; returns failures.
int sd_cu_selftest(int verbose);

#ifdef __cplusplus
}
#endif

#endif
