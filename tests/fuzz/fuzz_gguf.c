// fuzz_gguf.c - libFuzzer target for the GGUF reader (make fuzz).
// Every input either fails with a non-empty message or loads; a loaded file
// is walked completely (keys, strings, arrays, tensor bytes, getters) so that
// the sanitizers see any read the validation should have prevented.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n) {
    if (!n) return;
    const uint8_t *b = p;
    sink ^= b[0];
    sink ^= b[n - 1];
}

static size_t elem_size(int t) {
    switch (t) {
    case SD_GGUF_U8: case SD_GGUF_I8: case SD_GGUF_BOOL: return 1;
    case SD_GGUF_U16: case SD_GGUF_I16: return 2;
    case SD_GGUF_U32: case SD_GGUF_I32: case SD_GGUF_F32: return 4;
    case SD_GGUF_U64: case SD_GGUF_I64: case SD_GGUF_F64: return 8;
    default: return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sd_gguf *g = NULL;
    char err[256];
    err[0] = 0;
    if (sd_gguf_open_mem(&g, data, size, err, sizeof err) != 0) {
        if (!err[0] || g) abort(); // an error must come with a message and no object
        return 0;
    }
    char key[128], msg[256];
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const sd_gguf_kv *kv = &g->kv[i];
        if (kv->key.len == 0) abort();
        touch(kv->key.ptr, kv->key.len);
        if (kv->type == SD_GGUF_STRING || (kv->type == SD_GGUF_ARRAY && kv->arr_type == SD_GGUF_STRING)) {
            if (!kv->strs) abort();
            for (uint64_t j = 0; j < kv->n; j++) touch(kv->strs[j].ptr, kv->strs[j].len);
        } else if (kv->type == SD_GGUF_ARRAY) {
            touch(kv->data, kv->n * elem_size(kv->arr_type));
            if (kv->n) {
                sink ^= (uint8_t)sd_gguf_arr_i64(kv, kv->n - 1);
                float f0 = sd_gguf_arr_f32(kv, 0);
                sink ^= (uint8_t)(f0 == f0);
            }
        } else {
            touch(kv->data, elem_size(kv->type));
        }
        // Getters by name (keys with NUL bytes or too long cannot be named).
        if (kv->key.len < sizeof key && !memchr(kv->key.ptr, 0, kv->key.len)) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = 0;
            if (sd_gguf_find_key(g, key) != kv) abort();
            uint32_t u;
            int64_t i64;
            float f;
            int b;
            sd_str s;
            int r = sd_gguf_get_u32(g, key, &u, msg, sizeof msg);
            r |= sd_gguf_get_i64(g, key, &i64, msg, sizeof msg);
            r |= sd_gguf_get_f32(g, key, &f, msg, sizeof msg);
            r |= sd_gguf_get_bool(g, key, &b, msg, sizeof msg);
            if (sd_gguf_get_str(g, key, &s, msg, sizeof msg) == 0) touch(s.ptr, s.len);
            sink ^= (uint8_t)r;
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const sd_tensor *t = &g->tensors[i];
        touch(t->name.ptr, t->name.len);
        if (t->nbytes == 0 || !t->data) abort();
        touch(t->data, t->nbytes);
        if (t->name.len < sizeof key && !memchr(t->name.ptr, 0, t->name.len)) {
            memcpy(key, t->name.ptr, t->name.len);
            key[t->name.len] = 0;
            if (sd_gguf_find_tensor(g, key) != t) abort();
        }
    }
    sd_gguf_close(g);
    return 0;
}
