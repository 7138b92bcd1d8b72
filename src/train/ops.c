// ops.c - the element-wise layers of training (ops.h): RMSNorm, RoPE,
// SwiGLU / SiLU, residual adds, and the soft cross-entropy of the output.
// Written with vmath.h's vf (AVX2 lanes, or one float in a build without
// AVX2: the scalar fallback); a vector's tail runs the same formula one
// float at a time. Each element's result depends only on its own inputs and
// its position, so the bits never depend on the threads.
#include <math.h>
#include <string.h>

#include "common.h"
#include "kernels/vmath.h"
#include "train/ops.h"

// ---------------------------------------------------------------- helpers

// sum x[i] * y[i], in SD_VW lanes then the lanes' fixed reduction, then the tail.
static inline float dot_f(const float *x, const float *y, int n) {
    int i = 0;
    float s = 0.0f;
#if SD_VW > 1
    vf acc = vf_zero();
    for (; i + SD_VW <= n; i += SD_VW) acc = vf_fma(vf_load(x + i), vf_load(y + i), acc);
    s = vf_hsum(acc);
#endif
    for (; i < n; i++) s = SD_FMAF(x[i], y[i], s);
    return s;
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

#if SD_VW > 1
static inline vf vf_sigmoid(vf x) {
    return vf_div(vf_set1(1.0f), vf_add(vf_set1(1.0f), vf_exp(vf_sub(vf_zero(), x))));
}
#endif

// ---------------------------------------------------------------- RMSNorm

void sd_tr_rmsnorm(int n, int d, const float *X, const float *g, float eps, float *Y, float *rstd) {
    for (int r = 0; r < n; r++) {
        const float *x = X + (size_t)r * d;
        float *y = Y + (size_t)r * d;
        const float rs = 1.0f / sqrtf(dot_f(x, x, d) / (float)d + eps);
        rstd[r] = rs;
        int i = 0;
#if SD_VW > 1
        const vf vr = vf_set1(rs);
        for (; i + SD_VW <= d; i += SD_VW) {
            vf v = vf_mul(vf_load(x + i), vr);
            vf_store(y + i, g ? vf_mul(v, vf_load(g + i)) : v);
        }
#endif
        for (; i < d; i++) y[i] = x[i] * rs * (g ? g[i] : 1.0f);
    }
}

// y = x r g with r = (mean(x^2) + eps)^-1/2:
//   dx = r (dy g) - x r^3 mean(dy g x),   dg = sum over rows of dy x r.
void sd_tr_rmsnorm_bwd(int n, int d, const float *X, const float *g, const float *rstd, const float *dY, float *dX,
                       float *dg) {
    for (int r = 0; r < n; r++) {
        const float *x = X + (size_t)r * d, *dy = dY + (size_t)r * d;
        float *dx = dX + (size_t)r * d;
        const float rs = rstd[r];
        float s = 0.0f;   // sum dy g x
        int i = 0;
#if SD_VW > 1
        vf acc = vf_zero();
        for (; i + SD_VW <= d; i += SD_VW) {
            vf dyg = g ? vf_mul(vf_load(dy + i), vf_load(g + i)) : vf_load(dy + i);
            acc = vf_fma(dyg, vf_load(x + i), acc);
        }
        s = vf_hsum(acc);
#endif
        for (; i < d; i++) s = SD_FMAF(dy[i] * (g ? g[i] : 1.0f), x[i], s);
        const float c = s * rs * rs * rs / (float)d;
        i = 0;
#if SD_VW > 1
        const vf vr = vf_set1(rs), vc = vf_set1(-c);
        for (; i + SD_VW <= d; i += SD_VW) {
            vf dyg = g ? vf_mul(vf_load(dy + i), vf_load(g + i)) : vf_load(dy + i);
            vf v = vf_fma(vf_load(x + i), vc, vf_mul(dyg, vr));
            vf_store(dx + i, vf_add(vf_load(dx + i), v));
            if (dg) vf_store(dg + i, vf_fma(vf_load(dy + i), vf_mul(vf_load(x + i), vr), vf_load(dg + i)));
        }
#endif
        for (; i < d; i++) {
            const float dyg = dy[i] * (g ? g[i] : 1.0f);
            dx[i] += SD_FMAF(x[i], -c, dyg * rs);
            if (dg) dg[i] = SD_FMAF(dy[i], x[i] * rs, dg[i]);
        }
    }
}

// ---------------------------------------------------------------- RoPE

void sd_tr_rope_table(float *cs, int n_pos, int hd, float base) { sd_tr_rope_table_at(cs, 0, n_pos, hd, base); }

void sd_tr_rope_table_at(float *cs, int p0, int n_pos, int hd, float base) {
    const int half = hd / 2;
    for (int p = 0; p < n_pos; p++)
        for (int i = 0; i < half; i++) {
            const double th = (double)(p0 + p) * pow((double)base, -2.0 * i / hd);
            cs[((size_t)p * half + i) * 2] = (float)cos(th);
            cs[((size_t)p * half + i) * 2 + 1] = (float)sin(th);
        }
}

// The pair (a, b) turns to (a c - b s, a s + b c); inverse uses -s. The
// pair i is (2i, 2i+1), or with neox (i, i + hd/2) as Qwen2's layers rotate.
// One pair at a time: RoPE is a small part of a step.
void sd_tr_rope(int n, int n_h, int hd, const int32_t *pos, const float *cs, float *X, int inverse, int neox) {
    const int half = hd / 2, ia = neox ? 1 : 2, ib = neox ? half : 1;   // pair i: (ia i, ia i + ib)
    const float sg = inverse ? -1.0f : 1.0f;
    for (int r = 0; r < n; r++) {
        const float *c = cs + (size_t)pos[r] * half * 2;
        for (int h = 0; h < n_h; h++) {
            float *v = X + ((size_t)r * n_h + h) * hd;
            for (int i = 0; i < half; i++) {
                float *pa = v + ia * i, *pb = pa + ib;
                const float co = c[2 * i], si = sg * c[2 * i + 1], a = *pa, b = *pb;
                *pa = a * co - b * si;
                *pb = a * si + b * co;
            }
        }
    }
}

// ---------------------------------------------------------------- SwiGLU, SiLU

void sd_tr_swiglu(size_t n, const float *G, const float *U, float *S) {
    size_t i = 0;
#if SD_VW > 1
    for (; i + SD_VW <= n; i += SD_VW) {
        vf g = vf_load(G + i);
        vf_store(S + i, vf_mul(vf_mul(g, vf_sigmoid(g)), vf_load(U + i)));
    }
#endif
    for (; i < n; i++) S[i] = G[i] * sigmoid_f(G[i]) * U[i];
}

// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
void sd_tr_swiglu_bwd(size_t n, const float *G, const float *U, const float *dS, float *dG, float *dU) {
    size_t i = 0;
#if SD_VW > 1
    const vf one = vf_set1(1.0f);
    for (; i + SD_VW <= n; i += SD_VW) {
        vf g = vf_load(G + i), s = vf_sigmoid(g), ds = vf_load(dS + i);
        vf dsilu = vf_mul(s, vf_fma(g, vf_sub(one, s), one));
        vf_store(dG + i, vf_mul(vf_mul(ds, vf_load(U + i)), dsilu));
        vf_store(dU + i, vf_mul(ds, vf_mul(g, s)));
    }
#endif
    for (; i < n; i++) {
        const float g = G[i], s = sigmoid_f(g);
        dG[i] = dS[i] * U[i] * (s * SD_FMAF(g, 1.0f - s, 1.0f));
        dU[i] = dS[i] * (g * s);
    }
}

void sd_tr_silu(size_t n, const float *X, float *Y) {
    size_t i = 0;
#if SD_VW > 1
    for (; i + SD_VW <= n; i += SD_VW) {
        vf x = vf_load(X + i);
        vf_store(Y + i, vf_mul(x, vf_sigmoid(x)));
    }
#endif
    for (; i < n; i++) Y[i] = X[i] * sigmoid_f(X[i]);
}

void sd_tr_silu_bwd(size_t n, const float *X, const float *dY, float *dX) {
    size_t i = 0;
#if SD_VW > 1
    const vf one = vf_set1(1.0f);
    for (; i + SD_VW <= n; i += SD_VW) {
        vf x = vf_load(X + i), s = vf_sigmoid(x);
        vf dsilu = vf_mul(s, vf_fma(x, vf_sub(one, s), one));
        vf_store(dX + i, vf_fma(vf_load(dY + i), dsilu, vf_load(dX + i)));
    }
#endif
    for (; i < n; i++) {
        const float s = sigmoid_f(X[i]);
        dX[i] = SD_FMAF(dY[i], s * SD_FMAF(X[i], 1.0f - s, 1.0f), dX[i]);
    }
}

// ---------------------------------------------------------------- residual adds

void sd_tr_add(size_t n, const float *A, const float *B, float *Y) {
    for (size_t i = 0; i < n; i++) Y[i] = A[i] + B[i];
}

void sd_tr_acc(size_t n, const float *X, float *Y) {
    for (size_t i = 0; i < n; i++) Y[i] += X[i];
}

// ---------------------------------------------------------------- soft cross-entropy

typedef struct xent_job {
    int n, V, nt;
    const float *L;
    const int32_t *tid;
    const float *tp;
    float w;
    float *dL, *loss_row;
    int32_t *argmax;
} xent_job;

static void xent_row(const xent_job *j, int r) {
    const int V = j->V;
    const float *l = j->L + (size_t)r * V;
    const int32_t *ti = j->tid + (size_t)r * j->nt;
    const float *tp = j->tp + (size_t)r * j->nt;
    // The largest logit, and the first class that has it.
    float m = -INFINITY;
    int c = 0;
#if SD_VW > 1
    vf vm = vf_set1(-INFINITY);
    for (; c + SD_VW <= V; c += SD_VW) vm = vf_max(vm, vf_load(l + c));
    m = vf_hmax(vm);
#endif
    for (; c < V; c++) m = l[c] > m ? l[c] : m;
    int am = 0;
    while (am < V - 1 && !(l[am] == m)) am++;
    if (j->argmax) j->argmax[r] = am;
    // logsumexp.
    float s = 0.0f;
    c = 0;
#if SD_VW > 1
    vf vs = vf_zero();
    const vf vmx = vf_set1(m);
    for (; c + SD_VW <= V; c += SD_VW) vs = vf_add(vs, vf_exp(vf_sub(vf_load(l + c), vmx)));
    s = vf_hsum(vs);
#endif
    for (; c < V; c++) s += expf(l[c] - m);
    const float lse = m + logf(s);
    // The target, renormalised over its used entries.
    double mass = 0, dot = 0;
    for (int i = 0; i < j->nt; i++)
        if (ti[i] >= 0 && tp[i] > 0) {
            mass += tp[i];
            dot += (double)tp[i] * l[ti[i]];
        }
    float *dl = j->dL ? j->dL + (size_t)r * V : NULL;
    if (!(mass > 0)) {
        j->loss_row[r] = -1.0f;
        if (dl) memset(dl, 0, sizeof(float) * (size_t)V);
        return;
    }
    j->loss_row[r] = (float)(lse - dot / mass);
    if (!dl) return;
    const float sc = j->w / s;
    c = 0;
#if SD_VW > 1
    const vf vsc = vf_set1(sc);
    for (; c + SD_VW <= V; c += SD_VW) vf_store(dl + c, vf_mul(vf_exp(vf_sub(vf_load(l + c), vmx)), vsc));
#endif
    for (; c < V; c++) dl[c] = expf(l[c] - m) * sc;
    for (int i = 0; i < j->nt; i++)
        if (ti[i] >= 0 && tp[i] > 0) dl[ti[i]] -= (float)(j->w * (tp[i] / mass));
}

static void xent_task(void *arg, int ith, int nth) {
    const xent_job *j = arg;
    long lo, hi;
    sd_split_range(j->n, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) xent_row(j, (int)r);
}

double sd_tr_softxent(const sd_tr_ctx *ctx, int n, int V, const float *L, const int32_t *tid, const float *tp,
                      int nt, float w, float *dL, float *loss_row, int32_t *argmax, int *n_scored) {
    xent_job j = {.n = n, .V = V, .nt = nt, .L = L, .tid = tid, .tp = tp, .w = w, .dL = dL, .loss_row = loss_row,
                  .argmax = argmax};
    if (ctx->nth == 1 || (long)n * V < 32768)
        xent_task(&j, 0, 1);
    else
        sd_pool_run(ctx->pool, xent_task, &j);
    double sum = 0;
    int ns = 0;
    for (int r = 0; r < n; r++)
        if (loss_row[r] != -1.0f) {   // (a NaN loss is summed: divergence shows)
            sum += loss_row[r];
            ns++;
        }
    if (n_scored) *n_scored = ns;
    return sum;
}
