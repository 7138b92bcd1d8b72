// model.c - loading and validating a llama / qwen2 GGUF model.
//
// Everything the forward pass trusts is checked here (docs/house-rules.md, rule 5): the
// hyperparameters, the presence, shape and type of every tensor. Error
// messages name the key or tensor at fault.
#include "model/model.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "specdec.h"
#include "model/tokenizer.h"

// Reads "<arch>.<suffix>" as an integer. Returns 0 found, 1 absent, <0 error.
static int get_int(const sd_gguf *g, const char *arch, const char *suffix, int64_t *out,
                   char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return sd_gguf_get_i64(g, key, out, err, errlen);
}

static int get_f32(const sd_gguf *g, const char *arch, const char *suffix, float *out,
                   char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return sd_gguf_get_f32(g, key, out, err, errlen);
}

// Required positive integer hyperparameter in [1, max].
static int req_int(const sd_gguf *g, const char *arch, const char *suffix, int64_t max, int *out,
                   char *err, size_t errlen) {
    int64_t v = 0;
    int r = get_int(g, arch, suffix, &v, err, errlen);
    if (r < 0) return r;
    if (r == 1) return sd_err(err, errlen, "missing key '%s.%s'", arch, suffix);
    if (v < 1 || v > max)
        return sd_err(err, errlen, "key '%s.%s' has value %lld, expected 1..%lld", arch, suffix,
                      (long long)v, (long long)max);
    *out = (int)v;
    return 0;
}

// Optional positive integer hyperparameter: keeps *out (the default) if absent.
static int opt_int(const sd_gguf *g, const char *arch, const char *suffix, int64_t max, int *out,
                   char *err, size_t errlen) {
    int64_t v = 0;
    int r = get_int(g, arch, suffix, &v, err, errlen);
    if (r < 0) return r;
    if (r == 1) return 0;
    if (v < 1 || v > max)
        return sd_err(err, errlen, "key '%s.%s' has value %lld, expected 1..%lld", arch, suffix,
                      (long long)v, (long long)max);
    *out = (int)v;
    return 0;
}

static void fmt_shape(char *buf, size_t n, const int64_t *ne, int n_dims) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < n_dims && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

// Finds tensor `name` and checks its shape (n_dims expected dims, the rest 1)
// and type. kind 0: a matrix (any compute-supported type whose block divides
// ne[0]); kind 1: a vector that must be F32. Sets *out (NULL if absent and
// optional).
static int get_tensor(const sd_gguf *g, const char *name, int n_dims, int64_t ne0, int64_t ne1,
                      int kind, int optional, const sd_tensor **out, char *err, size_t errlen) {
    const sd_tensor *t = sd_gguf_find_tensor(g, name);
    *out = NULL;
    if (!t) {
        if (optional) return 0;
        return sd_err(err, errlen, "missing tensor '%s'", name);
    }
    int64_t want[SD_MAX_DIMS] = {ne0, ne1, 1, 1};
    int ok = 1;
    for (int i = 0; i < SD_MAX_DIMS; i++)
        if (t->ne[i] != (i < n_dims ? want[i] : 1)) ok = 0;
    if (!ok) {
        char got[96], exp[96];
        int nd = t->n_dims > n_dims ? t->n_dims : n_dims;
        if (nd > SD_MAX_DIMS) nd = SD_MAX_DIMS;
        fmt_shape(got, sizeof got, t->ne, nd);
        fmt_shape(exp, sizeof exp, want, n_dims);
        return sd_err(err, errlen, "tensor '%s' has shape %s, expected %s", name, got, exp);
    }
    const sd_type_traits *tr = sd_type_get(t->type);
    if (kind == 1) {
        if (t->type != SD_TYPE_F32)
            return sd_err(err, errlen, "tensor '%s' has type %s, expected F32", name,
                          tr && tr->name ? tr->name : "unknown");
    } else {
        if (!tr || !tr->supported)
            return sd_err(err, errlen, "tensor '%s' has type %s (id %d), which specdec cannot compute with",
                          name, tr && tr->name ? tr->name : "unknown", t->type);
        if (ne0 % tr->blck != 0)
            return sd_err(err, errlen, "tensor '%s' of type %s has rows of %lld elements, not a multiple of %d",
                          name, tr->name, (long long)ne0, tr->blck);
    }
    if (t->nbytes < sd_row_size(t->type, ne0) * (size_t)ne1)
        return sd_err(err, errlen, "tensor '%s' holds %zu bytes, fewer than its shape needs", name,
                      t->nbytes);
    *out = t;
    return 0;
}

static int load_hparams(sd_model *m, char *err, size_t errlen) {
    const sd_gguf *g = m->gguf;
    sd_hparams *hp = &m->hp;
    sd_str s;
    int r = sd_gguf_get_str(g, "general.architecture", &s, err, errlen);
    if (r < 0) return r;
    if (r == 1) return sd_err(err, errlen, "missing key 'general.architecture'");
    if (sd_str_eq(s, "llama")) {
        hp->arch = SD_ARCH_LLAMA;
        hp->rope_type = SD_ROPE_NORM;
    } else if (sd_str_eq(s, "qwen2")) {
        hp->arch = SD_ARCH_QWEN2;
        hp->rope_type = SD_ROPE_NEOX;
    } else {
        int n = s.len > 64 ? 64 : (int)s.len;
        return sd_err(err, errlen, "unsupported architecture '%.*s' (general.architecture); supported: llama, qwen2",
                      n, s.ptr);
    }
    const char *arch = hp->arch == SD_ARCH_LLAMA ? "llama" : "qwen2";
    snprintf(m->arch_name, sizeof m->arch_name, "%s", arch);
    m->name[0] = 0;
    if (sd_gguf_get_str(g, "general.name", &s, NULL, 0) == 0) {
        size_t n = s.len < sizeof m->name - 1 ? s.len : sizeof m->name - 1;
        memcpy(m->name, s.ptr, n);
        m->name[n] = 0;
    }

    const int64_t big = 1 << 20;
    // A split client's file (specdec split-client, docs/split.md) holds the
    // embeddings and, for an MoA drafter with TLI = N, only the target's last
    // N layers [client_lo, n_layer): it drafts, it never runs a forward.
    int64_t cl = 0;
    if ((r = sd_gguf_get_i64(g, "specdec.client.n_layer", &cl, err, errlen)) < 0) return r;
    if (r == 0) {
        if (cl < 1 || cl > 4096)
            return sd_err(err, errlen, "key 'specdec.client.n_layer' has value %lld, expected 1..4096", (long long)cl);
        hp->n_layer = (int)cl;
        m->client = 1;
        m->client_lo = hp->n_layer;
        int64_t lo = cl;
        if ((r = sd_gguf_get_i64(g, "specdec.client.layer_lo", &lo, err, errlen)) < 0) return r;
        if (lo < 0 || lo > cl)
            return sd_err(err, errlen, "key 'specdec.client.layer_lo' has value %lld, expected 0..%lld",
                          (long long)lo, (long long)cl);
        m->client_lo = (int)lo;
    } else if ((r = req_int(g, arch, "block_count", 4096, &hp->n_layer, err, errlen))) return r;
    if ((r = req_int(g, arch, "embedding_length", big, &hp->n_embd, err, errlen))) return r;
    if ((r = req_int(g, arch, "feed_forward_length", big, &hp->n_ff, err, errlen))) return r;
    if ((r = req_int(g, arch, "attention.head_count", 4096, &hp->n_head, err, errlen))) return r;
    hp->n_head_kv = hp->n_head;
    if ((r = opt_int(g, arch, "attention.head_count_kv", 4096, &hp->n_head_kv, err, errlen))) return r;
    if (hp->n_head % hp->n_head_kv != 0)
        return sd_err(err, errlen, "%s.attention.head_count %d is not a multiple of head_count_kv %d",
                      arch, hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->n_embd / hp->n_head;
    if (hp->n_embd % hp->n_head != 0) hp->head_dim = 0;
    if ((r = opt_int(g, arch, "attention.key_length", 65536, &hp->head_dim, err, errlen))) return r;
    if (hp->head_dim == 0)
        return sd_err(err, errlen, "%s.embedding_length %d is not a multiple of head_count %d and "
                      "attention.key_length is absent", arch, hp->n_embd, hp->n_head);
    int vlen = hp->head_dim;
    if ((r = opt_int(g, arch, "attention.value_length", 65536, &vlen, err, errlen))) return r;
    if (vlen != hp->head_dim)
        return sd_err(err, errlen, "%s.attention.value_length %d differs from key_length %d (unsupported)",
                      arch, vlen, hp->head_dim);
    hp->n_ctx_train = 4096;
    if ((r = opt_int(g, arch, "context_length", 1 << 24, &hp->n_ctx_train, err, errlen))) return r;
    hp->n_rot = hp->head_dim;
    if ((r = opt_int(g, arch, "rope.dimension_count", 65536, &hp->n_rot, err, errlen))) return r;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return sd_err(err, errlen, "%s.rope.dimension_count %d must be even and <= head dim %d", arch,
                      hp->n_rot, hp->head_dim);
    hp->rms_eps = 1e-5f;
    if ((r = get_f32(g, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, errlen)) < 0) return r;
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1))
        return sd_err(err, errlen, "%s.attention.layer_norm_rms_epsilon %g out of range", arch,
                      (double)hp->rms_eps);
    hp->rope_base = 10000.0f;
    if ((r = get_f32(g, arch, "rope.freq_base", &hp->rope_base, err, errlen)) < 0) return r;
    if (!(hp->rope_base > 1))
        return sd_err(err, errlen, "%s.rope.freq_base %g out of range", arch, (double)hp->rope_base);

    // RoPE scaling: linear only. Older files say rope.scale_linear.
    hp->rope_scale = 1.0f;
    float factor = 1.0f;
    int have_factor = 0;
    if ((r = get_f32(g, arch, "rope.scaling.factor", &factor, err, errlen)) < 0) return r;
    if (r == 0) have_factor = 1;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    r = sd_gguf_get_str(g, key, &s, err, errlen);
    if (r < 0) return r;
    if (r == 0 && !sd_str_eq(s, "none")) {
        if (sd_str_eq(s, "linear")) {
            if (have_factor && factor > 0) hp->rope_scale = factor;
        } else if (have_factor && factor != 1.0f && factor != 0.0f) {
            int n = s.len > 32 ? 32 : (int)s.len;
            return sd_err(err, errlen, "unsupported RoPE scaling '%.*s' with factor %g (%s); only linear is supported",
                          n, s.ptr, (double)factor, key);
        }
    } else if (r == 1) {
        float lin = 0;
        if ((r = get_f32(g, arch, "rope.scale_linear", &lin, err, errlen)) < 0) return r;
        if (r == 0 && lin > 0) hp->rope_scale = lin;
    }
    if (!(hp->rope_scale > 0))
        return sd_err(err, errlen, "RoPE scaling factor %g out of range", (double)hp->rope_scale);
    return 0;
}

static int load_tensors(sd_model *m, char *err, size_t errlen) {
    const sd_gguf *g = m->gguf;
    sd_hparams *hp = &m->hp;
    int r;
    const sd_tensor *te = sd_gguf_find_tensor(g, "token_embd.weight");
    if (!te) return sd_err(err, errlen, "missing tensor 'token_embd.weight'");
    if (te->ne[1] < 1 || te->ne[1] > (1 << 24))
        return sd_err(err, errlen, "tensor 'token_embd.weight' has %lld rows, expected 1..%d",
                      (long long)te->ne[1], 1 << 24);
    hp->n_vocab = (int)te->ne[1];
    const int64_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff;
    const int64_t Q = (int64_t)hp->n_head * hp->head_dim, KV = (int64_t)hp->n_head_kv * hp->head_dim;
    if ((r = get_tensor(g, "token_embd.weight", 2, E, V, 0, 0, &m->tok_embd, err, errlen))) return r;
    if ((r = get_tensor(g, "output_norm.weight", 1, E, 1, 1, 0, &m->out_norm, err, errlen))) return r;
    if ((r = get_tensor(g, "output.weight", 2, E, V, 0, 1, &m->output, err, errlen))) return r;
    if (!m->output) m->output = m->tok_embd;

    m->layers = calloc((size_t)hp->n_layer, sizeof(sd_layer));
    if (!m->layers) return sd_err(err, errlen, "out of memory");
    for (int l = m->client ? m->client_lo : 0; l < hp->n_layer; l++) {   // a client file: its layers only
        sd_layer *L = &m->layers[l];
        char nm[96];
#define T(field, suffix, nd, a, b, kind, opt)                                                  \
    do {                                                                                       \
        snprintf(nm, sizeof nm, "blk.%d." suffix, l);                                          \
        if ((r = get_tensor(g, nm, nd, a, b, kind, opt, &L->field, err, errlen))) return r;     \
    } while (0)
        T(attn_norm, "attn_norm.weight", 1, E, 1, 1, 0);
        T(wq, "attn_q.weight", 2, E, Q, 0, 0);
        T(wk, "attn_k.weight", 2, E, KV, 0, 0);
        T(wv, "attn_v.weight", 2, E, KV, 0, 0);
        T(wo, "attn_output.weight", 2, Q, E, 0, 0);
        T(bq, "attn_q.bias", 1, Q, 1, 1, 1);
        T(bk, "attn_k.bias", 1, KV, 1, 1, 1);
        T(bv, "attn_v.bias", 1, KV, 1, 1, 1);
        T(ffn_norm, "ffn_norm.weight", 1, E, 1, 1, 0);
        T(w_gate, "ffn_gate.weight", 2, E, F, 0, 0);
        T(w_up, "ffn_up.weight", 2, E, F, 0, 0);
        T(w_down, "ffn_down.weight", 2, F, E, 0, 0);
#undef T
    }
    m->n_bytes = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) m->n_bytes += g->tensors[i].nbytes;
    return 0;
}

// Bytes the repacked copy of t takes in the arena (0: not repacked).
static size_t matrix_bytes(const sd_tensor *t) { return sd_row_size(t->type, t->ne[0]) * (size_t)t->ne[1]; }
static size_t repack_bytes(const sd_tensor *t) {
    if (sd_quant_repack_type(t->type, t->ne[0]) < 0) return 0;
    return (matrix_bytes(t) + 64 + 4095) / 4096 * 4096; // + 64: kernels may read a vector past the end
}

// Rewrites the matrix *field into the kernel's layout at *cursor (advanced),
// pointing *field at the model's copy. A matrix the kernel does not take
// stays as it is.
static void repack_one(sd_model *m, const sd_tensor **field, uint8_t **cursor) {
    const sd_tensor *t = *field;
    const size_t size = repack_bytes(t);
    if (!size) return;
    const int rt = sd_quant_repack_type(t->type, t->ne[0]);
    uint8_t *buf = *cursor;
    *cursor += size;
    if (sd_type_get(rt)->repack(t->data, buf, t->ne[0], t->ne[1]) != 0) return;
    const size_t nb = matrix_bytes(t);
    // The file's copy is not read again (token_embd, looked up by row, is never
    // repacked itself): give its pages back to the page cache. A model part
    // (sd_model_load_part) gives back token_embd's too, once its tied output
    // is repacked: its lookups fault in the few rows they read.
    if (t != m->tok_embd || m->layer_hi - m->layer_lo < m->hp.n_layer) {
        uintptr_t a = ((uintptr_t)t->data + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)t->data + nb) & ~(uintptr_t)4095;
        if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
    }
    sd_tensor *c = &m->rp[m->n_rp];
    *c = *t;
    c->type = rt;
    c->data = buf;
    c->nbytes = nb;
    m->rp_src[m->n_rp++] = t;
    *field = c;
}

const sd_tensor *sd_model_file_tensor(const sd_model *m, const sd_tensor *t) {
    if (t && m->rp && t >= m->rp && t < m->rp + m->n_rp) return m->rp_src[t - m->rp];
    return t;
}

// Every matrix that goes through sd_matmul (not token_embd, whose rows are
// looked up: a tied output gets its own repacked copy), into one arena in
// the order the forward reads them. The arena is aligned to 2 MiB and asks
// for transparent huge pages: the forward streams every weight once per
// call, and with 4 KiB pages a 100 MB model costs ~25000 TLB misses per
// forward; the first touch also takes a few hundred page faults instead.
static int repack_weights(sd_model *m, char *err, size_t errlen) {
    const int n_max = m->hp.n_layer * 7 + 1;
    m->rp = calloc((size_t)n_max, sizeof(sd_tensor));
    m->rp_src = calloc((size_t)n_max, sizeof(sd_tensor *));
    const sd_tensor ***fields = malloc((size_t)n_max * sizeof(*fields));
    if (!m->rp || !m->rp_src || !fields) {
        free(fields);
        return sd_err(err, errlen, "out of memory");
    }
    int nf = 0;
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        sd_layer *L = &m->layers[l];
        const sd_tensor **f[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) fields[nf++] = f[i];
    }
    if (m->has_output) fields[nf++] = &m->output;
    size_t total = 0;
    for (int i = 0; i < nf; i++) total += repack_bytes(*fields[i]);
    if (total == 0) {
        free(fields);
        return 0;
    }
    const size_t huge = (size_t)2 << 20;
    size_t map = total + huge;
    uint8_t *raw = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        free(fields);
        return sd_err(err, errlen, "out of memory: %.0f MiB for the repacked weights", (double)total / (1 << 20));
    }
    // keep the 2 MiB aligned part, give back the rest
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    const size_t tail = (size_t)(raw + map - (base + total));
    if (tail) munmap(base + total, tail);
    m->rp_arena = base;
    m->rp_arena_size = total;
#ifdef MADV_HUGEPAGE
    (void)madvise(base, total, MADV_HUGEPAGE);
#endif
    uint8_t *cursor = base;
    for (int i = 0; i < nf; i++) repack_one(m, fields[i], &cursor);
    free(fields);
    return 0;
}

// Tensor bytes of the held layers and output (n_bytes_held).
static size_t held_bytes(const sd_model *m) {
    size_t n = 0;
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        const sd_layer *L = &m->layers[l];
        const sd_tensor *ts[12] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq,
                                   L->bk, L->bv, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; i < 12; i++)
            if (ts[i]) n += sd_model_file_tensor(m, ts[i])->nbytes;
    }
    if (m->has_output) n += m->out_norm->nbytes + sd_model_file_tensor(m, m->output)->nbytes;
    return n;
}

int sd_model_load(sd_model **out, const char *path, char *err, size_t errlen) {
    return sd_model_load_part(out, path, 0, -1, 1, err, errlen);
}

int sd_model_load_part(sd_model **out, const char *path, int layer_lo, int layer_hi, int output, char *err,
                       size_t errlen) {
    if (!out) return sd_err(err, errlen, "sd_model_load: out is NULL");
    *out = NULL;
    const int whole = layer_lo == 0 && layer_hi < 0 && output;
    if (!whole && (layer_lo < 0 || layer_hi < layer_lo))
        return sd_err(err, errlen, "%s: bad layer range [%d, %d)", path ? path : "(null)", layer_lo, layer_hi);
    // The kernel family is fixed once per process: the one sd_backend_select
    // chose, else "auto" (never reinstalled under running sessions).
    sd_quant_fix_for_model();
    sd_model *m = calloc(1, sizeof(*m));
    if (!m) return sd_errc(SD_ERR_OOM, err, errlen, "out of memory");
    int r = sd_gguf_open_map(&m->gguf, path, whole, err, errlen);
    if (r < 0) {
        free(m);
        return r;
    }
    char sub[400];
    if ((r = load_hparams(m, sub, sizeof sub)) < 0 || (r = load_tensors(m, sub, sizeof sub)) < 0) {
        sd_err(err, errlen, "%s: %s", path, sub);
        sd_model_free(m);
        return r;
    }
    m->layer_lo = whole ? 0 : layer_lo;
    m->layer_hi = whole ? m->hp.n_layer : layer_hi;
    m->has_output = output != 0;
    if (m->client) {   // a split client's file: nothing held for a forward (its layers are read by the drafter)
        if (!whole) {
            sd_err(err, errlen, "%s: a split client's file holds no layers to run", path);
            sd_model_free(m);
            return SD_ERR_INPUT;
        }
        m->layer_lo = m->layer_hi = m->hp.n_layer;
        m->has_output = 0;
    }
    if (m->layer_hi > m->hp.n_layer) {
        sd_err(err, errlen, "%s: layer range [%d, %d) exceeds the model's %d layers", path, m->layer_lo, m->layer_hi,
               m->hp.n_layer);
        sd_model_free(m);
        return SD_ERR_INPUT;
    }
    if ((r = repack_weights(m, sub, sizeof sub)) < 0) {
        sd_err(err, errlen, "%s: %s", path, sub);
        sd_model_free(m);
        return r;
    }
    if ((r = sd_tokenizer_load(&m->tok, m->gguf, sub, sizeof sub)) < 0) {
        sd_err(err, errlen, "%s: tokenizer: %s", path, sub);
        sd_model_free(m);
        return r;
    }
    m->n_bytes_held = held_bytes(m);
    *out = m;
    return 0;
}

void sd_model_free(sd_model *m) {
    if (!m) return;
    if (m->gpu && m->gpu_free) m->gpu_free(m->gpu);
    if (m->tok) sd_tokenizer_free(m->tok);
    free(m->layers);
    if (m->rp_arena) munmap(m->rp_arena, m->rp_arena_size);
    free(m->rp_src);
    free(m->rp);
    if (m->gguf) sd_gguf_close(m->gguf);
    free(m);
}

void sd_model_get_info(const sd_model *m, sd_model_info *info) {
    memset(info, 0, sizeof *info);
    info->arch = m->arch_name;
    info->name = m->name;
    info->n_vocab = m->hp.n_vocab;
    info->n_embd = m->hp.n_embd;
    info->n_layer = m->hp.n_layer;
    info->n_head = m->hp.n_head;
    info->n_head_kv = m->hp.n_head_kv;
    info->head_dim = m->hp.head_dim;
    info->n_ff = m->hp.n_ff;
    info->n_ctx_train = m->hp.n_ctx_train;
    info->n_bytes = m->n_bytes;
    info->layer_lo = m->layer_lo;
    info->layer_hi = m->layer_hi;
    info->has_output = m->has_output;
    info->n_bytes_held = m->n_bytes_held;
}

const sd_tokenizer *sd_model_tokenizer(const sd_model *m) { return m->tok; }

int sd_model_token_embd(const sd_model *m, int32_t token, float *out, char *err, size_t errlen) {
    const int E = m->hp.n_embd;
    if (token < 0 || token >= m->hp.n_vocab)
        return sd_err(err, errlen, "token_embd: token %d is out of range (n_vocab %d)", token, m->hp.n_vocab);
    if (!out) return sd_err(err, errlen, "token_embd: no output buffer");
    // the forward's embedding lookup does the same (forward.c), so a batch of
    // these rows gives the token batch's bits
    const sd_type_traits *et = sd_type_get(m->tok_embd->type);
    et->to_float((const uint8_t *)m->tok_embd->data + (size_t)token * sd_row_size(m->tok_embd->type, E), out, E);
    return 0;
}
