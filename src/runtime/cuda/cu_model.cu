// cu_model.cu - the device model (weights dequantised to bf16, fused Q/K/V
// and gate/up), its scratch and pinned staging, the KV caches and the GEMM.
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cu_internal.h"

#include "kernels/elem.h"

extern "C" int sd_cu_available(char *info, size_t infolen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(info, infolen, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return -1;
    }
    cudaDeviceProp pr;
    if (cudaGetDeviceProperties(&pr, 0) != cudaSuccess) {
        snprintf(info, infolen, "CUDA device 0: cannot read its properties");
        return -1;
    }
    snprintf(info, infolen, "%s (sm_%d%d, %.1f GiB)", pr.name, pr.major, pr.minor,
             (double)pr.totalGlobalMem / (1 << 30));
    return 0;
}

static size_t bytes_of(const sd_cu_tensor *t) {
    return (size_t)(t->n_in / sd_elem_block_n(t->type)) * (size_t)sd_elem_block_bytes(t->type) * (size_t)t->n_out;
}

// Uploads a file tensor's blocks through a staging buffer and expands them
// to bf16 rows at dst (n_out rows of n_in).
static int upload_bf16(sd_cu_model *g, const sd_cu_tensor *t, __nv_bfloat16 *dst, void **stage, size_t *stage_n,
                       char *err, size_t errlen) {
    if (sd_elem_block_n(t->type) == 0 || t->n_in % sd_elem_block_n(t->type) != 0) {
        snprintf(err, errlen, "CUDA path: tensor type %d with rows of %lld is not supported", t->type, (long long)t->n_in);
        return -1;
    }
    const size_t nb = bytes_of(t);
    if (nb > *stage_n) {
        if (*stage) cudaFree(*stage);
        *stage = NULL;
        CU_TRY(cudaMalloc(stage, nb));
        *stage_n = nb;
    }
    CU_TRY(cudaMemcpyAsync(*stage, t->data, nb, cudaMemcpyHostToDevice, g->st));
    cu_dequant_bf16(g->st, t->type, *stage, t->n_in, t->n_out, dst);
    CU_TRY(cudaGetLastError());
    CU_TRY(cudaStreamSynchronize(g->st)); // the staging buffer is reused by the next tensor
    return 0;
}
static int upload_f32(sd_cu_model *g, const sd_cu_tensor *t, float *dst, void **stage, size_t *stage_n, char *err,
                      size_t errlen) {
    const size_t nb = bytes_of(t);
    if (nb > *stage_n) {
        if (*stage) cudaFree(*stage);
        *stage = NULL;
        CU_TRY(cudaMalloc(stage, nb));
        *stage_n = nb;
    }
    CU_TRY(cudaMemcpyAsync(*stage, t->data, nb, cudaMemcpyHostToDevice, g->st));
    cu_dequant_f32(g->st, t->type, *stage, t->n_in * t->n_out, dst);
    CU_TRY(cudaGetLastError());
    CU_TRY(cudaStreamSynchronize(g->st));
    return 0;
}

template <typename T>
static int dmalloc(sd_cu_model *g, T **p, size_t n, char *err, size_t errlen) {
    CU_TRY(cudaMalloc((void **)p, n * sizeof(T)));
    g->bytes += n * sizeof(T);
    return 0;
}

static int model_build(sd_cu_model *g, const sd_cu_model_desc *d, char *err, size_t errlen) {
    g->n_vocab = d->n_vocab;
    g->E = d->n_embd;
    g->n_layer = d->n_layer;
    g->n_head = d->n_head;
    g->n_head_kv = d->n_head_kv;
    g->hd = d->head_dim;
    g->F = d->n_ff;
    g->n_rot = d->n_rot;
    g->neox = d->rope_neox;
    g->eps = d->rms_eps;
    g->q_dim = d->n_head * d->head_dim;
    g->kv_dim = d->n_head_kv * d->head_dim;
    g->qkv_dim = g->q_dim + 2 * g->kv_dim;
    g->graphs_on = 1;
    const char *env = getenv("SPECDEC_CUDA_GRAPHS");
    if (env && env[0] == '0') g->graphs_on = 0;
    env = getenv("SPECDEC_CUDA_TIMING");
    g->timing = env && env[0] == '1';
    g->invariant = 1;
    env = getenv("SPECDEC_CUDA_INVARIANT");
    if (env && env[0] == '0') g->invariant = 0;
    if (g->hd > 256 || g->hd % 2) {
        snprintf(err, errlen, "CUDA path: head_dim %d is not supported (even, at most 256)", g->hd);
        return -1;
    }
    CU_TRY(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking));
    if (g->timing)
        for (int i = 0; i < 5; i++) CU_TRY(cudaEventCreate(&g->tev[i]));
    CUBLAS_TRY(cublasCreate(&g->blas));
    CUBLAS_TRY(cublasSetStream(g->blas, g->st));
    CUBLAS_TRY(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));
    CU_TRY(cudaMalloc(&g->blas_ws, 32u << 20));
    CUBLAS_TRY(cublasSetWorkspace(g->blas, g->blas_ws, 32u << 20));
    void *stage = NULL;
    size_t stage_n = 0;
    int rc = 0;
    g->layers = (cu_layer *)calloc((size_t)g->n_layer, sizeof(cu_layer));
    if (!g->layers) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const size_t E = (size_t)g->E;
    for (int l = 0; l < g->n_layer && rc == 0; l++) {
        const sd_cu_layer_desc *s = &d->layers[l];
        cu_layer *L = &g->layers[l];
        rc = dmalloc(g, &L->wqkv, (size_t)g->qkv_dim * E, err, errlen);
        if (!rc) rc = upload_bf16(g, &s->wq, L->wqkv, &stage, &stage_n, err, errlen);
        if (!rc) rc = upload_bf16(g, &s->wk, L->wqkv + (size_t)g->q_dim * E, &stage, &stage_n, err, errlen);
        if (!rc) rc = upload_bf16(g, &s->wv, L->wqkv + (size_t)(g->q_dim + g->kv_dim) * E, &stage, &stage_n, err, errlen);
        if (!rc && s->bq.type >= 0) {
            rc = dmalloc(g, &L->bqkv, (size_t)g->qkv_dim, err, errlen);
            if (!rc) rc = upload_f32(g, &s->bq, L->bqkv, &stage, &stage_n, err, errlen);
            if (!rc) rc = upload_f32(g, &s->bk, L->bqkv + g->q_dim, &stage, &stage_n, err, errlen);
            if (!rc) rc = upload_f32(g, &s->bv, L->bqkv + g->q_dim + g->kv_dim, &stage, &stage_n, err, errlen);
        }
        if (!rc) rc = dmalloc(g, &L->wo, E * g->q_dim, err, errlen);
        if (!rc) rc = upload_bf16(g, &s->wo, L->wo, &stage, &stage_n, err, errlen);
        if (!rc) rc = dmalloc(g, &L->wgu, 2 * (size_t)g->F * E, err, errlen);
        if (!rc) rc = upload_bf16(g, &s->gate, L->wgu, &stage, &stage_n, err, errlen);
        if (!rc) rc = upload_bf16(g, &s->up, L->wgu + (size_t)g->F * E, &stage, &stage_n, err, errlen);
        if (!rc) rc = dmalloc(g, &L->wdown, E * g->F, err, errlen);
        if (!rc) rc = upload_bf16(g, &s->down, L->wdown, &stage, &stage_n, err, errlen);
        if (!rc) rc = dmalloc(g, &L->attn_norm, E, err, errlen);
        if (!rc) rc = upload_f32(g, &s->attn_norm, L->attn_norm, &stage, &stage_n, err, errlen);
        if (!rc) rc = dmalloc(g, &L->ffn_norm, E, err, errlen);
        if (!rc) rc = upload_f32(g, &s->ffn_norm, L->ffn_norm, &stage, &stage_n, err, errlen);
    }
    if (!rc) rc = dmalloc(g, &g->out_norm, E, err, errlen);
    if (!rc) rc = upload_f32(g, &d->out_norm, g->out_norm, &stage, &stage_n, err, errlen);
    if (!rc) rc = dmalloc(g, &g->output, (size_t)g->n_vocab * E, err, errlen);
    if (!rc) rc = upload_bf16(g, &d->output, g->output, &stage, &stage_n, err, errlen);
    if (stage) cudaFree(stage);
    if (rc) return rc;
    // scratch for max_rows rows, at least one graph bucket (64)
    const int cap = d->max_rows < 64 ? 64 : d->max_rows;
    const size_t C = (size_t)cap, half = (size_t)(g->n_rot / 2) * 2;
    g->cap = cap;
    if (dmalloc(g, &g->x, C * E, err, errlen) ||
        dmalloc(g, &g->qkv, C * g->qkv_dim, err, errlen) || dmalloc(g, &g->q, C * g->q_dim, err, errlen) ||
        dmalloc(g, &g->gu, C * 2 * g->F, err, errlen) || dmalloc(g, &g->xf, C * E, err, errlen) ||
        dmalloc(g, &g->logits, C * g->n_vocab, err, errlen) || dmalloc(g, &g->xn, C * (E > (size_t)g->q_dim ? E : g->q_dim), err, errlen) ||
        dmalloc(g, &g->att, C * g->q_dim, err, errlen) || dmalloc(g, &g->h, C * g->F, err, errlen) ||
        dmalloc(g, &g->rope_cs, C * (half ? half : 2), err, errlen) || dmalloc(g, &g->rows, C, err, errlen) ||
        dmalloc(g, &g->out_rows, C, err, errlen) || dmalloc(g, &g->hid, (size_t)CU_MAX_HID * C * E, err, errlen))
        return -1;
    CU_TRY(cudaMallocHost((void **)&g->h_x, C * E * sizeof(float)));
    CU_TRY(cudaMallocHost((void **)&g->h_cs, C * (half ? half : 2) * sizeof(float)));
    CU_TRY(cudaMallocHost((void **)&g->h_rows, C * sizeof(cu_row)));
    CU_TRY(cudaMallocHost((void **)&g->h_out, C * sizeof(int32_t)));
    CU_TRY(cudaMallocHost((void **)&g->h_hid, (size_t)CU_MAX_HID * C * E * sizeof(float)));
    CU_TRY(cudaStreamSynchronize(g->st));
    return 0;
}

// SPECDEC_CUDA_TIMING=1: the mean of each part of a pass, by row count.
static void print_timing(const sd_cu_model *g) {
    fprintf(stderr, "specdec: CUDA pass timing (ms per pass: host = staging before the upload, up = uploads, "
                    "layers, logits = final norm and output matrix, down = downloads and sync, wall = "
                    "sd_cu_forward)\n");
    for (int r = 0; r < 66; r++) {
        const cu_tstat *t = &g->tstat[r];
        if (t->n == 0) continue;
        const double n = (double)t->n;
        fprintf(stderr, "  rows %s%-3d passes %-5lld host %.4f up %.4f layers %.4f logits %.4f down %.4f wall %.4f\n",
                r == 65 ? ">" : " ", r == 65 ? 64 : r, t->n, t->host / n, t->up / n, t->layers / n, t->logits / n,
                t->down / n, t->wall / n);
    }
}

extern "C" void sd_cu_model_free(sd_cu_model *g) {
    if (!g) return;
    if (g->st) cudaStreamSynchronize(g->st);
    if (g->timing) {
        print_timing(g);
        for (int i = 0; i < 5; i++)
            if (g->tev[i]) cudaEventDestroy(g->tev[i]);
    }
    for (int b = 0; b < CU_N_BUCKETS; b++)
        if (g->graph[b]) cudaGraphExecDestroy(g->graph[b]);
    if (g->layers)
        for (int l = 0; l < g->n_layer; l++) {
            cu_layer *L = &g->layers[l];
            cudaFree(L->wqkv);
            cudaFree(L->bqkv);
            cudaFree(L->wo);
            cudaFree(L->wgu);
            cudaFree(L->wdown);
            cudaFree(L->attn_norm);
            cudaFree(L->ffn_norm);
        }
    free(g->layers);
    void *dev[] = {g->out_norm, g->output, g->x,       g->qkv,      g->q,    g->gu,       g->xf,
                   g->logits,   g->xn,     g->att,     g->h,    g->rope_cs,  g->rows, g->out_rows, g->hid};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    void *host[] = {g->h_x, g->h_cs, g->h_rows, g->h_out, g->h_hid};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) cudaFreeHost(host[i]);
    if (g->blas) cublasDestroy(g->blas);
    cudaFree(g->blas_ws);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

extern "C" int sd_cu_model_new(const sd_cu_model_desc *d, sd_cu_model **out, char *err, size_t errlen) {
    *out = NULL;
    char info[256];
    if (sd_cu_available(info, sizeof info) < 0) {
        snprintf(err, errlen, "%s", info);
        return -1;
    }
    sd_cu_model *g = (sd_cu_model *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (model_build(g, d, err, errlen) < 0) {
        sd_cu_model_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

extern "C" size_t sd_cu_model_bytes(const sd_cu_model *g) { return g->bytes; }
extern "C" void sd_cu_set_graphs(sd_cu_model *g, int on) { g->graphs_on = on; }

extern "C" int sd_cu_kv_new(sd_cu_model *g, int n_ctx, sd_cu_kv **out, char *err, size_t errlen) {
    *out = NULL;
    sd_cu_kv *kv = (sd_cu_kv *)calloc(1, sizeof *kv);
    if (!kv) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    kv->g = g;
    kv->n_ctx = n_ctx;
    const size_t n = (size_t)g->n_layer * n_ctx * g->kv_dim;
    cudaError_t e1 = cudaMalloc((void **)&kv->k, n * sizeof(__half));
    cudaError_t e2 = e1 == cudaSuccess ? cudaMalloc((void **)&kv->v, n * sizeof(__half)) : e1;
    if (e2 != cudaSuccess) {
        snprintf(err, errlen, "CUDA: the KV cache (%.1f MiB) does not fit: %s", 2.0 * n * 2 / (1 << 20),
                 cudaGetErrorString(e2));
        sd_cu_kv_free(kv);
        return -4; // SD_ERR_OOM
    }
    *out = kv;
    return 0;
}

extern "C" int sd_cu_kv_pin_logits(sd_cu_kv *kv, void *p, size_t bytes) {
    if (kv->pinned || !p || bytes == 0) return -1;
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); // not sticky: the copies go through pageable memory instead
        return -1;
    }
    kv->pinned = p;
    kv->pinned_bytes = bytes;
    return 0;
}

extern "C" void sd_cu_kv_free(sd_cu_kv *kv) {
    if (!kv) return;
    if (kv->pinned) cudaHostUnregister(kv->pinned);
    cudaFree(kv->k);
    cudaFree(kv->v);
    free(kv);
}

extern "C" int sd_cu_kv_move(sd_cu_kv *kv, const int32_t *dst, const int32_t *src, int n, const uint8_t *layer_skip,
                             char *err, size_t errlen) {
    sd_cu_model *g = kv->g;
    if (n <= 0) return 0;
    if (2 * n > g->cap) {
        snprintf(err, errlen, "CUDA: a commit of %d rows is over the scratch (%d)", n, g->cap / 2);
        return -1;
    }
    // indices in the pinned out-row staging, then the device copy (out_rows is free between passes)
    memcpy(g->h_out, dst, sizeof(int32_t) * n);
    memcpy(g->h_out + n, src, sizeof(int32_t) * n);
    CU_TRY(cudaMemcpyAsync(g->out_rows, g->h_out, sizeof(int32_t) * 2 * n, cudaMemcpyHostToDevice, g->st));
    unsigned char *skip = NULL;
    if (layer_skip) {
        // the skip flags ride in the rows buffer's space (free between passes)
        memcpy(g->h_rows, layer_skip, (size_t)g->n_layer);
        CU_TRY(cudaMemcpyAsync(g->rows, g->h_rows, (size_t)g->n_layer, cudaMemcpyHostToDevice, g->st));
        skip = (unsigned char *)g->rows;
    }
    cu_kv_move(g->st, kv->k, kv->v, (long long)kv->n_ctx * g->kv_dim, g->n_layer, g->kv_dim, g->out_rows,
               g->out_rows + n, n, skip);
    CU_TRY(cudaGetLastError());
    CU_TRY(cudaStreamSynchronize(g->st));
    return 0;
}

extern "C" int sd_cu_kv_read(sd_cu_kv *kv, int l, int n, uint16_t *k, uint16_t *v, char *err, size_t errlen) {
    const size_t kvd = (size_t)kv->g->kv_dim, off = (size_t)l * kv->n_ctx * kvd;
    CU_TRY(cudaMemcpy(k, kv->k + off, (size_t)n * kvd * 2, cudaMemcpyDeviceToHost));
    CU_TRY(cudaMemcpy(v, kv->v + off, (size_t)n * kvd * 2, cudaMemcpyDeviceToHost));
    return 0;
}
extern "C" int sd_cu_kv_write(sd_cu_kv *kv, int l, int n, const uint16_t *k, const uint16_t *v, char *err,
                              size_t errlen) {
    const size_t kvd = (size_t)kv->g->kv_dim, off = (size_t)l * kv->n_ctx * kvd;
    CU_TRY(cudaMemcpy(kv->k + off, k, (size_t)n * kvd * 2, cudaMemcpyHostToDevice));
    CU_TRY(cudaMemcpy(kv->v + off, v, (size_t)n * kvd * 2, cudaMemcpyHostToDevice));
    return 0;
}

// Y (n, out) = X (n, in) W^T + beta Y. Column-major view: Y^T (out x n) = W' ^T (out x in) X' (in x n),
// with W' the column-major (in x out) view of the row-major W.
int cu_gemm(sd_cu_model *g, const __nv_bfloat16 *W, int out, int in, const __nv_bfloat16 *X, int n, float *Y,
            float beta, char *err, size_t errlen) {
    const float one = 1.0f;
    CUBLAS_TRY(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, CUDA_R_16BF, in, X, CUDA_R_16BF, in,
                            &beta, Y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}
