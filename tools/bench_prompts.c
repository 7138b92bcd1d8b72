// bench_prompts.c - Spec-Bench JSON-lines prompt files (see bench_prompts.h),
// each line parsed by jansson.
#include "bench_prompts.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pfail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pfail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

// question_id as text: a string as it is, an integer in decimal, any other
// number in the fewest digits that read back as the same double. NULL if v is
// neither (or out of memory).
static char *id_text(const json_t *v) {
    char tmp[64];
    if (json_is_string(v)) return strdup(json_string_value(v));
    if (json_is_integer(v)) {
        snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return strdup(tmp);
    }
    if (!json_is_real(v)) return NULL;
    const double x = json_real_value(v);
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x) break;
    }
    return strdup(tmp);
}

// Takes the fields of the parsed line o into p. 0, or -1 with a message.
static int prompt_fields(const json_t *o, int line, bench_prompt *p, char *err, size_t errlen) {
    if (!json_is_object(o)) return pfail(err, errlen, "expected a JSON object ('{'), not %s", type_name(o));
    const json_t *turns = json_object_get(o, "turns");
    if (!turns) return pfail(err, errlen, "\"turns\" is missing");
    if (!json_is_array(turns))
        return pfail(err, errlen, "\"turns\" must be an array of strings, not %s", type_name(turns));
    if (json_array_size(turns) == 0) return pfail(err, errlen, "\"turns\" is empty");
    // the first turn is the prompt; the others are not used
    const json_t *first = json_array_get(turns, 0);
    if (!json_is_string(first))
        return pfail(err, errlen, "\"turns\" must be an array of strings; its first element is %s", type_name(first));
    const json_t *cat = json_object_get(o, "category");
    if (cat && !json_is_string(cat)) return pfail(err, errlen, "\"category\" must be a string, not %s", type_name(cat));
    const json_t *qid = json_object_get(o, "question_id");
    if (qid && !json_is_string(qid) && !json_is_number(qid))
        return pfail(err, errlen, "\"question_id\" must be a number or a string, not %s", type_name(qid));

    // jansson refuses \u0000 (no JSON_ALLOW_NUL), so the strings hold no NUL
    p->text = strdup(json_string_value(first));
    const char *c = cat ? json_string_value(cat) : "";
    p->category = strdup(c[0] ? c : "uncategorized");
    p->id = qid ? id_text(qid) : NULL;
    if (p->id && !p->id[0]) {
        free(p->id);
        p->id = NULL;
    }
    if (!p->id) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "line%d", line);
        p->id = strdup(tmp);
    }
    if (!p->text || !p->category || !p->id) return pfail(err, errlen, "out of memory");
    return 0;
}

void bench_prompt_clear(bench_prompt *p) {
    if (!p) return;
    free(p->id);
    free(p->category);
    free(p->text);
    p->id = p->category = p->text = NULL;
}

int bench_prompt_parse(const char *s, size_t len, int line, bench_prompt *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->line = line;
    json_error_t je;
    json_t *o = json_loadb(s, len, 0, &je);
    if (!o) return pfail(err, errlen, "invalid JSON at column %d: %s", je.column, je.text);
    int rc = prompt_fields(o, line, p, err, errlen);
    json_decref(o);
    if (rc) bench_prompt_clear(p);
    return rc;
}

void bench_prompts_free(bench_prompt *p, int n) {
    if (!p) return;
    for (int i = 0; i < n; i++) bench_prompt_clear(&p[i]);
    free(p);
}

int bench_prompts_load(const char *path, bench_prompt **out, char *err, size_t errlen) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open prompts file '%s': %s", path, strerror(errno));
        return -1;
    }
    char *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 65536 * 2;
            char *t = realloc(data, cap);
            if (!t) {
                free(data);
                fclose(f);
                snprintf(err, errlen, "out of memory reading '%s'", path);
                return -1;
            }
            data = t;
        }
        size_t k = fread(data + len, 1, 65536, f);
        len += k;
        if (k < 65536) break;
    }
    int ioerr = ferror(f);
    fclose(f);
    if (ioerr) {
        free(data);
        snprintf(err, errlen, "cannot read prompts file '%s'", path);
        return -1;
    }
    bench_prompt *ps = NULL;
    int n = 0, cap_p = 0, line = 0;
    size_t pos = 0;
    // a UTF-8 byte order mark at the start is tolerated
    if (len >= 3 && (unsigned char)data[0] == 0xEF && (unsigned char)data[1] == 0xBB && (unsigned char)data[2] == 0xBF)
        pos = 3;
    char lerr[256];
    while (pos < len) {
        line++;
        size_t e = pos;
        while (e < len && data[e] != '\n') e++;
        size_t ll = e - pos;
        if (ll && data[pos + ll - 1] == '\r') ll--;
        size_t k = 0;
        while (k < ll && (data[pos + k] == ' ' || data[pos + k] == '\t')) k++;
        if (k < ll) {
            if (n == cap_p) {
                cap_p = cap_p ? cap_p * 2 : 64;
                bench_prompt *t = realloc(ps, sizeof *ps * (size_t)cap_p);
                if (!t) {
                    bench_prompts_free(ps, n);
                    free(data);
                    snprintf(err, errlen, "out of memory reading '%s'", path);
                    return -1;
                }
                ps = t;
            }
            if (memchr(data + pos, 0, ll)) {
                snprintf(err, errlen, "%s, line %d: NUL byte in the line", path, line);
                bench_prompts_free(ps, n);
                free(data);
                return -1;
            }
            if (bench_prompt_parse(data + pos, ll, line, &ps[n], lerr, sizeof lerr) < 0) {
                snprintf(err, errlen, "%s, line %d: %s", path, line, lerr);
                bench_prompts_free(ps, n);
                free(data);
                return -1;
            }
            n++;
        }
        pos = e + 1;
    }
    free(data);
    if (n == 0) {
        free(ps);
        snprintf(err, errlen, "prompts file '%s' holds no prompts", path);
        return -1;
    }
    *out = ps;
    return n;
}
