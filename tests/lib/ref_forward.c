// ref_forward.c - scalar reference forward (see ref_forward.h).
#include "ref_forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct ref_state {
    const sd_model *m;
    int n_ctx, n_past, kv_dim, q_dim;
    int act_quant;           // see ref_set_act_quant
    int flip[REF_TIE_FLIPS_MAX]; // see ref_set_tie_flips
    int n_flip;
    int n_ties;              // near-tie sites met by the evaluation under way / the last one
    const float *last_x;     // input of the last matvec with act_quant (its quantization, xq, is reused for
    float *xsave;            // the same input again: one set of sites, as the engine quantizes it once)
    int64_t last_n;
    int last_at;
    void *qbuf;              // (row of the widest input in the activation format)
    float *xq;               // (widest input) activation after the quantization round trip
    float *k, *v;            // (n_layer, n_ctx, kv_dim)
    float *x, *xn, *q, *att, *tmp, *g, *u, *row, *sc; // scratch
};

ref_state *ref_new(const sd_model *m, int n_ctx) {
    const sd_hparams *hp = &m->hp;
    ref_state *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->m = m;
    r->n_ctx = n_ctx;
    r->kv_dim = hp->n_head_kv * hp->head_dim;
    r->q_dim = hp->n_head * hp->head_dim;
    size_t kv = (size_t)hp->n_layer * n_ctx * r->kv_dim;
    int wmax = hp->n_embd;
    if (r->q_dim > wmax) wmax = r->q_dim;
    if (hp->n_ff > wmax) wmax = hp->n_ff;
    r->k = calloc(kv, sizeof(float));
    r->v = calloc(kv, sizeof(float));
    r->x = calloc((size_t)wmax, sizeof(float));
    r->xn = calloc((size_t)wmax, sizeof(float));
    r->q = calloc((size_t)r->q_dim, sizeof(float));
    r->att = calloc((size_t)r->q_dim, sizeof(float));
    r->tmp = calloc((size_t)wmax, sizeof(float));
    r->g = calloc((size_t)hp->n_ff, sizeof(float));
    r->u = calloc((size_t)hp->n_ff, sizeof(float));
    r->row = calloc((size_t)wmax, sizeof(float));
    r->sc = calloc((size_t)n_ctx, sizeof(float));
    r->xq = calloc((size_t)wmax, sizeof(float));
    r->qbuf = calloc((size_t)wmax * 2 + 1024, 1); // every activation format takes < 2 bytes / element
    r->xsave = calloc((size_t)wmax, sizeof(float));
    if (!r->xsave || !r->xq || !r->qbuf || !r->k || !r->v || !r->x || !r->xn || !r->q || !r->att || !r->tmp || !r->g || !r->u || !r->row || !r->sc) {
        ref_free(r);
        return NULL;
    }
    return r;
}

void ref_free(ref_state *r) {
    if (!r) return;
    free(r->k); free(r->v); free(r->x); free(r->xn); free(r->q); free(r->att);
    free(r->tmp); free(r->g); free(r->u); free(r->row); free(r->sc); free(r->xq); free(r->qbuf); free(r->xsave);
    free(r);
}

void ref_set_act_quant(ref_state *r, int act_quant) { r->act_quant = act_quant; }

int ref_n_past(const ref_state *r) { return r->n_past; }

void ref_truncate(ref_state *r, int n) {
    if (n >= 0 && n <= r->n_past) r->n_past = n;
}

void ref_set_tie_flips(ref_state *r, const int *sites, int n) {
    r->n_flip = n < 0 ? 0 : n > REF_TIE_FLIPS_MAX ? REF_TIE_FLIPS_MAX : n;
    if (r->n_flip) memcpy(r->flip, sites, (size_t)r->n_flip * sizeof(int));
}
int ref_last_ties(const ref_state *r) { return r->n_ties; }

// A near-tie site met: 1 if it rounds the other way (its index is listed).
static int tie_site(ref_state *r) {
    const int i = r->n_ties++;
    for (int k = 0; k < r->n_flip; k++)
        if (r->flip[k] == i) return 1;
    return 0;
}

// The near-tie sites of x's 8-bit quantization xq (blocks of blck with one
// scale, amax / 127: Q8_0, Q8_1, Q8_K): the element at a site that rounds the
// other way gets the other neighbouring step.
static void ties_q8(ref_state *r, const float *x, float *xq, int64_t n, int blck) {
    for (int64_t b0 = 0; b0 + blck <= n; b0 += blck) {
        float amax = 0, xmax = 0;
        for (int k = 0; k < blck; k++)
            if (fabsf(x[b0 + k]) > amax) amax = fabsf(x[b0 + k]), xmax = fabsf(xq[b0 + k]);
        if (!(amax > 0) || !(xmax > 0)) continue;
        const float d = xmax / 127; // (the amax element is +-127 steps)
        for (int k = 0; k < blck; k++) {
            const float v = x[b0 + k] * (127.f / amax), fl = floorf(v);
            if (!(fabsf(v - (fl + 0.5f)) <= REF_TIE_Q8_REL * fabsf(v) + REF_TIE_Q8_ABS) || !tie_site(r)) continue;
            const float q = nearbyintf(xq[b0 + k] / d), other = q == fl ? fl + 1 : fl;
            if (fabsf(other) <= 127) xq[b0 + k] = d * other;
        }
    }
}

// The fp16 neighbour of h one step up (up = 1) or down.
static uint16_t f16_step(uint16_t h, int up) {
    if ((h & 0x7FFF) == 0) return up ? 0x0001 : 0x8001;
    return (uint16_t)((h & 0x8000) ? (up ? h - 1 : h + 1) : (up ? h + 1 : h - 1));
}

// x rounded through fp16 as the KV cache does, or to its other fp16
// neighbour at a near-tie site that rounds the other way.
static float kv_round(ref_state *r, float x) {
    const uint16_t h = sd_fp32_to_fp16(x);
    const float xr = sd_fp16_to_fp32(h);
    if (xr == x || !isfinite(xr)) return xr;
    const uint16_t o = f16_step(h, x > xr);
    const float xo = sd_fp16_to_fp32(o);
    if (!isfinite(xo) || !(fabsf(x - 0.5f * (xr + xo)) <= REF_TIE_F16_REL * fabsf(x)) || !tie_site(r)) return xr;
    return xo;
}

// y[o] = sum_k W[o][k] * x[k] (+ b[o]) with W dequantized row by row.
static void matvec(ref_state *r, const sd_tensor *w, const sd_tensor *b, const float *x, float *y) {
    w = sd_model_file_tensor(r->m, w); // the file's layout (the model may hold a repacked copy)
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    const sd_type_traits *tr = sd_type_get(w->type);
    const sd_type_traits *at = sd_type_get(tr->vec_dot_type);
    if (r->act_quant && tr->vec_dot_type != SD_TYPE_F32 && at && at->from_float && at->to_float) {
        if (x != r->last_x || n_in != r->last_n || tr->vec_dot_type != r->last_at ||
            memcmp(x, r->xsave, (size_t)n_in * sizeof(float)) != 0) { // (else: the same input again)
            at->from_float(x, r->qbuf, n_in);
            at->to_float(r->qbuf, r->xq, n_in);
            ties_q8(r, x, r->xq, n_in, at->blck);
            memcpy(r->xsave, x, (size_t)n_in * sizeof(float));
            r->last_x = x, r->last_n = n_in, r->last_at = tr->vec_dot_type;
        }
        x = r->xq;
    }
    const size_t rs = sd_row_size(w->type, n_in);
    for (int64_t o = 0; o < n_out; o++) {
        tr->to_float((const uint8_t *)w->data + (size_t)o * rs, r->row, n_in);
        double s = 0;
        for (int64_t k = 0; k < n_in; k++) s += (double)r->row[k] * x[k];
        if (b) s += ((const float *)b->data)[o];
        y[o] = (float)s;
    }
}

static void rmsnorm(float *out, const float *x, const sd_tensor *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    const float *wv = w->data;
    for (int i = 0; i < n; i++) out[i] = (float)(x[i] * sc * wv[i]);
}

static void rope(float *v, int n_heads, const sd_hparams *hp, int pos) {
    const int half = hp->n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hp->head_dim;
        for (int k = 0; k < half; k++) {
            double th = (double)pos / hp->rope_scale * pow(hp->rope_base, -2.0 * k / hp->n_rot);
            double c = cos(th), s = sin(th);
            int i0 = hp->rope_type == SD_ROPE_NORM ? 2 * k : k;
            int i1 = hp->rope_type == SD_ROPE_NORM ? 2 * k + 1 : k + half;
            double a = x[i0], b = x[i1];
            x[i0] = (float)(a * c - b * s);
            x[i1] = (float)(a * s + b * c);
        }
    }
}

int ref_eval(ref_state *r, int32_t token, int pos, float *logits) { return ref_eval_hidden(r, token, pos, logits, NULL); }

int ref_eval_hidden(ref_state *r, int32_t token, int pos, float *logits, float *hidden) {
    const sd_model *m = r->m;
    const sd_hparams *hp = &m->hp;
    if (r->n_past >= r->n_ctx || token < 0 || token >= hp->n_vocab) return -1;
    if (pos < 0) pos = r->n_past;
    r->n_ties = 0;
    r->last_x = NULL;
    const int E = hp->n_embd, hd = hp->head_dim, kvd = r->kv_dim, t = r->n_past;
    const sd_type_traits *et = sd_type_get(m->tok_embd->type);
    et->to_float((const uint8_t *)m->tok_embd->data + (size_t)token * sd_row_size(m->tok_embd->type, E), r->x, E);
    for (int l = 0; l < hp->n_layer; l++) {
        const sd_layer *L = &m->layers[l];
        float *kl = r->k + (size_t)l * r->n_ctx * kvd, *vl = r->v + (size_t)l * r->n_ctx * kvd;
        rmsnorm(r->xn, r->x, L->attn_norm, E, hp->rms_eps);
        matvec(r, L->wq, L->bq, r->xn, r->q);
        matvec(r, L->wk, L->bk, r->xn, kl + (size_t)t * kvd);
        matvec(r, L->wv, L->bv, r->xn, vl + (size_t)t * kvd);
        rope(r->q, hp->n_head, hp, pos);
        rope(kl + (size_t)t * kvd, hp->n_head_kv, hp, pos);
        for (int i = 0; i < kvd; i++) { // the KV cache holds fp16
            kl[(size_t)t * kvd + i] = kv_round(r, kl[(size_t)t * kvd + i]);
            vl[(size_t)t * kvd + i] = kv_round(r, vl[(size_t)t * kvd + i]);
        }
        for (int h = 0; h < hp->n_head; h++) {
            const int g = h / (hp->n_head / hp->n_head_kv);
            const float *q = r->q + (size_t)h * hd;
            double mx = -1e300;
            for (int j = 0; j <= t; j++) {
                const float *k = kl + (size_t)j * kvd + (size_t)g * hd;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[d] * k[d];
                s /= sqrt((double)hd);
                r->sc[j] = (float)s;
                if (s > mx) mx = s;
            }
            double sum = 0;
            for (int j = 0; j <= t; j++) sum += exp(r->sc[j] - mx);
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int j = 0; j <= t; j++)
                    o += exp(r->sc[j] - mx) / sum * vl[(size_t)j * kvd + (size_t)g * hd + d];
                r->att[(size_t)h * hd + d] = (float)o;
            }
        }
        matvec(r, L->wo, NULL, r->att, r->tmp);
        for (int i = 0; i < E; i++) r->x[i] += r->tmp[i];
        rmsnorm(r->xn, r->x, L->ffn_norm, E, hp->rms_eps);
        matvec(r, L->w_gate, NULL, r->xn, r->g);
        matvec(r, L->w_up, NULL, r->xn, r->u);
        for (int i = 0; i < hp->n_ff; i++) {
            double gv = r->g[i];
            r->g[i] = (float)(gv / (1.0 + exp(-gv)) * r->u[i]);
        }
        matvec(r, L->w_down, NULL, r->g, r->tmp);
        for (int i = 0; i < E; i++) r->x[i] += r->tmp[i];
        if (hidden) memcpy(hidden + (size_t)l * E, r->x, (size_t)E * sizeof(float));
    }
    rmsnorm(r->xn, r->x, m->out_norm, E, hp->rms_eps);
    if (hidden) memcpy(hidden + (size_t)hp->n_layer * E, r->xn, (size_t)E * sizeof(float));
    matvec(r, m->output, NULL, r->xn, logits);
    r->n_past++;
    return 0;
}

static float max_diff(const float *a, const float *b, int n) {
    float m = 0;
    for (int i = 0; i < n; i++) {
        const float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; // (NaN counts as the largest)
    }
    return m;
}

// One evaluation of token with the sites fl[0..nf) rounded the other way,
// from n0 cached tokens; its max |logit - want|.
static float eval_flipped(ref_state *r, int n0, int32_t token, int pos, const int *fl, int nf, const float *want,
                          float *lg) {
    ref_truncate(r, n0);
    ref_set_tie_flips(r, fl, nf);
    ref_eval(r, token, pos, lg);
    return max_diff(lg, want, r->m->hp.n_vocab);
}

int ref_eval_nearest(ref_state *r, int32_t token, int pos, const float *want, float tol, float *logits,
                     int *flips) {
    const int V = r->m->hp.n_vocab, n0 = r->n_past;
    if (flips) *flips = 0;
    r->n_flip = 0;
    if (ref_eval(r, token, pos, logits) < 0) return -1;
    const int ties = r->n_ties;
    const float d0 = max_diff(logits, want, V);
    if (d0 <= tol || ties == 0) return ties;
    // every site alone, then pairs and triples of the REF_TIE_SEARCH best alone
    enum { NB = REF_TIE_SEARCH };
    int bi[NB], nb = 0, best[3] = {0, 0, 0}, nbest = 0;
    float bd[NB], best_d = d0;
    float *lg = malloc((size_t)V * sizeof(float));
    if (!lg) return ties;
    const int ns = ties < REF_TIE_SITES_MAX ? ties : REF_TIE_SITES_MAX;
    for (int i = 0; i < ns && best_d > tol; i++) {
        const float d = eval_flipped(r, n0, token, pos, &i, 1, want, lg);
        if (d < best_d) best_d = d, best[0] = i, nbest = 1;
        int k = nb < NB ? nb++ : NB - 1; // insert into the NB smallest
        if (k == NB - 1 && nb == NB && !(d < bd[k])) continue;
        for (; k > 0 && d < bd[k - 1]; k--) bd[k] = bd[k - 1], bi[k] = bi[k - 1];
        bd[k] = d, bi[k] = i;
    }
    for (int a = 0; a < nb && best_d > tol; a++)
        for (int b = a + 1; b < nb && best_d > tol; b++) {
            int fl[3] = {bi[a], bi[b], 0};
            float d = eval_flipped(r, n0, token, pos, fl, 2, want, lg);
            if (d < best_d) best_d = d, best[0] = fl[0], best[1] = fl[1], nbest = 2;
            for (int c = b + 1; c < nb && best_d > tol; c++) {
                fl[2] = bi[c];
                d = eval_flipped(r, n0, token, pos, fl, 3, want, lg);
                if (d < best_d) best_d = d, best[0] = fl[0], best[1] = fl[1], best[2] = fl[2], nbest = 3;
            }
        }
    // keep a combination that matches, else the plain rounding (a choice
    // that only comes closer may be wrong, and later tokens would carry it)
    if (!(best_d <= tol)) nbest = 0;
    eval_flipped(r, n0, token, pos, best, nbest, want, logits);
    if (nbest && getenv("REF_TIE_DEBUG") && !strcmp(getenv("REF_TIE_DEBUG"), "1"))
        printf("    [%d of %d near-tie sites rounded the other way: %d %d %d; max diff %.3g -> %.3g]\n", nbest, ties,
               best[0], best[1], best[2], d0, best_d);
    free(lg);
    r->n_flip = 0;
    r->n_ties = ties;
    if (flips) *flips = nbest;
    return ties;
}
