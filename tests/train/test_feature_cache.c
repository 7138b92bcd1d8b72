// test_feature_cache.c - the feature cache of `specdec train-head`
// (src/train/cache.c, cache_build.c) and its corpus reader (corpus.c) on
// tiny synthetic models and a real one (stories260K, else the default
// model): the cache holds what the target
// computes (tokens, states, top-k), bit for bit, split into windows; a
// stopped build resumes to the same bytes; a torn tail is cut and rebuilt;
// a foreign target, other layers, type, top-k, window or data are refused;
// corpus errors name file, line and column.
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "common.h"
#include "head/head.h"
#include "lib/train_fixture.h"
#include "model/model.h"
#include "runtime/session.h"
#include "t.h"
#include "train/cache.h"
#include "train/corpus.h"

static char g_err[1024];

static int same_cache(const char *a, const char *b) {
    static const char *files[] = {"header.bin", "index.bin", "tokens.bin", "top_ids.bin", "top_p.bin", "feats.bin"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        if (!tf_same_file(pa, pb)) {
            printf("  %s differs\n", files[i]);
            return 0;
        }
    }
    return 1;
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
// Stops a build inside a record once rec_done reaches at (progress
// callback), and counts the reports made inside a record.
typedef struct in_record {
    volatile sig_atomic_t flag;
    int64_t at;               // < 0: never stop
    int64_t reports_inside;   // reports with a record in progress
    int64_t tokens_new;       // the last report's
} in_record;

static void in_record_cb(void *user, const sd_cache_progress *p) {
    in_record *s = user;
    if (p->rec_tokens > 0 && p->rec_done > 0) s->reports_inside++;
    s->tokens_new = p->tokens_new;
    if (s->at >= 0 && p->rec_done >= s->at) s->flag = 1;
}

static int build_in_record(const char *dir, const sd_model *m, const sd_cache_params *cp, const char *data,
                           in_record *st, char *note, size_t notelen) {
    sd_cache *c;
    if (sd_cache_open(&c, dir, m, cp, note, notelen, g_err, sizeof g_err) < 0) return -100;
    sd_cache_build_params bp = {.n_batch = 8, .stop = &st->flag, .progress = in_record_cb, .user = st};
    const char *paths[1] = {data};
    int r = sd_cache_build(c, m, paths, 1, &bp, g_err, sizeof g_err);
    sd_cache_close(c);
    return r;
}

// A long record (many windows) reports progress while it is cached; a build
// stopped inside it keeps its finished windows, and the next build goes on
// after them (computing only the rest) to the same bytes as one in one go.
// Windows of a record the data no longer has (edited after the stop) are
// dropped and recomputed.
static void test_cache_long_record_resumes(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char data[512], a[512], b[512], text[8192], note[1024];
    tf_path(data, sizeof data, "long.jsonl");
    tf_path(a, sizeof a, "long_a.cache");
    tf_path(b, sizeof b, "long_b.cache");
    int o = snprintf(text, sizeof text, "{\"text\": \"");
    for (int w = 0; w < 300; w++) o += snprintf(text + o, sizeof text - (size_t)o, "%sw%d", w ? " " : "", (w * 37) % 60);
    snprintf(text + o, sizeof text - (size_t)o, "\"}\n{\"text\": \"w1 w2 w3\"}\n");
    tf_write_file(data, text);
    const int W = 16;
    sd_cache_params cp = eagle_params(m, 4, W);
    in_record one = {.at = -1};
    CHECK(build_in_record(a, m, &cp, data, &one, NULL, 0) == 0, "one go: %s", g_err);
    const int64_t total_new = one.tokens_new;
    CHECK(total_new > 10 * W, "the long record has %lld positions", (long long)total_new);
    CHECK(one.reports_inside >= 10, "progress inside the record: %lld reports", (long long)one.reports_inside);
    // stopped inside the first record, after 5 windows and a half
    in_record st = {.at = 5 * W + 8};
    int r = build_in_record(b, m, &cp, data, &st, NULL, 0);
    CHECK(r == 1, "stopped: %d (%s)", r, g_err);
    char idx[600];
    snprintf(idx, sizeof idx, "%s/index.bin", b);
    CHECK(tf_file_len(idx) == 5 * 48, "the 5 finished windows are kept: index.bin has %ld bytes", tf_file_len(idx));
    sd_cache *c = NULL;
    CHECK(sd_cache_open(&c, b, m, &cp, note, sizeof note, g_err, sizeof g_err) == 0, "open: %s", g_err);
    CHECK(c && sd_cache_n_records(c) == 0 && sd_cache_n_positions(c) == 0, "readers see no record yet");
    CHECK(strstr(note, "5 windows") && strstr(note, "unfinished") && !strstr(note, "torn"), "note: '%s'", note);
    sd_cache_close(c);
    // stopped again a window later, then to the end
    st = (in_record){.at = 7 * W};
    CHECK(build_in_record(b, m, &cp, data, &st, NULL, 0) == 1, "stopped again: %s", g_err);
    CHECK(tf_file_len(idx) == 7 * 48, "7 windows now: %ld bytes", tf_file_len(idx));
    st = (in_record){.at = -1};
    CHECK(build_in_record(b, m, &cp, data, &st, NULL, 0) == 0, "resumed: %s", g_err);
    CHECK(st.tokens_new == total_new - 7 * W, "the resumed build computed %lld positions, want %lld",
          (long long)st.tokens_new, (long long)(total_new - 7 * W));
    CHECK(same_cache(a, b), "a build resumed inside a record differs from one in one go");
    // stopped inside the record, then the record edited: its windows are redone
    tf_rm_rf(b);
    st = (in_record){.at = 3 * W};
    CHECK(build_in_record(b, m, &cp, data, &st, NULL, 0) == 1, "stopped: %s", g_err);
    CHECK(!strncmp(text, "{\"text\": \"w0 ", 13), "the first word: %.16s", text);
    text[11] = '1';   // "w0" -> "w1"
    tf_write_file(data, text);
    tf_rm_rf(a);
    one = (in_record){.at = -1};
    CHECK(build_in_record(a, m, &cp, data, &one, NULL, 0) == 0, "one go, edited: %s", g_err);
    st = (in_record){.at = -1};
    CHECK(build_in_record(b, m, &cp, data, &st, NULL, 0) == 0, "edited record: %s", g_err);
    CHECK(st.tokens_new == one.tokens_new, "the edited record is computed whole: %lld of %lld",
          (long long)st.tokens_new, (long long)one.tokens_new);
    CHECK(same_cache(a, b), "the edited record's windows were not redone");
    sd_model_free(m);
}

// ---------------------------------------------------------------- the cache
// Every position of every window holds the record's token, the target's
// states at the extract layers (F16 of the forward's rows, bit for bit) and
// its top-k (argmax first, descending, probabilities summing to 1); records
// longer than the window are split, each window run from an empty cache.
static void test_cache_matches_target(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char data[512], dir[512];
    tf_path(data, sizeof data, "match.jsonl");
    tf_path(dir, sizeof dir, "match.cache");
    tf_write_corpus(data, 6, 40, 7, 0);
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

// The MoA cache (no LSA, TLI up to 2) holds, per position, the mean of the
// target's K,V rows over its layers, the rows of its last two layers, the
// states entering them and the final normed state, as the target's own
// forward over the window gives them (in F16), through windows of 16 built
// in forwards of 8 (rows read at each forward's positions). A cache keeping
// two TLI layers serves a drafter with one; one keeping none is refused for
// TLI 1, with the reason.
static void test_cache_moa_matches_target(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char data[512], dir[512], dir0[512];
    tf_path(data, sizeof data, "moa.jsonl");
    tf_path(dir, sizeof dir, "moa.cache");
    tf_path(dir0, sizeof dir0, "moa0.cache");
    tf_write_corpus(data, 4, 30, 5, 0);
    const int W = 16, L = m->hp.n_layer, E = m->hp.n_embd, kvd = m->hp.n_head_kv * m->hp.head_dim, ekv = 2 * kvd;
    sd_cache_params cp = sd_cache_default_params();
    cp.type = SD_HEAD_MOA;
    cp.moa_tli = 2;
    cp.topk = 4;
    cp.n_ctx = W;
    CHECK(build(dir, m, &cp, data, NULL, NULL, 0) == 0, "build: %s", g_err);
    sd_cache *c = NULL;
    sd_cache_params c1 = cp;
    c1.moa_tli = 1;   // a drafter with TLI 1 reads the TLI-2 cache
    if (sd_cache_open(&c, dir, m, &c1, NULL, 0, g_err, sizeof g_err) < 0) {
        CHECK(0, "open for TLI 1: %s", g_err);
        sd_model_free(m);
        return;
    }
    const int nf = sd_cache_n_feat(c);
    CHECK(nf == 3 * ekv + 3 * E, "n_feat %d, want %d", nf, 3 * ekv + 3 * E);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = W;
    sp.n_batch = W;
    sp.n_threads = 1;
    sd_session *s = NULL;
    CHECK(sd_session_new(&s, m, &sp, g_err, sizeof g_err) == 0, "session: %s", g_err);
    int64_t n_seq, checked = 0, bad = 0;
    const sd_cache_seq *sq = sd_cache_seqs(c, &n_seq);
    static float feats[16 * 1024], want[1024], hid[16 * 3 * 64], k[16 * 64], v[16 * 64];
    int32_t tok[16], layers[3] = {L - 3, L - 2, SD_HIDDEN_NORM};
    for (int64_t e = 0; s && e < n_seq && nf <= 1024; e++) {
        const int T = sq[e].T;
        if (sd_cache_read(c, e, 0, T, tok, feats, NULL, NULL, g_err, sizeof g_err) < 0) break;
        sd_session_truncate(s, 0, g_err, sizeof g_err);
        sd_batch b = {.n = T, .tokens = tok, .hidden_layers = layers, .n_hidden_layers = 3, .hidden_out = hid};
        if (sd_session_forward(s, &b, g_err, sizeof g_err) < 0 || sd_session_commit(s, NULL, T, g_err, sizeof g_err) < 0)
            break;
        for (int t = 0; t < T; t++) {
            memset(want, 0, sizeof want);
            for (int l = 0; l < L; l++) {
                sd_session_kv_rows(s, l, t, 1, k, v);
                for (int j = 0; j < kvd; j++) want[j] += k[j] / (float)L, want[kvd + j] += v[j] / (float)L;
                if (l >= L - 2) {
                    memcpy(want + (1 + l - (L - 2)) * ekv, k, sizeof(float) * (size_t)kvd);
                    memcpy(want + (1 + l - (L - 2)) * ekv + kvd, v, sizeof(float) * (size_t)kvd);
                }
            }
            memcpy(want + 3 * ekv, hid + (size_t)t * 3 * E, sizeof(float) * 3 * (size_t)E);
            for (int i = 0; i < nf; i++) {
                const float w16 = sd_fp16_to_fp32(sd_fp32_to_fp16(want[i])), got = feats[(size_t)t * nf + i];
                bad += fabsf(got - w16) > 1e-3f * (1.0f + fabsf(w16));
            }
            checked++;
        }
    }
    CHECK(checked == sd_cache_n_positions(c) && checked > W, "checked %lld of %lld positions", (long long)checked,
          (long long)sd_cache_n_positions(c));
    CHECK(bad == 0, "%lld MoA feature values differ from the target's rows", (long long)bad);
    sd_session_free(s);
    sd_cache_close(c);
    sd_cache_params c0 = cp;
    c0.moa_tli = 0;
    CHECK(build(dir0, m, &c0, data, NULL, NULL, 0) == 0, "build TLI 0: %s", g_err);
    CHECK(build(dir0, m, &c1, data, NULL, NULL, 0) == -100 && strstr(g_err, "rows of 0 TLI layers") &&
              strstr(g_err, "runs 1"),
          "a TLI-0 cache for TLI 1: %s", g_err);
    sd_cache_params cm = cp;
    cm.type = SD_HEAD_MEDUSA;
    CHECK(build(dir0, m, &cm, data, NULL, NULL, 0) == -100 && strstr(g_err, "without LSA"), "as Medusa: %s", g_err);
    cp.moa_tli = 3;
    CHECK(build(dir0, m, &cp, data, NULL, NULL, 0) == -100 && strstr(g_err, "0..2"), "TLI 3: %s", g_err);
    sd_model_free(m);
}

// A build stopped after two records keeps exactly them and resumes to the
// same bytes as a build in one go; a torn tail (partial index entry, data
// past the last record, data missing or corrupted under the last record, an
// unfinished record's entries) is cut at open and the rebuild restores the
// same bytes.
static void test_cache_resume_and_torn_tail(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char data[512], a[512], b[512], f[600], note[512];
    tf_path(data, sizeof data, "resume.jsonl");
    tf_path(a, sizeof a, "resume_a.cache");
    tf_path(b, sizeof b, "resume_b.cache");
    tf_write_corpus(data, 6, 40, 11, 0);
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
        long len = tf_file_len(f);
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
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err), *m2 = tf_synth_model(32, 4, 1, g_err, sizeof g_err);
    CHECK(m && m2, "synthetic models: %s", g_err);
    if (!m || !m2) {
        sd_model_free(m);
        sd_model_free(m2);
        return;
    }
    char data[512], other[512], fewer[512], dir[512];
    tf_path(data, sizeof data, "foreign.jsonl");
    tf_path(other, sizeof other, "other.jsonl");
    tf_path(fewer, sizeof fewer, "fewer.jsonl");
    tf_path(dir, sizeof dir, "foreign.cache");
    tf_write_corpus(data, 4, 10, 3, 0);
    tf_write_corpus(other, 4, 10, 4, 0);
    tf_write_corpus(fewer, 2, 10, 3, 0);
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
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char dir[512], bad[512], missing[512];
    tf_path(dir, sizeof dir, "errors.cache");
    tf_path(bad, sizeof bad, "bad.jsonl");
    tf_path(missing, sizeof missing, "absent.jsonl");
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
        tf_write_file(bad, text);
        tf_rm_rf(dir);
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
// A real target (tf_real_target: stories260K, else the default model; text
// records only: stories260K has no chat template): a Medusa cache holds the
// final normed state (n_feat = d) of every position, and the target's argmax
// where the text is plain to a real model.
static void test_cache_stories(void) {
    char why[256], data[512], dir[512];
    const char *gguf = tf_real_target(t_shared_dir(), why, sizeof why);
    if (!gguf) SKIP("%s", why);
    tf_path(data, sizeof data, "stories.jsonl");
    tf_path(dir, sizeof dir, "stories.cache");
    sd_model *m = NULL;
    sd_model_load(&m, gguf, g_err, sizeof g_err);
    CHECK(m, "%s: %s", gguf, g_err);
    if (!m) return;
    tf_write_file(data, "{\"text\": \"Once upon a time, there was a little girl named Lily.\"}\n"
                     "{\"text\": \"She loved to play outside in the park.\", \"source\": \"x\"}\n");
    sd_cache_params cp = sd_cache_default_params();
    cp.type = SD_HEAD_MEDUSA;
    CHECK(build(dir, m, &cp, data, NULL, NULL, 0) == 0, "build: %s", g_err);
    sd_cache *c = NULL;
    CHECK(sd_cache_open(&c, dir, m, &cp, NULL, 0, g_err, sizeof g_err) == 0, "open: %s", g_err);
    if (c) {
        CHECK(sd_cache_n_feat(c) == m->hp.n_embd, "n_feat %d", sd_cache_n_feat(c));
        const sd_tokenizer *tk = sd_model_tokenizer(m);
        int32_t ids[64], pre[64];
        int n = sd_tokenize(tk, "Once upon a time, there was a little girl named Lily.", 53, 1, 0, ids, 64);
        // the tokens of "Once upon a" (BOS too where the vocabulary has one) begin the record's
        int k = sd_tokenize(tk, "Once upon a", 11, 1, 0, pre, 64);
        CHECK(n > 0 && k > 0 && k < n && !memcmp(pre, ids, sizeof(int32_t) * (size_t)k),
              "'Once upon a' is %d tokens, a prefix of the record's %d", k, n);
        int32_t tok[64];
        CHECK(n > 0 && sd_cache_read(c, 0, 0, n, tok, NULL, NULL, NULL, g_err, sizeof g_err) == 0 &&
                  !memcmp(tok, ids, sizeof(int32_t) * (size_t)n),
              "the first record's tokens");
        int32_t top[8] = {0};
        // the model continues the story: after "Once upon a" comes " time"
        CHECK(k > 0 && k < n && sd_cache_read(c, 0, k - 1, 1, NULL, NULL, top, NULL, g_err, sizeof g_err) == 0 &&
                  top[0] == ids[k],
              "the target's argmax after 'Once upon a' is the text's next token (%d vs %d)", top[0],
              k > 0 && k < n ? ids[k] : -1);
    }
    sd_cache_close(c);
    sd_model_free(m);
}

// A UTF-8 byte order mark at the start of the file is accepted (the same
// cache as without it); invalid UTF-8 in a string (text, content, or a key
// read over) is refused with the file, line and column.
static void test_corpus_bom_and_utf8(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    char plain[512], bom[512], d1[512], d2[512];
    tf_path(plain, sizeof plain, "nobom.jsonl");
    tf_path(bom, sizeof bom, "bom.jsonl");
    tf_path(d1, sizeof d1, "nobom.cache");
    tf_path(d2, sizeof d2, "bom.cache");
    const char *body = "{\"text\": \"w1 w2 caf\xC3\xA9 \xF0\x9F\x98\x80 w3\"}\n{\"text\": \"w4 w5\"}\n";
    char withbom[256];
    snprintf(withbom, sizeof withbom, "\xEF\xBB\xBF%s", body);
    tf_write_file(plain, body);
    tf_write_file(bom, withbom);
    sd_cache_params cp = eagle_params(m, 4, 16);
    CHECK(build(d1, m, &cp, plain, NULL, NULL, 0) == 0, "without a BOM: %s", g_err);
    CHECK(build(d2, m, &cp, bom, NULL, NULL, 0) == 0, "with a BOM: %s", g_err);
    CHECK(same_cache(d1, d2), "a BOM changes the cache");
    struct { const char *line; const char *want; } cases[] = {
        {"{\"text\": \"ab\xFF\"}", "bad.jsonl:3: invalid UTF-8 (byte 0xFF) in a string at column 13"},
        {"{\"text\": \"\xC0\x80\"}", "bad.jsonl:3: invalid UTF-8 (byte 0xC0)"},          // overlong
        {"{\"text\": \"\xED\xA0\x80\"}", "bad.jsonl:3: invalid UTF-8 (byte 0xED)"},      // a surrogate
        {"{\"text\": \"x\xE2\x82\"}", "bad.jsonl:3: invalid UTF-8 (byte 0xE2)"},          // truncated
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xFE\"}]}", "bad.jsonl:3: invalid UTF-8"},
        {"{\"id\": \"\x80\", \"text\": \"w1\"}", "bad.jsonl:3: invalid UTF-8 (byte 0x80)"},
        {"\xEF\xBB\xBF{\"text\": \"w1\"}", "bad.jsonl:3: expected '{' at column 1"},   // a BOM inside the file
    };
    char bad[512], dir[512], text[512];
    tf_path(bad, sizeof bad, "bad.jsonl");
    tf_path(dir, sizeof dir, "bad.cache");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(text, sizeof text, "%s%s\n", body, cases[i].line);
        tf_write_file(bad, text);
        tf_rm_rf(dir);
        int r = build(dir, m, &cp, bad, NULL, NULL, 0);
        CHECK(r < 0 && strstr(g_err, cases[i].want), "case %zu: got %d '%s', want '%s'", i, r, g_err, cases[i].want);
    }
    sd_model_free(m);
}

int main(void) {
    tf_init("test_train_cache");
    T_RUN(test_cache_matches_target);
    T_RUN(test_cache_moa_matches_target);
    T_RUN(test_cache_resume_and_torn_tail);
    T_RUN(test_cache_refuses_foreign);
    T_RUN(test_corpus_errors);
    T_RUN(test_corpus_bom_and_utf8);
    T_RUN(test_cache_long_record_resumes);
    T_RUN(test_cache_stories);
    tf_done();
    T_EXIT();
}
