// test_head_file_checks.c - draft head files (src/head/): an EAGLE-3 and a Medusa
// head saved and loaded back give the same parameters (F32 exactly, F16 and
// Q8_0 within their rounding) and draft vocabulary; the file carries
// llama.cpp's eagle3 keys and tensors (test_head_llama_layout.c has the rest
// of that layout and the older one); truncated or corrupted files, files
// that are not heads, heads made for another target, and heads with corrupt
// metadata (NaN RoPE base, zero lengths, a vocabulary size or hidden size
// that disagrees, a boolean of 7, the other head type, another layout's
// tensors) are refused with a message naming the key and the value.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "head/head.h"
#include "kernels/quant.h"
#include "lib/synth.h"
#include "model/gguf.h"
#include "model/model.h"
#include "specdec.h"
#include "t.h"

static char g_err[512];
static char g_dir[128];

static const char *tmp_path(const char *tag) {
    static char p[8][256];
    static int k;
    char *s = p[k++ % 8];
    snprintf(s, 256, "%s/%s", g_dir, tag);
    return s;
}

static sd_model *synth_model(int n_vocab, int n_embd, int n_layer, uint64_t seed) {
    synth_params p = synth_default_params();
    p.n_vocab = n_vocab;
    p.n_embd = n_embd;
    p.n_layer = n_layer;
    p.seed = seed;
    const char *path = tmp_path("model.gguf");
    sd_model *m = NULL;
    if (synth_write(path, &p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

static sd_head *make_head(const sd_model *m, int type) {
    sd_head_hp hp = sd_head_default_hp(m, type);
    hp.n_draft_vocab = 100;
    sd_head *h = NULL;
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0) return NULL;
    sd_head_init(h, 7);
    // Make the gains non-trivial so that a lost tensor shows.
    for (int i = 0; i < h->n_t; i++)
        if (h->t[i].is_norm)
            for (int64_t j = 0; j < h->t[i].ne0; j++) sd_head_w(h, i)[j] = 0.5f + 0.01f * (float)j;
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 3 * (99 - i) + 1;   // unsorted on purpose
    if (sd_head_set_vocab(h, ids, 100, g_err, sizeof g_err) < 0) {
        sd_head_free(h);
        return NULL;
    }
    snprintf(h->note, sizeof h->note, "seed=7\nrecipe=test");
    return h;
}

static double max_rel_diff(const sd_head *a, const sd_head *b) {
    double worst = 0.0;
    for (int i = 0; i < a->n_t; i++) {
        const float *x = sd_head_w(a, i), *y = sd_head_w(b, i);
        double mx = 1e-12;
        size_t n = (size_t)(a->t[i].ne0 * a->t[i].ne1);
        for (size_t j = 0; j < n; j++) mx = fmax(mx, fabs(x[j]));
        for (size_t j = 0; j < n; j++) worst = fmax(worst, fabs(x[j] - y[j]) / mx);
    }
    return worst;
}

static void roundtrip(int type) {
    sd_model *m = synth_model(320, 64, 8, 1);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = make_head(m, type);
    CHECK(h, "%s", g_err);
    if (!h) {
        sd_model_free(m);
        return;
    }
    CHECK(h->d2t[0] == 1 && h->d2t[99] == 298, "d2t sorted: %d %d", h->d2t[0], h->d2t[99]);
    CHECK(h->t2d[4] == 1 && h->t2d[5] == -1, "t2d: %d %d", h->t2d[4], h->t2d[5]);
    const int types[3] = {SD_TYPE_F32, SD_TYPE_F16, SD_TYPE_Q8_0};
    const double tol[3] = {0.0, 1e-3, 1.0 / 127.0 + 1e-4};
    for (int k = 0; k < 3; k++) {
        const char *path = tmp_path("head.gguf");
        int rc = sd_head_save(h, path, types[k], g_err, sizeof g_err);
        CHECK(rc == 0, "save: %s", g_err);
        sd_head *b = NULL;
        rc = sd_head_load(&b, path, m, g_err, sizeof g_err);
        CHECK(rc == 0 && b, "load type %d: %s", types[k], g_err);
        if (!b) continue;
        CHECK(memcmp(&b->hp, &h->hp, sizeof h->hp) == 0, "hyper-parameters differ after a round trip");
        CHECK(memcmp(b->d2t, h->d2t, sizeof(int32_t) * 100) == 0, "d2t differs");
        double d = max_rel_diff(h, b);
        CHECK(d <= tol[k], "type %d: parameters differ by %g (bar %g)", types[k], d, tol[k]);
        CHECK(strcmp(b->note, h->note) == 0, "note '%s'", b->note);
        sd_head_free(b);
        remove(path);
    }
    sd_head_free(h);
    sd_model_free(m);
}

static void test_eagle3_roundtrip(void) { roundtrip(SD_HEAD_EAGLE3); }
static void test_medusa_roundtrip(void) { roundtrip(SD_HEAD_MEDUSA); }

// The file speaks llama.cpp's eagle3 layout.
static void test_eagle3_layout(void) {
    sd_model *m = synth_model(320, 64, 8, 1);
    if (!m) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_head *h = make_head(m, SD_HEAD_EAGLE3);
    const char *path = tmp_path("layout.gguf");
    CHECK(h && sd_head_save(h, path, SD_TYPE_F16, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_gguf *g = NULL;
    CHECK(sd_gguf_open(&g, path, g_err, sizeof g_err) == 0, "%s", g_err);
    if (g && h) {
        sd_str a;
        CHECK(sd_gguf_get_str(g, "general.architecture", &a, g_err, sizeof g_err) == 0 && sd_str_eq(a, "eagle3"),
              "architecture");
        const sd_gguf_kv *kv = sd_gguf_find_key(g, "eagle3.target_layers");
        CHECK(h->hp.extract[0] == 2 && h->hp.extract[1] == 4 && h->hp.extract[2] == 5,
              "extract layers default to {2, L/2, L-3}");
        CHECK(kv && kv->n == 3 && sd_gguf_arr_i64(kv, 0) == 3 && sd_gguf_arr_i64(kv, 1) == 5 &&
                  sd_gguf_arr_i64(kv, 2) == 6,
              "llama.cpp numbers the inputs of layers: the outputs of blocks 2, 4, 5 are target_layers 3, 5, 6");
        CHECK(!sd_gguf_find_key(g, "eagle3.extract_layers"), "the older key is not written");
        uint32_t v = 0;
        CHECK(sd_gguf_get_u32(g, "eagle3.target_hidden_size", &v, g_err, sizeof g_err) == 0 && v == 64, "hidden size");
        const sd_tensor *q = sd_gguf_find_tensor(g, "blk.0.attn_q.weight");
        CHECK(q && q->ne[0] == 128 && q->ne[1] == 64, "Q reads 2*n_embd inputs");
        const sd_tensor *fc = sd_gguf_find_tensor(g, "fc.weight");
        CHECK(fc && fc->ne[0] == 192 && fc->ne[1] == 64, "fc fuses 3 layers");
        const sd_tensor *d2t = sd_gguf_find_tensor(g, "d2t");
        CHECK(d2t && d2t->type == 27 && d2t->ne[0] == 100, "d2t is I64 of the draft vocabulary");
        if (d2t) {
            int64_t o5;
            memcpy(&o5, (const char *)d2t->data + 5 * 8, 8);
            CHECK(o5 == h->d2t[5], "d2t holds target ids (llama.cpp): %lld", (long long)o5);
        }
        CHECK(!sd_gguf_find_tensor(g, "token_embd.weight"), "token_embd is borrowed from the target");
    }
    sd_gguf_close(g);
    remove(path);
    sd_head_free(h);
    sd_model_free(m);
}

// Truncated, corrupted, not-a-head and other-target files are refused.
static void test_bad_files(void) {
    sd_model *m = synth_model(320, 64, 8, 1);
    if (!m) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_head *h = make_head(m, SD_HEAD_EAGLE3);
    const char *path = tmp_path("bad.gguf");
    CHECK(h && sd_head_save(h, path, SD_TYPE_Q8_0, g_err, sizeof g_err) == 0, "%s", g_err);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, "read");
    fclose(f);
    sd_head *b = NULL;
    // truncated
    const char *p2 = tmp_path("trunc.gguf");
    f = fopen(p2, "wb");
    fwrite(buf, 1, (size_t)n - 100, f);
    fclose(f);
    CHECK(sd_head_load(&b, p2, m, g_err, sizeof g_err) < 0 && !b, "truncated file loaded");
    CHECK(strstr(g_err, "trunc.gguf") != NULL, "message names the file: %s", g_err);
    printf("  truncated: %s\n", g_err);
    // the key of the extract layers renamed: missing key
    char *k = memmem(buf, (size_t)n, "eagle3.target_layers", 20);
    CHECK(k != NULL, "key present");
    if (k) {
        k[0] = 'X';
        f = fopen(p2, "wb");
        fwrite(buf, 1, (size_t)n, f);
        fclose(f);
        CHECK(sd_head_load(&b, p2, m, g_err, sizeof g_err) < 0 && strstr(g_err, "target_layers"),
              "missing key: %s", g_err);
        printf("  missing key: %s\n", g_err);
        k[0] = 'e';
    }
    // a NaN in a norm gain
    sd_head_w(h, SD_E3_FFN_NORM)[3] = NAN;
    CHECK(sd_head_save(h, p2, SD_TYPE_F32, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_head_load(&b, p2, m, g_err, sizeof g_err) < 0 && strstr(g_err, "non-finite"), "NaN: %s", g_err);
    sd_head_w(h, SD_E3_FFN_NORM)[3] = 1.0f;
    // a model is not a head
    synth_params sp = synth_default_params();
    CHECK(synth_write(p2, &sp, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_head_load(&b, p2, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "not a draft head"), "model: %s",
          g_err);
    printf("  a model: %s\n", g_err);
    // heads for other targets: vocabulary size, hidden size, layers, same sizes other tokens
    struct { int nv, ne, nl; const char *word; } other[3] = {
        {400, 64, 8, "vocabulary"}, {320, 32, 8, "hidden size"}, {320, 64, 6, "layers"}};
    for (int i = 0; i < 3; i++) {
        sd_model *o = synth_model(other[i].nv, other[i].ne, other[i].nl, 1);
        CHECK(o, "%s", g_err);
        if (!o) continue;
        CHECK(sd_head_load(&b, path, o, g_err, sizeof g_err) < 0 && strstr(g_err, other[i].word),
              "other target (%s): %s", other[i].word, g_err);
        printf("  other target: %s\n", g_err);
        sd_model_free(o);
    }
    // Same sizes, other tokens: the fingerprint.
    sd_head_hp hp = h->hp;
    hp.target_vocab_hash ^= 1;
    h->hp = hp;
    CHECK(sd_head_save(h, p2, SD_TYPE_F16, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_head_load(&b, p2, m, g_err, sizeof g_err) < 0 && strstr(g_err, "fingerprint"), "fingerprint: %s", g_err);
    printf("  fingerprint: %s\n", g_err);
    // Saving into a directory that does not exist fails with a message and leaves nothing.
    CHECK(sd_head_save(h, "/nonexistent-dir/h.gguf", SD_TYPE_F16, g_err, sizeof g_err) < 0, "save into nowhere");
    free(buf);
    remove(path);
    remove(p2);
    sd_head_free(h);
    sd_model_free(m);
}

// The value of key in a GGUF image: the key as written (u64 length, then its
// bytes) is followed by its u32 type and the value. Returns the value's offset
// (and *type), or -1.
static long key_value_at(const char *buf, long n, const char *key, uint32_t *type) {
    const size_t kl = strlen(key);
    for (long i = 8; i + (long)kl + 8 <= n; i++) {
        uint64_t len;
        memcpy(&len, buf + i - 8, 8);
        if (len != kl || memcmp(buf + i, key, kl) != 0) continue;
        memcpy(type, buf + i + kl, 4);
        return i + (long)kl + 4;
    }
    return -1;
}

// One corruption of a head file: key set to a value of its own type, and
// what the refusal must say besides the key.
typedef struct {
    const char *key;
    uint32_t type;      // GGUF value type the key has (checked, then overwritten in place)
    uint32_t u;         // U32 value or BOOL byte
    float f;            // F32 value
    const char *s;      // STRING value (same length as the original)
    const char *says;   // the bad value as the message gives it
} corruption;

// Writes buf with c applied to path; 0, or -1 if the key is not found as expected.
static int write_corrupted(const char *path, const char *buf, long n, const corruption *c) {
    char *b = malloc((size_t)n);
    if (!b) return -1;
    memcpy(b, buf, (size_t)n);
    uint32_t ty = 0;
    long at = key_value_at(b, n, c->key, &ty);
    int ok = at >= 0 && ty == c->type;
    if (ok && ty == 4) memcpy(b + at, &c->u, 4);
    else if (ok && ty == 7) b[at] = (char)c->u;
    else if (ok && ty == 6) memcpy(b + at, &c->f, 4);
    else if (ok && ty == 8) {
        uint64_t len;
        memcpy(&len, b + at, 8);
        ok = len == strlen(c->s);
        if (ok) memcpy(b + at + 8, c->s, len);
    } else {
        ok = 0;
    }
    FILE *f = ok ? fopen(path, "wb") : NULL;
    if (f) {
        ok = fwrite(b, 1, (size_t)n, f) == (size_t)n;
        fclose(f);
    }
    free(b);
    return ok && f ? 0 : -1;
}

static char *read_all(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)*n);
    if (buf && fread(buf, 1, (size_t)*n, f) != (size_t)*n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

// Head files with corrupt metadata (issue 27's probe and kin) are refused,
// each with a message naming the key and the bad value, with or without
// the target at hand; the untouched file loads.
static void test_bad_metadata(void) {
    sd_model *m = synth_model(320, 64, 8, 1);
    if (!m) {
        CHECK(0, "%s", g_err);
        return;
    }
    static const corruption e3[] = {
        {"eagle3.rope.freq_base", 6, 0, NAN, NULL, "nan"},
        {"eagle3.rope.freq_base", 6, 0, INFINITY, NULL, "inf"},
        {"eagle3.rope.freq_base", 6, 0, 0.5f, NULL, "0.5"},
        {"eagle3.context_length", 4, 0, 0, NULL, "= 0"},
        {"eagle3.attention.key_length", 4, 0, 0, NULL, "= 0"},
        {"eagle3.attention.key_length", 4, 15, 0, NULL, "= 15"},
        {"eagle3.attention.value_length", 4, 18, 0, NULL, "= 18"},
        {"eagle3.vocab_size", 4, 1000, 0, NULL, "= 1000"},
        {"eagle3.norm_before_residual", 7, 7, 0, NULL, "= 7"},
        {"specdec.target.n_embd", 4, 1024, 0, NULL, "= 1024"},
        {"specdec.head.type", 8, 0, 0, "medusa", "'medusa'"},
        {"eagle3.attention.layer_norm_rms_epsilon", 6, 0, -1.0f, NULL, "= -1"},
        {"eagle3.attention.layer_norm_rms_epsilon", 6, 0, NAN, NULL, "nan"},
        {"eagle3.attention.head_count", 4, 0, 0, NULL, "= 0"},
        {"eagle3.attention.head_count_kv", 4, 3, 0, NULL, "= 3"},
        {"eagle3.feed_forward_length", 4, 0, 0, NULL, "= 0"},
        {"eagle3.embedding_length", 4, 0, 0, NULL, "= 0"},
        {"eagle3.target_hidden_size", 4, 32, 0, NULL, "= 32"},
        {"eagle3.block_count", 4, 2, 0, NULL, "= 2"},
        {"specdec.target.n_vocab", 4, 0, 0, NULL, "= 0"},
        {"specdec.target.n_layer", 4, 5000, 0, NULL, "= 5000"},
    };
    static const corruption md[] = {
        {"specdec.head.type", 8, 0, 0, "eagle3", "'eagle3'"},
        {"medusa.head_count", 4, 9, 0, NULL, "= 9"},
        {"medusa.head_count", 4, 3, 0, NULL, "tensor 'medusa.3.fc.weight'"},   // a fourth head's tensors left over
        {"specdec.target.n_embd", 4, 1024, 0, NULL, "= 1024"},
        {"medusa.attention.layer_norm_rms_epsilon", 6, 0, INFINITY, NULL, "inf"},
    };
    const struct { int type; const corruption *c; size_t n; } sets[2] = {
        {SD_HEAD_EAGLE3, e3, sizeof e3 / sizeof *e3}, {SD_HEAD_MEDUSA, md, sizeof md / sizeof *md}};
    const char *path = tmp_path("meta.gguf"), *bad = tmp_path("meta-bad.gguf");
    for (int s = 0; s < 2; s++) {
        sd_head *h = make_head(m, sets[s].type);
        CHECK(h && sd_head_save(h, path, SD_TYPE_F16, g_err, sizeof g_err) == 0, "%s", g_err);
        sd_head_free(h);
        long n = 0;
        char *buf = read_all(path, &n);
        CHECK(buf, "read %s", path);
        if (!buf) continue;
        sd_head *b = NULL;
        CHECK(sd_head_load(&b, path, m, g_err, sizeof g_err) == 0, "the untouched file: %s", g_err);
        sd_head_free(b);
        for (size_t i = 0; i < sets[s].n; i++) {
            const corruption *c = &sets[s].c[i];
            int w = write_corrupted(bad, buf, n, c);
            CHECK(w == 0, "%s: key not found with type %u", c->key, c->type);
            if (w) continue;
            for (int with_model = 0; with_model <= 1; with_model++) {
                b = NULL;
                g_err[0] = 0;
                int rc = sd_head_load(&b, bad, with_model ? m : NULL, g_err, sizeof g_err);
                CHECK(rc < 0 && !b && strstr(g_err, c->key) && strstr(g_err, c->says),
                      "%s %s (model %d): rc %d, '%s'", c->key, c->says, with_model, rc, g_err);
                sd_head_free(b);
            }
            printf("  %s: %s\n", c->key, strstr(g_err, "head file:") ? strstr(g_err, "head file:") : g_err);
        }
        free(buf);
    }
    remove(path);
    remove(bad);
    sd_model_free(m);
}

// A full disk while saving leaves the previous file intact.
static void test_save_full_disk(void) {
    if (access("/dev/full", W_OK) != 0) SKIP("/dev/full is not writable here");
    sd_model *m = synth_model(320, 64, 8, 1);
    if (!m) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_head *h = make_head(m, SD_HEAD_MEDUSA);
    const char *path = tmp_path("keep.gguf");
    CHECK(sd_head_save(h, path, SD_TYPE_F16, g_err, sizeof g_err) == 0, "%s", g_err);
    // path.tmp as a link to /dev/full: the write fails, path stays.
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(symlink("/dev/full", tmp) == 0, "symlink");
    sd_head_w(h, SD_MD_BIAS(0))[0] = 5.0f;
    int rc = sd_head_save(h, path, SD_TYPE_F16, g_err, sizeof g_err);
    CHECK(rc < 0, "save onto a full disk succeeded");
    printf("  full disk: %s\n", g_err);
    unlink(tmp);
    sd_head *b = NULL;
    CHECK(sd_head_load(&b, path, m, g_err, sizeof g_err) == 0, "previous file damaged: %s", g_err);
    if (b) CHECK(sd_head_w(b, SD_MD_BIAS(0))[0] == 0.0f, "previous contents kept");
    sd_head_free(b);
    remove(path);
    sd_head_free(h);
    sd_model_free(m);
}

// The shipped heads (heads/*.gguf): each a well-formed GGUF file of an
// EAGLE-3 head, a Medusa head or an MoA drafter with a recipe note that
// loads, all together within the 64 MiB the repository allows for them;
// EAGLE-3 heads in llama.cpp's layout with their target's tokenizer (so that
// llama.cpp loads them).
static void test_shipped_heads(void) {
    DIR *dir = opendir("heads");
    if (!dir) SKIP("no heads/ directory here (run from the repository root)");
    long long total = 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        const size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf")) continue;
        char path[512];
        snprintf(path, sizeof path, "heads/%s", e->d_name);
        struct stat st;
        CHECK(stat(path, &st) == 0, "%s: cannot stat", path);
        total += st.st_size;
        sd_gguf *g = NULL;
        CHECK(sd_gguf_open(&g, path, g_err, sizeof g_err) == 0, "%s: %s", path, g_err);
        if (g) {
            const int e3 = sd_gguf_find_key(g, "eagle3.target_layers") != NULL;
            const int arch_ok = e3 || sd_gguf_find_key(g, "medusa.head_count") || sd_gguf_find_key(g, "moa.tli");
            CHECK(arch_ok, "%s: neither an EAGLE-3 head in llama.cpp's layout nor a Medusa head nor an MoA drafter",
                  path);
            if (e3) {
                CHECK(sd_gguf_find_key(g, "tokenizer.ggml.tokens") && sd_gguf_find_key(g, "tokenizer.ggml.model"),
                      "%s: no tokenizer (llama.cpp needs it; specdec head-convert adds it)", path);
                CHECK(sd_gguf_find_tensor(g, "blk.0.attn_norm_2.weight") && !sd_gguf_find_key(g, "eagle3.extract_layers"),
                      "%s: not in llama.cpp's layout (specdec head-convert)", path);
            }
            CHECK(sd_gguf_find_key(g, "specdec.head.note"), "%s: no recipe note", path);
        }
        sd_gguf_close(g);
        sd_head *h = NULL;   // and passes the loader's checks (its target aside)
        CHECK(sd_head_load(&h, path, NULL, g_err, sizeof g_err) == 0, "%s: %s", path, g_err);
        sd_head_free(h);
        n++;
        printf("  %s: %.1f MB\n", path, st.st_size / 1e6);
    }
    closedir(dir);
    printf("  %d heads, %.1f MiB in all\n", n, total / 1048576.0);
    CHECK(n >= 1, "heads/ holds no head");
    CHECK(total <= 64LL << 20, "heads/ holds %.1f MiB, more than 64 MiB", total / 1048576.0);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/specdec_test_head_%d", (int)getpid());
    char cmd[200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_RUN(test_eagle3_roundtrip);
    T_RUN(test_medusa_roundtrip);
    T_RUN(test_eagle3_layout);
    T_RUN(test_bad_files);
    T_RUN(test_bad_metadata);
    T_RUN(test_save_full_disk);
    T_RUN(test_shipped_heads);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_EXIT();
}
