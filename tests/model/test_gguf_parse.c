// test_gguf_parse.c - GGUF reader/writer: round trip, the real model, a hand-made
// version-2 file, the corpus of malformed files, truncated prefixes, getters.
// Run from the repository root.
#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

#include "common.h"
#include "model/gguf.h"
#include "kernels/quant.h"
#include "t.h"

#define MODEL_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define BAD_DIR "tests/data/gguf-bad"

static char tmp_path[256];

static const char *tmp_file(const char *tag) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/sd_test_gguf_%ld_%s.gguf", (long)getpid(), tag);
    return tmp_path;
}

static void *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = n > 0 ? (size_t)n : 0;
    return buf;
}

static int has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

// ---------------------------------------------------------------- writer -> reader

#define N_F32 (2 * 3 * 5)
static float f32_data[N_F32];
static uint16_t f16_data[64 * 2];
static uint8_t q8_data[2 * 34 * 3];  // Q8_0, ne = [64, 3]
static uint8_t q41_data[20 * 2 * 2 * 2]; // Q4_1, ne = [32, 2, 2, 2]

static void fill_data(void) {
    for (int i = 0; i < N_F32; i++) f32_data[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 128; i++) f16_data[i] = sd_fp32_to_fp16((float)i);
    for (size_t i = 0; i < sizeof q8_data; i++) q8_data[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof q41_data; i++) q41_data[i] = (uint8_t)(255 - i);
}

static int write_sample(const char *path, char *err, size_t errlen) {
    sd_gguf_writer *w = sd_gguf_writer_new();
    if (!w) return -1;
    static const char *toks[] = {"<s>", "hello", "", "wörld"};
    static const char nul_tok[] = {'\0'};
    static const char *toks_n[] = {nul_tok, "ab\0c", "x"};
    static const uint64_t lens_n[] = {1, 4, 1};
    static const float fa[] = {1.0f, -2.5f, 1e30f};
    static const int32_t ia[] = {-1, 0, 2147483647, -2147483647 - 1};
    sd_gguf_w_str(w, "general.architecture", "llama");
    sd_gguf_w_u32(w, "llama.block_count", 30);
    sd_gguf_w_u32(w, "big.u32", 4000000000u);
    sd_gguf_w_i32(w, "neg.i32", -5);
    sd_gguf_w_i32(w, "pos.i32", 12);
    sd_gguf_w_f32(w, "llama.rope.freq_base", 100000.0f);
    sd_gguf_w_bool(w, "flag.true", 1);
    sd_gguf_w_bool(w, "flag.false", 0);
    sd_gguf_w_str(w, "empty.str", "");
    sd_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    sd_gguf_w_arr_strn(w, "bytes.tokens", toks_n, lens_n, 3);
    sd_gguf_w_arr_f32(w, "arr.f32", fa, 3);
    sd_gguf_w_arr_i32(w, "arr.i32", ia, 4);
    sd_gguf_w_arr_i32(w, "arr.empty", NULL, 0);
    sd_gguf_w_arr_str(w, "arr.empty_str", NULL, 0);
    sd_gguf_w_tensor(w, "t.f32", SD_TYPE_F32, 3, (const int64_t[]){2, 3, 5}, f32_data, sizeof f32_data);
    sd_gguf_w_tensor(w, "t.f16", SD_TYPE_F16, 2, (const int64_t[]){64, 2}, f16_data, sizeof f16_data);
    sd_gguf_w_tensor(w, "t.q8_0", SD_TYPE_Q8_0, 2, (const int64_t[]){64, 3}, q8_data, sizeof q8_data);
    sd_gguf_w_tensor(w, "t.q4_1", SD_TYPE_Q4_1, 4, (const int64_t[]){32, 2, 2, 2}, q41_data, sizeof q41_data);
    int rc = sd_gguf_writer_write(w, path, err, errlen);
    sd_gguf_writer_free(w);
    return rc;
}

static void t_roundtrip(void) {
    char err[512] = "";
    const char *path = tmp_file("rt");
    fill_data();
    int rc = write_sample(path, err, sizeof err);
    CHECK(rc == 0, "write: %s", err);
    if (rc) return;
    sd_gguf *g = NULL;
    rc = sd_gguf_open(&g, path, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc) return;
    CHECK(g->version == 3, "version %u", g->version);
    CHECK(g->n_kv == 15, "n_kv %llu", (unsigned long long)g->n_kv);
    CHECK(g->n_tensors == 4, "n_tensors %llu", (unsigned long long)g->n_tensors);
    CHECK(g->alignment == 32, "alignment %llu", (unsigned long long)g->alignment);
    CHECK(g->mapped == 1, "mapped");
    CHECK(sd_str_eq(g->kv[0].key, "general.architecture"), "first key in order");

    sd_str s;
    uint32_t u;
    int64_t i64;
    float f;
    int b;
    CHECK(sd_gguf_get_str(g, "general.architecture", &s, err, sizeof err) == 0 && sd_str_eq(s, "llama"), "arch");
    CHECK(sd_gguf_get_str(g, "empty.str", &s, err, sizeof err) == 0 && s.len == 0, "empty string");
    CHECK(sd_gguf_get_u32(g, "llama.block_count", &u, err, sizeof err) == 0 && u == 30, "block_count");
    CHECK(sd_gguf_get_u32(g, "big.u32", &u, err, sizeof err) == 0 && u == 4000000000u, "big u32");
    CHECK(sd_gguf_get_u32(g, "pos.i32", &u, err, sizeof err) == 0 && u == 12, "i32 -> u32 coercion");
    err[0] = 0;
    CHECK(sd_gguf_get_u32(g, "neg.i32", &u, err, sizeof err) < 0 && has(err, "neg.i32") && has(err, "-5"),
          "negative i32 -> u32 must fail naming the key: '%s'", err);
    CHECK(sd_gguf_get_i64(g, "neg.i32", &i64, err, sizeof err) == 0 && i64 == -5, "i32 -> i64");
    CHECK(sd_gguf_get_i64(g, "big.u32", &i64, err, sizeof err) == 0 && i64 == 4000000000ll, "u32 -> i64");
    CHECK(sd_gguf_get_f32(g, "llama.rope.freq_base", &f, err, sizeof err) == 0 && f == 100000.0f, "f32");
    CHECK(sd_gguf_get_f32(g, "neg.i32", &f, err, sizeof err) == 0 && f == -5.0f, "i32 -> f32");
    CHECK(sd_gguf_get_bool(g, "flag.true", &b, err, sizeof err) == 0 && b == 1, "bool true");
    CHECK(sd_gguf_get_bool(g, "flag.false", &b, err, sizeof err) == 0 && b == 0, "bool false");
    err[0] = 0;
    CHECK(sd_gguf_get_str(g, "llama.block_count", &s, err, sizeof err) < 0 && has(err, "llama.block_count") &&
              has(err, "u32"),
          "u32 as string must fail: '%s'", err);
    err[0] = 0;
    CHECK(sd_gguf_get_u32(g, "flag.true", &u, err, sizeof err) < 0 && err[0], "bool as u32 must fail");
    CHECK(sd_gguf_get_u32(g, "tokenizer.ggml.tokens", &u, err, sizeof err) < 0 && has(err, "array"),
          "array as u32 must fail: '%s'", err);
    u = 77;
    CHECK(sd_gguf_get_u32(g, "no.such.key", &u, err, sizeof err) == 1 && u == 77, "absent key: 1, out untouched");
    CHECK(sd_gguf_find_key(g, "no.such.key") == NULL, "find absent");
    CHECK(sd_gguf_find_key(g, "general") == NULL, "prefix is not a key");

    const sd_gguf_kv *kv = sd_gguf_find_key(g, "tokenizer.ggml.tokens");
    CHECK(kv && kv->type == SD_GGUF_ARRAY && kv->arr_type == SD_GGUF_STRING && kv->n == 4 && kv->strs, "tokens kv");
    if (kv && kv->strs && kv->n == 4) {
        CHECK(sd_str_eq(kv->strs[0], "<s>") && sd_str_eq(kv->strs[1], "hello") && kv->strs[2].len == 0 &&
                  sd_str_eq(kv->strs[3], "wörld"),
              "token strings");
    }
    kv = sd_gguf_find_key(g, "bytes.tokens");
    CHECK(kv && kv->n == 3 && kv->strs, "bytes.tokens");
    if (kv && kv->strs && kv->n == 3) {
        CHECK(kv->strs[0].len == 1 && kv->strs[0].ptr[0] == 0, "NUL token");
        CHECK(kv->strs[1].len == 4 && memcmp(kv->strs[1].ptr, "ab\0c", 4) == 0, "embedded NUL");
    }
    kv = sd_gguf_find_key(g, "general.architecture");
    CHECK(kv && kv->strs && kv->n == 1 && sd_str_eq(kv->strs[0], "llama"), "single string has a 1-element strs");
    kv = sd_gguf_find_key(g, "arr.f32");
    CHECK(kv && kv->arr_type == SD_GGUF_F32 && kv->n == 3, "arr.f32");
    if (kv && kv->n == 3) {
        CHECK(sd_gguf_arr_f32(kv, 0) == 1.0f && sd_gguf_arr_f32(kv, 1) == -2.5f && sd_gguf_arr_f32(kv, 2) == 1e30f,
              "f32 elements");
        CHECK(sd_gguf_arr_i64(kv, 1) == -2 && sd_gguf_arr_i64(kv, 2) == INT64_MAX, "f32 -> i64 (truncated, clamped)");
    }
    kv = sd_gguf_find_key(g, "arr.i32");
    CHECK(kv && kv->arr_type == SD_GGUF_I32 && kv->n == 4, "arr.i32");
    if (kv && kv->n == 4) {
        CHECK(sd_gguf_arr_i64(kv, 0) == -1 && sd_gguf_arr_i64(kv, 2) == 2147483647 &&
                  sd_gguf_arr_i64(kv, 3) == -2147483647ll - 1,
              "i32 elements");
        CHECK(sd_gguf_arr_f32(kv, 0) == -1.0f, "i32 -> f32 element");
    }
    kv = sd_gguf_find_key(g, "arr.empty");
    CHECK(kv && kv->type == SD_GGUF_ARRAY && kv->n == 0, "empty array");
    kv = sd_gguf_find_key(g, "arr.empty_str");
    CHECK(kv && kv->arr_type == SD_GGUF_STRING && kv->n == 0, "empty string array");

    struct {
        const char *name;
        int type, n_dims;
        int64_t ne[4];
        const void *data;
        size_t nbytes;
    } want[] = {
        {"t.f32", SD_TYPE_F32, 3, {2, 3, 5, 1}, f32_data, sizeof f32_data},
        {"t.f16", SD_TYPE_F16, 2, {64, 2, 1, 1}, f16_data, sizeof f16_data},
        {"t.q8_0", SD_TYPE_Q8_0, 2, {64, 3, 1, 1}, q8_data, sizeof q8_data},
        {"t.q4_1", SD_TYPE_Q4_1, 4, {32, 2, 2, 2}, q41_data, sizeof q41_data},
    };
    for (int i = 0; i < 4; i++) {
        const sd_tensor *t = sd_gguf_find_tensor(g, want[i].name);
        CHECK(t != NULL, "tensor %s", want[i].name);
        if (!t) continue;
        CHECK(t == &g->tensors[i], "tensor order %s", want[i].name);
        CHECK(t->type == want[i].type && t->n_dims == want[i].n_dims, "%s type/n_dims", want[i].name);
        CHECK(memcmp(t->ne, want[i].ne, sizeof t->ne) == 0, "%s shape", want[i].name);
        CHECK(t->nbytes == want[i].nbytes, "%s nbytes %zu", want[i].name, t->nbytes);
        CHECK(t->offset % 32 == 0, "%s offset aligned", want[i].name);
        CHECK(((const uint8_t *)t->data - g->base) % 32 == 0, "%s data aligned in file", want[i].name);
        CHECK((uintptr_t)t->data % 32 == 0, "%s data aligned in memory", want[i].name);
        CHECK(memcmp(t->data, want[i].data, want[i].nbytes) == 0, "%s data", want[i].name);
    }
    CHECK(sd_gguf_find_tensor(g, "t.f3") == NULL, "absent tensor");
    sd_gguf_close(g);
    remove(path);
}

static void t_writer_errors(void) {
    char err[512] = "";
    const char *path = tmp_file("werr");
    static const float x[8];
    // Wrong byte count for the shape.
    sd_gguf_writer *w = sd_gguf_writer_new();
    sd_gguf_w_tensor(w, "bad", SD_TYPE_F32, 1, (const int64_t[]){8}, x, 16);
    CHECK(sd_gguf_writer_write(w, path, err, sizeof err) < 0 && has(err, "bad"), "size mismatch: '%s'", err);
    sd_gguf_writer_free(w);
    // Duplicate key.
    w = sd_gguf_writer_new();
    sd_gguf_w_u32(w, "k", 1);
    sd_gguf_w_u32(w, "k", 2);
    err[0] = 0;
    CHECK(sd_gguf_writer_write(w, path, err, sizeof err) < 0 && has(err, "duplicate key 'k'"), "dup key: '%s'", err);
    sd_gguf_writer_free(w);
    // ne[0] not a multiple of the block size.
    w = sd_gguf_writer_new();
    sd_gguf_w_tensor(w, "q", SD_TYPE_Q8_0, 1, (const int64_t[]){33}, x, 32);
    err[0] = 0;
    CHECK(sd_gguf_writer_write(w, path, err, sizeof err) < 0 && has(err, "block size"), "block: '%s'", err);
    sd_gguf_writer_free(w);
    // Unwritable path.
    w = sd_gguf_writer_new();
    err[0] = 0;
    CHECK(sd_gguf_writer_write(w, "/nonexistent-dir/x.gguf", err, sizeof err) < 0 && has(err, "nonexistent-dir"),
          "bad path: '%s'", err);
    sd_gguf_writer_free(w);
    // An empty writer gives a valid empty file.
    w = sd_gguf_writer_new();
    CHECK(sd_gguf_writer_write(w, path, err, sizeof err) == 0, "empty write: %s", err);
    sd_gguf_writer_free(w);
    sd_gguf *g = NULL;
    CHECK(sd_gguf_open(&g, path, err, sizeof err) == 0 && g->n_kv == 0 && g->n_tensors == 0, "empty open: %s", err);
    sd_gguf_close(g);
    remove(path);
    sd_gguf_writer_free(NULL);
}

// ---------------------------------------------------------------- the real model

static void t_model(void) {
    char err[512] = "";
    FILE *f = fopen(MODEL_PATH, "rb");
    if (!f) SKIP("%s is absent (make models fetches it)", MODEL_PATH);
    fclose(f);
    sd_gguf *g = NULL;
    double t0 = sd_time_ms();
    int rc = sd_gguf_open(&g, MODEL_PATH, err, sizeof err);
    double ms = sd_time_ms() - t0;
    CHECK(rc == 0, "open: %s", err);
    if (rc) return;
    printf("  opened %s (%zu bytes) in %.1f ms\n", MODEL_PATH, g->size, ms);
    CHECK(g->version == 3, "version %u", g->version);
    CHECK(g->n_kv == 33, "n_kv %llu", (unsigned long long)g->n_kv);
    CHECK(g->n_tensors == 272, "n_tensors %llu", (unsigned long long)g->n_tensors);
    CHECK(g->alignment == 32, "alignment");
    sd_str s;
    uint32_t u;
    float fl;
    int b;
    CHECK(sd_gguf_get_str(g, "general.architecture", &s, err, sizeof err) == 0 && sd_str_eq(s, "llama"), "arch");
    CHECK(sd_gguf_get_u32(g, "llama.block_count", &u, err, sizeof err) == 0 && u == 30, "block_count");
    CHECK(sd_gguf_get_u32(g, "llama.embedding_length", &u, err, sizeof err) == 0 && u == 576, "n_embd");
    CHECK(sd_gguf_get_u32(g, "llama.attention.head_count_kv", &u, err, sizeof err) == 0 && u == 3, "n_head_kv");
    CHECK(sd_gguf_get_f32(g, "llama.rope.freq_base", &fl, err, sizeof err) == 0 && fl == 100000.0f, "rope base");
    CHECK(sd_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, err, sizeof err) == 0 && b == 0, "add_bos");
    CHECK(sd_gguf_get_str(g, "tokenizer.ggml.pre", &s, err, sizeof err) == 0 && sd_str_eq(s, "smollm"), "pre");
    const sd_gguf_kv *kv = sd_gguf_find_key(g, "tokenizer.ggml.tokens");
    CHECK(kv && kv->arr_type == SD_GGUF_STRING && kv->n == 49152 && kv->strs, "tokens");
    if (kv && kv->strs && kv->n == 49152) {
        CHECK(sd_str_eq(kv->strs[0], "<|endoftext|>"), "token 0 '%.*s'", (int)kv->strs[0].len, kv->strs[0].ptr);
        CHECK(sd_str_eq(kv->strs[1], "<|im_start|>"), "token 1");
    }
    kv = sd_gguf_find_key(g, "tokenizer.ggml.merges");
    CHECK(kv && kv->arr_type == SD_GGUF_STRING && kv->n == 48900, "merges");
    kv = sd_gguf_find_key(g, "tokenizer.ggml.token_type");
    CHECK(kv && kv->arr_type == SD_GGUF_I32 && kv->n == 49152 && sd_gguf_arr_i64(kv, 0) == 3, "token_type[0] control");
    const sd_tensor *t = sd_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == SD_TYPE_Q8_0 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152 &&
              t->nbytes == 30081024 && t->offset == 0,
          "token_embd");
    t = sd_gguf_find_tensor(g, "blk.29.ffn_down.weight");
    CHECK(t && t->type == SD_TYPE_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576, "blk.29.ffn_down");
    t = sd_gguf_find_tensor(g, "output_norm.weight");
    CHECK(t && t->type == SD_TYPE_F32 && t->n_dims == 1 && t->ne[0] == 576 &&
              (const uint8_t *)t->data + t->nbytes == g->base + g->size,
          "output_norm is the last tensor and ends the file");
    CHECK(sd_gguf_find_tensor(g, "output.weight") == NULL, "tied output");
    size_t total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) total += g->tensors[i].nbytes;
    CHECK(total > 90000000 && total < g->size, "tensor bytes %zu", total);
    sd_gguf_close(g);
}

// ---------------------------------------------------------------- hand-made v2 file

typedef struct {
    uint8_t b[1024];
    size_t n;
} bytes;

static void put(bytes *o, const void *p, size_t n) {
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void put32(bytes *o, uint32_t v) { put(o, &v, 4); }
static void put64(bytes *o, uint64_t v) { put(o, &v, 8); }
static void putstr(bytes *o, const char *s) {
    put64(o, strlen(s));
    put(o, s, strlen(s));
}

static void t_version2(void) {
    static bytes o;
    o.n = 0;
    char err[512] = "";
    put(&o, "GGUF", 4);
    put32(&o, 2);
    put64(&o, 2); // tensors
    put64(&o, 5); // kv
    putstr(&o, "general.architecture"), put32(&o, SD_GGUF_STRING), putstr(&o, "llama");
    putstr(&o, "v.u64"), put32(&o, SD_GGUF_U64), put64(&o, 1ull << 40);
    putstr(&o, "v.i16"), put32(&o, SD_GGUF_I16), put(&o, (int16_t[]){-300}, 2);
    putstr(&o, "v.f64"), put32(&o, SD_GGUF_F64), put(&o, (double[]){0.25}, 8);
    putstr(&o, "v.arr_u8"), put32(&o, SD_GGUF_ARRAY), put32(&o, SD_GGUF_U8), put64(&o, 3), put(&o, "\x01\x02\xff", 3);
    putstr(&o, "w1"), put32(&o, 2), put64(&o, 4), put64(&o, 2), put32(&o, SD_TYPE_F32), put64(&o, 0);
    putstr(&o, "w2"), put32(&o, 1), put64(&o, 32), put32(&o, SD_TYPE_Q8_0), put64(&o, 32);
    while (o.n % 32) o.b[o.n++] = 0;
    size_t data_start = o.n;
    for (int i = 0; i < 8; i++) put(&o, (float[]){(float)i}, 4);
    while ((o.n - data_start) % 32) o.b[o.n++] = 0;
    put(&o, (uint16_t[]){0x3c00}, 2);
    for (int i = 0; i < 32; i++) o.b[o.n++] = (uint8_t)i;

    sd_gguf *g = NULL;
    int rc = sd_gguf_open_mem(&g, o.b, o.n, err, sizeof err);
    CHECK(rc == 0, "open v2: %s", err);
    if (rc) return;
    CHECK(g->version == 2 && g->n_kv == 5 && g->n_tensors == 2 && g->mapped == 0, "header");
    int64_t i64;
    float f;
    uint32_t u;
    sd_str s;
    CHECK(sd_gguf_get_str(g, "general.architecture", &s, err, sizeof err) == 0 && sd_str_eq(s, "llama"), "arch");
    CHECK(sd_gguf_get_i64(g, "v.u64", &i64, err, sizeof err) == 0 && i64 == 1ll << 40, "u64");
    CHECK(sd_gguf_get_u32(g, "v.u64", &u, err, sizeof err) < 0 && has(err, "v.u64"), "u64 too big for u32");
    CHECK(sd_gguf_get_i64(g, "v.i16", &i64, err, sizeof err) == 0 && i64 == -300, "i16");
    CHECK(sd_gguf_get_f32(g, "v.f64", &f, err, sizeof err) == 0 && f == 0.25f, "f64 -> f32");
    CHECK(sd_gguf_get_i64(g, "v.f64", &i64, err, sizeof err) < 0, "f64 is not an integer");
    const sd_gguf_kv *kv = sd_gguf_find_key(g, "v.arr_u8");
    CHECK(kv && kv->n == 3 && sd_gguf_arr_i64(kv, 2) == 255 && sd_gguf_arr_f32(kv, 1) == 2.0f, "u8 array");
    const sd_tensor *t = sd_gguf_find_tensor(g, "w1");
    CHECK(t && t->ne[0] == 4 && t->ne[1] == 2 && t->nbytes == 32 && (const uint8_t *)t->data == o.b + data_start,
          "w1");
    if (t) {
        float v;
        memcpy(&v, (const uint8_t *)t->data + 7 * 4, 4);
        CHECK(v == 7.0f, "w1[7] = %g", v);
    }
    t = sd_gguf_find_tensor(g, "w2");
    CHECK(t && t->type == SD_TYPE_Q8_0 && t->nbytes == 34 && t->offset == 32 &&
              ((const uint8_t *)t->data)[33] == 31,
          "w2");
    sd_gguf_close(g);

    // The same bytes declared as version 1 or big-endian must be refused.
    o.b[4] = 1;
    err[0] = 0;
    CHECK(sd_gguf_open_mem(&g, o.b, o.n, err, sizeof err) < 0 && has(err, "version 1"), "v1: '%s'", err);
    memcpy(o.b + 4, "\0\0\0\2", 4);
    err[0] = 0;
    CHECK(sd_gguf_open_mem(&g, o.b, o.n, err, sizeof err) < 0 && has(err, "big-endian"), "BE: '%s'", err);
}

// ---------------------------------------------------------------- malformed files

static const struct {
    const char *file, *expect;
} bad_table[] = {
    {"empty.gguf", "too small"},
    {"bad-magic.gguf", "bad magic"},
    {"bad-version.gguf", "unsupported GGUF version 4"},
    {"version-1.gguf", "version 1"},
    {"big-endian.gguf", "big-endian"},
    {"huge-kv-count.gguf", "kv count 1152921504606846976"},
    {"huge-tensor-count.gguf", "tensor count 1152921504606846976"},
    {"huge-key-length.gguf", "key length 9223372036854775808 extends past end of file"},
    {"huge-string-length.gguf", "key 'general.name': string length 1152921504606846976 extends past end"},
    {"truncated-key.gguf", "key length 20 extends past end of file"},
    {"empty-key.gguf", "empty key"},
    {"unknown-value-type.gguf", "key 'general.x': unknown value type 13"},
    {"bad-array-type.gguf", "key 'general.x': unknown array element type 42"},
    {"nested-array.gguf", "key 'general.x': arrays of arrays are not supported"},
    {"huge-array.gguf", "key 'general.x': array of 2305843009213693952 u32 elements extends past end"},
    {"huge-string-array.gguf", "key 'tokenizer.ggml.tokens': array of 1099511627776 strings extends past end"},
    {"duplicate-key.gguf", "duplicate key 'general.architecture'"},
    {"alignment-zero.gguf", "key 'general.alignment': value 0 is not a non-zero power of two"},
    {"alignment-three.gguf", "key 'general.alignment': value 3 is not a non-zero power of two"},
    {"alignment-type.gguf", "key 'general.alignment': must be of type u32, found u64"},
    {"huge-ndims.gguf", "tensor 'a': n_dims 2147483647 out of range"},
    {"zero-dim.gguf", "tensor 'a': dimension 1 is 0"},
    {"negative-dim.gguf", "tensor 'a': dimension 1 is negative"},
    {"dim-overflow.gguf", "tensor 'a': element count overflows"},
    {"unknown-tensor-type.gguf", "tensor 'a': unknown tensor type 99"},
    {"block-size.gguf", "tensor 'a': ne[0] = 48 is not a multiple of the block size 32"},
    {"tensor-out-of-bounds.gguf", "tensor 'b': data [offset 32"},
    {"misaligned-offset.gguf", "tensor 'a': data offset 4 is not a multiple of the alignment 32"},
    {"overlapping-tensors.gguf", "tensors 'a' [offset 0, 32 bytes] and 'b' [offset 0, 64 bytes] overlap"},
    {"duplicate-tensor.gguf", "duplicate tensor name 'a'"},
};
#define N_BAD (sizeof bad_table / sizeof *bad_table)

static void t_bad_corpus(void) {
    DIR *d = opendir(BAD_DIR);
    if (!d) SKIP("%s not found (run from the repository root)", BAD_DIR);
    int seen[N_BAD] = {0};
    int n_files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        n_files++;
        size_t k = 0;
        while (k < N_BAD && strcmp(bad_table[k].file, e->d_name)) k++;
        CHECK(k < N_BAD, "%s/%s has no expected message in bad_table", BAD_DIR, e->d_name);
        if (k == N_BAD) continue;
        seen[k] = 1;
        char path[512], err[512] = "";
        snprintf(path, sizeof path, "%s/%s", BAD_DIR, e->d_name);
        static sd_gguf dummy;
        sd_gguf *g = &dummy; // must be reset to NULL on failure
        int rc = sd_gguf_open(&g, path, err, sizeof err);
        CHECK(rc < 0 && g == NULL, "%s: loaded but must fail", e->d_name);
        CHECK(has(err, bad_table[k].expect), "%s: message '%s' lacks '%s'", e->d_name, err, bad_table[k].expect);
        CHECK(has(err, path), "%s: message '%s' lacks the path", e->d_name, err);
        if (rc == 0) sd_gguf_close(g);
        // Same through the memory interface, from an exact-size heap copy.
        size_t n;
        void *buf = read_all(path, &n);
        CHECK(buf != NULL, "read %s", path);
        if (!buf) continue;
        err[0] = 0;
        rc = sd_gguf_open_mem(&g, buf, n, err, sizeof err);
        CHECK(rc < 0 && has(err, bad_table[k].expect), "%s (mem): '%s'", e->d_name, err);
        if (rc == 0) sd_gguf_close(g);
        free(buf);
    }
    closedir(d);
    for (size_t k = 0; k < N_BAD; k++) CHECK(seen[k], "%s/%s is missing", BAD_DIR, bad_table[k].file);
    printf("  %d malformed files rejected with the expected messages\n", n_files);
}

// Every strict prefix of a valid file must be rejected, with a message.
static void t_truncated(void) {
    char err[512];
    const char *path = tmp_file("trunc");
    fill_data();
    CHECK(write_sample(path, err, sizeof err) == 0, "write: %s", err);
    size_t n;
    uint8_t *full = read_all(path, &n);
    remove(path);
    CHECK(full != NULL && n > 100, "read back");
    if (!full) return;
    int n_bad = 0;
    for (size_t len = 0; len < n; len++) {
        uint8_t *p = malloc(len ? len : 1);
        memcpy(p, full, len);
        sd_gguf *g = NULL;
        err[0] = 0;
        int rc = sd_gguf_open_mem(&g, p, len, err, sizeof err);
        if (rc == 0 || !err[0] || g) {
            if (n_bad++ < 5) CHECK(0, "prefix of %zu/%zu bytes: rc %d err '%s'", len, n, rc, err);
            if (rc == 0) sd_gguf_close(g);
        }
        free(p);
    }
    CHECK(n_bad == 0, "%d prefixes misbehaved", n_bad);
    sd_gguf *g = NULL;
    CHECK(sd_gguf_open_mem(&g, full, n, err, sizeof err) == 0, "full file: %s", err);
    sd_gguf_close(g);
    printf("  %zu truncated prefixes rejected\n", n);
    free(full);
}

static void t_open_errors(void) {
    char err[512] = "";
    sd_gguf *g = NULL;
    CHECK(sd_gguf_open(&g, "/nonexistent/model.gguf", err, sizeof err) < 0 && has(err, "/nonexistent/model.gguf") &&
              g == NULL,
          "missing file: '%s'", err);
    err[0] = 0;
    CHECK(sd_gguf_open(&g, "tests", err, sizeof err) < 0 && has(err, "regular file"), "directory: '%s'", err);
    CHECK(sd_gguf_open_mem(&g, NULL, 0, err, sizeof err) < 0 && err[0], "NULL buffer of 0 bytes");
    sd_gguf_close(NULL);
    CHECK(sd_gguf_find_key(NULL, "x") == NULL && sd_gguf_find_tensor(NULL, "x") == NULL, "NULL g");
    sd_str s = {3, "abcdef"};
    CHECK(sd_str_eq(s, "abc") && !sd_str_eq(s, "abcd") && !sd_str_eq(s, "ab") && !sd_str_eq(s, "abd"), "sd_str_eq");
    sd_str z = {0, ""};
    CHECK(sd_str_eq(z, "") && !sd_str_eq(z, "a"), "sd_str_eq empty");
}

int main(void) {
    T_RUN(t_roundtrip);
    T_RUN(t_writer_errors);
    T_RUN(t_model);
    T_RUN(t_version2);
    T_RUN(t_bad_corpus);
    T_RUN(t_truncated);
    T_RUN(t_open_errors);
    T_EXIT();
}
