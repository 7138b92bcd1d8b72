// synth.c - writes small random GGUF models (see synth.h).
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/gguf.h"
#include "kernels/quant.h"

synth_params synth_default_params(void) {
    synth_params p;
    memset(&p, 0, sizeof p);
    p.arch = "llama";
    p.n_vocab = 320;
    p.n_embd = 64;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_ctx_train = 512;
    p.rope_base = 10000.0f;
    p.wtype = SD_TYPE_F32;
    p.embd_type = -1;
    p.mix_type = -1;
    p.tied = 1;
    p.biases = -1;
    p.seed = 1234;
    return p;
}

static uint64_t rng_next(uint64_t *s) { // splitmix64
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_unif(uint64_t *s) { // [-1, 1)
    return (float)((double)(rng_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

// Adds tensor name with ne (n_dims), values offset + scale * U(-1,1),
// stored as type. Honors the fault-injection fields.
// The first zero_rows rows (of ne0 values) are zero.
static int add_tensor_z(sd_gguf_writer *w, const synth_params *p, uint64_t *rng, const char *name, int type,
                        int n_dims, int64_t ne0, int64_t ne1, float offset, float scale, int64_t zero_rows,
                        char *err, size_t errlen) {
    if (p->omit_tensor && strcmp(p->omit_tensor, name) == 0) return 0;
    int64_t ne[2] = {ne0, ne1};
    if (p->bad_shape_tensor && strcmp(p->bad_shape_tensor, name) == 0) {
        if (n_dims == 2) ne[1] = ne[1] / 2 > 0 ? ne[1] / 2 : 1;
        else ne[0] = ne[0] / 2 > 0 ? ne[0] / 2 : 1;
    }
    const sd_type_traits *tr = sd_type_get(type);
    if (!tr || !tr->from_float || tr->blck < 1 || ne[0] % tr->blck)
        return sd_err(err, errlen, "synth: type %d unusable for tensor '%s' with rows of %lld", type, name,
                      (long long)ne[0]);
    size_t n = (size_t)(ne[0] * (n_dims == 2 ? ne[1] : 1));
    float *f = malloc(n * sizeof(float));
    size_t nbytes = sd_row_size(type, ne[0]) * (size_t)(n_dims == 2 ? ne[1] : 1);
    void *q = malloc(nbytes);
    if (!f || !q) {
        free(f);
        free(q);
        return sd_err(err, errlen, "synth: out of memory");
    }
    for (size_t i = 0; i < n; i++) f[i] = offset + scale * rng_unif(rng);
    for (size_t i = 0; i < n && i < (size_t)(zero_rows * ne[0]); i++) f[i] = 0.0f;
    if (type == SD_TYPE_F32) memcpy(q, f, n * sizeof(float));
    else
        for (int64_t r = 0; r < (n_dims == 2 ? ne[1] : 1); r++)
            tr->from_float(f + r * ne[0], (uint8_t *)q + sd_row_size(type, ne[0]) * (size_t)r, ne[0]);
    sd_gguf_w_tensor(w, name, type, n_dims, ne, q, nbytes);
    free(f);
    free(q);
    return 0;
}

static int add_tensor(sd_gguf_writer *w, const synth_params *p, uint64_t *rng, const char *name, int type,
                      int n_dims, int64_t ne0, int64_t ne1, float offset, float scale, char *err,
                      size_t errlen) {
    return add_tensor_z(w, p, rng, name, type, n_dims, ne0, ne1, offset, scale, 0, err, errlen);
}

int synth_write(const char *path, const synth_params *p, char *err, size_t errlen) {
    // (the reference quantizers only: no kernel selection, which stays the
    // program's, sd_backend_select)
    if (p->n_vocab < 260 || p->n_embd < 1 || p->n_layer < 1 || p->n_head < 1 || p->n_head_kv < 1 ||
        p->n_embd % p->n_head || p->n_head % p->n_head_kv || p->n_ff < 1)
        return sd_err(err, errlen, "synth: inconsistent parameters");
    const int E = p->n_embd, F = p->n_ff, V = p->n_vocab, hd = E / p->n_head;
    const int KV = hd * p->n_head_kv;
    const int etype = p->embd_type >= 0 ? p->embd_type : p->wtype;
    const int mtype = p->mix_type >= 0 ? p->mix_type : p->wtype;
    const int qwen = strcmp(p->arch, "qwen2") == 0;
    const int biases = p->biases >= 0 ? p->biases : qwen;
    const int tied = p->tied && !p->words_only;
    sd_gguf_writer *w = sd_gguf_writer_new();
    if (!w) return sd_err(err, errlen, "synth: out of memory");
    char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", p->arch, suffix), key)
    sd_gguf_w_str(w, "general.architecture", p->arch);
    sd_gguf_w_str(w, "general.name", "synthetic");
    sd_gguf_w_u32(w, K("block_count"), (uint32_t)p->n_layer);
    sd_gguf_w_u32(w, K("context_length"), (uint32_t)p->n_ctx_train);
    sd_gguf_w_u32(w, K("embedding_length"), (uint32_t)E);
    sd_gguf_w_u32(w, K("feed_forward_length"), (uint32_t)F);
    sd_gguf_w_u32(w, K("attention.head_count"), (uint32_t)p->n_head);
    sd_gguf_w_u32(w, K("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    sd_gguf_w_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-5f);
    sd_gguf_w_f32(w, K("rope.freq_base"), p->rope_base);
    sd_gguf_w_u32(w, K("rope.dimension_count"), (uint32_t)hd);
    if (p->rope_scaling_type) {
        sd_gguf_w_str(w, K("rope.scaling.type"), p->rope_scaling_type);
        sd_gguf_w_f32(w, K("rope.scaling.factor"), p->rope_scaling_factor);
    }
#undef K

    // Vocabulary: <unk> <s> </s>, 256 byte tokens, then "▁w<k>".
    char **toks = calloc((size_t)V, sizeof(char *));
    float *scores = calloc((size_t)V, sizeof(float));
    int32_t *ttype = calloc((size_t)V, sizeof(int32_t));
    int rc = 0;
    if (!toks || !scores || !ttype) {
        rc = sd_err(err, errlen, "synth: out of memory");
        goto done;
    }
    for (int i = 0; i < V; i++) {
        char buf[32];
        if (i == 0) snprintf(buf, sizeof buf, "<unk>");
        else if (i == 1) snprintf(buf, sizeof buf, "<s>");
        else if (i == 2) snprintf(buf, sizeof buf, "</s>");
        else if (i < 259) snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else if (p->chatml && i >= V - 2) snprintf(buf, sizeof buf, "%s", i == V - 2 ? "<|im_start|>" : "<|im_end|>");
        else snprintf(buf, sizeof buf, "\xe2\x96\x81w%d", i - 259);
        toks[i] = malloc(strlen(buf) + 1);
        if (!toks[i]) {
            rc = sd_err(err, errlen, "synth: out of memory");
            goto done;
        }
        strcpy(toks[i], buf);
        ttype[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : p->chatml && i >= V - 2 ? 3 : 1;
        scores[i] = i < 259 ? 0.0f : -(float)(i - 259) * 0.01f;
    }
    sd_gguf_w_str(w, "tokenizer.ggml.model", "llama");
    sd_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)V);
    sd_gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)V);
    sd_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", ttype, (uint64_t)V);
    sd_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    sd_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    sd_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (p->chatml)
        sd_gguf_w_str(w, "tokenizer.chat_template",
                      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");

    uint64_t rng = p->seed * 0x2545F4914F6CDD1Dull + 1;
    // Uniform(-a, a) has std a / sqrt(3): a = sqrt(3 / n_in) keeps unit scale.
    const float s_e = sqrtf(3.0f / (float)E), s_f = sqrtf(3.0f / (float)F);
    char nm[96];
#define ADD(name, type, nd, a, b, off, sc)                                                      \
    do {                                                                                       \
        if ((rc = add_tensor(w, p, &rng, name, type, nd, a, b, off, sc, err, errlen)) < 0) goto done; \
    } while (0)
    // Embeddings of unit-ish scale; the logits are dot products with the
    // normalised state (norm ~ sqrt(E)), so a tied output gives logits of
    // std ~ sqrt(E) * 0.58: multiply embeddings by 3 / sqrt(E) for std ~ 1.7.
    const float s_emb = 3.0f / sqrtf((float)E);
    ADD("token_embd.weight", etype, 2, E, V, 0.0f, tied ? s_emb * 1.7f : 1.0f);
    ADD("output_norm.weight", SD_TYPE_F32, 1, E, 1, 1.0f, 0.2f);
    if (!tied && (rc = add_tensor_z(w, p, &rng, "output.weight", etype, 2, E, V, 0.0f, s_emb * 1.7f,
                                    p->words_only ? 259 : 0, err, errlen)) < 0)
        goto done;
    for (int l = 0; l < p->n_layer; l++) {
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), nm)
        ADD(BLK("attn_norm.weight"), SD_TYPE_F32, 1, E, 1, 1.0f, 0.2f);
        ADD(BLK("attn_q.weight"), p->wtype, 2, E, E, 0.0f, s_e * 1.5f);
        ADD(BLK("attn_k.weight"), p->wtype, 2, E, KV, 0.0f, s_e * 1.5f);
        ADD(BLK("attn_v.weight"), mtype, 2, E, KV, 0.0f, s_e);
        ADD(BLK("attn_output.weight"), p->wtype, 2, E, E, 0.0f, s_e);
        if (biases) {
            ADD(BLK("attn_q.bias"), SD_TYPE_F32, 1, E, 1, 0.0f, 0.3f);
            ADD(BLK("attn_k.bias"), SD_TYPE_F32, 1, KV, 1, 0.0f, 0.3f);
            ADD(BLK("attn_v.bias"), SD_TYPE_F32, 1, KV, 1, 0.0f, 0.3f);
        }
        ADD(BLK("ffn_norm.weight"), SD_TYPE_F32, 1, E, 1, 1.0f, 0.2f);
        ADD(BLK("ffn_gate.weight"), p->wtype, 2, E, F, 0.0f, s_e * 1.5f);
        ADD(BLK("ffn_up.weight"), mtype, 2, E, F, 0.0f, s_e);
        ADD(BLK("ffn_down.weight"), p->wtype, 2, F, E, 0.0f, s_f);
#undef BLK
    }
#undef ADD
    rc = sd_gguf_writer_write(w, path, err, errlen);
done:
    if (toks)
        for (int i = 0; i < V; i++) free(toks[i]);
    free(toks);
    free(scores);
    free(ttype);
    sd_gguf_writer_free(w);
    return rc < 0 ? rc : 0;
}
