// bench_prompts.c - Spec-Bench JSON-lines prompt files (see bench_prompts.h).
#include "bench_prompts.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct jcur {
    const char *s;   // (n) the line
    size_t n;
    size_t i;        // read position
    char *err;       // caller's message buffer
    size_t errlen;
} jcur;

typedef struct jbuf {
    char *b;         // (cap) bytes, NUL-terminated
    size_t len, cap;
} jbuf;

static int jfail(jcur *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jfail(jcur *c, const char *fmt, ...) {
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < c->errlen)
            snprintf(c->err + k, c->errlen - (size_t)k, " at column %zu", c->i + 1);
    }
    return -1;
}

static int jbuf_put(jbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (b->len + n + 1 > cap) cap *= 2;
        char *t = realloc(b->b, cap);
        if (!t) return -1;
        b->b = t;
        b->cap = cap;
    }
    memcpy(b->b + b->len, s, n);
    b->len += n;
    b->b[b->len] = 0;
    return 0;
}

static void ws(jcur *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\r' || c->s[c->i] == '\n'))
        c->i++;
}

static int hex4(jcur *c, unsigned *out) {
    if (c->i + 4 > c->n) return jfail(c, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char h = c->s[c->i + k];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (unsigned)(h - 'A' + 10);
        else return jfail(c, "bad hex digit '%c' in \\u escape", h);
    }
    c->i += 4;
    *out = v;
    return 0;
}

static size_t utf8_encode(unsigned cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Reads a string (the cursor on its opening quote); decodes it into out
// (NULL: only checks and skips it).
static int jstring(jcur *c, jbuf *out) {
    if (c->i >= c->n || c->s[c->i] != '"') return jfail(c, "expected a string");
    c->i++;
    for (;;) {
        size_t start = c->i;
        while (c->i < c->n && c->s[c->i] != '"' && c->s[c->i] != '\\' && (unsigned char)c->s[c->i] >= 0x20) c->i++;
        if (out && c->i > start && jbuf_put(out, c->s + start, c->i - start)) return jfail(c, "out of memory");
        if (c->i >= c->n) return jfail(c, "unterminated string");
        char ch = c->s[c->i];
        if (ch == '"') {
            c->i++;
            if (out && !out->b && jbuf_put(out, "", 0)) return jfail(c, "out of memory");
            return 0;
        }
        if (ch != '\\') return jfail(c, "raw control character 0x%02x in a string (use an escape)", (unsigned char)ch);
        c->i++;
        if (c->i >= c->n) return jfail(c, "unterminated escape");
        char e = c->s[c->i++];
        char tmp[4];
        size_t tn = 1;
        switch (e) {
        case '"': tmp[0] = '"'; break;
        case '\\': tmp[0] = '\\'; break;
        case '/': tmp[0] = '/'; break;
        case 'b': tmp[0] = '\b'; break;
        case 'f': tmp[0] = '\f'; break;
        case 'n': tmp[0] = '\n'; break;
        case 'r': tmp[0] = '\r'; break;
        case 't': tmp[0] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(c, &cp)) return -1;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return jfail(c, "unpaired low surrogate \\u%04X", cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (c->i + 2 > c->n || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u')
                    return jfail(c, "high surrogate \\u%04X not followed by a low surrogate", cp);
                c->i += 2;
                if (hex4(c, &lo)) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return jfail(c, "high surrogate \\u%04X followed by \\u%04X, not a low surrogate", cp, lo);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) return jfail(c, "\\u0000 (NUL) is not supported in prompt text");
            tn = utf8_encode(cp, tmp);
            break;
        }
        default:
            c->i--;
            return jfail(c, "unknown escape '\\%c'", e);
        }
        if (out && jbuf_put(out, tmp, tn)) return jfail(c, "out of memory");
    }
}

// Reads a JSON number; its text goes into out when out != NULL.
static int jnumber(jcur *c, jbuf *out) {
    size_t st = c->i;
    if (c->i < c->n && c->s[c->i] == '-') c->i++;
    if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return jfail(c, "bad number");
    if (c->s[c->i] == '0') c->i++;
    else
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    if (c->i < c->n && c->s[c->i] == '.') {
        c->i++;
        if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return jfail(c, "bad number: digits expected after '.'");
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    }
    if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
        c->i++;
        if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-')) c->i++;
        if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return jfail(c, "bad number: exponent digits expected");
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    }
    if (out && jbuf_put(out, c->s + st, c->i - st)) return jfail(c, "out of memory");
    return 0;
}

static int jliteral(jcur *c, const char *w) {
    size_t L = strlen(w);
    if (c->i + L > c->n || memcmp(c->s + c->i, w, L) != 0) return jfail(c, "unexpected character '%c'", c->s[c->i]);
    c->i += L;
    return 0;
}

// Skips any value (the cursor on its first character, whitespace skipped).
static int jskip(jcur *c, int depth) {
    if (depth > JSON_MAX_DEPTH) return jfail(c, "nesting deeper than %d", JSON_MAX_DEPTH);
    if (c->i >= c->n) return jfail(c, "a value is missing");
    char ch = c->s[c->i];
    if (ch == '"') return jstring(c, NULL);
    if (ch == '-' || (ch >= '0' && ch <= '9')) return jnumber(c, NULL);
    if (ch == 't') return jliteral(c, "true");
    if (ch == 'f') return jliteral(c, "false");
    if (ch == 'n') return jliteral(c, "null");
    if (ch == '[' || ch == '{') {
        char close = ch == '[' ? ']' : '}';
        c->i++;
        ws(c);
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            return 0;
        }
        for (;;) {
            ws(c);
            if (close == '}') {
                if (jstring(c, NULL)) return -1;
                ws(c);
                if (c->i >= c->n || c->s[c->i] != ':') return jfail(c, "expected ':' after an object key");
                c->i++;
                ws(c);
            }
            if (jskip(c, depth + 1)) return -1;
            ws(c);
            if (c->i < c->n && c->s[c->i] == ',') {
                c->i++;
                continue;
            }
            if (c->i < c->n && c->s[c->i] == close) {
                c->i++;
                return 0;
            }
            return jfail(c, "expected ',' or '%c'", close);
        }
    }
    return jfail(c, "unexpected character '%c'", ch);
}

static char *jbuf_take(jbuf *b) {
    char *r = b->b;
    b->b = NULL;
    b->len = b->cap = 0;
    return r;
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
    jcur c = {s, len, 0, err, errlen};
    jbuf b = {0};
    int have_turns = 0;
    ws(&c);
    if (c.i >= c.n || s[c.i] != '{') {
        jfail(&c, "expected a JSON object ('{')");
        goto fail;
    }
    c.i++;
    ws(&c);
    if (c.i < c.n && s[c.i] == '}') {
        c.i++;
    } else {
        for (;;) {
            ws(&c);
            if (jstring(&c, &b)) goto fail;
            char *key = jbuf_take(&b);
            ws(&c);
            if (c.i >= c.n || s[c.i] != ':') {
                free(key);
                jfail(&c, "expected ':' after an object key");
                goto fail;
            }
            c.i++;
            ws(&c);
            int rc = 0;
            if (!strcmp(key, "turns")) {
                if (c.i >= c.n || s[c.i] != '[') {
                    rc = jfail(&c, "\"turns\" must be an array of strings");
                } else {
                    // the first element is the prompt, the rest are skipped
                    c.i++;
                    ws(&c);
                    if (c.i < c.n && s[c.i] == ']') {
                        rc = jfail(&c, "\"turns\" is empty");
                    } else {
                        free(p->text);
                        p->text = NULL;
                        if (c.i >= c.n || s[c.i] != '"') rc = jfail(&c, "\"turns\" must be an array of strings");
                        else if ((rc = jstring(&c, &b)) == 0) p->text = jbuf_take(&b);
                        while (rc == 0) {
                            ws(&c);
                            if (c.i < c.n && s[c.i] == ']') {
                                c.i++;
                                break;
                            }
                            if (c.i >= c.n || s[c.i] != ',') {
                                rc = jfail(&c, "expected ',' or ']'");
                                break;
                            }
                            c.i++;
                            ws(&c);
                            rc = jskip(&c, 1);
                        }
                        if (rc == 0) have_turns = 1;
                    }
                }
            } else if (!strcmp(key, "category")) {
                if (c.i < c.n && s[c.i] == '"') {
                    free(p->category);
                    p->category = NULL;
                    if ((rc = jstring(&c, &b)) == 0) p->category = jbuf_take(&b);
                } else {
                    rc = jfail(&c, "\"category\" must be a string");
                }
            } else if (!strcmp(key, "question_id")) {
                free(p->id);
                p->id = NULL;
                if (c.i < c.n && s[c.i] == '"') rc = jstring(&c, &b);
                else if (c.i < c.n && (s[c.i] == '-' || (s[c.i] >= '0' && s[c.i] <= '9'))) rc = jnumber(&c, &b);
                else rc = jfail(&c, "\"question_id\" must be a number or a string");
                if (rc == 0) p->id = jbuf_take(&b);
            } else {
                rc = jskip(&c, 1);
            }
            free(key);
            if (rc) goto fail;
            ws(&c);
            if (c.i < c.n && s[c.i] == ',') {
                c.i++;
                continue;
            }
            if (c.i < c.n && s[c.i] == '}') {
                c.i++;
                break;
            }
            jfail(&c, "expected ',' or '}'");
            goto fail;
        }
    }
    ws(&c);
    if (c.i < c.n) {
        jfail(&c, "unexpected text after the object");
        goto fail;
    }
    if (!have_turns) {
        snprintf(err, errlen, "\"turns\" is missing");
        goto fail;
    }
    if (!p->category || !p->category[0]) {
        free(p->category);
        p->category = strdup("uncategorized");
    }
    if (!p->id || !p->id[0]) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "line%d", line);
        free(p->id);
        p->id = strdup(tmp);
    }
    if (!p->category || !p->id) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    free(b.b);
    return 0;
fail:
    free(b.b);
    bench_prompt_clear(p);
    return -1;
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
