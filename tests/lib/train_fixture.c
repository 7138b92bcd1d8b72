// train_fixture.c - see train_fixture.h.
#include "train_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "synth.h"
#include "model/llama2c.h"

static char g_dir[256];

void tf_init(const char *tag) {
    snprintf(g_dir, sizeof g_dir, "/tmp/specdec_%s_%d", tag, (int)getpid());
    mkdir(g_dir, 0777);
}

void tf_done(void) { tf_rm_rf(g_dir); }

const char *tf_dir(void) { return g_dir; }

void tf_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", g_dir, name); }

void tf_rm_rf(const char *p) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) {
    }
}

int tf_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

long tf_file_len(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

int tf_same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) same = 0;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int tf_synth_gguf(const char *path, int n_embd, int n_layer, uint64_t seed, char *err, size_t errlen) {
    synth_params p = synth_default_params();
    p.n_embd = n_embd;
    p.n_ff = 2 * n_embd;
    p.n_layer = n_layer;
    p.seed = seed;
    return synth_write(path, &p, err, errlen);
}

sd_model *tf_synth_model(int n_embd, int n_layer, uint64_t seed, char *err, size_t errlen) {
    char path[512];
    snprintf(path, sizeof path, "%s/synth_%d_%d_%llu.gguf", g_dir, n_embd, n_layer, (unsigned long long)seed);
    sd_model *m = NULL;
    if (tf_synth_gguf(path, n_embd, n_layer, seed, err, errlen) == 0) sd_model_load(&m, path, err, errlen);
    remove(path);
    return m;
}

void tf_write_corpus(const char *path, int n, int len_spread, uint64_t seed, int chat) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    sd_rng r;
    sd_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"id\": \"r%d\", \"source\": \"test\", \"text\": \"", i);
        int nw = 3 + (i * 7) % len_spread;
        for (int w = 0; w < nw; w++) fprintf(f, "%sw%d", w ? " " : "", (int)(sd_rng_next(&r) % 60));
        fprintf(f, "\"}\n");
        if (i == 1) fprintf(f, "\n");   // a blank line is skipped
    }
    if (chat) fprintf(f, "{\"id\": \"c\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    fclose(f);
}

sd_train_head_params tf_run_params(const sd_model *m, const char *const *paths, const char *cache, const char *out,
                                   const char *ckpt) {
    sd_train_head_params p = sd_train_head_default_params();
    p.model = m;
    p.data_paths = paths;
    p.n_data = 1;
    p.cache_dir = cache;
    p.out_path = out;
    p.ckpt_path = ckpt;
    return p;
}

void tf_stories_corpus(const char *path, int copies) {
    static const char *lines[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
        "One day, she saw a big, red ball. She wanted to play with it, but it was too high.",
        "Tom and his mom went to the store. They bought apples, bread and a toy car for Tom.",
        "The cat was sleepy. It found a warm spot in the sun and closed its eyes.",
    };
    FILE *f = fopen(path, "wb");
    if (!f) return;
    for (int c = 0; c < copies; c++)
        for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
            fprintf(f, "{\"id\": \"%d-%zu\", \"source\": \"test\", \"text\": \"%s\"}\n", c, i, lines[i]);
    fclose(f);
}

const char *tf_stories_gguf(const char *sh, char *why, size_t n) {
    static char gguf[512];
    if (gguf[0]) return gguf;
    if (!sh) {
        snprintf(why, n, "../shared/models (stories260K) is absent; set SD_SHARED");
        return NULL;
    }
    char ckpt[512], tokp[512], err[256];
    snprintf(ckpt, sizeof ckpt, "%s/models/stories260K.bin", sh);
    snprintf(tokp, sizeof tokp, "%s/models/tok512.bin", sh);
    tf_path(gguf, sizeof gguf, "stories.gguf");
    if (sd_llama2c_convert(ckpt, tokp, gguf, err, sizeof err) < 0) {
        snprintf(why, n, "stories260K: %.200s", err);
        gguf[0] = 0;
        return NULL;
    }
    return gguf;
}

#define TF_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

const char *tf_real_target(const char *sh, char *why, size_t n) {
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/models/stories260K.bin", sh ? sh : "");
    if (sh && access(ckpt, R_OK) == 0) return tf_stories_gguf(sh, why, n);
    if (access(TF_DEFAULT_MODEL, R_OK) == 0) return TF_DEFAULT_MODEL;
    snprintf(why, n, "neither ../shared/models/stories260K.bin nor %s (scripts/fetch-models.sh) is here",
             TF_DEFAULT_MODEL);
    return NULL;
}
