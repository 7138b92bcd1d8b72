// tool_random_head.c - a test helper, not a test: writes a randomly
// initialised draft head for a model, so that the Python tests
// (tests/serve/test_serve.py) can start programs with --head before any trained
// head exists. A random head drafts badly (almost nothing is accepted), but
// greedy output must still equal plain decoding, which is what those tests
// assert.
//
//   build/tests/tool_random_head MODEL.gguf OUT.gguf [eagle3|medusa|moa[-tliN][-nolsa][-hid|-hid2]|moa-exact[-nolsa]] [SEED]
//
// moa-exact: an MoA drafter whose SA and CA matrices are zero and whose TLI
// runs every target layer: it drafts what the target would (a check of the
// drafter's plumbing on a real model, docs/moa.md).
//
// Exit status 0 and nothing on stdout when the head was written; 1 and one
// line on stderr otherwise. The file is F16 (the loader dequantizes it).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "head/head.h"
#include "head/moa.h"
#include "kernels/quant.h"
#include "specdec.h"

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.gguf [eagle3|medusa|moa[-tliN][-nolsa][-hid|-hid2]|moa-exact[-nolsa]] [SEED]\n", argv[0]);
        return 1;
    }
    const char *type_s = argc > 3 ? argv[3] : "eagle3";
    int type = !strcmp(type_s, "eagle3") ? SD_HEAD_EAGLE3 : !strcmp(type_s, "medusa") ? SD_HEAD_MEDUSA
               : !strncmp(type_s, "moa", 3) ? SD_HEAD_MOA : 0;
    if (!type) {
        fprintf(stderr, "tool_random_head: type must be eagle3, medusa or moa, got '%s'\n", type_s);
        return 1;
    }
    char *end = NULL;
    uint64_t seed = argc > 4 ? strtoull(argv[4], &end, 10) : 1;
    if (argc > 4 && (!*argv[4] || *end)) {
        fprintf(stderr, "tool_random_head: SEED must be a number, got '%s'\n", argv[4]);
        return 1;
    }
    char err[512];
    sd_model *m = NULL;
    if (sd_model_load(&m, argv[1], err, sizeof err) < 0) {
        fprintf(stderr, "tool_random_head: cannot load model '%s': %s\n", argv[1], err);
        return 1;
    }
    sd_head_hp hp = sd_head_default_hp(m, type);   // bound to m: the loader accepts it for m only
    const int exact = !strncmp(type_s, "moa-exact", 9);   // (moa-exact-nolsa: the same without LSA)
    if (type == SD_HEAD_MOA) {
        const char *t = strstr(type_s, "-tli");
        if (t) hp.moa_tli = atoi(t + 4);
        hp.moa_no_lsa = strstr(type_s, "-nolsa") != NULL;
        hp.moa_ca_hidden = strstr(type_s, "-hid") != NULL;   // CA also reads the target's states
        hp.moa_sa_hidden = strstr(type_s, "-hid2") != NULL;  // and SA's input
        hp.moa_sa_full = strstr(type_s, "-safull") != NULL;  // SA sees the whole text
        if (exact) hp.moa_tli = hp.target_n_layer;
    }
    sd_head *h = NULL;
    int rc = sd_head_new(&h, &hp, err, sizeof err);
    if (rc == 0) {
        sd_head_init(h, seed);
        for (int i = 0; exact && i < 2 * SD_MOA_PER_LAYER; i++)   // SA and CA pass the embedding through
            if (!h->t[i].is_norm) memset(sd_head_w(h, i), 0, sizeof(float) * (size_t)(h->t[i].ne0 * h->t[i].ne1));
        snprintf(h->note, sizeof h->note, "recipe=random (tests/tool_random_head.c)\nseed=%llu\n",
                 (unsigned long long)seed);
        rc = sd_head_save_for(h, m, argv[2], SD_TYPE_F16, err, sizeof err);
    }
    if (rc < 0) fprintf(stderr, "tool_random_head: %s\n", err);
    sd_head_free(h);
    sd_model_free(m);
    return rc < 0 ? 1 : 0;
}
