// test_train_loop.c - the feature cache and the training loop of `specdec
// train-head` (src/train/cache*.c, corpus.c, ckpt.c, loop*.c) on tiny
// synthetic models and stories260K: the cache holds what the target computes
// (tokens, states, top-k), is split into windows, resumes after a stop, cuts
// a torn tail and refuses a foreign target, other layers or other data;
// corpus errors name file and line; a stopped and resumed run ends with the
// same parameters, bit for bit, as one never interrupted; a full disk keeps
// the previous checkpoint; foreign or mismatched checkpoints are refused; a
// short run on stories260K raises the held-back agreement; the command's
// help, errors and Ctrl-C.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "specdec.h"
#include "specdec_train.h"
#include "common.h"
#include "head/head.h"
#include "lib/cli_run.h"
#include "lib/synth.h"
#include "model/llama2c.h"
#include "model/model.h"
#include "t.h"
#include "train/cache.h"
#include "train/ckpt.h"
#include "train/corpus.h"
#include "train/train.h"

static char g_err[1024];
static char g_tmp[256];   // this run's scratch directory

// ---------------------------------------------------------------- files and models
static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", g_tmp, name); }

static void rm_rf(const char *p) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) {
    }
}

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

static long file_len(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

// 1 if the two files have the same bytes.
static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) same = 0;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static int same_cache(const char *a, const char *b) {
    static const char *files[] = {"header.bin", "index.bin", "tokens.bin", "top_ids.bin", "top_p.bin", "feats.bin"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char pa[512], pb[512];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        if (!same_file(pa, pb)) {
            printf("  %s differs\n", files[i]);
            return 0;
        }
    }
    return 1;
}

static sd_model *synth_model(int n_embd, int n_layer, uint64_t seed) {
    synth_params p = synth_default_params();
    p.n_embd = n_embd;
    p.n_ff = 2 * n_embd;
    p.n_layer = n_layer;
    p.seed = seed;
    char path[512];
    snprintf(path, sizeof path, "%s/synth_%d_%d_%llu.gguf", g_tmp, n_embd, n_layer, (unsigned long long)seed);
    sd_model *m = NULL;
    if (synth_write(path, &p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

// A corpus of n text records of random synthetic words ("w12 w7 ..."), record
// i with 3 + (i * 7) % len_spread words; one chat record when chat.
static void write_corpus(const char *path, int n, int len_spread, uint64_t seed, int chat) {
    FILE *f = fopen(path, "wb");
    sd_rng r;
    sd_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"id\": \"r%d\", \"source\": \"test\", \"text\": \"", i);
        int nw = 3 + (i * 7) % len_spread;
        for (int w = 0; w < nw; w++) fprintf(f, "%sw%d", w ? " " : "", (int)(sd_rng_next(&r) % 60));
        fprintf(f, "\"}\n");
        if (i == 1) fprintf(f, "\n");   // a blank line is skipped
    }
    if (chat) fprintf(f, "{\"id\": \"c\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    fclose(f);
}

static sd_cache_params eagle_params(const sd_model *m, int topk, int n_ctx) {
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_EAGLE3);
    sd_cache_params cp = sd_cache_default_params();
    cp.type = SD_HEAD_EAGLE3;
    memcpy(cp.extract, hp.extract, sizeof cp.extract);
    cp.topk = topk;
    cp.n_ctx = n_ctx;
    return cp;
}

// Stops a build after stop_after records (progress callback).
typedef struct stopper {
    volatile sig_atomic_t flag;
    int64_t stop_after;
} stopper;

static void stop_cb(void *user, const sd_cache_progress *p) {
    stopper *s = user;
    if (s->stop_after >= 0 && p->records >= s->stop_after) s->flag = 1;
}

static int build(const char *dir, const sd_model *m, const sd_cache_params *cp, const char *data, stopper *st,
                 char *note, size_t notelen) {
    sd_cache *c;
    if (sd_cache_open(&c, dir, m, cp, note, notelen, g_err, sizeof g_err) < 0) return -100;
    sd_cache_build_params bp = {.n_batch = 8, .stop = st ? &st->flag : NULL, .progress = st ? stop_cb : NULL,
                                .user = st};
    const char *paths[1] = {data};
    int r = sd_cache_build(c, m, paths, 1, &bp, g_err, sizeof g_err);
    sd_cache_close(c);
    return r;
}

// ---------------------------------------------------------------- the cache
// Every position of every window holds the record's token, the target's
// states at the extract layers (F16 of the forward's rows, bit for bit) and
// its top-k (argmax first, descending, probabilities summing to 1); records
// longer than the window are split, each window run from an empty cache.
static void test_cache_matches_target(void) {
    sd_model *m = synth_model(64, 4, 1);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char data[512], dir[512];
    path_in(data, sizeof data, "match.jsonl");
    path_in(dir, sizeof dir, "match.cache");
    write_corpus(data, 6, 40, 7, 0);
    const int W = 16, K = 4;
    sd_cache_params cp = eagle_params(m, K, W);
    int r = build(dir, m, &cp, data, NULL, NULL, 0);
    CHECK(r == 0, "build: %d %s", r, g_err);
    sd_cache *c = NULL;
    if (r != 0 || sd_cache_open(&c, dir, m, &cp, NULL, 0, g_err, sizeof g_err) < 0) {
        CHECK(0, "open: %s", g_err);
        sd_model_free(m);
        return;
    }
    CHECK(sd_cache_n_records(c) == 6, "records %lld", (long long)sd_cache_n_records(c));
    CHECK(sd_cache_n_feat(c) == 3 * 64, "n_feat %d", sd_cache_n_feat(c));
    int64_t n_seq;
    const sd_cache_seq *sq = sd_cache_seqs(c, &n_seq);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = W;
    sp.n_batch = W;
    sp.n_threads = 1;
    sd_session *s = NULL;
    CHECK(sd_session_new(&s, m, &sp, g_err, sizeof g_err) == 0, "session: %s", g_err);
    sd_corpus *cr = NULL;
    CHECK(sd_corpus_open(&cr, data, g_err, sizeof g_err) == 0, "corpus: %s", g_err);
    sd_corpus_rec rec;
    int32_t ids[256], tok[64], top[64 * K];
    float feats[64 * 192], p[64 * K], hid[64 * 192];
    int64_t e = 0, positions = 0, windows_split = 0, bad_feat = 0, bad_top = 0;
    for (int rno = 0; s && cr && sd_corpus_next(cr, &rec, 1, g_err, sizeof g_err) == 1; rno++) {
        int n = sd_tokenize(sd_model_tokenizer(m), rec.text, strlen(rec.text), 1, 0, ids, 256);
        for (int off = 0; off < n; off += W, e++) {
            const int T = n - off < W ? n - off : W;
            CHECK(e < n_seq && sq[e].record == (uint32_t)rno && sq[e].T == T, "entry %lld: record %u T %d (want %d %d)",
                  (long long)e, e < n_seq ? sq[e].record : 0, e < n_seq ? sq[e].T : 0, rno, T);
            if (e >= n_seq) break;
            windows_split += off > 0;
            CHECK(sd_cache_read(c, e, 0, T, tok, feats, top, p, g_err, sizeof g_err) == 0, "read: %s", g_err);
            CHECK(!memcmp(tok, ids + off, sizeof(int32_t) * (size_t)T), "record %d window at %d: tokens differ", rno, off);
            sd_session_truncate(s, 0, g_err, sizeof g_err);
            sd_batch b = {.n = T, .tokens = ids + off, .hidden_layers = cp.extract, .n_hidden_layers = 3,
                          .hidden_out = hid};
            CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) == 0, "forward: %s", g_err);
            for (int t = 0; t < T; t++) {
                for (int i = 0; i < 192; i++)
                    bad_feat += feats[t * 192 + i] != sd_fp16_to_fp32(sd_fp32_to_fp16(hid[t * 192 + i]));
                const float *l = sd_session_logits(s, t);
                int am = 0;
                for (int v = 1; v < m->hp.n_vocab; v++)
                    if (l[v] > l[am]) am = v;
                double sum = 0;
                for (int k = 0; k < K; k++) {
                    sum += p[t * K + k];
                    if (k && (l[top[t * K + k]] > l[top[t * K + k - 1]] || p[t * K + k] > p[t * K + k - 1])) bad_top++;
                }
                if (top[t * K] != am || fabs(sum - 1.0) > 4e-3) bad_top++;
            }
            positions += T;
        }
    }
    CHECK(e == n_seq, "%lld windows expected, the cache has %lld", (long long)e, (long long)n_seq);
    CHECK(positions == sd_cache_n_positions(c), "positions %lld vs %lld", (long long)positions,
          (long long)sd_cache_n_positions(c));
    CHECK(windows_split >= 2, "the corpus should have records longer than a window (%lld)", (long long)windows_split);
    CHECK(bad_feat == 0, "%lld state values differ from the forward's rows", (long long)bad_feat);
    CHECK(bad_top == 0, "%lld top-k rows wrong", (long long)bad_top);
    // the argmax counts are the top_ids' first entries
    int64_t counts[320] = {0}, total = 0;
    CHECK(sd_cache_argmax_counts(c, NULL, 0, counts, g_err, sizeof g_err) == 0, "counts: %s", g_err);
    for (int v = 0; v < 320; v++) total += counts[v];
    CHECK(total == positions, "argmax counts sum to %lld, not %lld", (long long)total, (long long)positions);
    sd_corpus_close(cr);
    sd_session_free(s);
    sd_cache_close(c);
    sd_model_free(m);
}

// A build stopped after two records keeps exactly them and resumes to the
// same bytes as a build in one go; a torn tail (partial index entry, data
// past the last record, data missing or corrupted under the last record, an
// unfinished record's entries) is cut at open and the rebuild restores the
// same bytes.
static void test_cache_resume_and_torn_tail(void) {
    sd_model *m = synth_model(64, 4, 1);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char data[512], a[512], b[512], f[600], note[512];
    path_in(data, sizeof data, "resume.jsonl");
    path_in(a, sizeof a, "resume_a.cache");
    path_in(b, sizeof b, "resume_b.cache");
    write_corpus(data, 6, 40, 11, 0);
    sd_cache_params cp = eagle_params(m, 4, 16);
    CHECK(build(a, m, &cp, data, NULL, NULL, 0) == 0, "one go: %s", g_err);
    stopper st = {.flag = 0, .stop_after = 2};
    int r = build(b, m, &cp, data, &st, NULL, 0);
    CHECK(r == 1, "a stopped build returns 1, got %d (%s)", r, g_err);
    sd_cache *c = NULL;
    CHECK(sd_cache_open(&c, b, m, &cp, note, sizeof note, g_err, sizeof g_err) == 0, "open: %s", g_err);
    CHECK(c && sd_cache_n_records(c) == 2, "after the stop: %lld records", c ? (long long)sd_cache_n_records(c) : -1);
    CHECK(note[0] == 0, "nothing to cut after a clean stop: %s", note);
    sd_cache_close(c);
    CHECK(build(b, m, &cp, data, NULL, NULL, 0) == 0, "resumed: %s", g_err);
    CHECK(same_cache(a, b), "a resumed build differs from one in one go");

    struct { const char *file; long delta; int flip; int64_t records_after; const char *what; } cuts[] = {
        {"index.bin", +20, 0, 6, "a partial index entry"},
        {"feats.bin", +100, 0, 6, "data past the last record"},
        {"feats.bin", -10, 0, 5, "data missing under the last record"},
        {"top_p.bin", 0, 1, 5, "a corrupted last record"},
        {"index.bin", -48, 0, 5, "the entries of an unfinished record"},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        snprintf(f, sizeof f, "%s/%s", b, cuts[i].file);
        long len = file_len(f);
        if (cuts[i].delta > 0) {
            FILE *fp = fopen(f, "ab");
            for (long k = 0; k < cuts[i].delta; k++) fputc(0x5a, fp);
            fclose(fp);
        } else if (cuts[i].delta < 0) {
            CHECK(truncate(f, len + cuts[i].delta) == 0, "truncate");
        } else {
            FILE *fp = fopen(f, "r+b");
            fseek(fp, len - 1, SEEK_SET);
            int ch = fgetc(fp);
            fseek(fp, len - 1, SEEK_SET);
            fputc(ch ^ 0x40, fp);
            fclose(fp);
        }
        c = NULL;
        CHECK(sd_cache_open(&c, b, m, &cp, note, sizeof note, g_err, sizeof g_err) == 0, "%s: open: %s", cuts[i].what,
              g_err);
        CHECK(c && sd_cache_n_records(c) == cuts[i].records_after, "%s: %lld records kept, want %lld", cuts[i].what,
              c ? (long long)sd_cache_n_records(c) : -1, (long long)cuts[i].records_after);
        CHECK(strstr(note, "torn tail"), "%s: the note says what was cut: '%s'", cuts[i].what, note);
        sd_cache_close(c);
        CHECK(build(b, m, &cp, data, NULL, NULL, 0) == 0, "%s: rebuild: %s", cuts[i].what, g_err);
        CHECK(same_cache(a, b), "%s: the rebuilt cache differs", cuts[i].what);
    }
    sd_model_free(m);
}

// A cache is refused for another target, other layers, another head type,
// another top-k, another window, and other data, each with a message saying so.
static void test_cache_refuses_foreign(void) {
    sd_model *m = synth_model(64, 4, 1), *m2 = synth_model(32, 4, 1);
    CHECK(m && m2, "synthetic models: %s", g_err);
    if (!m || !m2) {
        sd_model_free(m);
        sd_model_free(m2);
        return;
    }
    char data[512], other[512], fewer[512], dir[512];
    path_in(data, sizeof data, "foreign.jsonl");
    path_in(other, sizeof other, "other.jsonl");
    path_in(fewer, sizeof fewer, "fewer.jsonl");
    path_in(dir, sizeof dir, "foreign.cache");
    write_corpus(data, 4, 10, 3, 0);
    write_corpus(other, 4, 10, 4, 0);
    write_corpus(fewer, 2, 10, 3, 0);
    sd_cache_params cp = eagle_params(m, 4, 16);
    CHECK(build(dir, m, &cp, data, NULL, NULL, 0) == 0, "build: %s", g_err);
    sd_cache_params c2 = eagle_params(m2, 4, 16);
    CHECK(build(dir, m2, &c2, data, NULL, NULL, 0) == -100 && strstr(g_err, "another target") &&
              strstr(g_err, "hidden size 64"),
          "another target: %s", g_err);
    sd_cache_params cl = cp;
    cl.extract[0] = 0;
    CHECK(build(dir, m, &cl, data, NULL, NULL, 0) == -100 && strstr(g_err, "layers"), "other layers: %s", g_err);
    sd_cache_params cm = cp;
    cm.type = SD_HEAD_MEDUSA;
    CHECK(build(dir, m, &cm, data, NULL, NULL, 0) == -100 && strstr(g_err, "Medusa"), "medusa: %s", g_err);
    sd_cache_params ck = cp;
    ck.topk = 2;
    CHECK(build(dir, m, &ck, data, NULL, NULL, 0) == -100 && strstr(g_err, "top"), "topk: %s", g_err);
    sd_cache_params cw = cp;
    cw.n_ctx = 32;
    CHECK(build(dir, m, &cw, data, NULL, NULL, 0) == -100 && strstr(g_err, "windows"), "window: %s", g_err);
    CHECK(build(dir, m, &cp, other, NULL, NULL, 0) < 0 && strstr(g_err, "other data") && strstr(g_err, "other.jsonl:1"),
          "other data: %s", g_err);
    CHECK(build(dir, m, &cp, fewer, NULL, NULL, 0) < 0 && strstr(g_err, "holds 4 records"), "fewer records: %s", g_err);
    CHECK(build(dir, m, &cp, data, NULL, NULL, 0) == 0, "the right data is still fine: %s", g_err);
    sd_model_free(m);
    sd_model_free(m2);
}

// Corpus errors name the file (and line, column); the records before a bad
// line stay cached.
static void test_corpus_errors(void) {
    sd_model *m = synth_model(64, 4, 1);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char dir[512], bad[512], missing[512];
    path_in(dir, sizeof dir, "errors.cache");
    path_in(bad, sizeof bad, "bad.jsonl");
    path_in(missing, sizeof missing, "absent.jsonl");
    sd_cache_params cp = eagle_params(m, 4, 16);
    CHECK(build(dir, m, &cp, missing, NULL, NULL, 0) < 0 && strstr(g_err, "not found") && strstr(g_err, missing),
          "missing file: %s", g_err);
    struct { const char *third; const char *want; } cases[] = {
        {"{\"text\": \"w1 w2\"", "bad.jsonl:3: expected ',' or '}' at column 17"},
        {"{\"id\": 3}", "bad.jsonl:3: the record has neither \"text\" nor \"messages\""},
        {"{\"text\": 7}", "bad.jsonl:3: \"text\" is not a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": null}]}", "messages[0].content is not a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "bad.jsonl:3: cannot format the messages"},
        {"{\"text\": \"a\\x\"}", "bad.jsonl:3: bad escape"},
        {"[1, 2]", "bad.jsonl:3: expected '{'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"text\": \"w1 w2 w3\"}\n{\"text\": \"w4 \\u00e9 \\ud83d\\ude00 w5\", \"x\": [1, {\"y\": null}]}\n%s\n",
                 cases[i].third);
        write_file(bad, text);
        rm_rf(dir);
        int r = build(dir, m, &cp, bad, NULL, NULL, 0);
        CHECK(r < 0 && strstr(g_err, cases[i].want), "case %zu: got %d '%s', want '%s'", i, r, g_err, cases[i].want);
    }
    // every line is read before the target runs: nothing was cached
    sd_cache *c = NULL;
    CHECK(sd_cache_open(&c, dir, m, &cp, NULL, 0, g_err, sizeof g_err) == 0, "open: %s", g_err);
    if (c) CHECK(sd_cache_n_records(c) == 0, "records %lld", (long long)sd_cache_n_records(c));
    sd_cache_close(c);
    sd_model_free(m);
}

// stories260K converted to GGUF in the scratch directory (once), or NULL with why.
static const char *stories_path(char *why, size_t n) {
    static char gguf[512];
    if (gguf[0]) return gguf;
    const char *sh = t_shared_dir();
    if (!sh) {
        snprintf(why, n, "../shared/models (stories260K) is absent; set SD_SHARED");
        return NULL;
    }
    char ckpt[512], tokp[512];
    snprintf(ckpt, sizeof ckpt, "%s/models/stories260K.bin", sh);
    snprintf(tokp, sizeof tokp, "%s/models/tok512.bin", sh);
    path_in(gguf, sizeof gguf, "stories.gguf");
    if (sd_llama2c_convert(ckpt, tokp, gguf, g_err, sizeof g_err) < 0) {
        snprintf(why, n, "stories260K: %.200s", g_err);
        gguf[0] = 0;
        return NULL;
    }
    return gguf;
}

// stories260K (text records only: it has no chat template): a Medusa cache
// holds the final normed state (n_feat = d) of every position.
static void test_cache_stories(void) {
    char why[256], data[512], dir[512];
    const char *gguf = stories_path(why, sizeof why);
    if (!gguf) SKIP("%s", why);
    path_in(data, sizeof data, "stories.jsonl");
    path_in(dir, sizeof dir, "stories.cache");
    sd_model *m = NULL;
    sd_model_load(&m, gguf, g_err, sizeof g_err);
    CHECK(m, "stories260K: %s", g_err);
    if (!m) return;
    write_file(data, "{\"text\": \"Once upon a time, there was a little girl named Lily.\"}\n"
                     "{\"text\": \"She loved to play outside in the park.\", \"source\": \"x\"}\n");
    sd_cache_params cp = sd_cache_default_params();
    cp.type = SD_HEAD_MEDUSA;
    CHECK(build(dir, m, &cp, data, NULL, NULL, 0) == 0, "build: %s", g_err);
    sd_cache *c = NULL;
    CHECK(sd_cache_open(&c, dir, m, &cp, NULL, 0, g_err, sizeof g_err) == 0, "open: %s", g_err);
    if (c) {
        CHECK(sd_cache_n_feat(c) == m->hp.n_embd, "n_feat %d", sd_cache_n_feat(c));
        int32_t ids[64];
        int n = sd_tokenize(sd_model_tokenizer(m), "Once upon a time, there was a little girl named Lily.", 53, 1, 0,
                            ids, 64);
        int32_t tok[64];
        CHECK(sd_cache_read(c, 0, 0, n, tok, NULL, NULL, NULL, g_err, sizeof g_err) == 0 &&
                  !memcmp(tok, ids, sizeof(int32_t) * (size_t)n),
              "the first record's tokens");
        int32_t top[8];
        // the model continues its own story: after "Once upon a" comes " time"
        CHECK(sd_cache_read(c, 0, 3, 1, NULL, NULL, top, NULL, g_err, sizeof g_err) == 0 && top[0] == ids[4],
              "the target's argmax after 'Once upon a' is the text's next token (%d vs %d)", top[0], ids[4]);
    }
    sd_cache_close(c);
    sd_model_free(m);
}

// ---------------------------------------------------------------- the loop
typedef struct watch {
    volatile sig_atomic_t flag;
    int64_t stop_at;          // set the stop flag after this step (-1: never)
    int64_t limit_after_ckpt; // lower RLIMIT_FSIZE once the checkpoint of this step is written (-1: never)
    int saw_stop_note, saw_fail_note, n_steps_seen;
    long ckpt_bytes;
} watch;

static void on_progress(void *user, const sd_train_progress *p) {
    watch *w = user;
    if (p->phase == SD_TRAIN_PHASE_STEP) {
        w->n_steps_seen++;
        if (w->stop_at >= 0 && p->step == w->stop_at) w->flag = 1;
    }
    if (p->phase != SD_TRAIN_PHASE_NOTE) return;
    if (strstr(p->note, "stopped at step")) w->saw_stop_note = 1;
    if (strstr(p->note, "failed") && strstr(p->note, "training goes on")) w->saw_fail_note = 1;
    char want[64];
    snprintf(want, sizeof want, "written at step %lld", (long long)w->limit_after_ckpt);
    if (w->limit_after_ckpt >= 0 && strstr(p->note, want)) {
        struct rlimit rl = {.rlim_cur = 4096, .rlim_max = 4096};
        signal(SIGXFSZ, SIG_IGN);   // a write past the limit then fails with EFBIG instead of killing
        setrlimit(RLIMIT_FSIZE, &rl);
    }
}

static const char *g_data[1];

static sd_train_head_params small_run(const sd_model *m, const char *tag, watch *w) {
    static char out[8][512], ckpt[8][512], cache[512];
    static int k;
    k = (k + 1) % 8;
    snprintf(out[k], sizeof out[k], "%s/%s.gguf", g_tmp, tag);
    snprintf(ckpt[k], sizeof ckpt[k], "%s/%s.ckpt", g_tmp, tag);
    path_in(cache, sizeof cache, "loop.cache");
    sd_train_head_params p = sd_train_head_default_params();
    p.model = m;
    p.data_paths = g_data;
    p.n_data = 1;
    p.cache_dir = cache;
    p.out_path = out[k];
    p.ckpt_path = ckpt[k];
    p.out_type = SD_TRAIN_OUT_F32;
    p.draft_vocab = 64;
    p.ttt_steps = 2;
    p.seq_len = 8;
    p.batch = 2;
    p.tokens = 8 * 2 * 8;   // 8 steps or a few more (sequences at the ends of records are shorter)
    p.lr = 1e-2f;
    p.warmup = 2;
    p.n_threads = 2;
    p.ckpt_minutes = 0;
    p.heldout = 0.2;
    p.eval_every = 3;
    p.topk = 4;
    p.n_ctx = 16;
    p.n_batch = 8;
    p.stop = &w->flag;
    p.progress = on_progress;
    p.user = w;
    return p;
}

static sd_head *load_head(const char *path, const sd_model *m) {
    sd_head *h = NULL;
    if (sd_head_load(&h, path, m, g_err, sizeof g_err) < 0) return NULL;
    return h;
}

static int same_params(const sd_head *a, const sd_head *b) {
    return a && b && a->n_w == b->n_w && !memcmp(a->w, b->w, a->n_w * sizeof(float)) &&
           a->hp.n_draft_vocab == b->hp.n_draft_vocab &&
           !memcmp(a->d2t, b->d2t, sizeof(int32_t) * (size_t)a->hp.n_draft_vocab);
}

// N steps in one run give the same parameters, bit for bit, as N/2 steps,
// a stop (the flag: a checkpoint is written, no head), and a resumed run of
// the rest; another seed gives other parameters.
static void test_resume_bit_identical(void) {
    sd_model *m = synth_model(64, 4, 1);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w0 = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params pa = small_run(m, "whole", &w0);
    sd_train_head_result ra;
    int r = sd_train_head(&pa, &ra, g_err, sizeof g_err);
    CHECK(r == 0 && !ra.stopped && ra.n_steps >= 8 && ra.step == ra.n_steps && w0.n_steps_seen == ra.n_steps,
          "uninterrupted: %d step %lld of %lld %s", r, (long long)ra.step, (long long)ra.n_steps, g_err);
    CHECK(ra.draft_vocab == 64 && ra.coverage > 0 && ra.coverage <= 1, "vocabulary %d coverage %g", ra.draft_vocab,
          ra.coverage);
    CHECK(ra.eval_tokens > 0, "the held-back split was evaluated");

    watch w1 = {.stop_at = 4, .limit_after_ckpt = -1};
    sd_train_head_params pb = small_run(m, "halves", &w1);
    sd_train_head_result rb;
    r = sd_train_head(&pb, &rb, g_err, sizeof g_err);
    CHECK(r == 1 && rb.stopped && rb.step == 4, "stopped: %d step %lld %s", r, (long long)rb.step, g_err);
    CHECK(w1.saw_stop_note, "the stop is reported");
    CHECK(file_len(pb.out_path) < 0, "no head is written at a stop");
    sd_head *hc = NULL;
    sd_adamw oc;
    sd_ckpt_recipe rc;
    sd_ckpt_state sc;
    CHECK(sd_ckpt_load(pb.ckpt_path, m, &hc, &oc, &rc, &sc, g_err, sizeof g_err) == 0 && sc.step == 4 && oc.t == 4,
          "the checkpoint holds step 4: %s", g_err);
    if (hc) {
        sd_head_free(hc);
        sd_adamw_free(&oc);
    }
    watch w2 = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params pc = small_run(m, "halves", &w2);
    pc.resume = 1;
    r = sd_train_head(&pc, &rb, g_err, sizeof g_err);
    CHECK(r == 0 && rb.step == ra.n_steps && w2.n_steps_seen == ra.n_steps - 4,
          "resumed: %d step %lld (%d steps run) %s", r, (long long)rb.step, w2.n_steps_seen, g_err);
    sd_head *ha = load_head(pa.out_path, m), *hb = load_head(pc.out_path, m);
    CHECK(ha && hb, "heads load: %s", g_err);
    CHECK(same_params(ha, hb), "resumed parameters differ from the uninterrupted run's");
    char steps[32];
    snprintf(steps, sizeof steps, "steps=%lld\n", (long long)ra.n_steps);
    CHECK(ha && strstr(ha->note, steps) && strstr(ha->note, "seed=42"), "the recipe note: %s", ha ? ha->note : "");

    watch w3 = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params pd = small_run(m, "seed43", &w3);
    pd.seed = 43;
    CHECK(sd_train_head(&pd, NULL, g_err, sizeof g_err) == 0, "seed 43: %s", g_err);
    sd_head *hd = load_head(pd.out_path, m);
    CHECK(hd && !same_params(ha, hd), "another seed gives other parameters (the comparison means something)");
    sd_head_free(ha);
    sd_head_free(hb);
    sd_head_free(hd);
    sd_model_free(m);
}

// A full disk (a file size limit) while writing a checkpoint keeps the
// previous one intact and leaves no temporary; training goes on, and the
// final head, which cannot be written either, is an error.
static void test_full_disk_keeps_checkpoint(void) {
    sd_model *m = synth_model(64, 4, 1);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w = {.stop_at = -1, .limit_after_ckpt = 2};
    sd_train_head_params p = small_run(m, "fulldisk", &w);
    p.ckpt_every = 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int r = sd_train_head(&p, NULL, g_err, sizeof g_err);
        int ok = r < 0 && w.saw_fail_note && (strstr(g_err, "File too large") || strstr(g_err, "write"));
        if (!ok) printf("  child: r %d, fail note %d, '%s'\n", r, w.saw_fail_note, g_err);
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child saw the checkpoint fail and the head save fail");
    sd_head *h = NULL;
    sd_adamw o;
    sd_ckpt_recipe rc;
    sd_ckpt_state sc;
    CHECK(sd_ckpt_load(p.ckpt_path, m, &h, &o, &rc, &sc, g_err, sizeof g_err) == 0 && sc.step == 2,
          "the checkpoint of step 2 is intact: %s (step %lld)", g_err, h ? (long long)sc.step : -1);
    if (h) {
        sd_head_free(h);
        sd_adamw_free(&o);
    }
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", p.ckpt_path);
    CHECK(file_len(tmp) < 0, "no checkpoint temporary is left behind");
    snprintf(tmp, sizeof tmp, "%s.tmp", p.out_path);
    CHECK(file_len(tmp) < 0 && file_len(p.out_path) < 0, "no head file nor temporary");
    sd_model_free(m);
}

// Checkpoints and runs that do not fit are refused with a message: another
// target, other settings, an existing checkpoint without --resume, --resume
// without one, a missing data file.
static void test_refusals(void) {
    sd_model *m = synth_model(64, 4, 1), *m2 = synth_model(32, 4, 1);
    CHECK(m && m2, "synthetic models: %s", g_err);
    if (!m || !m2) {
        sd_model_free(m);
        sd_model_free(m2);
        return;
    }
    watch w = {.stop_at = 2, .limit_after_ckpt = -1};
    sd_train_head_params p = small_run(m, "refuse", &w);
    CHECK(sd_train_head(&p, NULL, g_err, sizeof g_err) == 1, "a stopped run: %s", g_err);
    w.stop_at = -1;
    w.flag = 0;
    sd_train_head_params q = p;
    q.resume = 1;
    q.model = m2;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "belongs to another target") &&
              strstr(g_err, "hidden size"),
          "another target: %s", g_err);
    q = p;
    q.resume = 1;
    q.seq_len = 16;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--seq-len 8") && strstr(g_err, "16"),
          "other settings: %s", g_err);
    q = p;
    q.resume = 1;
    q.type = SD_TRAIN_MEDUSA;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "EAGLE-3"), "other type: %s", g_err);
    q = p;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "exists") && strstr(g_err, "--resume"),
          "an existing checkpoint: %s", g_err);
    q = small_run(m, "nockpt", &w);
    q.resume = 1;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "no checkpoint"), "nothing to resume: %s",
          g_err);
    q = small_run(m, "nodata", &w);
    const char *absent[1] = {"/nonexistent/dir/data.jsonl"};
    q.data_paths = absent;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "not found") &&
              strstr(g_err, "/nonexistent/dir/data.jsonl"),
          "missing data: %s", g_err);
    // a head of another target as --init
    q = small_run(m2, "init", &w);
    q.init_path = p.ckpt_path;   // not a head at all
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--init"), "a bad --init: %s", g_err);
    sd_model_free(m);
    sd_model_free(m2);
}

// A corpus of a few lines of stories for stories260K.
static void stories_corpus(const char *path, int copies) {
    static const char *lines[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
        "One day, she saw a big, red ball. She wanted to play with it, but it was too high.",
        "Tom and his mom went to the store. They bought apples, bread and a toy car for Tom.",
        "The cat was sleepy. It found a warm spot in the sun and closed its eyes.",
    };
    FILE *f = fopen(path, "wb");
    for (int c = 0; c < copies; c++)
        for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
            fprintf(f, "{\"id\": \"%d-%zu\", \"source\": \"test\", \"text\": \"%s\"}\n", c, i, lines[i]);
    fclose(f);
}

// Evaluations seen by a run.
typedef struct evals {
    int n;
    double loss[64], agree0[64];
} evals;

static void on_eval(void *user, const sd_train_progress *p) {
    evals *e = user;
    if (p->phase == SD_TRAIN_PHASE_EVAL && e->n < 64) {
        e->loss[e->n] = p->eval_loss;
        e->agree0[e->n++] = p->eval_agree[0];
    }
}

// stories260K learns: over 40 steps the held-back loss falls and the top-1
// agreement of the first training-time-test step rises well above where it
// started (the loop feeds the trainer the cache's aligned data and applies
// its gradients).
static void test_learns_stories(void) {
    char why[256], data[512], cache[512], out[512], ckpt[512];
    const char *gguf = stories_path(why, sizeof why);
    if (!gguf) SKIP("%s", why);
    sd_model *m = NULL;
    sd_model_load(&m, gguf, g_err, sizeof g_err);
    CHECK(m, "stories260K: %s", g_err);
    if (!m) return;
    path_in(data, sizeof data, "learn.jsonl");
    path_in(cache, sizeof cache, "learn.cache");
    path_in(out, sizeof out, "learn.gguf");
    path_in(ckpt, sizeof ckpt, "learn.ckpt");
    stories_corpus(data, 16);
    const char *paths[1] = {data};
    evals ev = {0};
    sd_train_head_params p = sd_train_head_default_params();
    p.model = m;
    p.data_paths = paths;
    p.n_data = 1;
    p.cache_dir = cache;
    p.out_path = out;
    p.ckpt_path = ckpt;
    p.seq_len = 32;
    p.batch = 4;
    p.tokens = 40 * 4 * 25;
    p.lr = 3e-3f;
    p.heldout = 0.1;
    p.eval_every = 5;
    p.n_threads = 2;
    p.progress = on_eval;
    p.user = &ev;
    sd_train_head_result r;
    CHECK(sd_train_head(&p, &r, g_err, sizeof g_err) == 0, "run: %s", g_err);
    CHECK(ev.n >= 5, "%d evaluations", ev.n);
    if (ev.n >= 5) {
        CHECK(ev.loss[ev.n - 1] < 0.7 * ev.loss[0], "held-back loss %.3f -> %.3f", ev.loss[0], ev.loss[ev.n - 1]);
        CHECK(ev.agree0[ev.n - 1] > ev.agree0[0] + 0.2, "agreement %.3f -> %.3f", ev.agree0[0], ev.agree0[ev.n - 1]);
    }
    CHECK(r.tokens > 3000 && r.tokens < 5000, "about the positions asked for: %lld", (long long)r.tokens);
    sd_model_free(m);
}

// A Medusa run goes through and writes a Medusa head.
static void test_medusa_run(void) {
    sd_model *m = synth_model(64, 4, 1);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params p = small_run(m, "medusa", &w);
    char cache[512];
    path_in(cache, sizeof cache, "medusa.cache");
    p.cache_dir = cache;
    p.type = SD_TRAIN_MEDUSA;
    p.n_medusa = 2;
    p.out_type = SD_TRAIN_OUT_Q8_0;
    sd_train_head_result r;
    CHECK(sd_train_head(&p, &r, g_err, sizeof g_err) == 0 && r.n_agree == 2, "medusa: %s", g_err);
    sd_head *h = load_head(p.out_path, m);
    CHECK(h && h->hp.type == SD_HEAD_MEDUSA && h->hp.n_medusa == 2, "a Medusa head of 2: %s", g_err);
    sd_head_free(h);
    sd_model_free(m);
}

// ---------------------------------------------------------------- the command
// SPECDEC_BIN overrides the program under test.
static const char *specdec_bin(void) {
    const char *e = getenv("SPECDEC_BIN");
    return e && *e ? e : "./build/specdec";
}

static char g_out[1 << 16];

// --help documents every option; missing or bad data gets a clear message
// naming the file (and line); a run trains and writes a head that loads.
static void test_cli(void) {
    char why[256], data[512], bad[512], out[512], args[4096];
    struct stat st;
    if (stat(specdec_bin(), &st) != 0) SKIP("%s is missing: build it with make", specdec_bin());
    const char *gguf = stories_path(why, sizeof why);
    if (!gguf) SKIP("%s", why);
    int rc = cli_run(specdec_bin(), "train-head --help", 1, g_out, sizeof g_out);
    CHECK(rc == 0, "--help: exit %d", rc);
    const char *opts[] = {"--model", "--type", "--data", "--out", "--out-type", "--threads", "--seed", "--draft-vocab",
                          "--ttt", "--medusa-heads", "--init", "--tokens", "--epochs", "--seq-len", "--batch", "--lr",
                          "--warmup", "--weight-decay", "--clip", "--heldout", "--eval-every", "--eval-tokens",
                          "--ckpt", "--ckpt-minutes", "--ckpt-every", "--resume", "--cache", "--cache-only", "--topk",
                          "--ctx", "--cache-batch", "(default 8192)", "(default 3)", "(default 0.0003)"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
        CHECK(strstr(g_out, opts[i]), "--help mentions %s", opts[i]);
    path_in(data, sizeof data, "cli.jsonl");
    path_in(bad, sizeof bad, "cli_bad.jsonl");
    path_in(out, sizeof out, "cli_head.gguf");
    snprintf(args, sizeof args, "train-head -m %s --data %s/absent.jsonl --out %s", gguf, g_tmp, out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "data file") && strstr(g_out, "absent.jsonl' not found"), "missing data: %d %s", rc,
          g_out);
    write_file(bad, "{\"text\": \"Once upon a time\"}\n{\"text\": \"Lily\" \"x\"}\n");
    snprintf(args, sizeof args, "train-head -m %s --data %s --out %s", gguf, bad, out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "cli_bad.jsonl:2: expected ',' or '}' at column 17"), "bad line: %d %s", rc, g_out);
    snprintf(args, sizeof args, "train-head -m %s --out %s", gguf, out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "--data"), "no data: %d %s", rc, g_out);
    stories_corpus(data, 8);
    snprintf(args, sizeof args,
             "train-head -m %s --data %s --out %s --seq-len 16 --batch 2 --tokens 640 --draft-vocab 128 -t 2 "
             "--eval-every 5 --heldout 0.1",
             gguf, data, out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    const char *last = NULL;
    for (const char *q = strstr(g_out, "\nstep "); q; q = strstr(q + 1, "\nstep ")) last = q;
    long a = -1, b = -2;
    if (last) sscanf(last, "\nstep %ld/%ld", &a, &b);
    CHECK(rc == 0 && a == b && a >= 20 && strstr(g_out, "tok/s") && strstr(g_out, "agree") && strstr(g_out, "ETA") &&
              strstr(g_out, "wrote"),
          "a run to its last step: %d %s", rc, g_out);
    sd_model *m = NULL;
    sd_model_load(&m, gguf, g_err, sizeof g_err);
    sd_head *h = m ? load_head(out, m) : NULL;
    CHECK(h && h->hp.n_draft_vocab == 128 && strstr(h->note, "command=specdec train-head"), "the head: %s", g_err);
    sd_head_free(h);
    sd_model_free(m);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "exists") && strstr(g_out, "--resume"), "a second run: %d %s", rc, g_out);
}

// Ctrl-C while training: a checkpoint is written, the exit status is 130.
static void test_cli_sigint(void) {
    char why[256], data[512], out[512], log[512], ckpt[600];
    struct stat st;
    if (stat(specdec_bin(), &st) != 0) SKIP("%s is missing: build it with make", specdec_bin());
    const char *gguf = stories_path(why, sizeof why);
    if (!gguf) SKIP("%s", why);
    path_in(data, sizeof data, "sigint.jsonl");
    path_in(out, sizeof out, "sigint.gguf");
    path_in(log, sizeof log, "sigint.log");
    snprintf(ckpt, sizeof ckpt, "%s.ckpt", out);
    stories_corpus(data, 4);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(specdec_bin(), specdec_bin(), "train-head", "-m", gguf, "--data", data, "--out", out, "--seq-len", "16",
              "--batch", "2", "--tokens", "1000000000", "-t", "1", (char *)NULL);
        _exit(127);
    }
    // wait for the first step, then interrupt
    int started = 0;
    for (int i = 0; i < 1500 && !started; i++) {
        usleep(20000);
        FILE *f = fopen(log, "rb");
        if (!f) continue;
        size_t n = fread(g_out, 1, sizeof g_out - 1, f);
        g_out[n] = 0;
        fclose(f);
        started = strstr(g_out, "step 1/") != NULL;
    }
    CHECK(started, "training started: %s", g_out);
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    FILE *f = fopen(log, "rb");
    size_t n = f ? fread(g_out, 1, sizeof g_out - 1, f) : 0;
    g_out[n] = 0;
    if (f) fclose(f);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 130, "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(strstr(g_out, "stopped at step") && strstr(g_out, "--resume"), "the stop is reported: %s", g_out);
    CHECK(file_len(ckpt) > 0 && file_len(out) < 0, "a checkpoint and no head");
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/specdec_test_train_loop_%d", (int)getpid());
    mkdir(g_tmp, 0777);
    char data[512];
    static char loop_data[512];
    path_in(data, sizeof data, "loop.jsonl");
    snprintf(loop_data, sizeof loop_data, "%s", data);
    write_corpus(loop_data, 24, 30, 5, 0);
    g_data[0] = loop_data;
    T_RUN(test_cache_matches_target);
    T_RUN(test_cache_resume_and_torn_tail);
    T_RUN(test_cache_refuses_foreign);
    T_RUN(test_corpus_errors);
    T_RUN(test_cache_stories);
    T_RUN(test_resume_bit_identical);
    T_RUN(test_full_disk_keeps_checkpoint);
    T_RUN(test_refusals);
    T_RUN(test_learns_stories);
    T_RUN(test_medusa_run);
    T_RUN(test_cli);
    T_RUN(test_cli_sigint);
    rm_rf(g_tmp);
    T_EXIT();
}
