// method_args.c - the numbers of method strings (see method_args.h) and
// sd_parse_ints (include/specdec_spec.h), moved here from methods.c.
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "gen/method_args.h"
#include "specdec_spec.h"

int sd_parse_ints(const char *flag, const char *s, char sep, int *out, int max, int lo, int hi, char *err,
                    size_t errlen) {
    const char *what = sep == ',' ? "comma-separated" : "dash-separated";
    int n = 0;
    const char *p = s;
    if (!*s) goto bad;
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9') goto bad;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p) goto bad;
        if (v < 1) goto bad;
        if (v < lo || v > hi) {
            snprintf(err, errlen, "%s: %ld is out of range [%d, %d] in '%s'", flag, v, lo, hi, s);
            return -1;
        }
        if (n == max) {
            snprintf(err, errlen, "%s: at most %d values, got '%s'", flag, max, s);
            return -1;
        }
        out[n++] = (int)v;
        p = end;
        if (!*p) break;
        if (*p != sep) goto bad;
        p++;
    }
    return n;
bad:
    snprintf(err, errlen, "%s: expected %s positive integers, got '%s'", flag, what, s);
    return -1;
}

int sd_method_nums(const char *s, char sep, char sep2, int *out, int max) {
    int n = 0;
    const char *p = s;
    for (;;) {
        if (*p < '0' || *p > '9') return -1;
        long v = 0;
        for (; *p >= '0' && *p <= '9'; p++)
            if (v < INT_MAX) v = v * 10 + (*p - '0');
        if (n == max) return max + 1;
        out[n++] = v > INT_MAX ? INT_MAX : (int)v;
        if (!*p) return n;
        if (*p != sep && (!sep2 || *p != sep2)) return -1;
        p++;
    }
}

int sd_method_range(const char *syntax, const char *name, int v, int lo, int hi, const char *got, char *err,
                    size_t errlen) {
    if (v >= lo && v <= hi) return 0;
    snprintf(err, errlen, "method %s needs %s in %d..%d, got %s = %d in '%s'", syntax, name, lo, hi, name, v, got);
    return -1;
}

int sd_method_widths_nodes(const int *w, int n) {
    long total = 1, level = 1;
    for (int i = 0; i < n; i++) {
        level *= w[i];
        if (level > (1 << 20)) level = 1 << 20;
        total += level;
        if (total > (1 << 20)) return 1 << 20;
    }
    return (int)total;
}

// Each value of a width list in lo..hi ("W1", "W2", ... named in messages).
int sd_method_widths_range(const char *syntax, const int *w, int n, int lo, int hi, const char *got, char *err,
                           size_t errlen) {
    char name[16];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "W%d", i + 1);
        if (sd_method_range(syntax, name, w[i], lo, hi, got, err, errlen) < 0) return -1;
    }
    return 0;
}

int sd_method_repeat(const int *v, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (v[i] == v[j]) return v[i];
    return -1;
}
