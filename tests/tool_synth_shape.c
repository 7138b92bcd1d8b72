// tool_synth_shape.c - a test helper, not a test: writes a synthetic GGUF
// model of a chosen shape with random weights (tests/lib/synth.h), for
// scripts that cannot carry real models: scripts/gpu-check.sh makes a tiny
// model and one shaped like Qwen2.5-1.5B on the device machine.
//
//   build/tests/tool_synth_shape OUT.gguf ARCH N_EMBD N_LAYER N_HEAD N_HEAD_KV N_FF N_VOCAB TYPE [SEED]
//
// ARCH llama or qwen2; TYPE one of F32 F16 Q8_0 Q4_0 Q4_K ... (the layer
// matrices; token_embd too). Greedy text is words only (the byte and
// control tokens' logits are 0). Exit status 0, or 1 with one line on stderr.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "lib/synth.h"

int main(int argc, char **argv) {
    if (argc < 10 || argc > 11) {
        fprintf(stderr, "usage: %s OUT.gguf ARCH N_EMBD N_LAYER N_HEAD N_HEAD_KV N_FF N_VOCAB TYPE [SEED]\n", argv[0]);
        return 1;
    }
    synth_params p = synth_default_params();
    p.arch = argv[2];
    p.n_embd = atoi(argv[3]);
    p.n_layer = atoi(argv[4]);
    p.n_head = atoi(argv[5]);
    p.n_head_kv = atoi(argv[6]);
    p.n_ff = atoi(argv[7]);
    p.n_vocab = atoi(argv[8]);
    p.n_ctx_train = 4096;
    p.words_only = 1;
    p.wtype = -1;
    for (int t = 0; t < SD_TYPE_FILE_COUNT; t++) {
        const sd_type_traits *tr = sd_type_get(t);
        if (tr && tr->name && tr->supported && !strcmp(tr->name, argv[9])) p.wtype = t;
    }
    if (p.wtype < 0) {
        fprintf(stderr, "tool_synth_shape: unknown weight type '%s'\n", argv[9]);
        return 1;
    }
    if (argc > 10) p.seed = strtoull(argv[10], NULL, 0);
    if (strcmp(p.arch, "llama") && strcmp(p.arch, "qwen2")) {
        fprintf(stderr, "tool_synth_shape: ARCH must be llama or qwen2, got '%s'\n", p.arch);
        return 1;
    }
    char err[512];
    if (synth_write(argv[1], &p, err, sizeof err) < 0) {
        fprintf(stderr, "tool_synth_shape: %s\n", err);
        return 1;
    }
    return 0;
}
