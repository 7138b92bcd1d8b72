// test_llama2c_convert.c - llama2.c checkpoint conversion: the stories260K model
// generates its known text (the one case that needs ../shared); hand-written
// v0 and v1 checkpoints convert to the same tensors, through the library and
// through `specdec convert-llama2c`, and the result generates; truncated and
// garbage files give clear errors.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <errno.h>

#include "specdec_spec.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "specdec.h"
#include "lib/cli_run.h"
#include "t.h"

static char g_tmp[256];

static const char *tmp_path(const char *name) {
    static char p[32][512]; // callers keep up to 32 paths at once
    static int k;
    k = (k + 1) & 31;
    snprintf(p[k], sizeof p[k], "%s/%s", g_tmp, name);
    return p[k];
}

typedef struct {
    const sd_tokenizer *tok;
    char text[4096];
    size_t len;
} collect;

static int collect_cb(int32_t t, void *user) {
    collect *c = user;
    char buf[128];
    int n = sd_token_to_piece(c->tok, t, 0, buf, sizeof buf);
    if (n > 0 && n <= (int)sizeof buf && c->len + (size_t)n < sizeof c->text) {
        memcpy(c->text + c->len, buf, (size_t)n);
        c->len += (size_t)n;
        c->text[c->len] = 0;
    }
    return 0;
}

static void test_stories260k(void) {
    const char *sh = t_shared_dir();
    if (!sh) SKIP("../shared/models is absent (stories260K.bin, tok512.bin); set SD_SHARED to its directory");
    char ckpt[512], tokp[512];
    snprintf(ckpt, sizeof ckpt, "%s/models/stories260K.bin", sh);
    snprintf(tokp, sizeof tokp, "%s/models/tok512.bin", sh);
    const char *out = tmp_path("stories260K.gguf");
    char err[512] = "";
    int rc = sd_llama2c_convert(ckpt, tokp, out, err, sizeof err);
    CHECK(rc == 0, "convert: %s", err);
    if (rc) return;
    sd_model *m = NULL;
    rc = sd_model_load(&m, out, err, sizeof err);
    CHECK(rc == 0, "load: %s", err);
    if (rc) return;
    sd_model_info info;
    sd_model_get_info(m, &info);
    CHECK(info.n_embd == 64 && info.n_layer == 5 && info.n_head == 8 && info.n_head_kv == 4 &&
              info.n_vocab == 512 && info.n_ff == 172 && info.n_ctx_train == 512,
          "hparams: embd %d layer %d head %d kv %d vocab %d ff %d ctx %d", info.n_embd, info.n_layer,
          info.n_head, info.n_head_kv, info.n_vocab, info.n_ff, info.n_ctx_train);
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    CHECK(sd_token_bos(tok) == 1 && sd_token_eos(tok) == 2, "bos %d eos %d", sd_token_bos(tok), sd_token_eos(tok));

    sd_session *s = NULL;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 256;
    sp.n_threads = 1;
    rc = sd_session_new(&s, m, &sp, err, sizeof err);
    CHECK(rc == 0, "session: %s", err);
    sd_sampler_params pp = sd_sampler_default_params();
    pp.temp = 0.0f;
    sd_sampler *smp = NULL;
    if (rc == 0) rc = sd_sampler_new(&smp, &pp, info.n_vocab, err, sizeof err);
    if (rc == 0) {
        collect c = {.tok = tok};
        int32_t bos = 1;
        sd_gen_params gp = sd_gen_default_params();
        gp.n_predict = 60;
        sd_gen_stats st;
        rc = sd_generate(s, smp, NULL, &bos, 1, &gp, collect_cb, &c, &st, err, sizeof err);
        CHECK(rc == 0, "generate: %s", err);
        const char *want = "Once upon a time, there was a little girl named Lily. She loved to play outside "
                           "in the park. One day, she saw a big, red ball";
        const char *got = c.text;
        while (*got == ' ') got++;
        CHECK(strncmp(got, want, strlen(want)) == 0, "greedy text:\n    got  '%s'\n    want '%s...'", got, want);
        CHECK(st.n_generated == 60 && st.n_prompt_tokens == 1, "stats: %d generated, %d prompt", st.n_generated,
              st.n_prompt_tokens);
    }
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
    unlink(out);
}

// ---------------------------------------------------------------- tiny checkpoints
enum { DIM = 16, HID = 32, NL = 2, NH = 4, NKV = 2, SEQ = 32, NTOK_EXTRA = 10 };
#define NV (3 + 256 + NTOK_EXTRA)
#define KVD (DIM / NH * NKV)

typedef struct {
    float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
} tiny_w;

static float *rnd(size_t n, uint64_t *x) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        *x = *x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((int)((*x >> 33) % 2001) - 1000) / 5000.0f;
    }
    return p;
}

static void tiny_make(tiny_w *w) {
    uint64_t x = 99;
    w->emb = rnd((size_t)NV * DIM, &x);
    w->rms_att = rnd(NL * DIM, &x);
    w->wq = rnd(NL * DIM * DIM, &x);
    w->wk = rnd(NL * DIM * KVD, &x);
    w->wv = rnd(NL * DIM * KVD, &x);
    w->wo = rnd(NL * DIM * DIM, &x);
    w->rms_ffn = rnd(NL * DIM, &x);
    w->w1 = rnd(NL * DIM * HID, &x);
    w->w2 = rnd(NL * HID * DIM, &x);
    w->w3 = rnd(NL * DIM * HID, &x);
    w->rms_final = rnd(DIM, &x);
    w->wcls = rnd((size_t)NV * DIM, &x);
}

static void tiny_free(tiny_w *w) {
    float **p = &w->emb;
    for (int i = 0; i < 12; i++) free(p[i]);
}

static void wf(FILE *f, const float *p, size_t n) { fwrite(p, sizeof(float), n, f); }

static void write_v1(const char *path, const tiny_w *w, int shared) {
    FILE *f = fopen(path, "wb");
    uint32_t magic = 0x616b3432u;
    int32_t hdr[8] = {1, DIM, HID, NL, NH, NKV, NV, SEQ};
    fwrite(&magic, 4, 1, f);
    fwrite(hdr, 4, 8, f);
    uint8_t flag = (uint8_t)shared, pad[256] = {0};
    fwrite(&flag, 1, 1, f);
    fwrite(pad, 1, 256 - 37, f);
    wf(f, w->rms_att, NL * DIM);
    wf(f, w->rms_ffn, NL * DIM);
    wf(f, w->rms_final, DIM);
    wf(f, w->emb, (size_t)NV * DIM);
    wf(f, w->wq, NL * DIM * DIM);
    wf(f, w->wk, NL * DIM * KVD);
    wf(f, w->wv, NL * DIM * KVD);
    wf(f, w->wo, NL * DIM * DIM);
    wf(f, w->w1, NL * DIM * HID);
    wf(f, w->w2, NL * HID * DIM);
    wf(f, w->w3, NL * DIM * HID);
    if (!shared) wf(f, w->wcls, (size_t)NV * DIM);
    fclose(f);
}

static void write_v0(const char *path, const tiny_w *w, int shared) {
    FILE *f = fopen(path, "wb");
    int32_t hdr[7] = {DIM, HID, NL, NH, NKV, shared ? NV : -NV, SEQ};
    fwrite(hdr, 4, 7, f);
    wf(f, w->emb, (size_t)NV * DIM);
    wf(f, w->rms_att, NL * DIM);
    wf(f, w->wq, NL * DIM * DIM);
    wf(f, w->wk, NL * DIM * KVD);
    wf(f, w->wv, NL * DIM * KVD);
    wf(f, w->wo, NL * DIM * DIM);
    wf(f, w->rms_ffn, NL * DIM);
    wf(f, w->w1, NL * DIM * HID);
    wf(f, w->w2, NL * HID * DIM);
    wf(f, w->w3, NL * DIM * HID);
    wf(f, w->rms_final, DIM);
    float *fc = calloc(SEQ * (DIM / NH), sizeof(float)); // freq_cis_real + imag
    wf(f, fc, SEQ * (DIM / NH));
    free(fc);
    if (!shared) wf(f, w->wcls, (size_t)NV * DIM);
    fclose(f);
}

static void write_tok(const char *path) {
    FILE *f = fopen(path, "wb");
    int32_t maxlen = 8;
    fwrite(&maxlen, 4, 1, f);
    char buf[16];
    for (int i = 0; i < NV; i++) {
        if (i == 0)
            strcpy(buf, "<unk>");
        else if (i == 1)
            strcpy(buf, "\n<s>\n");
        else if (i == 2)
            strcpy(buf, "\n</s>\n");
        else if (i < 259)
            snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else
            snprintf(buf, sizeof buf, " %c%c", 'a' + (i - 259), 'a' + (i - 259));
        float score = i < 259 ? 0.0f : -(float)(i - 259);
        int32_t len = (int32_t)strlen(buf);
        fwrite(&score, 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(buf, 1, (size_t)len, f);
    }
    fclose(f);
}

// 1 if the GGUF tensor `name` holds exactly want[0..n).
static int tensor_is(const sd_gguf *g, const char *name, const float *want, size_t n, int64_t ne0, int64_t ne1) {
    const sd_tensor *t = sd_gguf_find_tensor(g, name);
    if (!t || t->type != 0 || t->nbytes != n * 4 || t->ne[0] != ne0 || t->ne[1] != ne1) return 0;
    return memcmp(t->data, want, n * 4) == 0;
}

static void check_tiny_gguf(const char *path, const tiny_w *w, int shared) {
    char err[512] = "";
    sd_gguf *g = NULL;
    int rc = sd_gguf_open(&g, path, err, sizeof err);
    CHECK(rc == 0, "gguf open: %s", err);
    if (rc) return;
    CHECK(tensor_is(g, "token_embd.weight", w->emb, (size_t)NV * DIM, DIM, NV), "token_embd");
    CHECK(tensor_is(g, "blk.1.attn_norm.weight", w->rms_att + DIM, DIM, DIM, 1), "blk.1.attn_norm");
    CHECK(tensor_is(g, "blk.1.attn_q.weight", w->wq + DIM * DIM, DIM * DIM, DIM, DIM), "blk.1.attn_q");
    CHECK(tensor_is(g, "blk.1.attn_k.weight", w->wk + DIM * KVD, DIM * KVD, DIM, KVD), "blk.1.attn_k");
    CHECK(tensor_is(g, "blk.0.attn_v.weight", w->wv, DIM * KVD, DIM, KVD), "blk.0.attn_v");
    CHECK(tensor_is(g, "blk.1.attn_output.weight", w->wo + DIM * DIM, DIM * DIM, DIM, DIM), "attn_output");
    CHECK(tensor_is(g, "blk.1.ffn_norm.weight", w->rms_ffn + DIM, DIM, DIM, 1), "ffn_norm");
    CHECK(tensor_is(g, "blk.1.ffn_gate.weight", w->w1 + DIM * HID, DIM * HID, DIM, HID), "ffn_gate");
    CHECK(tensor_is(g, "blk.1.ffn_down.weight", w->w2 + DIM * HID, DIM * HID, HID, DIM), "ffn_down");
    CHECK(tensor_is(g, "blk.1.ffn_up.weight", w->w3 + DIM * HID, DIM * HID, DIM, HID), "ffn_up");
    CHECK(tensor_is(g, "output_norm.weight", w->rms_final, DIM, DIM, 1), "output_norm");
    if (shared)
        CHECK(sd_gguf_find_tensor(g, "output.weight") == NULL, "shared classifier written as output.weight");
    else
        CHECK(tensor_is(g, "output.weight", w->wcls, (size_t)NV * DIM, DIM, NV), "output");
    const sd_gguf_kv *kv = sd_gguf_find_key(g, "tokenizer.ggml.tokens");
    CHECK(kv && kv->n == NV, "tokens");
    if (kv && kv->n == NV) {
        CHECK(sd_str_eq(kv->strs[1], "<s>") && sd_str_eq(kv->strs[2], "</s>") && sd_str_eq(kv->strs[3], "<0x00>"),
              "special token texts");
        CHECK(sd_str_eq(kv->strs[259], "\xe2\x96\x81" "aa"), "space as U+2581");
    }
    const sd_gguf_kv *tt = sd_gguf_find_key(g, "tokenizer.ggml.token_type");
    CHECK(tt && tt->n == NV, "token_type");
    if (tt && tt->n == NV)
        CHECK(sd_gguf_arr_i64(tt, 0) == 2 && sd_gguf_arr_i64(tt, 1) == 3 && sd_gguf_arr_i64(tt, 2) == 3 &&
                  sd_gguf_arr_i64(tt, 100) == 6 && sd_gguf_arr_i64(tt, 260) == 1,
              "token types");
    sd_gguf_close(g);

    // loads and runs
    sd_model *m = NULL;
    rc = sd_model_load(&m, path, err, sizeof err);
    CHECK(rc == 0, "load: %s", err);
    if (rc) return;
    sd_model_info info;
    sd_model_get_info(m, &info);
    CHECK(info.n_embd == DIM && info.n_layer == NL && info.n_head == NH && info.n_head_kv == NKV &&
              info.n_ff == HID && info.n_vocab == NV,
          "hparams");
    sd_session *s = NULL;
    sd_session_params sp = sd_session_default_params();
    sp.n_threads = 1;
    sp.n_ctx = SEQ;
    rc = sd_session_new(&s, m, &sp, err, sizeof err);
    CHECK(rc == 0, "session: %s", err);
    if (rc == 0) {
        int32_t toks[3] = {1, 260, 261};
        sd_batch b = {.n = 3, .tokens = toks};
        rc = sd_session_forward(s, &b, err, sizeof err);
        CHECK(rc == 0, "forward: %s", err);
        const float *l = rc == 0 ? sd_session_logits(s, 2) : NULL;
        int finite = l != NULL;
        for (int i = 0; l && i < NV; i++) finite &= isfinite(l[i]) != 0;
        CHECK(finite, "logits not finite");
    }
    sd_session_free(s);
    sd_model_free(m);
}

static void test_tiny_v1_and_v0(void) {
    tiny_w w;
    tiny_make(&w);
    const char *tok = tmp_path("tok.bin");
    write_tok(tok);
    for (int shared = 0; shared < 2; shared++) {
        const char *ck1 = tmp_path("v1.bin"), *ck0 = tmp_path("v0.bin"), *out = tmp_path("tiny.gguf");
        char err[512] = "";
        write_v1(ck1, &w, shared);
        int rc = sd_llama2c_convert(ck1, tok, out, err, sizeof err);
        CHECK(rc == 0, "v1 (shared %d) convert: %s", shared, err);
        if (rc == 0) check_tiny_gguf(out, &w, shared);
        write_v0(ck0, &w, shared);
        rc = sd_llama2c_convert(ck0, tok, out, err, sizeof err);
        CHECK(rc == 0, "v0 (shared %d) convert: %s", shared, err);
        if (rc == 0) check_tiny_gguf(out, &w, shared);
        unlink(ck1);
        unlink(ck0);
        unlink(out);
    }
    unlink(tok);
    tiny_free(&w);
}

static void truncate_copy(const char *src, const char *dst, long drop) {
    FILE *f = fopen(src, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    f = fopen(dst, "wb");
    fwrite(buf, 1, got - (size_t)drop, f);
    fclose(f);
    free(buf);
}

static void test_bad_files(void) {
    tiny_w w;
    tiny_make(&w);
    const char *tok = tmp_path("tok.bin"), *ck = tmp_path("v1.bin"), *bad = tmp_path("bad.bin"),
               *out = tmp_path("bad.gguf");
    write_tok(tok);
    write_v1(ck, &w, 0);
    char err[512];

    truncate_copy(ck, bad, 100);
    err[0] = 0;
    CHECK(sd_llama2c_convert(bad, tok, out, err, sizeof err) < 0, "truncated v1 accepted");
    CHECK(strstr(err, "truncated") != NULL, "message: %s", err);

    FILE *f = fopen(bad, "wb");
    for (int i = 0; i < 1000; i++) fputc((i * 37 + 11) & 0xff, f);
    fclose(f);
    err[0] = 0;
    CHECK(sd_llama2c_convert(bad, tok, out, err, sizeof err) < 0, "garbage accepted");
    CHECK(strstr(err, "header") != NULL, "message: %s", err);

    f = fopen(bad, "wb");
    uint32_t hdr[2] = {0x616b3432u, 2};
    fwrite(hdr, 4, 2, f);
    for (int i = 0; i < 300; i++) fputc(0, f);
    fclose(f);
    err[0] = 0;
    CHECK(sd_llama2c_convert(bad, tok, out, err, sizeof err) < 0, "version 2 accepted");
    CHECK(strstr(err, "version 2") != NULL, "message: %s", err);

    err[0] = 0;
    CHECK(sd_llama2c_convert(tmp_path("nonexistent.bin"), tok, out, err, sizeof err) < 0, "missing file accepted");
    CHECK(strstr(err, "cannot open") != NULL, "message: %s", err);

    truncate_copy(tok, bad, 50);
    err[0] = 0;
    CHECK(sd_llama2c_convert(ck, bad, out, err, sizeof err) < 0, "truncated tokenizer accepted");
    CHECK(strstr(err, "tokenizer") != NULL, "message: %s", err);

    unlink(tok);
    unlink(ck);
    unlink(bad);
    unlink(out);
    tiny_free(&w);
}

// SPECDEC_BIN overrides the program under test.
static const char *specdec_bin(void) {
    const char *e = getenv("SPECDEC_BIN");
    return e && *e ? e : "./build/specdec";
}

// The command on a hand-written v0 checkpoint (the converter of a clone
// without ../shared, where test_cli's stories260K case is skipped): the same
// tensors as the library writes, a model that generates, and a truncated
// checkpoint refused with the reason and exit status 1.
static void test_tiny_command(void) {
    struct stat st;
    if (stat(specdec_bin(), &st) != 0) SKIP("%s is missing: build it with make", specdec_bin());
    static char out_txt[1 << 14];
    tiny_w w;
    tiny_make(&w);
    const char *tok = tmp_path("cmd_tok.bin"), *ck = tmp_path("cmd_v0.bin"), *bad = tmp_path("cmd_bad.bin"),
               *out = tmp_path("cmd.gguf");
    write_tok(tok);
    write_v0(ck, &w, 0);
    char args[2048];
    snprintf(args, sizeof args, "convert-llama2c %s %s %s", ck, tok, out);
    int rc = cli_run(specdec_bin(), args, 1, out_txt, sizeof out_txt);
    CHECK(rc == 0, "convert-llama2c: exit %d: %s", rc, out_txt);
    if (rc == 0) {
        check_tiny_gguf(out, &w, 0);
        snprintf(args, sizeof args, "generate -m %s -p \"ab\" -n 8 --temp 0 -t 1 --json", out);
        rc = cli_run(specdec_bin(), args, 0, out_txt, sizeof out_txt);
        const char *ng = strstr(out_txt, "\"n_generated\": ");
        int n = ng ? atoi(ng + 15) : -1;
        CHECK(rc == 0 && n >= 1 && n <= 8, "generate: exit %d, %d generated: %s", rc, n, out_txt);
    }
    truncate_copy(ck, bad, 100);
    unlink(out);
    snprintf(args, sizeof args, "convert-llama2c %s %s %s", bad, tok, out);
    rc = cli_run(specdec_bin(), args, 1, out_txt, sizeof out_txt);
    CHECK(rc == 1 && strstr(out_txt, "truncated") && stat(out, &st) != 0,
          "truncated checkpoint: exit %d, output file %s: %s", rc, stat(out, &st) == 0 ? "left" : "none", out_txt);
    unlink(tok);
    unlink(ck);
    unlink(bad);
    unlink(out);
    tiny_free(&w);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/specdec_test_llama2c_%d", (int)getpid());
    if (mkdir(g_tmp, 0700) != 0 && errno != EEXIST) {
        printf("FAIL setup: cannot create %s\n", g_tmp);
        return 1;
    }
    T_RUN(test_stories260k);
    T_RUN(test_tiny_v1_and_v0);
    T_RUN(test_bad_files);
    T_RUN(test_tiny_command);
    rmdir(g_tmp);
    T_EXIT();
}
