// cli_common.c - flag parsing, JSON values (jansson) and UTF-8 helpers for the CLI.
#include "cli_common.h"
#include "utf8.h"

#include "specdec.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

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

int cli_gpu_on;

int cli_gpu_setup(void) {
    if (!cli_gpu_on) return 0;
    char err[512];
    if (sd_gpu_enable(1, err, sizeof err) < 0) {
        cli_error("%s", err);
        return -1;
    }
    return 0;
}

int cli_sampling_draw(const char *flag, const char *value, void *dst) {
    if (!strcmp(value, "race")) *(int *)dst = SD_DRAW_RACE;
    else if (!strcmp(value, "rejection")) *(int *)dst = SD_DRAW_REJECTION;
    else return cli_error("%s: expected race or rejection, got '%s'", flag, value), -1;
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

json_t *cli_json_str(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    char *clean = malloc(3 * n + 1); // each byte at worst becomes U+FFFD (3 bytes)
    if (!clean) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int L = utf8_char(s + i, n - i);
        if (L <= 0) { // invalid, or cut off at the end
            memcpy(clean + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        } else {
            memcpy(clean + k, s + i, (size_t)L);
            k += (size_t)L;
            i += (size_t)L;
        }
    }
    json_t *v = json_stringn(clean, k);
    free(clean);
    return v;
}

json_t *cli_json_strs(const char *const *s, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, cli_json_str(s[i], strlen(s[i])))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

json_t *cli_json_host(void) {
    char cpu[256] = "unknown", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ' || *v == '\t') v++;
            snprintf(cpu, sizeof cpu, "%.*s", (int)strcspn(v, "\n"), v);
            break;
        }
    if (f) fclose(f);
    struct utsname u;
    char os[200] = "unknown";
    if (uname(&u) == 0) snprintf(os, sizeof os, "%.60s %.120s", u.sysname, u.release);
    return json_pack("{s:o, s:I, s:s, s:o}", "cpu", cli_json_str(cpu, strlen(cpu)), "cores",
                     (json_int_t)sysconf(_SC_NPROCESSORS_ONLN), "kernels", sd_backend_name(), "os",
                     cli_json_str(os, strlen(os)));
}

json_t *cli_json_num(double v, int decimals) {
    if (!isfinite(v)) return json_null();
    const double scale = pow(10.0, decimals);
    // beyond 1e15 a double has no decimals left to round
    if (fabs(v) * scale < 1e15) v = round(v * scale) / scale;
    return json_real(v);
}

int cli_json_write(FILE *f, json_t *v) {
    if (!v) return -1;
    // one line, ", " and ": " between items; 15 significant digits print the
    // rounded numbers of cli_json_num exactly (older jansson prints 17)
    int rc = json_dumpf(v, f, JSON_REAL_PRECISION(15));
    json_decref(v);
    if (rc || fputc('\n', f) == EOF || fflush(f) == EOF) return -1;
    return 0;
}

int cli_tokenize_prompt(const sd_tokenizer *tok, const char *system, const char *text, int chat, int32_t **out,
                        char *err, size_t errlen, int *chat_failed) {
    *out = NULL;
    if (chat_failed) *chat_failed = 0;
    const size_t len = strlen(text);
    int max = (int)len + (chat ? (system ? (int)strlen(system) : 0) + 4096 : 16), n = -1;
    int32_t *ids = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {   // the second with the count the first one gave
        int32_t *t = realloc(ids, sizeof(int32_t) * (size_t)max);
        if (!t) break;
        ids = t;
        n = chat ? sd_chat_tokenize(tok, system, text, ids, max, err, errlen) : sd_tokenize(tok, text, len, 1, 0, ids, max);
        if (chat && n < 0) {
            if (chat_failed) *chat_failed = 1;
            free(ids);
            return -1;
        }
        if (n <= max) break;
        max = n;
        n = -1;
    }
    if (n <= 0) {
        free(ids);
        return snprintf(err, errlen, n < 0 ? "cannot tokenize the prompt" : "the prompt is empty (no tokens)"), -1;
    }
    *out = ids;
    return n;
}
