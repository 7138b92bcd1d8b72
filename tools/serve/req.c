// req.c - the life of a request shared by a connection thread and the
// scheduler (reference counting, cancellation), and text helpers.
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

sv_req *sv_req_new(void) {
    sv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->sp = sd_sampler_default_params();
    return r;
}

void sv_req_ref(sv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

void sv_req_unref(sv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->prompt);
    free(r->out);
    free(r->how);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

// sd_gen_stop is safe from any thread; r->gen is set and cleared by the
// scheduler under r->mu, so the generation cannot be freed meanwhile.
void sv_req_cancel(sv_req *r) {
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        r->cancelled = 1;
        if (r->gen) sd_gen_stop(r->gen);
    }
    pthread_mutex_unlock(&r->mu);
}

int sv_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (*len + n + 1 > c) c *= 2;
        char *t = realloc(*buf, c);
        if (!t) return -1;
        *buf = t;
        *cap = c;
    }
    if (n) memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

// Bytes of the valid UTF-8 character at s (n available), 0 if invalid or cut.
static int utf8_char(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    int L = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (L == 0 || (size_t)L > n) return 0;
    for (int k = 1; k < L; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    if (L == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0))) return 0;
    if (L == 4 && ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90))) return 0;
    return L;
}

char *sv_utf8_clean(const char *str, size_t n, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)str;
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int L = utf8_char(s + i, n - i);
        if (L == 0 || (L == 1 && s[i] == 0)) {   // invalid (and NUL, which C strings cannot hold)
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        } else {
            memcpy(o + k, s + i, (size_t)L);
            k += (size_t)L;
            i += (size_t)L;
        }
    }
    o[k] = 0;
    if (out_len) *out_len = k;
    return o;
}
