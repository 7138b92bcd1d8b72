// draft_lookahead.c - lookahead decoding: Jacobi window + n-gram pool (see
// draft_lookahead.h for the method and the attention layout).
#include "draft/draft_lookahead.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct la {
    int W, N, G;          // window columns, n-gram size, n-grams verified per step
    int L;                // window levels, N - 1
    int per_key;          // n-grams kept per first token
    int pool_keys;        // blocks (distinct first tokens) in the pool
    int text_ngrams;      // 1: committed text feeds the pool too
    int nv;               // vocabulary size

    int32_t *win;         // (L, W) window tokens, level-major; level 0 is the trunk
    int init;             // window filled
    long n_upd;           // Jacobi updates done
    int w_used;           // columns placed in the batch by the last aux() (0: none)
    int tree_n;           // tree size at the last aux(): aux node k is batch node tree_n + k

    // Pool: a block per distinct first token, n-grams newest first.
    int32_t *key_blk;     // (nv) block holding first token t, -1 if none
    int32_t *blk_key;     // (pool_keys) first token of a block
    int32_t *blk_cnt;     // (pool_keys) n-grams in a block, <= per_key
    uint64_t *blk_stamp;  // (pool_keys) clock of the last insertion (least recent is evicted)
    int32_t *grams;       // (pool_keys, per_key, L) continuation tokens, newest first
    int n_blk;            // blocks in use
    uint64_t clock;       // insertion counter
    long n_harvest;       // n-grams harvested from the window
    int n_text;           // committed tokens already fed to the pool (text_ngrams)
    int32_t text_last;    // token at n_text - 1 then (a different text is detected and re-read)
    int32_t *gram;        // (N) scratch n-gram
} la;

sd_draft_lookahead_params sd_draft_lookahead_default_params(void) {
    sd_draft_lookahead_params p;
    p.W = 2;
    p.N = 3;
    p.G = 2;
    p.per_key = 0;
    p.pool_keys = 4096;
    p.text_ngrams = 0;
    return p;
}

static void pool_clear(la *g) {
    for (int t = 0; t < g->nv; t++) g->key_blk[t] = -1;
    g->n_blk = 0;
    g->clock = 0;
}

// Inserts the n-gram key, cont[0..L) as the newest of key's block.
static void pool_insert(la *g, int32_t key, const int32_t *cont) {
    if (key < 0 || key >= g->nv) return;
    const int L = g->L;
    int b = g->key_blk[key];
    if (b < 0) {
        if (g->n_blk < g->pool_keys) {
            b = g->n_blk++;
        } else {   // evict the block updated least recently
            b = 0;
            for (int k = 1; k < g->n_blk; k++)
                if (g->blk_stamp[k] < g->blk_stamp[b]) b = k;
            g->key_blk[g->blk_key[b]] = -1;
        }
        g->key_blk[key] = b;
        g->blk_key[b] = key;
        g->blk_cnt[b] = 0;
    }
    int32_t *gr = g->grams + (size_t)b * (size_t)g->per_key * (size_t)L;
    int cnt = g->blk_cnt[b];
    int at = cnt < g->per_key ? cnt : g->per_key - 1;   // slot dropped by the shift (the oldest when full)
    for (int r = 0; r < cnt; r++) {
        if (!memcmp(gr + (size_t)r * L, cont, sizeof(int32_t) * (size_t)L)) {
            at = r;   // already present: becomes the newest
            break;
        }
    }
    if (at == cnt) g->blk_cnt[b] = cnt + 1;
    memmove(gr + L, gr, sizeof(int32_t) * (size_t)at * (size_t)L);
    memcpy(gr, cont, sizeof(int32_t) * (size_t)L);
    g->blk_stamp[b] = ++g->clock;
}

// Feeds the n-grams of the committed text not seen yet into the pool.
static void pool_sync_text(la *g, const int32_t *tok, int n) {
    if (n < g->n_text || (g->n_text > 0 && tok[g->n_text - 1] != g->text_last)) g->n_text = 0;   // another text
    for (int k = SD_MAX(g->n_text, g->N - 1); k < n; k++) pool_insert(g, tok[k - g->N + 1], tok + k - g->N + 2);
    g->n_text = n;
    g->text_last = n > 0 ? tok[n - 1] : -1;
}

static int la_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    la *g = dr->impl;
    if (g->text_ngrams) pool_sync_text(g, ctx->tokens, ctx->n_tokens);
    int32_t root = tree->token[0];
    if (root < 0 || root >= g->nv) return 0;
    int b = g->key_blk[root];
    if (b < 0) return 0;
    const int lim = SD_MIN(ctx->max_nodes, tree->cap);
    const int32_t *gr = g->grams + (size_t)b * (size_t)g->per_key * (size_t)g->L;
    const int n_c = SD_MIN(g->blk_cnt[b], g->G);
    // Candidates newest first, merged by shared prefixes (a trie below the root).
    for (int c = 0; c < n_c && tree->n < lim; c++) {
        int u = 0;
        for (int k = 0; k < g->L; k++) {
            int32_t t = gr[(size_t)c * g->L + k];
            int nx = -1;
            for (int j = u + 1; j < tree->n; j++) {
                if (tree->parent[j] == u && tree->token[j] == t) {
                    nx = j;
                    break;
                }
            }
            if (nx < 0) {
                if (tree->n >= lim) break;
                nx = sd_tree_add(tree, u, t, 1.0f);
                if (nx < 0) break;
            }
            u = nx;
        }
    }
    return 0;
}

static int la_aux(sd_drafter *dr, const sd_draft_ctx *ctx, const sd_tree *tree, sd_aux_nodes *aux, char *err,
                  size_t errlen) {
    (void)err;
    (void)errlen;
    la *g = dr->impl;
    aux->n = 0;
    g->w_used = 0;
    if (!g->init) {   // initial guesses: tokens of the committed text, at random
        for (int k = 0; k < g->L * g->W; k++)
            g->win[k] = ctx->n_tokens > 0 ? ctx->tokens[sd_rng_next(ctx->rng) % (uint64_t)ctx->n_tokens]
                                          : (int32_t)(sd_rng_next(ctx->rng) % (uint64_t)g->nv);
        g->init = 1;
    }
    const int L = g->L;
    int w = SD_MIN(g->W, aux->cap / L);
    if (w <= 0) return 0;
    const int base = tree->n;
    for (int j = 0; j < L; j++) {
        for (int i = 0; i < w; i++) {
            int k = j * w + i;
            aux->token[k] = g->win[j * g->W + i];
            if (j == 0) aux->parent[k] = i == 0 ? 0 : base + i - 1;   // the trunk: a chain off the root
            else aux->parent[k] = base + (j - 1) * w + i;            // column i: a chain off trunk node i
            aux->logits[k] = j == L - 1;
        }
    }
    aux->n = w * L;
    g->w_used = w;
    g->tree_n = base;
    return 0;
}

static int32_t argmax_row(const float *row, int n) {
    int32_t best = 0;
    for (int v = 1; v < n; v++)
        if (row[v] > row[best]) best = v;
    return best;
}

// The window slides by one position per step whatever was accepted (as in
// the paper): each column's next guess is the target's argmax after it; the
// committed text reaches the pool at propose.
static int la_accept(sd_drafter *dr, const sd_step_record *rec, char *err, size_t errlen) {
    la *g = dr->impl;
    const sd_tree *tree = rec->tree;
    const sd_aux_nodes *aux = rec->aux;
    const int w = g->w_used, L = g->L;
    g->w_used = 0;
    if (w <= 0 || !aux || aux->n != w * L || tree->n != g->tree_n) return 0;
    const int harvest = g->n_upd >= L - 1;   // columns are model trajectories by now
    for (int i = 0; i < w; i++) {
        const float *lg = rec->logits(rec->lstate, g->tree_n + (L - 1) * w + i);
        if (!lg) return sd_err(err, errlen, "lookahead: no target logits for window column %d", i);
        int32_t nx = argmax_row(lg, g->nv);
        for (int j = 0; j < L; j++) g->gram[j] = g->win[j * g->W + i];
        g->gram[L] = nx;
        if (harvest) {
            pool_insert(g, g->gram[0], g->gram + 1);
            g->n_harvest++;
        }
        for (int j = 0; j < L; j++) g->win[j * g->W + i] = g->gram[j + 1];   // levels shift down
    }
    g->n_upd++;
    return 0;
}

static void la_reset(sd_drafter *dr) {
    la *g = dr->impl;
    pool_clear(g);
    g->init = 0;
    g->n_upd = 0;
    g->w_used = 0;
    g->n_harvest = 0;
    g->n_text = 0;
}

static void la_free(sd_drafter *dr) {
    if (!dr) return;
    la *g = dr->impl;
    if (g) {
        free(g->win);
        free(g->key_blk);
        free(g->blk_key);
        free(g->blk_cnt);
        free(g->blk_stamp);
        free(g->grams);
        free(g->gram);
        free(g);
    }
    free(dr);
}

static const sd_drafter_vt la_vt = {
    .name = "lookahead",
    .propose = la_propose,
    .aux = la_aux,
    .accept = la_accept,
    .reset = la_reset,
    .free = la_free,
};

int sd_draft_lookahead_new(sd_drafter **out, const sd_draft_lookahead_params *p, int n_vocab, char *err,
                           size_t errlen) {
    if (!out) return sd_err(err, errlen, "lookahead: out is NULL");
    *out = NULL;
    sd_draft_lookahead_params q = p ? *p : sd_draft_lookahead_default_params();
    if (q.per_key <= 0) q.per_key = q.G;
    if (q.W < 1 || q.W > 256) return sd_err(err, errlen, "lookahead: W=%d must be in 1..256", q.W);
    if (q.N < 2 || q.N > 16) return sd_err(err, errlen, "lookahead: N=%d must be in 2..16", q.N);
    if (q.G < 1 || q.G > 256) return sd_err(err, errlen, "lookahead: G=%d must be in 1..256", q.G);
    if (q.per_key > 256) return sd_err(err, errlen, "lookahead: per_key=%d must be <= 256", q.per_key);
    if (q.pool_keys < 1 || q.pool_keys > (1 << 20))
        return sd_err(err, errlen, "lookahead: pool_keys=%d must be in 1..%d", q.pool_keys, 1 << 20);
    if (n_vocab < 1) return sd_err(err, errlen, "lookahead: n_vocab=%d", n_vocab);
    la *g = calloc(1, sizeof *g);
    sd_drafter *dr = g ? sd_drafter_alloc(&la_vt, g) : NULL;
    if (!dr) {
        free(g);
        return sd_err(err, errlen, "lookahead: out of memory");
    }
    g->W = q.W;
    g->N = q.N;
    g->G = q.G;
    g->L = q.N - 1;
    g->per_key = q.per_key;
    g->pool_keys = q.pool_keys;
    g->text_ngrams = q.text_ngrams != 0;
    g->nv = n_vocab;
    g->win = malloc(sizeof(int32_t) * (size_t)g->L * (size_t)g->W);
    g->key_blk = malloc(sizeof(int32_t) * (size_t)n_vocab);
    g->blk_key = malloc(sizeof(int32_t) * (size_t)q.pool_keys);
    g->blk_cnt = malloc(sizeof(int32_t) * (size_t)q.pool_keys);
    g->blk_stamp = malloc(sizeof(uint64_t) * (size_t)q.pool_keys);
    g->grams = malloc(sizeof(int32_t) * (size_t)q.pool_keys * (size_t)q.per_key * (size_t)g->L);
    g->gram = malloc(sizeof(int32_t) * (size_t)q.N);
    if (!g->win || !g->key_blk || !g->blk_key || !g->blk_cnt || !g->blk_stamp || !g->grams || !g->gram) {
        la_free(dr);
        return sd_err(err, errlen, "lookahead: out of memory (pool of %d keys x %d n-grams)", q.pool_keys,
                      q.per_key);
    }
    la_reset(dr);
    *out = dr;
    return 0;
}

// ---------------------------------------------------------------- inspection
int32_t sd_draft_lookahead_window(const sd_drafter *d, int level, int col) {
    const la *g = d->impl;
    if (!g->init || level < 0 || level >= g->L || col < 0 || col >= g->W) return -1;
    return g->win[level * g->W + col];
}

int sd_draft_lookahead_pool_get(const sd_drafter *d, int32_t key, int32_t *out, int max) {
    const la *g = d->impl;
    if (key < 0 || key >= g->nv || g->key_blk[key] < 0) return 0;
    int b = g->key_blk[key];
    int cnt = g->blk_cnt[b];
    int m = SD_MIN(cnt, max);
    if (m > 0 && out)
        memcpy(out, g->grams + (size_t)b * (size_t)g->per_key * (size_t)g->L, sizeof(int32_t) * (size_t)m * (size_t)g->L);
    return cnt;
}

int sd_draft_lookahead_pool_keys(const sd_drafter *d) { return ((const la *)d->impl)->n_blk; }

long sd_draft_lookahead_n_harvested(const sd_drafter *d) { return ((const la *)d->impl)->n_harvest; }

void sd_draft_lookahead_set_window(sd_drafter *d, const int32_t *tokens, int n_updates) {
    la *g = d->impl;
    memcpy(g->win, tokens, sizeof(int32_t) * (size_t)g->L * (size_t)g->W);
    g->init = 1;
    g->n_upd = n_updates;
}
