// specdec.c - the specdec program: dispatches to the subcommands.
#include <stdio.h>
#include <string.h>

#include "cli_common.h"
#include "mpi/pp.h"

static void usage(FILE *f) {
    fprintf(f,
            "specdec %s - speculative decoding of GGUF models (CPU; GPU: make CUDA=1)\n"
            "\n"
            "usage: specdec <command> [options]\n"
            "\n"
            "commands:\n"
            "  generate         generate text from a prompt (streams to stdout)\n"
            "  bench            compare decoding methods (ar, speculative) on a Spec-Bench prompt set\n"
            "  bench-forward    time forward passes of 1..64 tokens, decode speed and memory bandwidth\n"
            "  serve            an OpenAI-compatible HTTP server with speculative decoding\n"
            "  client           draft here, verify on a specdec server (serve --split); drafts on offline\n"
            "  split-client     write the file the client drafts with (embeddings and EAGLE-3 head)\n"
            "  bench-batch      time one forward over K sessions' trees against K separate forwards\n"
            "  train-head       train an EAGLE-3, Medusa or MoA draft head for a model on this CPU\n"
            "  head-convert     rewrite a draft head file in the current layout (llama.cpp's eagle3)\n"
            "  convert-llama2c  convert a llama2.c checkpoint + tokenizer.bin to GGUF\n"
            "\n"
            "options:\n"
            "  -h, --help       show this help\n"
            "  --version        print the version\n"
            "\n"
            "'specdec <command> --help' describes the options of a command.\n"
            "mpirun -np R specdec generate|bench|serve ... --pp R splits the model's layers over R\n"
            "processes (a build with `make MPI=1`; --layers N,N,.., --pp-groups G, --pp-wait auto|spin|sleep,\n"
            "--pp-stats: docs/mpi.md).\n"
            "example: specdec generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat -p \"Hello\"\n",
            SPECDEC_VERSION);
}

int main(int argc, char **argv) {
    // --pp R / --layers: a pipeline over MPI ranks (docs/mpi.md); the other
    // ranks serve their layers and end here
    const int pp = pp_main(&argc, argv);
    if (pp >= 0) return pp;
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("specdec %s\n", SPECDEC_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert-llama2c")) return cmd_convert_llama2c(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench-forward")) return cmd_bench_forward(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "client")) return cmd_client(argc - 1, argv + 1);
    if (!strcmp(cmd, "split-client")) return cmd_split_client(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench-batch")) return cmd_bench_batch(argc - 1, argv + 1);
    if (!strcmp(cmd, "train-head")) return cmd_train_head(argc - 1, argv + 1);
    if (!strcmp(cmd, "head-convert")) return cmd_head_convert(argc - 1, argv + 1);
    cli_error("unknown command '%s' (commands: generate, bench, bench-forward, bench-batch, serve, train-head, head-convert, "
              "convert-llama2c; "
              "see specdec --help)",
              cmd);
    return 1;
}
