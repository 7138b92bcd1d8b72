// ref_forward.c - scalar reference forward (see ref_forward.h).
#include "ref_forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct ref_state {
    const sd_model *m;
    int n_ctx, n_past, kv_dim, q_dim;
    int act_quant;           // see ref_set_act_quant
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
    if (!r->xq || !r->qbuf || !r->k || !r->v || !r->x || !r->xn || !r->q || !r->att || !r->tmp || !r->g || !r->u || !r->row || !r->sc) {
        ref_free(r);
        return NULL;
    }
    return r;
}

void ref_free(ref_state *r) {
    if (!r) return;
    free(r->k); free(r->v); free(r->x); free(r->xn); free(r->q); free(r->att);
    free(r->tmp); free(r->g); free(r->u); free(r->row); free(r->sc); free(r->xq); free(r->qbuf);
    free(r);
}

void ref_set_act_quant(ref_state *r, int act_quant) { r->act_quant = act_quant; }

int ref_n_past(const ref_state *r) { return r->n_past; }

void ref_truncate(ref_state *r, int n) {
    if (n >= 0 && n <= r->n_past) r->n_past = n;
}

// y[o] = sum_k W[o][k] * x[k] (+ b[o]) with W dequantized row by row.
static void matvec(ref_state *r, const sd_tensor *w, const sd_tensor *b, const float *x, float *y) {
    w = sd_model_file_tensor(r->m, w); // the file's layout (the model may hold a repacked copy)
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    const sd_type_traits *tr = sd_type_get(w->type);
    const sd_type_traits *at = sd_type_get(tr->vec_dot_type);
    if (r->act_quant && tr->vec_dot_type != SD_TYPE_F32 && at && at->from_float && at->to_float) {
        at->from_float(x, r->qbuf, n_in);
        at->to_float(r->qbuf, r->xq, n_in);
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
            kl[(size_t)t * kvd + i] = sd_fp16_to_fp32(sd_fp32_to_fp16(kl[(size_t)t * kvd + i]));
            vl[(size_t)t * kvd + i] = sd_fp16_to_fp32(sd_fp32_to_fp16(vl[(size_t)t * kvd + i]));
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
