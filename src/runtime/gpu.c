// gpu.c - the CUDA path's host side (built in every build): the process
// switch (sd_gpu_enable), a model's device twin made on its first GPU
// session, a session's device KV cache, and the translation of a forward
// pass (forward.h) and of a commit into the device calls of gpu.h. Without
// CUDA (gpu_none.c) every device call fails with the way to get it.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime/forward.h"
#include "runtime/gpu.h"
#include "runtime/gpu_session.h"

static int g_default;  // sd_gpu_enable: sessions use the device unless their params say otherwise
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

SD_API int sd_gpu_available(char *info, size_t infolen) { return sd_cu_available(info, infolen); }

SD_API int sd_gpu_enable(int on, char *err, size_t errlen) {
    if (on) {
        char info[256];
        if (sd_cu_available(info, sizeof info) < 0) return sd_err(err, errlen, "--gpu: %s", info);
    }
    g_default = on != 0;
    return 0;
}

static sd_cu_tensor desc_of(const sd_model *m, const sd_tensor *t) {
    sd_cu_tensor d = {.type = -1};
    if (!t) return d;
    t = sd_model_file_tensor(m, t); // the file's layout, which elem.h reads
    d.type = t->type;
    d.n_in = t->ne[0];
    d.n_out = t->n_dims > 1 ? t->ne[1] : 1;
    d.data = t->data;
    return d;
}

static void free_twin(void *g) { sd_cu_model_free(g); }

// The model's device twin, made by the first GPU session (under the lock).
static int twin_get(sd_session *s, sd_cu_model **out, char *err, size_t errlen) {
    sd_model *m = (sd_model *)s->m; // the twin is the one lazily made part of a model (guarded by g_lock)
    pthread_mutex_lock(&g_lock);
    int rc = 0;
    if (!m->gpu) {
        const sd_hparams *hp = &m->hp;
        sd_cu_layer_desc *ld = calloc((size_t)hp->n_layer, sizeof *ld);
        if (!ld) {
            pthread_mutex_unlock(&g_lock);
            return sd_errc(SD_ERR_OOM, err, errlen, "out of memory");
        }
        for (int l = 0; l < hp->n_layer; l++) {
            const sd_layer *L = &m->layers[l];
            ld[l] = (sd_cu_layer_desc){desc_of(m, L->attn_norm), desc_of(m, L->wq), desc_of(m, L->wk),
                                       desc_of(m, L->wv), desc_of(m, L->wo), desc_of(m, L->bq), desc_of(m, L->bk),
                                       desc_of(m, L->bv), desc_of(m, L->ffn_norm), desc_of(m, L->w_gate),
                                       desc_of(m, L->w_up), desc_of(m, L->w_down)};
        }
        sd_cu_model_desc d = {.n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .n_layer = hp->n_layer,
                              .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = hp->n_ff, .n_rot = hp->n_rot, .rope_neox = hp->rope_type == SD_ROPE_NEOX,
                              .rms_eps = hp->rms_eps, .out_norm = desc_of(m, m->out_norm),
                              .output = desc_of(m, m->output), .layers = ld,
                              .max_rows = s->n_batch > SD_GPU_MIN_ROWS ? s->n_batch : SD_GPU_MIN_ROWS};
        sd_cu_model *g = NULL;
        rc = sd_cu_model_new(&d, &g, err, errlen);
        free(ld);
        if (rc == 0) {
            m->gpu = g;
            m->gpu_free = free_twin;
        }
    }
    pthread_mutex_unlock(&g_lock);
    *out = m->gpu;
    return rc;
}

int sd_gpu_session_init(sd_session *s, int want, char *err, size_t errlen) {
    s->gkv = NULL;
    if (want < 0 || (want == 0 && !g_default)) return 0;
    const sd_model *m = s->m;
    if (m->layer_lo != 0 || m->layer_hi != m->hp.n_layer || !m->has_output)
        return sd_err(err, errlen, "--gpu: a part of a model (layers [%d, %d) of a pipeline) cannot run on the GPU yet",
                      m->layer_lo, m->layer_hi);
    sd_cu_model *g = NULL;
    if (twin_get(s, &g, err, errlen) < 0) return -1;
    if (sd_cu_kv_new(g, s->n_ctx, &s->gkv, err, errlen) < 0) return -1;
    // The logits land here straight from the device. Its first rows (a tree's
    // worth) are pinned: full speed without pinning n_batch rows per session
    // (311 MB for Qwen's vocabulary at 512); rows beyond, and everything if
    // the driver refuses, come through pageable memory, as correctly.
    const int pin_rows = s->n_batch < SD_GPU_PIN_ROWS ? s->n_batch : SD_GPU_PIN_ROWS;
    sd_cu_kv_pin_logits(s->gkv, s->logits, (size_t)pin_rows * (size_t)m->hp.n_vocab * sizeof(float));
    return 0;
}

void sd_gpu_session_free(sd_session *s) {
    sd_cu_kv_free(s->gkv);
    s->gkv = NULL;
}

int sd_gpu_fwd_run(const sd_fwd_pass *p, char *err, size_t errlen) {
    sd_cu_seg seg[p->n_seg > 0 ? p->n_seg : 1];
    uint64_t *masks = NULL;
    size_t n_mask = 0;
    for (int j = 0; j < p->n_seg; j++) n_mask += (size_t)p->seg[j].n;
    masks = calloc(n_mask ? n_mask : 1, sizeof *masks);
    if (!masks) return sd_errc(SD_ERR_OOM, err, errlen, "out of memory");
    uint64_t *mk = masks;
    for (int j = 0; j < p->n_seg; j++) {
        const sd_fwd_seg *sg = &p->seg[j];
        sd_session *s = sg->s;
        if (!s->gkv) {
            free(masks);
            return sd_err(err, errlen, "a pass mixes GPU and CPU sessions");
        }
        int chain = 1;
        for (int i = 0; i < sg->n && chain; i++) chain = s->parent[i] == i - 1;
        if (!chain && sg->n <= 64)
            for (int i = 0; i < sg->n; i++) {
                uint64_t b = 0;
                for (int k = 0; k < s->n_anc[i]; k++) b |= (uint64_t)1 << s->anc[(size_t)i * s->n_batch + k];
                mk[i] = b;
            }
        seg[j] = (sd_cu_seg){.kv = s->gkv, .t0 = sg->t0, .n = sg->n, .n_past = s->n_past, .chain = chain,
                             .anc = mk, .n_hid = s->n_hid, .hid_layers = s->hid_layers, .hid_row = s->hid_row,
                             .hid_out = s->hid_out, .o0 = sg->o0, .n_out = sg->n_out, .logits = s->logits};
        mk += sg->n;
    }
    const sd_cu_pass cp = {.n = p->n, .n_seg = p->n_seg, .seg = seg, .x = p->x, .rope_cs = p->rope_cs,
                           .layer_skip = p->layer_skip, .out_rows = p->out_rows, .n_out = p->n_out};
    const int rc = sd_cu_forward((sd_cu_model *)p->m->gpu, &cp, err, errlen);
    free(masks);
    if (rc < 0) return rc;
    for (int j = 0; j < p->n_seg; j++) {
        sd_session *s = p->seg[j].s;
        s->n_hid = 0;
        s->hid_out = NULL;
        s->n_pending = p->seg[j].n;
    }
    return 0;
}

int sd_gpu_commit(sd_session *s, const int32_t *rows, int first, int n_rows, char *err, size_t errlen) {
    const int n = n_rows - first;
    if (n <= 0) return 0;
    int32_t *idx = malloc(sizeof(int32_t) * 2 * (size_t)n);
    if (!idx) return sd_errc(SD_ERR_OOM, err, errlen, "out of memory");
    for (int k = first; k < n_rows; k++) {
        idx[k - first] = s->n_past + k;
        idx[n + k - first] = s->n_past + rows[k];
    }
    const int rc = sd_cu_kv_move(s->gkv, idx, idx + n, n, s->layer_skip, err, errlen);
    free(idx);
    return rc;
}
