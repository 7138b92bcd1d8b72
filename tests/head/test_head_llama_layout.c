// test_head_llama_layout.c - EAGLE-3 head files in llama.cpp's `eagle3`
// layout (docs/heads.md, "Files") and in specdec's first one:
// - a head written for its target carries llama.cpp's keys
//   (eagle3.target_layers = the extract layers + 1: llama.cpp reads a layer's
//   input, specdec a block's output), d2t as target ids, the hidden norm as
//   blk.0.attn_norm_2, and every tokenizer.* key of the target, equal to the
//   model's (type and value);
// - a file of the first layout (eagle3.extract_layers, d2t as offsets,
//   blk.0.hidden_norm) loads to the same head, bit for bit in F32;
// - sd_head_convert turns a first-layout file into a llama.cpp one (returns
//   1; 0 for a file already converted), keeping Q8_0 matrices byte for byte;
// - contradictions are refused with a message: both layer keys disagreeing,
//   a target layer 0 (the embeddings), both names of the hidden norm,
//   norm_before_fc, a tokenizer of a model the head was not made for;
// - the last block's output (extract L-1) is llama.cpp's target layer L.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static sd_model *synth_model(int n_vocab, uint64_t seed) {
    synth_params p = synth_default_params();
    p.n_vocab = n_vocab;
    p.n_embd = 64;
    p.n_layer = 8;
    p.seed = seed;
    const char *path = tmp_path("model.gguf");
    sd_model *m = NULL;
    if (synth_write(path, &p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

static sd_head *make_head(const sd_model *m) {
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = 100;
    sd_head *h = NULL;
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0) return NULL;
    sd_head_init(h, 11);
    for (int i = 0; i < h->n_t; i++)   // gains that differ per tensor, so that a swapped tensor shows
        if (h->t[i].is_norm)
            for (int64_t j = 0; j < h->t[i].ne0; j++) sd_head_w(h, i)[j] = 0.25f * (float)i + 0.01f * (float)j;
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 2 * i + 7;
    if (sd_head_set_vocab(h, ids, 100, g_err, sizeof g_err) < 0) {
        sd_head_free(h);
        return NULL;
    }
    snprintf(h->note, sizeof h->note, "recipe=test_head_llama_layout");
    return h;
}

static int same_head(const sd_head *a, const sd_head *b) {
    return memcmp(&a->hp, &b->hp, sizeof a->hp) == 0 && a->n_w == b->n_w &&
           memcmp(a->w, b->w, sizeof(float) * a->n_w) == 0 &&
           memcmp(a->d2t, b->d2t, sizeof(int32_t) * (size_t)a->hp.n_draft_vocab) == 0;
}

static int64_t d2t_at(const sd_gguf *g, int i) {
    const sd_tensor *t = sd_gguf_find_tensor(g, "d2t");
    int64_t v = -1;
    if (t && t->type == 27) memcpy(&v, (const char *)t->data + 8 * (size_t)i, 8);
    return v;
}

// kv equal in name, type and bytes of value (strings compared by content).
static int same_kv(const sd_gguf_kv *a, const sd_gguf_kv *b) {
    if (a->type != b->type || a->arr_type != b->arr_type || a->n != b->n) return 0;
    if (a->type == SD_GGUF_STRING || (a->type == SD_GGUF_ARRAY && a->arr_type == SD_GGUF_STRING)) {
        for (uint64_t i = 0; i < a->n; i++)
            if (a->strs[i].len != b->strs[i].len || memcmp(a->strs[i].ptr, b->strs[i].ptr, a->strs[i].len)) return 0;
        return 1;
    }
    int t = a->type == SD_GGUF_ARRAY ? a->arr_type : a->type;
    size_t sz = t == SD_GGUF_U8 || t == SD_GGUF_I8 || t == SD_GGUF_BOOL ? 1
              : t == SD_GGUF_U16 || t == SD_GGUF_I16                     ? 2
              : t == SD_GGUF_U64 || t == SD_GGUF_I64 || t == SD_GGUF_F64 ? 8
                                                                           : 4;
    return memcmp(a->data, b->data, sz * (size_t)a->n) == 0;
}

// A head written for its target: llama.cpp's keys, names, d2t and the tokenizer.
static void test_llama_layout_and_tokenizer(void) {
    sd_model *m = synth_model(320, 1);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = make_head(m);
    const char *path = tmp_path("llama.gguf");
    CHECK(h && sd_head_save_for(h, m, path, SD_TYPE_F32, g_err, sizeof g_err) == 0, "save: %s", g_err);
    sd_gguf *g = NULL;
    CHECK(sd_gguf_open(&g, path, g_err, sizeof g_err) == 0, "%s", g_err);
    if (g && h) {
        const sd_gguf_kv *tl = sd_gguf_find_key(g, "eagle3.target_layers");
        CHECK(tl && tl->type == SD_GGUF_ARRAY && tl->arr_type == SD_GGUF_I32 && tl->n == 3, "eagle3.target_layers int32[3]");
        for (int i = 0; tl && i < 3; i++)
            CHECK(sd_gguf_arr_i64(tl, (uint64_t)i) == h->hp.extract[i] + 1, "target_layers[%d] = %lld, extract %d", i,
                  (long long)sd_gguf_arr_i64(tl, (uint64_t)i), h->hp.extract[i]);
        CHECK(!sd_gguf_find_key(g, "eagle3.extract_layers"), "no older key");
        CHECK(sd_gguf_find_tensor(g, "blk.0.attn_norm_2.weight") && !sd_gguf_find_tensor(g, "blk.0.hidden_norm.weight"),
              "the hidden norm is blk.0.attn_norm_2");
        CHECK(d2t_at(g, 0) == 7 && d2t_at(g, 99) == 205, "d2t holds target ids: %lld %lld", (long long)d2t_at(g, 0),
              (long long)d2t_at(g, 99));
        // Every tokenizer key of the model, the same; nothing else under tokenizer.
        int n_tok = 0;
        for (uint64_t i = 0; i < m->gguf->n_kv; i++) {
            const sd_gguf_kv *mk = &m->gguf->kv[i];
            if (mk->key.len < 10 || memcmp(mk->key.ptr, "tokenizer.", 10)) continue;
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)mk->key.len, mk->key.ptr);
            const sd_gguf_kv *hk = sd_gguf_find_key(g, key);
            CHECK(hk && same_kv(mk, hk), "tokenizer key %s missing or different", key);
            n_tok++;
        }
        int n_head_tok = 0;
        for (uint64_t i = 0; i < g->n_kv; i++)
            n_head_tok += g->kv[i].key.len >= 10 && !memcmp(g->kv[i].key.ptr, "tokenizer.", 10);
        CHECK(n_tok >= 5 && n_head_tok == n_tok, "tokenizer keys: model %d, head %d", n_tok, n_head_tok);
        const sd_gguf_kv *toks = sd_gguf_find_key(g, "tokenizer.ggml.tokens");
        CHECK(toks && toks->n == 320, "the target's 320 tokens");
    }
    sd_gguf_close(g);
    sd_head *b = NULL;
    CHECK(sd_head_load(&b, path, m, g_err, sizeof g_err) == 0, "load: %s", g_err);
    CHECK(b && h && same_head(h, b), "the llama.cpp file loads to the same head");
    sd_head_free(b);
    // A tokenizer of a model the head was not made for is refused.
    sd_model *o = synth_model(400, 1);
    if (o && h) {
        CHECK(sd_head_save_for(h, o, tmp_path("other.gguf"), SD_TYPE_F32, g_err, sizeof g_err) < 0 &&
                  strstr(g_err, "tokenizer"),
              "other model's tokenizer: %s", g_err);
        printf("  other model: %s\n", g_err);
        CHECK(access(tmp_path("other.gguf"), F_OK) != 0, "nothing written");
    }
    sd_model_free(o);
    remove(path);
    sd_head_free(h);
    sd_model_free(m);
}

// A file of specdec's first layout loads to the same head, and converts.
static void test_old_layout_loads_and_converts(void) {
    sd_model *m = synth_model(320, 1);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = make_head(m);
    const int types[3] = {SD_TYPE_F32, SD_TYPE_Q8_0, SD_TYPE_Q5_0};   // head-convert keeps each
    for (int k = 0; k < 3 && h; k++) {
        const char *old = tmp_path("v1.gguf"), *neu = tmp_path("v2.gguf");
        CHECK(sd_head_save_ex(h, m, SD_HEAD_LAYOUT_V1, old, types[k], g_err, sizeof g_err) == 0, "%s", g_err);
        sd_gguf *g = NULL;
        CHECK(sd_gguf_open(&g, old, g_err, sizeof g_err) == 0, "%s", g_err);
        if (g) {   // really the first layout
            const sd_gguf_kv *el = sd_gguf_find_key(g, "eagle3.extract_layers");
            CHECK(el && sd_gguf_arr_i64(el, 0) == h->hp.extract[0] && !sd_gguf_find_key(g, "eagle3.target_layers"),
                  "v1 keys");
            CHECK(sd_gguf_find_tensor(g, "blk.0.hidden_norm.weight") && !sd_gguf_find_tensor(g, "blk.0.attn_norm_2.weight"),
                  "v1 tensor names");
            CHECK(d2t_at(g, 99) == 205 - 99, "v1 d2t offsets: %lld", (long long)d2t_at(g, 99));
            CHECK(!sd_gguf_find_key(g, "tokenizer.ggml.tokens"), "v1 has no tokenizer");
        }
        sd_gguf_close(g);
        sd_head *a = NULL, *b = NULL;
        CHECK(sd_head_load(&a, old, m, g_err, sizeof g_err) == 0, "v1 load: %s", g_err);
        CHECK(sd_head_save_for(h, m, neu, types[k], g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_head_load(&b, neu, m, g_err, sizeof g_err) == 0, "v2 load: %s", g_err);
        CHECK(a && b && same_head(a, b), "type %d: both layouts load to the same head", types[k]);
        if (k == 0) CHECK(a && same_head(a, h), "F32: the saved head, bit for bit");
        sd_head_free(b);
        b = NULL;
        // The conversion: 1 from v1, then 0 (already converted), in place.
        const char *conv = tmp_path("conv.gguf");
        CHECK(sd_head_convert(old, conv, m, g_err, sizeof g_err) == 1, "convert v1: %s", g_err);
        CHECK(sd_head_convert(conv, conv, m, g_err, sizeof g_err) == 0, "convert again in place: %s", g_err);
        CHECK(sd_head_load(&b, conv, m, g_err, sizeof g_err) == 0 && a && same_head(a, b), "converted: %s", g_err);
        sd_head_free(b);
        sd_gguf *gn = NULL, *gc = NULL;
        if (sd_gguf_open(&gn, neu, g_err, sizeof g_err) == 0 && sd_gguf_open(&gc, conv, g_err, sizeof g_err) == 0) {
            CHECK(gn->n_tensors == gc->n_tensors, "tensor count");
            for (uint64_t i = 0; i < gn->n_tensors; i++) {
                const sd_tensor *x = &gn->tensors[i];
                char nm[64];
                snprintf(nm, sizeof nm, "%.*s", (int)x->name.len, x->name.ptr);
                const sd_tensor *y = sd_gguf_find_tensor(gc, nm);
                CHECK(y && y->type == x->type && y->nbytes == x->nbytes && !memcmp(x->data, y->data, x->nbytes),
                      "type %d: tensor %s differs after conversion", types[k], nm);
            }
            CHECK(sd_gguf_find_key(gc, "tokenizer.ggml.tokens"), "the converted file has the tokenizer");
        }
        sd_gguf_close(gn);
        sd_gguf_close(gc);
        // Converting for another model is refused.
        sd_model *o = synth_model(400, 1);
        if (o) {
            CHECK(sd_head_convert(old, conv, o, g_err, sizeof g_err) < 0 && strstr(g_err, "vocabulary"),
                  "convert for another model: %s", g_err);
            printf("  convert for another model: %s\n", g_err);
        }
        sd_model_free(o);
        sd_head_free(a);
        remove(old);
        remove(neu);
        remove(conv);
    }
    sd_head_free(h);
    sd_model_free(m);
}

// Rewrites the GGUF file src into dst through the writer: every key but
// drop_key (NULL: none) copied, then add(w) if given, every tensor copied,
// tensor ren_from renamed ren_to (NULL: none) and tensor extra (NULL: none)
// added as a copy of ren_to's source. Returns 0 or -1.
static int rewrite(const char *src, const char *dst, const char *drop_key, void (*add)(sd_gguf_writer *),
                   const char *ren_from, const char *ren_to, const char *extra) {
    sd_gguf *g = NULL;
    if (sd_gguf_open(&g, src, g_err, sizeof g_err) < 0) return -1;
    sd_gguf_writer *w = sd_gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (!drop_key || !sd_str_eq(g->kv[i].key, drop_key)) sd_gguf_w_copy(w, &g->kv[i]);
    if (add) add(w);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const sd_tensor *t = &g->tensors[i];
        char nm[64];
        snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.ptr);
        const int ren = ren_from && !strcmp(nm, ren_from);
        sd_gguf_w_tensor(w, ren ? ren_to : nm, t->type, t->n_dims, t->ne, t->data, t->nbytes);
        if (ren && extra) sd_gguf_w_tensor(w, extra, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
    int rc = sd_gguf_writer_write(w, dst, g_err, sizeof g_err);
    sd_gguf_writer_free(w);
    sd_gguf_close(g);
    return rc;
}

static void add_el_wrong(sd_gguf_writer *w) {
    const int32_t v[3] = {2, 4, 4};   // the file's target_layers are 3, 5, 6: the last disagrees
    sd_gguf_w_arr_i32(w, "eagle3.extract_layers", v, 3);
}
static void add_el_right(sd_gguf_writer *w) {
    const int32_t v[3] = {2, 4, 5};
    sd_gguf_w_arr_i32(w, "eagle3.extract_layers", v, 3);
}
static void add_tl_zero(sd_gguf_writer *w) {
    const int32_t v[3] = {0, 4, 5};
    sd_gguf_w_arr_i32(w, "eagle3.target_layers", v, 3);
}
static void add_tl_last(sd_gguf_writer *w) {
    const int32_t v[3] = {3, 5, 8};   // 8 = L: the last block's output
    sd_gguf_w_arr_i32(w, "eagle3.target_layers", v, 3);
}
static void add_tl_over(sd_gguf_writer *w) {
    const int32_t v[3] = {3, 5, 9};
    sd_gguf_w_arr_i32(w, "eagle3.target_layers", v, 3);
}
static void add_nbfc(sd_gguf_writer *w) { sd_gguf_w_bool(w, "eagle3.norm_before_fc", 1); }

static void test_contradictions(void) {
    sd_model *m = synth_model(320, 1);
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = make_head(m);
    const char *path = tmp_path("base.gguf"), *bad = tmp_path("bad.gguf");
    CHECK(h && sd_head_save_for(h, m, path, SD_TYPE_F16, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_head *ref = NULL;   // the head as the F16 file holds it
    CHECK(sd_head_load(&ref, path, m, g_err, sizeof g_err) == 0, "%s", g_err);
    struct {
        const char *what, *drop;
        void (*add)(sd_gguf_writer *);
        const char *ren_from, *ren_to, *extra, *says;   // says NULL: loads
    } cases[] = {
        {"the copy itself", NULL, NULL, NULL, NULL, NULL, NULL},
        {"both layer keys, agreeing", NULL, add_el_right, NULL, NULL, NULL, NULL},
        {"both layer keys, disagreeing", NULL, add_el_wrong, NULL, NULL, NULL, "disagrees"},
        {"target layer 0", "eagle3.target_layers", add_tl_zero, NULL, NULL, NULL, "embeddings"},
        {"target layer past the target", "eagle3.target_layers", add_tl_over, NULL, NULL, NULL,
         "eagle3.target_layers[2] = 9"},
        {"norm_before_fc", NULL, add_nbfc, NULL, NULL, NULL, "norm_before_fc"},
        {"the older norm name", NULL, NULL, "blk.0.attn_norm_2.weight", "blk.0.hidden_norm.weight", NULL, NULL},
        {"both norm names", NULL, NULL, "blk.0.attn_norm_2.weight", "blk.0.hidden_norm.weight",
         "blk.0.attn_norm_2.weight", "both"},
        {"no layer key", "eagle3.target_layers", NULL, NULL, NULL, NULL, "eagle3.target_layers' is missing"},
    };
    for (size_t i = 0; ref && i < sizeof cases / sizeof *cases; i++) {
        CHECK(rewrite(path, bad, cases[i].drop, cases[i].add, cases[i].ren_from, cases[i].ren_to, cases[i].extra) == 0,
              "%s: rewrite: %s", cases[i].what, g_err);
        sd_head *b = NULL;
        g_err[0] = 0;
        int rc = sd_head_load(&b, bad, m, g_err, sizeof g_err);
        if (!cases[i].says) {
            CHECK(rc == 0 && b && same_head(ref, b), "%s: should load as the same head: %s", cases[i].what, g_err);
        } else {
            CHECK(rc < 0 && !b && strstr(g_err, cases[i].says), "%s: rc %d '%s'", cases[i].what, rc, g_err);
            printf("  %s: %s\n", cases[i].what, strstr(g_err, "head file:") ? strstr(g_err, "head file:") : g_err);
        }
        sd_head_free(b);
    }
    // target layer L = the output of the last block: extract L-1.
    CHECK(rewrite(path, bad, "eagle3.target_layers", add_tl_last, NULL, NULL, NULL) == 0, "%s", g_err);
    sd_head *b = NULL;
    CHECK(sd_head_load(&b, bad, m, g_err, sizeof g_err) == 0 && b && b->hp.extract[0] == 2 && b->hp.extract[1] == 4 &&
              b->hp.extract[2] == 7,
          "target layer 8 of 8 is block 7's output: %s", g_err);
    sd_head_free(b);
    remove(path);
    remove(bad);
    sd_head_free(ref);
    sd_head_free(h);
    sd_model_free(m);
}

// sd_head_convert_type: a Q8_0 head written as Q5_0 drafts exactly as the
// Q8_0 file does at --head-bits 5: every matrix, rounded to Q5_0 as the
// drafter packs it, gives the same bytes from either file (Q5_0 rounding
// repeated changes nothing). The file is smaller; keep keeps the type; a bad
// type is refused.
static void test_convert_type(void) {
    sd_model *m = synth_model(320, 2);
    CHECK(m, "%s", g_err);
    sd_head *h = m ? make_head(m) : NULL;
    CHECK(h, "%s", g_err);
    if (!h) {
        sd_model_free(m);
        return;
    }
    const char *q8 = tmp_path("q8.gguf"), *q5 = tmp_path("q5.gguf"), *kept = tmp_path("kept.gguf");
    CHECK(sd_head_save_for(h, m, q8, SD_TYPE_Q8_0, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_head_convert_type(q8, q5, m, SD_HEAD_OUT_Q5_0, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_head_convert_type(q8, kept, m, SD_HEAD_OUT_KEEP, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_head_convert_type(q8, kept, m, 9, g_err, sizeof g_err) < 0 && strstr(g_err, "type"), "type 9: %s", g_err);
    sd_gguf *g5 = NULL, *gk = NULL;
    CHECK(sd_gguf_open(&g5, q5, g_err, sizeof g_err) == 0 && sd_gguf_open(&gk, kept, g_err, sizeof g_err) == 0, "%s",
          g_err);
    int n5 = 0, n8 = 0;
    for (uint64_t i = 0; g5 && gk && i < g5->n_tensors; i++) n5 += g5->tensors[i].type == SD_TYPE_Q5_0;
    for (uint64_t i = 0; g5 && gk && i < gk->n_tensors; i++) n8 += gk->tensors[i].type == SD_TYPE_Q8_0;
    CHECK(n5 > 0 && n5 == n8, "matrices: %d in Q5_0, %d in Q8_0 kept", n5, n8);
    CHECK(g5 && gk && g5->size < gk->size, "the Q5_0 file is smaller");
    sd_gguf_close(g5);
    sd_gguf_close(gk);
    sd_head *a = NULL, *b = NULL;
    CHECK(sd_head_load(&a, q8, m, g_err, sizeof g_err) == 0 && sd_head_load(&b, q5, m, g_err, sizeof g_err) == 0,
          "%s", g_err);
    const sd_type_traits *tr = sd_type_get(SD_TYPE_Q5_0);
    int n_cmp = 0, n_moved = 0;
    for (int i = 0; a && b && i < a->n_t; i++) {
        const sd_head_tensor *t = &a->t[i];
        if (t->is_norm || t->ne1 < 2 || t->ne0 % tr->blck) continue;
        const size_t rb = sd_row_size(SD_TYPE_Q5_0, t->ne0);
        uint8_t *x = malloc(rb), *y = malloc(rb);
        for (int64_t r = 0; x && y && r < t->ne1; r++) {
            tr->from_float(sd_head_w(a, i) + r * t->ne0, x, t->ne0);
            tr->from_float(sd_head_w(b, i) + r * t->ne0, y, t->ne0);
            n_cmp++;
            CHECK(!memcmp(x, y, rb), "tensor %d row %lld: other Q5_0 bytes", i, (long long)r);
            n_moved += memcmp(sd_head_w(a, i) + r * t->ne0, sd_head_w(b, i) + r * t->ne0, sizeof(float) * t->ne0) != 0;
        }
        free(x);
        free(y);
    }
    CHECK(n_cmp > 0 && n_moved > 0, "%d rows compared, %d differ in float (the file really is Q5_0)", n_cmp, n_moved);
    printf("  %d matrix rows: the same Q5_0 bytes from the Q8_0 file and from its Q5_0 conversion\n", n_cmp);
    sd_head_free(a);
    sd_head_free(b);
    sd_head_free(h);
    sd_model_free(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/specdec_test_head_llama_%d", (int)getpid());
    char cmd[200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_RUN(test_llama_layout_and_tokenizer);
    T_RUN(test_old_layout_loads_and_converts);
    T_RUN(test_contradictions);
    T_RUN(test_convert_type);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_EXIT();
}
