// gguf_get.c - lookups in an open GGUF file: keys and tensors by name
// (through the index built at open), typed getters that convert any
// compatible value type and name the key in their errors, and numeric array
// elements.
#include "model/gguf_impl.h"

#include <limits.h>
#include <string.h>

#include "common.h"

static sd_str cstr(const char *s) { return (sd_str){strlen(s), s}; }

const sd_gguf_kv *sd_gguf_find_key(const sd_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    const gguf_impl *im = (const gguf_impl *)g;
    uint64_t s = index_slot(&im->kv_ix, g, kv_name, cstr(key));
    return im->kv_ix.slots[s] ? &g->kv[im->kv_ix.slots[s] - 1] : NULL;
}

const sd_tensor *sd_gguf_find_tensor(const sd_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    const gguf_impl *im = (const gguf_impl *)g;
    uint64_t s = index_slot(&im->t_ix, g, tensor_name, cstr(name));
    return im->t_ix.slots[s] ? &g->tensors[im->t_ix.slots[s] - 1] : NULL;
}

int sd_str_eq(sd_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

// Integer value of element i of a numeric value (type t at p): exactly one of
// *u (unsigned types, *is_u = 1) or *s (signed types) is set.
static void int_at(int t, const void *p, uint64_t i, uint64_t *u, int64_t *s, int *is_u) {
    const uint8_t *b = (const uint8_t *)p + i * vtype_size((uint32_t)t);
    *is_u = 0;
    switch (t) {
    case SD_GGUF_U8: { uint8_t v; memcpy(&v, b, 1); *u = v; *is_u = 1; break; }
    case SD_GGUF_BOOL: { uint8_t v; memcpy(&v, b, 1); *u = v; *is_u = 1; break; }
    case SD_GGUF_I8: { int8_t v; memcpy(&v, b, 1); *s = v; break; }
    case SD_GGUF_U16: { uint16_t v; memcpy(&v, b, 2); *u = v; *is_u = 1; break; }
    case SD_GGUF_I16: { int16_t v; memcpy(&v, b, 2); *s = v; break; }
    case SD_GGUF_U32: { uint32_t v; memcpy(&v, b, 4); *u = v; *is_u = 1; break; }
    case SD_GGUF_I32: { int32_t v; memcpy(&v, b, 4); *s = v; break; }
    case SD_GGUF_U64: { uint64_t v; memcpy(&v, b, 8); *u = v; *is_u = 1; break; }
    case SD_GGUF_I64: { int64_t v; memcpy(&v, b, 8); *s = v; break; }
    default: *s = 0; break;
    }
}

static double num_at(int t, const void *p, uint64_t i) {
    const uint8_t *b = (const uint8_t *)p + i * vtype_size((uint32_t)t);
    if (t == SD_GGUF_F32) { float v; memcpy(&v, b, 4); return v; }
    if (t == SD_GGUF_F64) { double v; memcpy(&v, b, 8); return v; }
    uint64_t u = 0;
    int64_t s = 0;
    int is_u;
    int_at(t, p, i, &u, &s, &is_u);
    return is_u ? (double)u : (double)s;
}

static int type_error(const sd_gguf_kv *kv, const char *want, char *err, size_t errlen) {
    char nb[PNAME_MAX];
    if (kv->type == SD_GGUF_ARRAY)
        return sd_err(err, errlen, "key '%s': expected %s, found array of %s", pname(kv->key, nb), want,
                      vtype_name((uint32_t)kv->arr_type));
    return sd_err(err, errlen, "key '%s': expected %s, found %s", pname(kv->key, nb), want,
                  vtype_name((uint32_t)kv->type));
}

int sd_gguf_get_u32(const sd_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen) {
    const sd_gguf_kv *kv = sd_gguf_find_key(g, key);
    if (!kv) return 1;
    if (!vtype_is_int(kv->type)) return type_error(kv, "an integer", err, errlen);
    uint64_t u = 0;
    int64_t s = 0;
    int is_u;
    int_at(kv->type, kv->data, 0, &u, &s, &is_u);
    if (is_u ? u > UINT32_MAX : (s < 0 || s > (int64_t)UINT32_MAX)) {
        char nb[PNAME_MAX];
        if (is_u)
            return sd_err(err, errlen, "key '%s': value %llu does not fit in u32", pname(kv->key, nb), (unsigned long long)u);
        return sd_err(err, errlen, "key '%s': value %lld does not fit in u32", pname(kv->key, nb), (long long)s);
    }
    *out = is_u ? (uint32_t)u : (uint32_t)s;
    return 0;
}

int sd_gguf_get_i64(const sd_gguf *g, const char *key, int64_t *out, char *err, size_t errlen) {
    const sd_gguf_kv *kv = sd_gguf_find_key(g, key);
    if (!kv) return 1;
    if (!vtype_is_int(kv->type)) return type_error(kv, "an integer", err, errlen);
    uint64_t u = 0;
    int64_t s = 0;
    int is_u;
    int_at(kv->type, kv->data, 0, &u, &s, &is_u);
    if (is_u && u > (uint64_t)INT64_MAX) {
        char nb[PNAME_MAX];
        return sd_err(err, errlen, "key '%s': value %llu does not fit in i64", pname(kv->key, nb), (unsigned long long)u);
    }
    *out = is_u ? (int64_t)u : s;
    return 0;
}

int sd_gguf_get_f32(const sd_gguf *g, const char *key, float *out, char *err, size_t errlen) {
    const sd_gguf_kv *kv = sd_gguf_find_key(g, key);
    if (!kv) return 1;
    if (kv->type != SD_GGUF_F32 && kv->type != SD_GGUF_F64 && !vtype_is_int(kv->type))
        return type_error(kv, "a number", err, errlen);
    *out = (float)num_at(kv->type, kv->data, 0);
    return 0;
}

int sd_gguf_get_bool(const sd_gguf *g, const char *key, int *out, char *err, size_t errlen) {
    const sd_gguf_kv *kv = sd_gguf_find_key(g, key);
    if (!kv) return 1;
    if (kv->type != SD_GGUF_BOOL) return type_error(kv, "bool", err, errlen);
    *out = *(const uint8_t *)kv->data != 0;
    return 0;
}

int sd_gguf_get_str(const sd_gguf *g, const char *key, sd_str *out, char *err, size_t errlen) {
    const sd_gguf_kv *kv = sd_gguf_find_key(g, key);
    if (!kv) return 1;
    if (kv->type != SD_GGUF_STRING) return type_error(kv, "string", err, errlen);
    *out = kv->strs[0];
    return 0;
}

float sd_gguf_arr_f32(const sd_gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != SD_GGUF_ARRAY || i >= kv->n || !vtype_size((uint32_t)kv->arr_type)) return 0.0f;
    return (float)num_at(kv->arr_type, kv->data, i);
}

int64_t sd_gguf_arr_i64(const sd_gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != SD_GGUF_ARRAY || i >= kv->n || !vtype_size((uint32_t)kv->arr_type)) return 0;
    if (kv->arr_type == SD_GGUF_F32 || kv->arr_type == SD_GGUF_F64) {
        double d = num_at(kv->arr_type, kv->data, i);
        if (!(d == d)) return 0;
        if (d >= 9.2233720368547758e18) return INT64_MAX;
        if (d <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)d;
    }
    uint64_t u = 0;
    int64_t s = 0;
    int is_u;
    int_at(kv->arr_type, kv->data, i, &u, &s, &is_u);
    if (is_u) return u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
    return s;
}
