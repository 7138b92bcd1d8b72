// stoptext.c - a generated text, its stop strings and what was emitted (stoptext.h).
#include "stoptext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


struct tx_text {
    const sd_tokenizer *tok;
    char *stop[TX_MAX_STOP];
    int n_stop, max_stop;
    int n_prompt;
    char *tb;          // (tb_len) the bytes of text[n_prompt .. n_dec)
    size_t tb_len, tb_cap;
    size_t *tend;      // (n_ctx) tend[i]: the end of text[i]'s bytes in tb (i >= n_prompt)
    int n_ctx;
    int n_dec;         // tokens decoded into tb
    int n_out;         // tokens emitted (prompt included)
    size_t searched;   // tb[0 .. searched) holds no match start (stops are looked for after it)
    long stop_p;       // the match's start in tb, or -1
    int stop_keep;     // tokens kept by the match
    int stop_done;     // the text up to the match was emitted (nothing more will be)
};

int tx_text_new(tx_text **out, const sd_tokenizer *tok, int n_ctx, const char *const *stops, int n_stop, char *err,
                size_t errlen) {
    *out = NULL;
    if (n_stop > TX_MAX_STOP) return snprintf(err, errlen, "at most %d stop strings, got %d", TX_MAX_STOP, n_stop), -1;
    tx_text *t = calloc(1, sizeof *t);
    if (!t || !(t->tend = malloc(sizeof(size_t) * (size_t)n_ctx))) {
        free(t);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    t->tok = tok;
    t->n_ctx = n_ctx;
    for (int i = 0; i < n_stop; i++) {
        size_t L = strlen(stops[i]);
        if (L == 0) continue;
        if (L > TX_STOP_MAX_LEN) {
            tx_text_free(t);
            return snprintf(err, errlen, "--stop: at most %d bytes a string, got %zu", TX_STOP_MAX_LEN, L), -1;
        }
        if (!(t->stop[t->n_stop] = strdup(stops[i]))) {
            tx_text_free(t);
            return snprintf(err, errlen, "out of memory"), -1;
        }
        if ((int)L > t->max_stop) t->max_stop = (int)L;
        t->n_stop++;
    }
    tx_text_reset(t, 0);
    *out = t;
    return 0;
}

void tx_text_free(tx_text *t) {
    if (!t) return;
    for (int i = 0; i < t->n_stop; i++) free(t->stop[i]);
    free(t->tb);
    free(t->tend);
    free(t);
}

void tx_text_reset(tx_text *t, int n_prompt) {
    t->n_prompt = t->n_dec = t->n_out = n_prompt;
    t->tb_len = t->searched = 0;
    t->stop_p = -1;
    t->stop_keep = 0;
    t->stop_done = 0;
}

int tx_text_n_out(const tx_text *t) { return t->n_out; }
long tx_text_stop_bytes(const tx_text *t) { return t->stop_p; }

static size_t start_of(const tx_text *t, int i) { return i > t->n_prompt ? t->tend[i - 1] : 0; }

void tx_text_cut(tx_text *t, int n, const char *why, const tx_sink *sink) {
    if (n < t->n_prompt) n = t->n_prompt;
    if (t->n_out > n) {
        if (sink && sink->retract) sink->retract(sink->user, t->n_out - n, why);
        t->n_out = n;
    }
    if (t->n_dec > n) {
        t->n_dec = n;
        t->tb_len = start_of(t, n);
        if (t->searched > t->tb_len) t->searched = t->tb_len;
    }
    if (t->stop_p >= 0 && n < t->stop_keep) t->stop_p = -1, t->stop_done = 0;   // the match was in what went
}

// Bytes at the end of tb that begin some stop string (the next token may complete it).
static size_t hold(const tx_text *t) {
    size_t h = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t L = strlen(t->stop[i]);
        for (size_t k = L - 1 < t->tb_len ? L - 1 : t->tb_len; k > h; k--)
            if (memcmp(t->tb + t->tb_len - k, t->stop[i], k) == 0) {
                h = k;
                break;
            }
    }
    return h;
}

// The earliest match starting at or after from: its start (end in *end), or -1.
static long find(const tx_text *t, size_t from, size_t *end) {
    long best = -1;
    for (int i = 0; i < t->n_stop; i++) {
        size_t L = strlen(t->stop[i]);
        for (size_t p = from; p + L <= t->tb_len; p++) {
            if (best >= 0 && (long)p > best) break;
            if (memcmp(t->tb + p, t->stop[i], L) == 0) {
                if (best < 0 || (long)p < best || p + L < *end) best = (long)p, *end = p + L;
                break;
            }
        }
    }
    return best;
}

static void emit(const int32_t *text, int a, int b, int nv, const tx_sink *sink) {
    while (a < b) {   // runs of verified and unverified tokens
        const int v = a < nv, e = v ? (b < nv ? b : nv) : b;
        if (sink && sink->emit) sink->emit(sink->user, text + a, e - a, v);
        a = e;
    }
}

int tx_text_sync(tx_text *t, const int32_t *text, int n, int nv, int final, const tx_sink *sink, int *stopped) {
    *stopped = 0;
    if (n > t->n_ctx) n = t->n_ctx;
    if (n < t->n_dec) tx_text_cut(t, n, "the text was cut", sink);
    char piece[256];
    for (; t->n_dec < n; t->n_dec++) {
        int k = sd_token_to_piece(t->tok, text[t->n_dec], 0, piece, sizeof piece);
        if (k < 0) k = 0;
        if (k > (int)sizeof piece) k = (int)sizeof piece;
        if (t->tb_len + (size_t)k > t->tb_cap) {
            size_t cap = (t->tb_len + (size_t)k) * 2 + 256;
            char *p = realloc(t->tb, cap);
            if (!p) break;   // out of memory: the text stops growing here
            t->tb = p, t->tb_cap = cap;
        }
        memcpy(t->tb + t->tb_len, piece, (size_t)k);
        t->tb_len += (size_t)k;
        t->tend[t->n_dec] = t->tb_len;
    }
    n = t->n_dec;
    if (t->stop_p < 0 && t->n_stop) {
        size_t end = 0;
        long p = find(t, t->searched, &end);
        if (p >= 0) {
            int k = t->n_prompt;
            while (k < n && t->tend[k] < end) k++;
            t->stop_p = p;
            t->stop_keep = k + 1;
        } else {
            size_t keep = t->tb_len > (size_t)t->max_stop ? t->tb_len - (size_t)t->max_stop + 1 : 0;
            if (keep > t->searched) t->searched = keep;
        }
    }
    if (t->stop_p >= 0) {   // emit up to the match, the token it starts in partly; nothing after
        const int keep = t->stop_keep < n ? t->stop_keep : n;
        if (!t->stop_done) {
            int j = t->n_out;
            while (j < keep && t->tend[j] <= (size_t)t->stop_p) j++;
            emit(text, t->n_out, j, nv, sink);
            t->n_out = j;
            if (j < keep && start_of(t, j) < (size_t)t->stop_p && sink && sink->emit_part) {
                sink->emit_part(sink->user, text[j], (int)((size_t)t->stop_p - start_of(t, j)), j < nv);
                t->n_out = j + 1;
            }
            t->stop_done = 1;
        }
        *stopped = 1;
        return keep;
    }
    const size_t lim = final ? t->tb_len : t->tb_len - hold(t);
    int j = t->n_out;
    while (j < n && t->tend[j] <= lim) j++;
    emit(text, t->n_out, j, nv, sink);
    t->n_out = j;
    return n;
}
