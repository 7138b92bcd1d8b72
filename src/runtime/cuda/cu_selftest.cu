// cu_selftest.cu - every kernel of the CUDA path on random inputs against
// host code: kernels/elem.h (the same per-element math, compiled for the
// host) and double-precision references. One PASS/FAIL line per op, as the
// tests print them; tests/gpu/test_gpu.c runs it (it needs a device).
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "runtime/cuda/cu_internal.h"

#include "kernels/elem.h"

static unsigned long long st_rng = 0x9E3779B97F4A7C15ull;
static float urand() {
    st_rng ^= st_rng << 13;
    st_rng ^= st_rng >> 7;
    st_rng ^= st_rng << 17;
    return (float)((st_rng >> 11) % 2000001) / 1000000.0f - 1.0f;
}

static int report(const char *name, int ok, double err, double tol) {
    printf("%s cuda_%s: max error %.3g (tolerance %.3g)\n", ok ? "PASS" : "FAIL", name, err, tol);
    return ok ? 0 : 1;
}

template <typename T>
static T *dev_copy(const std::vector<T> &h) {
    T *d = NULL;
    cudaMalloc((void **)&d, h.size() * sizeof(T));
    cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}
template <typename T>
static std::vector<T> host_copy(const T *d, size_t n) {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}

static int test_dequant(void) {
    const int types[] = {SD_ELEM_F32, SD_ELEM_F16, SD_ELEM_BF16, SD_ELEM_Q4_0, SD_ELEM_Q4_1, SD_ELEM_Q5_0,
                         SD_ELEM_Q5_1, SD_ELEM_Q8_0, SD_ELEM_Q4_K, SD_ELEM_Q5_K, SD_ELEM_Q6_K};
    int fails = 0;
    double worst = 0;
    for (int t : types) {
        const int nb = 64, bn = sd_elem_block_n(t), bb = sd_elem_block_bytes(t);
        std::vector<unsigned char> blk((size_t)nb * bb);
        for (auto &c : blk) c = (unsigned char)(st_rng = st_rng * 6364136223846793005ull + 1442695040888963407ull, st_rng >> 56);
        // finite scales: the fp16 fields set to small values
        for (int b = 0; b < nb; b++) {
            unsigned char *p = blk.data() + (size_t)b * bb;
            const unsigned short h = 0x2E66; // 0.1
            if (t == SD_ELEM_Q6_K) memcpy(p + 208, &h, 2);
            else if (t == SD_ELEM_F16 || t == SD_ELEM_BF16 || t == SD_ELEM_F32) {
                const float f = urand();
                if (t == SD_ELEM_F32) memcpy(p, &f, 4);
                else { unsigned short v = t == SD_ELEM_F16 ? 0x3C00 : sd_elem_f2bf(f); memcpy(p, &v, 2); }
            } else {
                memcpy(p, &h, 2);
                if (t == SD_ELEM_Q4_1 || t == SD_ELEM_Q5_1 || t == SD_ELEM_Q4_K || t == SD_ELEM_Q5_K) memcpy(p + 2, &h, 2);
            }
        }
        const long long n = (long long)nb * bn;
        unsigned char *d = dev_copy(blk);
        float *o = NULL;
        cudaMalloc((void **)&o, n * sizeof(float));
        cu_dequant_f32(0, t, d, n, o);
        std::vector<float> got = host_copy(o, (size_t)n);
        for (long long j = 0; j < n; j++) {
            const float want = sd_elem_row_get(t, blk.data(), j);
            const double e = fabs((double)got[j] - want) / (fabs(want) + 1e-30);
            if (e > worst) worst = e;
        }
        cudaFree(d);
        cudaFree(o);
    }
    fails += report("dequant_every_type", worst <= 1e-6, worst, 1e-6);
    return fails;
}

static int test_norm(void) {
    const int E = 1536, n = 5;
    std::vector<float> x((size_t)n * E), a((size_t)n * E), w(E);
    for (auto &v : x) v = urand() * 3;
    for (auto &v : a) v = urand();
    for (auto &v : w) v = urand();
    float *dx = dev_copy(x), *da = dev_copy(a), *dw = dev_copy(w), *xf = NULL;
    __nv_bfloat16 *xn = NULL;
    cudaMalloc((void **)&xf, x.size() * 4);
    cudaMalloc((void **)&xn, x.size() * 2);
    cu_add_norm(0, dx, da, dw, E, 1e-5f, n, NULL, xn, xf);
    std::vector<float> got = host_copy(xf, x.size()), gx = host_copy(dx, x.size());
    double worst = 0;
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < E; i++) ss += (double)(x[t * E + i] + a[t * E + i]) * (x[t * E + i] + a[t * E + i]);
        const double r = 1.0 / sqrt(ss / E + 1e-5);
        for (int i = 0; i < E; i++) {
            const double xv = (double)x[t * E + i] + a[t * E + i], want = xv * r * w[i];
            worst = fmax(worst, fabs(got[t * E + i] - want));
            worst = fmax(worst, fabs(gx[t * E + i] - xv));
        }
    }
    cudaFree(dx), cudaFree(da), cudaFree(dw), cudaFree(xf), cudaFree(xn);
    return report("add_rmsnorm", worst < 1e-5, worst, 1e-5);
}

// qkv_post and attention on one small layer: 3 committed rows plus a tree of 6 nodes.
static int test_qkv_attention(int neox) {
    const int nh = 4, nkv = 2, hd = 64, n_rot = 64, qd = nh * hd, kvd = nkv * hd, w = qd + 2 * kvd, n_ctx = 16;
    const int n_past = 3, n = 6;
    const int parent[6] = {-1, 0, 0, 1, -1, 4};
    std::vector<float> qkv((size_t)n * w), bias(w), cs((size_t)n * n_rot);
    for (auto &v : qkv) v = urand();
    for (auto &v : bias) v = urand() * 0.1f;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < n_rot / 2; i++) {
            const double th = (n_past + t) * pow(10000.0, -2.0 * i / n_rot);
            cs[(size_t)t * n_rot + 2 * i] = (float)cos(th);
            cs[(size_t)t * n_rot + 2 * i + 1] = (float)sin(th);
        }
    std::vector<__half> kc((size_t)n_ctx * kvd), vc((size_t)n_ctx * kvd);
    for (int p = 0; p < n_past * kvd; p++) {
        kc[p] = __float2half(urand());
        vc[p] = __float2half(urand());
    }
    uint64_t anc[6];
    sd_elem_tree_mask(parent, n, anc);
    __half *dk = dev_copy(kc), *dv = dev_copy(vc);
    std::vector<cu_row> rows(n);
    for (int t = 0; t < n; t++) rows[t] = cu_row{dk, dv, 0, n_past, t, 0, 1, (unsigned long long)anc[t]};
    float *dqkv = dev_copy(qkv), *db = dev_copy(bias), *dcs = dev_copy(cs), *dq = NULL;
    cu_row *dr = dev_copy(rows);
    __nv_bfloat16 *dout = NULL;
    cudaMalloc((void **)&dq, (size_t)n * qd * 4);
    cudaMalloc((void **)&dout, (size_t)n * qd * 2);
    cu_qkv_post(0, dqkv, db, dcs, dr, n, 0, nh, nkv, hd, n_rot, neox, dq);
    cu_attention(0, dq, dr, n, 0, nh, nkv, hd, dout);
    std::vector<float> gq = host_copy(dq, (size_t)n * qd);
    std::vector<__half> gk = host_copy(dk, kc.size()), gv = host_copy(dv, vc.size());
    std::vector<__nv_bfloat16> go = host_copy(dout, (size_t)n * qd);
    // host: bias, RoPE (elem.h), fp16 rounding
    std::vector<float> hq((size_t)n * qd), hk((size_t)n_ctx * kvd), hv((size_t)n_ctx * kvd);
    for (int p = 0; p < n_past * kvd; p++) {
        hk[p] = __half2float(kc[p]);
        hv[p] = __half2float(vc[p]);
    }
    double eq = 0, ekv = 0, eo = 0;
    for (int t = 0; t < n; t++) {
        std::vector<float> r(w);
        for (int i = 0; i < w; i++) r[i] = qkv[(size_t)t * w + i] + bias[i];
        for (int h = 0; h < nh + nkv; h++)
            for (int i = 0; i < n_rot / 2; i++) {
                int j0, j1 = sd_elem_rope_partner(neox, n_rot, i, &j0);
                sd_elem_rope_pair(&r[h * hd + j0], &r[h * hd + j1], cs[(size_t)t * n_rot + 2 * i],
                                  cs[(size_t)t * n_rot + 2 * i + 1], neox);
            }
        for (int i = 0; i < qd; i++) {
            hq[(size_t)t * qd + i] = r[i];
            eq = fmax(eq, fabs(gq[(size_t)t * qd + i] - r[i]));
        }
        for (int i = 0; i < kvd; i++) {
            const size_t s = (size_t)(n_past + t) * kvd + i;
            hk[s] = __half2float(__float2half(r[qd + i]));
            hv[s] = __half2float(__float2half(r[qd + kvd + i]));
            ekv = fmax(ekv, fabs(__half2float(gk[s]) - hk[s]) + fabs(__half2float(gv[s]) - hv[s]));
        }
    }
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            const int g = h / (nh / nkv);
            std::vector<double> sc;
            std::vector<int> pos;
            for (int p = 0; p < n_past + n; p++) {
                if (p >= n_past && !sd_elem_sees(anc, t, p - n_past)) continue;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)hq[(size_t)t * qd + h * hd + d] * hk[(size_t)p * kvd + g * hd + d];
                sc.push_back(s / sqrt((double)hd));
                pos.push_back(p);
            }
            double mx = -1e300, z = 0;
            for (double s : sc) mx = fmax(mx, s);
            for (double &s : sc) z += (s = exp(s - mx));
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (size_t k = 0; k < sc.size(); k++) o += sc[k] / z * hv[(size_t)pos[k] * kvd + g * hd + d];
                eo = fmax(eo, fabs(__bfloat162float(go[(size_t)t * qd + h * hd + d]) - o));
            }
        }
    cudaFree(dk), cudaFree(dv), cudaFree(dqkv), cudaFree(db), cudaFree(dcs), cudaFree(dq), cudaFree(dr), cudaFree(dout);
    int f = 0;
    f += report(neox ? "qkv_rope_neox" : "qkv_rope_norm", eq < 1e-5, eq, 1e-5);
    // one fp16 step at most (the device may fuse the rotation's multiply-adds)
    f += report(neox ? "kv_append_neox" : "kv_append_norm", ekv <= 2e-3, ekv, 2e-3);
    f += report(neox ? "tree_attention_neox" : "tree_attention_norm", eo < 8e-3, eo, 8e-3);
    return f;
}

static int test_swiglu_gemm_move(void) {
    int f = 0;
    const int n = 3, F = 300;
    std::vector<float> gu((size_t)n * 2 * F);
    for (auto &v : gu) v = urand() * 4;
    float *dgu = dev_copy(gu);
    __nv_bfloat16 *dh = NULL;
    cudaMalloc((void **)&dh, (size_t)n * F * 2);
    cu_swiglu(0, dgu, n, F, dh);
    std::vector<__nv_bfloat16> h = host_copy(dh, (size_t)n * F);
    double e = 0;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < F; c++) {
            const double g = gu[(size_t)t * 2 * F + c], u = gu[(size_t)t * 2 * F + F + c], want = g / (1 + exp(-g)) * u;
            e = fmax(e, fabs(__bfloat162float(h[(size_t)t * F + c]) - want) / (fabs(want) + 1e-3));
        }
    f += report("swiglu", e < 8e-3, e, 8e-3);
    cudaFree(dgu), cudaFree(dh);
    // GEMM through cu_gemm's cuBLAS call: Y (n, out) = X (n, in) W^T
    sd_cu_model g;
    memset(&g, 0, sizeof g);
    cublasCreate(&g.blas);
    const int out = 96, in = 256, rows = 7;
    std::vector<__nv_bfloat16> W((size_t)out * in), X((size_t)rows * in);
    for (auto &v : W) v = __float2bfloat16(urand());
    for (auto &v : X) v = __float2bfloat16(urand());
    __nv_bfloat16 *dW = dev_copy(W), *dX = dev_copy(X);
    float *dY = NULL;
    cudaMalloc((void **)&dY, (size_t)rows * out * 4);
    char err[256];
    const int rc = cu_gemm(&g, dW, out, in, dX, rows, dY, 0.0f, err, sizeof err);
    std::vector<float> Y = host_copy(dY, (size_t)rows * out);
    e = 0;
    for (int t = 0; t < rows; t++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int i = 0; i < in; i++) s += (double)__bfloat162float(W[(size_t)o * in + i]) * __bfloat162float(X[(size_t)t * in + i]);
            e = fmax(e, fabs(Y[(size_t)t * out + o] - s));
        }
    f += report("gemm_bf16", rc == 0 && e < 1e-3, e, 1e-3);
    cublasDestroy(g.blas);
    cudaFree(dW), cudaFree(dX), cudaFree(dY);
    // commit moves: slot src -> dst in order, two layers, the second skipped
    const int kvd = 8, nctx = 10;
    std::vector<__half> k((size_t)2 * nctx * kvd), v(k.size());
    for (size_t i = 0; i < k.size(); i++) {
        k[i] = __float2half((float)i);
        v[i] = __float2half(-(float)i);
    }
    __half *dk = dev_copy(k), *dv = dev_copy(v);
    std::vector<int32_t> idx = {4, 5, 6, 5, 7, 9}; // dst 4, 5, 6 <- src 5, 7, 9
    int32_t *di = dev_copy(idx);
    std::vector<unsigned char> skip = {0, 1};
    unsigned char *ds = dev_copy(skip);
    cu_kv_move(0, dk, dv, (long long)nctx * kvd, 2, kvd, di, di + 3, 3, ds);
    std::vector<__half> gk = host_copy(dk, k.size()), gv = host_copy(dv, v.size());
    int bad = 0;
    for (int l = 0; l < 2; l++)
        for (int s = 0; s < nctx; s++)
            for (int i = 0; i < kvd; i++) {
                int from = s;
                if (l == 0 && s >= 4 && s <= 6) from = idx[3 + s - 4];
                const float want = (float)((size_t)l * nctx * kvd + (size_t)from * kvd + i);
                bad += __half2float(gk[(size_t)l * nctx * kvd + (size_t)s * kvd + i]) != __half2float(__float2half(want));
                bad += __half2float(gv[(size_t)l * nctx * kvd + (size_t)s * kvd + i]) != __half2float(__float2half(-want));
            }
    f += report("kv_commit_moves", bad == 0, bad, 0);
    cudaFree(dk), cudaFree(dv), cudaFree(di), cudaFree(ds);
    return f;
}

extern "C" int sd_cu_selftest(int verbose) {
    (void)verbose;
    char info[256];
    if (sd_cu_available(info, sizeof info) < 0) {
        printf("SKIP cuda_selftest: %s\n", info);
        return 0;
    }
    int f = test_dequant() + test_norm() + test_qkv_attention(0) + test_qkv_attention(1) + test_swiglu_gemm_move();
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FAIL cuda_selftest: %s\n", cudaGetErrorString(e));
        f++;
    }
    return f;
}
