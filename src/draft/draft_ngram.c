// draft_ngram.c - prompt lookup over the committed text plus optional
// REST-style retrieval from a corpus suffix array.
//
// The index. Every committed position e is the end of the n-grams
// text[e-n+1..e] for n = 1..N. One open-addressing hash table maps (n,
// n-gram hash) to the newest end position; prev[n-1][e] links each end
// position to the previous one with the same n-gram, so the occurrences of an
// n-gram are a chain from newest to oldest. Appending a token costs N table
// probes; nothing is ever rescanned. The drafter keeps its own copy of the
// committed text: propose appends what it has not seen (the whole prompt at
// the first step), accept appends the accepted tokens and the bonus, and a
// text that no longer extends the copy (a new sequence without reset) clears
// the index.
//
// The proposal (SD_NGRAM_FILL). Continuations of the matches go into a trie
// whose node weights are the summed weights of the continuations through
// them. A parent is at least as heavy as its children and was created before
// them, so ordering the trie nodes by (weight desc, creation asc) lists
// parents first: taking nodes in that order while the branch budget and the
// node limit allow gives a tree closed under ancestors.
//
// The proposal (SD_NGRAM_SIZED, the default). How much to draft is decided
// per step from the evidence, because the evidence varies enormously from
// step to step: one step copies a 20-token stretch of the prompt, the next
// has only a 1-token match, the next none at all.
//  - Matches. The chains of the n-grams ending the text (n = N down to 1,
//    newest first, at most max_matches in all) give the matches; each match's
//    true length l is measured backwards beyond N (up to NG_LMAX), so a long
//    copy is recognised as one. A continuation that runs into the end of the
//    text goes on with itself (a match at distance P predicts period P), so
//    repetitive text gets full-length drafts.
//  - Probability. Once the first j-1 tokens of a continuation are accepted,
//    its match is l + j - 1 tokens long; measured on greedy outputs, the
//    acceptance of the next token depends on that length alone (the same at
//    depth 1 and deeper), and is higher when two or more matches agree. So a
//    trie node's class is (bucket of its longest match extended to its depth,
//    one or several supporting matches), and P(node | parent accepted) =
//    p(class) * share, share being the node's part of the evidence weight
//    among its siblings (each match weighs the prior odds of its length, so a
//    long match outweighs many short ones). p(class) starts from a prior and
//    is learnt online from every verified child (sd_class_stats). The path
//    probability f of a node is the product down from the root.
//  - Size. The candidates in decreasing f (closed under ancestors), within
//    max_branches continuations and the node limit, go to the per-step sizer
//    (tree_sizer.h): it keeps the k that maximise E[tokens] - rate * ms under
//    the target's cost curve. With no match, or only weak ones on a curve
//    where an extra node is not nearly free, nothing is drafted and the step
//    is a plain 1-token forward; a long copy gets a long chain; siblings
//    appear only when their evidence is comparable.
#include "draft/draft_ngram.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/suffix.h"
#include "spec/tree_sizer.h"

sd_draft_ngram_params sd_draft_ngram_default_params(void) {
    sd_draft_ngram_params p;
    memset(&p, 0, sizeof p);
    p.n_max = 3;
    p.k_max = 8;
    p.max_branches = 4;
    p.max_matches = 16;
    p.ctx_weight = 2;
    p.n_ctx = 4096;
    p.datastore = NULL;
    p.ds_shared = NULL;
    p.ds_max_matches = 32;
    p.ds_min_n = 1;
    p.tree_auto = sd_draft_auto_default_params();
    return p;
}

typedef struct ng_entry {
    uint64_t key;   // hash of the n-gram (n mixed in)
    int32_t head;   // newest end position, -1: empty slot
    int32_t n;      // n-gram length
} ng_entry;

typedef struct ng {
    sd_draft_ngram_params p;
    sd_datastore *ds;      // owned, or NULL
    // Committed text and its index.
    int32_t *hist;         // (cap) the committed text as far as seen
    int n_hist;
    int cap;               // positions the index is sized for
    int32_t *prev;         // (n_max, cap) previous end position of the same n-gram, -1: none
    ng_entry *tab;         // (tab_mask + 1)
    uint32_t tab_mask;
    int tab_dirty;         // tab holds entries of a forgotten text
    // Trie of continuations (rebuilt each step).
    int trie_cap;
    int n_trie;
    int32_t *t_tok;        // (trie_cap) token; node 0 is the root
    int32_t *t_par;        // (trie_cap) parent
    int32_t *t_child;      // (trie_cap) first child, -1 none
    int32_t *t_sib;        // (trie_cap) next sibling, -1 none
    int64_t *t_w;          // (trie_cap) summed weight of the continuations through the node
    int32_t *t_order;      // (trie_cap) nodes by weight
    int32_t *t_sel;        // (trie_cap) tree node of a trie node, -1 not taken
    int32_t *t_nch;        // (trie_cap) children taken into the tree
    // Last proposal, for inspection.
    int last_n, last_ctx, last_ds;
    sd_draft_auto *au;     // SD_NGRAM_FILL with tree_auto.on: the Sequoia sizing state, else NULL
    // SD_NGRAM_SIZED: match lengths, probabilities and the learnt state.
    int32_t *occ_e;        // (max_matches) end positions of this step's context matches
    int32_t *occ_l;        // (max_matches) their match lengths (<= NG_LMAX)
    int32_t *cont;         // (k_max) one continuation
    double *t_wd;          // (trie_cap) summed evidence weight through the node
    double *t_wch;         // (trie_cap) summed weight of the node's children
    int32_t *t_m;          // (trie_cap) longest context match through the node, extended to its depth (0: none)
    int32_t *t_mds;        // (trie_cap) the same for corpus matches
    int32_t *t_sup;        // (trie_cap) context matches through the node
    double *t_f;           // (trie_cap) probability that the path to the node is accepted
    double *t_p;           // (trie_cap) P(node accepted | parent accepted)
    double *t_share;       // (trie_cap) weight share among the siblings
    int32_t *t_cls;        // (trie_cap) evidence class
    double *sel_f;         // (trie_cap) f of the candidates in the order taken
    int32_t *sel_x;        // (trie_cap) their trie nodes
    int32_t *n_cls;        // (trie_cap) class of tree node i of the last proposal
    double *n_share;       // (trie_cap) share of tree node i of the last proposal
    int last_tree_n;       // nodes of the last proposed tree (0: none pending)
    sd_class_stats cls;    // acceptance per class
    sd_step_sizer sizer;   // cost curve and running rate
} ng;

static uint64_t ng_mix(uint64_t h, int32_t t) {
    h = (h ^ (uint32_t)t) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}
static uint64_t ng_key(uint64_t h, int n) { return h ^ ((uint64_t)n * 0xD6E8FEB86659FD93ull); }
static uint32_t ng_slot0(uint64_t key, uint32_t mask) { return (uint32_t)(key ^ (key >> 32)) & mask; }

static void ng_clear_tab(ng *g) {
    for (uint32_t i = 0; i <= g->tab_mask; i++) g->tab[i].head = -1;
    g->tab_dirty = 0;
}

// Indexes position e (hist[e] already stored).
static void ng_index(ng *g, int e) {
    uint64_t h = 0x243F6A8885A308D3ull;
    int nmax = SD_MIN(g->p.n_max, e + 1);
    for (int n = 1; n <= nmax; n++) {
        h = ng_mix(h, g->hist[e - n + 1]);
        uint64_t key = ng_key(h, n);
        uint32_t s = ng_slot0(key, g->tab_mask);
        while (g->tab[s].head >= 0 && (g->tab[s].key != key || g->tab[s].n != n)) s = (s + 1) & g->tab_mask;
        g->prev[(size_t)(n - 1) * (size_t)g->cap + (size_t)e] = g->tab[s].head;
        g->tab[s].key = key;
        g->tab[s].n = n;
        g->tab[s].head = e;
    }
}

// Sizes the index for cap positions and re-indexes the text (amortised
// doubling; also the first allocation).
static int ng_grow(ng *g, int cap) {
    uint32_t tcap = 1024;
    while (tcap < 2u * (uint32_t)g->p.n_max * (uint32_t)cap) tcap <<= 1;
    int32_t *hist = realloc(g->hist, sizeof(int32_t) * (size_t)cap);
    if (!hist) return -1;
    g->hist = hist;
    int32_t *prev = malloc(sizeof(int32_t) * (size_t)g->p.n_max * (size_t)cap);
    ng_entry *tab = malloc(sizeof(ng_entry) * tcap);
    if (!prev || !tab) {
        free(prev);
        free(tab);
        return -1;
    }
    free(g->prev);
    free(g->tab);
    g->prev = prev;
    g->tab = tab;
    g->tab_mask = tcap - 1;
    g->cap = cap;
    ng_clear_tab(g);
    for (int e = 0; e < g->n_hist; e++) ng_index(g, e);
    return 0;
}

static int ng_append(ng *g, int32_t t) {
    if (g->n_hist == g->cap && (g->cap > INT32_MAX / 2 || ng_grow(g, g->cap * 2) < 0)) return -1;
    g->hist[g->n_hist] = t;
    ng_index(g, g->n_hist++);
    return 0;
}

// ------------------------------------------------------------------ trie
static void trie_reset(ng *g) {
    g->n_trie = 1;
    g->t_tok[0] = -1;
    g->t_par[0] = -1;
    g->t_child[0] = -1;
    g->t_sib[0] = -1;
    g->t_w[0] = 0;
}

// The child of node cur with token tok, created (all counts zero, appended
// at the end of the sibling list: creation order) if absent; -1 when the trie
// is full.
static int trie_child(ng *g, int cur, int32_t tok) {
    int ch = g->t_child[cur];
    while (ch >= 0 && g->t_tok[ch] != tok) ch = g->t_sib[ch];
    if (ch >= 0) return ch;
    if (g->n_trie >= g->trie_cap) return -1;
    ch = g->n_trie++;
    g->t_tok[ch] = tok;
    g->t_par[ch] = cur;
    g->t_child[ch] = -1;
    g->t_sib[ch] = -1;
    g->t_w[ch] = 0;
    g->t_wd[ch] = 0;
    g->t_m[ch] = g->t_mds[ch] = g->t_sup[ch] = 0;
    if (g->t_child[cur] < 0) g->t_child[cur] = ch;
    else {
        int s = g->t_child[cur];
        while (g->t_sib[s] >= 0) s = g->t_sib[s];
        g->t_sib[s] = ch;
    }
    return ch;
}

static void trie_insert(ng *g, const int32_t *c, int len, int w) {
    int cur = 0;
    g->t_w[0] += w;
    for (int j = 0; j < len; j++) {
        int ch = trie_child(g, cur, c[j]);
        if (ch < 0) return;
        g->t_w[ch] += w;
        cur = ch;
    }
}

// a before b: heavier first, then created first.
static int trie_before(const ng *g, int32_t a, int32_t b) {
    return g->t_w[a] > g->t_w[b] || (g->t_w[a] == g->t_w[b] && a < b);
}

// Sorts idx by before (shell sort: no allocation).
static void trie_sort(const ng *g, int32_t *idx, int n, int (*before)(const ng *, int32_t, int32_t)) {
    static const int gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t gi = 0; gi < sizeof gaps / sizeof *gaps; gi++) {
        int gap = gaps[gi];
        for (int i = gap; i < n; i++) {
            int32_t v = idx[i];
            int j = i;
            while (j >= gap && before(g, v, idx[j - gap])) {
                idx[j] = idx[j - gap];
                j -= gap;
            }
            idx[j] = v;
        }
    }
}

// Brings the index up to the committed text.
static int ng_sync(ng *g, const sd_draft_ctx *ctx, char *err, size_t errlen) {
    const int L = ctx->n_tokens;
    if (g->n_hist > L || (g->n_hist > 0 && (g->hist[0] != ctx->tokens[0] ||
                                             g->hist[g->n_hist - 1] != ctx->tokens[g->n_hist - 1]))) {
        g->n_hist = 0;
        g->tab_dirty = 1;
    }
    if (g->tab_dirty) ng_clear_tab(g);
    for (int i = g->n_hist; i < L; i++)
        if (ng_append(g, ctx->tokens[i]) < 0) return sd_err(err, errlen, "n-gram drafter: out of memory");
    return 0;
}

// Newest end position of the n-gram with key (-1: none).
static int ng_head(const ng *g, uint64_t key, int n) {
    uint32_t s = ng_slot0(key, g->tab_mask);
    while (g->tab[s].head >= 0 && (g->tab[s].key != key || g->tab[s].n != n)) s = (s + 1) & g->tab_mask;
    return g->tab[s].head;
}

// ------------------------------------------------------------------ vtable
static int ng_propose_capped(ng *g, const sd_draft_ctx *ctx, sd_tree *tree, int node_cap, int depth_cap,
                             char *err, size_t errlen);

static int ng_propose_sized(ng *g, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen);

static int ng_propose(sd_drafter *dr, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    ng *g = dr->impl;
    if (g->p.sizing == SD_NGRAM_SIZED) {
        int rc = ng_propose_sized(g, ctx, tree, err, errlen);
        g->last_tree_n = rc < 0 ? 0 : tree->n;
        return rc;
    }
    if (!g->au) return ng_propose_capped(g, ctx, tree, 0, 0, err, errlen);
    const sd_tree_shape *shape = sd_draft_auto_begin(g->au);
    int rc = shape->n > 1 ? ng_propose_capped(g, ctx, tree, shape->n, shape->depth, err, errlen)
                          : ng_propose_capped(g, ctx, tree, 1, 1, err, errlen);
    sd_draft_auto_end(g->au);
    return rc;
}

// propose with at most node_cap nodes (root included) of depth <= depth_cap (0: no caps).
static double ng_weight(int l, int ds);
static void trie_insert_sized(ng *g, const int32_t *c, int len, double w, int l, int ds);

// Retrieval: the continuations (up to K tokens) of the longest suffix of
// h[0..L) (at most N tokens) present in the corpus, spread over its
// occurrences, into the trie (sized: weighted by the match length).
static void ng_retrieve(ng *g, const int32_t *h, int L, int K, int sized) {
    const sd_datastore *ds = g->ds;
    if (!ds) return;
    for (int m = SD_MIN(g->p.n_max, L); m >= SD_MAX(1, g->p.ds_min_n) && g->last_ds == 0; m--) {
        int64_t lo, hi;
        sd_sa_range(ds->tok, ds->n, ds->sa, h + L - m, m, &lo, &hi);
        int64_t cnt = hi - lo;
        if (cnt <= 0) continue;
        int take = (int)SD_MIN(cnt, (int64_t)g->p.ds_max_matches);
        for (int i = 0; i < take; i++) {
            int64_t p = ds->sa[lo + (int64_t)i * cnt / take] + (int64_t)m;   // spread over the range
            int len = (int)SD_MIN((int64_t)K, ds->n - p);
            if (len <= 0) continue;
            if (sized) trie_insert_sized(g, ds->tok + p, len, ng_weight(m, 1), m, 1);
            else trie_insert(g, ds->tok + p, len, 1);
            g->last_ds++;
        }
    }
}

static int ng_propose_capped(ng *g, const sd_draft_ctx *ctx, sd_tree *tree, int node_cap, int depth_cap,
                             char *err, size_t errlen) {
    const int L = ctx->n_tokens;
    g->last_n = g->last_ctx = g->last_ds = 0;
    if (ng_sync(g, ctx, err, errlen) < 0) return -1;
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    if (node_cap > 0) max_nodes = SD_MIN(max_nodes, node_cap);
    if (L < 1 || max_nodes <= 1) return 0;
    const int K = depth_cap > 0 ? SD_MIN(g->p.k_max, depth_cap) : g->p.k_max;
    const int32_t *h = g->hist;
    trie_reset(g);

    // Prompt lookup: the longest n (<= N) whose n-gram ending at L-1 occurred before.
    uint64_t hh = 0x243F6A8885A308D3ull;
    uint64_t keys[SD_NGRAM_MAX_N + 1];
    int nmax = SD_MIN(g->p.n_max, L - 1);
    for (int n = 1; n <= nmax; n++) keys[n] = ng_key(hh = ng_mix(hh, h[L - n]), n);
    for (int n = nmax; n >= 1 && g->last_ctx == 0; n--) {
        uint32_t s = ng_slot0(keys[n], g->tab_mask);
        while (g->tab[s].head >= 0 && (g->tab[s].key != keys[n] || g->tab[s].n != n)) s = (s + 1) & g->tab_mask;
        const int32_t *prev = g->prev + (size_t)(n - 1) * (size_t)g->cap;
        for (int e = g->tab[s].head; e >= 0 && g->last_ctx < g->p.max_matches; e = prev[e]) {
            if (e >= L - 1) continue;   // the final position itself
            int same = 1;
            for (int j = 0; j < n && same; j++) same = h[e - j] == h[L - 1 - j];
            if (!same) continue;   // hash collision
            int len = SD_MIN(K, L - 1 - e);
            trie_insert(g, h + e + 1, len, g->p.ctx_weight);
            g->last_ctx++;
        }
        if (g->last_ctx) g->last_n = n;
    }

    ng_retrieve(g, h, L, K, 0);
    if (g->n_trie <= 1) return 0;

    // Heaviest trie nodes first, within the branch budget and the node limit.
    int n_ord = 0;
    for (int i = 1; i < g->n_trie; i++) g->t_order[n_ord++] = i;
    trie_sort(g, g->t_order, n_ord, trie_before);
    for (int i = 0; i < g->n_trie; i++) g->t_sel[i] = -1, g->t_nch[i] = 0;
    g->t_sel[0] = 0;
    int leaves = 0;
    for (int o = 0; o < n_ord && tree->n < max_nodes; o++) {
        int x = g->t_order[o], par = g->t_par[x];
        if (g->t_sel[par] < 0) continue;
        int inc = g->t_nch[par] > 0 || par == 0;
        if (leaves + inc > g->p.max_branches) continue;
        float pr = (float)((double)g->t_w[x] / (double)g->t_w[par]);
        int id = sd_tree_add(tree, g->t_sel[par], g->t_tok[x], pr);
        if (id < 0) break;
        g->t_sel[x] = id;
        g->t_nch[par]++;
        leaves += inc;
    }
    return 0;
}

// ------------------------------------------------------------------ per-step sizing
// Evidence classes: the match length m of a candidate (its context match
// extended to the candidate's depth) in NG_NCLS buckets; corpus matches use
// the next NG_NCLS classes.
#define NG_LMAX 64    // longest match length measured (the backward extension stops there)
#define NG_NCLS 10
static int ng_bucket(int m) {
    static const int hi[NG_NCLS - 1] = {1, 2, 3, 4, 6, 8, 12, 16, 24};
    int b = 0;
    while (b < NG_NCLS - 1 && m > hi[b]) b++;
    return b;
}
// Prior P(accepted) of the most recent longest context match's next token by
// match length (measured on greedy chat outputs of a small instruct model:
// 1-token matches are right about a quarter of the time, 3-token matches 60%,
// matches of 16+ tokens, copies, more than 90%); corpus matches are weaker.
static const double ng_prior_ctx[NG_NCLS] = {0.25, 0.45, 0.6, 0.68, 0.75, 0.8, 0.82, 0.88, 0.92, 0.95};
static const double ng_prior_ctx2[NG_NCLS] = {0.45, 0.65, 0.78, 0.82, 0.9, 0.92, 0.93, 0.94, 0.95, 0.97};
static const double ng_prior_ds[NG_NCLS] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75};
// Evidence weight of a match of length l among the matches of a step: the
// odds of the prior, so a long match outweighs many short ones.
static double ng_weight(int l, int ds) {
    double q = (ds ? ng_prior_ds : ng_prior_ctx)[ng_bucket(l)];
    return q / (1.0 - q);
}

// Inserts one continuation (len tokens) whose match has length l, weight w.
static void trie_insert_sized(ng *g, const int32_t *c, int len, double w, int l, int ds) {
    int cur = 0;
    g->t_wd[0] += w;
    for (int j = 0; j < len; j++) {
        int ch = trie_child(g, cur, c[j]);
        if (ch < 0) return;
        g->t_wd[ch] += w;
        int m = SD_MIN(l + j, NG_LMAX);
        int32_t *mm = ds ? &g->t_mds[ch] : &g->t_m[ch];
        if (m > *mm) *mm = m;
        if (!ds) g->t_sup[ch]++;
        cur = ch;
    }
}

// a before b: more probable first, then created first.
static int sized_before(const ng *g, int32_t a, int32_t b) {
    return g->t_f[a] > g->t_f[b] || (g->t_f[a] == g->t_f[b] && a < b);
}


// The continuation of length len after end position e of the text h[0..L):
// h[e+1..L) and then, where the text ends, the continuation itself (a match
// at distance P = L-1-e predicts a text of period P: "a b a b" -> "a b ...").
static void ng_continuation(const int32_t *h, int L, int e, int len, int32_t *out) {
    int P = L - 1 - e;
    for (int j = 0; j < len; j++) out[j] = e + 1 + j < L ? h[e + 1 + j] : out[j - P];
}

static int ng_propose_sized(ng *g, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    const int L = ctx->n_tokens;
    g->last_n = g->last_ctx = g->last_ds = 0;
    if (ng_sync(g, ctx, err, errlen) < 0) return -1;
    int max_nodes = ctx->max_nodes > 0 ? SD_MIN(ctx->max_nodes, tree->cap) : tree->cap;
    if (g->p.tree_auto.on) max_nodes = SD_MIN(max_nodes, g->p.tree_auto.max_nodes);
    if (L < 2 || max_nodes <= 1) return 0;
    const int K = g->p.tree_auto.on ? SD_MIN(g->p.k_max, g->p.tree_auto.max_depth) : g->p.k_max;
    const int32_t *h = g->hist;
    trie_reset(g);
    g->t_wd[0] = 0;
    g->t_m[0] = g->t_mds[0] = 0;

    // Context matches: n = N down to 1, most recent first; each match's
    // length is measured backwards beyond n (up to NG_LMAX). A match longer
    // than n < N was already met in the chain of n + 1.
    uint64_t hh = 0x243F6A8885A308D3ull;
    uint64_t keys[SD_NGRAM_MAX_N + 1];
    int nmax = SD_MIN(g->p.n_max, L - 1);
    for (int n = 1; n <= nmax; n++) keys[n] = ng_key(hh = ng_mix(hh, h[L - n]), n);
    int n_occ = 0;
    for (int n = nmax; n >= 1 && n_occ < g->p.max_matches; n--) {
        const int32_t *prev = g->prev + (size_t)(n - 1) * (size_t)g->cap;
        for (int e = ng_head(g, keys[n], n); e >= 0 && n_occ < g->p.max_matches; e = prev[e]) {
            if (e >= L - 1) continue;   // the final position itself
            int l = 0;
            while (l < NG_LMAX && l <= e && h[e - l] == h[L - 1 - l]) l++;
            if (l < n) continue;               // hash collision
            if (l > n && n < nmax) continue;   // counted with n + 1
            g->occ_e[n_occ] = e;
            g->occ_l[n_occ] = l;
            n_occ++;
            if (!g->last_n) g->last_n = n;
        }
    }
    g->last_ctx = n_occ;
    for (int i = 0; i < n_occ; i++) {
        ng_continuation(h, L, g->occ_e[i], K, g->cont);
        trie_insert_sized(g, g->cont, K, ng_weight(g->occ_l[i], 0), g->occ_l[i], 0);
    }
    ng_retrieve(g, h, L, K, 1);
    if (g->n_trie <= 1) return 0;

    // Probabilities, parents before children (creation order).
    for (int i = 0; i < g->n_trie; i++) g->t_wch[i] = 0;
    for (int x = 1; x < g->n_trie; x++) g->t_wch[g->t_par[x]] += g->t_wd[x];
    g->t_f[0] = 1.0;
    for (int x = 1; x < g->n_trie; x++) {
        int par = g->t_par[x];
        double share = g->t_wch[par] > 0 ? g->t_wd[x] / g->t_wch[par] : 0.0;
        int c = g->t_m[x] > 0 ? ng_bucket(g->t_m[x]) + (g->t_sup[x] >= 2 ? NG_NCLS : 0)
                              : 2 * NG_NCLS + ng_bucket(g->t_mds[x]);
        g->t_cls[x] = c;
        g->t_share[x] = share;
        g->t_p[x] = sd_class_stats_p(&g->cls, c) * share;
        g->t_f[x] = g->t_f[par] * g->t_p[x];
    }
    // Candidates by probability (a parent is strictly more probable than its
    // children and was created first: the order is closed under ancestors),
    // within the branch budget and the node limit.
    int n_ord = 0;
    for (int i = 1; i < g->n_trie; i++) g->t_order[n_ord++] = i;
    trie_sort(g, g->t_order, n_ord, sized_before);
    for (int i = 0; i < g->n_trie; i++) g->t_sel[i] = -1, g->t_nch[i] = 0;
    g->t_sel[0] = 0;
    int leaves = 0, m = 0;
    for (int o = 0; o < n_ord && m < max_nodes - 1; o++) {
        int x = g->t_order[o], par = g->t_par[x];
        if (g->t_sel[par] < 0 || !(g->t_f[x] > 0)) continue;
        int inc = g->t_nch[par] > 0 || par == 0;
        if (leaves + inc > g->p.max_branches) continue;
        g->t_sel[x] = 1;   // taken (tree ids assigned below)
        g->t_nch[par]++;
        leaves += inc;
        g->sel_x[m] = x;
        g->sel_f[m] = g->t_f[x];
        m++;
    }
    int k = sd_step_sizer_choose(&g->sizer, g->sel_f, m, NULL);
    for (int i = 0; i < g->n_trie; i++) g->t_sel[i] = -1;
    g->t_sel[0] = 0;
    for (int i = 0; i < k; i++) {
        int x = g->sel_x[i];
        int id = sd_tree_add(tree, g->t_sel[g->t_par[x]], g->t_tok[x], (float)g->t_p[x]);
        if (id < 0) break;
        g->t_sel[x] = id;
        g->n_cls[id] = g->t_cls[x];
        g->n_share[id] = g->t_share[x];
    }
    return 0;
}

// The tree the sizer drafts, at the start, after a single fresh match of l
// tokens (a chain: shown as the representative choice when the tree is
// automatic; the real tree varies per step with the evidence).
static void ng_policy_shape(const ng *g, int l, sd_tree_shape *sh) {
    int K = g->p.tree_auto.on ? SD_MIN(g->p.k_max, g->p.tree_auto.max_depth) : g->p.k_max;
    int max_n = g->p.tree_auto.on ? g->p.tree_auto.max_nodes : 1 + K;
    K = SD_MIN(SD_MIN(K, max_n - 1), SD_TA_MAX_NODES - 1);
    double f[SD_TA_MAX_NODES], acc = 1.0;
    for (int j = 0; j < K; j++) f[j] = acc *= sd_class_stats_p(&g->cls, ng_bucket(SD_MIN(l + j, NG_LMAX)));
    int k = sd_step_sizer_choose(&g->sizer, f, K, NULL);
    memset(sh, 0, sizeof *sh);
    sh->n = k + 1;
    sh->depth = k;
    sh->expected_tokens = 1.0;
    for (int i = 0; i <= k; i++) {
        sh->parent[i] = i - 1;
        sh->depth_of[i] = i;
        sh->f[i] = i ? f[i - 1] : 1.0;
        if (i) sh->expected_tokens += f[i - 1];
    }
    double base = sd_cost_curve_verify_ms(&g->sizer.cost, 1);
    sh->cost_ms = sd_cost_curve_verify_ms(&g->sizer.cost, sh->n);
    sh->tokens_per_s = sh->cost_ms > 0 ? sh->expected_tokens / sh->cost_ms * 1000.0 : 0.0;
    sh->speedup = base > 0 ? sh->tokens_per_s / (1000.0 / base) : 0.0;
}

static int ng_accept(sd_drafter *dr, const sd_step_record *rec, char *err, size_t errlen) {
    ng *g = dr->impl;
    const sd_tree *tree = rec->tree;
    const int32_t *path = rec->path;
    const int n_path = rec->n_path;
    const int32_t bonus = rec->bonus;
    if (g->au && sd_draft_auto_accept(g->au, rec, err, errlen) < 0) return -1;
    if (g->p.sizing == SD_NGRAM_SIZED && g->last_tree_n == tree->n && n_path >= 1) {
        // Every child of an accepted node is an observation of its class.
        sd_class_stats_step(&g->cls);
        for (int i = 0; i < n_path; i++) {
            int u = path[i], next = i + 1 < n_path ? path[i + 1] : -1;
            for (int c = u + 1; c < tree->n; c++)
                if (tree->parent[c] == u) sd_class_stats_add(&g->cls, g->n_cls[c], g->n_share[c], c == next);
        }
        sd_step_sizer_observe(&g->sizer, tree->n, n_path, rec->verify_ms);
    }
    g->last_tree_n = 0;
    if (g->n_hist == 0 || g->hist[g->n_hist - 1] != tree->token[0]) {   // not in step: resync at propose
        g->n_hist = 0;
        g->tab_dirty = 1;
        return 0;
    }
    for (int k = 1; k < n_path; k++)
        if (ng_append(g, tree->token[path[k]]) < 0) return sd_err(err, errlen, "n-gram drafter: out of memory");
    if (ng_append(g, bonus) < 0) return sd_err(err, errlen, "n-gram drafter: out of memory");
    return 0;
}

static void ng_reset(sd_drafter *dr) {
    ng *g = dr->impl;
    g->n_hist = 0;
    g->tab_dirty = 1;
    g->last_tree_n = 0;
    // A new sequence drafts as a fresh drafter would (the same seed gives the
    // same output): the learnt acceptance and rate go; the cost curve, a
    // property of the machine, stays.
    if (g->p.sizing == SD_NGRAM_SIZED) {
        sd_class_stats_reset(&g->cls);
        sd_step_sizer_reset(&g->sizer);
    }
    sd_draft_auto_reset(g->au);
}

static void ng_free(sd_drafter *dr) {
    if (!dr) return;
    ng *g = dr->impl;
    if (g) {
        sd_datastore_free(g->ds);
        sd_draft_auto_free(g->au);
        free(g->hist);
        free(g->prev);
        free(g->tab);
        free(g->t_tok);
        free(g->t_par);
        free(g->t_child);
        free(g->t_sib);
        free(g->t_w);
        free(g->t_order);
        free(g->t_sel);
        free(g->t_nch);
        free(g->occ_e);
        free(g->occ_l);
        free(g->cont);
        free(g->t_wd);
        free(g->t_wch);
        free(g->t_m);
        free(g->t_mds);
        free(g->t_sup);
        free(g->t_f);
        free(g->t_p);
        free(g->t_share);
        free(g->t_cls);
        free(g->sel_f);
        free(g->sel_x);
        free(g->n_cls);
        free(g->n_share);
        free(g);
    }
    free(dr);
}

static const char *ng_note(const sd_drafter *d) {
    const ng *g = d->impl;
    return g->ds ? g->ds->note : "";
}

static const sd_drafter_vt ng_vt = {
    .name = "ngram",
    .propose = ng_propose,
    .accept = ng_accept,
    .reset = ng_reset,
    .free = ng_free,
    .note = ng_note,
};

const char *sd_draft_ngram_note(const sd_drafter *d) { return d && d->vt == &ng_vt ? ng_note(d) : ""; }

void sd_draft_ngram_last(const sd_drafter *d, int *n_matched, int *n_ctx_matches, int *n_ds_matches) {
    const ng *g = d && d->vt == &ng_vt ? d->impl : NULL;
    if (n_matched) *n_matched = g ? g->last_n : 0;
    if (n_ctx_matches) *n_ctx_matches = g ? g->last_ctx : 0;
    if (n_ds_matches) *n_ds_matches = g ? g->last_ds : 0;
}

int sd_draft_ngram_new(sd_drafter **out, const sd_draft_ngram_params *pp, const sd_tokenizer *tok, char *err,
                       size_t errlen) {
    *out = NULL;
    sd_draft_ngram_params p = pp ? *pp : sd_draft_ngram_default_params();
    if (p.sizing != SD_NGRAM_SIZED && p.sizing != SD_NGRAM_FILL)
        return sd_err(err, errlen, "n-gram drafter: unknown sizing %d", p.sizing);
    if (p.n_max < 1 || p.n_max > SD_NGRAM_MAX_N)
        return sd_err(err, errlen, "n-gram drafter: N must be in 1..%d (got %d)", SD_NGRAM_MAX_N, p.n_max);
    if (p.k_max < 1 || p.k_max > 256) return sd_err(err, errlen, "n-gram drafter: K must be in 1..256 (got %d)", p.k_max);
    if (p.max_branches < 1) p.max_branches = 1;
    if (p.max_matches < 1) p.max_matches = 1;
    if (p.ctx_weight < 1) p.ctx_weight = 1;
    if (p.n_ctx < 16) p.n_ctx = 16;
    if (p.ds_max_matches < 1) p.ds_max_matches = 1;
    if (p.ds_shared) p.datastore = NULL;   // the shared one is used
    if (p.datastore && !tok) return sd_err(err, errlen, "n-gram drafter: a datastore needs the tokenizer");
    ng *g = calloc(1, sizeof *g);
    sd_drafter *dr = g ? sd_drafter_alloc(&ng_vt, g) : NULL;
    if (!dr) {
        free(g);
        return sd_err(err, errlen, "n-gram drafter: out of memory");
    }
    g->p = p;
    g->p.datastore = NULL;   // not kept: the caller's string
    g->p.ds_shared = NULL;
    const int has_ds = p.datastore || p.ds_shared;
    g->trie_cap = 1 + (p.max_matches + (has_ds ? p.ds_max_matches : 0)) * p.k_max;
    size_t tc = (size_t)g->trie_cap;
    g->t_tok = malloc(sizeof(int32_t) * tc);
    g->t_par = malloc(sizeof(int32_t) * tc);
    g->t_child = malloc(sizeof(int32_t) * tc);
    g->t_sib = malloc(sizeof(int32_t) * tc);
    g->t_w = malloc(sizeof(int64_t) * tc);
    g->t_order = malloc(sizeof(int32_t) * tc);
    g->t_sel = malloc(sizeof(int32_t) * tc);
    g->t_nch = malloc(sizeof(int32_t) * tc);
    g->occ_e = malloc(sizeof(int32_t) * (size_t)p.max_matches);
    g->occ_l = malloc(sizeof(int32_t) * (size_t)p.max_matches);
    g->cont = malloc(sizeof(int32_t) * (size_t)p.k_max);
    g->t_wd = malloc(sizeof(double) * tc);
    g->t_wch = malloc(sizeof(double) * tc);
    g->t_m = malloc(sizeof(int32_t) * tc);
    g->t_mds = malloc(sizeof(int32_t) * tc);
    g->t_sup = malloc(sizeof(int32_t) * tc);
    g->t_f = malloc(sizeof(double) * tc);
    g->t_p = malloc(sizeof(double) * tc);
    g->t_share = malloc(sizeof(double) * tc);
    g->t_cls = malloc(sizeof(int32_t) * tc);
    g->sel_f = malloc(sizeof(double) * tc);
    g->sel_x = malloc(sizeof(int32_t) * tc);
    g->n_cls = malloc(sizeof(int32_t) * tc);
    g->n_share = malloc(sizeof(double) * tc);
    if (!g->t_tok || !g->t_par || !g->t_child || !g->t_sib || !g->t_w || !g->t_order || !g->t_sel || !g->t_nch ||
        !g->occ_e || !g->occ_l || !g->cont || !g->t_wd || !g->t_wch || !g->t_m || !g->t_mds || !g->t_sup || !g->t_f ||
        !g->t_p || !g->t_share || !g->t_cls || !g->sel_f || !g->sel_x || !g->n_cls || !g->n_share ||
        ng_grow(g, p.n_ctx) < 0) {
        ng_free(dr);
        return sd_err(err, errlen, "n-gram drafter: out of memory");
    }
    if (p.ds_shared) g->ds = sd_datastore_ref(p.ds_shared);
    else if (p.datastore && sd_datastore_open(&g->ds, p.datastore, tok, err, errlen) < 0) {
        ng_free(dr);
        return -1;
    }
    if (p.sizing == SD_NGRAM_FILL && p.tree_auto.on && sd_draft_auto_new(&g->au, &p.tree_auto, err, errlen) < 0) {
        ng_free(dr);
        return -1;
    }
    if (p.sizing == SD_NGRAM_SIZED) {
        if (p.tree_auto.on) {
            if (!p.tree_auto.cost || p.tree_auto.cost->n_points < 1) {
                ng_free(dr);
                return sd_err(err, errlen, "n-gram drafter: the automatic tree needs the target's cost curve");
            }
            if (p.tree_auto.max_nodes < 2 || p.tree_auto.max_depth < 1) {
                ng_free(dr);
                return sd_err(err, errlen, "n-gram drafter: automatic tree limits %d nodes, depth %d",
                              p.tree_auto.max_nodes, p.tree_auto.max_depth);
            }
        }
        double prior[3 * NG_NCLS];
        for (int c = 0; c < NG_NCLS; c++)
            prior[c] = ng_prior_ctx[c], prior[NG_NCLS + c] = ng_prior_ctx2[c], prior[2 * NG_NCLS + c] = ng_prior_ds[c];
        sd_class_stats_init(&g->cls, 3 * NG_NCLS, prior, 4.0, 0.98);
        sd_step_sizer_init(&g->sizer, p.tree_auto.on ? p.tree_auto.cost : NULL);
        g->p.tree_auto.cost = NULL;   // copied into the sizer
        if (p.tree_auto.on && p.tree_auto.report) {
            sd_tree_shape sh;
            char buf[1024], line[1100];
            ng_policy_shape(g, p.n_max, &sh);
            sd_tree_shape_format(&sh, buf, sizeof buf);
            snprintf(line, sizeof line, "tree auto: %s", buf);
            p.tree_auto.report(p.tree_auto.user, line);
        }
    }
    *out = dr;
    return 0;
}
