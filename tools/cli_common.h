// cli_common.h - helpers shared by the specdec subcommands: flag value
// parsing with clear messages (the option table of cli_opts.h uses them),
// JSON values and output (jansson), UTF-8 boundaries.
#ifndef SD_CLI_COMMON_H
#define SD_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "specdec.h"   // SPECDEC_VERSION


#ifndef SD_MIN
#define SD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SD_MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

// Prints "specdec: <message>" to stderr. Returns 1 (the exit code of errors).
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Parse a flag value; on error print "FLAG: expected ..., got 'TEXT'" and return -1.
int cli_int(const char *flag, const char *s, long lo, long hi, int *out);
int cli_float(const char *flag, const char *s, double lo, double hi, float *out);
int cli_u64(const char *flag, const char *s, uint64_t *out);
// --sampling-draw race|rejection into *(int *)dst (enum sd_sampling_draw); a
// cli_custom_fn. CLI_SAMPLING_DRAW_HELP is its help text.
int cli_sampling_draw(const char *flag, const char *value, void *dst);
// --gpu (generate, bench, bench-forward, serve): every session on the CUDA
// path (docs/gpu.md). cli_gpu_setup, called after parsing, switches it on
// (sd_gpu_enable) or prints why it cannot be (no CUDA build, no device): -1.
extern int cli_gpu_on;
#define CLI_GPU_HELP "run the model on the GPU (a CUDA build: make CUDA=1; weights in bf16 on the device; docs/gpu.md)"
#define CLI_OPT_GPU {"--gpu", NULL, CLI_FLAG, &cli_gpu_on, .help = CLI_GPU_HELP}
int cli_gpu_setup(void);
#define CLI_SAMPLING_DRAW_HELP                                                                                   \
    "how a sampled token is drawn (temp > 0): race = the exponential race over noise hashed from (seed, "        \
    "position, token): a seed gives the same text with any method, tree or load, equal to plain sampling's; "   \
    "rejection = a sequential random generator and rejection-based speculative sampling: the most drafts "       \
    "accepted, the same distribution, but the text of a seed depends on the drafts"

// The prompt as token ids in a malloc'd *out: with chat, the model's chat
// template around text (and system, NULL: the template's own), its markers
// as special tokens and the messages as text (sd_chat_tokenize); without,
// text as plain text (no special tokens parsed), BOS as the vocabulary asks.
// Returns the count (> 0), or -1 with a message in err: the template's
// error (*chat_failed = 1 when chat_failed is given), or the prompt could
// not be tokenized or is empty.
int cli_tokenize_prompt(const sd_tokenizer *tok, const char *system, const char *text, int chat, int32_t **out,
                        char *err, size_t errlen, int *chat_failed);

// 1 if path names an existing readable regular file; otherwise prints
// "WHAT 'PATH' not found" (or not readable) and returns 0.
int cli_file_ok(const char *what, const char *path);

// A new JSON string holding s[0..n) with every invalid UTF-8 byte replaced
// by U+FFFD (jansson takes valid UTF-8 only; generated text and file names
// may hold anything). NUL bytes are kept (written as \u0000). NULL when out of
// memory; json_pack's "o" takes it, or free it with json_decref.
json_t *cli_json_str(const char *s, size_t n);

// A new JSON array of the n strings s[0..n) (each as cli_json_str); NULL when
// out of memory.
json_t *cli_json_strs(const char *const *s, int n);

// A new JSON number: v rounded to `decimals` places (the precision of the
// text output), or null when v is not finite (JSON has no inf or nan).
json_t *cli_json_num(double v, int decimals);

// A new JSON object naming the machine a figure comes from: "cpu" (the
// model name /proc/cpuinfo gives, or "unknown"), "cores" (online), "kernels"
// (the kernel family in use, sd_backend_name) and "os" (uname's system and
// release). NULL when out of memory.
json_t *cli_json_host(void);

// Writes v on one line ("{"a": 1, "b": [2, 3]}") and a newline to f, flushes,
// and releases v. 0, or -1 when v is NULL (building it failed: out of memory)
// or the write failed.
int cli_json_write(FILE *f, json_t *v);

// Subcommands (argv[0] is the subcommand name). Return the exit code.
int cmd_generate(int argc, char **argv);
int cmd_convert_llama2c(int argc, char **argv);
int cmd_bench_forward(int argc, char **argv);
int cmd_bench(int argc, char **argv);
// specdec serve (tools/serve/); without libmicrohttpd at build time it only
// says how to install it.
int cmd_serve(int argc, char **argv);
int cmd_bench_batch(int argc, char **argv);
int cmd_train_head(int argc, char **argv);
// specdec client (tools/client/, docs/split.md); without libcurl at build time
// it only says how to install it. split-client writes its file.
int cmd_client(int argc, char **argv);
int cmd_split_client(int argc, char **argv);
int cmd_head_convert(int argc, char **argv);

#endif
