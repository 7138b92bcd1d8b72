// tool_synth_model.c - a test helper, not a test: writes a synthetic model
// (tests/lib/synth.h) for the Python tests that run the program on one
// (tests/mpi/test_mpi.py): Q4_1 layer matrices (the repacked kernels), words
// only (greedy text never ends), so a run's length is its -n.
//
//   build/tests/tool_synth_model OUT.gguf N_LAYER [llama|qwen2] [SEED]
//
// Exit status 0 and nothing on stdout when the model was written; 1 and one
// line on stderr otherwise.
#include <stdio.h>
#include <stdlib.h>

#include "kernels/quant.h"
#include "lib/synth.h"

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s OUT.gguf N_LAYER [llama|qwen2] [SEED]\n", argv[0]);
        return 1;
    }
    synth_params p = synth_default_params();
    p.n_layer = atoi(argv[2]);
    if (p.n_layer < 1 || p.n_layer > 64) {
        fprintf(stderr, "tool_synth_model: N_LAYER must be 1..64, got '%s'\n", argv[2]);
        return 1;
    }
    if (argc > 3) p.arch = argv[3];
    if (argc > 4) p.seed = strtoull(argv[4], NULL, 10);
    p.wtype = SD_TYPE_Q4_1;
    p.words_only = 1;
    p.n_ctx_train = 2048;
    char err[256];
    if (synth_write(argv[1], &p, err, sizeof err) < 0) {
        fprintf(stderr, "tool_synth_model: %s\n", err);
        return 1;
    }
    return 0;
}
