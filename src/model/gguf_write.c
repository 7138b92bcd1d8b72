// gguf_write.c - a small GGUF v3 writer (convert-llama2c, synthetic test
// models): kv pairs are encoded as they are added, tensors copied; the first
// invalid argument or allocation failure is remembered and reported by
// sd_gguf_writer_write, which writes the file with 32-byte alignment.
#include "model/gguf_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/quant.h"

typedef struct {
    char *name;
    int type, n_dims;
    int64_t ne[SD_MAX_DIMS];
    void *data;    // (nbytes) owned copy
    size_t nbytes;
} w_tensor;

struct sd_gguf_writer {
    uint8_t *kv;        // (kv_len) encoded kv pairs, in insertion order
    size_t kv_len, kv_cap;
    char **keys;        // (n_kv) copies of the keys, for the duplicate check
    uint64_t n_kv;
    size_t keys_cap;
    w_tensor *t;        // (n_t)
    size_t n_t, t_cap;
    int oom;            // an allocation failed: write reports it
    char bad[256];      // first invalid argument, reported by write ("" if none)
};

sd_gguf_writer *sd_gguf_writer_new(void) { return calloc(1, sizeof(sd_gguf_writer)); }

void sd_gguf_writer_free(sd_gguf_writer *w) {
    if (!w) return;
    free(w->kv);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w);
}

static void w_bad(sd_gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void w_bad(sd_gguf_writer *w, const char *fmt, ...) {
    if (w->bad[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->bad, sizeof w->bad, fmt, ap);
    va_end(ap);
    if (!w->bad[0]) w->bad[0] = '?';
}

// Grows *buf (element size esz, capacity *cap) to hold need elements.
static int w_grow(sd_gguf_writer *w, void **buf, size_t *cap, size_t need, size_t esz) {
    if (w->oom) return -1;
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / esz) {
            w->oom = 1;
            return -1;
        }
        nc *= 2;
    }
    void *p = realloc(*buf, nc * esz);
    if (!p) {
        w->oom = 1;
        return -1;
    }
    *buf = p;
    *cap = nc;
    return 0;
}

static void w_bytes(sd_gguf_writer *w, const void *p, size_t n) {
    if (n > SIZE_MAX - w->kv_len) {
        w->oom = 1;
        return;
    }
    if (w_grow(w, (void **)&w->kv, &w->kv_cap, w->kv_len + n, 1)) return;
    if (n) memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}
static void w_le32(sd_gguf_writer *w, uint32_t v) { w_bytes(w, &v, 4); }
static void w_le64(sd_gguf_writer *w, uint64_t v) { w_bytes(w, &v, 8); }
static void w_strn(sd_gguf_writer *w, const char *s, uint64_t n) {
    w_le64(w, n);
    w_bytes(w, s, (size_t)n);
}

// Starts a kv pair: checks the key, remembers it, writes key and type.
static int w_key(sd_gguf_writer *w, const char *key, uint32_t type) {
    if (!w) return -1;
    if (!key || !*key) {
        w_bad(w, "empty or NULL key");
        return -1;
    }
    if (w->n_kv >= SIZE_MAX / sizeof(char *) ||
        w_grow(w, (void **)&w->keys, &w->keys_cap, (size_t)w->n_kv + 1, sizeof(char *)))
        return -1;
    char *k = strdup(key);
    if (!k) {
        w->oom = 1;
        return -1;
    }
    w->keys[w->n_kv++] = k;
    w_strn(w, key, strlen(key));
    w_le32(w, type);
    return w->oom ? -1 : 0;
}

void sd_gguf_w_u32(sd_gguf_writer *w, const char *key, uint32_t v) {
    if (!w_key(w, key, SD_GGUF_U32)) w_le32(w, v);
}
void sd_gguf_w_i32(sd_gguf_writer *w, const char *key, int32_t v) {
    if (!w_key(w, key, SD_GGUF_I32)) w_bytes(w, &v, 4);
}
void sd_gguf_w_f32(sd_gguf_writer *w, const char *key, float v) {
    if (!w_key(w, key, SD_GGUF_F32)) w_bytes(w, &v, 4);
}
void sd_gguf_w_bool(sd_gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    if (!w_key(w, key, SD_GGUF_BOOL)) w_bytes(w, &b, 1);
}
void sd_gguf_w_str(sd_gguf_writer *w, const char *key, const char *v) {
    if (w && !v) {
        w_bad(w, "key '%s': NULL string", key ? key : "(null)");
        return;
    }
    if (!w_key(w, key, SD_GGUF_STRING)) w_strn(w, v, strlen(v));
}

static int w_arr_head(sd_gguf_writer *w, const char *key, uint32_t at, const void *v, uint64_t n) {
    if (w && n && !v) {
        w_bad(w, "key '%s': NULL array", key ? key : "(null)");
        return -1;
    }
    if (w_key(w, key, SD_GGUF_ARRAY)) return -1;
    w_le32(w, at);
    w_le64(w, n);
    return w->oom ? -1 : 0;
}

void sd_gguf_w_arr_strn(sd_gguf_writer *w, const char *key, const char *const *v, const uint64_t *lens, uint64_t n) {
    if (w_arr_head(w, key, SD_GGUF_STRING, v, n)) return;
    for (uint64_t i = 0; i < n && !w->oom; i++) {
        uint64_t len = lens ? lens[i] : (v[i] ? strlen(v[i]) : 0);
        if (!v[i] && len) {
            w_bad(w, "key '%s': string %llu is NULL", key, (unsigned long long)i);
            len = 0;
        }
        w_strn(w, v[i] ? v[i] : "", len);
    }
}
void sd_gguf_w_arr_str(sd_gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    sd_gguf_w_arr_strn(w, key, v, NULL, n);
}
void sd_gguf_w_arr_f32(sd_gguf_writer *w, const char *key, const float *v, uint64_t n) {
    if (w_arr_head(w, key, SD_GGUF_F32, v, n)) return;
    if (n > SIZE_MAX / 4) {
        w->oom = 1;
        return;
    }
    w_bytes(w, v, (size_t)n * 4);
}
void sd_gguf_w_arr_i32(sd_gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
    if (w_arr_head(w, key, SD_GGUF_I32, v, n)) return;
    if (n > SIZE_MAX / 4) {
        w->oom = 1;
        return;
    }
    w_bytes(w, v, (size_t)n * 4);
}

void sd_gguf_w_copy(sd_gguf_writer *w, const sd_gguf_kv *kv) {
    if (!w) return;
    if (!kv) {
        w_bad(w, "copy of a NULL key");
        return;
    }
    char key[512];
    if (kv->key.len >= sizeof key) {
        w_bad(w, "copy: key of %llu bytes is too long", (unsigned long long)kv->key.len);
        return;
    }
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = 0;
    sd_gguf_w_kv_copy(w, key, kv);
}

void sd_gguf_w_kv_copy(sd_gguf_writer *w, const char *key, const sd_gguf_kv *kv) {
    if (!w) return;
    if (!kv) {
        w_bad(w, "copy of a NULL key");
        return;
    }
    if (kv->type == SD_GGUF_STRING) {
        if (!w_key(w, key, SD_GGUF_STRING)) w_strn(w, kv->strs[0].ptr, kv->strs[0].len);
        return;
    }
    if (kv->type != SD_GGUF_ARRAY) {
        size_t sz = vtype_size((uint32_t)kv->type);
        if (!sz) {
            w_bad(w, "copy of key '%s': unknown type %d", key, kv->type);
            return;
        }
        if (!w_key(w, key, (uint32_t)kv->type)) w_bytes(w, kv->data, sz);
        return;
    }
    if (kv->arr_type == SD_GGUF_STRING) {
        if (w_arr_head(w, key, SD_GGUF_STRING, kv->strs, kv->n)) return;
        for (uint64_t i = 0; i < kv->n && !w->oom; i++) w_strn(w, kv->strs[i].ptr, kv->strs[i].len);
        return;
    }
    size_t sz = vtype_size((uint32_t)kv->arr_type);
    if (!sz) {
        w_bad(w, "copy of key '%s': arrays of type %d are not copied", key, kv->arr_type);
        return;
    }
    if (kv->n > SIZE_MAX / sz) {
        w->oom = 1;
        return;
    }
    if (w_arr_head(w, key, (uint32_t)kv->arr_type, kv->data, kv->n)) return;
    w_bytes(w, kv->data, (size_t)kv->n * sz);
}

void sd_gguf_w_tensor(sd_gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data,
                      size_t nbytes) {
    if (!w) return;
    if (!name || !*name) {
        w_bad(w, "tensor with an empty or NULL name");
        return;
    }
    const sd_type_traits *tr = type < SD_TYPE_FILE_COUNT ? sd_type_get(type) : NULL;
    if (!tr || tr->tsize == 0 || tr->blck <= 0) {
        w_bad(w, "tensor '%s': unknown tensor type %d", name, type);
        return;
    }
    if (n_dims < 1 || n_dims > SD_MAX_DIMS || !ne) {
        w_bad(w, "tensor '%s': n_dims %d out of range 1..%d", name, n_dims, SD_MAX_DIMS);
        return;
    }
    w_tensor t = {.type = type, .n_dims = n_dims, .nbytes = nbytes};
    uint64_t nrows = 1;
    for (int d = 0; d < SD_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 1) {
            w_bad(w, "tensor '%s': dimension %d is %lld", name, d, (long long)t.ne[d]);
            return;
        }
        if (d > 0) {
            if (nrows > (uint64_t)INT64_MAX / (uint64_t)t.ne[d]) {
                w_bad(w, "tensor '%s': element count overflows", name);
                return;
            }
            nrows *= (uint64_t)t.ne[d];
        }
    }
    if (t.ne[0] % tr->blck) {
        w_bad(w, "tensor '%s': ne[0] = %lld is not a multiple of the block size %d", name, (long long)t.ne[0], tr->blck);
        return;
    }
    uint64_t row = (uint64_t)t.ne[0] / (uint64_t)tr->blck * tr->tsize;
    if (row > UINT64_MAX / nrows || row * nrows != nbytes) {
        w_bad(w, "tensor '%s': %zu bytes given, shape and type %s need %llu", name, nbytes, tr->name ? tr->name : "?",
              (unsigned long long)(row > UINT64_MAX / nrows ? 0 : row * nrows));
        return;
    }
    if (nbytes && !data) {
        w_bad(w, "tensor '%s': NULL data", name);
        return;
    }
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) {
            w_bad(w, "duplicate tensor name '%s'", name);
            return;
        }
    if (w_grow(w, (void **)&w->t, &w->t_cap, w->n_t + 1, sizeof *w->t)) return;
    t.name = strdup(name);
    t.data = malloc(nbytes ? nbytes : 1);
    if (!t.name || !t.data) {
        free(t.name);
        free(t.data);
        w->oom = 1;
        return;
    }
    if (nbytes) memcpy(t.data, data, nbytes);
    w->t[w->n_t++] = t;
}

static int put(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1; }
static int put_pad(FILE *f, uint64_t pos) {
    static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
    size_t pad = (size_t)((GGUF_DEFAULT_ALIGNMENT - pos % GGUF_DEFAULT_ALIGNMENT) % GGUF_DEFAULT_ALIGNMENT);
    return put(f, zeros, pad);
}

int sd_gguf_writer_write(sd_gguf_writer *w, const char *path, char *err, size_t errlen) {
    if (!w || !path) return sd_err(err, errlen, "sd_gguf_writer_write: NULL argument");
    if (w->oom) return sd_err(err, errlen, "%s: out of memory while building the GGUF file", path);
    if (w->bad[0]) return sd_err(err, errlen, "%s: %s", path, w->bad);
    for (uint64_t i = 0; i < w->n_kv; i++)
        for (uint64_t j = 0; j < i; j++)
            if (!strcmp(w->keys[i], w->keys[j])) return sd_err(err, errlen, "%s: duplicate key '%s'", path, w->keys[i]);

    FILE *f = fopen(path, "wb");
    if (!f) return sd_err(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    uint32_t version = 3;
    uint64_t n_t = w->n_t;
    int bad = put(f, "GGUF", 4) || put(f, &version, 4) || put(f, &n_t, 8) || put(f, &w->n_kv, 8) ||
              put(f, w->kv, w->kv_len);
    uint64_t pos = 24 + (uint64_t)w->kv_len, off = 0;
    for (size_t i = 0; i < w->n_t && !bad; i++) {
        const w_tensor *t = &w->t[i];
        uint64_t len = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims, ty = (uint32_t)t->type;
        off += (GGUF_DEFAULT_ALIGNMENT - off % GGUF_DEFAULT_ALIGNMENT) % GGUF_DEFAULT_ALIGNMENT;
        bad = put(f, &len, 8) || put(f, t->name, (size_t)len) || put(f, &nd, 4) ||
              put(f, t->ne, 8 * (size_t)t->n_dims) || put(f, &ty, 4) || put(f, &off, 8);
        pos += 8 + len + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
        off += t->nbytes;
    }
    if (!bad && w->n_t) bad = put_pad(f, pos);
    off = 0;
    for (size_t i = 0; i < w->n_t && !bad; i++) {
        bad = put_pad(f, off) || put(f, w->t[i].data, w->t[i].nbytes);
        off += (GGUF_DEFAULT_ALIGNMENT - off % GGUF_DEFAULT_ALIGNMENT) % GGUF_DEFAULT_ALIGNMENT + w->t[i].nbytes;
    }
    int e = errno;
    if (fclose(f)) bad = 1, e = errno;
    if (bad) {
        remove(path);
        return sd_err(err, errlen, "%s: write failed: %s", path, strerror(e));
    }
    return 0;
}

void sd_gguf_w_arr_u8(sd_gguf_writer *w, const char *key, const void *v, uint64_t n) {
    if (w_arr_head(w, key, SD_GGUF_U8, v, n)) return;
    w_bytes(w, v, (size_t)n);
}
