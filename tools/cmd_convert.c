// cmd_convert.c - specdec convert-llama2c CHECKPOINT.bin TOKENIZER.bin OUT.gguf
#include <stdio.h>
#include <string.h>

#include "cli_common.h"
#include "common.h"
#include "model/llama2c.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: specdec convert-llama2c CHECKPOINT.bin TOKENIZER.bin OUT.gguf\n"
            "\n"
            "Converts a llama2.c checkpoint (fp32, legacy v0 or v1 header) and its\n"
            "tokenizer.bin into a GGUF file (architecture llama, F32 tensors, SentencePiece\n"
            "vocabulary) that 'specdec generate' can run.\n"
            "\n"
            "options:\n"
            "  -h, --help   show this help\n");
}

int cmd_convert_llama2c(int argc, char **argv) {
    const char *pos[3];
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            cli_error("convert-llama2c: unknown option '%s' (see specdec convert-llama2c --help)", argv[i]);
            return 1;
        }
        if (n_pos == 3) {
            cli_error("convert-llama2c: too many arguments ('%s'); expected CHECKPOINT.bin TOKENIZER.bin OUT.gguf", argv[i]);
            return 1;
        }
        pos[n_pos++] = argv[i];
    }
    if (n_pos != 3) {
        usage(stderr);
        return cli_error("convert-llama2c: expected 3 arguments, got %d", n_pos);
    }
    if (!cli_file_ok("checkpoint", pos[0]) || !cli_file_ok("tokenizer", pos[1])) return 1;
    char err[512];
    double t0 = sd_time_ms();
    if (sd_llama2c_convert(pos[0], pos[1], pos[2], err, sizeof err) < 0) return cli_error("%s", err);
    fprintf(stderr, "specdec: wrote %s (%.0f ms)\n", pos[2], sd_time_ms() - t0);
    return 0;
}
