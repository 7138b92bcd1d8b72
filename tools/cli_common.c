// cli_common.c - flag parsing, JSON strings and UTF-8 helpers for the CLI.
#include "cli_common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("specdec: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_int(const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno) {
        cli_error("%s: expected an integer, got '%s'", flag, s);
        return -1;
    }
    if (v < lo || v > hi) {
        cli_error("%s: %ld is out of range [%ld, %ld]", flag, v, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_float(const char *flag, const char *s, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || isnan(v)) {
        cli_error("%s: expected a number, got '%s'", flag, s);
        return -1;
    }
    if (v < lo || v > hi) {
        cli_error("%s: %g is out of range [%g, %g]", flag, v, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

int cli_u64(const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!*s || *s == '-') {
        cli_error("%s: expected a non-negative integer, got '%s'", flag, s);
        return -1;
    }
    unsigned long long v = strtoull(s, &end, 0);
    if (*end || errno) {
        cli_error("%s: expected a non-negative integer, got '%s'", flag, s);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int cli_file_ok(const char *what, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        cli_error("%s '%s' not found", what, path);
        return 0;
    }
    if (!S_ISREG(st.st_mode)) {
        cli_error("%s '%s' is not a regular file", what, path);
        return 0;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error("%s '%s' is not readable: %s", what, path, strerror(errno));
        return 0;
    }
    fclose(f);
    return 1;
}

// Length of the UTF-8 sequence starting with lead byte c (0: invalid lead).
static int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

// Bytes of the valid UTF-8 character at s (n bytes available): 0 if invalid,
// -1 if valid so far but incomplete.
static int utf8_char(const unsigned char *s, size_t n) {
    int L = utf8_len(s[0]);
    if (L == 0) return 0;
    for (int k = 1; k < L; k++) {
        if ((size_t)k >= n) return -1;
        if ((s[k] & 0xC0) != 0x80) return 0;
    }
    if (L == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
    if (L == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))) return 0;
    return L;
}

size_t cli_utf8_complete(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        int L = utf8_char(s + i, n - i);
        if (L < 0) break;      // incomplete at the end: hold back
        i += L ? (size_t)L : 1; // invalid bytes pass through one at a time
    }
    return i;
}

void cli_json_string(FILE *f, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            switch (c) {
            case '"': fputs("\\\"", f); break;
            case '\\': fputs("\\\\", f); break;
            case '\n': fputs("\\n", f); break;
            case '\r': fputs("\\r", f); break;
            case '\t': fputs("\\t", f); break;
            case '\b': fputs("\\b", f); break;
            case '\f': fputs("\\f", f); break;
            default:
                if (c < 0x20 || c == 0x7f)
                    fprintf(f, "\\u%04x", c);
                else
                    fputc(c, f);
            }
            i++;
            continue;
        }
        int L = utf8_char(s + i, n - i);
        if (L <= 0) {
            fputs("\xEF\xBF\xBD", f); // U+FFFD
            i++;
        } else {
            fwrite(s + i, 1, (size_t)L, f);
            i += (size_t)L;
        }
    }
    fputc('"', f);
}
