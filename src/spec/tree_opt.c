// tree_opt.c - Sequoia's tree sizing: acceptance statistics by (depth,
// rank), the dynamic program over tree shapes, growing a chosen shape with a
// drafter's distributions, and the sd_tree_auto bundle. See tree_opt.h.
#include "spec/tree_opt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

// ================================================================ 1. acceptance statistics

void sd_accept_stats_init(sd_accept_stats *st, int n_rank, int n_depth, double decay) {
    static const double means[SD_TA_MAX_RANK] = {0.6, 0.12, 0.05, 0.02, 0.01, 0.01, 0.01, 0.01};
    memset(st, 0, sizeof *st);
    st->n_rank = SD_MAX(1, SD_MIN(n_rank, SD_TA_MAX_RANK));
    st->n_depth = SD_MAX(1, SD_MIN(n_depth, SD_TA_MAX_DEPTH));
    st->decay = (decay > 0 && decay <= 1) ? decay : 1.0;
    for (int r = 0; r < SD_TA_MAX_RANK; r++) st->prior_mean[r] = means[r];
    st->prior_strength = 4.0;
    st->depth_strength = 8.0;
}

void sd_accept_stats_reset(sd_accept_stats *st) {
    memset(st->tried, 0, sizeof st->tried);
    memset(st->acc, 0, sizeof st->acc);
    memset(st->tried_all, 0, sizeof st->tried_all);
    memset(st->acc_all, 0, sizeof st->acc_all);
    st->n_updates = 0;
}

// Rank of child c among the children of its parent.
static int sibling_rank(const int32_t *parent, const float *p, int n, int c, int by_p) {
    int r = 0, par = parent[c];
    for (int j = 1; j < n; j++) {
        if (j == c || parent[j] != par) continue;
        if (by_p && p) {
            if (p[j] > p[c] || (p[j] == p[c] && j < c)) r++;
        } else if (j < c) {
            r++;
        }
    }
    return r;
}

int sd_accept_stats_update(sd_accept_stats *st, const int32_t *parent, const float *p, int n,
                           const int32_t *path, int n_path) {
    if (n < 1 || n_path < 1 || path[0] != 0) return -1;
    for (int i = 1; i < n_path; i++)
        if (path[i] <= 0 || path[i] >= n || parent[path[i]] != path[i - 1]) return -1;
    int by_p = st->rank_by_p && p;
    for (int d = 0; d < st->n_depth; d++)
        for (int r = 0; r < st->n_rank; r++) {
            st->tried[d][r] *= st->decay;
            st->acc[d][r] *= st->decay;
        }
    for (int r = 0; r < st->n_rank; r++) {
        st->tried_all[r] *= st->decay;
        st->acc_all[r] *= st->decay;
    }
    for (int i = 0; i < n_path; i++) {
        int u = path[i], next = i + 1 < n_path ? path[i + 1] : -1;
        int row = SD_MIN(i, st->n_depth - 1); // children of a depth-i node are at depth i + 1 -> row i
        for (int c = u + 1; c < n; c++) {
            if (parent[c] != u) continue;
            int r = sibling_rank(parent, p, n, c, by_p);
            if (r >= st->n_rank) continue;
            st->tried[row][r] += 1.0;
            st->tried_all[r] += 1.0;
            if (c == next) {
                st->acc[row][r] += 1.0;
                st->acc_all[r] += 1.0;
            }
        }
    }
    st->n_updates++;
    return 0;
}

int sd_accept_stats_update_tree(sd_accept_stats *st, const sd_tree *t, const int32_t *path, int n_path) {
    return sd_accept_stats_update(st, t->parent, t->p, t->n, path, n_path);
}

void sd_accept_stats_probs(const sd_accept_stats *st, int depth, double *out) {
    int row = SD_MAX(0, SD_MIN(depth - 1, st->n_depth - 1));
    double sum = 0.0;
    for (int r = 0; r < SD_TA_MAX_RANK; r++) {
        if (r >= st->n_rank) {
            out[r] = 0.0;
            continue;
        }
        double s0 = st->prior_strength > 0 ? st->prior_strength : 0.0;
        double den0 = st->tried_all[r] + s0;
        double pooled = den0 > 0 ? (st->acc_all[r] + s0 * st->prior_mean[r]) / den0 : st->prior_mean[r];
        double v = pooled;
        if (st->n_depth > 1) {
            double s1 = st->depth_strength > 0 ? st->depth_strength : 0.0;
            double den1 = st->tried[row][r] + s1;
            v = den1 > 0 ? (st->acc[row][r] + s1 * pooled) / den1 : pooled;
        }
        out[r] = SD_MAX(0.0, SD_MIN(1.0, v));
        sum += out[r];
    }
    if (sum > 1.0)
        for (int r = 0; r < st->n_rank; r++) out[r] /= sum;
}

void sd_accept_table_const(sd_accept_table *t, const double *p, int n_rank) {
    memset(t, 0, sizeof *t);
    t->n_rank = SD_MAX(1, SD_MIN(n_rank, SD_TA_MAX_RANK));
    t->n_depth = 1;
    for (int r = 0; r < t->n_rank; r++) t->p[0][r] = p[r];
}

void sd_accept_stats_table(const sd_accept_stats *st, sd_accept_table *t) {
    memset(t, 0, sizeof *t);
    t->n_rank = st->n_rank;
    t->n_depth = st->n_depth;
    for (int d = 1; d <= st->n_depth; d++) sd_accept_stats_probs(st, d, t->p[d - 1]);
}

double sd_accept_table_p(const sd_accept_table *t, int depth, int rank) {
    if (rank < 0 || rank >= t->n_rank || depth < 1) return 0.0;
    int row = SD_MIN(depth, t->n_depth) - 1;
    return t->p[row][rank];
}

// ================================================================ 2. optimiser

#define DN (SD_TA_MAX_NODES + 1)
#define DK (SD_TA_MAX_RANK + 1)
#define DD (SD_TA_MAX_DEPTH + 1)

// G(d, k, m): best expected value contributed by the children of ranks
// k, k+1, ... of a node at depth d, using at most m nodes (the child of rank
// k must exist before the one of rank k + 1). The subtree value of a node at
// depth d with at most n nodes is T(d, n) = 1 + G(d, 0, n - 1).
struct sd_tree_opt_ws {
    double g[DD][DK][DN];    // value
    int16_t ch[DD][DK][DN];  // nodes given to the child of rank k (0 = no more children)
    int16_t cnt[DD][DK][DN]; // nodes actually used
    int8_t dep[DD][DK][DN];  // deepest absolute depth used (d when none)
    int L, N, W;             // parameters of the filled tables
};

int sd_tree_opt_ws_new(sd_tree_opt_ws **out, char *err, size_t errlen) {
    *out = calloc(1, sizeof **out);
    if (!*out) return sd_err(err, errlen, "tree optimiser: out of memory");
    return 0;
}

void sd_tree_opt_ws_free(sd_tree_opt_ws *ws) { free(ws); }

sd_tree_opt_params sd_tree_opt_default_params(void) {
    sd_tree_opt_params p = {.max_nodes = 64, .max_depth = 12, .max_width = 8};
    return p;
}

// Fills the tables for depth limit L, at most N nodes, W children per node.
static void dp_fill(sd_tree_opt_ws *ws, const sd_accept_table *t, int N, int L, int W) {
    ws->L = L;
    ws->N = N;
    ws->W = W;
    for (int d = L; d >= 0; d--) {
        for (int m = 0; m < N; m++) {
            ws->g[d][W][m] = 0.0;
            ws->ch[d][W][m] = 0;
            ws->cnt[d][W][m] = 0;
            ws->dep[d][W][m] = (int8_t)d;
        }
        for (int k = W - 1; k >= 0; k--) {
            double q = d < L ? sd_accept_table_p(t, d + 1, k) : 0.0;
            for (int m = 0; m < N; m++) {
                double best = 0.0;
                int bj = 0;
                if (q > 0) {
                    for (int j = 1; j <= m; j++) {
                        double v = q * (1.0 + ws->g[d + 1][0][j - 1]) + ws->g[d][k + 1][m - j];
                        if (v > best * (1.0 + 1e-12) + 1e-15) {
                            best = v;
                            bj = j;
                        }
                    }
                }
                ws->g[d][k][m] = best;
                ws->ch[d][k][m] = (int16_t)bj;
                if (bj == 0) {
                    ws->cnt[d][k][m] = 0;
                    ws->dep[d][k][m] = (int8_t)d;
                } else {
                    int16_t c1 = (int16_t)(1 + ws->cnt[d + 1][0][bj - 1]);
                    ws->cnt[d][k][m] = (int16_t)(c1 + ws->cnt[d][k + 1][m - bj]);
                    int8_t a = ws->dep[d + 1][0][bj - 1], b = ws->dep[d][k + 1][m - bj];
                    ws->dep[d][k][m] = a > b ? a : b;
                }
            }
        }
    }
}

static int check_params(const sd_accept_table *t, int N, int L, int W, char *err, size_t errlen) {
    if (N < 1 || N > SD_TA_MAX_NODES)
        return sd_err(err, errlen, "tree optimiser: max_nodes %d outside 1..%d", N, SD_TA_MAX_NODES);
    if (L < 0 || L > SD_TA_MAX_DEPTH)
        return sd_err(err, errlen, "tree optimiser: max_depth %d outside 0..%d", L, SD_TA_MAX_DEPTH);
    if (W < 1 || W > SD_TA_MAX_RANK)
        return sd_err(err, errlen, "tree optimiser: max_width %d outside 1..%d", W, SD_TA_MAX_RANK);
    if (t->n_rank < 1 || t->n_depth < 1) return sd_err(err, errlen, "tree optimiser: empty acceptance table");
    return 0;
}

int sd_tree_opt_values(sd_tree_opt_ws *ws, const sd_accept_table *t, int max_nodes, int L, int max_width,
                       double *value) {
    int W = SD_MIN(max_width, t->n_rank);
    if (check_params(t, max_nodes, L, W, NULL, 0) < 0) return -1;
    dp_fill(ws, t, max_nodes, L, W);
    value[0] = 0.0;
    for (int n = 1; n <= max_nodes; n++) value[n] = 1.0 + ws->g[0][0][n - 1];
    return 0;
}

// Depth-first construction from the filled tables into tmp arrays.
typedef struct {
    int n;
    int32_t parent[SD_TA_MAX_NODES], rank[SD_TA_MAX_NODES], depth[SD_TA_MAX_NODES];
    double f[SD_TA_MAX_NODES];
} dfs_tree;

// d: table row; r0: the row of the root (row - r0 = depth; r0 > 0 only for
// depth-independent tables, whose rows depend only on the height left).
static void build(const sd_tree_opt_ws *ws, const sd_accept_table *t, dfs_tree *o, int d, int r0, int n, int par,
                  int rank, double f) {
    int me = o->n++;
    o->parent[me] = par;
    o->rank[me] = rank;
    o->depth[me] = d - r0;
    o->f[me] = f;
    int m = n - 1;
    for (int k = 0; k < ws->W && m > 0; k++) {
        int j = ws->ch[d][k][m];
        if (j == 0) break;
        build(ws, t, o, d + 1, r0, j, me, k, f * sd_accept_table_p(t, d - r0 + 1, k));
        m -= j;
    }
}

// Reorders the depth-first tree breadth-first into out.
static void to_shape(const dfs_tree *o, sd_tree_shape *out) {
    int32_t order[SD_TA_MAX_NODES], newid[SD_TA_MAX_NODES];
    int head = 0, tail = 0;
    order[tail++] = 0;
    newid[0] = 0;
    while (head < tail) {
        int u = order[head++];
        for (int c = u + 1; c < o->n; c++) // children in rank order: depth-first adds rank k before k + 1
            if (o->parent[c] == u) {
                newid[c] = tail;
                order[tail++] = c;
            }
    }
    // breadth-first by parent order gives depth order as well
    out->n = o->n;
    out->depth = 0;
    out->expected_tokens = 0.0;
    for (int i = 0; i < o->n; i++) {
        int u = order[i];
        out->parent[i] = o->parent[u] < 0 ? -1 : newid[o->parent[u]];
        out->rank[i] = o->rank[u];
        out->depth_of[i] = o->depth[u];
        out->f[i] = o->f[u];
        out->expected_tokens += o->f[u];
        if (o->depth[u] > out->depth) out->depth = o->depth[u];
    }
}

static void shape_from_tables(const sd_tree_opt_ws *ws, const sd_accept_table *t, int r0, int n,
                              sd_tree_shape *out) {
    dfs_tree o;
    o.n = 0;
    build(ws, t, &o, r0, r0, n, -1, 0, 1.0);
    to_shape(&o, out);
}

int sd_tree_opt_fixed(sd_tree_opt_ws *ws, const sd_accept_table *t, int n, int L, int max_width,
                      sd_tree_shape *out, char *err, size_t errlen) {
    int W = SD_MIN(max_width, t->n_rank);
    if (check_params(t, n, L, W, err, errlen) < 0) return -1;
    dp_fill(ws, t, n, L, W);
    memset(out, 0, sizeof *out);
    shape_from_tables(ws, t, 0, n, out);
    return 0;
}

static double tree_cost(const sd_cost_curve *c, int n, int depth) {
    return sd_cost_curve_verify_ms(c, n) + sd_cost_curve_draft_ms(c, n, depth);
}

int sd_tree_opt(sd_tree_opt_ws *ws, const sd_accept_table *t, const sd_cost_curve *c,
                const sd_tree_opt_params *p, sd_tree_shape *out, char *err, size_t errlen) {
    int N = p->max_nodes, Lmax = p->max_depth, W = SD_MIN(p->max_width, t->n_rank);
    if (check_params(t, N, Lmax, W, err, errlen) < 0) return -1;
    if (c->n_points < 1) return sd_err(err, errlen, "tree optimiser: the cost curve has no points");
    double base = sd_cost_curve_verify_ms(c, 1);
    if (!(base > 0)) return sd_err(err, errlen, "tree optimiser: the cost of one token must be > 0");
    double best_rate = 1.0 / base; // the root alone: plain decoding
    int best_L = 0, best_n = 1, best_cnt = 1;
    // A depth-independent table: the subtree tables depend only on the height
    // left, so one fill for max_depth serves every limit L (root at row
    // max_depth - L). Otherwise one fill per L.
    int shared = t->n_depth == 1;
    if (shared) dp_fill(ws, t, N, Lmax, W);
    for (int L = 1; L <= Lmax; L++) {
        int r0 = shared ? Lmax - L : 0;
        if (!shared) dp_fill(ws, t, N, L, W);
        for (int n = 2; n <= N; n++) {
            int cnt = 1 + ws->cnt[r0][0][n - 1];
            int dep = ws->dep[r0][0][n - 1] - r0;
            double v = 1.0 + ws->g[r0][0][n - 1];
            double cost = tree_cost(c, cnt, dep);
            if (!(cost > 0)) continue;
            double rate = v / cost;
            if (rate > best_rate * (1.0 + 1e-9) || (rate >= best_rate * (1.0 - 1e-9) && cnt < best_cnt)) {
                best_rate = rate;
                best_L = L;
                best_n = n;
                best_cnt = cnt;
            }
        }
    }
    int r0 = shared ? Lmax - best_L : 0;
    if (!shared) dp_fill(ws, t, best_n, best_L, W);
    memset(out, 0, sizeof *out);
    shape_from_tables(ws, t, r0, best_n, out);
    out->cost_ms = tree_cost(c, out->n, out->depth);
    out->tokens_per_s = out->cost_ms > 0 ? out->expected_tokens / out->cost_ms * 1000.0 : 0.0;
    out->speedup = out->tokens_per_s / (1000.0 / base);
    return 0;
}

int sd_tree_shape_widths(const sd_tree_shape *s, int *widths, int max, int *n_widths) {
    if (max < s->depth) return -1;
    int nch[SD_TA_MAX_NODES] = {0};
    for (int i = 1; i < s->n; i++) nch[s->parent[i]]++;
    int exact = 1;
    for (int d = 0; d < s->depth; d++) {
        int lo = 1 << 30, hi = 0;
        for (int i = 0; i < s->n; i++)
            if (s->depth_of[i] == d) {
                lo = SD_MIN(lo, nch[i]);
                hi = SD_MAX(hi, nch[i]);
            }
        widths[d] = hi;
        if (lo != hi) exact = 0;
    }
    *n_widths = s->depth;
    return exact;
}

int sd_tree_shape_format(const sd_tree_shape *s, char *buf, size_t len) {
    int w[SD_TA_MAX_DEPTH], nw = 0;
    int exact = sd_tree_shape_widths(s, w, SD_TA_MAX_DEPTH, &nw) == 1;
    // at most ~100 + 4 * SD_TA_MAX_NODES characters: composed whole, then copied
    char tmp[160 + 8 * SD_TA_MAX_NODES];
    int k = snprintf(tmp, sizeof tmp, "n=%d depth=%d E=%.3f", s->n, s->depth, s->expected_tokens);
    if (s->tokens_per_s > 0 && s->tokens_per_s < 1e12)
        k += snprintf(tmp + k, sizeof tmp - (size_t)k, " tok/s=%.1f speedup=%.2f", s->tokens_per_s, s->speedup);
    if (exact) {
        k += snprintf(tmp + k, sizeof tmp - (size_t)k, " widths ");
        for (int d = 0; d < nw; d++) k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%s%d", d ? "," : "", w[d]);
        if (nw == 0) k += snprintf(tmp + k, sizeof tmp - (size_t)k, "-");
    } else {
        k += snprintf(tmp + k, sizeof tmp - (size_t)k, " parents ");
        for (int i = 1; i < s->n && i < SD_TA_MAX_NODES; i++)
            k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%s%d", i > 1 ? "," : "", s->parent[i]);
    }
    if (buf && len > 0) {
        size_t c = SD_MIN((size_t)k, len - 1);
        memcpy(buf, tmp, c);
        buf[c] = 0;
    }
    return k;
}

int sd_tree_grow_shape(sd_tree *t, const sd_tree_shape *s, const sd_tree_grow *g, char *err, size_t errlen) {
    if (t->n != 1) return sd_err(err, errlen, "grow shape: the tree must hold only the root");
    if (!g || !g->dist) return sd_err(err, errlen, "grow shape: no distribution callback");
    if (s->n < 1 || s->n > SD_TA_MAX_NODES) return sd_err(err, errlen, "grow shape: bad shape (%d nodes)", s->n);
    int32_t map[SD_TA_MAX_NODES], nch[SD_TA_MAX_NODES] = {0};
    int32_t nodes[SD_TA_MAX_NODES], snodes[SD_TA_MAX_NODES];
    float *rows[SD_TA_MAX_NODES];
    for (int i = 0; i < s->n; i++) map[i] = -1;
    for (int i = 1; i < s->n; i++) nch[s->parent[i]]++;
    map[0] = 0;
    for (int d = 0; d < s->depth; d++) {
        int cnt = 0;
        for (int i = 0; i < s->n; i++)
            if (s->depth_of[i] == d && nch[i] > 0 && map[i] >= 0) {
                float *row = sd_tree_dist_for(t, map[i]);
                if (!row) return sd_err(err, errlen, "grow shape: out of distribution rows");
                snodes[cnt] = i;
                nodes[cnt] = map[i];
                rows[cnt] = row;
                cnt++;
            }
        if (cnt == 0) break;
        if (g->dist(g->ud, t, nodes, cnt, rows, err, errlen) < 0) return -1;
        for (int q = 0; q < cnt; q++) {
            int u = snodes[q], k = SD_MIN(nch[u], SD_TA_MAX_RANK);
            int32_t ids[SD_TA_MAX_RANK];
            float ps[SD_TA_MAX_RANK];
            const float *row = rows[q];
            // the top k by probability, or by race score under the target's noise (tree.h); only the
            // drafter's support is read (a head's draft vocabulary: 8192 of 49152 entries)
            const int m = sd_tree_rank_children(t, nodes[q], row, g, k, ids);
            for (int r = 0; r < m; r++) ps[r] = row[ids[r]];
            int r = 0;
            for (int c = u + 1; c < s->n; c++) { // shape children of u, in rank order
                if (s->parent[c] != u) continue;
                if (r < m) {
                    int id = sd_tree_add(t, nodes[q], ids[r], ps[r]);
                    if (id < 0) return sd_err(err, errlen, "grow shape: the tree is full (%d nodes)", t->cap);
                    map[c] = id;
                }
                r++;
            }
            t->mode[nodes[q]] = SD_CHILDREN_ANY;
        }
    }
    return 0;
}

// ================================================================ the bundle

sd_tree_auto_params sd_tree_auto_default_params(void) {
    sd_tree_auto_params p;
    p.opt = sd_tree_opt_default_params();
    p.n_rank = 4;
    p.n_depth = 8;
    p.decay = 0.99;
    p.reopt_every = 16;
    p.refine_cost = 1;
    return p;
}

static void chain_shape(sd_tree_shape *s, int k) {
    memset(s, 0, sizeof *s);
    s->n = k + 1;
    s->depth = k;
    for (int i = 0; i <= k; i++) {
        s->parent[i] = i - 1;
        s->depth_of[i] = i;
        s->f[i] = 1.0;
    }
    s->expected_tokens = k + 1;
}

int sd_tree_auto_new(sd_tree_auto **out, const sd_tree_auto_params *p, char *err, size_t errlen) {
    sd_tree_auto *a = calloc(1, sizeof *a);
    if (!a) return sd_err(err, errlen, "tree auto: out of memory");
    a->p = p ? *p : sd_tree_auto_default_params();
    if (sd_tree_opt_ws_new(&a->ws, err, errlen) < 0) {
        free(a);
        return -1;
    }
    sd_accept_stats_init(&a->stats, a->p.n_rank, a->p.n_depth, a->p.decay);
    sd_cost_curve_init(&a->cost);
    sd_accept_stats_table(&a->stats, &a->table);
    chain_shape(&a->shape, SD_MAX(0, SD_MIN(4, SD_MIN(a->p.opt.max_depth, a->p.opt.max_nodes - 1))));
    *out = a;
    return 0;
}

void sd_tree_auto_free(sd_tree_auto *a) {
    if (!a) return;
    sd_tree_opt_ws_free(a->ws);
    free(a);
}

int sd_tree_auto_optimise(sd_tree_auto *a, char *err, size_t errlen) {
    sd_accept_stats_table(&a->stats, &a->table);
    a->steps_since_opt = 0;
    return sd_tree_opt(a->ws, &a->table, &a->cost, &a->p.opt, &a->shape, err, errlen);
}

int sd_tree_auto_observe(sd_tree_auto *a, const sd_tree *tree, const int32_t *path, int n_path,
                         double draft_ms, double verify_ms, char *err, size_t errlen) {
    if (sd_accept_stats_update_tree(&a->stats, tree, path, n_path) < 0)
        return sd_err(err, errlen, "tree auto: the accepted path is not a root-to-node chain of the tree");
    if (a->p.refine_cost && verify_ms > 0 && a->cost.n_points > 0) sd_cost_curve_observe(&a->cost, tree->n, verify_ms);
    if (a->p.refine_cost && draft_ms > 0) sd_cost_curve_observe_draft(&a->cost, tree->n, sd_tree_max_depth(tree), draft_ms);
    a->steps_since_opt++;
    a->steps++;
    // early, the statistics move most (the prior is worth 4 steps): re-chosen after the bundle's steps 4 and 8
    // too (not sooner: two unlucky steps would stop the drafting for the next 16)
    const int early = a->steps < a->p.reopt_every && (a->steps == 4 || a->steps == 8);
    if (a->p.reopt_every <= 0 || (a->steps_since_opt < a->p.reopt_every && !early) || a->cost.n_points == 0) return 0;
    int old_n = a->shape.n;
    int32_t old_parent[SD_TA_MAX_NODES];
    memcpy(old_parent, a->shape.parent, sizeof old_parent);
    if (sd_tree_auto_optimise(a, err, errlen) < 0) return -1;
    return old_n != a->shape.n || memcmp(old_parent, a->shape.parent, (size_t)old_n * sizeof old_parent[0]) != 0;
}
