// tokenizer.c - text <-> token ids for the two vocabulary kinds GGUF files
// carry, and the chat prompt formats.
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
// All lookups use open-addressing hash tables built once at load time.
#include "model/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/unicode.h"

enum { TOK_SPM = 0, TOK_BPE = 1 };

// tokenizer.ggml.token_type values
enum {
    TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6,
};

enum { PRE_GPT2 = 0, PRE_SMOLLM = 1, PRE_QWEN2 = 2, PRE_LLAMA3 = 3 };

enum { CHAT_NONE = 0, CHAT_CHATML = 1, CHAT_LLAMA3 = 2 };

typedef struct {
    uint64_t key;    // ((uint64_t)left_id << 32) | right_id; UINT64_MAX = empty slot
    int32_t rank;    // index in tokenizer.ggml.merges (lower merges first)
    int32_t result;  // id of the concatenation
} merge_slot;

struct sd_tokenizer {
    int kind;             // TOK_SPM or TOK_BPE
    int pre;              // PRE_* (TOK_BPE only)
    int n_vocab;
    char *pool;           // (pool bytes) every token text, each followed by a NUL
    uint32_t *off;        // (n_vocab) offset of token i's text in pool
    uint32_t *len;        // (n_vocab) bytes of token i's text
    float *score;         // (n_vocab) SentencePiece scores (0 when absent)
    uint8_t *type;        // (n_vocab) TT_* (TT_NORMAL when absent)
    uint8_t *eog;         // (n_vocab) 1 if the token ends generation
    int32_t *hash;        // (hash_mask + 1) token id or -1; open addressing on the text
    uint32_t hash_mask;   // capacity - 1 (power of two, >= 2 n_vocab)
    merge_slot *merges;   // (merge_mask + 1) pair -> rank, result (TOK_BPE)
    uint32_t merge_mask;  // capacity - 1, or 0 with merges == NULL
    int32_t *special;     // (n_special) control/user-defined ids, by first byte then length desc
    int n_special;
    int special_start[257];  // special[special_start[b] .. special_start[b+1]) start with byte b
    int32_t byte_id[256];    // SPM: id of "<0xXX>"; BPE: id of the mapped single-byte text; -1 if none
    uint32_t byte_cp[256];   // BPE: byte -> GPT-2 printable code point
    int16_t cp_byte[512];    // BPE: code point (< 512) -> byte, -1 if it stands for none
    int32_t bos, eos, unk, eot, eom;  // ids or -1
    int add_bos;          // tokenizer.ggml.add_bos_token
    int add_space_prefix; // tokenizer.ggml.add_space_prefix (SPM)
    int ignore_merges;    // BPE: a piece that is a whole token is not merged (llama-bpe)
    int chat;             // CHAT_*
    char *default_system; // NUL-terminated default system message of a ChatML template, or NULL
};

// ------------------------------------------------------------ hashing

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static uint32_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static int32_t lookup(const sd_tokenizer *t, const char *s, size_t n) {
    uint32_t i = hash_bytes(s, n) & t->hash_mask;
    for (;;) {
        int32_t id = t->hash[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->pool + t->off[id], s, n) == 0) return id;
        i = (i + 1) & t->hash_mask;
    }
}

static const merge_slot *merge_find(const sd_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merges || a < 0 || b < 0) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = hash_u64(key) & t->merge_mask;
    for (;;) {
        const merge_slot *m = &t->merges[i];
        if (m->key == UINT64_MAX) return NULL;
        if (m->key == key) return m;
        i = (i + 1) & t->merge_mask;
    }
}

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

// Finds the default system message in a ChatML template: the text between
// "<|im_start|>system" + newline (a real one or the escape "\n" inside a
// Jinja string literal) and "<|im_end|>" that is plain literal text (no
// quotes, braces or Jinja syntax), e.g. SmolLM2's "You are a helpful AI
// assistant named SmolLM, ..." or Qwen2.5's "You are Qwen, ...".
static char *chatml_default_system(const char *tpl, size_t n) {
    const char *hdr = "<|im_start|>system";
    size_t hl = strlen(hdr);
    const char *end_tag = "<|im_end|>";
    for (size_t i = 0; i + hl <= n; i++) {
        if (memcmp(tpl + i, hdr, hl) != 0) continue;
        size_t p = i + hl;
        if (p < n && tpl[p] == '\n') p += 1;
        else if (p + 1 < n && tpl[p] == '\\' && tpl[p + 1] == 'n') p += 2;
        else continue;
        size_t q = p;
        int ok = 0;
        while (q + strlen(end_tag) <= n) {
            if (memcmp(tpl + q, end_tag, strlen(end_tag)) == 0) {
                ok = 1;
                break;
            }
            char c = tpl[q];
            if (c == '\'' || c == '"' || c == '{' || c == '}') break;
            q++;
        }
        if (!ok || q == p) continue;
        char *s = malloc(q - p + 1);
        if (!s) return NULL;
        size_t k = 0;
        for (size_t j = p; j < q; j++) {
            if (tpl[j] == '\\' && j + 1 < q) {
                char e = tpl[++j];
                s[k++] = e == 'n' ? '\n' : e == 't' ? '\t' : e;
            } else {
                s[k++] = tpl[j];
            }
        }
        s[k] = 0;
        return s;
    }
    return NULL;
}

static int contains(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(s + i, needle, m) == 0) return 1;
    return 0;
}

int sd_tokenizer_load(sd_tokenizer **out, const sd_gguf *g, char *err, size_t errlen) {
    *out = NULL;
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

    sd_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return sd_err(err, errlen, "out of memory");
    t->kind = kind;
    t->pre = pre;
    t->n_vocab = n;
    t->ignore_merges = kind == TOK_BPE && pre == PRE_LLAMA3;
    uint64_t pool_bytes = 0;
    for (int i = 0; i < n; i++) pool_bytes += ktok->strs[i].len + 1;
    if (pool_bytes > UINT32_MAX) {
        sd_tokenizer_free(t);
        return sd_err(err, errlen, "tokenizer.ggml.tokens: texts too large");
    }
    t->pool = malloc(pool_bytes);
    t->off = malloc(sizeof *t->off * (size_t)n);
    t->len = malloc(sizeof *t->len * (size_t)n);
    t->score = calloc((size_t)n, sizeof *t->score);
    t->type = malloc((size_t)n);
    t->eog = calloc((size_t)n, 1);
    t->hash_mask = pow2_at_least(2 * (uint64_t)n) - 1;
    t->hash = malloc(sizeof *t->hash * ((size_t)t->hash_mask + 1));
    if (!t->pool || !t->off || !t->len || !t->score || !t->type || !t->eog || !t->hash) {
        sd_tokenizer_free(t);
        return sd_err(err, errlen, "out of memory");
    }
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

    // Special tokens, matched literally in the text.
    int ns = 0;
    for (int i = 0; i < n; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0) ns++;
    t->special = malloc(sizeof *t->special * (size_t)(ns ? ns : 1));
    if (!t->special) {
        sd_tokenizer_free(t);
        return sd_err(err, errlen, "out of memory");
    }
    for (int i = 0; i < n; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0) t->special[t->n_special++] = i;
    sort_specials(t);
    {
        int k = 0;
        for (int b = 0; b < 256; b++) {
            t->special_start[b] = k;
            while (k < t->n_special && (unsigned char)t->pool[t->off[t->special[k]]] == b) k++;
        }
        t->special_start[256] = k;
    }

    // Byte tokens / byte-level alphabet.
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    if (kind == TOK_SPM) {
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

    // Merges: "a b" -> (id(a), id(b)) -> rank, id(ab).
    if (kind == TOK_BPE && kmerge->n > 0) {
        if (kmerge->n > (1u << 30)) {
            sd_tokenizer_free(t);
            return sd_err(err, errlen, "tokenizer.ggml.merges has too many entries");
        }
        t->merge_mask = pow2_at_least(2 * kmerge->n) - 1;
        t->merges = malloc(sizeof *t->merges * ((size_t)t->merge_mask + 1));
        size_t cap = 256;
        char *cat = malloc(cap);
        if (!t->merges || !cat) {
            free(cat);
            sd_tokenizer_free(t);
            return sd_err(err, errlen, "out of memory");
        }
        for (size_t i = 0; i <= t->merge_mask; i++) t->merges[i].key = UINT64_MAX;
        for (uint64_t m = 0; m < kmerge->n; m++) {
            sd_str s = kmerge->strs[m];
            const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
            if (!sp) {
                free(cat);
                sd_tokenizer_free(t);
                return sd_err(err, errlen, "tokenizer.ggml.merges[%llu] has no space separating two tokens", (unsigned long long)m);
            }
            size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
            int32_t a = lookup(t, s.ptr, la), b = lookup(t, sp + 1, lb);
            if (la + lb > cap) {
                cap = la + lb;
                char *nc = realloc(cat, cap);
                if (!nc) {
                    free(cat);
                    sd_tokenizer_free(t);
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
    }

    // Special ids and flags.
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
        (r = sd_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, errlen)) < 0) {
        sd_tokenizer_free(t);
        return r;
    }

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

    // Chat template.
    sd_str tpl;
    r = sd_gguf_get_str(g, "tokenizer.chat_template", &tpl, err, errlen);
    if (r < 0) {
        sd_tokenizer_free(t);
        return r;
    }
    if (r == 0) {
        if (contains(tpl.ptr, tpl.len, "<|im_start|>")) {
            t->chat = CHAT_CHATML;
            t->default_system = chatml_default_system(tpl.ptr, tpl.len);
        } else if (contains(tpl.ptr, tpl.len, "<|start_header_id|>")) {
            t->chat = CHAT_LLAMA3;
        } else {
            t->chat = -1;  // present but not recognised
        }
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

// ------------------------------------------------------------ pre-tokenizers

int sd_pretokenizer_kind(const char *name) {
    if (!strcmp(name, "gpt2") || !strcmp(name, "default")) return PRE_GPT2;
    if (!strcmp(name, "smollm")) return PRE_SMOLLM;
    if (!strcmp(name, "qwen2")) return PRE_QWEN2;
    if (!strcmp(name, "llama-bpe")) return PRE_LLAMA3;
    return -1;
}

// The text of a fragment as code points: cp[i], its class cls[i], and the
// byte offset of code point i in the fragment (off[n] = byte length).
typedef struct {
    const uint32_t *cp;
    const uint8_t *cls;
    const uint32_t *off;
} cps;

static int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

// Contractions. GPT-2: 's 't 're 've 'm 'll 'd (lower case only); Qwen2 and
// Llama 3: the same in either case. Returns the code points matched (0: none).
static int m_contraction(const cps *x, int i, int end, int any_case) {
    if (x->cp[i] != '\'' || i + 1 >= end) return 0;
    uint32_t a = x->cp[i + 1], b = i + 2 < end ? x->cp[i + 2] : 0;
    if (any_case) {
        if (a < 128) a = (uint32_t)((a >= 'A' && a <= 'Z') ? a + 32 : a);
        if (b < 128) b = (uint32_t)((b >= 'A' && b <= 'Z') ? b + 32 : b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

// \s+(?!\S) then \s+ : a whitespace run, leaving its last character for the
// next piece when a non-space follows (so " world" keeps its space).
static int m_space_run(const cps *x, int i, int end) {
    int j = i;
    while (j < end && x->cls[j] == SD_UCLASS_SPACE) j++;
    if (j == i) return 0;
    if (j < end && j - i >= 2) return j - i - 1;
    return j - i;
}

// Returns the code points of the GPT-2 pattern's match at i:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static int match_gpt2(const cps *x, int i, int end) {
    int k = m_contraction(x, i, end, 0);
    if (k) return k;
    int s = x->cp[i] == ' ' && i + 1 < end ? 1 : 0;
    int c0 = x->cls[i + s];
    if (s && c0 == SD_UCLASS_SPACE) s = 0, c0 = x->cls[i];
    if (c0 != SD_UCLASS_SPACE) {
        // ` ?X+` with X one of letter, number, other: the run of that class
        int j = i + s;
        while (j < end && x->cls[j] == c0) j++;
        return j - i;
    }
    return m_space_run(x, i, end);
}

// Qwen2 (max_digits 1) and Llama 3 (max_digits 3):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
static int match_qwen(const cps *x, int i, int end, int max_digits) {
    int k = m_contraction(x, i, end, 1);
    if (k) return k;
    int c = x->cls[i];
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c == SD_UCLASS_LETTER || (c != SD_UCLASS_NUMBER && !is_nl(x->cp[i]) && i + 1 < end && x->cls[i + 1] == SD_UCLASS_LETTER)) {
        int j = c == SD_UCLASS_LETTER ? i : i + 1;
        while (j < end && x->cls[j] == SD_UCLASS_LETTER) j++;
        return j - i;
    }
    if (c == SD_UCLASS_NUMBER) {
        int j = i;
        while (j < end && j - i < max_digits && x->cls[j] == SD_UCLASS_NUMBER) j++;
        return j - i;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    {
        int s = x->cp[i] == ' ' && i + 1 < end && x->cls[i + 1] == SD_UCLASS_OTHER ? 1 : 0;
        if (x->cls[i + s] == SD_UCLASS_OTHER) {
            int j = i + s;
            while (j < end && x->cls[j] == SD_UCLASS_OTHER) j++;
            while (j < end && is_nl(x->cp[j])) j++;
            return j - i;
        }
    }
    // c is white space here. `\s*[\r\n]+`: up to the last newline of the run.
    int j = i, last_nl = -1;
    while (j < end && x->cls[j] == SD_UCLASS_SPACE) {
        if (is_nl(x->cp[j])) last_nl = j;
        j++;
    }
    if (last_nl >= 0) return last_nl + 1 - i;
    return m_space_run(x, i, end);
}

// Pieces found by a pre-tokenizer, as byte ranges of the fragment; n counts
// all pieces, only the first cap are stored.
typedef struct {
    uint32_t *start, *end;  // (cap) byte ranges of the pieces
    int n, cap;
} pieces;

static void pieces_add(pieces *p, uint32_t s, uint32_t e) {
    if (p->n < p->cap) {
        p->start[p->n] = s;
        p->end[p->n] = e;
    }
    p->n++;
}

// Splits the n code points of x into pieces with pre-tokenizer pre.
static void pretokenize_cps(int pre, const cps *x, int n, pieces *out) {
    int i = 0;
    while (i < n) {
        int end = n;
        if (pre == PRE_SMOLLM) {
            // Digits are split off one by one first; the GPT-2 pattern then
            // runs on each stretch between digits.
            if (x->cls[i] == SD_UCLASS_NUMBER) {
                pieces_add(out, x->off[i], x->off[i + 1]);
                i++;
                continue;
            }
            end = i;
            while (end < n && x->cls[end] != SD_UCLASS_NUMBER) end++;
        }
        int lim = end;
        while (i < lim) {
            int k;
            switch (pre) {
            case PRE_QWEN2: k = match_qwen(x, i, lim, 1); break;
            case PRE_LLAMA3: k = match_qwen(x, i, lim, 3); break;
            default: k = match_gpt2(x, i, lim); break;
            }
            if (k <= 0) k = 1;  // cannot happen: every class is covered; stay safe
            pieces_add(out, x->off[i], x->off[i + k]);
            i += k;
        }
    }
}

// Decodes text into code points; buffers are sized for len code points.
static int decode_cps(const char *text, size_t len, uint32_t *cp, uint8_t *cls, uint32_t *off) {
    int n = 0;
    size_t p = 0;
    while (p < len) {
        uint32_t c;
        int k = sd_utf8_decode(text + p, len - p, &c);
        cp[n] = c;
        cls[n] = (uint8_t)sd_unicode_class(c);
        off[n] = (uint32_t)p;
        n++;
        p += (size_t)k;
    }
    off[n] = (uint32_t)len;
    return n;
}

int sd_pretokenize(const char *pre_type, const char *text, size_t len, size_t *starts, size_t *lens,
                   int max, char *err, size_t errlen) {
    int pre = sd_pretokenizer_kind(pre_type);
    if (pre < 0) return sd_err(err, errlen, "pre-tokenizer '%s' is not supported (supported: smollm, qwen2, llama-bpe, gpt2, default)", pre_type);
    if (len > (1u << 30)) return sd_err(err, errlen, "text too long");
    uint32_t *cp = malloc(sizeof *cp * (len + 1));
    uint8_t *cls = malloc(len + 1);
    uint32_t *off = malloc(sizeof *off * (len + 1));
    uint32_t *ps = malloc(sizeof *ps * (len + 1));
    uint32_t *pe = malloc(sizeof *pe * (len + 1));
    if (!cp || !cls || !off || !ps || !pe) {
        free(cp), free(cls), free(off), free(ps), free(pe);
        return sd_err(err, errlen, "out of memory");
    }
    int n = decode_cps(text, len, cp, cls, off);
    cps x = {cp, cls, off};
    pieces p = {ps, pe, 0, (int)len + 1};
    pretokenize_cps(pre, &x, n, &p);
    for (int i = 0; i < p.n && i < max; i++) {
        starts[i] = ps[i];
        lens[i] = pe[i] - ps[i];
    }
    free(cp), free(cls), free(off), free(ps), free(pe);
    return p.n;
}

// ------------------------------------------------------------ encoding

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
    int n = decode_cps(text, len, w->cp, w->cls, w->off);
    cps x = {w->cp, w->cls, w->off};
    pieces p = {w->ps, w->pe, 0, (int)len + 1};
    pretokenize_cps(t->pre, &x, n, &p);
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

// ------------------------------------------------------------ chat formats

typedef struct {
    char *out;
    size_t size, n;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t k) {
    if (b->n < b->size) {
        size_t c = SD_MIN(k, b->size - b->n);
        memcpy(b->out + b->n, s, c);
    }
    b->n += k;
}

static void sb_str(strbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

// Appends s without leading and trailing white space (Llama 3's template
// applies `| trim` to message contents).
static void sb_trimmed(strbuf *b, const char *s) {
    size_t k = strlen(s), i = 0;
    while (i < k && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    while (k > i && (s[k - 1] == ' ' || s[k - 1] == '\t' || s[k - 1] == '\n' || s[k - 1] == '\r')) k--;
    sb_add(b, s + i, k - i);
}

// Contract in specdec.h. system == NULL means the template's default: for
// ChatML the default system message found in the template (none if it has
// none); Llama 3 templates get no system turn. system == "" means no system
// turn at all. Llama 3 contents are trimmed as its template does, and
// "<|begin_of_text|>" is written only when sd_tokenize will not add BOS
// itself (add_bos_token false), so the tokenized prompt has exactly one BOS.
// Callers tokenize the result with parse_special = 1.
int sd_chat_format(const sd_tokenizer *t, const char *system, const char *user, char *out, size_t outsize,
                   char *err, size_t errlen) {
    if (!t || !user || !out || !outsize) return sd_err(err, errlen, "sd_chat_format: missing argument");
    if (t->chat == CHAT_NONE) return sd_err(err, errlen, "the model has no chat template (tokenizer.chat_template)");
    if (t->chat < 0) return sd_err(err, errlen, "the model's chat template is not recognised (supported: ChatML, Llama 3)");
    strbuf b = {out, outsize, 0};
    if (t->chat == CHAT_CHATML) {
        const char *sys = system ? system : t->default_system;
        if (sys && *sys) {
            sb_str(&b, "<|im_start|>system\n");
            sb_str(&b, sys);
            sb_str(&b, "<|im_end|>\n");
        }
        sb_str(&b, "<|im_start|>user\n");
        sb_str(&b, user);
        sb_str(&b, "<|im_end|>\n<|im_start|>assistant\n");
    } else {
        // The template begins with bos_token; it is written here only when
        // sd_tokenize will not add BOS itself, so the prompt never has two.
        if (!(t->add_bos && t->bos >= 0)) {
            if (t->bos >= 0) sb_add(&b, t->pool + t->off[t->bos], t->len[t->bos]);
            else sb_str(&b, "<|begin_of_text|>");
        }
        if (system && *system) {
            sb_str(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
            sb_trimmed(&b, system);
            sb_str(&b, "<|eot_id|>");
        }
        sb_str(&b, "<|start_header_id|>user<|end_header_id|>\n\n");
        sb_trimmed(&b, user);
        sb_str(&b, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    if (b.n + 1 > outsize) {
        out[0] = 0;
        return sd_err(err, errlen, "chat prompt needs %zu bytes, buffer has %zu", b.n + 1, outsize);
    }
    out[b.n] = 0;
    if (b.n > (size_t)0x7fffffff) return sd_err(err, errlen, "chat prompt too long");
    return (int)b.n;
}
