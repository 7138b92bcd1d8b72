// head_client.c - a split client's file (docs/split.md): what `specdec
// client` needs of a target and its drafter (an EAGLE-3 head or an MoA
// drafter), in one GGUF: every key of the target (architecture, tokenizer,
// chat template), its token embeddings and output norm, for MoA its output
// matrix and its last TLI layers (specdec.client.layer_lo), and the drafter
// file itself as the bytes of the key specdec.client.head. The model loader
// reads it as a client model (it drafts, never runs a forward);
// sd_client_file_head gives the drafter.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/head.h"
#include "model/gguf.h"
#include "model/model.h"

#define CLIENT_HEAD_KEY "specdec.client.head"

static int read_all(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return sd_errc(SD_ERR_IO, err, errlen, "cannot open '%s'", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = n > 0 ? malloc((size_t)n) : NULL;
    if (!*buf || fread(*buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(*buf);
        *buf = NULL;
        return sd_errc(SD_ERR_IO, err, errlen, "cannot read '%s'", path);
    }
    fclose(f);
    *len = (size_t)n;
    return 0;
}

static int key_eq(sd_str k, const char *c) { return strlen(c) == k.len && !memcmp(k.ptr, c, k.len); }

int sd_client_file_write(const char *target_path, const char *head_path, const char *out_path, char *err,
                         size_t errlen) {
    sd_model *m = NULL;
    sd_head *h = NULL;
    uint8_t *hb = NULL;
    size_t hn = 0;
    sd_gguf *g = NULL;
    sd_gguf_writer *w = NULL;
    char e2[400];
    int rc = -1;
    if (sd_model_load(&m, target_path, e2, sizeof e2) < 0) {
        rc = sd_errc(SD_ERR_INPUT, err, errlen, "%s", e2);
        goto out;
    }
    if (m->client) {
        rc = sd_errc(SD_ERR_INPUT, err, errlen, "'%s' is already a client file: give the target model", target_path);
        goto out;
    }
    if ((rc = read_all(head_path, &hb, &hn, err, errlen)) < 0) goto out;
    if (sd_head_load_mem(&h, hb, hn, head_path, m, e2, sizeof e2) < 0) {   // made for this target?
        rc = sd_errc(SD_ERR_INPUT, err, errlen, "%s", e2);
        goto out;
    }
    if (h->hp.type != SD_HEAD_EAGLE3 && h->hp.type != SD_HEAD_MOA) {
        rc = sd_errc(SD_ERR_INPUT, err, errlen, "%s: the client drafts with an EAGLE-3 head or an MoA drafter",
                     head_path);
        goto out;
    }
    const int moa = h->hp.type == SD_HEAD_MOA, lo = m->hp.n_layer - (moa ? h->hp.moa_tli : 0);
    if (sd_gguf_open(&g, target_path, e2, sizeof e2) < 0 || !(w = sd_gguf_writer_new())) {
        rc = sd_errc(SD_ERR_IO, err, errlen, "%s", g ? "out of memory" : e2);
        goto out;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const sd_gguf_kv *kv = &g->kv[i];
        if (key_eq(kv->key, "general.alignment")) continue;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)SD_MIN(kv->key.len, 255), kv->key.ptr);
        sd_gguf_w_kv_copy(w, key, kv);
    }
    sd_gguf_w_u32(w, "specdec.client.n_layer", (uint32_t)m->hp.n_layer);
    sd_gguf_w_u32(w, "specdec.client.layer_lo", (uint32_t)lo);
    sd_gguf_w_arr_u8(w, CLIENT_HEAD_KEY, hb, hn);
    // the embeddings and the final norm; an MoA drafter also reads the output matrix (its draft vocabulary's
    // rows) and runs the last TLI layers
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const sd_tensor *t = &g->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)SD_MIN(t->name.len, 127), t->name.ptr);
        int l = -1, keep = !strcmp(name, "token_embd.weight") || !strcmp(name, "output_norm.weight") ||
                           (moa && !strcmp(name, "output.weight"));
        if (!keep && sscanf(name, "blk.%d.", &l) == 1) keep = l >= lo && l < m->hp.n_layer;
        if (keep) sd_gguf_w_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
    if (sd_gguf_writer_write(w, out_path, e2, sizeof e2) < 0) {
        rc = sd_errc(SD_ERR_IO, err, errlen, "%s", e2);
        goto out;
    }
    rc = 0;
out:
    sd_gguf_writer_free(w);
    sd_gguf_close(g);
    sd_head_free(h);
    free(hb);
    sd_model_free(m);
    return rc;
}

int sd_client_file_head(const char *path, const sd_model *m, sd_head **out, char *err, size_t errlen) {
    *out = NULL;
    sd_gguf *g = NULL;
    char e2[400];
    if (sd_gguf_open(&g, path, e2, sizeof e2) < 0) return sd_errc(SD_ERR_IO, err, errlen, "%s", e2);
    const sd_gguf_kv *kv = sd_gguf_find_key(g, CLIENT_HEAD_KEY);
    int rc = 0;
    if (kv && (kv->type != SD_GGUF_ARRAY || kv->arr_type != SD_GGUF_U8))
        rc = sd_errc(SD_ERR_INPUT, err, errlen, "%s: key %s is not an array of bytes", path, CLIENT_HEAD_KEY);
    else if (kv && sd_head_load_mem(out, kv->data, (size_t)kv->n, path, m, e2, sizeof e2) < 0)
        rc = sd_errc(SD_ERR_INPUT, err, errlen, "%s", e2);
    sd_gguf_close(g);
    return rc;
}
