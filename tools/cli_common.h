// cli_common.h - helpers shared by the specdec subcommands: flag value
// parsing with clear messages (the option table of cli_opts.h uses them),
// JSON string output, UTF-8 boundaries.
#ifndef SD_CLI_COMMON_H
#define SD_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SPECDEC_VERSION "0.1.0"

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

// 1 if path names an existing readable regular file; otherwise prints
// "WHAT 'PATH' not found" (or not readable) and returns 0.
int cli_file_ok(const char *what, const char *path);

// Length of the longest prefix of s[0..n) that does not end inside a UTF-8
// character (incomplete trailing sequences are held back; invalid bytes count
// as complete single bytes).
size_t cli_utf8_complete(const char *s, size_t n);

// Writes s[0..n) as a JSON string literal (quotes included): escapes quotes,
// backslashes and control characters; invalid UTF-8 becomes U+FFFD.
void cli_json_string(FILE *f, const char *s, size_t n);

// Subcommands (argv[0] is the subcommand name). Return the exit code.
int cmd_generate(int argc, char **argv);
int cmd_convert_llama2c(int argc, char **argv);
int cmd_bench_forward(int argc, char **argv);
int cmd_bench(int argc, char **argv);
// specdec serve (tools/serve/); without libmicrohttpd and jansson at build
// time it only says how to install them.
int cmd_serve(int argc, char **argv);
int cmd_bench_batch(int argc, char **argv);
int cmd_train_head(int argc, char **argv);

#endif
