// test_suffix_index.c - the suffix index behind retrieval drafting
// (src/draft/suffix.c): the suffix array against brute force, the .sdsa file
// (round trip, rejection of bad files, rebuild) and the corpus datastore
// (built, loaded, rebuilt for another tokenizer, a corrupted index or a
// changed corpus). The n-gram drafter that uses it is tested by test_ngram_lookup.c.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "common.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "draft/suffix.h"
#include "t.h"

static char g_err[512];
static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

// ------------------------------------------------------------ suffix array
static const int32_t *g_bs;
static int64_t g_bn;
static int brute_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    while (x < g_bn && y < g_bn) {
        if (g_bs[x] != g_bs[y]) return g_bs[x] < g_bs[y] ? -1 : 1;
        x++, y++;
    }
    return x == g_bn ? (y == g_bn ? 0 : -1) : 1;   // the shorter (ended) suffix first
}

static int check_sa_case(const int32_t *s, int n, const char *what) {
    static int32_t sa[4096], ref[4096];
    int ok = 1;
    if (sd_sa_build(s, n, sa, g_err, sizeof g_err) < 0) {
        CHECK(0, "%s: %s", what, g_err);
        return 0;
    }
    for (int i = 0; i < n; i++) ref[i] = i;
    g_bs = s, g_bn = n;
    qsort(ref, (size_t)n, sizeof *ref, brute_cmp);
    for (int i = 0; i < n && ok; i++)
        if (sa[i] != ref[i]) {
            CHECK(0, "%s (n=%d): sa[%d] = %d, brute force %d", what, n, i, sa[i], ref[i]);
            ok = 0;
        }
    // Binary search finds exactly the occurrences.
    for (int q = 0; q < 20 && ok && n > 0; q++) {
        int32_t pat[6];
        int m = 1 + (int)(rnd() % 5);
        if (q % 2 == 0 && n >= m) {   // a pattern that occurs
            int st = (int)(rnd() % (uint32_t)(n - m + 1));
            memcpy(pat, s + st, sizeof(int32_t) * (size_t)m);
        } else {
            for (int j = 0; j < m; j++) pat[j] = s[rnd() % (uint32_t)n] + (int32_t)(rnd() % 2);
        }
        int64_t lo, hi;
        sd_sa_range(s, n, sa, pat, m, &lo, &hi);
        int cnt = 0;
        for (int p = 0; p + m <= n; p++) cnt += memcmp(s + p, pat, sizeof(int32_t) * (size_t)m) == 0;
        int inrange = 1;
        for (int64_t r = lo; r < hi; r++)
            inrange &= sa[r] + m <= n && memcmp(s + sa[r], pat, sizeof(int32_t) * (size_t)m) == 0;
        if (hi - lo != cnt || !inrange) {
            CHECK(0, "%s: pattern of %d: range %lld..%lld, %d occurrences", what, m, (long long)lo, (long long)hi, cnt);
            ok = 0;
        }
    }
    return ok;
}

static void test_sa_brute(void) {
    static int32_t s[4096];
    int cases = 0;
    for (int n = 0; n <= 300; n += (n < 20 ? 1 : 37)) {
        int alphas[] = {1, 2, 3, 50, 40000};
        for (int a = 0; a < 5; a++) {
            for (int i = 0; i < n; i++) s[i] = (int32_t)(rnd() % (uint32_t)alphas[a]);
            check_sa_case(s, n, alphas[a] == 1 ? "all-equal" : "random");
            cases++;
        }
        for (int i = 0; i < n; i++) s[i] = i % 3 == 2 ? 7 : 5;   // periodic
        check_sa_case(s, n, "periodic");
        for (int i = 0; i < n; i++) s[i] = (i / 5) % 2;          // runs
        check_sa_case(s, n, "runs");
        for (int i = 0; i < n; i++) s[i] = (int32_t)(n - i);     // decreasing
        check_sa_case(s, n, "decreasing");
        cases += 3;
    }
    int32_t neg[3] = {1, -2, 3}, sa[3];
    CHECK(sd_sa_build(neg, 3, sa, g_err, sizeof g_err) < 0 && strstr(g_err, "negative"), "negative id refused: %s",
          g_err);
    printf("  %d strings checked against a brute-force sort\n", cases);
}

// A large repetitive string indexes fast and is sorted (adjacent pairs checked).
static void test_sa_large(void) {
    int n = 1 << 20;
    int32_t *s = malloc(sizeof(int32_t) * (size_t)n), *sa = malloc(sizeof(int32_t) * (size_t)n);
    CHECK(s && sa, "oom");
    if (!s || !sa) goto out;
    // Zipf-like tokens with long repeated stretches.
    for (int i = 0; i < n; i++) {
        if (i > 5000 && rnd() % 100 < 30) {
            int back = 1 + (int)(rnd() % 5000), len = 10 + (int)(rnd() % 200);
            for (int j = 0; j < len && i < n; j++, i++) s[i] = s[i - back];
            i--;
            continue;
        }
        uint32_t r = rnd() % 1000;
        s[i] = (int32_t)(r * r / 20);
    }
    double t0 = sd_time_ms();
    CHECK(sd_sa_build(s, n, sa, g_err, sizeof g_err) == 0, "%s", g_err);
    double ms = sd_time_ms() - t0;
    g_bs = s, g_bn = n;
    int bad = 0;
    for (int r = 1; r < n && bad < 3; r++)
        if (brute_cmp(&sa[r - 1], &sa[r]) >= 0) {
            bad++;
            CHECK(0, "sa[%d] and sa[%d] out of order", r - 1, r);
        }
    printf("  %d tokens indexed in %.0f ms\n", n, ms);
    CHECK(ms < 20000, "indexing 1M tokens took %.0f ms", ms);
out:
    free(s);
    free(sa);
}

// ------------------------------------------------------------ .sdsa files
static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}
static size_t read_file(const char *path, unsigned char *buf, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, max, f);
    fclose(f);
    return n;
}

static void test_sdsa_file(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_suffix_%d.sdsa", (int)getpid());
    int32_t toks[500];
    for (int i = 0; i < 500; i++) toks[i] = (int32_t)(rnd() % 7);
    sd_datastore_key key = {320, 0x1234, 999, 1700000000, 0xABCD};
    sd_datastore *ds = NULL, *ld = NULL;
    CHECK(sd_datastore_from_tokens(&ds, toks, 500, &key, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!ds) return;
    CHECK(sd_datastore_save(ds, path, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_datastore_load(&ld, path, &key, g_err, sizeof g_err) == 0, "round trip: %s", g_err);
    if (ld) {
        CHECK(ld->n == 500 && !memcmp(ld->tok, ds->tok, sizeof toks) && !memcmp(ld->sa, ds->sa, sizeof toks),
              "round trip content");
        sd_datastore_free(ld);
    }
    static unsigned char orig[8192], buf[8192];
    size_t len = read_file(path, orig, sizeof orig);
    CHECK(len == 64 + 8 * 500, "file size %zu", len);
    struct {
        const char *what, *expect;
        size_t off;      // byte to flip (SIZE_MAX: truncate)
        int keyfield;    // 1: other vocabulary, 2: other corpus
    } cases[] = {
        {"bad magic", "bad magic", 0, 0},
        {"version", "version", 8, 0},
        {"payload byte", "checksum", 64 + 4 * 123, 0},
        {"suffix array byte", "checksum", 64 + 4 * 700, 0},
        {"truncated", "truncated", (size_t)-1, 0},
        {"other tokenizer", "different tokenizer", 0, 1},
        {"corpus changed", "corpus changed", 0, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        memcpy(buf, orig, len);
        size_t n = len;
        sd_datastore_key k2 = key;
        if (cases[c].keyfield == 1) k2.vocab_hash ^= 1;
        else if (cases[c].keyfield == 2) k2.corpus_mtime++;
        else if (cases[c].off == (size_t)-1) n -= 10;
        else buf[cases[c].off] ^= 0x5A;
        write_file(path, buf, n);
        ld = NULL;
        g_err[0] = 0;
        int rc = sd_datastore_load(&ld, path, &k2, g_err, sizeof g_err);
        CHECK(rc < 0 && !ld && strstr(g_err, cases[c].expect), "%s: rc %d, message '%s'", cases[c].what, rc, g_err);
        printf("  %-18s -> %s\n", cases[c].what, g_err);
        sd_datastore_free(ld);
    }
    remove(path);
    sd_datastore_free(ds);
}

// ------------------------------------------------------------ datastore
static sd_model *g_tgt, *g_other;
static sd_model *synth_model(uint64_t seed, int n_layer, int n_vocab, const char *tag) {
    synth_params p = synth_default_params();
    p.seed = seed;
    p.n_layer = n_layer;
    p.n_vocab = n_vocab;
    return sc_synth_model(&p, "suffix", tag, g_err, sizeof g_err);
}
static int need_models(void) {
    if (!g_tgt) g_tgt = synth_model(1234, 2, 320, "tgt");
    if (!g_other) g_other = synth_model(1, 1, 384, "other");
    return g_tgt && g_other;
}

// A corpus of synthetic-vocabulary words ("w<k>" pieces) with repeated phrases.
static void write_corpus(const char *path, uint64_t seed, int n_words) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint64_t r = seed;
    for (int i = 0; i < n_words; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int w = (int)((r >> 33) % 50);
        if (w < 10) fprintf(f, "w5 w6 w7 w8 w9 ");   // a frequent phrase
        else fprintf(f, "w%d ", w);
        if (i % 20 == 19) fprintf(f, "\n");
    }
    fclose(f);
}

static void test_datastore_open(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    char corpus[256], idx[300];
    snprintf(corpus, sizeof corpus, "/tmp/specdec_test_suffix_%d_corpus.txt", (int)getpid());
    snprintf(idx, sizeof idx, "%s.sdsa", corpus);
    remove(idx);
    write_corpus(corpus, 5, 3000);
    const sd_tokenizer *tok = sd_model_tokenizer(g_tgt);
    sd_datastore *ds = NULL;
    CHECK(sd_datastore_open(&ds, corpus, tok, g_err, sizeof g_err) == 0, "first open: %s", g_err);
    if (!ds) return;
    CHECK(ds->rebuilt == 1 && strstr(ds->note, "no index yet"), "first open builds: %s", ds->note);
    printf("  %s\n", ds->note);
    int64_t n0 = ds->n;
    // The index must equal tokenizing the corpus in one go (chunking is invisible here).
    static int32_t whole[65536];
    static char text[60000];
    FILE *f = fopen(corpus, "rb");
    size_t tl = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    int nw = sd_tokenize(tok, text, tl, 0, 0, whole, 65536);
    CHECK(nw == n0 && !memcmp(whole, ds->tok, sizeof(int32_t) * (size_t)SD_MAX(0, SD_MIN(nw, n0))),
          "corpus tokens %lld, whole-text tokens %d", (long long)n0, nw);
    sd_datastore_free(ds);
    ds = NULL;
    CHECK(sd_datastore_open(&ds, corpus, tok, g_err, sizeof g_err) == 0 && ds && ds->rebuilt == 0 && ds->n == n0,
          "second open loads: %s", ds ? ds->note : g_err);
    if (ds) printf("  %s\n", ds->note);
    sd_datastore_free(ds);
    ds = NULL;
    // Another tokenizer: rejected and rebuilt.
    CHECK(sd_datastore_open(&ds, corpus, sd_model_tokenizer(g_other), g_err, sizeof g_err) == 0 && ds &&
              ds->rebuilt == 1 && strstr(ds->note, "different tokenizer"),
          "other tokenizer rebuilds: %s", ds ? ds->note : g_err);
    if (ds) printf("  %s\n", ds->note);
    sd_datastore_free(ds);
    ds = NULL;
    CHECK(sd_datastore_open(&ds, corpus, tok, g_err, sizeof g_err) == 0 && ds && ds->rebuilt == 1, "back: %s", g_err);
    sd_datastore_free(ds);
    ds = NULL;
    // Corrupted file: rebuilt.
    static unsigned char buf[1 << 20];
    size_t len = read_file(idx, buf, sizeof buf);
    CHECK(len > 1000, "index size %zu", len);
    buf[len - 7] ^= 1;
    write_file(idx, buf, len);
    CHECK(sd_datastore_open(&ds, corpus, tok, g_err, sizeof g_err) == 0 && ds && ds->rebuilt == 1 &&
              strstr(ds->note, "checksum"),
          "corrupted index rebuilds: %s", ds ? ds->note : g_err);
    if (ds) printf("  %s\n", ds->note);
    sd_datastore_free(ds);
    ds = NULL;
    // Changed corpus: rebuilt.
    write_corpus(corpus, 6, 2000);
    CHECK(sd_datastore_open(&ds, corpus, tok, g_err, sizeof g_err) == 0 && ds && ds->rebuilt == 1 &&
              strstr(ds->note, "corpus changed"),
          "changed corpus rebuilds: %s", ds ? ds->note : g_err);
    if (ds) printf("  %s\n", ds->note);
    sd_datastore_free(ds);
    ds = NULL;
    // Garbage file: rebuilt.
    write_file(idx, "hello", 5);
    CHECK(sd_datastore_open(&ds, corpus, tok, g_err, sizeof g_err) == 0 && ds && ds->rebuilt == 1,
          "garbage index rebuilds: %s", ds ? ds->note : g_err);
    if (ds) printf("  %s\n", ds->note);
    sd_datastore_free(ds);
    ds = NULL;
    CHECK(sd_datastore_open(&ds, "/nonexistent/corpus.txt", tok, g_err, sizeof g_err) < 0 && strstr(g_err, "corpus"),
          "missing corpus: %s", g_err);
    remove(idx);
    remove(corpus);
}

int main(void) {
    T_RUN(test_sa_brute);
    T_RUN(test_sa_large);
    T_RUN(test_sdsa_file);
    T_RUN(test_datastore_open);
    sd_model_free(g_tgt);
    sd_model_free(g_other);
    T_EXIT();
}
