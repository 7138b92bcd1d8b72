// cli_opts.h - the one option parser of the specdec subcommands: each command
// declares a table of options (name, kind, destination, help, default), and
// cli_parse / cli_help read argv and write --help from that table, so that
// the parser, the checks of a value and the help text cannot drift apart.
//
//   static const cli_opt opts[] = {
//       {"--model", "-m", CLI_FILE, &o->model, .meta = "FILE", .what = "model file",
//        .required = "a model is required (-m MODEL.gguf)", .help = "GGUF model"},
//       {"--n-predict", "-n", CLI_INT, &o->n_predict, .lo = 0, .hi = 1 << 30, .meta = "N",
//        .def = CLI_DEF_VALUE, .help = "most tokens to generate"},
//       {"--help", "-h", CLI_HELP, .help = "show this help"},
//   };
//   cli_cmd cmd = {"generate", "usage: ...", "intro", "notes", opts, CLI_N(opts)};
//   int r = cli_parse(&cmd, argc, argv);
//   if (r != CLI_PARSE_OK) return r == CLI_PARSE_HELP ? 0 : 1;
//
// Messages keep the style of cli_common.h: "specdec: FLAG: expected an
// integer, got 'x'", "specdec: FLAG: missing value", "specdec: CMD: unknown
// option 'X' (see specdec CMD --help)". FLAG is the spelling the user typed.
#ifndef SD_CLI_OPTS_H
#define SD_CLI_OPTS_H

#include <stdint.h>
#include <stdio.h>

typedef enum cli_kind {
    CLI_FLAG = 0,  // no value: *(int *)dst = 1 (0 with .off = 1, e.g. --no-chat)
    CLI_INT,       // int in [lo, hi]: *(int *)dst
    CLI_FLOAT,     // float in [lo, hi]: *(float *)dst
    CLI_U64,       // non-negative integer (decimal or 0x hex): *(uint64_t *)dst
    CLI_STRING,    // *(const char **)dst = the argument (argv's storage, not copied)
    CLI_FILE,      // as CLI_STRING, and the file must exist and be readable ("WHAT 'PATH' not found")
    CLI_LIST,      // repeatable: appends to (const char **)dst, at most max values, count in *count
    CLI_CUSTOM,    // fn(flag, value, dst) stores and checks the value; prints its own message on error
    CLI_HELP,      // prints the help on stdout; cli_parse returns CLI_PARSE_HELP
    CLI_SECTION,   // not an option: a heading line (help) in the help text; name is NULL
} cli_kind;

// A custom option's parser: checks value, stores it through dst. flag is the
// spelling typed (for messages). Returns 0, or -1 after printing a message
// (cli_error).
typedef int (*cli_custom_fn)(const char *flag, const char *value, void *dst);

typedef struct cli_opt {
    const char *name;        // long name with dashes ("--model"); NULL for CLI_SECTION
    const char *short_name;  // "-m", or NULL
    cli_kind kind;
    void *dst;               // destination (type per kind); CLI_CUSTOM: passed to fn
    double lo, hi;           // CLI_INT / CLI_FLOAT: accepted range, both ends included
    int max;                 // CLI_LIST: most values (dst has room for max)
    int *count;              // CLI_LIST: values stored so far (start at 0)
    int off;                 // CLI_FLAG: 1 = store 0 instead of 1 ("--no-chat" clears chat)
    cli_custom_fn fn;        // CLI_CUSTOM
    const char *meta;        // value's placeholder in the help ("FILE", "N"); NULL for flags
    const char *what;        // CLI_FILE: noun of messages ("model file"); CLI_LIST: plural noun of the
                             // too-many message ("draft models"; NULL = "values")
    const char *required;    // if set, the option is required; the message when it is absent
                             // (printed after "CMD: ")
    const char **given;      // if set, receives the spelling typed when the option appears (else untouched)
    const char *help;        // help text; wrapped at 80 columns, '\n' starts a new line
    const char *def;         // default shown in the help: NULL = none, CLI_DEF_VALUE = the value dst
                             // holds before parsing (ints, floats, u64), else "(default DEF)"
} cli_opt;

#define CLI_DEF_VALUE "\x01"  // cli_opt.def: print the destination's initial value
#define CLI_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct cli_cmd {
    const char *name;    // subcommand name, prefixes messages ("generate")
    const char *usage;   // first line(s) of the help ("usage: specdec generate -m MODEL.gguf ...")
    const char *intro;   // paragraph(s) after usage, or NULL
    const char *notes;   // text after the options, or NULL
    const cli_opt *opts;
    int n_opts;
    // Positional arguments (arguments not starting with '-', and "-"): with
    // max_pos == 0 they are rejected as unknown options.
    const char **pos;    // (max_pos) receives them
    int max_pos;
    int *n_pos;          // count stored
    const char *pos_syntax;  // for the too-many message ("CHECKPOINT.bin TOKENIZER.bin OUT.gguf")
} cli_cmd;

enum {
    CLI_PARSE_OK = 0,     // parsed; the command runs
    CLI_PARSE_HELP = 1,   // --help was printed on stdout: exit 0
    CLI_PARSE_ERROR = 2,  // a message was printed on stderr: exit 1
};

// Parses argv[1..argc) (argv[0] is the subcommand) against cmd's table,
// filling the destinations in order (a later value of a non-list option
// replaces an earlier one). "--name=value" is accepted for options with a
// value. -h/--help anywhere (not as a value) prints the help with the
// defaults as they were before parsing and returns CLI_PARSE_HELP. Files are
// checked when their option is read; required options after the whole argv.
// Returns CLI_PARSE_OK, CLI_PARSE_HELP or CLI_PARSE_ERROR (message printed).
int cli_parse(const cli_cmd *cmd, int argc, char **argv);

// Writes the help of cmd to f: usage, intro, "options:" and one entry per
// option of the table (section headings where the table has them), notes.
// Defaults marked CLI_DEF_VALUE show the destinations' current values (call
// it before parsing has changed them; cli_parse does).
void cli_help(FILE *f, const cli_cmd *cmd);

// The exit status of a cli_parse result that is not CLI_PARSE_OK.
static inline int cli_parse_exit(int r) { return r == CLI_PARSE_HELP ? 0 : 1; }

#endif
