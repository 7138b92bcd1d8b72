// cmd_convert.c - specdec convert-llama2c CHECKPOINT.bin TOKENIZER.bin OUT.gguf
#include <stdio.h>
#include <string.h>

#include "cli_common.h"
#include "cli_opts.h"
#include "specdec.h"

int cmd_convert_llama2c(int argc, char **argv) {
    const char *pos[3];
    int n_pos = 0;
    const cli_opt opts[] = {
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "convert-llama2c",
        .usage = "usage: specdec convert-llama2c CHECKPOINT.bin TOKENIZER.bin OUT.gguf",
        .intro = "Converts a llama2.c checkpoint (fp32, legacy v0 or v1 header) and its\n"
                 "tokenizer.bin into a GGUF file (architecture llama, F32 tensors, SentencePiece\n"
                 "vocabulary) that 'specdec generate' can run.\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
        .pos = pos,
        .max_pos = 3,
        .n_pos = &n_pos,
        .pos_syntax = "CHECKPOINT.bin TOKENIZER.bin OUT.gguf",
    };
    int r = cli_parse(&cmd, argc, argv);
    if (r != CLI_PARSE_OK) return cli_parse_exit(r);
    if (n_pos != 3) {
        cli_help(stderr, &cmd);
        return cli_error("convert-llama2c: expected 3 arguments, got %d", n_pos);
    }
    if (!cli_file_ok("checkpoint", pos[0]) || !cli_file_ok("tokenizer", pos[1])) return 1;
    char err[512];
    double t0 = sd_time_ms();
    if (sd_llama2c_convert(pos[0], pos[1], pos[2], err, sizeof err) < 0) return cli_error("%s", err);
    fprintf(stderr, "specdec: wrote %s (%.0f ms)\n", pos[2], sd_time_ms() - t0);
    return 0;
}
