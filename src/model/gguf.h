// gguf.h - GGUF reader (v2, v3; memory-mapped, fully validated) and writer.
// After sd_gguf_open succeeds, every key, string, array and tensor extent has
// been checked against the file size, so callers may trust what they read.
#ifndef SD_GGUF_H
#define SD_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum sd_gguf_vtype {
    SD_GGUF_U8 = 0, SD_GGUF_I8 = 1, SD_GGUF_U16 = 2, SD_GGUF_I16 = 3,
    SD_GGUF_U32 = 4, SD_GGUF_I32 = 5, SD_GGUF_F32 = 6, SD_GGUF_BOOL = 7,
    SD_GGUF_STRING = 8, SD_GGUF_ARRAY = 9, SD_GGUF_U64 = 10, SD_GGUF_I64 = 11,
    SD_GGUF_F64 = 12,
};

typedef struct {
    uint64_t len;     // bytes, no terminating NUL
    const char *ptr;  // points into the mapped file
} sd_str;

typedef struct {
    sd_str key;
    int type;          // enum sd_gguf_vtype
    int arr_type;      // element type when type == SD_GGUF_ARRAY
    uint64_t n;        // element count for arrays, 1 otherwise
    const void *data;  // scalar value or first array element, in the file (may be unaligned: memcpy)
    sd_str *strs;      // (n) for string arrays and single strings (n == 1); owned by the sd_gguf
} sd_gguf_kv;

#define SD_MAX_DIMS 4
typedef struct {
    sd_str name;
    int type;                 // ggml type id (enum sd_type in quant.h)
    int n_dims;
    int64_t ne[SD_MAX_DIMS];  // ne[0] is the contiguous dimension (columns); unused dims are 1
    uint64_t offset;          // from the start of the data section
    const void *data;         // in the mapping
    size_t nbytes;
} sd_tensor;

typedef struct sd_gguf {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    sd_gguf_kv *kv;       // (n_kv)
    sd_tensor *tensors;   // (n_tensors)
    uint64_t alignment;   // general.alignment or 32
    const uint8_t *base;  // start of the mapping / buffer
    size_t size;          // bytes
    int mapped;           // 1 if base was mmap'ed by us
} sd_gguf;

// Opens and validates a GGUF file (mmap). On error returns <0 and a message
// naming the key or tensor at fault.
int sd_gguf_open(sd_gguf **out, const char *path, char *err, size_t errlen);
// The same, populate = 0: the mapping is not faulted in at once (only the
// pages read later become resident: a model loaded for a range of layers).
int sd_gguf_open_map(sd_gguf **out, const char *path, int populate, char *err, size_t errlen);
// Same over a caller-owned buffer that must outlive the sd_gguf (fuzzing, tests).
int sd_gguf_open_mem(sd_gguf **out, const void *buf, size_t size, char *err, size_t errlen);
void sd_gguf_close(sd_gguf *g);

// Lookups. find_key returns the kv or NULL.
const sd_gguf_kv *sd_gguf_find_key(const sd_gguf *g, const char *key);
const sd_tensor *sd_gguf_find_tensor(const sd_gguf *g, const char *name);
// Typed getters: 0 found, 1 absent (out untouched), <0 present with an
// incompatible type (message in err). Integer getters accept any integer type
// whose value fits; get_f32 accepts F32/F64 and integers.
int sd_gguf_get_u32(const sd_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen);
int sd_gguf_get_i64(const sd_gguf *g, const char *key, int64_t *out, char *err, size_t errlen);
int sd_gguf_get_f32(const sd_gguf *g, const char *key, float *out, char *err, size_t errlen);
int sd_gguf_get_bool(const sd_gguf *g, const char *key, int *out, char *err, size_t errlen);
int sd_gguf_get_str(const sd_gguf *g, const char *key, sd_str *out, char *err, size_t errlen);
// Array element i as f32 / i64 (numeric arrays only; caller checked bounds).
float sd_gguf_arr_f32(const sd_gguf_kv *kv, uint64_t i);
int64_t sd_gguf_arr_i64(const sd_gguf_kv *kv, uint64_t i);
// 1 if s equals the NUL-terminated c string.
int sd_str_eq(sd_str s, const char *c);

// ---- writer (convert-llama2c, synthetic test models) ----
typedef struct sd_gguf_writer sd_gguf_writer;
sd_gguf_writer *sd_gguf_writer_new(void);
void sd_gguf_writer_free(sd_gguf_writer *w);
void sd_gguf_w_u32(sd_gguf_writer *w, const char *key, uint32_t v);
void sd_gguf_w_i32(sd_gguf_writer *w, const char *key, int32_t v);
void sd_gguf_w_f32(sd_gguf_writer *w, const char *key, float v);
void sd_gguf_w_bool(sd_gguf_writer *w, const char *key, int v);
void sd_gguf_w_str(sd_gguf_writer *w, const char *key, const char *v);
void sd_gguf_w_arr_str(sd_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
// Strings with explicit lengths (may contain NUL bytes, e.g. a byte token "\0").
void sd_gguf_w_arr_strn(sd_gguf_writer *w, const char *key, const char *const *v, const uint64_t *lens, uint64_t n);
void sd_gguf_w_arr_f32(sd_gguf_writer *w, const char *key, const float *v, uint64_t n);
void sd_gguf_w_arr_i32(sd_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
// A key-value pair of another file, copied as it is (any type but nested arrays), under key.
void sd_gguf_w_kv_copy(sd_gguf_writer *w, const char *key, const sd_gguf_kv *kv);
// An array of n bytes (U8 elements).
void sd_gguf_w_arr_u8(sd_gguf_writer *w, const char *key, const void *v, uint64_t n);
// Copies a key of a reader (any scalar, a string, an array of scalars or of
// strings; a nested array is refused) under the same name and type.
void sd_gguf_w_copy(sd_gguf_writer *w, const sd_gguf_kv *kv);
// Adds a tensor; data (nbytes) is copied. ne[0] is the contiguous dimension.
void sd_gguf_w_tensor(sd_gguf_writer *w, const char *name, int type, int n_dims,
                      const int64_t *ne, const void *data, size_t nbytes);
// Writes a version-3 file with 32-byte alignment. <0 on I/O error (or an earlier
// allocation failure remembered by the writer).
int sd_gguf_writer_write(sd_gguf_writer *w, const char *path, char *err, size_t errlen);

#endif
