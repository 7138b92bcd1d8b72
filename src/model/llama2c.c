// llama2c.c - llama2.c checkpoint + tokenizer.bin -> GGUF (F32 tensors).
#include "model/llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "model/gguf.h"
#include "kernels/quant.h"

#define L2C_MAGIC 0x616b3432u

typedef struct {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    int shared;         // 1: the classifier is the token embedding
    int version;        // 0 (legacy) or 1
    size_t header_size; // bytes before the first weight
} l2c_config;

typedef struct {
    const uint8_t *p;  // mapping
    size_t size;       // bytes
} l2c_map;

static int map_file(l2c_map *m, const char *path, const char *what, char *err, size_t errlen) {
    m->p = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return sd_err(err, errlen, "cannot open %s '%s': %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return sd_err(err, errlen, "%s '%s' is not a regular file", what, path);
    }
    m->size = (size_t)st.st_size;
    if (m->size == 0) {
        close(fd);
        return sd_err(err, errlen, "%s '%s' is empty", what, path);
    }
    void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return sd_err(err, errlen, "cannot map %s '%s': %s", what, path, strerror(errno));
    m->p = p;
    return 0;
}

static void unmap_file(l2c_map *m) {
    if (m->p) munmap((void *)m->p, m->size);
    m->p = NULL;
}

static int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

// Float count of the weights the header announces (including the v0 freq_cis tables).
static uint64_t expected_floats(const l2c_config *c) {
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t kv_dim = dim * (uint64_t)c->n_kv_heads / (uint64_t)c->n_heads;
    uint64_t head = dim / (uint64_t)c->n_heads;
    uint64_t n = (uint64_t)c->vocab_size * dim;         // token embedding
    n += L * dim * 2;                                    // rms_att, rms_ffn
    n += L * (dim * dim * 2 + dim * kv_dim * 2);         // wq, wo, wk, wv
    n += L * dim * hid * 3;                              // w1, w2, w3
    n += dim;                                            // rms_final
    if (c->version == 0) n += (uint64_t)c->seq_len * head; // freq_cis_real + imag (head/2 each)
    if (!c->shared) n += (uint64_t)c->vocab_size * dim;  // wcls
    return n;
}

static int parse_header(const l2c_map *m, const char *path, l2c_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    const uint8_t *p = m->p;
    if (m->size >= 8 && (uint32_t)rd_i32(p) == L2C_MAGIC) {
        int ver = rd_i32(p + 4);
        if (ver != 1)
            return sd_err(err, errlen,
                          "checkpoint '%s': llama2.c format version %d is not supported (only the fp32 "
                          "formats: legacy v0 and v1)", path, ver);
        if (m->size < 256) return sd_err(err, errlen, "checkpoint '%s' is truncated: v1 header needs 256 bytes, file has %zu", path, m->size);
        c->version = 1;
        c->header_size = 256;
        p += 8;
    } else {
        if (m->size < 28) return sd_err(err, errlen, "checkpoint '%s' is too small (%zu bytes) to be a llama2.c checkpoint", path, m->size);
        c->version = 0;
        c->header_size = 28;
    }
    c->dim = rd_i32(p);
    c->hidden_dim = rd_i32(p + 4);
    c->n_layers = rd_i32(p + 8);
    c->n_heads = rd_i32(p + 12);
    c->n_kv_heads = rd_i32(p + 16);
    c->vocab_size = rd_i32(p + 20);
    c->seq_len = rd_i32(p + 24);
    if (c->version == 0) {
        c->shared = c->vocab_size > 0;
        if (c->vocab_size < 0) c->vocab_size = -c->vocab_size;
    } else {
        c->shared = p[28] != 0;
    }
    if (c->dim <= 0 || c->dim > (1 << 16) || c->hidden_dim <= 0 || c->hidden_dim > (1 << 18) ||
        c->n_layers <= 0 || c->n_layers > 1024 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0 || c->dim % c->n_heads != 0 ||
        (c->dim / c->n_heads) % 2 != 0 || c->vocab_size <= 0 || c->vocab_size > (1 << 22) ||
        c->seq_len <= 0 || c->seq_len > (1 << 22))
        return sd_err(err, errlen,
                      "checkpoint '%s' has an invalid or unknown header (dim %d, hidden_dim %d, n_layers %d, "
                      "n_heads %d, n_kv_heads %d, vocab_size %d, seq_len %d): not a llama2.c fp32 checkpoint?",
                      path, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                      c->seq_len);
    uint64_t want = c->header_size + expected_floats(c) * 4;
    if ((uint64_t)m->size != want) {
        if (c->version == 0 && c->shared && (uint64_t)m->size == want + (uint64_t)c->vocab_size * c->dim * 4)
            return 0; // an explicit copy of the shared classifier: ignored
        return sd_err(err, errlen,
                      "checkpoint '%s' has %zu bytes but its v%d header (dim %d, %d layers, vocab %d%s) "
                      "implies %llu: %s",
                      path, m->size, c->version, c->dim, c->n_layers, c->vocab_size,
                      c->shared ? ", shared classifier" : ", separate classifier", (unsigned long long)want,
                      (uint64_t)m->size < want ? "the file is truncated" : "unknown trailing data");
    }
    return 0;
}

// ---------------------------------------------------------------- tokenizer
typedef struct {
    char **text;     // (n) NUL-terminated texts, spaces as U+2581
    uint64_t *len;   // (n)
    float *score;    // (n)
    int32_t *type;   // (n) 1 normal, 2 unknown, 3 control, 6 byte
    int n;
} l2c_vocab;

static void vocab_free(l2c_vocab *v) {
    if (v->text)
        for (int i = 0; i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->score);
    free(v->type);
    memset(v, 0, sizeof *v);
}

static int is_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    for (int i = 3; i < 5; i++) {
        char ch = s[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'A' && ch <= 'F') || (ch >= 'a' && ch <= 'f'))) return 0;
    }
    return 1;
}

static int read_vocab(l2c_vocab *v, const char *path, int n_vocab, char *err, size_t errlen) {
    memset(v, 0, sizeof *v);
    l2c_map m;
    if (map_file(&m, path, "tokenizer", err, errlen) < 0) return -1;
    int rc = 0;
    v->text = calloc((size_t)n_vocab, sizeof(char *));
    v->len = calloc((size_t)n_vocab, sizeof(uint64_t));
    v->score = calloc((size_t)n_vocab, sizeof(float));
    v->type = calloc((size_t)n_vocab, sizeof(int32_t));
    v->n = n_vocab;
    if (!v->text || !v->len || !v->score || !v->type) {
        rc = sd_err(err, errlen, "out of memory reading the tokenizer");
        goto out;
    }
    size_t off = 4;
    if (m.size < 4) {
        rc = sd_err(err, errlen, "tokenizer '%s' is truncated (no header)", path);
        goto out;
    }
    int32_t max_len = rd_i32(m.p);
    if (max_len <= 0 || max_len > 4096) {
        rc = sd_err(err, errlen, "tokenizer '%s': invalid max_token_length %d (not a llama2.c tokenizer.bin?)", path, max_len);
        goto out;
    }
    for (int i = 0; i < n_vocab; i++) {
        if (off + 8 > m.size) {
            rc = sd_err(err, errlen, "tokenizer '%s' is truncated: it has %d tokens, the checkpoint needs %d", path, i, n_vocab);
            goto out;
        }
        float score;
        memcpy(&score, m.p + off, 4);
        int32_t len = rd_i32(m.p + off + 4);
        off += 8;
        if (len < 0 || len > max_len || off + (size_t)len > m.size) {
            rc = sd_err(err, errlen, "tokenizer '%s': token %d has an invalid length %d", path, i, len);
            goto out;
        }
        const char *s = (const char *)m.p + off;
        off += (size_t)len;
        // llama2.c writes BOS/EOS as "\n<s>\n" / "\n</s>\n"
        size_t a = 0, b = (size_t)len;
        while (a < b && s[a] == '\n') a++;
        while (b > a && s[b - 1] == '\n') b--;
        int ctl = (b - a == 3 && !memcmp(s + a, "<s>", 3)) || (b - a == 4 && !memcmp(s + a, "</s>", 4));
        if (!ctl) {
            a = 0;
            b = (size_t)len;
        }
        // spaces become U+2581 (3 bytes)
        size_t n_sp = 0;
        for (size_t k = a; k < b; k++) n_sp += s[k] == ' ';
        char *t = malloc(b - a + 2 * n_sp + 1);
        if (!t) {
            rc = sd_err(err, errlen, "out of memory reading the tokenizer");
            goto out;
        }
        size_t j = 0;
        for (size_t k = a; k < b; k++) {
            if (s[k] == ' ') {
                t[j++] = (char)0xE2;
                t[j++] = (char)0x96;
                t[j++] = (char)0x81;
            } else {
                t[j++] = s[k];
            }
        }
        t[j] = 0;
        v->text[i] = t;
        v->len[i] = j;
        v->score[i] = score;
        if (ctl)
            v->type[i] = 3;
        else if (j == 5 && !memcmp(t, "<unk>", 5))
            v->type[i] = 2;
        else if (is_byte_token(t, j))
            v->type[i] = 6;
        else
            v->type[i] = 1;
    }
out:
    unmap_file(&m);
    if (rc < 0) vocab_free(v);
    return rc;
}

// ---------------------------------------------------------------- conversion
typedef struct {
    const float *p;  // next weight in the checkpoint
} l2c_cursor;

static const float *take(l2c_cursor *c, uint64_t n) {
    const float *r = c->p;
    c->p += n;
    return r;
}

static void put(sd_gguf_writer *w, const char *name, const float *data, int64_t ne0, int64_t ne1) {
    int64_t ne[2] = {ne0, ne1};
    sd_gguf_w_tensor(w, name, SD_TYPE_F32, ne1 > 1 ? 2 : 1, ne, data, (size_t)(ne0 * ne1) * sizeof(float));
}

int sd_llama2c_convert(const char *ckpt, const char *tok, const char *out, char *err, size_t errlen) {
    l2c_map m;
    l2c_config c;
    l2c_vocab v;
    if (map_file(&m, ckpt, "checkpoint", err, errlen) < 0) return -1;
    if (parse_header(&m, ckpt, &c, err, errlen) < 0) {
        unmap_file(&m);
        return -1;
    }
    if (read_vocab(&v, tok, c.vocab_size, err, errlen) < 0) {
        unmap_file(&m);
        return -1;
    }
    sd_gguf_writer *w = sd_gguf_writer_new();
    if (!w) {
        vocab_free(&v);
        unmap_file(&m);
        return sd_err(err, errlen, "out of memory");
    }
    const int64_t dim = c.dim, hid = c.hidden_dim, L = c.n_layers, nv = c.vocab_size;
    const int64_t head = dim / c.n_heads, kv_dim = head * c.n_kv_heads;

    // metadata
    const char *base = strrchr(ckpt, '/');
    base = base ? base + 1 : ckpt;
    char name[256];
    snprintf(name, sizeof name, "llama2.c %s", base);
    sd_gguf_w_str(w, "general.architecture", "llama");
    sd_gguf_w_str(w, "general.name", name);
    sd_gguf_w_u32(w, "llama.context_length", (uint32_t)c.seq_len);
    sd_gguf_w_u32(w, "llama.embedding_length", (uint32_t)dim);
    sd_gguf_w_u32(w, "llama.block_count", (uint32_t)L);
    sd_gguf_w_u32(w, "llama.feed_forward_length", (uint32_t)hid);
    sd_gguf_w_u32(w, "llama.attention.head_count", (uint32_t)c.n_heads);
    sd_gguf_w_u32(w, "llama.attention.head_count_kv", (uint32_t)c.n_kv_heads);
    sd_gguf_w_u32(w, "llama.rope.dimension_count", (uint32_t)head);
    sd_gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    sd_gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    sd_gguf_w_u32(w, "llama.vocab_size", (uint32_t)nv);
    sd_gguf_w_u32(w, "general.file_type", 0); // all F32
    sd_gguf_w_str(w, "tokenizer.ggml.model", "llama");
    sd_gguf_w_arr_strn(w, "tokenizer.ggml.tokens", (const char *const *)v.text, v.len, (uint64_t)nv);
    sd_gguf_w_arr_f32(w, "tokenizer.ggml.scores", v.score, (uint64_t)nv);
    sd_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.type, (uint64_t)nv);
    sd_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    sd_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    sd_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    sd_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 1);
    sd_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", 0);
    sd_gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", 1);

    // weights, in the checkpoint's order
    l2c_cursor cur = {(const float *)(const void *)(m.p + c.header_size)};
    const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
    if (c.version == 0) {
        emb = take(&cur, (uint64_t)(nv * dim));
        rms_att = take(&cur, (uint64_t)(L * dim));
        wq = take(&cur, (uint64_t)(L * dim * dim));
        wk = take(&cur, (uint64_t)(L * dim * kv_dim));
        wv = take(&cur, (uint64_t)(L * dim * kv_dim));
        wo = take(&cur, (uint64_t)(L * dim * dim));
        rms_ffn = take(&cur, (uint64_t)(L * dim));
        w1 = take(&cur, (uint64_t)(L * dim * hid));
        w2 = take(&cur, (uint64_t)(L * hid * dim));
        w3 = take(&cur, (uint64_t)(L * dim * hid));
        rms_final = take(&cur, (uint64_t)dim);
        take(&cur, (uint64_t)c.seq_len * (uint64_t)head); // freq_cis_real, freq_cis_imag: recomputed at run time
    } else {
        rms_att = take(&cur, (uint64_t)(L * dim));
        rms_ffn = take(&cur, (uint64_t)(L * dim));
        rms_final = take(&cur, (uint64_t)dim);
        emb = take(&cur, (uint64_t)(nv * dim));
        wq = take(&cur, (uint64_t)(L * dim * dim));
        wk = take(&cur, (uint64_t)(L * dim * kv_dim));
        wv = take(&cur, (uint64_t)(L * dim * kv_dim));
        wo = take(&cur, (uint64_t)(L * dim * dim));
        w1 = take(&cur, (uint64_t)(L * dim * hid));
        w2 = take(&cur, (uint64_t)(L * hid * dim));
        w3 = take(&cur, (uint64_t)(L * dim * hid));
    }
    wcls = c.shared ? NULL : take(&cur, (uint64_t)(nv * dim));

    put(w, "token_embd.weight", emb, dim, nv);
    for (int64_t l = 0; l < L; l++) {
        char tn[64];
#define T(suffix) (snprintf(tn, sizeof tn, "blk.%d." suffix ".weight", (int)l), tn)
        put(w, T("attn_norm"), rms_att + l * dim, dim, 1);
        put(w, T("attn_q"), wq + l * dim * dim, dim, dim);
        put(w, T("attn_k"), wk + l * dim * kv_dim, dim, kv_dim);
        put(w, T("attn_v"), wv + l * dim * kv_dim, dim, kv_dim);
        put(w, T("attn_output"), wo + l * dim * dim, dim, dim);
        put(w, T("ffn_norm"), rms_ffn + l * dim, dim, 1);
        put(w, T("ffn_gate"), w1 + l * dim * hid, dim, hid);
        put(w, T("ffn_down"), w2 + l * hid * dim, hid, dim);
        put(w, T("ffn_up"), w3 + l * dim * hid, dim, hid);
#undef T
    }
    put(w, "output_norm.weight", rms_final, dim, 1);
    if (wcls) put(w, "output.weight", wcls, dim, nv);

    char werr[256];
    int rc = sd_gguf_writer_write(w, out, werr, sizeof werr);
    if (rc < 0) rc = sd_err(err, errlen, "cannot write '%s': %s", out, werr);
    sd_gguf_writer_free(w);
    vocab_free(&v);
    unmap_file(&m);
    return rc < 0 ? -1 : 0;
}
