// tokenizer_chat.c - chat templates: recognising the template a GGUF file
// carries (ChatML or Llama 3, and ChatML's default system message) and
// formatting a chat prompt in it, as text or as token ids built piece by
// piece (markers as special tokens, message text never parsed for them).
#include "model/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

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

int sd_tokenizer_load_chat(sd_tokenizer *t, const sd_gguf *g, char *err, size_t errlen) {
    sd_str tpl;
    int r = sd_gguf_get_str(g, "tokenizer.chat_template", &tpl, err, errlen);
    if (r < 0) return r;
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
    return 0;
}

// Where a chat prompt goes: text (out, size; n counts every byte, only the
// first size are stored) or, in token mode, token ids. In token mode the
// template's markers become their special tokens directly and the text
// between markers (role names, newlines, message contents) collects in raw and
// is tokenized with parse_special = 0 when the next marker comes: the text of
// a message can never produce a control token such as <|im_end|>.
typedef struct {
    char *out;
    size_t size, n;
    int tokens;             // 1: token mode
    const sd_tokenizer *t;  // token mode only
    int32_t *ids;           // token mode: (max) ids or NULL; n_ids counts all, the first max are stored
    int max, n_ids, failed;
    char *raw;              // pending text since the last marker (token mode)
    size_t raw_n, raw_cap;
} chat_out;

static void put_id(chat_out *b, int32_t id) {
    if (b->n_ids < b->max) b->ids[b->n_ids] = id;
    if (b->n_ids == INT32_MAX) b->failed = 1;
    else b->n_ids++;
}

static void sb_add(chat_out *b, const char *s, size_t k) {
    b->n += k;
    if (b->tokens) {
        if (b->failed) return;
        if (b->raw_n + k > b->raw_cap) {
            size_t cap = SD_MAX(b->raw_n + k, 2 * b->raw_cap + 256);
            char *r = realloc(b->raw, cap);
            if (!r) {
                b->failed = 1;
                return;
            }
            b->raw = r, b->raw_cap = cap;
        }
        memcpy(b->raw + b->raw_n, s, k);
        b->raw_n += k;
        return;
    }
    size_t at = b->n - k;
    if (at < b->size) memcpy(b->out + at, s, SD_MIN(k, b->size - at));
}

static void sb_str(chat_out *b, const char *s) { sb_add(b, s, strlen(s)); }

// Token mode: the pending raw text as ids, special-token texts in it taken
// literally.
static void flush_raw(chat_out *b) {
    if (!b->tokens || b->failed || b->raw_n == 0) return;
    int room = b->n_ids < b->max ? b->max - b->n_ids : 0;
    int k = sd_tokenize(b->t, b->raw, b->raw_n, 0, 0, room ? b->ids + b->n_ids : NULL, room);
    if (k < 0 || k > INT32_MAX - b->n_ids) b->failed = 1;
    else b->n_ids += k;
    b->raw_n = 0;
}

// A marker of the template itself (<|im_start|>, <|eot_id|>, ...): in token
// mode its special token when the vocabulary has it as one; otherwise (a
// vocabulary without it) it stays text, as sd_tokenize would leave it.
static void sb_mark(chat_out *b, const char *s, size_t k) {
    if (b->tokens) {
        int32_t id = lookup(b->t, s, k);
        if (id >= 0 && (b->t->type[id] == TT_CONTROL || b->t->type[id] == TT_USER)) {
            b->n += k;
            flush_raw(b);
            put_id(b, id);
            return;
        }
    }
    sb_add(b, s, k);
}

static void sb_markstr(chat_out *b, const char *s) { sb_mark(b, s, strlen(s)); }

// Appends s without leading and trailing white space (Llama 3's template
// applies `| trim` to message contents).
static void sb_trimmed(chat_out *b, const char *s) {
    size_t k = strlen(s), i = 0;
    while (i < k && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    while (k > i && (s[k - 1] == ' ' || s[k - 1] == '\t' || s[k - 1] == '\n' || s[k - 1] == '\r')) k--;
    sb_add(b, s + i, k - i);
}

// Writes the turns of messages[0..n) in t's chat format, then the assistant
// header, into b. default_system: for ChatML, write the template's default
// system message first when messages[0] is not a system message (what
// SmolLM2's and Qwen2.5's templates do); Llama 3 templates get no default.
// Llama 3 contents are trimmed as its template does, and "<|begin_of_text|>"
// is written only when sd_tokenize will not add BOS itself
// (add_bos_token false), so the tokenized prompt has exactly one BOS.
// Returns 0 or <0 with a message (the checks; sizes are the callers').
static int chat_write(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                      int default_system, chat_out *b, char *err, size_t errlen) {
    if (t->chat == CHAT_NONE) return sd_err(err, errlen, "the model has no chat template (tokenizer.chat_template)");
    if (t->chat < 0) return sd_err(err, errlen, "the model's chat template is not recognised (supported: ChatML, Llama 3)");
    for (int i = 0; i < n; i++) {
        if (!roles[i] || !contents[i]) return sd_err(err, errlen, "message %d: missing role or content", i);
        if (strcmp(roles[i], "system") && strcmp(roles[i], "user") && strcmp(roles[i], "assistant"))
            return sd_err(err, errlen, "message %d: unknown role '%.32s' (expected system, user or assistant)", i,
                          roles[i]);
    }
    int first_is_system = n > 0 && !strcmp(roles[0], "system");
    if (t->chat == CHAT_CHATML) {
        if (default_system && !first_is_system && t->default_system && *t->default_system) {
            sb_markstr(b, "<|im_start|>");
            sb_str(b, "system\n");
            sb_str(b, t->default_system);
            sb_markstr(b, "<|im_end|>");
            sb_str(b, "\n");
        }
        for (int i = 0; i < n; i++) {
            sb_markstr(b, "<|im_start|>");
            sb_str(b, roles[i]);
            sb_str(b, "\n");
            sb_str(b, contents[i]);
            sb_markstr(b, "<|im_end|>");
            sb_str(b, "\n");
        }
        sb_markstr(b, "<|im_start|>");
        sb_str(b, "assistant\n");
    } else {
        // The template begins with bos_token; it is written here only when
        // sd_tokenize will not add BOS itself, so the prompt never has two.
        if (!(t->add_bos && t->bos >= 0)) {
            if (t->bos >= 0) sb_mark(b, t->pool + t->off[t->bos], t->len[t->bos]);
            else sb_markstr(b, "<|begin_of_text|>");
        }
        for (int i = 0; i < n; i++) {
            sb_markstr(b, "<|start_header_id|>");
            sb_str(b, roles[i]);
            sb_markstr(b, "<|end_header_id|>");
            sb_str(b, "\n\n");
            sb_trimmed(b, contents[i]);
            sb_markstr(b, "<|eot_id|>");
        }
        sb_markstr(b, "<|start_header_id|>");
        sb_str(b, "assistant");
        sb_markstr(b, "<|end_header_id|>");
        sb_str(b, "\n\n");
    }
    return 0;
}

// Text mode: formats into out and checks the size.
static int chat_text(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                     int default_system, char *out, size_t outsize, char *err, size_t errlen) {
    chat_out b = {.out = out, .size = outsize};
    int r = chat_write(t, roles, contents, n, default_system, &b, err, errlen);
    if (r < 0) return r;
    if (b.n + 1 > outsize) {
        out[0] = 0;
        return sd_err(err, errlen, "chat prompt needs %zu bytes, buffer has %zu", b.n + 1, outsize);
    }
    out[b.n] = 0;
    if (b.n > (size_t)0x7fffffff) return sd_err(err, errlen, "chat prompt too long");
    return (int)b.n;
}

// Token mode: BOS when the vocabulary asks for it (as sd_tokenize with
// add_bos = 1; chat_write then writes no BOS of its own), then the turns.
static int chat_ids(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                    int default_system, int32_t *out, int max, char *err, size_t errlen) {
    if (max < 0 || (!out && max > 0)) return sd_err(err, errlen, "chat tokenize: bad output buffer");
    chat_out b = {.tokens = 1, .t = t, .ids = out, .max = out ? max : 0};
    if (t->add_bos && t->bos >= 0) put_id(&b, t->bos);
    int r = chat_write(t, roles, contents, n, default_system, &b, err, errlen);
    if (r == 0) flush_raw(&b);
    free(b.raw);
    if (r < 0) return r;
    if (b.failed) return sd_err(err, errlen, "chat prompt too long to tokenize");
    return b.n_ids;
}

// Contract in specdec.h. system == NULL means the template's default: for
// ChatML the default system message found in the template (none if it has
// none); Llama 3 templates get no system turn. system == "" means no system
// turn at all. The text is for showing: sd_chat_tokenize gives the ids.
int sd_chat_format(const sd_tokenizer *t, const char *system, const char *user, char *out, size_t outsize,
                   char *err, size_t errlen) {
    if (!t || !user || !out || !outsize) return sd_err(err, errlen, "sd_chat_format: missing argument");
    const char *roles[2] = {"system", "user"}, *contents[2] = {system, user};
    if (system && *system) return chat_text(t, roles, contents, 2, 0, out, outsize, err, errlen);
    return chat_text(t, roles + 1, contents + 1, 1, system == NULL, out, outsize, err, errlen);
}

// Contract in specdec.h.
int sd_chat_format_messages(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                            char *out, size_t outsize, char *err, size_t errlen) {
    if (!t || !out || !outsize || n < 0 || (n > 0 && (!roles || !contents)))
        return sd_err(err, errlen, "sd_chat_format_messages: missing argument");
    if (n == 0) return sd_err(err, errlen, "a chat needs at least one message");
    return chat_text(t, roles, contents, n, 1, out, outsize, err, errlen);
}

// Contract in specdec.h; the same turns as sd_chat_format, as ids.
int sd_chat_tokenize(const sd_tokenizer *t, const char *system, const char *user, int32_t *out, int max, char *err,
                     size_t errlen) {
    if (!t || !user) return sd_err(err, errlen, "sd_chat_tokenize: missing argument");
    const char *roles[2] = {"system", "user"}, *contents[2] = {system, user};
    if (system && *system) return chat_ids(t, roles, contents, 2, 0, out, max, err, errlen);
    return chat_ids(t, roles + 1, contents + 1, 1, system == NULL, out, max, err, errlen);
}

// Contract in specdec.h; the same turns as sd_chat_format_messages, as ids.
int sd_chat_tokenize_messages(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                              int32_t *out, int max, char *err, size_t errlen) {
    if (!t || n < 0 || (n > 0 && (!roles || !contents)))
        return sd_err(err, errlen, "sd_chat_tokenize_messages: missing argument");
    if (n == 0) return sd_err(err, errlen, "a chat needs at least one message");
    return chat_ids(t, roles, contents, n, 1, out, max, err, errlen);
}
