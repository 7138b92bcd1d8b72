// gen_out.c - generate's text output and stop strings (gen_out.h).
#include "gen_out.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

static int out_append(gen_out *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (o->len + n + 1 > cap) cap *= 2;
        char *t = realloc(o->text, cap);
        if (!t) {
            o->oom = 1;
            return -1;
        }
        o->text = t;
        o->cap = cap;
    }
    memcpy(o->text + o->len, s, n);
    o->len += n;
    o->text[o->len] = 0;
    return 0;
}

// Prints the complete UTF-8 characters of the pending bytes, keeps the rest.
static void stream_flush(gen_out *o, int final) {
    size_t n = final ? o->len : utf8_complete(o->text, o->len);
    if (n) {
        fwrite(o->text, 1, n, stdout);
        memmove(o->text, o->text + n, o->len - n);
        o->len -= n;
    }
    fflush(stdout);
}

// Token t's text, its first `most` bytes at most (-1: all).
static void put_token(gen_out *o, int32_t t, int most) {
    int n = sd_token_to_piece(o->tok, t, 0, o->piece, o->piece_cap);
    if (n > o->piece_cap) {
        char *p = realloc(o->piece, (size_t)n);
        if (p) {
            o->piece = p;
            o->piece_cap = n;
            n = sd_token_to_piece(o->tok, t, 0, o->piece, o->piece_cap);
        } else {
            n = o->piece_cap;
        }
    }
    if (most >= 0 && n > most) n = most;
    if (n > 0) {
        out_append(o, o->piece, (size_t)n);
        if (!o->json) stream_flush(o, 0);
    }
}

static void sink_emit(void *user, const int32_t *tokens, int n, int verified) {
    (void)verified;
    for (int i = 0; i < n; i++) put_token(user, tokens[i], -1);
}

static void sink_emit_part(void *user, int32_t token, int n_bytes, int verified) {
    (void)verified;
    put_token(user, token, n_bytes);
}

int gen_out_init(gen_out *o, const sd_tokenizer *tok, int json, const char *const *stops, int n_stop, int n_ctx,
                 char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    o->tok = tok;
    o->json = json;
    o->piece_cap = 256;
    if (!(o->piece = malloc((size_t)o->piece_cap))) return snprintf(err, errlen, "out of memory"), -1;
    if (n_stop > 0) {
        if (tx_text_new(&o->tx, tok, n_ctx, stops, n_stop, err, errlen) < 0) return -1;
        if (!(o->toks = malloc(sizeof(int32_t) * (size_t)n_ctx))) return snprintf(err, errlen, "out of memory"), -1;
        o->cap_toks = n_ctx;
    }
    return 0;
}

static void sync_text(gen_out *o, int final) {
    const tx_sink sink = {o, sink_emit, sink_emit_part, NULL, NULL};
    int stopped = 0;
    tx_text_sync(o->tx, o->toks, o->n_toks, o->n_toks, final, &sink, &stopped);
    if (stopped) o->stopped = 1;
}

int gen_out_token(gen_out *o, int32_t t) {
    if (!o->tx) {
        put_token(o, t, -1);
        return 0;
    }
    if (o->stopped || o->n_toks >= o->cap_toks) return o->stopped;
    o->toks[o->n_toks++] = t;
    sync_text(o, 0);
    return o->stopped;
}

void gen_out_finish(gen_out *o) {
    if (o->tx && !o->stopped) sync_text(o, 1);
    if (!o->json) stream_flush(o, 1);
}

void gen_out_free(gen_out *o) {
    free(o->text);
    free(o->piece);
    free(o->toks);
    tx_text_free(o->tx);
    memset(o, 0, sizeof *o);
}
