// suffix.c - suffix arrays over token ids (prefix doubling + counting sort)
// and the retrieval datastore file (.sdsa).
#include "draft/suffix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"

static const char sdsa_magic[8] = {'S', 'D', 'S', 'A', 'I', 'D', 'X', 0};

#define FNV_OFF 1469598103934665603ull
#define FNV_PRIME 1099511628211ull

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

int sd_sa_build(const int32_t *s, int64_t n, int32_t *sa, char *err, size_t errlen) {
    if (n <= 0) return 0;
    if (n > INT32_MAX) return sd_err(err, errlen, "suffix array: %lld tokens is too many", (long long)n);
    int32_t maxv = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] < 0) return sd_err(err, errlen, "suffix array: negative token id %d at %lld", s[i], (long long)i);
        maxv = SD_MAX(maxv, s[i]);
    }
    size_t ncnt = (size_t)SD_MAX((int64_t)maxv + 1, n) + 1;
    int32_t *rank = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *tmp = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *cnt = malloc(sizeof(int32_t) * ncnt);
    if (!rank || !tmp || !cnt) {
        free(rank);
        free(tmp);
        free(cnt);
        return sd_err(err, errlen, "suffix array: out of memory for %lld tokens", (long long)n);
    }
    const int32_t N = (int32_t)n;
    // Round 0: order by the first token.
    memset(cnt, 0, sizeof(int32_t) * ((size_t)maxv + 1));
    for (int32_t i = 0; i < N; i++) cnt[s[i]]++;
    for (int32_t v = 0, acc = 0; v <= maxv; v++) {
        int32_t c = cnt[v];
        cnt[v] = acc;
        acc += c;
    }
    for (int32_t i = 0; i < N; i++) sa[cnt[s[i]]++] = i;
    rank[sa[0]] = 0;
    for (int32_t r = 1; r < N; r++) rank[sa[r]] = rank[sa[r - 1]] + (s[sa[r]] != s[sa[r - 1]]);
    int32_t classes = rank[sa[N - 1]] + 1;
    // Round k: rank[i] orders the first k tokens of suffix i (a suffix
    // shorter than k sorts before its extensions); sort by (rank[i], rank[i+k]).
    for (int64_t k = 1; classes < N; k <<= 1) {
        int32_t p = 0;
        for (int64_t i = SD_MAX(0, n - k); i < n; i++) tmp[p++] = (int32_t)i;   // empty second key first
        for (int32_t r = 0; r < N; r++)
            if (sa[r] >= k) tmp[p++] = (int32_t)(sa[r] - k);
        memset(cnt, 0, sizeof(int32_t) * (size_t)classes);
        for (int32_t i = 0; i < N; i++) cnt[rank[i]]++;
        for (int32_t v = 0, acc = 0; v < classes; v++) {
            int32_t c = cnt[v];
            cnt[v] = acc;
            acc += c;
        }
        for (int32_t j = 0; j < N; j++) sa[cnt[rank[tmp[j]]]++] = tmp[j];
        tmp[sa[0]] = 0;
        for (int32_t r = 1; r < N; r++) {
            int32_t a = sa[r - 1], b = sa[r];
            int32_t a2 = a + k < n ? rank[a + k] : -1, b2 = b + k < n ? rank[b + k] : -1;
            tmp[b] = tmp[a] + (rank[a] != rank[b] || a2 != b2);
        }
        int32_t *sw = rank;
        rank = tmp;
        tmp = sw;
        classes = rank[sa[N - 1]] + 1;
    }
    free(rank);
    free(tmp);
    free(cnt);
    return 0;
}

// <0, 0, >0: the suffix at p, cut to m tokens, against pat.
static int sa_cmp(const int32_t *s, int64_t n, int64_t p, const int32_t *pat, int m) {
    for (int j = 0; j < m; j++) {
        if (p + j >= n) return -1;
        if (s[p + j] != pat[j]) return s[p + j] < pat[j] ? -1 : 1;
    }
    return 0;
}

void sd_sa_range(const int32_t *s, int64_t n, const int32_t *sa, const int32_t *pat, int m, int64_t *lo,
                 int64_t *hi) {
    int64_t a = 0, b = n;
    while (a < b) {   // first suffix >= pat
        int64_t mid = a + (b - a) / 2;
        if (sa_cmp(s, n, sa[mid], pat, m) < 0) a = mid + 1;
        else b = mid;
    }
    *lo = a;
    b = n;
    while (a < b) {   // first suffix > pat
        int64_t mid = a + (b - a) / 2;
        if (sa_cmp(s, n, sa[mid], pat, m) <= 0) a = mid + 1;
        else b = mid;
    }
    *hi = a;
}

uint64_t sd_vocab_hash(const sd_tokenizer *t) {
    int nv = sd_tokenizer_n_vocab(t);
    uint64_t h = fnv(FNV_OFF, &nv, sizeof nv);
    for (int id = 0; id < nv; id++) {
        size_t len = 0;
        const char *txt = sd_token_text(t, id, &len);
        uint32_t l32 = txt ? (uint32_t)len : 0xFFFFFFFFu;
        h = fnv(h, &l32, sizeof l32);
        if (txt) h = fnv(h, txt, len);
    }
    return h;
}

sd_datastore *sd_datastore_ref(sd_datastore *ds) {
    if (ds) atomic_fetch_add(&ds->refs, 1);
    return ds;
}

const char *sd_datastore_note(const sd_datastore *ds) { return ds ? ds->note : ""; }

void sd_datastore_free(sd_datastore *ds) {
    if (!ds || atomic_fetch_sub(&ds->refs, 1) > 1) return;
    free(ds->tok);
    free(ds->sa);
    free(ds);
}

int sd_datastore_from_tokens(sd_datastore **out, const int32_t *tok, int64_t n, const sd_datastore_key *key,
                             char *err, size_t errlen) {
    *out = NULL;
    if (n <= 0) return sd_err(err, errlen, "datastore: no tokens");
    sd_datastore *ds = calloc(1, sizeof *ds);
    if (!ds) return sd_err(err, errlen, "datastore: out of memory");
    atomic_init(&ds->refs, 1);
    ds->tok = malloc(sizeof(int32_t) * (size_t)n);
    ds->sa = malloc(sizeof(int32_t) * (size_t)n);
    if (!ds->tok || !ds->sa) {
        sd_datastore_free(ds);
        return sd_err(err, errlen, "datastore: out of memory for %lld tokens", (long long)n);
    }
    memcpy(ds->tok, tok, sizeof(int32_t) * (size_t)n);
    ds->n = n;
    if (key) ds->key = *key;
    ds->rebuilt = 1;
    if (sd_sa_build(ds->tok, n, ds->sa, err, errlen) < 0) {
        sd_datastore_free(ds);
        return -1;
    }
    *out = ds;
    return 0;
}

typedef struct sdsa_header {
    char magic[8];
    uint32_t version;
    uint32_t n_vocab;
    uint64_t vocab_hash;
    uint64_t corpus_size;
    int64_t corpus_mtime;
    uint64_t corpus_hash;
    uint64_t n_tokens;
    uint64_t payload_hash;
} sdsa_header;   // 64 bytes, no padding

static uint64_t payload_hash(const sd_datastore *ds) {
    uint64_t h = fnv(FNV_OFF, ds->tok, sizeof(int32_t) * (size_t)ds->n);
    return fnv(h, ds->sa, sizeof(int32_t) * (size_t)ds->n);
}

int sd_datastore_save(const sd_datastore *ds, const char *path, char *err, size_t errlen) {
    sdsa_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, sdsa_magic, 8);
    h.version = SD_SDSA_VERSION;
    h.n_vocab = ds->key.n_vocab;
    h.vocab_hash = ds->key.vocab_hash;
    h.corpus_size = ds->key.corpus_size;
    h.corpus_mtime = ds->key.corpus_mtime;
    h.corpus_hash = ds->key.corpus_hash;
    h.n_tokens = (uint64_t)ds->n;
    h.payload_hash = payload_hash(ds);
    // Written to a temporary name, then renamed: a crash never leaves a half file.
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return sd_err(err, errlen, "datastore: path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return sd_err(err, errlen, "datastore: cannot write %s: %s", tmp, strerror(errno));
    int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(ds->tok, sizeof(int32_t), (size_t)ds->n, f) == (size_t)ds->n &&
             fwrite(ds->sa, sizeof(int32_t), (size_t)ds->n, f) == (size_t)ds->n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return sd_err(err, errlen, "datastore: writing %s failed: %s", path, strerror(errno));
    }
    return 0;
}

int sd_datastore_load(sd_datastore **out, const char *path, const sd_datastore_key *key, char *err,
                      size_t errlen) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return sd_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat stt;
    sdsa_header h;
    sd_datastore *ds = NULL;
    int rc = -1;
    if (fstat(fileno(f), &stt) != 0 || fread(&h, sizeof h, 1, f) != 1) {
        sd_err(err, errlen, "%s: too short for a datastore header", path);
        goto done;
    }
    if (memcmp(h.magic, sdsa_magic, 8) != 0) {
        sd_err(err, errlen, "%s: not a specdec datastore index (bad magic)", path);
        goto done;
    }
    if (h.version != SD_SDSA_VERSION) {
        sd_err(err, errlen, "%s: index format version %u, this build reads version %d", path, h.version,
               SD_SDSA_VERSION);
        goto done;
    }
    if (key && (h.n_vocab != key->n_vocab || h.vocab_hash != key->vocab_hash)) {
        sd_err(err, errlen, "%s: built with a different tokenizer (n_vocab %u, vocabulary hash %016llx; expected %u, %016llx)",
               path, h.n_vocab, (unsigned long long)h.vocab_hash, key->n_vocab, (unsigned long long)key->vocab_hash);
        goto done;
    }
    if (key && (h.corpus_size != key->corpus_size || h.corpus_mtime != key->corpus_mtime ||
                h.corpus_hash != key->corpus_hash)) {
        sd_err(err, errlen, "%s: the corpus changed since it was indexed (size %llu -> %llu)", path,
               (unsigned long long)h.corpus_size, (unsigned long long)(key ? key->corpus_size : 0));
        goto done;
    }
    if (h.n_tokens == 0 || h.n_tokens > INT32_MAX ||
        (uint64_t)stt.st_size != sizeof h + 2 * sizeof(int32_t) * h.n_tokens) {
        sd_err(err, errlen, "%s: file size %lld does not match its %llu tokens (truncated or corrupted)", path,
               (long long)stt.st_size, (unsigned long long)h.n_tokens);
        goto done;
    }
    ds = calloc(1, sizeof *ds);
    if (ds) {
        atomic_init(&ds->refs, 1);
        ds->n = (int64_t)h.n_tokens;
        ds->tok = malloc(sizeof(int32_t) * (size_t)ds->n);
        ds->sa = malloc(sizeof(int32_t) * (size_t)ds->n);
    }
    if (!ds || !ds->tok || !ds->sa) {
        sd_err(err, errlen, "%s: out of memory for %llu tokens", path, (unsigned long long)h.n_tokens);
        goto done;
    }
    if (fread(ds->tok, sizeof(int32_t), (size_t)ds->n, f) != (size_t)ds->n ||
        fread(ds->sa, sizeof(int32_t), (size_t)ds->n, f) != (size_t)ds->n) {
        sd_err(err, errlen, "%s: read error", path);
        goto done;
    }
    if (payload_hash(ds) != h.payload_hash) {
        sd_err(err, errlen, "%s: corrupted (checksum mismatch)", path);
        goto done;
    }
    for (int64_t i = 0; i < ds->n; i++) {
        if (ds->tok[i] < 0 || (h.n_vocab && (uint32_t)ds->tok[i] >= h.n_vocab) || ds->sa[i] < 0 || ds->sa[i] >= ds->n) {
            sd_err(err, errlen, "%s: corrupted (entry %lld out of range)", path, (long long)i);
            goto done;
        }
    }
    ds->key.n_vocab = h.n_vocab;
    ds->key.vocab_hash = h.vocab_hash;
    ds->key.corpus_size = h.corpus_size;
    ds->key.corpus_mtime = h.corpus_mtime;
    ds->key.corpus_hash = h.corpus_hash;
    *out = ds;
    ds = NULL;
    rc = 0;
done:
    fclose(f);
    sd_datastore_free(ds);
    return rc;
}

// Tokenizes text in chunks cut after a newline (or a space), so that a
// corpus of megabytes never needs one huge call; appends to *tok.
static int tokenize_corpus(const sd_tokenizer *t, const char *text, size_t len, int32_t **tok, int64_t *n,
                           char *err, size_t errlen) {
    const size_t CH = 1 << 16;
    size_t cap = len / 2 + 1024;
    int32_t *buf = malloc(sizeof(int32_t) * cap);
    if (!buf) return sd_err(err, errlen, "datastore: out of memory");
    int64_t nt = 0;
    size_t pos = 0;
    while (pos < len) {
        size_t end = len;
        if (len - pos > CH) {
            end = pos + CH;
            size_t e = end;
            while (e > pos + CH / 2 && text[e - 1] != '\n') e--;
            if (e == pos + CH / 2) {
                e = end;
                while (e > pos + CH / 2 && text[e - 1] != ' ') e--;
            }
            if (e == pos + CH / 2) {   // no separator: at least never split a UTF-8 character
                e = end;
                while (e > pos + 1 && ((unsigned char)text[e] & 0xC0) == 0x80) e--;
            }
            end = e;
        }
        for (;;) {
            size_t room = cap - (size_t)nt;
            int r = sd_tokenize(t, text + pos, end - pos, 0, 0, buf + nt, room > INT32_MAX ? INT32_MAX : (int)room);
            if (r < 0) {
                free(buf);
                return sd_err(err, errlen, "datastore: tokenizing the corpus failed at byte %zu", pos);
            }
            if ((size_t)r <= room) {
                nt += r;
                break;
            }
            size_t ncap = cap * 2 + (size_t)r;
            int32_t *nb = realloc(buf, sizeof(int32_t) * ncap);
            if (!nb) {
                free(buf);
                return sd_err(err, errlen, "datastore: out of memory");
            }
            buf = nb;
            cap = ncap;
        }
        pos = end;
    }
    *tok = buf;
    *n = nt;
    return 0;
}

int sd_datastore_open(sd_datastore **out, const char *corpus_path, const sd_tokenizer *tok, char *err,
                      size_t errlen) {
    *out = NULL;
    FILE *f = fopen(corpus_path, "rb");
    if (!f) return sd_err(err, errlen, "datastore: cannot open corpus %s: %s", corpus_path, strerror(errno));
    struct stat stt;
    if (fstat(fileno(f), &stt) != 0 || stt.st_size <= 0) {
        fclose(f);
        return sd_err(err, errlen, "datastore: corpus %s is empty or unreadable", corpus_path);
    }
    size_t len = (size_t)stt.st_size;
    char *text = malloc(len + 1);
    if (!text || fread(text, 1, len, f) != len) {
        fclose(f);
        free(text);
        return sd_err(err, errlen, "datastore: cannot read corpus %s", corpus_path);
    }
    fclose(f);
    text[len] = 0;
    sd_datastore_key key;
    key.n_vocab = (uint32_t)sd_tokenizer_n_vocab(tok);
    key.vocab_hash = sd_vocab_hash(tok);
    key.corpus_size = (uint64_t)len;
    key.corpus_mtime = (int64_t)stt.st_mtime;
    key.corpus_hash = fnv(FNV_OFF, text, len);
    char path[4096], why[512];
    if (snprintf(path, sizeof path, "%s.sdsa", corpus_path) >= (int)sizeof path) {
        free(text);
        return sd_err(err, errlen, "datastore: path too long: %s", corpus_path);
    }
    sd_datastore *ds = NULL;
    struct stat st2;
    if (stat(path, &st2) != 0) snprintf(why, sizeof why, "no index yet");
    else if (sd_datastore_load(&ds, path, &key, why, sizeof why) == 0) {
        free(text);
        ds->rebuilt = 0;
        snprintf(ds->note, sizeof ds->note, "datastore: loaded %.400s (%lld tokens)", path, (long long)ds->n);
        *out = ds;
        return 0;
    }
    int32_t *toks = NULL;
    int64_t nt = 0;
    int rc = tokenize_corpus(tok, text, len, &toks, &nt, err, errlen);
    free(text);
    if (rc < 0) return rc;
    if (nt == 0) {
        free(toks);
        return sd_err(err, errlen, "datastore: corpus %s has no tokens", corpus_path);
    }
    rc = sd_datastore_from_tokens(&ds, toks, nt, &key, err, errlen);
    free(toks);
    if (rc < 0) return rc;
    char werr[512];
    if (sd_datastore_save(ds, path, werr, sizeof werr) < 0)
        snprintf(ds->note, sizeof ds->note, "datastore: indexed %lld tokens (%.200s); not saved: %.200s",
                 (long long)ds->n, why, werr);
    else
        snprintf(ds->note, sizeof ds->note, "datastore: indexed %lld tokens into %.200s (%.200s)", (long long)ds->n,
                 path, why);
    *out = ds;
    return 0;
}
