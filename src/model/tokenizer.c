// tokenizer.c - the tokenizer's vocabulary: loading it from GGUF metadata
// (token texts, scores and types, special tokens, byte tokens, BPE merges,
// special ids; sd_tokenizer_load runs these steps in turn) and decoding ids
// back to text. All lookups use open-addressing hash tables built once at
// load time. Encoding is in tokenizer_encode.c, chat prompts in
// tokenizer_chat.c.
#include "model/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/unicode.h"

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

// ------------------------------------------------------------ GPT-2 byte map

// GPT-2 maps every byte to a printable code point: the printable Latin-1
// bytes to themselves, the other 68 to U+0100.. in byte order.
static void init_byte_map(sd_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 512; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)n++;
        t->byte_cp[b] = cp;
        t->cp_byte[cp] = (int16_t)b;
    }
}

// ------------------------------------------------------------ loading

void sd_tokenizer_free(sd_tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->eog);
    free(t->hash);
    free(t->merges);
    free(t->special);
    free(t->default_system);
    free(t);
}

// Reads an optional token id key: absent leaves *out; negative means none.
static int get_id(const sd_gguf *g, const char *key, int n_vocab, int32_t *out, char *err, size_t errlen) {
    int64_t v;
    int r = sd_gguf_get_i64(g, key, &v, err, errlen);
    if (r < 0) return r;
    if (r == 1) return 0;
    if (v < 0) {
        *out = -1;
        return 0;
    }
    if (v >= n_vocab) return sd_err(err, errlen, "%s = %lld is outside the vocabulary (%d tokens)", key, (long long)v, n_vocab);
    *out = (int32_t)v;
    return 0;
}

static int is_numeric_type(int ty) {
    return ty != SD_GGUF_STRING && ty != SD_GGUF_ARRAY && ty >= SD_GGUF_U8 && ty <= SD_GGUF_F64;
}

static int cmp_special(const sd_tokenizer *t, int32_t a, int32_t b) {
    unsigned char fa = t->len[a] ? (unsigned char)t->pool[t->off[a]] : 0;
    unsigned char fb = t->len[b] ? (unsigned char)t->pool[t->off[b]] : 0;
    if (fa != fb) return fa < fb ? -1 : 1;
    if (t->len[a] != t->len[b]) return t->len[a] > t->len[b] ? -1 : 1;
    return a < b ? -1 : (a > b);
}

// Insertion sort: special token lists are small (tens to a few hundred).
static void sort_specials(sd_tokenizer *t) {
    for (int i = 1; i < t->n_special; i++) {
        int32_t x = t->special[i];
        int j = i - 1;
        while (j >= 0 && cmp_special(t, t->special[j], x) > 0) {
            t->special[j + 1] = t->special[j];
            j--;
        }
        t->special[j + 1] = x;
    }
}

// The GGUF arrays a tokenizer is built from, checked by load_check.
typedef struct {
    int kind;                  // TOK_SPM or TOK_BPE
    int pre;                   // PRE_* (PRE_GPT2 unless TOK_BPE names another)
    int n;                     // vocabulary size
    const sd_gguf_kv *ktok;    // tokenizer.ggml.tokens: (n) strings
    const sd_gguf_kv *kscore;  // tokenizer.ggml.scores: (n) numbers, or NULL
    const sd_gguf_kv *ktype;   // tokenizer.ggml.token_type: (n) numbers, or NULL
    const sd_gguf_kv *kmerge;  // tokenizer.ggml.merges: strings (TOK_BPE), or NULL
} tok_src;

// Step 1: the vocabulary kind, the token arrays and the pre-tokenizer, checked.
static int load_check(const sd_gguf *g, tok_src *src, char *err, size_t errlen) {
    memset(src, 0, sizeof *src);
    sd_str model;
    int r = sd_gguf_get_str(g, "tokenizer.ggml.model", &model, err, errlen);
    if (r < 0) return r;
    if (r == 1) return sd_err(err, errlen, "tokenizer.ggml.model is missing");
    int kind;
    if (sd_str_eq(model, "llama")) kind = TOK_SPM;
    else if (sd_str_eq(model, "gpt2")) kind = TOK_BPE;
    else
        return sd_err(err, errlen, "tokenizer.ggml.model '%.*s' is not supported (only 'llama' and 'gpt2')",
                      (int)SD_MIN(model.len, 64), model.ptr);

    const sd_gguf_kv *ktok = sd_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (!ktok) return sd_err(err, errlen, "tokenizer.ggml.tokens is missing");
    if (ktok->type != SD_GGUF_ARRAY || ktok->arr_type != SD_GGUF_STRING || !ktok->strs)
        return sd_err(err, errlen, "tokenizer.ggml.tokens is not an array of strings");
    if (ktok->n == 0 || ktok->n > (1u << 30)) return sd_err(err, errlen, "tokenizer.ggml.tokens has %llu entries", (unsigned long long)ktok->n);
    int n = (int)ktok->n;

    const sd_gguf_kv *kscore = sd_gguf_find_key(g, "tokenizer.ggml.scores");
    if (kscore && (kscore->type != SD_GGUF_ARRAY || !is_numeric_type(kscore->arr_type) || kscore->n != (uint64_t)n))
        return sd_err(err, errlen, "tokenizer.ggml.scores must be a numeric array of %d entries", n);
    const sd_gguf_kv *ktype = sd_gguf_find_key(g, "tokenizer.ggml.token_type");
    if (ktype && (ktype->type != SD_GGUF_ARRAY || !is_numeric_type(ktype->arr_type) || ktype->n != (uint64_t)n))
        return sd_err(err, errlen, "tokenizer.ggml.token_type must be a numeric array of %d entries", n);
    const sd_gguf_kv *kmerge = sd_gguf_find_key(g, "tokenizer.ggml.merges");
    if (kind == TOK_BPE) {
        if (!kmerge) return sd_err(err, errlen, "tokenizer.ggml.merges is missing (required for a gpt2 tokenizer)");
        if (kmerge->type != SD_GGUF_ARRAY || kmerge->arr_type != SD_GGUF_STRING || !kmerge->strs)
            return sd_err(err, errlen, "tokenizer.ggml.merges is not an array of strings");
    }

    int pre = PRE_GPT2;
    if (kind == TOK_BPE) {
        sd_str ps;
        r = sd_gguf_get_str(g, "tokenizer.ggml.pre", &ps, err, errlen);
        if (r < 0) return r;
        if (r == 0) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)SD_MIN(ps.len, 63), ps.ptr);
            if (ps.len >= 64 || (pre = sd_pretokenizer_kind(name)) < 0)
                return sd_err(err, errlen, "tokenizer.ggml.pre '%.*s' is not supported (supported: smollm, qwen2, llama-bpe, gpt2, default)",
                              (int)SD_MIN(ps.len, 64), ps.ptr);
        }
    }
    src->kind = kind;
    src->pre = pre;
    src->n = n;
    src->ktok = ktok;
    src->kscore = kscore;
    src->ktype = ktype;
    src->kmerge = kmerge;
    return 0;
}

// Step 2: token texts, scores and types, and the text -> id hash table.
static int load_vocab(sd_tokenizer *t, const tok_src *src, char *err, size_t errlen) {
    const int n = src->n;
    const sd_gguf_kv *ktok = src->ktok, *kscore = src->kscore, *ktype = src->ktype;
    uint64_t pool_bytes = 0;
    for (int i = 0; i < n; i++) pool_bytes += ktok->strs[i].len + 1;
    if (pool_bytes > UINT32_MAX) return sd_err(err, errlen, "tokenizer.ggml.tokens: texts too large");
    t->pool = malloc(pool_bytes);
    t->off = malloc(sizeof *t->off * (size_t)n);
    t->len = malloc(sizeof *t->len * (size_t)n);
    t->score = calloc((size_t)n, sizeof *t->score);
    t->type = malloc((size_t)n);
    t->eog = calloc((size_t)n, 1);
    t->hash_mask = pow2_at_least(2 * (uint64_t)n) - 1;
    t->hash = malloc(sizeof *t->hash * ((size_t)t->hash_mask + 1));
    if (!t->pool || !t->off || !t->len || !t->score || !t->type || !t->eog || !t->hash)
        return sd_err(err, errlen, "out of memory");
    memset(t->hash, 0xff, sizeof *t->hash * ((size_t)t->hash_mask + 1));
    uint32_t o = 0;
    for (int i = 0; i < n; i++) {
        sd_str s = ktok->strs[i];
        memcpy(t->pool + o, s.ptr, s.len);
        t->pool[o + s.len] = 0;
        t->off[i] = o;
        t->len[i] = (uint32_t)s.len;
        o += (uint32_t)s.len + 1;
        t->score[i] = kscore ? sd_gguf_arr_f32(kscore, (uint64_t)i) : 0.0f;
        int64_t ty = ktype ? sd_gguf_arr_i64(ktype, (uint64_t)i) : TT_NORMAL;
        t->type[i] = (uint8_t)(ty >= TT_NORMAL && ty <= TT_BYTE ? ty : TT_NORMAL);
        // First occurrence of a duplicated text keeps the text -> id entry.
        uint32_t h = hash_bytes(s.ptr, s.len) & t->hash_mask;
        for (;;) {
            int32_t id = t->hash[h];
            if (id < 0) {
                t->hash[h] = i;
                break;
            }
            if (t->len[id] == s.len && memcmp(t->pool + t->off[id], s.ptr, s.len) == 0) break;
            h = (h + 1) & t->hash_mask;
        }
    }
    return 0;
}

// Step 3: special tokens, matched literally in the text.
static int load_specials(sd_tokenizer *t, char *err, size_t errlen) {
    const int n = t->n_vocab;
    int ns = 0;
    for (int i = 0; i < n; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0) ns++;
    t->special = malloc(sizeof *t->special * (size_t)(ns ? ns : 1));
    if (!t->special) return sd_err(err, errlen, "out of memory");
    for (int i = 0; i < n; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0) t->special[t->n_special++] = i;
    sort_specials(t);
    int k = 0;
    for (int b = 0; b < 256; b++) {
        t->special_start[b] = k;
        while (k < t->n_special && (unsigned char)t->pool[t->off[t->special[k]]] == b) k++;
    }
    t->special_start[256] = k;
    return 0;
}

// Step 4: byte tokens (SPM) / the byte-level alphabet (BPE).
static void load_bytes(sd_tokenizer *t) {
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    if (t->kind == TOK_SPM) {
        for (int b = 0; b < 256; b++) {
            char buf[8];
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            int32_t id = lookup(t, buf, 6);
            if (id >= 0) t->byte_id[b] = id;
        }
    } else {
        init_byte_map(t);
        for (int b = 0; b < 256; b++) {
            char buf[4];
            int k = sd_utf8_encode(t->byte_cp[b], buf);
            t->byte_id[b] = lookup(t, buf, (size_t)k);
        }
    }
}

// Step 5 (BPE): merges "a b" -> (id(a), id(b)) -> rank, id(ab).
static int load_merges(sd_tokenizer *t, const sd_gguf_kv *kmerge, char *err, size_t errlen) {
    if (kmerge->n > (1u << 30)) return sd_err(err, errlen, "tokenizer.ggml.merges has too many entries");
    t->merge_mask = pow2_at_least(2 * kmerge->n) - 1;
    t->merges = malloc(sizeof *t->merges * ((size_t)t->merge_mask + 1));
    size_t cap = 256;
    char *cat = malloc(cap);
    if (!t->merges || !cat) {
        free(cat);
        return sd_err(err, errlen, "out of memory");
    }
    for (size_t i = 0; i <= t->merge_mask; i++) t->merges[i].key = UINT64_MAX;
    for (uint64_t m = 0; m < kmerge->n; m++) {
        sd_str s = kmerge->strs[m];
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            free(cat);
            return sd_err(err, errlen, "tokenizer.ggml.merges[%llu] has no space separating two tokens", (unsigned long long)m);
        }
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
        int32_t a = lookup(t, s.ptr, la), b = lookup(t, sp + 1, lb);
        if (la + lb > cap) {
            cap = la + lb;
            char *nc = realloc(cat, cap);
            if (!nc) {
                free(cat);
                return sd_err(err, errlen, "out of memory");
            }
            cat = nc;
        }
        memcpy(cat, s.ptr, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t c = lookup(t, cat, la + lb);
        if (a < 0 || b < 0 || c < 0) continue;  // unusable merge: its tokens are not all in the vocabulary
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        uint32_t h = hash_u64(key) & t->merge_mask;
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key) h = (h + 1) & t->merge_mask;
        if (t->merges[h].key == key) continue;  // duplicate pair: the lower rank stays
        t->merges[h].key = key;
        t->merges[h].rank = (int32_t)m;
        t->merges[h].result = c;
    }
    free(cat);
    return 0;
}

// Step 6: special ids and flags, then the end-of-generation set. ktype: the
// token types, or NULL when the file has none.
static int load_ids(sd_tokenizer *t, const sd_gguf *g, const sd_gguf_kv *ktype, char *err, size_t errlen) {
    const int kind = t->kind, n = t->n_vocab;
    int r;
    t->bos = kind == TOK_SPM ? SD_MIN(1, n - 1) : -1;
    t->eos = kind == TOK_SPM ? SD_MIN(2, n - 1) : -1;
    t->unk = kind == TOK_SPM ? 0 : -1;
    t->eot = t->eom = -1;
    t->add_bos = kind == TOK_SPM;
    t->add_space_prefix = kind == TOK_SPM;
    if ((r = get_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos, err, errlen)) < 0 ||
        (r = get_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos, err, errlen)) < 0 ||
        (r = get_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk, err, errlen)) < 0 ||
        (r = get_id(g, "tokenizer.ggml.eot_token_id", n, &t->eot, err, errlen)) < 0 ||
        (r = get_id(g, "tokenizer.ggml.eom_token_id", n, &t->eom, err, errlen)) < 0 ||
        (r = sd_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err, errlen)) < 0 ||
        (r = sd_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, errlen)) < 0)
        return r;

    // End of generation: EOS, EOT, EOM, and end-of-turn tokens found by text
    // (only among control/user-defined tokens when token types are known, so
    // that an ordinary piece such as an HTML "</s>" does not stop generation).
    static const char *const eog_texts[] = {
        "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>",
    };
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++) {
        int32_t id = lookup(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && (!ktype || t->type[id] == TT_CONTROL || t->type[id] == TT_USER)) t->eog[id] = 1;
    }
    return 0;
}

int sd_tokenizer_load(sd_tokenizer **out, const sd_gguf *g, char *err, size_t errlen) {
    *out = NULL;
    tok_src src;
    int r = load_check(g, &src, err, errlen);
    if (r < 0) return r;
    sd_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return sd_err(err, errlen, "out of memory");
    t->kind = src.kind;
    t->pre = src.pre;
    t->n_vocab = src.n;
    t->ignore_merges = src.kind == TOK_BPE && src.pre == PRE_LLAMA3;
    if ((r = load_vocab(t, &src, err, errlen)) < 0 || (r = load_specials(t, err, errlen)) < 0) {
        sd_tokenizer_free(t);
        return r;
    }
    load_bytes(t);
    if ((src.kind == TOK_BPE && src.kmerge->n > 0 && (r = load_merges(t, src.kmerge, err, errlen)) < 0) ||
        (r = load_ids(t, g, src.ktype, err, errlen)) < 0 || (r = sd_tokenizer_load_chat(t, g, err, errlen)) < 0) {
        sd_tokenizer_free(t);
        return r;
    }
    *out = t;
    return 0;
}

// ------------------------------------------------------------ small accessors

int sd_tokenizer_n_vocab(const sd_tokenizer *t) { return t->n_vocab; }
int32_t sd_token_bos(const sd_tokenizer *t) { return t->bos; }
int32_t sd_token_eos(const sd_tokenizer *t) { return t->eos; }

int sd_token_is_eog(const sd_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

const char *sd_token_text(const sd_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->len[id];
    return t->pool + t->off[id];
}

// ------------------------------------------------------------ decoding

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int emit(char *buf, int bufsize, int n, const char *s, size_t k) {
    for (size_t i = 0; i < k; i++, n++)
        if (n < bufsize) buf[n] = s[i];
    return n;
}

int sd_token_to_piece(const sd_tokenizer *t, int32_t id, int render_special, char *buf, int bufsize) {
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    if (!buf) bufsize = 0;
    const char *s = t->pool + t->off[id];
    size_t k = t->len[id];
    int ty = t->type[id];
    if (ty == TT_CONTROL || ty == TT_UNKNOWN || ty == TT_UNUSED) return render_special ? emit(buf, bufsize, 0, s, k) : 0;
    if (ty == TT_USER) return emit(buf, bufsize, 0, s, k);
    int n = 0;
    if (t->kind == TOK_SPM) {
        if (ty == TT_BYTE && k == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
            hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
            char b = (char)(hexval(s[3]) * 16 + hexval(s[4]));
            return emit(buf, bufsize, 0, &b, 1);
        }
        for (size_t i = 0; i < k;) {
            if (i + 3 <= k && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                n = emit(buf, bufsize, n, " ", 1);
                i += 3;
            } else {
                n = emit(buf, bufsize, n, s + i, 1);
                i++;
            }
        }
        return n;
    }
    // Byte-level: each code point of the text stands for one byte.
    for (size_t i = 0; i < k;) {
        uint32_t c;
        int m = sd_utf8_decode(s + i, k - i, &c);
        if (c < 512 && t->cp_byte[c] >= 0) {
            char b = (char)t->cp_byte[c];
            n = emit(buf, bufsize, n, &b, 1);
        } else {
            n = emit(buf, bufsize, n, s + i, (size_t)m);
        }
        i += (size_t)m;
    }
    return n;
}
