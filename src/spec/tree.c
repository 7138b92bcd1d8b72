// tree.c - token trees: storage, paths, and the model-independent builders
// (chain, width vector, EAGLE-2 dynamic tree, prune, SpecInfer merge).
#include "spec/tree.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "specdec_spec.h"   // sd_tree_add is public (SD_API)
#include "runtime/race.h"

int sd_tree_init(sd_tree *t, int cap, int n_vocab, int n_dist_cap) {
    memset(t, 0, sizeof *t);
    if (cap < 1 || n_vocab < 1 || n_dist_cap < 0) return -1;
    t->cap = cap;
    t->n_vocab = n_vocab;
    t->n_dist_cap = n_dist_cap;
    t->token = malloc(sizeof(int32_t) * (size_t)cap);
    t->parent = malloc(sizeof(int32_t) * (size_t)cap);
    t->depth = malloc(sizeof(int32_t) * (size_t)cap);
    t->p = malloc(sizeof(float) * (size_t)cap);
    t->dist_row = malloc(sizeof(int32_t) * (size_t)cap);
    t->mode = malloc((size_t)cap);
    t->scratch = malloc(sizeof(int32_t) * 4 * (size_t)cap);
    t->jscratch = malloc(sizeof(double) * (size_t)cap);
    t->rowptr = malloc(sizeof(float *) * (size_t)cap);
    if (n_dist_cap > 0) t->dist = malloc(sizeof(float) * (size_t)n_dist_cap * (size_t)n_vocab);
    if (!t->token || !t->parent || !t->depth || !t->p || !t->dist_row || !t->mode || !t->scratch ||
        !t->jscratch || !t->rowptr || (n_dist_cap > 0 && !t->dist)) {
        sd_tree_free(t);
        return -1;
    }
    sd_tree_reset(t, 0);
    return 0;
}

void sd_tree_free(sd_tree *t) {
    if (!t) return;
    free(t->token);
    free(t->parent);
    free(t->depth);
    free(t->p);
    free(t->dist_row);
    free(t->mode);
    free(t->scratch);
    free(t->jscratch);
    free(t->rowptr);
    free(t->dist);
    memset(t, 0, sizeof *t);
}

void sd_tree_reset(sd_tree *t, int32_t root_token) {
    t->n = 1;
    t->n_dist = 0;
    t->token[0] = root_token;
    t->parent[0] = -1;
    t->depth[0] = 0;
    t->p[0] = 1.0f;
    t->dist_row[0] = -1;
    t->mode[0] = SD_CHILDREN_ANY;
}

int sd_tree_add(sd_tree *t, int parent, int32_t token, float p) {
    if (t->n >= t->cap || parent < 0 || parent >= t->n) return -1;
    int i = t->n++;
    t->token[i] = token;
    t->parent[i] = parent;
    t->depth[i] = t->depth[parent] + 1;
    t->p[i] = p;
    t->dist_row[i] = -1;
    t->mode[i] = SD_CHILDREN_ANY;
    return i;
}

float *sd_tree_dist_for(sd_tree *t, int i) {
    if (i < 0 || i >= t->n) return NULL;
    if (t->dist_row[i] >= 0) return t->dist + (size_t)t->dist_row[i] * (size_t)t->n_vocab;
    if (t->n_dist >= t->n_dist_cap) return NULL;
    t->dist_row[i] = t->n_dist++;
    return t->dist + (size_t)t->dist_row[i] * (size_t)t->n_vocab;
}

const float *sd_tree_dist(const sd_tree *t, int i) {
    if (i < 0 || i >= t->n || t->dist_row[i] < 0) return NULL;
    return t->dist + (size_t)t->dist_row[i] * (size_t)t->n_vocab;
}

int sd_tree_path(const sd_tree *t, int i, int32_t *out) {
    int len = t->depth[i] + 1;
    for (int k = len - 1; k >= 0; k--) {
        out[k] = i;
        i = t->parent[i];
    }
    return len;
}

double sd_tree_joint(const sd_tree *t, int i) {
    double j = 1.0;
    for (; i > 0; i = t->parent[i]) j *= t->p[i];
    return j;
}

int sd_tree_n_children(const sd_tree *t, int i) {
    int c = 0;
    for (int j = i + 1; j < t->n; j++) c += t->parent[j] == i;
    return c;
}

int sd_tree_max_depth(const sd_tree *t) {
    int d = 0;
    for (int i = 0; i < t->n; i++) d = SD_MAX(d, t->depth[i]);
    return d;
}

// Joint probabilities of all nodes into t->jscratch (parents precede children).
static void tree_joints(sd_tree *t) {
    t->jscratch[0] = 1.0;
    for (int i = 1; i < t->n; i++) t->jscratch[i] = t->jscratch[t->parent[i]] * (double)t->p[i];
}

// Sorts idx[0..n) by jscratch descending, ties by index ascending (insertion
// sort: n is a few hundred at most).
static void sort_by_joint(const sd_tree *t, int32_t *idx, int n) {
    for (int a = 1; a < n; a++) {
        int32_t v = idx[a];
        double jv = t->jscratch[v];
        int b = a - 1;
        while (b >= 0 && (t->jscratch[idx[b]] < jv || (t->jscratch[idx[b]] == jv && idx[b] > v))) {
            idx[b + 1] = idx[b];
            b--;
        }
        idx[b + 1] = v;
    }
}

// Writes the k most probable tokens of row (descending, ties: lower id) into
// out; returns how many have probability > 0 (at most k). The row's mass lies
// on the ids support[0..n) (strictly increasing), or anywhere when support is
// NULL (n = n_vocab).
static int top_k(const float *row, const int32_t *support, int n, int k, int32_t *out) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        const int v = support ? support[i] : i;
        float x = row[v];
        if (!(x > 0.0f)) continue;
        if (m == k && !(x > row[out[m - 1]])) continue;
        int b = m < k ? m++ : k - 1;
        while (b > 0 && row[out[b - 1]] < x) {
            out[b] = out[b - 1];
            b--;
        }
        out[b] = v;
    }
    return m;
}

int sd_tree_rank_children(const sd_tree *t, int node, const float *row, const sd_tree_grow *g, int k, int32_t *out) {
    const int32_t *sup = g->support;
    const int n_sup = sup ? g->n_support : t->n_vocab;
    k = SD_MIN(k, 64);
    if (g->race) return sd_race_rank(g->race->key, g->race->pos0 + t->depth[node], row, sup, n_sup, k, out);
    return top_k(row, sup, n_sup, k, out);
}

// Draws from row restricted to tokens not in excl[0..n_excl); -1 if no mass is left.
static int32_t draw_excluding(const float *row, int n_vocab, const int32_t *excl, int n_excl, double u) {
    double tot = 0.0;
    for (int v = 0; v < n_vocab; v++) tot += row[v];
    for (int e = 0; e < n_excl; e++) tot -= row[excl[e]];
    if (!(tot > 0.0)) return -1;
    double r = u * tot, acc = 0.0;
    int32_t last = -1;
    for (int v = 0; v < n_vocab; v++) {
        if (!(row[v] > 0.0f)) continue;
        int skip = 0;
        for (int e = 0; e < n_excl; e++) skip |= excl[e] == v;
        if (skip) continue;
        last = v;
        acc += row[v];
        if (r < acc) return v;
    }
    return last;   // rounding: the last token with mass
}

// Expands the nodes front[0..nf) (all at one depth) by up to width children
// each, most probable parents first. New nodes go to out (room for cap), their
// count to *n_out.
static int grow_level(sd_tree *t, int32_t *front, int nf, int width, const sd_tree_grow *g,
                      int32_t *out, int *n_out, char *err, size_t errlen) {
    int max_nodes = g->max_nodes > 0 ? SD_MIN(g->max_nodes, t->cap) : t->cap;
    *n_out = 0;
    if (nf == 0 || width < 1 || t->n >= max_nodes) return 0;
    tree_joints(t);
    sort_by_joint(t, front, nf);
    // Evaluate only the parents that can still get a child.
    nf = SD_MIN(nf, max_nodes - t->n);
    for (int j = 0; j < nf; j++) {
        t->rowptr[j] = sd_tree_dist_for(t, front[j]);
        if (!t->rowptr[j])
            return sd_err(err, errlen, "token tree: no distribution row left (%d rows)", t->n_dist_cap);
    }
    if (g->dist(g->ud, t, front, nf, t->rowptr, err, errlen) < 0) return -1;
    int32_t sel[64];
    for (int j = 0; j < nf; j++) {
        const float *row = t->rowptr[j];
        int k = SD_MIN(width, max_nodes - t->n);
        k = SD_MIN(k, (int)(sizeof sel / sizeof *sel));
        if (k <= 0) break;
        const int32_t *sup = g->support;
        const int n_sup = sup ? g->n_support : t->n_vocab;
        int m;
        if (g->race) {   // the race's order under the target's noise; below p_min at the top: no children
            if (g->p_min > 0.0f) {
                int32_t best;
                if (top_k(row, sup, n_sup, 1, &best) < 1 || row[best] < g->p_min) continue;
            }
            m = sd_tree_rank_children(t, front[j], row, g, k, sel);
            t->mode[front[j]] = SD_CHILDREN_ANY;
        } else if (!g->sample) {   // the top k; below p_min at the top: no children
            m = top_k(row, sup, n_sup, k, sel);
            if (g->p_min > 0.0f && (m < 1 || row[sel[0]] < g->p_min)) continue;
            t->mode[front[j]] = SD_CHILDREN_ANY;
        } else {
            if (g->p_min > 0.0f) {
                int32_t best;
                if (top_k(row, sup, n_sup, 1, &best) < 1 || row[best] < g->p_min) continue;
            }
            for (m = 0; m < k; m++) {
                int32_t v = draw_excluding(row, t->n_vocab, sel, m, g->uniform(g->ustate));
                if (v < 0) break;
                sel[m] = v;
            }
            t->mode[front[j]] = m == 1 ? SD_CHILDREN_IID : SD_CHILDREN_WOR;
        }
        for (int c = 0; c < m; c++) {
            int id = sd_tree_add(t, front[j], sel[c], row[sel[c]]);
            if (id < 0) break;
            out[(*n_out)++] = id;
        }
    }
    return 0;
}

int sd_tree_grow_widths(sd_tree *t, const int *widths, int n_depth, const sd_tree_grow *g,
                        char *err, size_t errlen) {
    if (t->n != 1) return sd_err(err, errlen, "token tree: growing needs a tree holding only the root");
    if (g->sample && !g->uniform && !g->race) return sd_err(err, errlen, "token tree: sampling needs a uniform source");
    int32_t *a = t->scratch, *b = t->scratch + t->cap;
    int na = 1, nb = 0;
    a[0] = 0;
    for (int d = 0; d < n_depth && na > 0; d++) {
        if (grow_level(t, a, na, widths[d], g, b, &nb, err, errlen) < 0) return -1;
        int32_t *tmp = a;
        a = b;
        b = tmp;
        na = nb;
    }
    return 0;
}

int sd_tree_grow_chain(sd_tree *t, int k, const sd_tree_grow *g, char *err, size_t errlen) {
    if (t->n != 1) return sd_err(err, errlen, "token tree: growing needs a tree holding only the root");
    if (g->sample && !g->uniform && !g->race) return sd_err(err, errlen, "token tree: sampling needs a uniform source");
    int32_t *a = t->scratch, *b = t->scratch + t->cap;
    int na = 1, nb = 0;
    a[0] = 0;
    for (int d = 0; d < k && na > 0; d++) {
        if (grow_level(t, a, na, 1, g, b, &nb, err, errlen) < 0) return -1;
        a[0] = nb ? b[0] : 0;
        na = nb;
    }
    return 0;
}

int sd_tree_grow_dynamic(sd_tree *t, sd_tree *work, int B, int D, int M, const sd_tree_grow *g,
                         char *err, size_t errlen) {
    if (t->n != 1) return sd_err(err, errlen, "token tree: growing needs a tree holding only the root");
    if (B < 1 || D < 1 || M < 1) return sd_err(err, errlen, "dynamic tree: B, D, M must be >= 1");
    if (work->cap < 1 + B * B * D || work->n_dist_cap < 1 + B * (D - 1))
        return sd_err(err, errlen, "dynamic tree: work tree too small for B=%d D=%d", B, D);
    if (B > 64) return sd_err(err, errlen, "dynamic tree: B=%d > 64", B);
    sd_tree_reset(work, t->token[0]);
    sd_tree_grow gw = *g;
    gw.sample = 0;
    gw.p_min = 0.0f;
    gw.max_nodes = work->cap;
    int32_t *a = work->scratch, *b = work->scratch + work->cap;
    int na = 1, nb = 0;
    a[0] = 0;
    for (int d = 0; d < D && na > 0; d++) {
        if (grow_level(work, a, na, B, &gw, b, &nb, err, errlen) < 0) return -1;
        // The next depth expands only the B best new nodes.
        tree_joints(work);
        sort_by_joint(work, b, nb);
        na = SD_MIN(nb, B);
        memcpy(a, b, sizeof(int32_t) * (size_t)na);
    }
    sd_tree_prune(t, work, SD_MIN(M, t->cap));
    return 0;
}

int sd_tree_prune(sd_tree *dst, sd_tree *src, int m) {
    int32_t *order = src->scratch;            // (cap) candidates by joint
    int32_t *keep = src->scratch + src->cap;  // (cap) new index or -1
    tree_joints(src);
    int n_order = 0;
    for (int i = 1; i < src->n; i++) order[n_order++] = i;
    sort_by_joint(src, order, n_order);
    for (int i = 0; i < src->n; i++) keep[i] = -1;
    keep[0] = 0;
    int count = 1;
    m = SD_MIN(m, dst->cap);
    for (int o = 0; o < n_order && count < m; o++) {
        int need = 0;
        for (int i = order[o]; i >= 0 && keep[i] < 0; i = src->parent[i]) need++;
        if (count + need > m) continue;
        for (int i = order[o]; i >= 0 && keep[i] < 0; i = src->parent[i]) keep[i] = 1;
        count += need;
    }
    sd_tree_reset(dst, src->token[0]);
    for (int i = 1; i < src->n; i++) {
        if (keep[i] < 0) continue;
        keep[i] = sd_tree_add(dst, keep[src->parent[i]], src->token[i], src->p[i]);
        SD_ASSERT(keep[i] > 0);
    }
    // Modes: a random sample stays one only when all of it is kept.
    for (int i = 0; i < src->n; i++) {
        if (keep[i] < 0 || src->mode[i] == SD_CHILDREN_ANY) continue;
        int all = 1, any = 0;
        for (int j = i + 1; j < src->n; j++) {
            if (src->parent[j] != i) continue;
            any = 1;
            all &= keep[j] >= 0;
        }
        if (!any || !all) continue;
        const float *row = sd_tree_dist(src, i);
        float *drow = row ? sd_tree_dist_for(dst, keep[i]) : NULL;
        if (!drow) continue;
        memcpy(drow, row, sizeof(float) * (size_t)dst->n_vocab);
        dst->mode[keep[i]] = src->mode[i];
    }
    return dst->n;
}

int sd_tree_merge(sd_tree *dst, sd_tree *src, int32_t *map) {
    if (src->token[0] != dst->token[0] || src->n_vocab != dst->n_vocab) return -1;
    if (!map) map = src->scratch;
    int32_t *had = dst->scratch;                 // (cap) node had children before the merge
    int32_t *mixed = dst->scratch + dst->cap;    // (cap) children no longer one source's sample
    int32_t *owner = dst->scratch + 2 * dst->cap; // (cap) src node whose children fill it, -1 none
    int n0 = dst->n;
    for (int i = 0; i < dst->cap; i++) had[i] = mixed[i] = 0, owner[i] = -1;
    for (int i = 1; i < n0; i++) had[dst->parent[i]] = 1;
    map[0] = 0;
    for (int s = 1; s < src->n; s++) {
        int sp = src->parent[s];
        int d = map[sp];
        map[s] = -1;
        if (d < 0) continue;
        int c = -1;
        for (int j = d + 1; j < dst->n && c < 0; j++)
            if (dst->parent[j] == d && dst->token[j] == src->token[s]) c = j;
        if (c >= 0) {
            if (c >= n0 && owner[d] == sp) mixed[d] = 1;   // duplicate tokens collapsed
            if (src->p[s] > dst->p[c]) dst->p[c] = src->p[s];
            map[s] = c;
            continue;
        }
        c = sd_tree_add(dst, d, src->token[s], src->p[s]);
        if (c < 0) {
            mixed[d] = 1;   // part of src's sample dropped
            continue;
        }
        map[s] = c;
        if (had[d]) mixed[d] = 1;
        if (owner[d] == -1) owner[d] = sp;
        else if (owner[d] != sp) mixed[d] = 1;
    }
    for (int d = 0; d < dst->n; d++) {
        if (mixed[d]) {
            dst->mode[d] = SD_CHILDREN_ANY;
            continue;
        }
        int s = owner[d];
        if (s < 0 || had[d]) continue;
        dst->mode[d] = SD_CHILDREN_ANY;
        if (src->mode[s] == SD_CHILDREN_ANY) continue;
        // Every child of s must have a node of its own under d.
        int complete = 1;
        for (int j = s + 1; j < src->n; j++)
            if (src->parent[j] == s && (map[j] < 0 || dst->parent[map[j]] != d)) complete = 0;
        const float *row = sd_tree_dist(src, s);
        float *drow = complete && row ? sd_tree_dist_for(dst, d) : NULL;
        if (!drow) continue;
        memcpy(drow, row, sizeof(float) * (size_t)dst->n_vocab);
        dst->mode[d] = src->mode[s];
    }
    return 0;
}
