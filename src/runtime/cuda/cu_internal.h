// cu_internal.h - internal to src/runtime/cuda/: the device model, the KV
// cache, the kernels' launchers and the error macro.
#ifndef SD_CU_INTERNAL_H
#define SD_CU_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "runtime/gpu.h"

// Fails the calling function (which has err, errlen) with the CUDA error.
#define CU_TRY(call)                                                                                 \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            snprintf(err, errlen, "CUDA: %s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, \
                     __LINE__);                                                                      \
            return -1;                                                                               \
        }                                                                                            \
    } while (0)
#define CUBLAS_TRY(call)                                                                            \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            snprintf(err, errlen, "cuBLAS: %s failed: status %d (%s:%d)", #call, (int)s_, __FILE__, __LINE__); \
            return -1;                                                                              \
        }                                                                                           \
    } while (0)

#define CU_MAX_HID 9         // SD_MAX_HIDDEN_LAYERS + the final norm
#define CU_N_BUCKETS 7       // graph buckets: 1, 2, 4, 8, 16, 32, 64 rows

// Per row of a pass, on the device (uploaded with the pass).
typedef struct cu_row {
    __half *k, *v;           // the row's session cache, layer 0 (layer l: + l * layer_stride)
    long long layer_stride;  // elements between layers: n_ctx * kv_dim
    int n_past;              // committed rows of its session
    int j;                   // the row's index in its segment (slot n_past + j)
    int chain;               // 1: sees segment rows 0..j; 0: mask
    int valid;               // 0: a padding row (no KV write, zero output)
    unsigned long long mask; // !chain: bit i set when it sees segment row i
} cu_row;

typedef struct cu_layer {
    __nv_bfloat16 *wqkv;     // (q_dim + 2 kv_dim, n_embd)
    float *bqkv;             // (q_dim + 2 kv_dim) or NULL
    __nv_bfloat16 *wo;       // (n_embd, q_dim)
    __nv_bfloat16 *wgu;      // (2 n_ff, n_embd): gate rows, then up rows
    __nv_bfloat16 *wdown;    // (n_embd, n_ff)
    float *attn_norm, *ffn_norm; // (n_embd)
} cu_layer;

typedef struct cu_tstat {
    long long n;
    double host, up, layers, logits, down, wall; // ms, summed
} cu_tstat;

struct sd_cu_model {
    int n_vocab, E, n_layer, n_head, n_head_kv, hd, F, n_rot, neox, q_dim, kv_dim, qkv_dim, max_rows;
    float eps;
    cu_layer *layers;        // host array of device pointers
    float *out_norm;
    __nv_bfloat16 *output;   // (n_vocab, E)
    size_t bytes;
    cudaStream_t st;
    cublasHandle_t blas;
    void *blas_ws;           // cuBLAS's workspace, fixed (graph capture must not allocate)
    // scratch, max_rows rows (bucket-padded to a multiple of 64)
    int cap;                 // rows the scratch holds
    float *x, *qkv, *q, *gu, *xf, *logits;
    __nv_bfloat16 *xn, *att, *h;
    float *rope_cs;          // (cap, n_rot/2, 2)
    cu_row *rows;            // (cap)
    int32_t *out_rows;       // (cap)
    float *hid;              // (CU_MAX_HID, cap, E) hidden rows staged
    // pinned host staging of a pass's uploads
    float *h_x, *h_cs;
    cu_row *h_rows;
    int32_t *h_out;
    float *h_hid;
    // graphs of the layer stack per bucket, and the hidden-layer set each was captured with
    int graphs_on;
    int invariant;           // 1 (default): passes of up to 64 rows padded to 64 (batch invariance)
    cudaGraphExec_t graph[CU_N_BUCKETS];
    unsigned long long graph_key[CU_N_BUCKETS];
    unsigned long long warm_key[CU_N_BUCKETS]; // the plan each bucket last ran directly with
    // SPECDEC_CUDA_TIMING=1: where a pass's time goes, by its row count
    // (0-64, 65: more), printed to stderr when the model is freed
    int timing;
    cudaEvent_t tev[5];
    cu_tstat tstat[66];
};

struct sd_cu_kv {
    sd_cu_model *g;
    int n_ctx;
    __half *k, *v;           // (n_layer, n_ctx, kv_dim) each
    void *pinned;            // the session's logits, registered with the driver (or NULL)
    size_t pinned_bytes;     // how much of them, from the start
};

// kernels (cu_kernels.cu); every launcher runs on stream st.
void cu_dequant_bf16(cudaStream_t st, int type, const void *src, long long n_in, long long rows, __nv_bfloat16 *dst);
void cu_dequant_f32(cudaStream_t st, int type, const void *src, long long n, float *dst);
// y = x (+ add) (written back to x when add), xn = bf16(rmsnorm(x) * w), also
// xf = rmsnorm(x) * w in float when xf; rows: sel (n, indices) or all n rows.
void cu_add_norm(cudaStream_t st, float *x, const float *add, const float *w, int E, float eps, int n,
                 const int32_t *sel, __nv_bfloat16 *xn, float *xf);
void cu_qkv_post(cudaStream_t st, const float *qkv, const float *bias, const float *rope_cs, const cu_row *rows, int n,
                 int layer, int n_head, int n_head_kv, int hd, int n_rot, int neox, float *q);
void cu_attention(cudaStream_t st, const float *q, const cu_row *rows, int n, int layer, int n_head, int n_head_kv,
                  int hd, __nv_bfloat16 *out);
void cu_swiglu(cudaStream_t st, const float *gu, int n, int F, __nv_bfloat16 *h);
void cu_kv_move(cudaStream_t st, __half *k, __half *v, long long layer_stride, int n_layer, int kv_dim,
                const int32_t *dst, const int32_t *src, int n, const unsigned char *skip);
// Y (n, out) = X (n, in) W^T + beta Y, W (out, in) bf16 row-major, f32 out
// (beta 1: the residual added in the GEMM's epilogue).
int cu_gemm(sd_cu_model *g, const __nv_bfloat16 *W, int out, int in, const __nv_bfloat16 *X, int n, float *Y,
            float beta, char *err, size_t errlen);

#endif
