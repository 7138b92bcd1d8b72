// loop_data.c - what the training loop reads: the cache cut into training
// and held-back sequences, the draft vocabulary, the order of an epoch, the
// target rows a new head starts from.
#include <math.h>

#include "common.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "head/moa.h"
#include "train/answers.h"
#include "train/loop_impl.h"

static uint64_t mix64(uint64_t x) {   // splitmix64's finaliser: spreads a hash over all bits
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int grow(loop_chunk **a, int64_t *cap, int64_t n) {
    if (n < *cap) return 0;
    int64_t c = *cap ? *cap * 2 : 1024;
    loop_chunk *p = realloc(*a, sizeof(loop_chunk) * (size_t)c);
    if (!p) return -1;
    *a = p;
    *cap = c;
    return 0;
}

int loop_split(loop_run *r, char *err, size_t errlen) {
    int64_t n_seq;
    const sd_cache_seq *sq = sd_cache_seqs(r->cache, &n_seq);
    const int64_t n_rec = sd_cache_n_records(r->cache);
    const int T = r->P.seq_len;
    // held back: records whose mixed line hash falls under the fraction (the
    // split does not move when the data grows or the seed changes)
    const uint64_t bar = (uint64_t)(r->P.heldout * 1e6);
    uint8_t *held = calloc((size_t)SD_MAX(n_rec, 1), 1);
    if (!held) return sd_err(err, errlen, "out of memory");
    int64_t n_held = 0, best = -1;
    uint64_t best_v = UINT64_MAX;
    for (int64_t i = 0; i < n_seq; i++) {
        if (!(sq[i].window & SD_CACHE_LAST_WINDOW)) continue;
        uint64_t v = mix64(sq[i].rec_hash) % 1000000u;
        if (v < bar) held[sq[i].record] = 1, n_held++;
        if (v < best_v) best_v = v, best = sq[i].record;
    }
    if (r->P.heldout > 0 && n_held == 0 && n_rec >= 2) held[best] = 1;   // a split asked for is never empty
    int64_t cap_t = 0, cap_e = 0;
    r->train_seqs = malloc(sizeof(int64_t) * (size_t)SD_MAX(n_seq, 1));
    if (!r->train_seqs) {
        free(held);
        return sd_err(err, errlen, "out of memory");
    }
    for (int64_t i = 0; i < n_seq; i++) {
        const int h = held[sq[i].record];
        if (!h) r->train_seqs[r->n_train_seqs++] = i;
        for (int32_t off = 0; sq[i].T - off >= 2; off += T) {
            loop_chunk c = {.seq = i, .off = off, .T = SD_MIN(T, sq[i].T - off)};
            if (grow(h ? &r->eval : &r->train, h ? &cap_e : &cap_t, h ? r->n_eval : r->n_train) < 0) {
                free(held);
                return sd_err(err, errlen, "out of memory");
            }
            if (h) {
                r->eval[r->n_eval++] = c;
                r->eval_pos += c.T;
            } else {
                r->train[r->n_train++] = c;
                r->train_pos += c.T;
            }
        }
    }
    free(held);
    if (r->n_train == 0)
        return sd_err(err, errlen,
                      "no training sequences: the cache holds %lld positions in %lld records (after holding back %.1f%% "
                      "of the records, none has 2 positions or more)",
                      (long long)sd_cache_n_positions(r->cache), (long long)n_rec, 100.0 * r->P.heldout);
    r->perm = malloc(sizeof(int64_t) * (size_t)r->n_train);
    if (!r->perm) return sd_err(err, errlen, "out of memory");
    return 0;
}

// ---------------------------------------------------------------- the draft vocabulary
typedef struct vcount {
    int64_t am, in;           // times the target's argmax, times an input token
    int32_t id;
} vcount;

static int vcount_cmp(const void *a, const void *b) {
    const vcount *x = a, *y = b;
    if (x->am != y->am) return x->am > y->am ? -1 : 1;
    if (x->in != y->in) return x->in > y->in ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int answer_argmax_counts(loop_run *r, int64_t *am, char *err, size_t errlen);

// Argmax counts over the training split into am (n_vocab, zeroed here); *total their sum.
// With --score answers only the positions it scores count.
static int argmax_counts(loop_run *r, int64_t *am, int64_t *total, char *err, size_t errlen) {
    const int nv = r->m->hp.n_vocab;
    memset(am, 0, sizeof(int64_t) * (size_t)nv);
    if (r->ans.n_hdr ? answer_argmax_counts(r, am, err, errlen) < 0
                     : sd_cache_argmax_counts(r->cache, r->train_seqs, r->n_train_seqs, am, err, errlen) < 0)
        return -1;
    *total = 0;
    for (int i = 0; i < nv; i++) *total += am[i];
    return 0;
}

int loop_pick_vocab(loop_run *r, int n, int32_t *ids, double *coverage, char *err, size_t errlen) {
    const int nv = r->m->hp.n_vocab;
    int64_t *am = malloc(sizeof(int64_t) * (size_t)nv), total;
    vcount *vc = malloc(sizeof(vcount) * (size_t)nv);
    int32_t *tok = malloc(sizeof(int32_t) * 4096);
    int rv = -1;
    if (!am || !vc || !tok) {
        sd_err(err, errlen, "out of memory");
        goto done;
    }
    if (argmax_counts(r, am, &total, err, errlen) < 0) goto done;
    for (int i = 0; i < nv; i++) vc[i] = (vcount){.am = am[i], .in = 0, .id = i};
    int64_t n_seq;
    const sd_cache_seq *sq = sd_cache_seqs(r->cache, &n_seq);
    for (int64_t k = 0; k < r->n_train_seqs; k++) {   // input tokens break the ties among rare argmaxes
        const int64_t s = r->train_seqs[k];
        for (int off = 0; off < sq[s].T; off += 4096) {
            int T = SD_MIN(4096, sq[s].T - off);
            if (sd_cache_read(r->cache, s, off, T, tok, NULL, NULL, NULL, err, errlen) < 0) goto done;
            for (int t = 0; t < T; t++)
                if (tok[t] >= 0 && tok[t] < nv) vc[tok[t]].in++;
        }
    }
    qsort(vc, (size_t)nv, sizeof *vc, vcount_cmp);
    int64_t covered = 0;
    for (int i = 0; i < n; i++) {
        ids[i] = vc[i].id;
        covered += vc[i].am;
    }
    *coverage = total ? (double)covered / (double)total : 0.0;
    rv = 0;
done:
    free(am);
    free(vc);
    free(tok);
    return rv;
}

int loop_coverage(loop_run *r, const sd_head *h, double *coverage, char *err, size_t errlen) {
    const int nv = r->m->hp.n_vocab;
    int64_t *am = malloc(sizeof(int64_t) * (size_t)nv), total, covered = 0;
    if (!am) return sd_err(err, errlen, "out of memory");
    if (argmax_counts(r, am, &total, err, errlen) < 0) {
        free(am);
        return -1;
    }
    for (int i = 0; i < h->hp.n_draft_vocab; i++) covered += am[h->d2t[i]];
    *coverage = total ? (double)covered / (double)total : 0.0;
    free(am);
    return 0;
}

// ---------------------------------------------------------------- the assistant's answers (--score answers)
int loop_answers_init(loop_run *r, char *err, size_t errlen) {
    if (sd_answers_init(&r->ans, sd_model_tokenizer(r->m), err, errlen) < 0) return -1;
    r->b_score = malloc((size_t)r->P.seq_len);
    r->b_pre = malloc(sizeof(int32_t) * LOOP_PRE);
    if (!r->b_score || !r->b_pre) return sd_err(err, errlen, "out of memory");
    return 0;
}

// Feeds tokens [off, off + n) of cache sequence q (read in pieces).
static int ans_feed_seq(loop_run *r, sd_answers_state *s, int64_t q, int off, int n, char *err, size_t errlen) {
    for (int o = 0; o < n; o += LOOP_PRE) {
        const int k = SD_MIN(LOOP_PRE, n - o);
        if (sd_cache_read(r->cache, q, off + o, k, r->b_pre, NULL, NULL, NULL, err, errlen) < 0) return -1;
        for (int i = 0; i < k; i++) sd_answers_feed(&r->ans, s, r->b_pre[i]);
    }
    return 0;
}

// answer_argmax_counts: the training split record by record (its windows
// are consecutive in train_seqs): is it a chat record (an end-of-turn token
// anywhere), then the argmax of each position it scores.
static int answer_argmax_counts(loop_run *r, int64_t *am, char *err, size_t errlen) {
    int64_t n_seq;
    const sd_cache_seq *sq = sd_cache_seqs(r->cache, &n_seq);
    const int k = sd_cache_topk(r->cache), nv = r->m->hp.n_vocab;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)k * LOOP_PRE);
    if (!ids) return sd_err(err, errlen, "out of memory");
    int rv = 0;
    for (int64_t i = 0, j; i < r->n_train_seqs && rv == 0; i = j) {
        for (j = i + 1; j < r->n_train_seqs && sq[r->train_seqs[j]].record == sq[r->train_seqs[i]].record;) j++;
        sd_answers_state s = {0};
        for (int64_t q = i; q < j && !s.chat && rv == 0; q++)
            rv = ans_feed_seq(r, &s, r->train_seqs[q], 0, sq[r->train_seqs[q]].T, err, errlen);
        const int chat = s.chat;
        memset(&s, 0, sizeof s);
        for (int64_t q = i; q < j && rv == 0; q++) {
            const int64_t e = r->train_seqs[q];
            for (int o = 0; o < sq[e].T && rv == 0; o += LOOP_PRE) {
                const int n = SD_MIN(LOOP_PRE, sq[e].T - o);
                rv = sd_cache_read(r->cache, e, o, n, r->b_pre, NULL, ids, NULL, err, errlen);
                for (int t = 0; t < n && rv == 0; t++) {
                    sd_answers_feed(&r->ans, &s, r->b_pre[t]);
                    const int32_t a = ids[(size_t)t * (size_t)k];
                    if ((s.in || !chat) && a >= 0 && a < nv) am[a]++;
                }
            }
        }
    }
    free(ids);
    return rv;
}

// r->b_score for chunk c (its tokens in r->b_tok): 1 where the state after
// the position's token is inside an answer; a record without an end-of-turn
// token (a text record) is scored in full.
static int answer_mask(loop_run *r, const loop_chunk *c, char *err, size_t errlen) {
    int64_t n_seq;
    const sd_cache_seq *sq = sd_cache_seqs(r->cache, &n_seq);
    int64_t first = c->seq - (int64_t)(sq[c->seq].window & ~SD_CACHE_LAST_WINDOW), end = c->seq;
    if (first < 0 || sq[first].record != sq[c->seq].record) first = c->seq;   // (windows are consecutive)
    while (end + 1 < n_seq && sq[end + 1].record == sq[c->seq].record && !(sq[end].window & SD_CACHE_LAST_WINDOW))
        end++;
    sd_answers_state s = {0};
    for (int64_t q = first; q < c->seq; q++)
        if (ans_feed_seq(r, &s, q, 0, sq[q].T, err, errlen) < 0) return -1;
    if (ans_feed_seq(r, &s, c->seq, 0, c->off, err, errlen) < 0) return -1;
    for (int p = 0; p < c->T; p++) {
        sd_answers_feed(&r->ans, &s, r->b_tok[p]);
        r->b_score[p] = (uint8_t)s.in;
    }
    if (!s.chat) {   // none yet: look through the rest of the record
        sd_answers_state t = s;
        if (ans_feed_seq(r, &t, c->seq, c->off + c->T, sq[c->seq].T - c->off - c->T, err, errlen) < 0) return -1;
        for (int64_t q = c->seq + 1; q <= end && !t.chat; q++)
            if (ans_feed_seq(r, &t, q, 0, sq[q].T, err, errlen) < 0) return -1;
        if (!t.chat) memset(r->b_score, 1, (size_t)c->T);
    }
    return 0;
}

// ---------------------------------------------------------------- sequences
int loop_read(loop_run *r, const loop_chunk *c, sd_train_seq *seq, char *err, size_t errlen) {
    if (sd_cache_read(r->cache, c->seq, c->off, c->T, r->b_tok, r->b_feat, r->b_ids, r->b_p, err, errlen) < 0)
        return -1;
    *seq = (sd_train_seq){.T = c->T, .tokens = r->b_tok, .feats = r->b_feat, .top_ids = r->b_ids, .top_p = r->b_p,
                          .topk = sd_cache_topk(r->cache)};
    if (r->ans.n_hdr) {
        if (answer_mask(r, c, err, errlen) < 0) return -1;
        seq->score = r->b_score;
    }
    if (r->h && r->h->hp.type == SD_HEAD_MOA) return loop_moa_feats(r, seq, c->off, err, errlen);
    return 0;
}

void loop_shuffle(loop_run *r) {
    memcpy(r->rng.s, r->st.rng_epoch, sizeof r->rng.s);
    for (int64_t i = 0; i < r->n_train; i++) r->perm[i] = i;
    for (int64_t i = r->n_train - 1; i > 0; i--) {   // Fisher-Yates
        int64_t j = (int64_t)(sd_rng_next(&r->rng) % (uint64_t)(i + 1));
        int64_t t = r->perm[i];
        r->perm[i] = r->perm[j];
        r->perm[j] = t;
    }
}

const loop_chunk *loop_next_chunk(loop_run *r) {
    if (r->st.cursor >= r->n_train) {   // the next epoch's order continues the RNG where this one's left it
        r->st.epoch++;
        r->st.cursor = 0;
        memcpy(r->st.rng_epoch, r->rng.s, sizeof r->rng.s);
        loop_shuffle(r);
    }
    return &r->train[r->perm[r->st.cursor++]];
}

// ---------------------------------------------------------------- initialisation
// The target's output row of token id, in floats (n_embd).
static void target_row(const sd_model *m, int32_t id, float *dst) {
    const sd_tensor *ot = sd_model_file_tensor(m, m->output);
    const int d = m->hp.n_embd;
    sd_type_get(ot->type)->to_float((const uint8_t *)ot->data + (size_t)id * sd_row_size(ot->type, d), dst, d);
}

static void target_rows(const sd_model *m, const sd_head *h, float *dst) {
    for (int i = 0; i < h->hp.n_draft_vocab; i++) target_row(m, h->d2t[i], dst + (size_t)i * m->hp.n_embd);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int loop_extend_vocab(loop_run *r, int n, char *err, size_t errlen) {
    const sd_head *h = r->h;
    const int nv = r->m->hp.n_vocab, n0 = h->hp.n_draft_vocab;
    const int64_t d = h->hp.n_embd;
    SD_ASSERT(n > n0 && n <= nv && h->hp.type != SD_HEAD_MOA);
    int32_t *rank = malloc(sizeof(int32_t) * (size_t)nv), *ids = malloc(sizeof(int32_t) * (size_t)n);
    float *trow = malloc(sizeof(float) * (size_t)d), *ratio = malloc(sizeof(float) * (size_t)n0);
    sd_head *nh = NULL;
    int rv = -1;
    double cov;
    if (!rank || !ids || !trow || !ratio) {
        sd_err(err, errlen, "out of memory");
        goto done;
    }
    if (loop_pick_vocab(r, nv, rank, &cov, err, errlen) < 0) goto done;
    memcpy(ids, h->d2t, sizeof(int32_t) * (size_t)n0);
    for (int i = 0, k = n0; k < n; i++)
        if (h->t2d[rank[i]] < 0) ids[k++] = rank[i];
    sd_head_hp hp = h->hp;
    hp.n_draft_vocab = n;
    if (sd_head_new(&nh, &hp, err, errlen) < 0 || sd_head_set_vocab(nh, ids, n, err, errlen) < 0) goto done;
    memcpy(nh->note, h->note, sizeof nh->note);
    SD_ASSERT(nh->n_t == h->n_t);
    for (int i = 0; i < h->n_t; i++) {
        const sd_head_tensor *a = &h->t[i], *b = &nh->t[i];
        SD_ASSERT(a->ne0 == b->ne0);
        if (a->ne1 == b->ne1) {
            memcpy(nh->w + b->off, h->w + a->off, sizeof(float) * (size_t)(a->ne0 * a->ne1));
            continue;
        }
        SD_ASSERT(a->ne1 == n0 && b->ne1 == n && a->ne0 == d);   // an output matrix: a row per draft token
        for (int j = 0; j < n0; j++) {   // the scale: the head's rows against the target's
            target_row(r->m, h->d2t[j], trow);
            const float *hr = h->w + a->off + (size_t)j * d;
            double sh = 0, st = 0;
            for (int64_t c = 0; c < d; c++) sh += (double)hr[c] * hr[c], st += (double)trow[c] * trow[c];
            ratio[j] = st > 0 ? (float)sqrt(sh / st) : 1.0f;
        }
        qsort(ratio, (size_t)n0, sizeof *ratio, cmp_float);
        const float scale = ratio[n0 / 2];
        for (int j = 0; j < n; j++) {
            float *dst = nh->w + b->off + (size_t)j * d;
            const int old = h->t2d[nh->d2t[j]];
            if (old >= 0) {
                memcpy(dst, h->w + a->off + (size_t)old * d, sizeof(float) * (size_t)d);
            } else {
                target_row(r->m, nh->d2t[j], dst);
                for (int64_t c = 0; c < d; c++) dst[c] *= scale;
            }
        }
    }
    sd_head_free(r->h);
    r->h = nh;
    nh = NULL;
    rv = 0;
done:
    sd_head_free(nh);
    free(rank);
    free(ids);
    free(trow);
    free(ratio);
    return rv;
}

void loop_init_from_target(sd_head *h, const sd_model *m) {
    if (h->hp.type == SD_HEAD_EAGLE3) {
        // fc starts as the selection of the highest layer's state, and the
        // layer's two residual writes (Wo, Wdown) start small: the head
        // begins near the target's own read-out of a late state instead of a
        // random projection (a first loss near the entropy of language, not
        // several times it).
        const int64_t d = h->hp.n_embd;
        float *fc = sd_head_w(h, SD_E3_FC);
        memset(fc, 0, sizeof(float) * (size_t)(3 * d * d));
        for (int64_t r = 0; r < d; r++) fc[r * 3 * d + 2 * d + r] = 1.0f;
        const int small[2] = {SD_E3_WO, SD_E3_DOWN};
        for (int i = 0; i < 2; i++) {
            float *w = sd_head_w(h, small[i]);
            for (int64_t j = 0; j < h->t[small[i]].ne0 * h->t[small[i]].ne1; j++) w[j] *= 0.1f;
        }
        target_rows(m, h, sd_head_w(h, SD_E3_OUT));
        const sd_tensor *nt = m->out_norm;
        sd_type_get(nt->type)->to_float(nt->data, sd_head_w(h, SD_E3_OUT_NORM), m->hp.n_embd);
    } else if (h->hp.type == SD_HEAD_MOA) {
        // the layers' two residual writes (Wo, Wdown) start small: each layer starts near the identity, so
        // the drafted row starts as its token's embedding (docs/moa.md)
        // sa.hidden starts at zero: SA's input starts as the token's embedding alone (a random G h / rms(h),
        // unit-sized against embeddings of a few hundredths, drowned the token: held-back agreement 0.29
        // against 0.40 without it on Qwen2.5-Coder-1.5B, docs/moa-measured.md)
        if (h->hp.moa_sa_hidden) {
            const int g = sd_moa_sa_hidden_t(&h->hp);
            memset(sd_head_w(h, g), 0, sizeof(float) * (size_t)(h->t[g].ne0 * h->t[g].ne1));
        }
        const int base[3] = {SD_MOA_SA, SD_MOA_CA, SD_MOA_LSA}, nb = h->hp.moa_no_lsa ? 2 : 3;
        for (int b = 0; b < nb; b++) {
            const int small[2] = {base[b] + SD_MOA_O, base[b] + SD_MOA_DOWN};
            for (int i = 0; i < 2; i++) {
                float *w = sd_head_w(h, small[i]);
                for (int64_t j = 0; j < h->t[small[i]].ne0 * h->t[small[i]].ne1; j++) w[j] *= 0.1f;
            }
        }
    } else {
        for (int k = 0; k < h->hp.n_medusa; k++) {   // W_k = 0, b_k = 0: each head starts as the target's read-out
            memset(sd_head_w(h, SD_MD_FC(k)), 0, sizeof(float) * (size_t)(h->hp.n_embd * h->hp.n_embd));
            memset(sd_head_w(h, SD_MD_BIAS(k)), 0, sizeof(float) * (size_t)h->hp.n_embd);
            target_rows(m, h, sd_head_w(h, SD_MD_OUT(k)));
        }
    }
}
