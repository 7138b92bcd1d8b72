// tokenizer_impl.h - private to the tokenizer files: the struct
// sd_tokenizer, its hash lookups, and the pre-tokenizer calls the encoder
// uses. tokenizer.c loads a tokenizer from GGUF metadata and decodes ids;
// tokenizer_pre.c holds the pre-tokenizers of byte-level BPE;
// tokenizer_encode.c turns text into ids; tokenizer_chat.c recognises chat
// templates and formats chat prompts.
#ifndef SD_TOKENIZER_IMPL_H
#define SD_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/tokenizer.h"

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

static inline uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static inline uint32_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static inline int32_t lookup(const sd_tokenizer *t, const char *s, size_t n) {
    uint32_t i = hash_bytes(s, n) & t->hash_mask;
    for (;;) {
        int32_t id = t->hash[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->pool + t->off[id], s, n) == 0) return id;
        i = (i + 1) & t->hash_mask;
    }
}

static inline const merge_slot *merge_find(const sd_tokenizer *t, int32_t a, int32_t b) {
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

// ------------------------------------------------------------ pre-tokenizing (tokenizer_pre.c)

// The text of a fragment as code points: cp[i], its class cls[i], and the
// byte offset of code point i in the fragment (off[n] = byte length).
typedef struct {
    const uint32_t *cp;
    const uint8_t *cls;
    const uint32_t *off;
} cps;

// Pieces found by a pre-tokenizer, as byte ranges of the fragment; n counts
// all pieces, only the first cap are stored.
typedef struct {
    uint32_t *start, *end;  // (cap) byte ranges of the pieces
    int n, cap;
} pieces;

// Decodes text into code points; buffers are sized for len code points.
// Returns the number of code points n (off[n] = len).
int sd_tok_decode_cps(const char *text, size_t len, uint32_t *cp, uint8_t *cls, uint32_t *off);
// Splits the n code points of x into pieces with pre-tokenizer pre (PRE_*).
void sd_tok_pretokenize_cps(int pre, const cps *x, int n, pieces *out);

// ------------------------------------------------------------ chat templates (tokenizer_chat.c)

// Load step: recognises tokenizer.chat_template (sets chat and
// default_system). Returns 0 or <0 with a message.
int sd_tokenizer_load_chat(sd_tokenizer *t, const sd_gguf *g, char *err, size_t errlen);

#endif
