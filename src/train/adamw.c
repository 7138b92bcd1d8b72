// adamw.c - AdamW over a head's flat parameters (train.h): global-norm
// clipping, bias-corrected moments, decoupled weight decay on the matrices
// only (never on norm gains or biases), linear warm-up then cosine decay to
// a tenth of the peak rate.
//
// Per parameter, with g the clipped gradient and t the step (1-based):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w -= lr_t (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr_t wd w   (wd on matrices only)
// The AVX2 loop performs the same correctly rounded operations in the same
// order as the scalar one (no fused multiply-adds), so both give the same
// bits (tests/train/test_adamw.c compares them).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "train/train_impl.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

int sd_adamw_init(sd_adamw *o, size_t n_w, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    o->lr = 1e-3f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->weight_decay = 0.0f;
    o->clip = 1.0f;
    // Moments in one allocation (house rule 13): m, then v.
    o->m = aligned_alloc(64, (2 * n_w * sizeof(float) + 63) / 64 * 64 + 64);
    if (!o->m) return sd_err(err, errlen, "adamw: out of memory for %zu parameters", n_w);
    o->v = o->m + n_w;
    memset(o->m, 0, 2 * n_w * sizeof(float));
    return 0;
}

void sd_adamw_free(sd_adamw *o) {
    free(o->m);
    o->m = o->v = NULL;
}

float sd_adamw_lr(const sd_adamw *o, int64_t t) {
    if (o->warmup > 0 && t < o->warmup) return o->lr * (float)(t + 1) / (float)o->warmup;
    if (o->total <= o->warmup) return o->lr;
    double x = (double)(t - o->warmup) / (double)(o->total - o->warmup);
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    const double lo = 0.1 * o->lr;
    return (float)(lo + (o->lr - lo) * 0.5 * (1.0 + cos(M_PI * x)));
}

void sd_adamw_update_ref(float *w, float *m, float *v, const float *g, size_t n, const sd_adamw_coef *c) {
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i] * c->gscale;
        m[i] = c->b1 * m[i] + c->nb1 * gi;
        v[i] = c->b2 * v[i] + c->nb2 * (gi * gi);
        const float mh = m[i] * c->ibc1, vh = v[i] * c->ibc2;
        const float upd = mh / (sqrtf(vh) + c->eps) + c->wd * w[i];
        w[i] = w[i] - c->lr * upd;
    }
}

void sd_adamw_update(float *w, float *m, float *v, const float *g, size_t n, const sd_adamw_coef *c) {
    size_t i = 0;
#if defined(__AVX2__)
    const __m256 gs = _mm256_set1_ps(c->gscale), b1 = _mm256_set1_ps(c->b1), nb1 = _mm256_set1_ps(c->nb1);
    const __m256 b2 = _mm256_set1_ps(c->b2), nb2 = _mm256_set1_ps(c->nb2), ib1 = _mm256_set1_ps(c->ibc1);
    const __m256 ib2 = _mm256_set1_ps(c->ibc2), ep = _mm256_set1_ps(c->eps), wd = _mm256_set1_ps(c->wd);
    const __m256 lr = _mm256_set1_ps(c->lr);
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
        const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(nb1, gi));
        const __m256 vi =
            _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(nb2, _mm256_mul_ps(gi, gi)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        const __m256 mh = _mm256_mul_ps(mi, ib1), vh = _mm256_mul_ps(vi, ib2);
        const __m256 wi = _mm256_loadu_ps(w + i);
        const __m256 upd = _mm256_add_ps(_mm256_div_ps(mh, _mm256_add_ps(_mm256_sqrt_ps(vh), ep)), _mm256_mul_ps(wd, wi));
        _mm256_storeu_ps(w + i, _mm256_sub_ps(wi, _mm256_mul_ps(lr, upd)));
    }
#endif
    sd_adamw_update_ref(w + i, m + i, v + i, g + i, n - i, c);
}

double sd_adamw_step(sd_adamw *o, sd_head *h, const float *grad) {
    double ss = 0;
    for (int i = 0; i < h->n_t; i++) {
        const float *g = grad + h->t[i].off;
        const size_t n = (size_t)(h->t[i].ne0 * h->t[i].ne1);
        for (size_t j = 0; j < n; j++) ss += (double)g[j] * g[j];
    }
    const double norm = sqrt(ss);
    const int64_t t = o->t + 1;
    sd_adamw_coef c = {
        .gscale = o->clip > 0 && norm > o->clip ? (float)(o->clip / norm) : 1.0f,
        .b1 = o->beta1,
        .nb1 = 1.0f - o->beta1,
        .b2 = o->beta2,
        .nb2 = 1.0f - o->beta2,
        .ibc1 = (float)(1.0 / (1.0 - pow(o->beta1, (double)t))),
        .ibc2 = (float)(1.0 / (1.0 - pow(o->beta2, (double)t))),
        .eps = o->eps,
        .lr = sd_adamw_lr(o, o->t),
    };
    for (int i = 0; i < h->n_t; i++) {
        const sd_head_tensor *ti = &h->t[i];
        // Decay only matrices: norm gains are flagged, biases are vectors.
        c.wd = !ti->is_norm && ti->ne1 > 1 ? o->weight_decay : 0.0f;
        sd_adamw_update(h->w + ti->off, o->m + ti->off, o->v + ti->off, grad + ti->off, (size_t)(ti->ne0 * ti->ne1), &c);
    }
    o->t = t;
    return norm;
}
