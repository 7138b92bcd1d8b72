// cli_opts.c - the table-driven option parser and help writer (cli_opts.h).
#include "cli_opts.h"

#include <string.h>

#include "cli_common.h"

#define HELP_WIDTH 80     // help lines wrap before this column
#define HELP_COL_MAX 26   // option columns wider than this put their help on the next line
#define MAX_OPTS 128      // most entries of one table

static int takes_value(const cli_opt *o) {
    return o->kind != CLI_FLAG && o->kind != CLI_HELP && o->kind != CLI_SECTION;
}

// The entry whose long or short name is a[0..len), or NULL.
static const cli_opt *find_opt(const cli_cmd *c, const char *a, size_t len) {
    for (int k = 0; k < c->n_opts; k++) {
        const cli_opt *o = &c->opts[k];
        if (o->kind == CLI_SECTION) continue;
        if (o->name && strlen(o->name) == len && !memcmp(o->name, a, len)) return o;
        if (o->short_name && strlen(o->short_name) == len && !memcmp(o->short_name, a, len)) return o;
    }
    return NULL;
}

// Length of the flag part of argument a: up to '=' in "--name=value".
static size_t flag_len(const char *a) {
    if (a[0] == '-' && a[1] == '-') return strcspn(a, "=");
    return strlen(a);
}

static int is_positional(const char *a) { return a[0] != '-' || a[1] == 0; }

// 1 if -h/--help appears in argv as an option (not as another option's value).
static int wants_help(const cli_cmd *c, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (is_positional(argv[i])) continue;
        size_t n = flag_len(argv[i]);
        const cli_opt *o = find_opt(c, argv[i], n);
        if (!o) continue;
        if (o->kind == CLI_HELP) return 1;
        if (takes_value(o) && !argv[i][n]) i++;   // skip the value
    }
    return 0;
}

// Stores value v of option o, typed as flag. 0, or -1 after a message.
static int store(const cli_opt *o, const char *flag, const char *v) {
    switch (o->kind) {
    case CLI_FLAG: *(int *)o->dst = o->off ? 0 : 1; return 0;
    case CLI_INT: return cli_int(flag, v, (long)o->lo, (long)o->hi, (int *)o->dst);
    case CLI_FLOAT: return cli_float(flag, v, o->lo, o->hi, (float *)o->dst);
    case CLI_U64: return cli_u64(flag, v, (uint64_t *)o->dst);
    case CLI_FILE:
        if (!cli_file_ok(o->what ? o->what : "file", v)) return -1;
        *(const char **)o->dst = v;
        return 0;
    case CLI_STRING: *(const char **)o->dst = v; return 0;
    case CLI_LIST:
        if (*o->count >= o->max) {
            cli_error("%s: at most %d %s", flag, o->max, o->what ? o->what : "values");
            return -1;
        }
        ((const char **)o->dst)[(*o->count)++] = v;
        return 0;
    case CLI_CUSTOM: return o->fn(flag, v, o->dst);
    case CLI_HELP:
    case CLI_SECTION: break;
    }
    return 0;
}

// Takes positional argument a. 0, or -1 after a message.
static int take_positional(const cli_cmd *c, const char *a) {
    if (c->max_pos == 0) {
        cli_error("%s: unknown option '%s' (see specdec %s --help)", c->name, a, c->name);
        return -1;
    }
    if (*c->n_pos == c->max_pos) {
        cli_error("%s: too many arguments ('%s'); expected %s", c->name, a, c->pos_syntax ? c->pos_syntax : "fewer");
        return -1;
    }
    c->pos[(*c->n_pos)++] = a;
    return 0;
}

int cli_parse(const cli_cmd *c, int argc, char **argv) {
    if (c->n_opts > MAX_OPTS) {
        cli_error("%s: option table too large (%d entries, at most %d)", c->name, c->n_opts, MAX_OPTS);
        return CLI_PARSE_ERROR;
    }
    if (wants_help(c, argc, argv)) {
        cli_help(stdout, c);
        return CLI_PARSE_HELP;
    }
    if (c->n_pos) *c->n_pos = 0;
    char seen[MAX_OPTS] = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_positional(a)) {
            if (take_positional(c, a) < 0) return CLI_PARSE_ERROR;
            continue;
        }
        size_t n = flag_len(a);
        const cli_opt *o = find_opt(c, a, n);
        if (!o) {
            cli_error("%s: unknown option '%.*s' (see specdec %s --help)", c->name, (int)n, a, c->name);
            return CLI_PARSE_ERROR;
        }
        const char *flag = a[n] ? o->name : a;   // "--name=value": the table's spelling (stable storage)
        const char *v = NULL;
        if (takes_value(o)) {
            if (a[n]) {
                v = a + n + 1;
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                cli_error("%s: missing value", a);
                return CLI_PARSE_ERROR;
            }
        } else if (a[n]) {
            cli_error("%s: takes no value, got '%s'", flag, a);
            return CLI_PARSE_ERROR;
        }
        if (store(o, flag, v) < 0) return CLI_PARSE_ERROR;
        seen[o - c->opts] = 1;
        if (o->given) *o->given = flag;
    }
    for (int k = 0; k < c->n_opts; k++)
        if (c->opts[k].required && !seen[k]) {
            cli_error("%s: %s", c->name, c->opts[k].required);
            return CLI_PARSE_ERROR;
        }
    return CLI_PARSE_OK;
}

// ---------------------------------------------------------------- help
// Writes "  -s, --long META" into buf; returns its length.
static int opt_left(const cli_opt *o, char *buf, size_t n) {
    return snprintf(buf, n, "  %s%s%s%s%s", o->short_name ? o->short_name : "", o->short_name ? ", " : "", o->name,
                    o->meta ? " " : "", o->meta ? o->meta : "");
}

// Writes text from column *cur, wrapping words at HELP_WIDTH to column col;
// '\n' in text starts a new line at col.
static void put_wrapped(FILE *f, const char *text, int col, int *cur) {
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            fprintf(f, "\n%*s", col, "");
            *cur = col;
            p++;
            continue;
        }
        if (*p == ' ') {
            p++;
            continue;
        }
        int len = (int)strcspn(p, " \n");
        if (*cur > col && *cur + 1 + len > HELP_WIDTH) {
            fprintf(f, "\n%*s", col, "");
            *cur = col;
        }
        if (*cur > col) {
            fputc(' ', f);
            (*cur)++;
        }
        fwrite(p, 1, (size_t)len, f);
        *cur += len;
        p += len;
    }
}

// The default of o as text ("" when none is shown).
static void opt_default(const cli_opt *o, char *buf, size_t n) {
    buf[0] = 0;
    if (!o->def) return;
    if (strcmp(o->def, CLI_DEF_VALUE)) {
        snprintf(buf, n, "(default %s)", o->def);
        return;
    }
    switch (o->kind) {
    case CLI_INT: snprintf(buf, n, "(default %d)", *(const int *)o->dst); break;
    case CLI_FLOAT: snprintf(buf, n, "(default %g)", (double)*(const float *)o->dst); break;
    case CLI_U64: snprintf(buf, n, "(default %llu)", (unsigned long long)*(const uint64_t *)o->dst); break;
    case CLI_STRING:
    case CLI_FILE: {
        const char *s = *(const char *const *)o->dst;
        if (s) snprintf(buf, n, "(default %s)", s);
        break;
    }
    default: break;
    }
}

void cli_help(FILE *f, const cli_cmd *c) {
    char left[160], def[160];
    int col = 0;
    for (int k = 0; k < c->n_opts; k++) {
        if (c->opts[k].kind == CLI_SECTION) continue;
        int w = opt_left(&c->opts[k], left, sizeof left);
        if (w <= HELP_COL_MAX && w > col) col = w;
    }
    col += 2;
    fprintf(f, "%s\n", c->usage);
    if (c->intro) fprintf(f, "\n%s", c->intro);
    fprintf(f, "\noptions:\n");
    for (int k = 0; k < c->n_opts; k++) {
        const cli_opt *o = &c->opts[k];
        if (o->kind == CLI_SECTION) {
            fprintf(f, "%s\n", o->help);
            continue;
        }
        int cur = opt_left(o, left, sizeof left);
        fputs(left, f);
        if (cur + 2 > col) {
            fprintf(f, "\n%*s", col, "");
        } else {
            fprintf(f, "%*s", col - cur, "");
        }
        cur = col;
        put_wrapped(f, o->help ? o->help : "", col, &cur);
        opt_default(o, def, sizeof def);
        if (def[0]) put_wrapped(f, def, col, &cur);
        fputc('\n', f);
    }
    if (c->notes) fprintf(f, "\n%s", c->notes);
}
