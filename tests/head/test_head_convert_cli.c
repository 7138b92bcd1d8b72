// test_head_convert_cli.c - `specdec head-convert` (run from the repository
// root): its help; a head of specdec's first layout converted for its model
// (exit 0, "converted", the output in llama.cpp's layout with the tokenizer,
// the same head when loaded); a second run on the output says it already was
// converted; a missing argument, a missing file, another model's head and a
// file that is not a head each exit 1 with one message naming the problem.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "head/head.h"
#include "kernels/quant.h"
#include "lib/cli_run.h"
#include "lib/synth.h"
#include "model/gguf.h"
#include "model/model.h"
#include "specdec.h"
#include "t.h"

static char g_err[512];
static char g_out[1 << 14];
static char g_dir[128];

static const char *specdec_bin(void) {
    const char *e = getenv("SPECDEC_BIN");
    return e && *e ? e : "./build/specdec";
}

static int run(const char *args) { return cli_run(specdec_bin(), args, 1, g_out, sizeof g_out); }

static void test_head_convert(void) {
    struct stat st;
    if (stat(specdec_bin(), &st) != 0) SKIP("%s is missing (build it with make)", specdec_bin());
    char model[256], other[256], v1[256], out[256], args[1200];
    snprintf(model, sizeof model, "%s/m.gguf", g_dir);
    snprintf(other, sizeof other, "%s/o.gguf", g_dir);
    snprintf(v1, sizeof v1, "%s/v1.gguf", g_dir);
    snprintf(out, sizeof out, "%s/out.gguf", g_dir);
    synth_params p = synth_default_params();
    p.n_vocab = 300;
    p.n_embd = 64;
    p.n_layer = 6;
    CHECK(synth_write(model, &p, g_err, sizeof g_err) == 0, "%s", g_err);
    p.n_vocab = 310;
    CHECK(synth_write(other, &p, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_model *m = NULL;
    CHECK(sd_model_load(&m, model, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!m) return;
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = 50;
    sd_head *h = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (h) {
        sd_head_init(h, 3);
        CHECK(sd_head_save_ex(h, NULL, SD_HEAD_LAYOUT_V1, v1, SD_TYPE_Q8_0, g_err, sizeof g_err) == 0, "%s", g_err);
    }

    int rc = run("head-convert --help");
    CHECK(rc == 0 && strstr(g_out, "llama.cpp") && strstr(g_out, "IN.gguf OUT.gguf"), "--help: exit %d", rc);

    snprintf(args, sizeof args, "head-convert -m %s %s %s", model, v1, out);
    rc = run(args);
    CHECK(rc == 0 && strstr(g_out, "converted to llama.cpp's eagle3 layout"), "convert: exit %d: %s", rc, g_out);
    sd_gguf *g = NULL;
    CHECK(sd_gguf_open(&g, out, g_err, sizeof g_err) == 0, "%s", g_err);
    if (g) {
        CHECK(sd_gguf_find_key(g, "eagle3.target_layers") && sd_gguf_find_key(g, "tokenizer.ggml.tokens") &&
                  sd_gguf_find_tensor(g, "blk.0.attn_norm_2.weight"),
              "the output is in llama.cpp's layout");
        const sd_tensor *fc = sd_gguf_find_tensor(g, "fc.weight");
        CHECK(fc && fc->type == SD_TYPE_Q8_0, "the matrices stay Q8_0");
    }
    sd_gguf_close(g);
    sd_head *a = NULL, *b = NULL;
    CHECK(sd_head_load(&a, v1, m, g_err, sizeof g_err) == 0 && sd_head_load(&b, out, m, g_err, sizeof g_err) == 0,
          "%s", g_err);
    CHECK(a && b && a->n_w == b->n_w && !memcmp(a->w, b->w, sizeof(float) * a->n_w) &&
              !memcmp(a->hp.extract, b->hp.extract, sizeof a->hp.extract) &&
              !memcmp(a->d2t, b->d2t, sizeof(int32_t) * 50),
          "the converted file is the same head");
    sd_head_free(a);
    sd_head_free(b);

    snprintf(args, sizeof args, "head-convert -m %s %s %s", model, out, out);
    rc = run(args);
    CHECK(rc == 0 && strstr(g_out, "already in the current layout"), "again: exit %d: %s", rc, g_out);

    struct {
        const char *what, *fmt, *says;
    } bad[] = {
        {"one argument", "head-convert -m %1$s %2$s", "expected 2 arguments"},
        {"no model", "head-convert %2$s %3$s", "-m TARGET.gguf"},
        {"missing head", "head-convert -m %1$s /nonexistent/h.gguf %3$s", "not found"},
        {"another model", "head-convert -m %4$s %2$s %3$s", "vocabulary"},
        {"a model as the head", "head-convert -m %1$s %1$s %3$s", "not a draft head"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, bad[i].fmt, model, v1, out, other);
        rc = run(args);
        CHECK(rc == 1 && strstr(g_out, "specdec: ") && strstr(g_out, bad[i].says), "%s: exit %d: %s", bad[i].what,
              rc, g_out);
        char *nl = strchr(g_out, '\n');
        if (nl) *nl = 0;
        printf("  %s: %s\n", bad[i].what, g_out);
    }
    sd_head_free(h);
    sd_model_free(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/specdec_test_head_cli_%d", (int)getpid());
    char cmd[200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_RUN(test_head_convert);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return 1;
    T_EXIT();
}
