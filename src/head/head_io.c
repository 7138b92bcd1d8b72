// head_io.c - draft head files: GGUF in llama.cpp's `eagle3` layout or
// specdec's `medusa` layout (docs/heads.md), written atomically and read
// back with every key and shape checked. EAGLE-3 files written before
// 2026-11-28 (specdec's first layout: `eagle3.extract_layers` numbering the
// block outputs, d2t as offsets, `blk.0.hidden_norm`) still load.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "common.h"
#include "head/head.h"
#include "head/moa.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/model.h"

#define GGUF_TYPE_I32 26
#define GGUF_TYPE_I64 27
#define E3_V1_HIDDEN_NORM "blk.0.hidden_norm.weight"   // SD_E3_HIDDEN_NORM in specdec's first layout

static const char *arch_of(int type) { return type == SD_HEAD_MEDUSA ? "medusa" : type == SD_HEAD_MOA ? "moa" : "eagle3"; }

static void w_key_u32(sd_gguf_writer *w, const char *arch, const char *key, uint32_t v) {
    char k[96];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    sd_gguf_w_u32(w, k, v);
}

// Matrix tensor i of h as wtype (rows of ne0): the bytes in a new buffer.
static void *convert_rows(const sd_head *h, int i, int wtype, size_t *nbytes) {
    const sd_head_tensor *t = &h->t[i];
    size_t rb = sd_row_size(wtype, t->ne0);
    uint8_t *buf = malloc(rb * (size_t)t->ne1);
    if (!buf) return NULL;
    const sd_type_traits *tr = sd_type_get(wtype);
    const float *src = sd_head_w(h, i);
    for (int64_t r = 0; r < t->ne1; r++) {
        if (wtype == SD_TYPE_F32) memcpy(buf + r * rb, src + r * t->ne0, rb);
        else tr->from_float(src + r * t->ne0, buf + r * rb, t->ne0);
    }
    *nbytes = rb * (size_t)t->ne1;
    return buf;
}

// The tokenizer keys of target (every `tokenizer.*` key, copied as they
// are): llama.cpp builds the head's vocabulary from them and refuses a
// draft model without one.
static void w_tokenizer(sd_gguf_writer *w, const sd_model *target) {
    const sd_gguf *g = target->gguf;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        sd_str k = g->kv[i].key;
        if (k.len > 10 && !memcmp(k.ptr, "tokenizer.", 10)) sd_gguf_w_copy(w, &g->kv[i]);
    }
}

int sd_head_save(const sd_head *h, const char *path, int wtype, char *err, size_t errlen) {
    return sd_head_save_ex(h, NULL, SD_HEAD_LAYOUT_LLAMA, path, wtype, err, errlen);
}

int sd_head_save_for(const sd_head *h, const sd_model *target, const char *path, int wtype, char *err, size_t errlen) {
    return sd_head_save_ex(h, target, SD_HEAD_LAYOUT_LLAMA, path, wtype, err, errlen);
}

int sd_head_save_ex(const sd_head *h, const sd_model *target, int layout, const char *path, int wtype, char *err,
                    size_t errlen) {
    if (layout != SD_HEAD_LAYOUT_LLAMA && layout != SD_HEAD_LAYOUT_V1)
        return sd_err(err, errlen, "head: unknown file layout %d", layout);
    if (target) {
        char e2[320];
        if (sd_head_check_target(h, target, e2, sizeof e2) < 0)
            return sd_err(err, errlen, "head: cannot write the tokenizer of a model the head was not made for: %s", e2);
    }
    const int v1 = layout == SD_HEAD_LAYOUT_V1;
    if (wtype != SD_TYPE_F32 && wtype != SD_TYPE_F16 && wtype != SD_TYPE_Q8_0 && wtype != SD_TYPE_Q5_0)
        return sd_err(err, errlen, "head: cannot save matrices as type %d (f32, f16, q8_0 or q5_0)", wtype);
    const sd_head_hp *hp = &h->hp;
    const char *arch = arch_of(hp->type);
    sd_gguf_writer *w = sd_gguf_writer_new();
    if (!w) return sd_err(err, errlen, "head: out of memory");
    sd_gguf_w_str(w, "general.architecture", arch);
    sd_gguf_w_str(w, "general.name", hp->type == SD_HEAD_MEDUSA ? "specdec Medusa head"
                                     : hp->type == SD_HEAD_MOA  ? "specdec MoA drafter"
                                                                : "specdec EAGLE-3 head");
    w_key_u32(w, arch, "embedding_length", (uint32_t)hp->n_embd);
    char k[96];
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    sd_gguf_w_f32(w, k, hp->rms_eps);
    if (hp->type == SD_HEAD_EAGLE3) {
        w_key_u32(w, arch, "block_count", 1);
        w_key_u32(w, arch, "feed_forward_length", (uint32_t)hp->n_ff);
        w_key_u32(w, arch, "attention.head_count", (uint32_t)hp->n_head);
        w_key_u32(w, arch, "attention.head_count_kv", (uint32_t)hp->n_head_kv);
        w_key_u32(w, arch, "attention.key_length", (uint32_t)hp->head_dim);
        w_key_u32(w, arch, "attention.value_length", (uint32_t)hp->head_dim);
        w_key_u32(w, arch, "context_length", 4096);
        w_key_u32(w, arch, "vocab_size", (uint32_t)hp->target_n_vocab);
        sd_gguf_w_f32(w, "eagle3.rope.freq_base", hp->rope_base);
        if (v1) {
            sd_gguf_w_arr_i32(w, "eagle3.extract_layers", hp->extract, 3);
        } else {   // llama.cpp numbers a layer's input: the output of block l is the input of layer l + 1
            int32_t tl[3] = {hp->extract[0] + 1, hp->extract[1] + 1, hp->extract[2] + 1};
            sd_gguf_w_arr_i32(w, "eagle3.target_layers", tl, 3);
        }
        sd_gguf_w_u32(w, "eagle3.target_hidden_size", (uint32_t)hp->target_n_embd);
        sd_gguf_w_bool(w, "eagle3.norm_before_residual", hp->norm_before_residual);
    } else if (hp->type == SD_HEAD_MOA) {
        sd_moa_write_hp(w, hp);
    } else {
        w_key_u32(w, arch, "head_count", (uint32_t)hp->n_medusa);
    }
    sd_gguf_w_str(w, "specdec.head.type", arch);
    sd_gguf_w_u32(w, "specdec.target.n_vocab", (uint32_t)hp->target_n_vocab);
    sd_gguf_w_u32(w, "specdec.target.n_embd", (uint32_t)hp->target_n_embd);
    sd_gguf_w_u32(w, "specdec.target.n_layer", (uint32_t)hp->target_n_layer);
    char hx[32];
    snprintf(hx, sizeof hx, "%016" PRIx64, hp->target_vocab_hash);
    sd_gguf_w_str(w, "specdec.target.vocab_hash", hx);
    sd_gguf_w_str(w, "specdec.head.note", h->note);
    if (target && !v1 && hp->type == SD_HEAD_EAGLE3) w_tokenizer(w, target);
    for (int i = 0; i < h->n_t; i++) {
        const sd_head_tensor *t = &h->t[i];
        int ty = t->ne1 == 1 ? SD_TYPE_F32 : wtype;
        if (t->ne0 % sd_type_get(ty)->blck) ty = SD_TYPE_F16;   // rows that do not fill whole blocks
        size_t nb = 0;
        void *buf = convert_rows(h, i, ty, &nb);
        if (!buf) {
            sd_gguf_writer_free(w);
            return sd_err(err, errlen, "head: out of memory");
        }
        int64_t ne[2] = {t->ne0, t->ne1};
        const char *name = v1 && hp->type == SD_HEAD_EAGLE3 && i == SD_E3_HIDDEN_NORM ? E3_V1_HIDDEN_NORM : t->name;
        sd_gguf_w_tensor(w, name, ty, t->ne1 == 1 ? 1 : 2, ne, buf, nb);
        free(buf);
    }
    int64_t V = hp->n_draft_vocab;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)V);
    if (!off) {
        sd_gguf_writer_free(w);
        return sd_err(err, errlen, "head: out of memory");
    }
    // llama.cpp: d2t[draft] is the target id; specdec's first layout (and
    // Medusa files) kept EAGLE's offsets, target = draft + d2t[draft].
    const int absolute = !v1 && hp->type == SD_HEAD_EAGLE3;
    for (int64_t i = 0; i < V; i++) off[i] = (int64_t)h->d2t[i] - (absolute ? 0 : i);
    sd_gguf_w_tensor(w, "d2t", GGUF_TYPE_I64, 1, &V, off, sizeof(int64_t) * (size_t)V);
    free(off);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        sd_gguf_writer_free(w);
        return sd_err(err, errlen, "head: path too long");
    }
    char werr[256];
    int rc = sd_gguf_writer_write(w, tmp, werr, sizeof werr);
    sd_gguf_writer_free(w);
    if (rc < 0) {
        unlink(tmp);
        return sd_err(err, errlen, "head: writing %s failed: %s (%s is unchanged)", tmp, werr, path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return sd_err(err, errlen, "head: cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return 0;
}

// ---------------------------------------------------------------- reading
// Every key is checked as strictly as a model's (src/model/model.c): integers
// in sane ranges, floats finite and in range, booleans 0 or 1, and keys that
// say the same thing twice (the target's hidden size and vocabulary, the head
// type) agreeing. Each message names the key and the value found.

// An integer key in [lo, hi]: 0, 1 if absent (*out untouched; an error when
// required), <0 with a message.
static int get_int(const sd_gguf *g, const char *key, int required, int64_t lo, int64_t hi, int *out, char *err,
                   size_t errlen) {
    int64_t v = 0;
    char e2[200];
    int rc = sd_gguf_get_i64(g, key, &v, e2, sizeof e2);   // names the key and the value or type
    if (rc < 0) return sd_err(err, errlen, "head file: %s", e2);
    if (rc == 1) return required ? sd_err(err, errlen, "head file: key '%s' is missing", key) : 1;
    if (v < lo || v > hi)
        return sd_err(err, errlen, "head file: %s = %lld is out of range (%lld..%lld)", key, (long long)v,
                      (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

// A float key (default def when absent) that is finite and in (lo, hi).
static int get_float(const sd_gguf *g, const char *key, float def, double lo, double hi, float *out, char *err,
                     size_t errlen) {
    *out = def;
    char e2[200];
    if (sd_gguf_get_f32(g, key, out, e2, sizeof e2) < 0) return sd_err(err, errlen, "head file: %s", e2);
    if (!isfinite(*out) || !(*out > lo && *out < hi))
        return sd_err(err, errlen, "head file: %s = %g, expected a finite number in (%g, %g)", key, (double)*out, lo,
                      hi);
    return 0;
}

// A boolean key (0 when absent) whose byte is 0 or 1.
static int get_bool01(const sd_gguf *g, const char *key, int *out, char *err, size_t errlen) {
    *out = 0;
    const sd_gguf_kv *kv = sd_gguf_find_key(g, key);
    if (!kv) return 0;
    if (kv->type != SD_GGUF_BOOL) {
        char e2[200];
        sd_gguf_get_bool(g, key, out, e2, sizeof e2);
        return sd_err(err, errlen, "head file: %s", e2);
    }
    uint8_t b = *(const uint8_t *)kv->data;
    if (b > 1) return sd_err(err, errlen, "head file: %s = %u, a boolean must be 0 or 1", key, b);
    *out = b;
    return 0;
}

// An optional integer key that must equal want (what another key or the
// target says, named by what).
static int check_same(const sd_gguf *g, const char *key, int want, const char *what, char *err, size_t errlen) {
    int v = 0;
    int rc = get_int(g, key, 0, 0, INT32_MAX, &v, err, errlen);
    if (rc < 0) return rc;
    if (rc == 0 && v != want) return sd_err(err, errlen, "head file: %s = %d differs from %s (%d)", key, v, what, want);
    return 0;
}

// An array of 3 integers in 0..4096 (1: read, 0: absent, <0: malformed).
static int get_layers(const sd_gguf *g, const char *key, int out[3], char *err, size_t errlen) {
    const sd_gguf_kv *kv = sd_gguf_find_key(g, key);
    if (!kv) return 0;
    if (kv->type != SD_GGUF_ARRAY || kv->n != 3 || kv->arr_type == SD_GGUF_STRING || kv->arr_type == SD_GGUF_F32 ||
        kv->arr_type == SD_GGUF_F64 || kv->arr_type == SD_GGUF_ARRAY || kv->arr_type == SD_GGUF_BOOL)
        return sd_err(err, errlen, "head file: %s must be an array of 3 integers", key);
    for (int i = 0; i < 3; i++) {
        int64_t x = sd_gguf_arr_i64(kv, (uint64_t)i);
        if (x < 0 || x > 4096)
            return sd_err(err, errlen, "head file: %s[%d] = %lld is out of range", key, i, (long long)x);
        out[i] = (int)x;
    }
    return 1;
}

// *llama: 1 when the file is in llama.cpp's layout (eagle3.target_layers,
// d2t holding target ids), 0 in specdec's first one.
static int read_eagle3_hp(const sd_gguf *g, sd_head_hp *hp, int *llama, char *err, size_t errlen) {
    int nb = 0, v = 0, rc;
    if (get_int(g, "eagle3.block_count", 1, 1, 1, &nb, err, errlen) < 0) return -1;
    if (get_int(g, "eagle3.feed_forward_length", 1, 1, 1 << 20, &hp->n_ff, err, errlen) < 0) return -1;
    if (get_int(g, "eagle3.attention.head_count", 1, 1, 1024, &hp->n_head, err, errlen) < 0) return -1;
    if (get_int(g, "eagle3.attention.head_count_kv", 1, 1, 1024, &hp->n_head_kv, err, errlen) < 0) return -1;
    if (hp->n_head % hp->n_head_kv)
        return sd_err(err, errlen, "head file: eagle3.attention.head_count_kv = %d does not divide "
                      "eagle3.attention.head_count = %d", hp->n_head_kv, hp->n_head);
    hp->head_dim = hp->n_embd % hp->n_head ? 0 : hp->n_embd / hp->n_head;
    if ((rc = get_int(g, "eagle3.attention.key_length", 0, 2, 65536, &hp->head_dim, err, errlen)) < 0) return -1;
    if (rc == 1 && hp->head_dim == 0)
        return sd_err(err, errlen, "head file: eagle3.embedding_length = %d is not a multiple of head_count = %d and "
                      "eagle3.attention.key_length is absent", hp->n_embd, hp->n_head);
    if (hp->head_dim % 2)
        return sd_err(err, errlen, "head file: eagle3.attention.key_length = %d must be even (RoPE pairs)", hp->head_dim);
    if (check_same(g, "eagle3.attention.value_length", hp->head_dim, "the key length", err, errlen) < 0) return -1;
    if (get_int(g, "eagle3.context_length", 0, 1, 1 << 24, &v, err, errlen) < 0) return -1;
    if (get_float(g, "eagle3.rope.freq_base", 10000.0f, 1.0, 1e12, &hp->rope_base, err, errlen) < 0) return -1;
    // The three layers: llama.cpp's eagle3.target_layers (layer inputs), or
    // eagle3.extract_layers (block outputs) in files written before 2026-11-28.
    int tl[3], el[3];
    int has_tl = get_layers(g, "eagle3.target_layers", tl, err, errlen);
    if (has_tl < 0) return -1;
    int has_el = get_layers(g, "eagle3.extract_layers", el, err, errlen);
    if (has_el < 0) return -1;
    if (!has_tl && !has_el)
        return sd_err(err, errlen, "head file: key 'eagle3.target_layers' is missing (older specdec files: "
                      "'eagle3.extract_layers')");
    for (int i = 0; i < 3; i++) {
        if (has_tl && tl[i] < 1)
            return sd_err(err, errlen, "head file: eagle3.target_layers[%d] = %d: the input of layer 0 (the token "
                          "embeddings) is not a state specdec gives a head", i, tl[i]);
        if (has_tl && has_el && el[i] != tl[i] - 1)
            return sd_err(err, errlen, "head file: eagle3.extract_layers[%d] = %d (a block output) disagrees with "
                          "eagle3.target_layers[%d] = %d (a layer input, expected %d)", i, el[i], i, tl[i], el[i] + 1);
        hp->extract[i] = has_tl ? tl[i] - 1 : el[i];
    }
    *llama = has_tl;
    int nbf = 0;
    if (get_bool01(g, "eagle3.norm_before_fc", &nbf, err, errlen) < 0) return -1;
    if (nbf) return sd_err(err, errlen, "head file: eagle3.norm_before_fc = true is not supported by specdec");
    if (get_int(g, "eagle3.target_hidden_size", 1, 1, 65536, &hp->target_n_embd, err, errlen) < 0) return -1;
    if (hp->target_n_embd != hp->n_embd)
        return sd_err(err, errlen, "head file: eagle3.target_hidden_size = %d differs from eagle3.embedding_length = "
                      "%d (not supported)", hp->target_n_embd, hp->n_embd);
    return get_bool01(g, "eagle3.norm_before_residual", &hp->norm_before_residual, err, errlen);
}

static int read_hp(const sd_gguf *g, const sd_model *m, sd_head_hp *hp, int *llama, char *err, size_t errlen) {
    memset(hp, 0, sizeof *hp);
    *llama = 0;
    sd_str a;
    if (sd_gguf_get_str(g, "general.architecture", &a, err, errlen) != 0)
        return sd_err(err, errlen, "head file: general.architecture is missing");
    if (sd_str_eq(a, "eagle3")) hp->type = SD_HEAD_EAGLE3;
    else if (sd_str_eq(a, "medusa")) hp->type = SD_HEAD_MEDUSA;
    else if (sd_str_eq(a, "moa")) hp->type = SD_HEAD_MOA;
    else
        return sd_err(err, errlen, "not a draft head: architecture '%.*s' (a head is 'eagle3', 'medusa' or 'moa')",
                      (int)SD_MIN(a.len, 32), a.ptr);
    const char *arch = arch_of(hp->type);
    sd_str ty;
    char e2[200];
    int rc = sd_gguf_get_str(g, "specdec.head.type", &ty, e2, sizeof e2);
    if (rc < 0) return sd_err(err, errlen, "head file: %s", e2);
    if (rc == 0 && !sd_str_eq(ty, arch))
        return sd_err(err, errlen, "head file: specdec.head.type = '%.*s' differs from general.architecture = '%s'",
                      (int)SD_MIN(ty.len, 32), ty.ptr, arch);
    char k[96];
    snprintf(k, sizeof k, "%s.embedding_length", arch);
    if (get_int(g, k, 1, 1, 65536, &hp->n_embd, err, errlen) < 0) return -1;
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    if (get_float(g, k, 1e-5f, 0.0, 1.0, &hp->rms_eps, err, errlen) < 0) return -1;
    if (hp->type == SD_HEAD_EAGLE3) {
        if (read_eagle3_hp(g, hp, llama, err, errlen) < 0) return -1;
    } else if (hp->type == SD_HEAD_MOA) {
        if (sd_moa_read_hp(g, hp, err, errlen) < 0) return -1;
        hp->target_n_embd = hp->n_embd;
    } else {
        if (get_int(g, "medusa.head_count", 1, 1, SD_HEAD_MAX_MEDUSA, &hp->n_medusa, err, errlen) < 0) return -1;
        hp->target_n_embd = hp->n_embd;
    }
    // What the head was made for: specdec's keys, else (a head made elsewhere) what the model says.
    hp->target_n_vocab = m ? m->hp.n_vocab : 0;
    hp->target_n_layer = m ? m->hp.n_layer : 0;
    if (get_int(g, "specdec.target.n_vocab", 0, 1, 1 << 24, &hp->target_n_vocab, err, errlen) < 0) return -1;
    if (get_int(g, "specdec.target.n_layer", 0, 1, 4096, &hp->target_n_layer, err, errlen) < 0) return -1;
    snprintf(k, sizeof k, "%s.embedding_length", arch);
    if (check_same(g, "specdec.target.n_embd", hp->target_n_embd,
                   hp->type == SD_HEAD_EAGLE3 ? "eagle3.target_hidden_size" : k, err, errlen) < 0)
        return -1;
    if (hp->type == SD_HEAD_EAGLE3 && hp->target_n_vocab > 0 &&
        check_same(g, "eagle3.vocab_size", hp->target_n_vocab,
                   sd_gguf_find_key(g, "specdec.target.n_vocab") ? "specdec.target.n_vocab" : "the target's vocabulary",
                   err, errlen) < 0)
        return -1;
    sd_str hs;
    rc = sd_gguf_get_str(g, "specdec.target.vocab_hash", &hs, e2, sizeof e2);
    if (rc < 0) return sd_err(err, errlen, "head file: %s", e2);
    if (rc == 0) {
        char buf[32];
        snprintf(buf, sizeof buf, "%.*s", (int)SD_MIN(hs.len, 31), hs.ptr);
        char *end = NULL;
        hp->target_vocab_hash = strtoull(buf, &end, 16);
        if (hs.len != 16 || !end || *end)
            return sd_err(err, errlen, "head file: specdec.target.vocab_hash = '%s' is not 16 hex digits", buf);
    } else if (m) {
        hp->target_vocab_hash = sd_head_vocab_hash(m);   // unknown: nothing to compare
    }
    if (hp->target_n_vocab <= 0 || hp->target_n_layer <= 0)
        return sd_err(err, errlen, "head file: the target's vocabulary and layer count are not recorded (specdec.target.*)");
    if (hp->type == SD_HEAD_EAGLE3)
        for (int i = 0; i < 3; i++)
            if (hp->extract[i] >= hp->target_n_layer)
                return sd_err(err, errlen, "head file: %s[%d] = %d is outside the target's %d layers",
                              *llama ? "eagle3.target_layers" : "eagle3.extract_layers", i,
                              hp->extract[i] + *llama, hp->target_n_layer);
    const sd_tensor *d2t = sd_gguf_find_tensor(g, "d2t");
    if (d2t) {
        if (d2t->n_dims != 1 || (d2t->type != GGUF_TYPE_I64 && d2t->type != GGUF_TYPE_I32))
            return sd_err(err, errlen, "head file: tensor 'd2t' must be a vector of I64 or I32");
        if (d2t->ne[0] < 1 || d2t->ne[0] > hp->target_n_vocab)
            return sd_err(err, errlen, "head file: tensor 'd2t' has %lld entries, expected 1..%d (the target's "
                          "vocabulary)", (long long)d2t->ne[0], hp->target_n_vocab);
        hp->n_draft_vocab = (int)d2t->ne[0];
    } else {
        hp->n_draft_vocab = hp->target_n_vocab;   // the full vocabulary
    }
    return 0;
}

// Every tensor of the file is one of the head's (d2t aside): a file with
// tensors of another layout (a Medusa head's in an EAGLE-3 file, a fifth
// Medusa head beyond head_count) is refused.
static int check_no_extra_tensors(const sd_gguf *g, const sd_head *h, char *err, size_t errlen) {
    const int e3 = h->hp.type == SD_HEAD_EAGLE3;
    if (e3 && sd_gguf_find_tensor(g, E3_V1_HIDDEN_NORM) && sd_gguf_find_tensor(g, h->t[SD_E3_HIDDEN_NORM].name))
        return sd_err(err, errlen, "head file: both '%s' and its older name '%s' are present",
                      h->t[SD_E3_HIDDEN_NORM].name, E3_V1_HIDDEN_NORM);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        sd_str nm = g->tensors[i].name;
        int known = sd_str_eq(nm, "d2t") || (e3 && sd_str_eq(nm, E3_V1_HIDDEN_NORM));
        for (int j = 0; j < h->n_t && !known; j++) known = sd_str_eq(nm, h->t[j].name);
        if (!known && h->hp.type == SD_HEAD_MEDUSA)
            return sd_err(err, errlen, "head file: tensor '%.*s' is not part of a Medusa head of medusa.head_count = %d "
                          "heads", (int)SD_MIN(nm.len, 64), nm.ptr, h->hp.n_medusa);
        if (!known)
            return sd_err(err, errlen, "head file: tensor '%.*s' is not part of %s",
                          (int)SD_MIN(nm.len, 64), nm.ptr,
                          h->hp.type == SD_HEAD_MOA ? (h->hp.moa_no_lsa ? "an MoA drafter without LSA" : "an MoA drafter")
                                                    : "an EAGLE-3 head");
    }
    return 0;
}

static int read_tensor(const sd_gguf *g, sd_head *h, int i, char *err, size_t errlen) {
    const sd_head_tensor *t = &h->t[i];
    const sd_tensor *ft = sd_gguf_find_tensor(g, t->name);
    if (!ft && h->hp.type == SD_HEAD_EAGLE3 && i == SD_E3_HIDDEN_NORM) ft = sd_gguf_find_tensor(g, E3_V1_HIDDEN_NORM);
    if (!ft) return sd_err(err, errlen, "head file: tensor '%s' is missing", t->name);
    if (ft->ne[0] != t->ne0 || ft->ne[1] != t->ne1 || ft->ne[2] != 1 || ft->ne[3] != 1)
        return sd_err(err, errlen, "head file: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", t->name,
                      (long long)ft->ne[0], (long long)ft->ne[1], (long long)t->ne0, (long long)t->ne1);
    const sd_type_traits *tr = sd_type_get(ft->type);
    if (!tr || (ft->type != SD_TYPE_F32 && !tr->to_float))
        return sd_err(err, errlen, "head file: tensor '%s' has a type specdec cannot read (%s)", t->name,
                      tr && tr->name ? tr->name : "?");
    float *dst = sd_head_w(h, i);
    size_t rb = sd_row_size(ft->type, t->ne0);
    const uint8_t *src = ft->data;
    for (int64_t r = 0; r < t->ne1; r++) {
        if (ft->type == SD_TYPE_F32) memcpy(dst + r * t->ne0, src + r * rb, rb);
        else tr->to_float(src + r * rb, dst + r * t->ne0, t->ne0);
    }
    for (size_t j = 0; j < (size_t)(t->ne0 * t->ne1); j++)
        if (!isfinite(dst[j])) return sd_err(err, errlen, "head file: tensor '%s' holds a non-finite value", t->name);
    return 0;
}

// Loads a head from the opened file g (closed here); path names it in messages.
static int load_gguf(sd_head **out, sd_gguf *g, const char *path, const sd_model *m, char *err, size_t errlen) {
    char gerr[256];
    sd_head_hp hp;
    sd_head *h = NULL;
    char e2[320];
    int llama = 0;
    if (read_hp(g, m, &hp, &llama, e2, sizeof e2) < 0 || sd_head_new(&h, &hp, e2, sizeof e2) < 0) goto fail;
    // the target first (its checks read the hyper-parameters only): a head for another model is refused
    // without reading its tensors (`--head auto` tries every file in heads/)
    if (m && sd_head_check_target(h, m, e2, sizeof e2) < 0) goto fail;
    if (check_no_extra_tensors(g, h, e2, sizeof e2) < 0) goto fail;
    for (int i = 0; i < h->n_t; i++)
        if (read_tensor(g, h, i, e2, sizeof e2) < 0) goto fail;
    const sd_tensor *d2t = sd_gguf_find_tensor(g, "d2t");
    if (d2t) {
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)hp.n_draft_vocab);
        if (!ids) {
            snprintf(e2, sizeof e2, "out of memory");
            goto fail;
        }
        int ok = 1;
        for (int i = 0; i < hp.n_draft_vocab; i++) {
            int64_t o = d2t->type == GGUF_TYPE_I64 ? (int64_t)sd_ld64((const uint8_t *)d2t->data + 8 * (size_t)i)
                                                   : (int32_t)sd_ld32((const uint8_t *)d2t->data + 4 * (size_t)i);
            int64_t id = llama ? o : i + o;   // llama.cpp: target ids; else EAGLE's offsets
            if (id < 0 || id >= hp.target_n_vocab || (i && id <= ids[i - 1])) ok = 0;
            ids[i] = ok ? (int32_t)id : 0;
            if (!ok) break;
        }
        if (!ok) {
            free(ids);
            snprintf(e2, sizeof e2, "tensor 'd2t' does not map the draft vocabulary to increasing target ids in range");
            goto fail;
        }
        int rc = sd_head_set_vocab(h, ids, hp.n_draft_vocab, e2, sizeof e2);
        free(ids);
        if (rc < 0) goto fail;
    }
    sd_str note;
    if (sd_gguf_get_str(g, "specdec.head.note", &note, gerr, sizeof gerr) == 0)
        snprintf(h->note, sizeof h->note, "%.*s", (int)SD_MIN(note.len, sizeof h->note - 1), note.ptr);
    sd_gguf_close(g);
    *out = h;
    return 0;
fail:
    sd_head_free(h);
    sd_gguf_close(g);
    return sd_err(err, errlen, "%s: %s", path, e2);
}

int sd_head_load(sd_head **out, const char *path, const sd_model *m, char *err, size_t errlen) {
    *out = NULL;
    char gerr[256];
    sd_gguf *g = NULL;
    if (sd_gguf_open(&g, path, gerr, sizeof gerr) < 0) return sd_err(err, errlen, "%s", gerr);   // names the file
    return load_gguf(out, g, path, m, err, errlen);
}

int sd_head_load_mem(sd_head **out, const void *buf, size_t size, const char *name, const sd_model *m, char *err,
                     size_t errlen) {
    *out = NULL;
    char gerr[256];
    sd_gguf *g = NULL;
    if (sd_gguf_open_mem(&g, buf, size, gerr, sizeof gerr) < 0) return sd_err(err, errlen, "%s: %s", name, gerr);
    return load_gguf(out, g, name, m, err, errlen);
}
