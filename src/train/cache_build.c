// cache_build.c - building the feature cache (cache.h): every record of the
// corpus through the target once, in windows of n_ctx tokens and prompt-style
// batches of n_batch tokens (8-bit path, every node's logits and states),
// appended to the data files; a record's index entries follow its data.
#include <errno.h>
#include <math.h>
#include <unistd.h>

#include "common.h"
#include "head/head.h"
#include "model/model.h"
#include "runtime/session.h"
#include "train/cache.h"
#include "train/cache_impl.h"
#include "train/corpus.h"
#include "train/moa_train.h"

// Everything a build owns, allocated once before the first record.
typedef struct builder {
    sd_cache *c;
    const sd_model *m;
    const sd_cache_build_params *bp;
    sd_session *s;
    int n_batch, n_hl;
    int32_t layers[3];
    float *hidden;            // (n_batch, n_hl, n_embd) the forward's state rows
    int kvp;                  // MoA: floats of K,V per position ahead of the states (0 otherwise)
    float *kv, *lk, *lv;      // MoA: (n_batch, kvp) that part; (n_batch, kv_dim) x2 one layer's cache rows
    int32_t *st_tok;          // (n_batch) staging rows of the four files
    int32_t *st_ids;          // (n_batch, topk)
    uint16_t *st_p;           // (n_batch, topk)
    uint16_t *st_feat;        // (n_batch, n_feat)
    int32_t *ids;             // (ids_cap) the record's tokens
    int ids_cap;
    uint64_t *rec_hash;       // (c->n_rec at the start) hashes of the cached records
    int64_t tokens_new;
    int64_t total;            // records in the data
    int64_t rec_tokens, rec_done;  // the record being cached: its positions, those in the cache
    double t0;
} builder;

static void builder_free(builder *b) {
    sd_session_free(b->s);
    free(b->hidden);
    free(b->kv);
    free(b->lk);
    free(b->lv);
    free(b->st_tok);
    free(b->st_ids);
    free(b->st_p);
    free(b->st_feat);
    free(b->ids);
    free(b->rec_hash);
}

static int builder_init(builder *b, sd_cache *c, const sd_model *m, const sd_cache_build_params *bp, char *err,
                        size_t errlen) {
    memset(b, 0, sizeof *b);
    b->c = c;
    b->m = m;
    b->bp = bp;
    b->n_batch = bp->n_batch > 0 ? SD_MIN(bp->n_batch, c->hdr.n_ctx) : SD_MIN(256, c->hdr.n_ctx);
    b->n_hl = c->hdr.n_extract;
    for (int i = 0; i < b->n_hl; i++) b->layers[i] = c->hdr.extract[i];
    const size_t nb = (size_t)b->n_batch, d = (size_t)m->hp.n_embd, k = (size_t)c->hdr.topk;
    b->hidden = malloc(sizeof(float) * nb * (size_t)b->n_hl * d);
    b->st_tok = malloc(sizeof(int32_t) * nb);
    b->st_ids = malloc(sizeof(int32_t) * nb * k);
    b->st_p = malloc(sizeof(uint16_t) * nb * k);
    b->st_feat = malloc(sizeof(uint16_t) * nb * (size_t)c->hdr.n_feat);
    b->rec_hash = malloc(sizeof(uint64_t) * (size_t)(c->n_rec + 1));
    if (!b->hidden || !b->st_tok || !b->st_ids || !b->st_p || !b->st_feat || !b->rec_hash)
        return sd_err(err, errlen, "cache: out of memory");
    if (c->hdr.type == SD_HEAD_MOA) {
        const size_t kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim;
        b->kvp = c->hdr.n_feat - b->n_hl * (int)d;
        b->kv = malloc(sizeof(float) * nb * (size_t)b->kvp);
        b->lk = malloc(sizeof(float) * nb * kvd);
        b->lv = malloc(sizeof(float) * nb * kvd);
        if (!b->kv || !b->lk || !b->lv) return sd_err(err, errlen, "cache: out of memory");
    }
    for (int64_t i = 0; i < c->n_seq; i++)
        if (c->seq[i].window & SD_CACHE_LAST_WINDOW) b->rec_hash[c->seq[i].record] = c->seq[i].rec_hash;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = c->hdr.n_ctx;
    sp.n_batch = b->n_batch;
    sp.pool = bp->pool;
    sp.n_threads = 1;
    if (c->hdr.type == SD_HEAD_MOA) sp.gpu = -1;   // the MoA rows are read from the host cache (sd_session_kv_rows)
    return sd_session_new(&b->s, m, &sp, err, errlen);
}

// The k largest logits of row l (ties: the lower id first) as ids and their
// softmax probabilities renormalised over those k (only the top-k logits
// matter: p_i = exp(l_i - l_max) / sum over the top-k).
static void top_k(const float *l, int n, int k, int32_t *ids, uint16_t *p16) {
    float v[SD_CACHE_MAX_TOPK];
    int m = 0;
    for (int i = 0; i < n; i++) {
        float x = l[i];
        if (m == k && !(x > v[k - 1])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && x > v[j - 1]) {
            v[j] = v[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        v[j] = x;
        ids[j] = i;
    }
    double e[SD_CACHE_MAX_TOPK], s = 0.0;
    for (int j = 0; j < m; j++) s += e[j] = exp((double)v[j] - (double)v[0]);
    for (int j = 0; j < k; j++) {
        if (j >= m) ids[j] = -1;
        p16[j] = sd_fp32_to_fp16(j < m ? (float)(e[j] / s) : 0.0f);
    }
}

// The record's tokens into b->ids; returns their count, or <0 with a message.
// A chat record goes through sd_chat_tokenize_messages (the template's
// markers as special tokens, the contents as plain text, as the server
// tokenizes them); a text record is plain text.
static int tokenize_record(builder *b, const sd_corpus_rec *rec, const char *path, char *err, size_t errlen) {
    const sd_tokenizer *tok = sd_model_tokenizer(b->m);
    size_t len = rec->text ? strlen(rec->text) : 4096;
    for (int i = 0; !rec->text && i < rec->n_msg; i++) len += strlen(rec->contents[i]) + 64;
    int max = (int)SD_MIN(len + 8, (size_t)1 << 30);
    for (;;) {
        if (b->ids_cap < max) {
            free(b->ids);
            b->ids = malloc(sizeof(int32_t) * (size_t)max);
            b->ids_cap = b->ids ? max : 0;
            if (!b->ids) return sd_err(err, errlen, "out of memory");
        }
        char e2[512];
        int n = rec->text ? sd_tokenize(tok, rec->text, len, 1, 0, b->ids, b->ids_cap)
                          : sd_chat_tokenize_messages(tok, (const char *const *)rec->roles,
                                                      (const char *const *)rec->contents, rec->n_msg, b->ids,
                                                      b->ids_cap, e2, sizeof e2);
        if (n < 0 && !rec->text)
            return sd_err(err, errlen, "%s:%d: cannot format the messages: %s", path, rec->line, e2);
        if (n < 0) return sd_err(err, errlen, "%s:%d: cannot tokenize the record", path, rec->line);
        if (n <= b->ids_cap) return n;
        max = n;
    }
}

static void report(builder *b) {
    if (!b->bp->progress) return;
    sd_cache_progress p = {.records = b->c->n_rec, .records_total = b->total, .tokens_new = b->tokens_new,
                           .tokens = b->c->n_pos + b->rec_done, .rec_tokens = b->rec_tokens, .rec_done = b->rec_done,
                           .ms = sd_time_ms() - b->t0};
    b->bp->progress(b->bp->user, &p);
}

// MoA: the K,V part of nodes pos..pos+n-1 of the forward just committed into
// b->kv (n, kvp): the mean of every layer's row, then the rows of the last N
// layers (cache.h).
static int moa_kv(builder *b, int pos, int n, char *err, size_t errlen) {
    const int L = b->m->hp.n_layer, kvd = b->m->hp.n_head_kv * b->m->hp.head_dim;
    const int N = b->n_hl - 1;
    memset(b->kv, 0, sizeof(float) * (size_t)n * (size_t)b->kvp);
    for (int l = 0; l < L; l++) {
        if (sd_session_kv_rows(b->s, l, pos, n, b->lk, b->lv) < 0)
            return sd_err(err, errlen, "cache: cannot read the target's cache rows of layer %d", l);
        for (int i = 0; i < n; i++)
            sd_moa_reduced_add(b->kv + (size_t)i * b->kvp, l, L, N, kvd, b->lk + (size_t)i * kvd, b->lv + (size_t)i * kvd);
    }
    return 0;
}

// Runs window ids[0..T) through the target and appends its rows at
// position pos0 of the data files; hs[] continues each file's hash.
// Returns 0, 1 when stopped, <0 on error.
static int run_window(builder *b, const int32_t *ids, int T, uint64_t pos0, uint64_t hs[CACHE_N_FILES], char *err,
                      size_t errlen) {
    sd_cache *c = b->c;
    const int k = c->hdr.topk, nf = c->hdr.n_feat, nv = b->m->hp.n_vocab;
    if (sd_session_truncate(b->s, 0, err, errlen) < 0) return -1;
    for (int done = 0; done < T;) {
        const int n = SD_MIN(b->n_batch, T - done);
        sd_batch bt = {.n = n, .tokens = ids + done, .precise = 0, .hidden_layers = b->layers,
                       .n_hidden_layers = b->n_hl, .hidden_out = b->hidden};
        if (sd_session_forward(b->s, &bt, err, errlen) < 0) return -1;
        if (sd_session_commit(b->s, NULL, n, err, errlen) < 0) return -1;
        if (b->kvp && moa_kv(b, done, n, err, errlen) < 0) return -1;
        const int nh = nf - b->kvp;
        for (int i = 0; i < n; i++) {
            b->st_tok[i] = ids[done + i];
            top_k(sd_session_logits(b->s, i), nv, k, b->st_ids + (size_t)i * k, b->st_p + (size_t)i * k);
            // hidden rows of node i: n_hl entries of d floats, contiguous = the feature layout (after MoA's K,V)
            const float *h = b->hidden + (size_t)i * (size_t)nh, *kv = b->kvp ? b->kv + (size_t)i * b->kvp : NULL;
            uint16_t *o = b->st_feat + (size_t)i * (size_t)nf;
            for (int j = 0; j < b->kvp; j++) o[j] = sd_fp32_to_fp16(kv[j]);
            for (int j = 0; j < nh; j++) o[b->kvp + j] = sd_fp32_to_fp16(h[j]);
        }
        const void *src[CACHE_N_FILES] = {b->st_tok, b->st_ids, b->st_p, b->st_feat};
        for (int f = 0; f < CACHE_N_FILES; f++) {
            size_t rb = cache_row_bytes(c, f);
            if (cache_pwrite(c->fd[f], src[f], rb * (size_t)n, (int64_t)((pos0 + (uint64_t)done) * rb)) < 0)
                return sd_err(err, errlen, "cache %s: write error: %s", c->dir, strerror(errno));
            hs[f] = sd_fnv64(hs[f], src[f], rb * (size_t)n);
        }
        done += n;
        b->tokens_new += n;
        b->rec_done += n;
        report(b);   // within a long record too
        if (done < T && b->bp->stop && *b->bp->stop) return 1;
    }
    return 0;
}

// Cuts the data files back to the complete records and the finished windows
// of an unfinished one (after a stop or an error).
static void cut_to_committed(sd_cache *c) {
    for (int f = 0; f < CACHE_N_FILES; f++)
        if (ftruncate(c->fd[f], (off_t)((c->n_pos + c->part_pos) * (int64_t)cache_row_bytes(c, f)))) {
        }
    if (ftruncate(c->fd_index, (off_t)((c->n_seq + c->n_part) * (int64_t)sizeof(sd_cache_seq)))) {
    }
}

// 1 if the unfinished record's windows in the cache belong to rec (its
// line's hash) cut into n_win windows of W from n tokens.
static int part_matches(const sd_cache *c, const sd_corpus_rec *rec, int n, int W, int n_win) {
    if (c->n_part >= n_win) return 0;
    for (int64_t w = 0; w < c->n_part; w++) {
        const sd_cache_seq *e = &c->seq[c->n_seq + w];
        if (e->rec_hash != rec->hash || e->T != SD_MIN(W, n - (int)w * W)) return 0;
    }
    return 1;
}

// Appends a record window by window: each window's data, then its index
// entry (the last one flagged), so that a stop or a crash inside a long
// record keeps its finished windows; a record the cache holds windows of
// (an earlier build stopped inside it) goes on after them. Returns 0, 1 when
// stopped, <0 on error.
static int add_record(builder *b, const sd_corpus_rec *rec, const char *path, char *err, size_t errlen) {
    sd_cache *c = b->c;
    int n = tokenize_record(b, rec, path, err, errlen);
    if (n < 0) return -1;
    const int W = c->hdr.n_ctx, n_win = n > 0 ? (n + W - 1) / W : 1;
    if (c->n_part && !part_matches(c, rec, n, W, n_win)) c->n_part = c->part_pos = 0;   // not this record's: redo
    if (c->n_seq + n_win > c->cap) {
        int64_t cap = SD_MAX(c->cap * 2, c->n_seq + n_win);
        sd_cache_seq *s = realloc(c->seq, sizeof(sd_cache_seq) * (size_t)cap);
        if (!s) return sd_err(err, errlen, "out of memory");
        c->seq = s;
        c->cap = cap;
    }
    sd_cache_seq *e = c->seq + c->n_seq;
    uint64_t pos = (uint64_t)(c->n_pos + c->part_pos);
    b->rec_tokens = n;
    b->rec_done = c->part_pos;
    for (int w = (int)c->n_part; w < n_win; w++) {
        const int T = SD_MIN(W, n - w * W);
        uint64_t hs[CACHE_N_FILES];
        for (int f = 0; f < CACHE_N_FILES; f++) hs[f] = SD_FNV_OFF;
        int r = T > 0 ? run_window(b, b->ids + (size_t)w * W, T, pos, hs, err, errlen) : 0;
        if (r != 0) return r;
        memset(&e[w], 0, sizeof e[w]);
        e[w].pos0 = pos;
        e[w].T = T > 0 ? T : 0;
        e[w].record = (uint32_t)c->n_rec;
        e[w].window = (uint32_t)w | (w == n_win - 1 ? SD_CACHE_LAST_WINDOW : 0);
        e[w].rec_hash = rec->hash;
        e[w].data_hash = sd_fnv64(SD_FNV_OFF, hs, sizeof hs);
        e[w].entry_hash = cache_entry_hash(&e[w]);
        pos += (uint64_t)e[w].T;
        if (cache_pwrite(c->fd_index, &e[w], sizeof(sd_cache_seq), (c->n_seq + w) * (int64_t)sizeof(sd_cache_seq)) < 0)
            return sd_err(err, errlen, "cache %s: write error: %s", c->dir, strerror(errno));
        c->n_part = w + 1;
        c->part_pos += e[w].T;
        if (w + 1 < n_win && b->bp->stop && *b->bp->stop) return 1;
    }
    c->n_seq += n_win;
    c->n_pos = (int64_t)pos;
    c->n_rec++;
    c->n_part = c->part_pos = 0;
    b->rec_tokens = b->rec_done = 0;
    return 0;
}

// The records of the data (for progress), after reading every line once:
// an unreadable file, a bad line or chat records for a model without a chat
// template fail here, before the target runs for hours. Returns the count or <0.
static int64_t count_records(const sd_model *m, const char *const *paths, int n_paths, char *err, size_t errlen) {
    int64_t total = 0;
    int chat_ok = 0;
    for (int i = 0; i < n_paths; i++) {
        sd_corpus *cr;
        if (sd_corpus_open(&cr, paths[i], err, errlen) < 0) return -1;
        sd_corpus_rec rec;
        int r;
        while ((r = sd_corpus_next(cr, &rec, 1, err, errlen)) == 1) {
            total++;
            if (rec.text || chat_ok) continue;
            char buf[4096], e2[512];
            const char *role = "user", *content = "hello";
            if (sd_chat_format_messages(sd_model_tokenizer(m), &role, &content, 1, buf, sizeof buf, e2, sizeof e2) < 0) {
                r = sd_err(err, errlen, "%s:%d: cannot format the messages: %s", paths[i], rec.line, e2);
                break;
            }
            chat_ok = 1;
        }
        sd_corpus_close(cr);
        if (r < 0) return -1;
    }
    return total;
}

int sd_cache_build(sd_cache *c, const sd_model *m, const char *const *paths, int n_paths,
                   const sd_cache_build_params *bp, char *err, size_t errlen) {
    if (n_paths < 1) return sd_err(err, errlen, "no training data (--data FILE.jsonl)");
    int64_t total = count_records(m, paths, n_paths, err, errlen);
    if (total < 0) return -1;
    builder b;
    int r = builder_init(&b, c, m, bp, err, errlen);
    const int64_t have = c->n_rec;
    int64_t rec_no = 0;
    b.t0 = sd_time_ms();
    b.total = total;
    if (r == 0) report(&b);
    for (int i = 0; r == 0 && i < n_paths; i++) {
        sd_corpus *cr;
        if ((r = sd_corpus_open(&cr, paths[i], err, errlen)) < 0) break;
        sd_corpus_rec rec;
        while (r == 0) {
            int got = sd_corpus_next(cr, &rec, rec_no >= have, err, errlen);
            if (got <= 0) {
                r = got;
                break;
            }
            if (rec_no < have) {   // cached already: it must be the same record
                if (rec.hash != b.rec_hash[rec_no])
                    r = sd_err(err, errlen,
                               "the feature cache %s was built from other data: record %lld (%s:%d) differs from the "
                               "one cached; use another --cache directory or the original data",
                               c->dir, (long long)rec_no + 1, paths[i], rec.line);
            } else {
                r = add_record(&b, &rec, paths[i], err, errlen);
                if (r == 0) report(&b);
                if (r == 0 && bp->stop && *bp->stop && rec_no + 1 < total) r = 1;
            }
            rec_no++;
        }
        sd_corpus_close(cr);
    }
    if (r == 0 && c->n_part) c->n_part = c->part_pos = 0;   // windows of a record the data no longer has
    if (r == 0 && rec_no < have)
        r = sd_err(err, errlen,
                   "the feature cache %s holds %lld records but the data has only %lld: it was built from other data; "
                   "use another --cache directory",
                   c->dir, (long long)have, (long long)rec_no);
    if (r != 0 || c->n_part == 0) cut_to_committed(c);
    builder_free(&b);
    return r;
}
