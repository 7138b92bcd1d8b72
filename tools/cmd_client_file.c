// cmd_client_file.c - `specdec split-client`: writes a split client's file
// (docs/split.md): what `specdec client` needs of a target and its EAGLE-3
// head, without the target's layers.
#include <stdio.h>
#include <sys/stat.h>

#include "cli_common.h"
#include "cli_opts.h"
#include "specdec_spec.h"

int cmd_split_client(int argc, char **argv) {
    const char *model = NULL, *head = NULL, *out = NULL;
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &model, .meta = "FILE", .what = "model file",
         .required = "a target model is required (-m TARGET.gguf)", .help = "the target model (GGUF)"},
        {"--head", NULL, CLI_FILE, &head, .meta = "FILE", .what = "head file",
         .required = "a drafter is required (--head HEAD.gguf)", .help = "its EAGLE-3 head or MoA drafter"},
        {"--out", "-o", CLI_STRING, &out, .meta = "FILE", .required = "--out CLIENT.gguf is required",
         .help = "the client file to write"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "split-client",
        .usage = "usage: specdec split-client -m TARGET.gguf --head HEAD.gguf --out CLIENT.gguf",
        .intro = "Writes the file `specdec client` drafts with: the target's tokenizer, chat template, token\n"
                 "embeddings and output norm, and the drafter (checked against the target): an EAGLE-3 head,\n"
                 "or an MoA drafter with the target's output matrix and, for TLI = N, its last N layers. The\n"
                 "target's other layers are left out (docs/split.md).\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
    };
    int pr = cli_parse(&cmd, argc, argv);
    if (pr != CLI_PARSE_OK) return cli_parse_exit(pr);
    char err[512];
    if (sd_client_file_write(model, head, out, err, sizeof err) < 0) return cli_error("split-client: %s", err);
    struct stat a, b;
    if (stat(model, &a) == 0 && stat(out, &b) == 0)
        fprintf(stderr, "specdec split-client: wrote %s: %.1f MB (the target: %.1f MB)\n", out, b.st_size / 1e6,
                a.st_size / 1e6);
    return 0;
}
