// tokenizer_encode.c - text -> token ids for the two vocabulary kinds GGUF
// files carry.
//
// "llama": SentencePiece-style BPE. Spaces become U+2581, an optional "▁" is
// put in front, then the adjacent pair whose concatenation is a vocabulary
// piece with the highest score is merged until none is left; characters that
// are no piece fall back to <0xXX> byte tokens.
//
// "gpt2": byte-level BPE. The text is split by a pre-tokenizer (a hand-written
// matcher for each supported regex, over code points and Unicode classes),
// each piece's bytes are mapped to GPT-2's printable code points, then merged
// by merge rank.
//
// Special tokens (control and user-defined types) are cut out of the text
// first, longest match first, so that "<|im_start|>" becomes one id.
#include "model/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/unicode.h"

typedef struct {
    int32_t *out;
    int max, n;
} sink;

static void put(sink *s, int32_t id) {
    if (s->n < s->max) s->out[s->n] = id;
    s->n++;
}

// Binary min-heap of 64-bit keys (priority in the high half, left symbol
// index in the low half: ties go to the leftmost pair).
typedef struct {
    uint64_t *a;
    int n;
} heap;

static void heap_push(heap *h, uint64_t k) {
    int i = h->n++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h->a[p] <= k) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = k;
}

static uint64_t heap_pop(heap *h) {
    uint64_t top = h->a[0], k = h->a[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->a[c + 1] < h->a[c]) c++;
        if (h->a[c] >= k) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0) h->a[i] = k;
    return top;
}

// A symbol of the merge loop: a byte range of the working text (SPM) or a
// token id (BPE), in a doubly linked list.
typedef struct {
    int32_t id;      // BPE: current token id (-1: byte without a token)
    uint32_t start;  // SPM: byte offset in the escaped text
    uint32_t n;      // SPM: bytes; 0 once merged into its left neighbour
    int prev, next;  // neighbours, -1 at the ends
} sym;

// Scratch for one sd_tokenize call, sized from the text length.
typedef struct {
    sym *syms;       // (len + 8)
    uint64_t *heap;  // (3 (len + 8))
    char *buf;       // (3 len + 8) escaped SPM text / byte-mapped BPE piece
    uint32_t *cp;    // (len + 1) code points of a BPE fragment
    uint8_t *cls;    // (len + 1)
    uint32_t *off;   // (len + 1)
    uint32_t *ps, *pe;  // (len + 1) piece ranges
} scratch;

static int spm_usable(const sd_tokenizer *t, int32_t id) {
    return id >= 0 && (t->type[id] == TT_NORMAL || t->type[id] == TT_USER);
}

// Orders scores descending as unsigned integers (higher score -> smaller key).
static uint32_t score_key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending order of floats
    return ~u;
}

static void spm_try_pair(const sd_tokenizer *t, scratch *w, heap *h, int l) {
    if (l < 0) return;
    int r = w->syms[l].next;
    if (r < 0) return;
    int32_t id = lookup(t, w->buf + w->syms[l].start, w->syms[l].n + w->syms[r].n);
    if (!spm_usable(t, id)) return;
    heap_push(h, ((uint64_t)score_key(t->score[id]) << 32) | (uint32_t)l);
}

static void spm_encode(const sd_tokenizer *t, scratch *w, const char *text, size_t len, int prefix, sink *out) {
    // Escape: spaces -> U+2581, optional leading U+2581.
    size_t m = 0;
    if (prefix) memcpy(w->buf, "\xE2\x96\x81", 3), m = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(w->buf + m, "\xE2\x96\x81", 3), m += 3;
        else w->buf[m++] = text[i];
    }
    int n = 0;
    for (size_t p = 0; p < m;) {
        uint32_t c;
        int k = sd_utf8_decode(w->buf + p, m - p, &c);
        w->syms[n] = (sym){-1, (uint32_t)p, (uint32_t)k, n - 1, -1};
        if (n > 0) w->syms[n - 1].next = n;
        n++;
        p += (size_t)k;
    }
    heap h = {w->heap, 0};
    for (int i = 0; i + 1 < n; i++) spm_try_pair(t, w, &h, i);
    while (h.n > 0) {
        uint64_t k = heap_pop(&h);
        int l = (int)(uint32_t)k;
        sym *L = &w->syms[l];
        if (L->n == 0 || L->next < 0) continue;
        sym *R = &w->syms[L->next];
        int32_t id = lookup(t, w->buf + L->start, L->n + R->n);
        if (!spm_usable(t, id) || ((uint64_t)score_key(t->score[id]) << 32 | (uint32_t)l) != k) continue;  // stale
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) w->syms[R->next].prev = l;
        spm_try_pair(t, w, &h, L->prev);
        spm_try_pair(t, w, &h, l);
    }
    for (int i = 0; i < n && n > 0; i = w->syms[i].next) {
        sym *s = &w->syms[i];
        int32_t id = lookup(t, w->buf + s->start, s->n);
        if (spm_usable(t, id)) {
            put(out, id);
        } else {
            for (uint32_t b = 0; b < s->n; b++) {
                int32_t bid = t->byte_id[(unsigned char)w->buf[s->start + b]];
                if (bid < 0) bid = t->unk;
                if (bid >= 0) put(out, bid);
            }
        }
        if (s->next < 0) break;
    }
}

static void bpe_try_pair(const sd_tokenizer *t, scratch *w, heap *h, int l) {
    if (l < 0) return;
    int r = w->syms[l].next;
    if (r < 0) return;
    const merge_slot *m = merge_find(t, w->syms[l].id, w->syms[r].id);
    if (m) heap_push(h, ((uint64_t)(uint32_t)m->rank << 32) | (uint32_t)l);
}

// Byte-level BPE of one pre-tokenized piece.
static void bpe_piece(const sd_tokenizer *t, scratch *w, const unsigned char *s, size_t len, sink *out) {
    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < len; i++) m += (size_t)sd_utf8_encode(t->byte_cp[s[i]], w->buf + m);
        int32_t id = lookup(t, w->buf, m);
        if (id >= 0) {
            put(out, id);
            return;
        }
    }
    int n = (int)len;
    for (int i = 0; i < n; i++) w->syms[i] = (sym){t->byte_id[s[i]], 0, 1, i - 1, i + 1 < n ? i + 1 : -1};
    heap h = {w->heap, 0};
    for (int i = 0; i + 1 < n; i++) bpe_try_pair(t, w, &h, i);
    while (h.n > 0) {
        uint64_t k = heap_pop(&h);
        int l = (int)(uint32_t)k;
        sym *L = &w->syms[l];
        if (L->n == 0 || L->next < 0) continue;
        sym *R = &w->syms[L->next];
        const merge_slot *m = merge_find(t, L->id, R->id);
        if (!m || (uint32_t)m->rank != (uint32_t)(k >> 32)) continue;  // stale
        L->id = m->result;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) w->syms[R->next].prev = l;
        bpe_try_pair(t, w, &h, L->prev);
        bpe_try_pair(t, w, &h, l);
    }
    // A byte whose symbol is not in the vocabulary (e.g. 0xFF, which valid
    // UTF-8 never contains, in SmolLM2) becomes the unknown token only if the
    // vocabulary has a real one (type UNKNOWN); otherwise it is dropped,
    // rather than inserting something like <|endoftext|> into the prompt.
    for (int i = 0; i >= 0 && n > 0; i = w->syms[i].next) {
        int32_t id = w->syms[i].id;
        if (id < 0 && t->unk >= 0 && t->type[t->unk] == TT_UNKNOWN) id = t->unk;
        if (id >= 0) put(out, id);
    }
}

static void bpe_encode(const sd_tokenizer *t, scratch *w, const char *text, size_t len, sink *out) {
    int n = sd_tok_decode_cps(text, len, w->cp, w->cls, w->off);
    cps x = {w->cp, w->cls, w->off};
    pieces p = {w->ps, w->pe, 0, (int)len + 1};
    sd_tok_pretokenize_cps(t->pre, &x, n, &p);
    for (int i = 0; i < p.n; i++)
        bpe_piece(t, w, (const unsigned char *)text + p.start[i], p.end[i] - p.start[i], out);
}

// The longest special token starting at text[i] that may be matched, or -1.
static int32_t match_special(const sd_tokenizer *t, const char *text, size_t len, size_t i, int parse_special) {
    unsigned char b = (unsigned char)text[i];
    for (int k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
        int32_t id = t->special[k];
        if (t->type[id] == TT_CONTROL && !parse_special) continue;
        size_t n = t->len[id];
        if (n <= len - i && memcmp(text + i, t->pool + t->off[id], n) == 0) return id;
    }
    return -1;
}

// Contract in specdec.h. Choices made here:
// - BOS is added when add_bos and the vocabulary asks for it
//   (tokenizer.ggml.add_bos_token), except when the text itself begins with
//   the BOS token (parsed as special): never two BOS.
// - Control tokens (type 3) are recognised only with parse_special;
//   user-defined tokens (type 4) always, as Hugging Face does for non-special
//   added tokens. Longest match wins at each position.
// - SentencePiece: the "▁" prefix (add_space_prefix) goes in front of the
//   text and after every special token, as in llama.cpp; decoding gives that
//   space back, so a caller printing a whole prompt may drop one leading space.
// - Byte-level BPE: a byte with no token in the vocabulary is dropped (see
//   bpe_piece). No Unicode normalisation (Qwen2's NFC) is applied.
// Thread-safe: the tokenizer is read-only; scratch is allocated per call.
int sd_tokenize(const sd_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                int32_t *out, int max) {
    if (!t || (!text && len) || max < 0 || (!out && max > 0)) return -1;
    if (len > (1u << 28)) return -1;
    // Symbols: at most one per code point (+1 for the SentencePiece prefix);
    // every merge pushes at most two heap entries. The working text grows to
    // 3 bytes per byte (space -> U+2581, byte -> GPT-2 code point).
    scratch w;
    size_t ns = len + 8;
    w.syms = malloc(sizeof *w.syms * ns);
    w.heap = malloc(sizeof *w.heap * 3 * ns);
    w.buf = malloc(3 * len + 8);
    w.cp = malloc(sizeof *w.cp * (len + 1));
    w.cls = malloc(len + 1);
    w.off = malloc(sizeof *w.off * (len + 1));
    w.ps = malloc(sizeof *w.ps * (len + 1));
    w.pe = malloc(sizeof *w.pe * (len + 1));
    int rc = -1;
    if (!w.syms || !w.heap || !w.buf || !w.cp || !w.cls || !w.off || !w.ps || !w.pe) goto done;

    sink s = {out, max, 0};
    // BOS, unless the text itself begins with the BOS token (no double BOS).
    if (add_bos && t->add_bos && t->bos >= 0) {
        int starts_with_bos = len > 0 && match_special(t, text, len, 0, parse_special) == t->bos;
        if (!starts_with_bos) put(&s, t->bos);
    }
    // Cut special tokens out; raw stretches between them go to the model.
    // SentencePiece gets the "▁" prefix at the start and after every special
    // token (as llama.cpp does).
    size_t raw = 0;
    int prev_special = 1;
    for (size_t i = 0; i <= len;) {
        int32_t id = i < len && t->n_special ? match_special(t, text, len, i, parse_special) : -1;
        if (id < 0 && i < len) {
            i++;
            continue;
        }
        if (i > raw) {
            if (t->kind == TOK_SPM) spm_encode(t, &w, text + raw, i - raw, t->add_space_prefix && prev_special, &s);
            else bpe_encode(t, &w, text + raw, i - raw, &s);
            prev_special = 0;
        }
        if (id < 0) break;  // i == len
        put(&s, id);
        prev_special = 1;
        i += t->len[id];
        raw = i;
    }
    rc = s.n;
done:
    free(w.syms), free(w.heap), free(w.buf), free(w.cp), free(w.cls), free(w.off), free(w.ps), free(w.pe);
    return rc;
}
