// cu_forward.cu - one forward pass on the device: the pass's inputs uploaded
// through pinned staging, the layer stack (run directly, or as a CUDA graph
// captured once per row bucket and hidden-row plan), then the final norm and
// the output matrix on the logit rows only, and the rows that come back.
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "runtime/cuda/cu_internal.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// Where the hidden rows a pass asks for are copied: slot u gets x after
// layer at[u] has run (-1: the input rows), layer[u] is the layer asked for
// (-1: the final norm, copied after the stack).
typedef struct {
    int n;
    int at[CU_MAX_HID], layer[CU_MAX_HID];
} hid_plan;

static int plan_hidden(const sd_cu_model *g, const sd_cu_pass *p, hid_plan *hp, char *err, size_t errlen) {
    hp->n = 0;
    for (int j = 0; j < p->n_seg; j++) {
        const sd_cu_seg *s = &p->seg[j];
        for (int k = 0; k < s->n_hid; k++) {
            const int L = s->hid_layers[k];
            int u = 0;
            while (u < hp->n && hp->layer[u] != L) u++;
            if (u < hp->n) continue;
            if (hp->n == CU_MAX_HID) {
                snprintf(err, errlen, "CUDA: more than %d distinct hidden layers in one pass", CU_MAX_HID);
                return -1;
            }
            int at = -1;
            if (L >= 0)
                for (int l = 0; l <= L && l < g->n_layer; l++)
                    if (!p->layer_skip || !p->layer_skip[l]) at = l;
            hp->layer[hp->n] = L;
            hp->at[hp->n] = L >= 0 ? at : -2;
            hp->n++;
        }
    }
    return 0;
}

static void copy_hidden(sd_cu_model *g, const hid_plan *hp, int after, int nb) {
    for (int u = 0; u < hp->n; u++)
        if (hp->at[u] == after)
            cudaMemcpyAsync(g->hid + (size_t)u * g->cap * g->E, g->x, sizeof(float) * (size_t)nb * g->E,
                            cudaMemcpyDeviceToDevice, g->st);
}

// The layer stack over nb rows (x, rows, rope_cs on the device).
static int run_layers(sd_cu_model *g, int nb, const uint8_t *skip, const hid_plan *hp, char *err, size_t errlen) {
    const int E = g->E;
    copy_hidden(g, hp, -1, nb);
    for (int l = 0; l < g->n_layer; l++) {
        if (skip && skip[l]) continue;
        const cu_layer *L = &g->layers[l];
        cu_add_norm(g->st, g->x, NULL, L->attn_norm, E, g->eps, nb, NULL, g->xn, NULL);
        if (cu_gemm(g, L->wqkv, g->qkv_dim, E, g->xn, nb, g->qkv, 0.0f, err, errlen) < 0) return -1;
        cu_qkv_post(g->st, g->qkv, L->bqkv, g->rope_cs, g->rows, nb, l, g->n_head, g->n_head_kv, g->hd, g->n_rot,
                    g->neox, g->q);
        cu_attention(g->st, g->q, g->rows, nb, l, g->n_head, g->n_head_kv, g->hd, g->att);
        // the residual adds ride in the GEMMs' epilogue (beta 1 on x): two launches fewer a layer
        if (cu_gemm(g, L->wo, E, g->q_dim, g->att, nb, g->x, 1.0f, err, errlen) < 0) return -1;
        cu_add_norm(g->st, g->x, NULL, L->ffn_norm, E, g->eps, nb, NULL, g->xn, NULL);
        if (cu_gemm(g, L->wgu, 2 * g->F, E, g->xn, nb, g->gu, 0.0f, err, errlen) < 0) return -1;
        cu_swiglu(g->st, g->gu, nb, g->F, g->h);
        if (cu_gemm(g, L->wdown, E, g->F, g->h, nb, g->x, 1.0f, err, errlen) < 0) return -1;
        copy_hidden(g, hp, l, nb);
    }
    return 0;
}

static unsigned long long plan_key(const hid_plan *hp) {
    unsigned long long k = 1469598103934665603ull ^ (unsigned long long)hp->n;
    for (int u = 0; u < hp->n; u++) {
        k = (k ^ (unsigned long long)(hp->at[u] + 3)) * 1099511628211ull;
        k = (k ^ (unsigned long long)(hp->layer[u] + 3)) * 1099511628211ull;
    }
    return k | 1ull; // never 0 (0: no graph)
}

// The stack as a graph for bucket b (nb rows): captured when absent or made
// for another hidden plan, then launched. A failed capture turns graphs off.
static int run_graph(sd_cu_model *g, int b, int nb, const hid_plan *hp, char *err, size_t errlen) {
    const unsigned long long key = plan_key(hp);
    if (!g->graph[b] || g->graph_key[b] != key) {
        // The first pass of a bucket and plan runs directly: it loads every
        // kernel and lets cuBLAS settle (lazy module loading must not happen
        // inside a capture); the next one is captured.
        if (g->warm_key[b] != key) {
            g->warm_key[b] = key;
            return run_layers(g, nb, NULL, hp, err, errlen);
        }
        if (g->graph[b]) cudaGraphExecDestroy(g->graph[b]);
        g->graph[b] = NULL;
        g->graph_key[b] = 0;
        cudaGraph_t gr = NULL;
        CU_TRY(cudaStreamBeginCapture(g->st, cudaStreamCaptureModeRelaxed));
        int rc = run_layers(g, nb, NULL, hp, err, errlen);
        cudaError_t e = cudaStreamEndCapture(g->st, &gr);
        if (rc < 0 || e != cudaSuccess || !gr) {
            if (gr) cudaGraphDestroy(gr);
            cudaGetLastError();
            g->graphs_on = 0;
            fprintf(stderr, "specdec: CUDA graph capture failed (%s); running without graphs\n",
                    e != cudaSuccess ? cudaGetErrorString(e) : err);
            return run_layers(g, nb, NULL, hp, err, errlen);
        }
        e = cudaGraphInstantiate(&g->graph[b], gr, 0);
        cudaGraphDestroy(gr);
        if (e != cudaSuccess) {
            g->graph[b] = NULL;
            g->graphs_on = 0;
            fprintf(stderr, "specdec: CUDA graph instantiation failed (%s); running without graphs\n",
                    cudaGetErrorString(e));
            return run_layers(g, nb, NULL, hp, err, errlen);
        }
        g->graph_key[b] = key;
    }
    CU_TRY(cudaGraphLaunch(g->graph[b], g->st));
    return 0;
}

extern "C" int sd_cu_forward(sd_cu_model *g, const sd_cu_pass *p, char *err, size_t errlen) {
    const int n = p->n, E = g->E, half = g->n_rot / 2;
    if (n < 1 || n > g->cap) {
        snprintf(err, errlen, "CUDA: a pass of %d rows (the device scratch holds %d)", n, g->cap);
        return -1;
    }
    const double h0 = g->timing ? now_ms() : 0.0;
    hid_plan hp;
    if (plan_hidden(g, p, &hp, err, errlen) < 0) return -1;
    // Rows padded: batch invariance (g->invariant, the default) pads every
    // pass of up to 64 rows to 64, so that each GEMM has one shape whatever
    // the pass holds, cuBLAS one algorithm, and a row's results do not depend
    // on the rows beside it (greedy speculation then equals plain decoding
    // bit for bit); otherwise a power-of-two bucket when the stack runs as a
    // graph. Each padded size has its graph.
    int nb = n, b = -1;
    if (n <= 64 && (g->invariant || (g->graphs_on && !p->layer_skip))) {
        nb = g->invariant ? 64 : 1;
        while (nb < n) nb *= 2;
        for (b = 0; (1 << b) < nb; b++) {
        }
        if (!g->graphs_on || p->layer_skip) b = -1;
    }
    memcpy(g->h_x, p->x, sizeof(float) * (size_t)n * E);
    memset(g->h_x + (size_t)n * E, 0, sizeof(float) * (size_t)(nb - n) * E);
    if (half > 0) {
        memcpy(g->h_cs, p->rope_cs, sizeof(float) * (size_t)n * half * 2);
        memset(g->h_cs + (size_t)n * half * 2, 0, sizeof(float) * (size_t)(nb - n) * half * 2);
    }
    for (int j = 0; j < p->n_seg; j++) {
        const sd_cu_seg *s = &p->seg[j];
        if (!s->chain && s->n > 64) {
            snprintf(err, errlen, "CUDA: a tree of %d nodes (the device path takes trees of at most 64 nodes, "
                     "and chains of any length)", s->n);
            return -1;
        }
        if (s->n_past + s->n > s->kv->n_ctx) {
            snprintf(err, errlen, "CUDA: no room in the KV cache (%d + %d > %d)", s->n_past, s->n, s->kv->n_ctx);
            return -1;
        }
        for (int i = 0; i < s->n; i++) {
            cu_row *r = &g->h_rows[s->t0 + i];
            r->k = s->kv->k;
            r->v = s->kv->v;
            r->layer_stride = (long long)s->kv->n_ctx * g->kv_dim;
            r->n_past = s->n_past;
            r->j = i;
            r->chain = s->chain;
            r->valid = 1;
            r->mask = s->chain ? 0ull : s->anc[i];
        }
    }
    for (int t = n; t < nb; t++) {
        memset(&g->h_rows[t], 0, sizeof(cu_row));
        g->h_rows[t].j = -1; // no position visible; never read (valid = 0)
    }
    const double h1 = g->timing ? now_ms() : 0.0;
    if (g->timing) CU_TRY(cudaEventRecord(g->tev[0], g->st));
    CU_TRY(cudaMemcpyAsync(g->x, g->h_x, sizeof(float) * (size_t)nb * E, cudaMemcpyHostToDevice, g->st));
    if (half > 0)
        CU_TRY(cudaMemcpyAsync(g->rope_cs, g->h_cs, sizeof(float) * (size_t)nb * half * 2, cudaMemcpyHostToDevice, g->st));
    CU_TRY(cudaMemcpyAsync(g->rows, g->h_rows, sizeof(cu_row) * (size_t)nb, cudaMemcpyHostToDevice, g->st));
    if (g->timing) CU_TRY(cudaEventRecord(g->tev[1], g->st));
    if (b >= 0) {
        if (run_graph(g, b, nb, &hp, err, errlen) < 0) return -1;
    } else if (run_layers(g, nb, p->layer_skip, &hp, err, errlen) < 0) {
        return -1;
    }
    if (g->timing) CU_TRY(cudaEventRecord(g->tev[2], g->st));
    // the final norm: hidden rows asking for it (all rows, in float), then the logit rows
    for (int u = 0; u < hp.n; u++)
        if (hp.layer[u] == -1) {
            cu_add_norm(g->st, g->x, NULL, g->out_norm, E, g->eps, n, NULL, g->xn, g->hid + (size_t)u * g->cap * E);
            break;
        }
    if (p->n_out > 0) {
        // the logit rows, padded as the pass (with copies of row 0) when invariant
        const int no = g->invariant && p->n_out <= 64 ? 64 : p->n_out;
        memcpy(g->h_out, p->out_rows, sizeof(int32_t) * (size_t)p->n_out);
        for (int k = p->n_out; k < no; k++) g->h_out[k] = p->out_rows[0];
        CU_TRY(cudaMemcpyAsync(g->out_rows, g->h_out, sizeof(int32_t) * (size_t)no, cudaMemcpyHostToDevice, g->st));
        cu_add_norm(g->st, g->x, NULL, g->out_norm, E, g->eps, no, g->out_rows, g->xn, NULL);
        if (cu_gemm(g, g->output, g->n_vocab, E, g->xn, no, g->logits, 0.0f, err, errlen) < 0) return -1;
    }
    if (g->timing) CU_TRY(cudaEventRecord(g->tev[3], g->st));
    // each segment's logit rows straight into its session's buffer: the part
    // sd_cu_kv_pin_logits pinned, then the rest (pageable) in a copy of its own,
    // so that no copy spans both
    const size_t V = (size_t)g->n_vocab;
    for (int j = 0; j < p->n_seg; j++) {
        const sd_cu_seg *s = &p->seg[j];
        if (s->n_out <= 0 || !s->logits) continue;
        const size_t bytes = sizeof(float) * (size_t)s->n_out * V;
        const size_t pin = s->kv->pinned == (void *)s->logits ? (bytes < s->kv->pinned_bytes ? bytes : s->kv->pinned_bytes) : 0;
        const char *src = (const char *)(g->logits + (size_t)s->o0 * V);
        if (pin > 0) CU_TRY(cudaMemcpyAsync(s->logits, src, pin, cudaMemcpyDeviceToHost, g->st));
        if (bytes > pin)
            CU_TRY(cudaMemcpyAsync((char *)s->logits + pin, src + pin, bytes - pin, cudaMemcpyDeviceToHost, g->st));
    }
    for (int u = 0; u < hp.n; u++)
        CU_TRY(cudaMemcpyAsync(g->h_hid + (size_t)u * g->cap * E, g->hid + (size_t)u * g->cap * E,
                               sizeof(float) * (size_t)n * E, cudaMemcpyDeviceToHost, g->st));
    CU_TRY(cudaGetLastError());
    if (g->timing) CU_TRY(cudaEventRecord(g->tev[4], g->st));
    CU_TRY(cudaStreamSynchronize(g->st));
    if (g->timing) {
        cu_tstat *t = &g->tstat[n > 64 ? 65 : n];
        float ms[4];
        for (int i = 0; i < 4; i++) cudaEventElapsedTime(&ms[i], g->tev[i], g->tev[i + 1]);
        t->n++;
        t->host += h1 - h0;
        t->up += ms[0];
        t->layers += ms[1];
        t->logits += ms[2];
        t->down += ms[3];
        t->wall += now_ms() - h0;
    }
    // scatter: each segment's hidden rows
    for (int j = 0; j < p->n_seg; j++) {
        const sd_cu_seg *s = &p->seg[j];
        for (int k = 0; k < s->n_hid; k++) {
            int u = 0;
            while (u < hp.n && hp.layer[u] != s->hid_layers[k]) u++;
            for (int i = 0; i < s->n; i++)
                if (s->hid_row[i] >= 0)
                    memcpy(s->hid_out + ((size_t)s->hid_row[i] * s->n_hid + k) * E,
                           g->h_hid + (size_t)u * g->cap * E + (size_t)(s->t0 + i) * E, sizeof(float) * E);
        }
    }
    return 0;
}
