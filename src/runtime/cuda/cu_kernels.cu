// cu_kernels.cu - the CUDA path's own kernels: dequantisation to bf16 at
// load, RMSNorm with the residual add, bias + RoPE + the KV append, the tree
// attention over the fp16 cache with an online softmax, SwiGLU, the residual
// add and the commit's KV moves. The per-element math is kernels/elem.h's,
// shared with the C tests.
#include "runtime/cuda/cu_internal.h"

#include "kernels/elem.h"

// ---------------------------------------------------------------- dequantisation

__global__ void k_dequant_bf16(int type, const unsigned char *src, long long n_in, long long rows, size_t row_bytes,
                               __nv_bfloat16 *dst) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_in * rows) return;
    const long long r = i / n_in, j = i % n_in;
    const float f = sd_elem_row_get(type, src + r * row_bytes, j);
    dst[i] = __float2bfloat16_rn(f);
}
__global__ void k_dequant_f32(int type, const unsigned char *src, long long n, float *dst) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = sd_elem_row_get(type, src, i);
}

static size_t row_bytes_of(int type, long long n_in) {
    return (size_t)(n_in / sd_elem_block_n(type)) * (size_t)sd_elem_block_bytes(type);
}
void cu_dequant_bf16(cudaStream_t st, int type, const void *src, long long n_in, long long rows, __nv_bfloat16 *dst) {
    const long long n = n_in * rows;
    k_dequant_bf16<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(type, (const unsigned char *)src, n_in, rows,
                                                                 row_bytes_of(type, n_in), dst);
}
void cu_dequant_f32(cudaStream_t st, int type, const void *src, long long n, float *dst) {
    k_dequant_f32<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(type, (const unsigned char *)src, n, dst);
}

// ---------------------------------------------------------------- block reductions

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum (or max) over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <int MAX>
__device__ float block_reduce(float v, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float r = lane < nw ? red[lane] : (MAX ? -INFINITY : 0.0f);
    r = MAX ? warp_max(r) : warp_sum(r);
    return r;
}

// ---------------------------------------------------------------- RMSNorm (+ residual)

__global__ void k_add_norm(float *x, const float *add, const float *w, int E, float eps, const int32_t *sel,
                           __nv_bfloat16 *xn, float *xf) {
    __shared__ float red[32];
    const int o = blockIdx.x, r = sel ? sel[o] : o;
    float *xr = x + (size_t)r * E;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = xr[i];
        if (add) {
            v += add[(size_t)r * E + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_reduce<0>(ss, red);
    const float s = 1.0f / sqrtf(ss / (float)E + eps);
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        const float v = xr[i] * s * w[i];
        xn[(size_t)o * E + i] = __float2bfloat16_rn(v);
        if (xf) xf[(size_t)o * E + i] = v;
    }
}
void cu_add_norm(cudaStream_t st, float *x, const float *add, const float *w, int E, float eps, int n,
                 const int32_t *sel, __nv_bfloat16 *xn, float *xf) {
    if (n > 0) k_add_norm<<<n, 256, 0, st>>>(x, add, w, E, eps, sel, xn, xf);
}

// ---------------------------------------------------------------- bias + RoPE + KV append

// One block per row: the row's q, k, v (with their bias) in shared memory,
// the rotary pairs of every q and k head turned, q written out in float, k
// and v rounded to fp16 into the row's cache slot.
__global__ void k_qkv_post(const float *qkv, const float *bias, const float *rope_cs, const cu_row *rows, int layer,
                           int n_head, int n_head_kv, int hd, int n_rot, int neox, float *q) {
    extern __shared__ float sh[];
    const int t = blockIdx.x, qd = n_head * hd, kvd = n_head_kv * hd, w = qd + 2 * kvd;
    const cu_row rw = rows[t];
    for (int i = threadIdx.x; i < w; i += blockDim.x) sh[i] = qkv[(size_t)t * w + i] + (bias ? bias[i] : 0.0f);
    __syncthreads();
    const int half = n_rot / 2, nh = n_head + n_head_kv;
    const float *cs = rope_cs + (size_t)t * half * 2;
    for (int p = threadIdx.x; p < nh * half; p += blockDim.x) {
        const int h = p / half, i = p % half;
        float *v = sh + (size_t)h * hd; // q heads, then k heads (contiguous after q)
        int j0, j1 = sd_elem_rope_partner(neox, n_rot, i, &j0);
        sd_elem_rope_pair(&v[j0], &v[j1], cs[2 * i], cs[2 * i + 1], neox);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < qd; i += blockDim.x) q[(size_t)t * qd + i] = rw.valid ? sh[i] : 0.0f;
    if (!rw.valid) return;
    const long long slot = (long long)layer * rw.layer_stride + (long long)(rw.n_past + rw.j) * kvd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        rw.k[slot + i] = __float2half_rn(sh[qd + i]);
        rw.v[slot + i] = __float2half_rn(sh[qd + kvd + i]);
    }
}
void cu_qkv_post(cudaStream_t st, const float *qkv, const float *bias, const float *rope_cs, const cu_row *rows, int n,
                 int layer, int n_head, int n_head_kv, int hd, int n_rot, int neox, float *q) {
    const size_t shm = sizeof(float) * (size_t)(n_head + 2 * n_head_kv) * hd;
    if (n > 0) k_qkv_post<<<n, 128, shm, st>>>(qkv, bias, rope_cs, rows, layer, n_head, n_head_kv, hd, n_rot, neox, q);
}

// ---------------------------------------------------------------- attention

// One block (128 threads) per (row, query head). Keys in chunks of ATT_CH
// positions: each thread scores positions tid, tid + 128, ... of the chunk
// (invisible ones -inf), the block takes the chunk's max and sum, then thread
// d accumulates output dims d and d + 128 over the chunk; chunk states merge
// with the online softmax (kernels/elem.h). The loop runs over the row's
// visible positions in order (its logical positions 0 .. n_vis - 1), never
// over masked slots: a tree node at depth d then sums exactly as the same
// token decoded alone at that position (same chunks, same thread per key,
// same order), which greedy speculation's bit-equality needs. Logical
// position q < n_past is cache slot q; beyond it, a chain row's q is slot q
// and a tree row's is n_past + vis[q - n_past], vis listing its mask's set
// bits (its ancestors, then itself) in index order.
#define ATT_CH 256
#define ATT_T 128
#define ATT_U 4 // V rows loaded ahead in the weighted sum
__global__ void __launch_bounds__(ATT_T) k_attention(const float *q, const cu_row *rows, int layer, int n_head,
                                                     int n_head_kv, int hd, __nv_bfloat16 *out) {
    __shared__ float qs[256];
    __shared__ float w[ATT_CH];
    __shared__ int sl[ATT_CH];
    __shared__ unsigned char vis[64];
    __shared__ float red[32];
    const int t = blockIdx.x, h = blockIdx.y, g = h / (n_head / n_head_kv), kvd = n_head_kv * hd;
    const cu_row rw = rows[t];
    const int d0 = threadIdx.x, d1 = threadIdx.x + ATT_T;
    __nv_bfloat16 *o = out + (size_t)t * n_head * hd + (size_t)h * hd;
    if (!rw.valid) {
        if (d0 < hd) o[d0] = __float2bfloat16_rn(0.0f);
        if (d1 < hd) o[d1] = __float2bfloat16_rn(0.0f);
        return;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = threadIdx.x; i < hd; i += ATT_T) qs[i] = q[(size_t)t * n_head * hd + (size_t)h * hd + i] * scale;
    if (!rw.chain && threadIdx.x < 64 && ((rw.mask >> threadIdx.x) & 1ull))
        vis[__popcll(rw.mask & ((1ull << threadIdx.x) - 1ull))] = (unsigned char)threadIdx.x;
    __syncthreads();
    const __half *K = rw.k + (long long)layer * rw.layer_stride + (long long)g * hd;
    const __half *V = rw.v + (long long)layer * rw.layer_stride + (long long)g * hd;
    const int n_pos = rw.chain ? rw.n_past + rw.j + 1 : rw.n_past + __popcll(rw.mask); // visible positions
    sd_elem_sm run = {-INFINITY, 0.0f};
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int c0 = 0; c0 < n_pos; c0 += ATT_CH) {
        const int cn = min(ATT_CH, n_pos - c0);
        float mx = -INFINITY;
        for (int p = threadIdx.x; p < cn; p += ATT_T) {
            const int lq = c0 + p;
            const int v = rw.chain || lq < rw.n_past ? lq : rw.n_past + vis[lq - rw.n_past];
            const __half *kr = K + (long long)v * kvd;
            float s = 0.0f;
            for (int d = 0; d < hd; d += 2) {
                const float2 kf = __half22float2(*(const __half2 *)(kr + d));
                s += qs[d] * kf.x + qs[d + 1] * kf.y;
            }
            sl[p] = v;
            w[p] = s;
            mx = fmaxf(mx, s);
        }
        mx = block_reduce<1>(mx, red);
        float sum = 0.0f;
        for (int p = threadIdx.x; p < cn; p += ATT_T) {
            const float e = w[p] == -INFINITY ? 0.0f : __expf(w[p] - mx);
            w[p] = e;
            sum += e;
        }
        sum = block_reduce<0>(sum, red); // its __syncthreads also publishes w and sl
        // positions in order; the loads of ATT_U positions issued before their
        // sums (a weight of 0 adds 0: no branch, the same sums as one by one)
        float a0 = 0.0f, a1 = 0.0f;
        const int dd0 = d0 < hd ? d0 : 0, dd1 = d1 < hd ? d1 : 0;
        int p = 0;
        for (; p + ATT_U <= cn; p += ATT_U) {
            float v0[ATT_U], v1[ATT_U];
#pragma unroll
            for (int u = 0; u < ATT_U; u++) {
                const __half *vr = V + (long long)sl[p + u] * kvd;
                v0[u] = __half2float(vr[dd0]);
                v1[u] = __half2float(vr[dd1]);
            }
#pragma unroll
            for (int u = 0; u < ATT_U; u++) {
                a0 += w[p + u] * v0[u];
                a1 += w[p + u] * v1[u];
            }
        }
        for (; p < cn; p++) {
            const __half *vr = V + (long long)sl[p] * kvd;
            a0 += w[p] * __half2float(vr[dd0]);
            a1 += w[p] * __half2float(vr[dd1]);
        }
        float wa, wb;
        const sd_elem_sm ch = {mx, sum};
        run = sd_elem_sm_merge(run, ch, &wa, &wb);
        acc0 = acc0 * wa + a0 * wb;
        acc1 = acc1 * wa + a1 * wb;
        __syncthreads(); // w is rewritten by the next chunk
    }
    const float inv = run.l > 0.0f ? 1.0f / run.l : 0.0f;
    if (d0 < hd) o[d0] = __float2bfloat16_rn(acc0 * inv);
    if (d1 < hd) o[d1] = __float2bfloat16_rn(acc1 * inv);
}
void cu_attention(cudaStream_t st, const float *q, const cu_row *rows, int n, int layer, int n_head, int n_head_kv,
                  int hd, __nv_bfloat16 *out) {
    if (n > 0) k_attention<<<dim3(n, n_head), ATT_T, 0, st>>>(q, rows, layer, n_head, n_head_kv, hd, out);
}

// ---------------------------------------------------------------- SwiGLU

__global__ void k_swiglu(const float *gu, int n, int F, __nv_bfloat16 *h) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * F) return;
    const long long t = i / F, c = i % F;
    const float g = gu[t * 2 * F + c], u = gu[t * 2 * F + F + c];
    h[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
}
void cu_swiglu(cudaStream_t st, const float *gu, int n, int F, __nv_bfloat16 *h) {
    const long long m = (long long)n * F;
    if (m > 0) k_swiglu<<<(unsigned)((m + 255) / 256), 256, 0, st>>>(gu, n, F, h);
}

// ---------------------------------------------------------------- commit

// One block per layer, moves in order (a move's source is never an earlier move's target).
__global__ void k_kv_move(__half *k, __half *v, long long layer_stride, int kv_dim, const int32_t *dst,
                          const int32_t *src, int n, const unsigned char *skip) {
    const int l = blockIdx.x;
    if (skip && skip[l]) return;
    for (int m = 0; m < n; m++) {
        const long long a = (long long)l * layer_stride + (long long)dst[m] * kv_dim,
                        b = (long long)l * layer_stride + (long long)src[m] * kv_dim;
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
            k[a + i] = k[b + i];
            v[a + i] = v[b + i];
        }
        __syncthreads();
    }
}
void cu_kv_move(cudaStream_t st, __half *k, __half *v, long long layer_stride, int n_layer, int kv_dim,
                const int32_t *dst, const int32_t *src, int n, const unsigned char *skip) {
    if (n > 0) k_kv_move<<<n_layer, 256, 0, st>>>(k, v, layer_stride, kv_dim, dst, src, n, skip);
}
