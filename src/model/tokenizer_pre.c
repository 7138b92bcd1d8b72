// tokenizer_pre.c - the pre-tokenizers of byte-level BPE vocabularies: the
// split of text into the pieces that are merged independently, by a
// hand-written matcher for each supported regex, over code points and
// Unicode classes.
#include "model/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/unicode.h"

int sd_pretokenizer_kind(const char *name) {
    if (!strcmp(name, "gpt2") || !strcmp(name, "default")) return PRE_GPT2;
    if (!strcmp(name, "smollm")) return PRE_SMOLLM;
    if (!strcmp(name, "qwen2")) return PRE_QWEN2;
    if (!strcmp(name, "llama-bpe")) return PRE_LLAMA3;
    return -1;
}

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

static void pieces_add(pieces *p, uint32_t s, uint32_t e) {
    if (p->n < p->cap) {
        p->start[p->n] = s;
        p->end[p->n] = e;
    }
    p->n++;
}

// Splits the n code points of x into pieces with pre-tokenizer pre.
void sd_tok_pretokenize_cps(int pre, const cps *x, int n, pieces *out) {
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
int sd_tok_decode_cps(const char *text, size_t len, uint32_t *cp, uint8_t *cls, uint32_t *off) {
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
    int n = sd_tok_decode_cps(text, len, cp, cls, off);
    cps x = {cp, cls, off};
    pieces p = {ps, pe, 0, (int)len + 1};
    sd_tok_pretokenize_cps(pre, &x, n, &p);
    for (int i = 0; i < p.n && i < max; i++) {
        starts[i] = ps[i];
        lens[i] = pe[i] - ps[i];
    }
    free(cp), free(cls), free(off), free(ps), free(pe);
    return p.n;
}
