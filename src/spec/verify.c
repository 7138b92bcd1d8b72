// verify.c - greedy and stochastic verification of token trees.
#include "spec/verify.h"

#include <string.h>

#include "common.h"

static int32_t next_from_array(void *state, int node) { return ((const int32_t *)state)[node]; }

void sd_verify_greedy(const sd_tree *t, const int32_t *tgt_next, int32_t *path, int *n_path,
                      int32_t *bonus) {
    sd_verify_greedy_fn(t, next_from_array, (void *)tgt_next, path, n_path, bonus);
}

int sd_verify_greedy_fn(const sd_tree *t, sd_next_fn next_fn, void *state, int32_t *path, int *n_path,
                        int32_t *bonus) {
    int u = 0, n = 0;
    int32_t want;
    path[n++] = 0;
    for (;;) {
        want = next_fn(state, u);
        if (want < 0) return want;
        int next = -1;
        // Children of u have larger indices; the first match wins (duplicates are equivalent).
        for (int j = u + 1; j < t->n; j++) {
            if (t->parent[j] == u && t->token[j] == want) {
                next = j;
                break;
            }
        }
        if (next < 0) break;
        u = next;
        path[n++] = u;
    }
    *n_path = n;
    *bonus = want; // the target's choice after the last accepted node
    return 0;
}

// The greedy walk with the target's race draw in place of its argmax: both
// are deterministic functions of the node's context (and, for the race, of
// the seed and the node's position), which is all the walk needs.
int sd_verify_race(const sd_tree *t, sd_next_fn draw, void *state, int32_t *path, int *n_path, int32_t *bonus) {
    return sd_verify_greedy_fn(t, draw, state, path, n_path, bonus);
}

int32_t sd_draw_row(const float *row, int n, double u) {
    double tot = 0.0;
    for (int v = 0; v < n; v++) tot += row[v] > 0.0f ? row[v] : 0.0f;
    if (!(tot > 0.0)) return -1;
    double r = u * tot, acc = 0.0;
    int32_t last = -1;
    for (int v = 0; v < n; v++) {
        if (!(row[v] > 0.0f)) continue;
        acc += row[v];
        last = v;
        if (r < acc) return v;
    }
    return last;
}

// Why this is lossless.
//
// Fix a node u with target distribution p (the sampler's final distribution
// for the context "accepted text + path to u"). Its children x_1..x_k are
// tried in proposal order; step i holds a current target p_i (p_1 = p) and a
// proposal distribution q_i: the distribution x_i had *given the draws and
// decisions before it*. Step i accepts x_i with probability
// min(1, p_i(x_i) / q_i(x_i)); on rejection p_{i+1} = norm(max(0, p_i - q_i)).
// If all k are rejected, the token is drawn from p_{k+1}.
//
// Claim: conditioned on reaching step i, the emitted token is distributed as
// p_i. For i = k + 1 it is drawn from p_{k+1}. For i <= k: the token is x_i
// with probability q_i(x) min(1, p_i(x)/q_i(x)) = min(q_i(x), p_i(x)), and
// otherwise (total probability sum_x max(0, p_i(x) - q_i(x))) by induction it
// is distributed as p_{i+1} = max(0, p_i - q_i) / that total; the sum is
// min(q_i, p_i) + max(0, p_i - q_i) = p_i. Hence the emitted token at u ~ p_1
// = p. This needs exactly that x_i ~ q_i independently of the verifier's
// uniforms so far, which fixes q_i for each way of producing children:
//   IID (drawn with replacement from q): q_i = q for every i (draws are
//        independent of each other; duplicates are simply tried again).
//   WOR (drawn without replacement from q): given x_1..x_{i-1}, x_i is drawn
//        from q with those tokens removed and renormalised, so q_i is that
//        (SpecTr's / "recursive rejection sampling without replacement").
//        Using q unrenormalised here would be biased.
//   ANY (argmax, top-k, n-gram hits, merged trees: a set chosen without
//        looking at the verifier's randomness): x_i is a fixed token given
//        the context, so q_i is one-hot at x_i. Acceptance is then p_i(x_i)
//        and the residual is p_i with x_i removed and renormalised: the same
//        as "draw from p, follow the child if present". Treating top-k
//        children as if sampled from q would be biased.
// If x_i is accepted the walk continues at x_i, whose own children were
// produced from the draft's distribution in the context of the path only, so
// the argument repeats one level down (and a leaf's token is drawn from its
// full p: the bonus). By the chain rule over the emitted tokens the whole
// sequence is distributed as target-only sampling. With one child per node
// (a chain) this is the speculative sampling of Leviathan et al. / Chen et al.
//
// Rounding: when sum max(0, p_i - q_i) is ~0 (p_i == q_i) rejection has
// probability ~0; if it happens anyway p_i is kept unchanged.
int sd_verify_stochastic(const sd_tree *t, sd_target_row_fn get_p, void *pstate,
                         sd_uniform_fn uniform, void *ustate, float *q_scratch, int32_t *path,
                         int *n_path, int32_t *bonus, char *err, size_t errlen) {
    const int nv = t->n_vocab;
    int u = 0, n = 0;
    path[n++] = 0;
    for (;;) {
        float *p = get_p(pstate, u);
        if (!p) return sd_err(err, errlen, "verify: no target distribution for node %d", u);
        int mode = t->mode[u];
        const float *q0 = sd_tree_dist(t, u);
        if (mode != SD_CHILDREN_ANY && !q0)
            return sd_err(err, errlen, "verify: node %d has sampled children but no distribution", u);
        {   // normalise p (the sampler's rows already are, up to rounding)
            double ps = 0.0;
            for (int v = 0; v < nv; v++) ps += p[v];
            if (!(ps > 0.0)) return sd_err(err, errlen, "verify: target distribution at node %d has no mass", u);
            float inv = (float)(1.0 / ps);
            for (int v = 0; v < nv; v++) p[v] *= inv;
        }
        if (mode == SD_CHILDREN_WOR) memcpy(q_scratch, q0, sizeof(float) * (size_t)nv);
        double qsum = 1.0;   // mass of the draft row (WOR: left after removing rejected tokens)
        if (mode != SD_CHILDREN_ANY) {
            qsum = 0.0;
            for (int v = 0; v < nv; v++) qsum += q0[v];
        }
        int next = -1;
        for (int j = u + 1; j < t->n && next < 0; j++) {
            if (t->parent[j] != u) continue;
            int32_t x = t->token[j];
            if (x < 0 || x >= nv) return sd_err(err, errlen, "verify: node %d has token %d outside the vocabulary", j, x);
            double px = p[x];
            double qx;   // q_i(x)
            if (mode == SD_CHILDREN_ANY) qx = 1.0;
            else if (mode == SD_CHILDREN_IID) qx = qsum > 0.0 ? q0[x] / qsum : 0.0;
            else qx = qsum > 0.0 ? q_scratch[x] / qsum : 0.0;
            double a = uniform(ustate);
            if (qx > 0.0 && a * qx < px) {   // accept with probability min(1, px/qx)
                next = j;
                break;
            }
            // Rejected: p <- norm(max(0, p - q_i)).
            double tot = 0.0;
            if (mode == SD_CHILDREN_ANY) {
                for (int v = 0; v < nv; v++) tot += p[v];
                tot -= p[x];
                if (tot > 1e-12) p[x] = 0.0f;
            } else {
                const float *q = mode == SD_CHILDREN_IID ? q0 : q_scratch;
                double scale = qsum > 0.0 ? 1.0 / qsum : 0.0;
                for (int v = 0; v < nv; v++) {
                    double r = (double)p[v] - (double)q[v] * scale;
                    tot += r > 0.0 ? r : 0.0;
                }
                if (tot > 1e-12) {
                    for (int v = 0; v < nv; v++) {
                        double r = (double)p[v] - (double)q[v] * scale;
                        p[v] = r > 0.0 ? (float)r : 0.0f;
                    }
                }
            }
            if (mode == SD_CHILDREN_WOR) {   // the next draw excluded x
                qsum -= q_scratch[x];
                q_scratch[x] = 0.0f;
            }
            // Scale does not matter: draws and ratios below normalise by the row sum.
            if (tot > 1e-12) {
                float inv = (float)(1.0 / tot);
                for (int v = 0; v < nv; v++) p[v] *= inv;
            }
        }
        if (next < 0) {
            int32_t tok = sd_draw_row(p, nv, uniform(ustate));
            if (tok < 0) return sd_err(err, errlen, "verify: target distribution at node %d has no mass", u);
            *n_path = n;
            *bonus = tok;
            return 0;
        }
        u = next;
        path[n++] = u;
    }
}
