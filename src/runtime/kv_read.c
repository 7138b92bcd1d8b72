// kv_read.c - reading a session's committed K and V rows back as floats
// (session.h: sd_session_kv_rows), for drafters that learn from the
// target's cache (docs/moa.md).
#include "common.h"
#include "specdec.h"
#include "runtime/session.h"

int sd_session_kv_rows(const sd_session *s, int layer, int pos, int n, float *k, float *v) {
    const sd_hparams *hp = &s->m->hp;
    if (layer < 0 || layer >= hp->n_layer || pos < 0 || n < 0 || pos + n > s->n_past) return -1;
    const int nkv = hp->n_head_kv, hd = hp->head_dim, kvd = s->kv_dim;
    for (int i = 0; i < n; i++) {
        const int p = pos + i, b = p / SD_KT_W, c0 = p % SD_KT_W;
        float *kr = k + (size_t)i * kvd, *vr = v + (size_t)i * kvd;
        for (int g = 0; g < nkv; g++) {
            // kt[l][g][b][c][0..SD_KT_W): dimension c of positions 16 b .. 16 b + 15
            const uint16_t *blk = s->kt + (((size_t)layer * nkv + g) * s->kt_nblk + b) * (size_t)hd * SD_KT_W;
            for (int c = 0; c < hd; c++) kr[g * hd + c] = sd_fp16_to_fp32(blk[(size_t)c * SD_KT_W + c0]);
        }
        const uint16_t *vs = s->v_cache + ((size_t)layer * s->n_ctx + p) * kvd;
        for (int j = 0; j < kvd; j++) vr[j] = sd_fp16_to_fp32(vs[j]);
    }
    return 0;
}

int sd_session_kv_read(const sd_session *s, int layer, int pos, int n, float *k, float *v, char *err, size_t errlen) {
    if (!s || !k || !v) return sd_errc(SD_ERR_INPUT, err, errlen, "kv_read: no session or buffers");
    if (s->gkv) return sd_errc(SD_ERR_INPUT, err, errlen, "kv_read: this session's cache is on the GPU");
    if (s->l0 != 0 || s->n_lay != s->m->hp.n_layer)
        return sd_errc(SD_ERR_INPUT, err, errlen, "kv_read: the session holds a part of the model's layers");
    if (sd_session_kv_rows(s, layer, pos, n, k, v) < 0)
        return sd_errc(SD_ERR_INPUT, err, errlen, "kv_read: rows %d..%d of layer %d are not committed (%d are)", pos,
                       pos + n - 1, layer, s->n_past);
    return 0;
}
