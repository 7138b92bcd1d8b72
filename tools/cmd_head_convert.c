// cmd_head_convert.c - specdec head-convert -m MODEL IN.gguf OUT.gguf: a head
// file rewritten in the current layout (sd_head_convert): an EAGLE-3 head of
// specdec's first layout becomes one that llama.cpp loads.
#include <stdio.h>
#include <string.h>

#include "cli_common.h"
#include "cli_opts.h"
#include "specdec.h"
#include "specdec_spec.h"

static int parse_type(const char *flag, const char *v, void *dst) {
    static const char *names[] = {"keep", "q8_0", "q5_0", "f16", "f32"};   // enum sd_head_out_type
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(v, names[i])) return *(int *)dst = i, 0;
    return cli_error("%s: expected keep, q8_0, q5_0, f16 or f32, got '%s'", flag, v), -1;
}

int cmd_head_convert(int argc, char **argv) {
    const char *pos[2];
    int n_pos = 0, out_type = SD_HEAD_OUT_KEEP;
    const char *model_path = NULL;
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &model_path, .meta = "FILE", .what = "model file",
         .required = "the head's target model is required (-m TARGET.gguf)",
         .help = "the model the head was made for (required): checked against the head, and its tokenizer "
                 "goes into the file"},
        {"--type", NULL, CLI_CUSTOM, &out_type, .fn = parse_type, .meta = "keep|q8_0|q5_0|f16|f32", .def = "keep",
         .help = "type of the written matrices: keep = the input's; q5_0 = the type drafters run at by default "
                 "(--head-bits 5): 40% smaller than q8_0, and a q8_0 head written as q5_0 drafts exactly as "
                 "before at --head-bits 5 (less precisely at --head-bits 8)"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "head-convert",
        .usage = "usage: specdec head-convert -m TARGET.gguf [--type T] IN.gguf OUT.gguf",
        .intro = "Rewrites a draft head file in the current layout (docs/heads.md, \"Files\"): an EAGLE-3\n"
                 "head in llama.cpp's eagle3 layout with the target's tokenizer, which llama.cpp's\n"
                 "llama-speculative-simple --spec-type draft-eagle3 loads as a draft model. Reads the\n"
                 "older specdec layout (eagle3.extract_layers) too; the matrices keep their type unless\n"
                 "--type says otherwise. MoA and Medusa files are rewritten as they are (or in --type).\n"
                 "OUT.gguf may be IN.gguf (written to OUT.gguf.tmp, then renamed).\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
        .pos = pos,
        .max_pos = 2,
        .n_pos = &n_pos,
        .pos_syntax = "IN.gguf OUT.gguf",
    };
    int r = cli_parse(&cmd, argc, argv);
    if (r != CLI_PARSE_OK) return cli_parse_exit(r);
    if (n_pos != 2) {
        cli_help(stderr, &cmd);
        return cli_error("head-convert: expected 2 arguments (IN.gguf OUT.gguf), got %d", n_pos);
    }
    if (!cli_file_ok("head file", pos[0])) return 1;
    char err[768];
    sd_model *m = NULL;
    if (sd_model_load(&m, model_path, err, sizeof err) < 0) return cli_error("%s", err);
    int rc = sd_head_convert_type(pos[0], pos[1], m, out_type, err, sizeof err);
    sd_model_free(m);
    if (rc < 0) return cli_error("head-convert: %s", err);
    fprintf(stderr, "specdec: wrote %s (%s)\n", pos[1],
            rc == 1 ? "converted to llama.cpp's eagle3 layout with the tokenizer"
                    : "already in the current layout; rewritten");
    return 0;
}
