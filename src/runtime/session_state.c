// session_state.c - a session's committed state (its KV cache rows and
// layer-skip mask) written to and read from a caller's buffer or a file, so
// that a generation can be suspended, moved to another session of the same
// model, or resumed after a reconnect (include/specdec.h).
//
// Layout (little endian, all fields 8-byte aligned):
//   u32 magic "SDST", u32 version, u64 model fingerprint,
//   u32 n_layer, u32 n_head_kv, u32 head_dim, u32 n_past,
//   u32 n_skip, u32 reserved, then n_layer mask bytes padded to 8,
//   then per layer l: K of each KV head g, position-major (n_past x head_dim
//   fp16), then V (n_past x kv_dim fp16).
// The cache's own K layout (blocks of SD_KT_W positions, transposed) is not
// part of the format, so a state loads into a session of any n_ctx >= n_past.
#include "runtime/session.h"

#include <errno.h>

#include "common.h"
#include "model/model.h"

#define ST_MAGIC 0x54534453u   // "SDST"
#define ST_VERSION 1u
#define ST_HEADER 40u

// FNV-1a over bytes, continuing from h.
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// A fingerprint of the model: its hyperparameters, tensor bytes and samples
// of its weights (the final norm, the first KiBs of the embeddings). Two
// different model files practically never share it.
static uint64_t model_fingerprint(const sd_model *m) {
    uint64_t h = 0xcbf29ce484222325ull;
    const sd_hparams *hp = &m->hp;
    const int dims[] = {hp->arch, hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim,
                        hp->n_ff, hp->n_rot, hp->rope_type};
    h = fnv(h, dims, sizeof dims);
    h = fnv(h, &hp->rope_base, sizeof hp->rope_base);
    uint64_t nb = m->n_bytes;
    h = fnv(h, &nb, sizeof nb);
    if (m->out_norm) h = fnv(h, m->out_norm->data, m->out_norm->nbytes);
    if (m->tok_embd) h = fnv(h, m->tok_embd->data, SD_MIN(m->tok_embd->nbytes, (size_t)8192));
    return h;
}

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

size_t sd_session_state_size(const sd_session *s) {
    const sd_hparams *hp = &s->m->hp;
    return ST_HEADER + pad8((size_t)hp->n_layer) + (size_t)hp->n_layer * s->n_past * 2 * s->kv_dim * sizeof(uint16_t);
}

// K of layer l, KV head g, in the cache's blocked layout (as attention.c).
static uint16_t *kt_of(const sd_session *s, int l, int g) {
    const sd_hparams *hp = &s->m->hp;
    return s->kt + ((size_t)l * hp->n_head_kv + g) * hp->head_dim * (size_t)s->kt_nblk * SD_KT_W;
}
static size_t kt_at(int hd, int p, int c) {
    return (size_t)(p / SD_KT_W) * hd * SD_KT_W + (size_t)c * SD_KT_W + p % SD_KT_W;
}

// A session of a model part (a pipeline's layers) has no whole state.
static int whole_model(const sd_session *s, char *err, size_t errlen) {
    if (s->n_lay == s->m->hp.n_layer) return 0;
    return sd_errc(SD_ERR_INPUT, err, errlen, "session state: the session caches layers [%d, %d) of %d only", s->l0,
                   s->l0 + s->n_lay, s->m->hp.n_layer);
}

int sd_session_state_save(const sd_session *s, void *buf, size_t size, char *err, size_t errlen) {
    if (s->gkv) return sd_errc(SD_ERR_INPUT, err, errlen, "session state: not available for a GPU session yet");
    if (whole_model(s, err, errlen) < 0) return SD_ERR_INPUT;
    const size_t need = sd_session_state_size(s);
    if (!buf || size < need)
        return sd_errc(SD_ERR_INPUT, err, errlen, "session state: the buffer holds %zu bytes, the state needs %zu", size, need);
    const sd_hparams *hp = &s->m->hp;
    const int nl = hp->n_layer, nkv = hp->n_head_kv, hd = hp->head_dim, np = s->n_past;
    uint8_t *o = buf;
    const uint32_t h32[] = {ST_MAGIC, ST_VERSION};
    memcpy(o, h32, 8);
    const uint64_t fp = model_fingerprint(s->m);
    memcpy(o + 8, &fp, 8);
    const uint32_t d[] = {(uint32_t)nl, (uint32_t)nkv, (uint32_t)hd, (uint32_t)np, (uint32_t)s->n_skip, 0};
    memcpy(o + 16, d, sizeof d);
    o += ST_HEADER;
    memset(o, 0, pad8((size_t)nl));
    if (s->layer_skip) memcpy(o, s->layer_skip, (size_t)nl);
    o += pad8((size_t)nl);
    uint16_t *w = (uint16_t *)(void *)o;
    for (int l = 0; l < nl; l++) {
        for (int g = 0; g < nkv; g++) {
            const uint16_t *kt = kt_of(s, l, g);
            for (int p = 0; p < np; p++)
                for (int c = 0; c < hd; c++) *w++ = kt[kt_at(hd, p, c)];
        }
        const size_t vrow = (size_t)s->kv_dim;
        memcpy(w, s->v_cache + (size_t)l * s->n_ctx * vrow, (size_t)np * vrow * sizeof *w);
        w += (size_t)np * vrow;
    }
    return (int)SD_MIN(need, (size_t)INT32_MAX);
}

int sd_session_state_load(sd_session *s, const void *buf, size_t size, char *err, size_t errlen) {
    if (s->gkv) return sd_errc(SD_ERR_INPUT, err, errlen, "session state: not available for a GPU session yet");
    if (whole_model(s, err, errlen) < 0) return SD_ERR_INPUT;
    const sd_hparams *hp = &s->m->hp;
    const int nl = hp->n_layer, nkv = hp->n_head_kv, hd = hp->head_dim;
    const uint8_t *in = buf;
    uint32_t h32[2], d[6];
    uint64_t fp;
    if (!buf || size < ST_HEADER)
        return sd_errc(SD_ERR_INPUT, err, errlen, "session state: %zu bytes is too short for a state (%u at least)", size,
                      ST_HEADER);
    memcpy(h32, in, 8);
    memcpy(&fp, in + 8, 8);
    memcpy(d, in + 16, sizeof d);
    if (h32[0] != ST_MAGIC)
        return sd_errc(SD_ERR_INPUT, err, errlen, "session state: not a specdec session state (bad magic)");
    if (h32[1] != ST_VERSION)
        return sd_errc(SD_ERR_INPUT, err, errlen, "session state: version %u, this build reads version %u", h32[1], ST_VERSION);
    if (d[0] != (uint32_t)nl || d[1] != (uint32_t)nkv || d[2] != (uint32_t)hd || fp != model_fingerprint(s->m))
        return sd_errc(SD_ERR_INPUT, err, errlen, "session state: saved from another model (%u layers, %u KV heads of %u) than this "
                      "session's (%d, %d of %d, or different weights)", d[0], d[1], d[2], nl, nkv, hd);
    const int np = (int)d[3];
    if (d[3] > (uint32_t)s->n_ctx)
        return sd_errc(SD_ERR_NO_ROOM, err, errlen, "session state: %u committed rows, but the session's context is %d", d[3],
                      s->n_ctx);
    const size_t need = ST_HEADER + pad8((size_t)nl) + (size_t)nl * np * 2 * s->kv_dim * sizeof(uint16_t);
    if (size != need)
        return sd_errc(SD_ERR_INPUT, err, errlen, "session state: %zu bytes where %u rows need %zu (truncated or corrupt)", size, d[3],
                      need);
    const uint8_t *mask = in + ST_HEADER;
    int n_skip = 0;
    for (int l = 0; l < nl; l++) {
        if (mask[l] > 1) return sd_errc(SD_ERR_INPUT, err, errlen, "session state: corrupt layer mask");
        n_skip += mask[l];
    }
    if ((uint32_t)n_skip != d[4]) return sd_errc(SD_ERR_INPUT, err, errlen, "session state: corrupt layer mask");
    // Everything is checked: from here on the load cannot fail but for memory.
    if (sd_session_set_layer_skip(s, n_skip ? mask : NULL, err, errlen) < 0) return SD_ERR_OOM;
    const uint16_t *r = (const uint16_t *)(const void *)(mask + pad8((size_t)nl));
    for (int l = 0; l < nl; l++) {
        for (int g = 0; g < nkv; g++) {
            uint16_t *kt = kt_of(s, l, g);
            for (int p = 0; p < np; p++)
                for (int c = 0; c < hd; c++) kt[kt_at(hd, p, c)] = *r++;
        }
        const size_t vrow = (size_t)s->kv_dim;
        memcpy(s->v_cache + (size_t)l * s->n_ctx * vrow, r, (size_t)np * vrow * sizeof *r);
        r += (size_t)np * vrow;
    }
    s->n_past = np;
    s->n_pending = 0;
    return 0;
}

int sd_session_state_save_file(const sd_session *s, const char *path, char *err, size_t errlen) {
    const size_t n = sd_session_state_size(s);
    void *buf = malloc(n);
    if (!buf) return sd_errc(SD_ERR_OOM, err, errlen, "session state: out of memory (%zu bytes)", n);
    int rc = sd_session_state_save(s, buf, n, err, errlen);
    if (rc >= 0) {
        FILE *f = fopen(path, "wb");
        if (!f) {
            rc = sd_errc(SD_ERR_IO, err, errlen, "session state: cannot write '%s': %s", path, strerror(errno));
        } else {
            const int bad = fwrite(buf, 1, n, f) != n;
            if ((fclose(f) != 0) | bad)
                rc = sd_errc(SD_ERR_IO, err, errlen, "session state: writing '%s' failed: %s", path, strerror(errno));
            else
                rc = 0;
        }
    }
    free(buf);
    return rc;
}

int sd_session_state_load_file(sd_session *s, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return sd_errc(SD_ERR_IO, err, errlen, "session state: cannot open '%s': %s", path, strerror(errno));
    int rc = 0;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    void *buf = NULL;
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = sd_errc(SD_ERR_IO, err, errlen, "session state: cannot read '%s'", path);
    } else if (!(buf = malloc(n ? (size_t)n : 1))) {
        rc = sd_errc(SD_ERR_OOM, err, errlen, "session state: out of memory (%ld bytes)", n);
    } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        rc = sd_errc(SD_ERR_IO, err, errlen, "session state: cannot read '%s': %s", path, strerror(errno));
    }
    fclose(f);
    if (!rc) rc = sd_session_state_load(s, buf, (size_t)n, err, errlen);
    free(buf);
    return rc;
}
