// tokenizer_chat.c - chat templates: recognising the template a GGUF file
// carries (ChatML or Llama 3, and ChatML's default system message) and
// formatting a chat prompt in it.
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

// Writes the turns of messages[0..n) in t's chat format, then the assistant
// header. default_system: for ChatML, write the template's default system
// message first when messages[0] is not a system message (what SmolLM2's and
// Qwen2.5's templates do); Llama 3 templates get no default. Llama 3 contents
// are trimmed as its template does, and "<|begin_of_text|>" is written only
// when sd_tokenize will not add BOS itself (add_bos_token false), so the
// tokenized prompt has exactly one BOS.
static int chat_write(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                      int default_system, char *out, size_t outsize, char *err, size_t errlen) {
    if (t->chat == CHAT_NONE) return sd_err(err, errlen, "the model has no chat template (tokenizer.chat_template)");
    if (t->chat < 0) return sd_err(err, errlen, "the model's chat template is not recognised (supported: ChatML, Llama 3)");
    for (int i = 0; i < n; i++) {
        if (!roles[i] || !contents[i]) return sd_err(err, errlen, "message %d: missing role or content", i);
        if (strcmp(roles[i], "system") && strcmp(roles[i], "user") && strcmp(roles[i], "assistant"))
            return sd_err(err, errlen, "message %d: unknown role '%.32s' (expected system, user or assistant)", i,
                          roles[i]);
    }
    strbuf b = {out, outsize, 0};
    int first_is_system = n > 0 && !strcmp(roles[0], "system");
    if (t->chat == CHAT_CHATML) {
        if (default_system && !first_is_system && t->default_system && *t->default_system) {
            sb_str(&b, "<|im_start|>system\n");
            sb_str(&b, t->default_system);
            sb_str(&b, "<|im_end|>\n");
        }
        for (int i = 0; i < n; i++) {
            sb_str(&b, "<|im_start|>");
            sb_str(&b, roles[i]);
            sb_str(&b, "\n");
            sb_str(&b, contents[i]);
            sb_str(&b, "<|im_end|>\n");
        }
        sb_str(&b, "<|im_start|>assistant\n");
    } else {
        // The template begins with bos_token; it is written here only when
        // sd_tokenize will not add BOS itself, so the prompt never has two.
        if (!(t->add_bos && t->bos >= 0)) {
            if (t->bos >= 0) sb_add(&b, t->pool + t->off[t->bos], t->len[t->bos]);
            else sb_str(&b, "<|begin_of_text|>");
        }
        for (int i = 0; i < n; i++) {
            sb_str(&b, "<|start_header_id|>");
            sb_str(&b, roles[i]);
            sb_str(&b, "<|end_header_id|>\n\n");
            sb_trimmed(&b, contents[i]);
            sb_str(&b, "<|eot_id|>");
        }
        sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    if (b.n + 1 > outsize) {
        out[0] = 0;
        return sd_err(err, errlen, "chat prompt needs %zu bytes, buffer has %zu", b.n + 1, outsize);
    }
    out[b.n] = 0;
    if (b.n > (size_t)0x7fffffff) return sd_err(err, errlen, "chat prompt too long");
    return (int)b.n;
}

// Contract in specdec.h. system == NULL means the template's default: for
// ChatML the default system message found in the template (none if it has
// none); Llama 3 templates get no system turn. system == "" means no system
// turn at all. Callers tokenize the result with parse_special = 1.
int sd_chat_format(const sd_tokenizer *t, const char *system, const char *user, char *out, size_t outsize,
                   char *err, size_t errlen) {
    if (!t || !user || !out || !outsize) return sd_err(err, errlen, "sd_chat_format: missing argument");
    const char *roles[2] = {"system", "user"}, *contents[2] = {system, user};
    if (system && *system) return chat_write(t, roles, contents, 2, 0, out, outsize, err, errlen);
    return chat_write(t, roles + 1, contents + 1, 1, system == NULL, out, outsize, err, errlen);
}

// Contract in specdec.h.
int sd_chat_format_messages(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                            char *out, size_t outsize, char *err, size_t errlen) {
    if (!t || !out || !outsize || n < 0 || (n > 0 && (!roles || !contents)))
        return sd_err(err, errlen, "sd_chat_format_messages: missing argument");
    if (n == 0) return sd_err(err, errlen, "a chat needs at least one message");
    return chat_write(t, roles, contents, n, 1, out, outsize, err, errlen);
}
