// corpus.c - the JSON-lines training corpus (corpus.h): lines in, records
// out, every error naming file, line and column.
#include "train/corpus.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "model/unicode.h"

struct sd_corpus {
    FILE *f;
    char path[1024];
    int line;                 // lines read so far
    char *buf;                // (cap) the current line, getline's buffer
    size_t cap;
    char *arena;              // (arena_cap) decoded strings of the current record
    size_t arena_cap, arena_used;
    const char *roles[SD_CORPUS_MAX_MSG];
    const char *contents[SD_CORPUS_MAX_MSG];
};

// ---------------------------------------------------------------- JSON reader
typedef struct jcur {
    const char *s, *p, *end;  // line, cursor, end
    sd_corpus *c;             // arena for decoded strings
    char msg[256];            // what went wrong (without file and line)
} jcur;

static int jfail(jcur *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jfail(jcur *j, const char *fmt, ...) {
    char m[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(j->msg, sizeof j->msg, "%s at column %d", m, (int)(j->p - j->s) + 1);
    return -1;
}

static void jws(jcur *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n')) j->p++;
}

static int jhex4(jcur *j, unsigned *out) {
    if (j->end - j->p < 4) return jfail(j, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = j->p[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') v |= (unsigned)(ch - 'A' + 10);
        else return jfail(j, "bad \\u escape");
    }
    j->p += 4;
    *out = v;
    return 0;
}

static char *utf8_put(char *o, unsigned cp) {
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | (cp >> 6));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | (cp >> 12));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | (cp >> 18));
        *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    }
    return o;
}

// A string at the cursor; out (may be NULL: skipped) receives the decoded,
// NUL-terminated text in the arena. A decoded string is never longer than
// its source, so the arena (2 x line + 2) always has room.
static int jstring(jcur *j, const char **out) {
    if (j->p >= j->end || *j->p != '"') return jfail(j, "expected a string");
    j->p++;
    sd_corpus *c = j->c;
    char *o0 = c->arena + c->arena_used, *o = o0;
    for (;;) {
        if (j->p >= j->end) return jfail(j, "unterminated string");
        unsigned char ch = (unsigned char)*j->p++;
        if (ch == '"') break;
        if (ch < 0x20) return j->p--, jfail(j, "control character in a string");
        if (ch >= 0x80) {   // UTF-8, well-formed (as the server's JSON reader requires)
            uint32_t cp;
            int k = sd_utf8_decode(j->p - 1, (size_t)(j->end - j->p + 1), &cp);
            if (cp >= SD_UTF8_INVALID_BASE) return j->p--, jfail(j, "invalid UTF-8 (byte 0x%02X) in a string", ch);
            memcpy(o, j->p - 1, (size_t)k);
            o += k;
            j->p += k - 1;
            continue;
        }
        if (ch != '\\') {
            *o++ = (char)ch;
            continue;
        }
        if (j->p >= j->end) return jfail(j, "unterminated string");
        char e = *j->p++;
        unsigned cp;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u':
            if (jhex4(j, &cp) < 0) return -1;
            if (cp >= 0xD800 && cp < 0xDC00) {   // a high surrogate wants its low half
                unsigned lo;
                if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u') return jfail(j, "unpaired surrogate");
                j->p += 2;
                if (jhex4(j, &lo) < 0) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return jfail(j, "unpaired surrogate");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return jfail(j, "unpaired surrogate");
            }
            if (cp == 0) return jfail(j, "NUL character (\\u0000) in a string");
            o = utf8_put(o, cp);
            break;
        default: return j->p--, jfail(j, "bad escape '\\%c'", e);
        }
    }
    *o++ = 0;
    if (out) {
        *out = o0;
        c->arena_used += (size_t)(o - o0);
    }
    return 0;
}

static int jliteral(jcur *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n)) return jfail(j, "unexpected character");
    j->p += n;
    return 0;
}

static int jnumber(jcur *j) {
    const char *q = j->p;
    if (q < j->end && *q == '-') q++;
    if (q >= j->end || *q < '0' || *q > '9') return jfail(j, "unexpected character");
    while (q < j->end && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-'))
        q++;
    j->p = q;
    return 0;
}

// Any value, read over.
static int jskip(jcur *j, int depth) {
    if (depth > 64) return jfail(j, "nested too deeply");
    jws(j);
    if (j->p >= j->end) return jfail(j, "expected a value");
    char ch = *j->p;
    if (ch == '"') return jstring(j, NULL);
    if (ch == 't') return jliteral(j, "true");
    if (ch == 'f') return jliteral(j, "false");
    if (ch == 'n') return jliteral(j, "null");
    if (ch != '{' && ch != '[') return jnumber(j);
    char close = ch == '{' ? '}' : ']';
    j->p++;
    jws(j);
    if (j->p < j->end && *j->p == close) return j->p++, 0;
    for (;;) {
        if (close == '}') {
            jws(j);
            if (jstring(j, NULL) < 0) return -1;
            jws(j);
            if (j->p >= j->end || *j->p != ':') return jfail(j, "expected ':' after an object key");
            j->p++;
        }
        if (jskip(j, depth + 1) < 0) return -1;
        jws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) return j->p++, 0;
        return jfail(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

// Iterates an object's members: call with *first = 1; returns 1 with the key
// decoded (cursor on the value), 0 at the closing brace, <0 on error.
static int jmember(jcur *j, int *first, const char **key) {
    jws(j);
    if (*first) {
        *first = 0;
        if (j->p >= j->end || *j->p != '{') return jfail(j, "expected '{'");
        j->p++;
        jws(j);
        if (j->p < j->end && *j->p == '}') return j->p++, 0;
    } else {
        if (j->p < j->end && *j->p == '}') return j->p++, 0;
        if (j->p >= j->end || *j->p != ',') return jfail(j, "expected ',' or '}'");
        j->p++;
        jws(j);
    }
    if (jstring(j, key) < 0) return -1;
    jws(j);
    if (j->p >= j->end || *j->p != ':') return jfail(j, "expected ':' after an object key");
    j->p++;
    jws(j);
    return 1;
}

// One message object {"role": "...", "content": "..."} into roles/contents[i].
static int jmessage(jcur *j, int i) {
    sd_corpus *c = j->c;
    const char *key;
    int first = 1, r;
    c->roles[i] = c->contents[i] = NULL;
    while ((r = jmember(j, &first, &key)) == 1) {
        const char **dst = !strcmp(key, "role") ? &c->roles[i] : !strcmp(key, "content") ? &c->contents[i] : NULL;
        if (dst && j->p < j->end && *j->p != '"')
            return jfail(j, "messages[%d].%s is not a string", i, dst == &c->roles[i] ? "role" : "content");
        if ((dst ? jstring(j, dst) : jskip(j, 0)) < 0) return -1;
    }
    if (r < 0) return -1;
    if (!c->roles[i]) return jfail(j, "messages[%d] has no \"role\"", i);
    if (!c->contents[i]) return jfail(j, "messages[%d] has no \"content\"", i);
    return 0;
}

static int jmessages(jcur *j, int *n) {
    if (j->p >= j->end || *j->p != '[') return jfail(j, "\"messages\" is not an array");
    j->p++;
    jws(j);
    *n = 0;
    if (j->p < j->end && *j->p == ']') return j->p++, 0;
    for (;;) {
        jws(j);
        if (*n == SD_CORPUS_MAX_MSG) return jfail(j, "more than %d messages", SD_CORPUS_MAX_MSG);
        if (jmessage(j, *n) < 0) return -1;
        (*n)++;
        jws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == ']') return j->p++, 0;
        return jfail(j, "expected ',' or ']' in \"messages\"");
    }
}

// The record of line s[0..n) into rec.
static int parse_record(sd_corpus *c, const char *s, size_t n, sd_corpus_rec *rec, char *msg, size_t msglen) {
    jcur j = {.s = s, .p = s, .end = s + n, .c = c};
    const char *key, *text = NULL;
    int first = 1, r, n_msg = -1;
    while ((r = jmember(&j, &first, &key)) == 1) {
        if (!strcmp(key, "text")) {
            if (j.p < j.end && *j.p != '"') {
                r = jfail(&j, "\"text\" is not a string");
                break;
            }
            if ((r = jstring(&j, &text)) < 0) break;
        } else if (!strcmp(key, "messages")) {
            if ((r = jmessages(&j, &n_msg)) < 0) break;
        } else if ((r = jskip(&j, 0)) < 0) {
            break;
        }
    }
    if (r == 0) {
        jws(&j);
        if (j.p != j.end) r = jfail(&j, "text after the record's closing '}'");
    }
    if (r == 0 && text && n_msg >= 0) r = jfail(&j, "the record has both \"text\" and \"messages\"");
    if (r == 0 && !text && n_msg < 0) {
        snprintf(j.msg, sizeof j.msg, "the record has neither \"text\" nor \"messages\"");
        r = -1;
    }
    if (r == 0 && n_msg == 0) {
        snprintf(j.msg, sizeof j.msg, "\"messages\" is empty");
        r = -1;
    }
    if (r < 0) {
        snprintf(msg, msglen, "%s", j.msg);
        return -1;
    }
    rec->parsed = 1;
    rec->text = text;
    rec->n_msg = n_msg > 0 ? n_msg : 0;
    rec->roles = c->roles;
    rec->contents = c->contents;
    return 0;
}

// ---------------------------------------------------------------- the file
int sd_corpus_open(sd_corpus **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return sd_err(err, errlen, "data file '%s' not found: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return sd_err(err, errlen, "data file '%s' is a directory", path);
    FILE *f = fopen(path, "rb");
    if (!f) return sd_err(err, errlen, "data file '%s' cannot be read: %s", path, strerror(errno));
    sd_corpus *c = calloc(1, sizeof *c);
    if (!c) {
        fclose(f);
        return sd_err(err, errlen, "out of memory");
    }
    c->f = f;
    snprintf(c->path, sizeof c->path, "%s", path);
    *out = c;
    return 0;
}

void sd_corpus_close(sd_corpus *c) {
    if (!c) return;
    if (c->f) fclose(c->f);
    free(c->buf);
    free(c->arena);
    free(c);
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

int sd_corpus_next(sd_corpus *c, sd_corpus_rec *rec, int parse, char *err, size_t errlen) {
    memset(rec, 0, sizeof *rec);
    for (;;) {
        errno = 0;
        ssize_t n = getline(&c->buf, &c->cap, c->f);
        if (n < 0) {
            if (ferror(c->f)) return sd_err(err, errlen, "%s:%d: read error: %s", c->path, c->line + 1, strerror(errno));
            return 0;
        }
        c->line++;
        size_t len = (size_t)n;
        if (len && c->buf[len - 1] == '\n') len--;
        char *line = c->buf;
        if (c->line == 1 && len >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3)) line += 3, len -= 3;   // a UTF-8 BOM
        if (blank(line, len)) continue;
        rec->line = c->line;
        rec->hash = sd_fnv64(SD_FNV_OFF, line, len);
        if (!parse) return 1;
        if (c->arena_cap < 2 * len + 2) {
            free(c->arena);
            c->arena_cap = 2 * len + 2;
            c->arena = malloc(c->arena_cap);
            if (!c->arena) {
                c->arena_cap = 0;
                return sd_err(err, errlen, "%s:%d: out of memory (a line of %zu bytes)", c->path, c->line, len);
            }
        }
        c->arena_used = 0;
        char msg[256];
        if (parse_record(c, line, len, rec, msg, sizeof msg) < 0)
            return sd_err(err, errlen, "%s:%d: %s", c->path, c->line, msg);
        return 1;
    }
}

int64_t sd_corpus_count(const char *path, char *err, size_t errlen) {
    sd_corpus *c;
    if (sd_corpus_open(&c, path, err, errlen) < 0) return -1;
    int64_t n = 0;
    sd_corpus_rec rec;
    int r;
    while ((r = sd_corpus_next(c, &rec, 0, err, errlen)) == 1) n++;
    sd_corpus_close(c);
    return r < 0 ? -1 : n;
}
