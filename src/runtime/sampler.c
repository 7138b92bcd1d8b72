// sampler.c - turning logits into a token: the transforms of sd_sampler_params,
// then a draw: the reproducible race (SD_DRAW_RACE, runtime/race.h: noise
// from a hash of the key, the position and the token) or a seeded xoshiro256**
// random number generator (SD_DRAW_REJECTION).
//
// Order of the transforms (sd_sampler_probs), as stated in specdec.h:
//   1. repetition penalty: every distinct token among the last repeat_last_n
//      tokens of the history has its logit divided by repeat_penalty if
//      positive, multiplied by it if negative (applied once per token id);
//   2. greedy (temp <= 0): one-hot at the argmax of the penalised logits,
//      ties to the lowest id; nothing below applies;
//   3. temperature: logits / temp;
//   4. top-k: keep the k largest logits (ties broken by the lower id);
//   5. softmax over the kept tokens;
//   6. top-p: keep the smallest prefix of tokens sorted by probability
//      (descending, ties by lower id) whose mass reaches top_p (at least one);
//   7. min-p: keep tokens whose probability is >= min_p * (largest probability);
//   8. renormalise the kept set; every other entry of probs is 0.
//
// Cost: all scratch is allocated by sd_sampler_new (no allocation per call).
// Top-k uses a partial selection (quickselect, O(n_vocab)) and sorts only the
// k survivors; top-p without top-k selects growing prefixes (64, 256, ...)
// instead of sorting the whole vocabulary.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime/race.h"
#include "runtime/sampler.h"
#include "specdec.h"

typedef struct {
    float v;     // logit, later probability
    int32_t id;  // token id
} sd_cand;

struct sd_sampler {
    sd_sampler_params p;
    int n_vocab;
    float *work;      // (n_vocab) penalised logits, by token id
    sd_cand *cand;    // (n_vocab) candidate set
    uint8_t *mark;    // (n_vocab) 1 while a token has been penalised in this call
    float *probs;     // (n_vocab) scratch for sd_sampler_sample
    int32_t *ids;     // (n_vocab) race: the candidates' ids
    double *u;        // (n_vocab) race: their uniforms
    sd_rng rng;       // draws (sd_sampler_draw, sd_sampler_uniform)
    uint64_t stream;  // race: texts started since the last reseed (sd_sampler_next_text)
    uint64_t key;     // race: the key of sd_sampler_sample
};

// ---------------------------------------------------------------- RNG
void sd_sampler_reseed(sd_sampler *s, uint64_t seed) {
    sd_rng_seed(&s->rng, seed);
    s->p.seed = seed;
    s->stream = 0;
    s->key = sd_race_key(seed, 0);
}

uint64_t sd_sampler_next_text(sd_sampler *s) {
    s->key = sd_race_key(s->p.seed, s->stream++);
    return s->key;
}

double sd_sampler_uniform(sd_sampler *s) {
    return sd_rng_uniform(&s->rng);
}

// ---------------------------------------------------------------- lifetime
sd_sampler_params sd_sampler_default_params(void) {
    sd_sampler_params p;
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 0xC0FFEE;
    p.draw = SD_DRAW_RACE;
    return p;
}

int sd_sampler_new(sd_sampler **out, const sd_sampler_params *p, int n_vocab, char *err, size_t errlen) {
    *out = NULL;
    if (n_vocab <= 0) return sd_err(err, errlen, "sampler: n_vocab must be positive, got %d", n_vocab);
    sd_sampler_params sp = p ? *p : sd_sampler_default_params();
    if (!(sp.repeat_penalty > 0.0f))
        return sd_err(err, errlen, "sampler: repeat_penalty must be > 0, got %g", (double)sp.repeat_penalty);
    if (sp.top_p != sp.top_p || sp.min_p != sp.min_p || sp.temp != sp.temp)
        return sd_err(err, errlen, "sampler: NaN parameter");
    if (sp.draw != SD_DRAW_RACE && sp.draw != SD_DRAW_REJECTION)
        return sd_err(err, errlen, "sampler: unknown draw %d (SD_DRAW_RACE or SD_DRAW_REJECTION)", sp.draw);
    sd_sampler *s = calloc(1, sizeof(*s));
    if (!s) return sd_err(err, errlen, "sampler: out of memory");
    s->p = sp;
    s->n_vocab = n_vocab;
    s->work = malloc((size_t)n_vocab * sizeof(float));
    s->cand = malloc((size_t)n_vocab * sizeof(sd_cand));
    s->mark = calloc((size_t)n_vocab, 1);
    s->probs = malloc((size_t)n_vocab * sizeof(float));
    s->ids = malloc((size_t)n_vocab * sizeof(int32_t));
    s->u = malloc((size_t)n_vocab * sizeof(double));
    if (!s->work || !s->cand || !s->mark || !s->probs || !s->ids || !s->u) {
        sd_sampler_free(s);
        return sd_err(err, errlen, "sampler: out of memory (n_vocab %d)", n_vocab);
    }
    sd_sampler_reseed(s, sp.seed);
    *out = s;
    return 0;
}

void sd_sampler_free(sd_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->cand);
    free(s->mark);
    free(s->probs);
    free(s->ids);
    free(s->u);
    free(s);
}

const sd_sampler_params *sd_sampler_get_params(const sd_sampler *s) { return &s->p; }

// ---------------------------------------------------------------- transforms
// Total order used everywhere: larger value first, then lower id.
static inline int cand_before(const sd_cand *a, const sd_cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const sd_cand *a = pa, *b = pb;
    if (cand_before(a, b)) return -1;
    if (cand_before(b, a)) return 1;
    return 0;
}

static inline void cand_swap(sd_cand *a, sd_cand *b) {
    sd_cand t = *a;
    *a = *b;
    *b = t;
}

// Rearranges c[0..n) so that c[0..k) holds the k first elements of the total
// order (in no particular order). Iterative quickselect, median of three.
static void select_top(sd_cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    if (k <= 0 || k >= n) return;
    while (hi > lo) {
        int mid = lo + (hi - lo) / 2;
        if (cand_before(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
        if (cand_before(&c[hi], &c[lo])) cand_swap(&c[hi], &c[lo]);
        if (cand_before(&c[hi], &c[mid])) cand_swap(&c[hi], &c[mid]);
        sd_cand pivot = c[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_before(&c[i], &pivot)) i++;
            while (cand_before(&pivot, &c[j])) j--;
            if (i <= j) {
                cand_swap(&c[i], &c[j]);
                i++;
                j--;
            }
        }
        // now c[lo..j] come before or equal the pivot, c[i..hi] after or equal
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

static void apply_penalty(sd_sampler *s, const int32_t *hist, int n_hist) {
    float r = s->p.repeat_penalty;
    if (r == 1.0f || !hist || n_hist <= 0 || s->p.repeat_last_n == 0) return;
    int n = s->p.repeat_last_n < 0 ? n_hist : SD_MIN(n_hist, s->p.repeat_last_n);
    const int32_t *h = hist + (n_hist - n);
    for (int i = 0; i < n; i++) {
        int32_t t = h[i];
        if (t < 0 || t >= s->n_vocab || s->mark[t]) continue;
        s->mark[t] = 1;
        float *l = &s->work[t];
        *l = *l > 0.0f ? *l / r : *l * r;
    }
    for (int i = 0; i < n; i++) {
        int32_t t = h[i];
        if (t >= 0 && t < s->n_vocab) s->mark[t] = 0;
    }
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int penalised_needed(const sd_sampler *s, const int32_t *hist, int n_hist) {
    return !(s->p.repeat_penalty == 1.0f || !hist || n_hist <= 0 || s->p.repeat_last_n == 0);
}

// Penalised logits into s->work; returns them (logits itself when unchanged).
static const float *penalised(sd_sampler *s, const float *logits, const int32_t *hist, int n_hist) {
    if (!penalised_needed(s, hist, n_hist)) return logits;
    memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(float));
    apply_penalty(s, hist, n_hist);
    return s->work;
}

// The kept candidates of a sampling (temp > 0) distribution: s->cand[0..n)
// with their unnormalised probabilities; returns n, the mass in *sum.
static int candidates_of(sd_sampler *s, int n, int sorted, double *sum_out);
static int candidates(sd_sampler *s, const float *l, double *sum_out) {
    const int nv = s->n_vocab;
    sd_cand *c = s->cand;
    for (int i = 0; i < nv; i++) {
        c[i].v = l[i];
        c[i].id = i;
    }
    return candidates_of(s, nv, 0, sum_out);
}

// The kept candidates among s->cand[0..n) (filled by the caller; sorted: 1
// when already in the total order).
static int candidates_of(sd_sampler *s, int n, int sorted, double *sum_out) {
    const sd_sampler_params *p = &s->p;
    sd_cand *c = s->cand; // 1 when c[0..n) is in the total order
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
        qsort(c, (size_t)n, sizeof(sd_cand), cand_cmp);
        sorted = 1;
    }
    // softmax of logits / temp over the candidates
    float mx = c[0].v;
    for (int i = 1; i < n; i++)
        if (c[i].v > mx) mx = c[i].v;
    double sum = 0.0;
    const float inv_t = 1.0f / p->temp;
    for (int i = 0; i < n; i++) {
        float e = expf((c[i].v - mx) * inv_t);
        c[i].v = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) c[i].v *= inv;

    if (p->top_p < 1.0f) {
        // find the smallest sorted prefix with mass >= top_p, sorting only
        // growing prefixes when the candidate set is large
        int m = sorted ? n : SD_MIN(n, 64);
        for (;;) {
            if (!sorted) {
                select_top(c, n, m);
                qsort(c, (size_t)m, sizeof(sd_cand), cand_cmp);
            }
            double cum = 0.0;
            int keep = -1;
            for (int i = 0; i < m; i++) {
                cum += c[i].v;
                if (cum >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            if (keep > 0) {
                n = keep;
                break;
            }
            if (m == n) break; // rounding: the whole set is kept
            m = m > n / 4 ? n : m * 4;
        }
    }
    if (p->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < n; i++)
            if (c[i].v > pmax) pmax = c[i].v;
        float thr = p->min_p * pmax;
        int j = 0;
        for (int i = 0; i < n; i++)
            if (c[i].v >= thr) c[j++] = c[i];
        n = j;
    }
    sum = 0.0;
    for (int i = 0; i < n; i++) sum += c[i].v;
    *sum_out = sum;
    return n;
}

void sd_sampler_probs(sd_sampler *s, const float *logits, const int32_t *hist, int n_hist, float *probs) {
    const int nv = s->n_vocab;
    const float *l = penalised(s, logits, hist, n_hist);
    memset(probs, 0, (size_t)nv * sizeof(float));
    if (s->p.temp <= 0.0f) {
        probs[argmax(l, nv)] = 1.0f;
        return;
    }
    double sum;
    const int n = candidates(s, l, &sum);
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) probs[s->cand[i].id] = s->cand[i].v * inv;
}

void sd_sampler_probs_support(sd_sampler *s, const float *lsub, const int32_t *ids, int n, const int32_t *hist,
                              int n_hist, float *probs) {
    const int nv = s->n_vocab;
    int ok = s->p.temp > 0.0f && n > 0 && n <= nv && !penalised_needed(s, hist, n_hist);
    for (int i = 0; ok && i < n; i++) ok = ids[i] >= 0 && ids[i] < nv && (i == 0 || ids[i] > ids[i - 1]);
    if (!ok) {   // the general path: the full row, -inf outside the support
        for (int v = 0; v < nv; v++) s->probs[v] = -INFINITY;
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < nv) s->probs[ids[i]] = lsub[i];
        sd_sampler_probs(s, s->probs, hist, n_hist, probs);
        return;
    }
    sd_cand *c = s->cand;
    for (int i = 0; i < n; i++) c[i].v = lsub[i], c[i].id = ids[i];
    // top_k in n..n_vocab-1: the full row's top k holds the whole support (then -inf rows) and is summed in
    // the total order; so is the support here, for the same sums bit for bit
    const int sorted = s->p.top_k >= n && s->p.top_k < nv;
    if (sorted) qsort(c, (size_t)n, sizeof(sd_cand), cand_cmp);
    double sum;
    const int k = candidates_of(s, n, sorted, &sum);
    memset(probs, 0, (size_t)nv * sizeof(float));
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < k; i++) probs[c[i].id] = c[i].v * inv;
}

int32_t sd_sampler_race_sample(sd_sampler *s, const float *logits, const int32_t *hist, int n_hist, uint64_t key,
                               int64_t pos) {
    const float *l = penalised(s, logits, hist, n_hist);
    if (s->p.temp <= 0.0f) return argmax(l, s->n_vocab);
    double sum;
    const int n = candidates(s, l, &sum);
    // the probabilities exactly as sd_sampler_probs writes them, so that a
    // drafter ranking that row with the same noise finds the same winner
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) {
        s->ids[i] = s->cand[i].id;
        s->probs[i] = s->cand[i].v * inv;
    }
    int w = sd_race_pick(key, pos, s->ids, s->probs, n, s->u);
    return w >= 0 ? s->ids[w] : s->cand[0].id;
}

int32_t sd_sampler_draw(sd_sampler *s, const float *probs) {
    double u = sd_sampler_uniform(s);
    double cum = 0.0;
    int32_t last = -1;
    for (int i = 0; i < s->n_vocab; i++) {
        if (probs[i] <= 0.0f) continue;
        cum += probs[i];
        last = i;
        if (u < cum) return i;
    }
    // u beyond the accumulated mass (rounding): the last token with mass
    return last >= 0 ? last : 0;
}

int32_t sd_sampler_sample(sd_sampler *s, const float *logits, const int32_t *hist, int n_hist) {
    if (s->p.temp <= 0.0f) return argmax(penalised(s, logits, hist, n_hist), s->n_vocab);
    if (s->p.draw == SD_DRAW_RACE) return sd_sampler_race_sample(s, logits, hist, n_hist, s->key, n_hist);
    sd_sampler_probs(s, logits, hist, n_hist, s->probs);
    return sd_sampler_draw(s, s->probs);
}
