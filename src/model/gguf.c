// gguf.c - GGUF v2/v3 reader (fully validated, zero-copy over an mmap or a
// caller buffer) and a small v3 writer.
//
// File layout (little endian):
//   "GGUF" u32 version u64 n_tensors u64 n_kv
//   n_kv x { string key, u32 type, value }
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
//   padding to `alignment`, then the data section (tensor offsets are relative
//   to its start and multiples of `alignment`).
// A string is u64 length + bytes (no NUL); an array value is u32 element type,
// u64 count, then the elements.
//
// Validation strategy: every read goes through a bounds-checked cursor; every
// count is compared with the bytes left before anything is allocated for it,
// so allocations are at most a small multiple of the file size. After a
// successful open callers may trust every pointer, length and shape.
//
// What kv.data points to: the value for scalars; the characters for a single
// string (same as strs[0].ptr); the first element for numeric arrays; the
// first element's u64 length prefix for string arrays (use strs instead).
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "kernels/quant.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads and writes little-endian values with memcpy: port it before building on a big-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32
// Smallest encodings, used to bound counts by the bytes left in the file:
// a kv is a key (u64 length + at least 1 byte), a u32 type and at least a
// 1-byte value; a tensor info is a name (u64 + 1), u32 n_dims, one u64 ne,
// u32 type and u64 offset.
#define KV_MIN_BYTES 14u
#define TI_MIN_BYTES 33u
#define MAX_COUNT (1ull << 31) // keeps indices in uint32 hash slots

// ---------------------------------------------------------------- helpers

static const char *vtype_name(uint32_t t) {
    static const char *names[] = {"u8",  "i8",  "u16",    "i16",   "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof *names ? names[t] : "unknown";
}

// Bytes of a fixed-size value type; 0 for string, array and unknown types.
static size_t vtype_size(uint32_t t) {
    switch (t) {
    case SD_GGUF_U8: case SD_GGUF_I8: case SD_GGUF_BOOL: return 1;
    case SD_GGUF_U16: case SD_GGUF_I16: return 2;
    case SD_GGUF_U32: case SD_GGUF_I32: case SD_GGUF_F32: return 4;
    case SD_GGUF_U64: case SD_GGUF_I64: case SD_GGUF_F64: return 8;
    default: return 0;
    }
}

static int vtype_is_int(int t) {
    return t == SD_GGUF_U8 || t == SD_GGUF_I8 || t == SD_GGUF_U16 || t == SD_GGUF_I16 ||
           t == SD_GGUF_U32 || t == SD_GGUF_I32 || t == SD_GGUF_U64 || t == SD_GGUF_I64;
}

// Printable, bounded copy of a name from the file for error messages:
// non-printable bytes become '?', long names are cut with "...".
#define PNAME_MAX 96
static const char *pname(sd_str s, char buf[PNAME_MAX]) {
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

static uint64_t fnv1a(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static int str_same(sd_str a, sd_str b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, (size_t)a.len) == 0);
}

// Bounds-checked reader over the file bytes.
typedef struct {
    const uint8_t *p; // file start
    size_t size;      // file bytes
    size_t pos;       // next byte to read
} cursor;

static size_t cur_left(const cursor *c) { return c->size - c->pos; }

static int cur_read(cursor *c, void *dst, size_t n) {
    if (cur_left(c) < n) return -1;
    memcpy(dst, c->p + c->pos, n);
    c->pos += n;
    return 0;
}
static int cur_u32(cursor *c, uint32_t *v) { return cur_read(c, v, 4); }
static int cur_u64(cursor *c, uint64_t *v) { return cur_read(c, v, 8); }

// Reads a string. Returns 0, -1 if the length field is truncated, -2 if the
// bytes run past the end (*len_out holds the length read).
static int cur_str(cursor *c, sd_str *s, uint64_t *len_out) {
    uint64_t len;
    if (cur_u64(c, &len)) return -1;
    *len_out = len;
    if (len > cur_left(c)) return -2;
    s->len = len;
    s->ptr = (const char *)(c->p + c->pos);
    c->pos += (size_t)len;
    return 0;
}

// ---------------------------------------------------------------- index

// Open-addressing hash index of names (kv keys or tensor names); slots hold
// entry index + 1, 0 = empty.
typedef struct {
    uint32_t *slots; // (mask + 1)
    uint64_t mask;
} name_index;

static int index_init(name_index *ix, uint64_t n) {
    uint64_t cap = 8;
    while (cap < 2 * n) cap <<= 1;
    ix->slots = calloc((size_t)cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : -1;
}

// Position of name in the index: the slot holding it, or the empty slot
// where it would go. name_at(i) gives the name of entry i.
typedef sd_str (*name_at_fn)(const sd_gguf *g, uint32_t i);
static uint64_t index_slot(const name_index *ix, const sd_gguf *g, name_at_fn name_at, sd_str name) {
    uint64_t h = fnv1a(name.ptr, name.len) & ix->mask;
    while (ix->slots[h] && !str_same(name_at(g, ix->slots[h] - 1), name)) h = (h + 1) & ix->mask;
    return h;
}

static sd_str kv_name(const sd_gguf *g, uint32_t i) { return g->kv[i].key; }
static sd_str tensor_name(const sd_gguf *g, uint32_t i) { return g->tensors[i].name; }

typedef struct {
    sd_gguf g;           // public part; first member so sd_gguf * casts back
    name_index kv_ix;    // over g.kv
    name_index t_ix;     // over g.tensors
} gguf_impl;

// ---------------------------------------------------------------- reader

static int parse_kv(sd_gguf *g, cursor *c, uint64_t i, name_index *ix, char *err, size_t errlen) {
    sd_gguf_kv *kv = &g->kv[i];
    char nb[PNAME_MAX];
    size_t at = c->pos;
    uint64_t len = 0;
    int r = cur_str(c, &kv->key, &len);
    if (r == -1)
        return sd_err(err, errlen, "kv #%llu (file offset %zu): truncated key length", (unsigned long long)i, at);
    if (r == -2)
        return sd_err(err, errlen, "kv #%llu (file offset %zu): key length %llu extends past end of file (size %zu)",
                      (unsigned long long)i, at, (unsigned long long)len, c->size);
    if (kv->key.len == 0)
        return sd_err(err, errlen, "kv #%llu (file offset %zu): empty key name", (unsigned long long)i, at);
    const char *kn = pname(kv->key, nb);

    uint64_t slot = index_slot(ix, g, kv_name, kv->key);
    if (ix->slots[slot])
        return sd_err(err, errlen, "duplicate key '%s' (kv #%u and #%llu)", kn, ix->slots[slot] - 1,
                      (unsigned long long)i);
    ix->slots[slot] = (uint32_t)i + 1;

    uint32_t type;
    if (cur_u32(c, &type)) return sd_err(err, errlen, "key '%s': truncated value type", kn);
    if (type > SD_GGUF_F64) return sd_err(err, errlen, "key '%s': unknown value type %u", kn, type);
    kv->type = (int)type;
    kv->arr_type = 0;
    kv->n = 1;

    if (type == SD_GGUF_STRING) {
        sd_str s;
        at = c->pos;
        r = cur_str(c, &s, &len);
        if (r == -1) return sd_err(err, errlen, "key '%s': truncated string length", kn);
        if (r == -2)
            return sd_err(err, errlen, "key '%s': string length %llu extends past end of file (size %zu)", kn,
                          (unsigned long long)len, c->size);
        kv->strs = malloc(sizeof *kv->strs);
        if (!kv->strs) return sd_err(err, errlen, "key '%s': out of memory", kn);
        kv->strs[0] = s;
        kv->data = s.ptr;
        return 0;
    }
    if (type != SD_GGUF_ARRAY) {
        size_t sz = vtype_size(type);
        if (cur_left(c) < sz)
            return sd_err(err, errlen, "key '%s': %s value extends past end of file (size %zu)", kn, vtype_name(type),
                          c->size);
        kv->data = c->p + c->pos;
        c->pos += sz;
        return 0;
    }

    uint32_t at_type;
    uint64_t n;
    if (cur_u32(c, &at_type)) return sd_err(err, errlen, "key '%s': truncated array element type", kn);
    if (cur_u64(c, &n)) return sd_err(err, errlen, "key '%s': truncated array length", kn);
    if (at_type == SD_GGUF_ARRAY)
        return sd_err(err, errlen, "key '%s': arrays of arrays are not supported", kn);
    if (at_type > SD_GGUF_F64) return sd_err(err, errlen, "key '%s': unknown array element type %u", kn, at_type);
    kv->arr_type = (int)at_type;
    kv->n = n;
    kv->data = c->p + c->pos;
    if (at_type != SD_GGUF_STRING) {
        size_t sz = vtype_size(at_type);
        if (n > cur_left(c) / sz)
            return sd_err(err, errlen, "key '%s': array of %llu %s elements extends past end of file (size %zu)", kn,
                          (unsigned long long)n, vtype_name(at_type), c->size);
        c->pos += (size_t)n * sz;
        return 0;
    }
    // Each string element takes at least its 8-byte length.
    if (n > cur_left(c) / 8)
        return sd_err(err, errlen, "key '%s': array of %llu strings extends past end of file (size %zu)", kn,
                      (unsigned long long)n, c->size);
    kv->strs = malloc((size_t)(n ? n : 1) * sizeof *kv->strs);
    if (!kv->strs) return sd_err(err, errlen, "key '%s': out of memory for %llu strings", kn, (unsigned long long)n);
    for (uint64_t j = 0; j < n; j++) {
        r = cur_str(c, &kv->strs[j], &len);
        if (r == -1)
            return sd_err(err, errlen, "key '%s': string %llu of %llu: truncated length", kn, (unsigned long long)j,
                          (unsigned long long)n);
        if (r == -2)
            return sd_err(err, errlen, "key '%s': string %llu of %llu: length %llu extends past end of file (size %zu)",
                          kn, (unsigned long long)j, (unsigned long long)n, (unsigned long long)len, c->size);
    }
    return 0;
}

static int parse_tensor_info(sd_gguf *g, cursor *c, uint64_t i, name_index *ix, char *err, size_t errlen) {
    sd_tensor *t = &g->tensors[i];
    char nb[PNAME_MAX];
    size_t at = c->pos;
    uint64_t len = 0;
    int r = cur_str(c, &t->name, &len);
    if (r == -1)
        return sd_err(err, errlen, "tensor #%llu (file offset %zu): truncated name length", (unsigned long long)i, at);
    if (r == -2)
        return sd_err(err, errlen, "tensor #%llu (file offset %zu): name length %llu extends past end of file (size %zu)",
                      (unsigned long long)i, at, (unsigned long long)len, c->size);
    if (t->name.len == 0)
        return sd_err(err, errlen, "tensor #%llu (file offset %zu): empty tensor name", (unsigned long long)i, at);
    const char *tn = pname(t->name, nb);

    uint64_t slot = index_slot(ix, g, tensor_name, t->name);
    if (ix->slots[slot])
        return sd_err(err, errlen, "duplicate tensor name '%s' (tensors #%u and #%llu)", tn, ix->slots[slot] - 1,
                      (unsigned long long)i);
    ix->slots[slot] = (uint32_t)i + 1;

    uint32_t n_dims;
    if (cur_u32(c, &n_dims)) return sd_err(err, errlen, "tensor '%s': truncated n_dims", tn);
    if (n_dims < 1 || n_dims > SD_MAX_DIMS)
        return sd_err(err, errlen, "tensor '%s': n_dims %u out of range 1..%d", tn, n_dims, SD_MAX_DIMS);
    t->n_dims = (int)n_dims;
    uint64_t nelem = 1;
    for (int d = 0; d < SD_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if ((uint32_t)d < n_dims) {
            if (cur_u64(c, &ne)) return sd_err(err, errlen, "tensor '%s': truncated dimension %d", tn, d);
            if (ne == 0) return sd_err(err, errlen, "tensor '%s': dimension %d is 0", tn, d);
            if (ne > (uint64_t)INT64_MAX)
                return sd_err(err, errlen, "tensor '%s': dimension %d is negative (%lld)", tn, d, (long long)ne);
            if (nelem > (uint64_t)INT64_MAX / ne)
                return sd_err(err, errlen, "tensor '%s': element count overflows at dimension %d (ne = %llu)", tn, d,
                              (unsigned long long)ne);
            nelem *= ne;
        }
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type;
    if (cur_u32(c, &type)) return sd_err(err, errlen, "tensor '%s': truncated type", tn);
    const sd_type_traits *tr = type < SD_TYPE_FILE_COUNT ? sd_type_get((int)type) : NULL;
    if (!tr || tr->tsize == 0 || tr->blck <= 0)
        return sd_err(err, errlen, "tensor '%s': unknown tensor type %u", tn, type);
    t->type = (int)type;
    if (t->ne[0] % tr->blck)
        return sd_err(err, errlen, "tensor '%s': ne[0] = %lld is not a multiple of the block size %d of type %s", tn,
                      (long long)t->ne[0], tr->blck, tr->name ? tr->name : "?");
    uint64_t nblk = (uint64_t)t->ne[0] / (uint64_t)tr->blck;
    uint64_t nrows = nelem / (uint64_t)t->ne[0];
    if (nblk > SIZE_MAX / tr->tsize || nblk * tr->tsize > SIZE_MAX / nrows)
        return sd_err(err, errlen, "tensor '%s': byte size overflows", tn);
    t->nbytes = (size_t)(nblk * tr->tsize * nrows);
    if (cur_u64(c, &t->offset)) return sd_err(err, errlen, "tensor '%s': truncated data offset", tn);
    if (t->offset % g->alignment)
        return sd_err(err, errlen, "tensor '%s': data offset %llu is not a multiple of the alignment %llu", tn,
                      (unsigned long long)t->offset, (unsigned long long)g->alignment);
    return 0;
}

typedef struct {
    uint64_t off, end; // data section range
    uint64_t i;        // tensor index
} extent;

static int extent_cmp(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : (x->i > y->i) - (x->i < y->i);
}

static int parse(gguf_impl *im, char *err, size_t errlen) {
    sd_gguf *g = &im->g;
    cursor c = {g->base, g->size, 0};
    char nb[PNAME_MAX], nb2[PNAME_MAX];
    uint8_t magic[4];
    if (g->size < 24)
        return sd_err(err, errlen, "file too small for a GGUF header (%zu bytes, need 24)", g->size);
    cur_read(&c, magic, 4);
    if (memcmp(magic, "GGUF", 4))
        return sd_err(err, errlen, "bad magic %02x %02x %02x %02x (not a GGUF file)", magic[0], magic[1], magic[2],
                      magic[3]);
    cur_u32(&c, &g->version);
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        uint32_t sw = (v >> 24) | ((v >> 8) & 0xff00) | ((v << 8) & 0xff0000) | (v << 24);
        if (sw >= 1 && sw <= 3)
            return sd_err(err, errlen, "big-endian GGUF file (version %u byte-swapped) is not supported", sw);
        if (v == 1)
            return sd_err(err, errlen, "unsupported GGUF version 1 (32-bit counts); only versions 2 and 3 are supported");
        return sd_err(err, errlen, "unsupported GGUF version %u (only versions 2 and 3 are supported)", v);
    }
    cur_u64(&c, &g->n_tensors);
    cur_u64(&c, &g->n_kv);
    size_t left = cur_left(&c);
    if (g->n_kv > left / KV_MIN_BYTES || g->n_kv > MAX_COUNT)
        return sd_err(err, errlen, "kv count %llu is impossible for a file of %zu bytes", (unsigned long long)g->n_kv,
                      g->size);
    if (g->n_tensors > left / TI_MIN_BYTES || g->n_tensors > MAX_COUNT)
        return sd_err(err, errlen, "tensor count %llu is impossible for a file of %zu bytes",
                      (unsigned long long)g->n_tensors, g->size);
    if (g->n_kv * KV_MIN_BYTES + g->n_tensors * TI_MIN_BYTES > left)
        return sd_err(err, errlen, "%llu kv pairs and %llu tensors cannot fit in a file of %zu bytes",
                      (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, g->size);

    g->kv = calloc((size_t)(g->n_kv ? g->n_kv : 1), sizeof *g->kv);
    g->tensors = calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *g->tensors);
    if (!g->kv || !g->tensors || index_init(&im->kv_ix, g->n_kv) || index_init(&im->t_ix, g->n_tensors))
        return sd_err(err, errlen, "out of memory for %llu kv pairs and %llu tensors", (unsigned long long)g->n_kv,
                      (unsigned long long)g->n_tensors);

    for (uint64_t i = 0; i < g->n_kv; i++)
        if (parse_kv(g, &c, i, &im->kv_ix, err, errlen)) return -1;

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const sd_gguf_kv *ak = sd_gguf_find_key(g, "general.alignment");
    if (ak) {
        uint32_t a;
        if (ak->type != SD_GGUF_U32)
            return sd_err(err, errlen, "key 'general.alignment': must be of type u32, found %s", vtype_name((uint32_t)ak->type));
        memcpy(&a, ak->data, 4);
        if (a == 0 || (a & (a - 1)))
            return sd_err(err, errlen, "key 'general.alignment': value %u is not a non-zero power of two", a);
        g->alignment = a;
    }

    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (parse_tensor_info(g, &c, i, &im->t_ix, err, errlen)) return -1;

    // Data section: starts at the next multiple of the alignment.
    size_t pad = (size_t)((g->alignment - c.pos % g->alignment) % g->alignment);
    if (g->n_tensors == 0) return 0; // nothing to place; a missing data section is fine
    if (pad > cur_left(&c))
        return sd_err(err, errlen, "data section (file offset %zu) starts past end of file (size %zu)", c.pos + pad,
                      g->size);
    size_t data_start = c.pos + pad;
    uint64_t data_size = g->size - data_start;

    extent *ex = malloc((size_t)g->n_tensors * sizeof *ex);
    if (!ex) return sd_err(err, errlen, "out of memory for %llu tensor extents", (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        sd_tensor *t = &g->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            int rc = sd_err(err, errlen,
                            "tensor '%s': data [offset %llu (file offset %llu), %zu bytes] extends past end of file "
                            "(size %zu)",
                            pname(t->name, nb), (unsigned long long)t->offset,
                            (unsigned long long)(t->offset > UINT64_MAX - data_start ? UINT64_MAX : t->offset + data_start),
                            t->nbytes, g->size);
            free(ex);
            return rc;
        }
        t->data = g->base + data_start + t->offset;
        ex[i] = (extent){t->offset, t->offset + t->nbytes, i};
    }
    qsort(ex, (size_t)g->n_tensors, sizeof *ex, extent_cmp);
    for (uint64_t i = 0; i + 1 < g->n_tensors; i++) {
        if (ex[i].end > ex[i + 1].off) {
            const sd_tensor *a = &g->tensors[ex[i].i], *b = &g->tensors[ex[i + 1].i];
            int rc = sd_err(err, errlen, "tensors '%s' [offset %llu, %zu bytes] and '%s' [offset %llu, %zu bytes] overlap",
                            pname(a->name, nb), (unsigned long long)a->offset, a->nbytes, pname(b->name, nb2),
                            (unsigned long long)b->offset, b->nbytes);
            free(ex);
            return rc;
        }
    }
    free(ex);
    return 0;
}

static int open_impl(sd_gguf **out, const void *buf, size_t size, int mapped, char *err, size_t errlen) {
    *out = NULL;
    gguf_impl *im = calloc(1, sizeof *im);
    if (!im) return sd_err(err, errlen, "out of memory");
    im->g.base = buf;
    im->g.size = size;
    im->g.mapped = mapped;
    if (parse(im, err, errlen)) {
        im->g.mapped = 0; // the caller unmaps on failure
        sd_gguf_close(&im->g);
        return -1;
    }
    *out = &im->g;
    return 0;
}

int sd_gguf_open_mem(sd_gguf **out, const void *buf, size_t size, char *err, size_t errlen) {
    if (!out) return sd_err(err, errlen, "sd_gguf_open_mem: out is NULL");
    *out = NULL;
    if (!buf && size) return sd_err(err, errlen, "sd_gguf_open_mem: buffer is NULL");
    return open_impl(out, buf ? buf : "", size, 0, err, errlen);
}

int sd_gguf_open(sd_gguf **out, const char *path, char *err, size_t errlen) {
    if (!out || !path) return sd_err(err, errlen, "sd_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sd_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return sd_err(err, errlen, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return sd_err(err, errlen, "%s: file too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0); // every weight is read at load (repacking) or per token: fault the file in at once
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return sd_err(err, errlen, "%s: mmap failed: %s", path, strerror(e));
        }
    }
    close(fd);
    char msg[512];
    msg[0] = 0;
    if (open_impl(out, map ? map : "", size, map != NULL, msg, sizeof msg)) {
        if (map) munmap(map, size);
        return sd_err(err, errlen, "%s: %s", path, msg);
    }
    return 0;
}

void sd_gguf_close(sd_gguf *g) {
    if (!g) return;
    gguf_impl *im = (gguf_impl *)g;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv);
    free(g->tensors);
    free(im->kv_ix.slots);
    free(im->t_ix.slots);
    if (g->mapped && g->size) munmap((void *)g->base, g->size);
    free(im);
}

// ---------------------------------------------------------------- lookups

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

// ---------------------------------------------------------------- writer

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
