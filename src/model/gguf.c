// gguf.c - GGUF v2/v3 reader (fully validated, zero-copy over an mmap or a
// caller buffer). Lookups and typed getters are in gguf_get.c, the writer
// in gguf_write.c.
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
#include "model/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "specdec.h"
#include "kernels/quant.h"

// Smallest encodings, used to bound counts by the bytes left in the file:
// a kv is a key (u64 length + at least 1 byte), a u32 type and at least a
// 1-byte value; a tensor info is a name (u64 + 1), u32 n_dims, one u64 ne,
// u32 type and u64 offset.
#define KV_MIN_BYTES 14u
#define TI_MIN_BYTES 33u
#define MAX_COUNT (1ull << 31) // keeps indices in uint32 hash slots

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

static int index_init(name_index *ix, uint64_t n) {
    uint64_t cap = 8;
    while (cap < 2 * n) cap <<= 1;
    ix->slots = calloc((size_t)cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : -1;
}

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
    return sd_gguf_open_map(out, path, 1, err, errlen);
}

int sd_gguf_open_map(sd_gguf **out, const char *path, int populate, char *err, size_t errlen) {
    if (!out || !path) return sd_err(err, errlen, "sd_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sd_errc(SD_ERR_IO, err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return sd_errc(SD_ERR_IO, err, errlen, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return sd_err(err, errlen, "%s: file too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        // every weight is read at load (repacking) or per token: fault the file
        // in at once -- unless the caller reads only part of it (a model
        // loaded for a range of layers, whose other pages stay on disk)
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return sd_errc(SD_ERR_IO, err, errlen, "%s: mmap failed: %s", path, strerror(e));
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
