// gguf_impl.h - private to the GGUF files (gguf.c: open and validate;
// gguf_get.c: lookups and typed getters; gguf_write.c: the writer): the
// reader's state behind sd_gguf, its name index, and small helpers on value
// types and names.
#ifndef SD_GGUF_IMPL_H
#define SD_GGUF_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF code reads and writes little-endian values with memcpy: port it before building on a big-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32

// ---------------------------------------------------------------- helpers

static inline const char *vtype_name(uint32_t t) {
    static const char *names[] = {"u8",  "i8",  "u16",    "i16",   "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof *names ? names[t] : "unknown";
}

// Bytes of a fixed-size value type; 0 for string, array and unknown types.
static inline size_t vtype_size(uint32_t t) {
    switch (t) {
    case SD_GGUF_U8: case SD_GGUF_I8: case SD_GGUF_BOOL: return 1;
    case SD_GGUF_U16: case SD_GGUF_I16: return 2;
    case SD_GGUF_U32: case SD_GGUF_I32: case SD_GGUF_F32: return 4;
    case SD_GGUF_U64: case SD_GGUF_I64: case SD_GGUF_F64: return 8;
    default: return 0;
    }
}

static inline int vtype_is_int(int t) {
    return t == SD_GGUF_U8 || t == SD_GGUF_I8 || t == SD_GGUF_U16 || t == SD_GGUF_I16 ||
           t == SD_GGUF_U32 || t == SD_GGUF_I32 || t == SD_GGUF_U64 || t == SD_GGUF_I64;
}

// Printable, bounded copy of a name from the file for error messages:
// non-printable bytes become '?', long names are cut with "...".
#define PNAME_MAX 96
static inline const char *pname(sd_str s, char buf[PNAME_MAX]) {
    size_t n = s.len < PNAME_MAX - 4 ? (size_t)s.len : PNAME_MAX - 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (n < s.len) {
        memcpy(buf + n, "...", 4);
    } else {
        buf[n] = 0;
    }
    return buf;
}

static inline uint64_t fnv1a(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static inline int str_same(sd_str a, sd_str b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, (size_t)a.len) == 0);
}

// ---------------------------------------------------------------- index

// Open-addressing hash index of names (kv keys or tensor names); slots hold
// entry index + 1, 0 = empty.
typedef struct {
    uint32_t *slots; // (mask + 1)
    uint64_t mask;
} name_index;

// Position of name in the index: the slot holding it, or the empty slot
// where it would go. name_at(i) gives the name of entry i.
typedef sd_str (*name_at_fn)(const sd_gguf *g, uint32_t i);
static inline uint64_t index_slot(const name_index *ix, const sd_gguf *g, name_at_fn name_at, sd_str name) {
    uint64_t h = fnv1a(name.ptr, name.len) & ix->mask;
    while (ix->slots[h] && !str_same(name_at(g, ix->slots[h] - 1), name)) h = (h + 1) & ix->mask;
    return h;
}

static inline sd_str kv_name(const sd_gguf *g, uint32_t i) { return g->kv[i].key; }
static inline sd_str tensor_name(const sd_gguf *g, uint32_t i) { return g->tensors[i].name; }

typedef struct {
    sd_gguf g;           // public part; first member so sd_gguf * casts back
    name_index kv_ix;    // over g.kv
    name_index t_ix;     // over g.tensors
} gguf_impl;

#endif
