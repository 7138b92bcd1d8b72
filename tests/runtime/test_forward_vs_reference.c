// test_forward_vs_reference.c - model loading, session KV cache and the batched tree-masked
// forward pass, on synthetic models (tests/lib/synth.h) checked against the
// scalar reference forward (tests/lib/ref_forward.h), and on the default model.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "common.h"
#include "lib/ref_forward.h"
#include "lib/synth.h"
#include "model/model.h"
#include "kernels/matmul.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];

static void tmp_path(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "/tmp/specdec_test_forward_%d_%s.gguf", (int)getpid(), tag);
}

static float max_abs_diff(const float *a, const float *b, int n) {
    float m = 0;
    for (int i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; // NaN propagates as a failure
    }
    return m;
}

static float stddev(const float *a, int n) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        s += a[i];
        s2 += (double)a[i] * a[i];
    }
    double mu = s / n;
    return (float)sqrt(s2 / n - mu * mu);
}

// Writes a synthetic model and loads it. 0 ok; <0 with g_err set.
static int synth_load(const synth_params *p, const char *tag, sd_model **m) {
    char path[256];
    tmp_path(path, sizeof path, tag);
    *m = NULL;
    if (synth_write(path, p, g_err, sizeof g_err) < 0) return -1;
    int r = sd_model_load(m, path, g_err, sizeof g_err);
    remove(path);
    return r;
}

static sd_session *new_session(const sd_model *m, int n_ctx, int n_batch, int n_threads) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.n_threads = n_threads;
    sd_session *s = NULL;
    if (sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return NULL;
    return s;
}

// Runs a chain of tokens and commits it.
static int feed_chain(sd_session *s, const int32_t *toks, int n) {
    sd_batch b = {.n = n, .tokens = toks};
    if (sd_session_forward(s, &b, g_err, sizeof g_err) < 0) return -1;
    return sd_session_commit(s, NULL, 0, g_err, sizeof g_err);
}

// ---------------------------------------------------------------- optimized vs reference

typedef struct {
    int type;
    float tol;   // max |logit - ref| against the float reference (logit std is ~3)
    float tolq;  // same against the reference that quantizes activations like sd_matmul
    int mix;     // type of attn_v and ffn_up (mixed files, e.g. Q4_K_M), or 0: all of type
} type_case;

// Tolerances, from measurements (max over the 8 logit rows of each model; the
// printed "info" lines show the values of the current kernels):
// - F32 / F16 / BF16 weights multiply float activations in both paths: only
//   the summation order differs, measured <= 1.2e-5; tol 2e-3.
// - Quantized weights multiply activations rounded to 8 bits (Q8_0 / Q8_1 /
//   Q8_K) in the optimized path. Against the all-float reference this noise
//   compounds over the layers and the attention softmax: measured 0.16..0.40
//   on these random models; tol 0.6 (a wrong kernel, mask or RoPE gives
//   differences of the order of the logit std, ~3).
// - Against the reference that rounds activations the same way, the measured
//   difference is ~1e-6, except when a float-order difference flips the
//   rounding (or the scale sign) of one activation block, which then shows as
//   an isolated jump (measured up to 0.25): tolq 0.5, and the median
//   difference must stay below 1e-4.
static const type_case k_types[] = {
    {SD_TYPE_F32, 2e-3f, 2e-3f, 0},  {SD_TYPE_F16, 2e-3f, 2e-3f, 0},  {SD_TYPE_BF16, 2e-3f, 2e-3f, 0},
    {SD_TYPE_Q8_0, 0.6f, 0.5f, 0},  {SD_TYPE_Q4_0, 0.6f, 0.5f, 0},  {SD_TYPE_Q4_1, 0.6f, 0.5f, 0},
    {SD_TYPE_Q5_0, 0.6f, 0.5f, 0},  {SD_TYPE_Q5_1, 0.6f, 0.5f, 0},  {SD_TYPE_Q4_K, 0.6f, 0.5f, 0},
    {SD_TYPE_Q5_K, 0.6f, 0.5f, 0},  {SD_TYPE_Q6_K, 0.6f, 0.5f, 0},
    // Q, K, V and gate, up of different types: one matmul per type, the
    // RMSNorm before them done once
    {SD_TYPE_Q4_K, 0.6f, 0.5f, SD_TYPE_Q6_K}, {SD_TYPE_Q4_1, 0.6f, 0.5f, SD_TYPE_Q8_0},
};

static int type_usable(int t) {
    const sd_type_traits *tr = sd_type_get(t);
    return tr && tr->supported && tr->from_float && tr->to_float;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

#define VSREF_ROWS 15 // 12 prompt rows (one batch) + 3 single steps: exercises 8-row attention blocks
// A row more than this off the act-quant reference is off. The reference and
// the engine round the same values to 8 bits (activations) and to fp16 (the
// KV cache), and a value at a near tie can round either way in the two (their
// float sums differ by ~1e-6): one activation then moves by a whole step
// (seen: the down matrix's output of one token 2.6e-3 off while its input
// matched to 1e-6), and through the KV cache every later row (seen: llama
// Q5_K, an activation 1.9e-6 steps below a tie in row 1 rounded up by the
// tile kernels of both x86 families and by nothing else: rows 1-14 off by
// 0.1-0.27, which failed here). So the reference is evaluated again with its
// near-tie sites rounded the other way (ref_eval_nearest) and keeps a choice
// that matches the engine to VSREF_MATCH. Rows still off (a flip the search
// did not find: outside its margins, or a K / V flip whose own row hides it;
// over six model seeds and the three x86 families, 1-5 rows in some types)
// are left out of the median; row 0 and one more at least must match, the
// median of the rest to 1e-4, which a systematic difference (a wrong
// activation format or conversion, the same at every position) does not.
// Position-dependent errors (attention, KV cache) are the business of
// test_long_context_vs_reference (float weights, 2e-3).
#define VSREF_FLIP 1e-3f
#define VSREF_MATCH 1e-4f // ref_eval_nearest stops at a choice this close

// Prompt of 12 tokens as one batch, then 3 single-token steps; every logit row
// compared with the two references run token by token.
static void check_vs_ref(const char *arch, const type_case *tc) {
    synth_params p = synth_default_params();
    p.arch = arch;
    p.wtype = tc->type;
    if (tc->mix) p.mix_type = tc->mix;
    const sd_type_traits *tr = sd_type_get(tc->type);
    char name[48]; // the type, "+" the mixed-in type if any
    snprintf(name, sizeof name, "%s%s%s", tr->name, tc->mix ? "+" : "", tc->mix ? sd_type_get(tc->mix)->name : "");
    if (tr->blck == SD_QK_K) {
        p.n_embd = 256;
        p.n_ff = 512;
    }
    p.tied = tc->type % 2; // alternate tied / separate output across types
    p.seed = 100 + (uint64_t)tc->type;
    sd_model *m;
    if (synth_load(&p, "vsref", &m) < 0) {
        CHECK(0, "%s %s: %s", arch, name, g_err);
        return;
    }
    sd_session *s = new_session(m, 64, 16, 2);
    ref_state *r = ref_new(m, 64), *rq = ref_new(m, 64);
    const int V = m->hp.n_vocab;
    float *ref = malloc((size_t)V * sizeof(float)), *refq = malloc((size_t)V * sizeof(float));
    float *dq = malloc((size_t)V * VSREF_ROWS * sizeof(float));
    CHECK(s && r && rq && ref && refq && dq, "setup: %s", g_err);
    if (!s || !r || !rq || !ref || !refq || !dq) goto out;
    ref_set_act_quant(rq, 1);
    const int32_t prompt[12] = {1, 300, 17, 260, 99, 5, 280, 281, 3, 312, 64, 128};
    int32_t tok = 42;
    float worst = 0, worstq = 0, sd = 0;
    int nq = 0, n_off = 0, n_tied = 0, n_ties = 0, row0_off = 0;
    sd_batch b = {.n = 12, .tokens = prompt};
    int rc = sd_session_forward(s, &b, g_err, sizeof g_err);
    CHECK(rc == 0, "forward: %s", g_err);
    for (int row = 0; row < VSREF_ROWS && rc == 0; row++) {
        const float *got;
        int32_t t = row < 12 ? prompt[row] : tok;
        if (row < 12) {
            got = sd_session_logits(s, row);
        } else {
            sd_session_commit(s, NULL, 0, g_err, sizeof g_err);
            sd_batch b1 = {.n = 1, .tokens = &tok};
            rc = sd_session_forward(s, &b1, g_err, sizeof g_err);
            CHECK(rc == 0, "forward: %s", g_err);
            if (rc) break;
            got = sd_session_logits(s, 0);
            tok = (int32_t)(tok * 7 + 3) % V;
        }
        ref_eval(r, t, -1, ref);
        int flips = 0;
        n_ties += ref_eval_nearest(rq, t, -1, got, VSREF_MATCH, refq, &flips); // (see VSREF_FLIP)
        n_tied += flips != 0;
        float d = max_abs_diff(got, ref, V), dqm = max_abs_diff(got, refq, V);
        if (!(d <= worst)) worst = d;
        if (!(dqm <= worstq)) worstq = dqm;
        sd = stddev(ref, V);
        if (!(dqm <= VSREF_FLIP)) { // off whichever way the near ties round: out of the median (see VSREF_FLIP)
            n_off++;
            row0_off |= row == 0;
            continue;
        }
        for (int v = 0; v < V; v++) dq[nq++] = fabsf(got[v] - refq[v]);
    }
    qsort(dq, (size_t)nq, sizeof(float), cmp_float);
    float med = nq ? dq[nq / 2] : 0;
    CHECK(worst <= tc->tol, "%s %s: max |logit - ref| = %g > tol %g", arch, name, worst, tc->tol);
    CHECK(worstq <= tc->tolq, "%s %s: max |logit - ref(act quant)| = %g > tol %g", arch, name, worstq, tc->tolq);
    CHECK(med <= 1e-4f, "%s %s: median |logit - ref(act quant)| = %g > 1e-4", arch, name, med);
    const int off_ok = !row0_off && n_off <= VSREF_ROWS - 2;
    CHECK(off_ok, "%s %s: %d of %d rows off the act-quant reference by > %g%s, whichever way its near ties round (%d "
          "sites)", arch, name, n_off, VSREF_ROWS, VSREF_FLIP, row0_off ? ", row 0 among them" : "", n_ties);
    if (n_off && off_ok)
        printf("  info: %-5s %-5s %d of %d rows off (a flip the near-tie search did not find), the median is over the "
               "other %d\n", arch, name, n_off, VSREF_ROWS, VSREF_ROWS - n_off);
    if (n_tied)
        printf("  info: %-5s %-5s %d of %d rows matched with near ties of the reference rounded the other way (%d "
               "near-tie sites)\n", arch, name, n_tied, VSREF_ROWS, n_ties);
    printf("  info: %-5s %-5s vs float ref max %.2e (tol %.2g); vs act-quant ref max %.2e median %.0e (tol %.2g); "
           "logit std %.2f\n",
           arch, name, worst, tc->tol, worstq, med, tc->tolq, sd);
out:
    free(ref);
    free(refq);
    free(dq);
    ref_free(r);
    ref_free(rq);
    sd_session_free(s);
    sd_model_free(m);
}

static void test_forward_vs_reference(void) {
    char skipped[256] = "";
    int n_run = 0;
    printf("  info: kernels: %s\n", sd_quant_backend());
    const char *archs[2] = {"llama", "qwen2"};
    for (int a = 0; a < 2; a++)
        for (size_t k = 0; k < sizeof k_types / sizeof *k_types; k++) {
            if (!type_usable(k_types[k].type)) {
                if (a == 0) {
                    size_t l = strlen(skipped);
                    const sd_type_traits *tr = sd_type_get(k_types[k].type);
                    snprintf(skipped + l, sizeof skipped - l, " %s", tr && tr->name ? tr->name : "?");
                }
                continue;
            }
            check_vs_ref(archs[a], &k_types[k]);
            n_run++;
        }
    if (skipped[0]) printf("  info: types not yet supported by quant.c, not checked:%s\n", skipped);
    CHECK(n_run > 0, "no tensor type could be checked");
}

// 150 tokens fed in batches of 16 (forward + commit each), every logit row
// compared with the reference: long attention spans, many commits. Head
// dimensions 16, 12 and 40 cover the vector and scalar attention paths. Both
// sides round K and V to fp16, but an element 1e-7 off (float order) can
// round to the neighbouring half: a few rows differ by up to ~3e-3 (measured
// 2.7e-3, head dim 40), so the max is bounded at 1e-2 (a wrong key, mask or
// position gives > 0.1) and the median row mean at 3e-4 (measured <= 6.4e-5).
static void long_context(int n_embd, int n_head, int n_head_kv) {
    synth_params p = synth_default_params();
    p.n_embd = n_embd;
    p.n_head = n_head;
    p.n_head_kv = n_head_kv;
    sd_model *m;
    if (synth_load(&p, "long", &m) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    const int V = m->hp.n_vocab, N = 150;
    sd_session *s = new_session(m, 160, 16, 2);
    ref_state *r = ref_new(m, 160);
    float *ref = malloc((size_t)V * sizeof(float));
    CHECK(s && r && ref, "%s", g_err);
    float worst = 0;
    float *diffs = malloc((size_t)N * sizeof(float)); // each row's mean |diff|
    int n_rows = 0;
    int32_t toks[16];
    for (int done = 0; s && r && ref && diffs && done < N;) {
        int n = SD_MIN(16, N - done);
        for (int i = 0; i < n; i++) toks[i] = (int32_t)((done + i) * 131 % V);
        sd_batch b = {.n = n, .tokens = toks};
        if (sd_session_forward(s, &b, g_err, sizeof g_err) < 0) {
            CHECK(0, "%s", g_err);
            break;
        }
        for (int i = 0; i < n; i++) {
            ref_eval(r, toks[i], -1, ref);
            const float *got = sd_session_logits(s, i);
            float d = max_abs_diff(got, ref, V), mean = 0;
            for (int v = 0; v < V; v++) mean += fabsf(got[v] - ref[v]) / (float)V;
            diffs[n_rows++] = mean;
            if (!(d <= worst)) worst = d;
        }
        sd_session_commit(s, NULL, 0, g_err, sizeof g_err);
        done += n;
    }
    qsort(diffs, (size_t)n_rows, sizeof(float), cmp_float);
    const float med = n_rows ? diffs[n_rows / 2] : 0;
    CHECK(n_rows == N, "long context: %d of %d rows compared", n_rows, N);
    CHECK(worst <= 1e-2f, "long context (head dim %d): max diff %g", n_embd / n_head, worst);
    CHECK(med <= 3e-4f, "long context (head dim %d): median row mean diff %g", n_embd / n_head, med);
    printf("  info: 150 tokens in batches of 16 vs reference, head dim %d, %d kv heads: max|diff| %.2e (tol 0.01), "
           "median row mean %.1e (tol 3e-4)\n", n_embd / n_head, n_head_kv, worst, med);
    free(diffs);
    free(ref);
    ref_free(r);
    sd_session_free(s);
    sd_model_free(m);
}

static void test_long_context_vs_reference(void) {
    long_context(64, 4, 1);  // GQA 4:1
    long_context(112, 7, 1); // GQA 7:1 (3 + 3 + 1), as Qwen2.5-0.5B
    long_context(48, 4, 2);  // head dim 12: the attention's outputs take the scalar tail
    long_context(160, 4, 4); // head dim 40: 32-wide vector part + scalar tail (AVX-512)
    long_context(256, 2, 1); // head dim 128 (Qwen2.5): two 64-dim output chunks
}

// ---------------------------------------------------------------- batch / tree semantics

// (a) A chain of 7 in one batch equals 7 single-token forwards.
// Differences between two sets of logit rows: the max of |a - b| and the
// largest per-row mean of |a - b|.
typedef struct {
    float max;
    double row_mean;
} diff_stats;

typedef struct {
    float max;   // allowed max |diff|
    float mean;  // allowed mean |diff| within any row
} sem_tol;

static int g_sem_threads = 2; // threads of the sessions in check_chain / check_tree / check_commit

static void diff_add(diff_stats *st, const float *a, const float *b, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= st->max)) st->max = d; // NaN propagates as a failure
        sum += d;
    }
    if (!(sum / n <= st->row_mean)) st->row_mean = sum / n;
}

static void diff_check(const diff_stats *st, const sem_tol *tol, const char *what, const char *how) {
    CHECK(st->max <= tol->max && st->row_mean <= tol->mean, "%s: %s: max|diff| %g (tol %g), row mean %g (tol %g)",
          what, how, st->max, tol->max, st->row_mean, tol->mean);
    printf("  info: %s %s: max|diff| %.2e (tol %.2g), worst row mean %.1e (tol %.2g)\n", what, how, st->max,
           tol->max, st->row_mean, tol->mean);
}

static void check_chain(const sd_model *m, const int32_t *prompt, int n_prompt, const int32_t *chain, const sem_tol *tol,
                        const char *what) {
    const int V = m->hp.n_vocab;
    sd_session *s1 = new_session(m, 128, 16, g_sem_threads), *s2 = new_session(m, 128, 16, g_sem_threads);
    CHECK(s1 && s2, "session: %s", g_err);
    if (!s1 || !s2) goto out;
    CHECK(feed_chain(s1, prompt, n_prompt) == 0, "prompt: %s", g_err);
    CHECK(feed_chain(s2, prompt, n_prompt) == 0, "prompt: %s", g_err);
    sd_batch b = {.n = 7, .tokens = chain};
    CHECK(sd_session_forward(s1, &b, g_err, sizeof g_err) == 0, "%s", g_err);
    diff_stats st = {0, 0};
    for (int i = 0; i < 7; i++) {
        sd_batch b1 = {.n = 1, .tokens = chain + i};
        if (sd_session_forward(s2, &b1, g_err, sizeof g_err) < 0) {
            CHECK(0, "%s", g_err);
            break;
        }
        diff_add(&st, sd_session_logits(s1, i), sd_session_logits(s2, 0), V);
        sd_session_commit(s2, NULL, 0, g_err, sizeof g_err);
    }
    diff_check(&st, tol, what, "chain of 7 batched vs one by one");
out:
    sd_session_free(s1);
    sd_session_free(s2);
}

// The test tree: 10 nodes, depth 3, branching 2-3.
//        0
//      / | \      .
//     1  2  3
//    / \  \       .
//   4   5  6
//   |   |  |
//   7   8  9
static const int32_t k_tree_parent[10] = {-1, 0, 0, 0, 1, 1, 2, 4, 5, 6};

static int tree_path(int node, int32_t *path) {
    int tmp[16], n = 0;
    for (int v = node; v >= 0; v = k_tree_parent[v]) tmp[n++] = v;
    for (int k = 0; k < n; k++) path[k] = tmp[n - 1 - k];
    return n;
}

// (b) Every node of a tree batch has the logits of its root-to-node path run alone.
static void check_tree(const sd_model *m, const int32_t *prompt, int n_prompt, const int32_t *ttok, const sem_tol *tol,
                       const char *what) {
    const int V = m->hp.n_vocab;
    sd_session *s1 = new_session(m, 128, 16, g_sem_threads), *s2 = new_session(m, 128, 16, g_sem_threads);
    CHECK(s1 && s2, "session: %s", g_err);
    if (!s1 || !s2) goto out;
    CHECK(feed_chain(s1, prompt, n_prompt) == 0, "prompt: %s", g_err);
    CHECK(feed_chain(s2, prompt, n_prompt) == 0, "prompt: %s", g_err);
    sd_batch b = {.n = 10, .tokens = ttok, .parent = k_tree_parent};
    CHECK(sd_session_forward(s1, &b, g_err, sizeof g_err) == 0, "%s", g_err);
    diff_stats st = {0, 0};
    for (int i = 0; i < 10; i++) {
        int32_t path[16], ptok[16];
        int np = tree_path(i, path);
        for (int k = 0; k < np; k++) ptok[k] = ttok[path[k]];
        sd_batch bp = {.n = np, .tokens = ptok};
        if (sd_session_forward(s2, &bp, g_err, sizeof g_err) < 0) {
            CHECK(0, "%s", g_err);
            break;
        }
        diff_add(&st, sd_session_logits(s1, i), sd_session_logits(s2, np - 1), V);
    }
    diff_check(&st, tol, what, "tree of 10 vs paths alone");
out:
    sd_session_free(s1);
    sd_session_free(s2);
}

// (c) Commit one path of the tree, then decode: same as decoding the path alone.
static void check_commit(const sd_model *m, const int32_t *prompt, int n_prompt, const int32_t *ttok, const sem_tol *tol,
                         const char *what) {
    const int V = m->hp.n_vocab;
    sd_session *s1 = new_session(m, 128, 16, g_sem_threads), *s2 = new_session(m, 128, 16, g_sem_threads);
    CHECK(s1 && s2, "session: %s", g_err);
    if (!s1 || !s2) goto out;
    CHECK(feed_chain(s1, prompt, n_prompt) == 0, "prompt: %s", g_err);
    CHECK(feed_chain(s2, prompt, n_prompt) == 0, "prompt: %s", g_err);
    sd_batch b = {.n = 10, .tokens = ttok, .parent = k_tree_parent};
    CHECK(sd_session_forward(s1, &b, g_err, sizeof g_err) == 0, "%s", g_err);
    int32_t path[16], ptok[16];
    int np = tree_path(8, path); // 0 1 5 8: a path whose rows must move
    for (int k = 0; k < np; k++) ptok[k] = ttok[path[k]];
    CHECK(sd_session_commit(s1, path, np, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_session_n_past(s1) == n_prompt + np, "n_past %d", sd_session_n_past(s1));
    CHECK(feed_chain(s2, ptok, np) == 0, "%s", g_err);
    diff_stats st = {0, 0};
    int32_t tok = ttok[9];
    for (int step = 0; step < 4; step++) {
        sd_batch b1 = {.n = 1, .tokens = &tok};
        if (sd_session_forward(s1, &b1, g_err, sizeof g_err) < 0 ||
            sd_session_forward(s2, &b1, g_err, sizeof g_err) < 0) {
            CHECK(0, "%s", g_err);
            break;
        }
        diff_add(&st, sd_session_logits(s1, 0), sd_session_logits(s2, 0), V);
        sd_session_commit(s1, NULL, 0, g_err, sizeof g_err);
        sd_session_commit(s2, NULL, 0, g_err, sizeof g_err);
        tok = (tok * 5 + 11) % V;
    }
    // Truncate back into the committed path and decode again: same logits as
    // the path session truncated the same way.
    CHECK(sd_session_truncate(s1, n_prompt + 2, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_session_truncate(s2, n_prompt + 2, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_batch b1 = {.n = 1, .tokens = &tok};
    if (sd_session_forward(s1, &b1, g_err, sizeof g_err) == 0 && sd_session_forward(s2, &b1, g_err, sizeof g_err) == 0) {
        diff_add(&st, sd_session_logits(s1, 0), sd_session_logits(s2, 0), V);
    } else
        CHECK(0, "%s", g_err);
    diff_check(&st, tol, what, "commit tree path then decode vs path alone");
out:
    sd_session_free(s1);
    sd_session_free(s2);
}

// Tolerance for batched vs single runs of the same optimized code: only the
// matmul's tiling may change the summation order.
static const sem_tol k_same_code_tol = {1e-3f, 1e-4f};

static void synth_semantics(const char *arch, int type, const char *what) {
    synth_params p = synth_default_params();
    p.arch = arch;
    if (type_usable(type)) p.wtype = type;
    sd_model *m;
    if (synth_load(&p, "sem", &m) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    const int32_t prompt[4] = {1, 270, 33, 301};
    const int32_t chain[7] = {5, 260, 261, 77, 300, 12, 319};
    const int32_t ttok[10] = {280, 281, 282, 283, 284, 285, 286, 287, 288, 289};
    check_chain(m, prompt, 4, chain, &k_same_code_tol, what);
    check_tree(m, prompt, 4, ttok, &k_same_code_tol, what);
    check_commit(m, prompt, 4, ttok, &k_same_code_tol, what);
    sd_model_free(m);
}

static void test_batch_tree_commit_llama(void) { synth_semantics("llama", SD_TYPE_Q8_0, "llama/Q8_0"); }
static void test_batch_tree_commit_qwen2(void) { synth_semantics("qwen2", SD_TYPE_F16, "qwen2/F16"); }

// Tree nodes with explicit positions and logits for a subset only.
static void test_explicit_pos_and_logit_mask(void) {
    synth_params p = synth_default_params();
    sd_model *m;
    if (synth_load(&p, "pos", &m) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_session *s1 = new_session(m, 64, 16, 1), *s2 = new_session(m, 64, 16, 2);
    CHECK(s1 && s2, "%s", g_err);
    if (s1 && s2) {
        const int32_t toks[3] = {10, 20, 30};
        const int32_t par[3] = {-1, 0, 0};
        const int32_t pos[3] = {0, 1, 1};
        const uint8_t want[3] = {0, 1, 1};
        sd_batch b = {.n = 3, .tokens = toks, .parent = par, .pos = pos, .logits = want};
        CHECK(sd_session_forward(s1, &b, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_session_logits(s1, 0) == NULL, "logits not requested but returned");
        sd_batch b2 = {.n = 3, .tokens = toks, .parent = par};
        CHECK(sd_session_forward(s2, &b2, g_err, sizeof g_err) == 0, "%s", g_err);
        const float *a = sd_session_logits(s1, 2), *c = sd_session_logits(s2, 2);
        CHECK(a && c, "missing logits");
        if (a && c) CHECK(max_abs_diff(a, c, m->hp.n_vocab) <= k_same_code_tol.max, "explicit vs default positions");
    }
    sd_session_free(s1);
    sd_session_free(s2);
    sd_model_free(m);
}

// ---------------------------------------------------------------- errors

static void test_forward_errors(void) {
    synth_params p = synth_default_params();
    sd_model *m;
    if (synth_load(&p, "err", &m) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_session *s = new_session(m, 16, 8, 1);
    CHECK(s != NULL, "%s", g_err);
    if (!s) {
        sd_model_free(m);
        return;
    }
    int32_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    sd_batch b = {.n = 9, .tokens = toks};
    g_err[0] = 0;
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "batch"), "batch too large: '%s'", g_err);
    b.n = 0;
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0, "empty batch accepted");
    b.n = 8;
    CHECK(feed_chain(s, toks, 8) == 0, "%s", g_err);
    CHECK(feed_chain(s, toks, 6) == 0, "%s", g_err);
    b.n = 3;
    g_err[0] = 0;
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "context full"), "context full: '%s'",
          g_err);
    CHECK(sd_session_truncate(s, 4, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_session_truncate(s, 5, g_err, sizeof g_err) < 0, "truncate beyond n_past accepted");
    int32_t par[3] = {-1, 0, 2};
    b.parent = par;
    g_err[0] = 0;
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "parent"), "bad parent: '%s'", g_err);
    par[2] = -2;
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0, "parent -2 accepted");
    b.parent = NULL;
    int32_t bad[3] = {1, m->hp.n_vocab, 2};
    b.tokens = bad;
    g_err[0] = 0;
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "token"), "bad token: '%s'", g_err);
    bad[1] = -1;
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0, "token -1 accepted");
    // A tree forward, then a commit of rows that are not a chain.
    int32_t tp[3] = {-1, 0, 0};
    sd_batch bt = {.n = 3, .tokens = toks, .parent = tp};
    CHECK(sd_session_forward(s, &bt, g_err, sizeof g_err) == 0, "%s", g_err);
    int32_t rows[2] = {1, 2};
    g_err[0] = 0;
    CHECK(sd_session_commit(s, rows, 2, g_err, sizeof g_err) < 0 && g_err[0], "non-chain commit accepted");
    CHECK(sd_session_commit(s, NULL, 0, g_err, sizeof g_err) < 0, "commit-all of a tree accepted");
    rows[0] = 0;
    rows[1] = 2;
    CHECK(sd_session_commit(s, rows, 2, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_session_n_past(s) == 6, "n_past %d", sd_session_n_past(s));
    sd_session_free(s);
    sd_model_free(m);
}

static void expect_load_error(synth_params *p, const char *tag, const char *needle1, const char *needle2) {
    sd_model *m = NULL;
    g_err[0] = 0;
    int r = synth_load(p, tag, &m);
    CHECK(r < 0, "%s: load succeeded", tag);
    CHECK(strstr(g_err, needle1) != NULL, "%s: message '%s' lacks '%s'", tag, g_err, needle1);
    if (needle2) CHECK(strstr(g_err, needle2) != NULL, "%s: message '%s' lacks '%s'", tag, g_err, needle2);
    printf("  info: %s -> %s\n", tag, g_err);
    sd_model_free(m);
}

static void test_load_errors(void) {
    synth_params p = synth_default_params();
    p.omit_tensor = "blk.1.ffn_up.weight";
    expect_load_error(&p, "missing", "blk.1.ffn_up.weight", "missing");
    p = synth_default_params();
    p.bad_shape_tensor = "blk.0.ffn_up.weight";
    expect_load_error(&p, "shape", "tensor 'blk.0.ffn_up.weight' has shape [64, 64], expected [64, 128]", NULL);
    p = synth_default_params();
    p.arch = "gpt3";
    expect_load_error(&p, "arch", "gpt3", "architecture");
    p = synth_default_params();
    p.rope_scaling_type = "yarn";
    p.rope_scaling_factor = 4.0f;
    expect_load_error(&p, "yarn", "yarn", "rope.scaling.type");
    p = synth_default_params();
    p.wtype = SD_TYPE_Q8_0;
    p.bad_shape_tensor = "token_embd.weight"; // fewer rows: a tied vocabulary smaller than the tokenizer's is fine,
    p.tied = 0;                               // but then output.weight disagrees with it
    expect_load_error(&p, "vocab", "output.weight", "expected");
    p = synth_default_params();
    p.omit_tensor = "output_norm.weight";
    expect_load_error(&p, "missing-norm", "output_norm.weight", NULL);
}

// Linear RoPE scaling: positions are divided by the factor (checked against
// the reference, which applies it independently).
static void test_rope_linear_scaling(void) {
    synth_params p = synth_default_params();
    p.rope_scaling_type = "linear";
    p.rope_scaling_factor = 4.0f;
    sd_model *m;
    if (synth_load(&p, "linear", &m) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    CHECK(m->hp.rope_scale == 4.0f, "rope_scale %g", (double)m->hp.rope_scale);
    sd_session *s = new_session(m, 32, 8, 1);
    ref_state *r = ref_new(m, 32);
    float *ref = malloc((size_t)m->hp.n_vocab * sizeof(float));
    CHECK(s && r && ref, "%s", g_err);
    if (s && r && ref) {
        const int32_t toks[6] = {1, 290, 3, 311, 7, 260};
        sd_batch b = {.n = 6, .tokens = toks};
        CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) == 0, "%s", g_err);
        float worst = 0;
        for (int i = 0; i < 6; i++) {
            ref_eval(r, toks[i], -1, ref);
            float d = max_abs_diff(sd_session_logits(s, i), ref, m->hp.n_vocab);
            if (!(d <= worst)) worst = d;
        }
        CHECK(worst <= 2e-3f, "linear rope scaling: max diff %g", worst);
    }
    free(ref);
    ref_free(r);
    sd_session_free(s);
    sd_model_free(m);
}

static void test_model_info(void) {
    synth_params p = synth_default_params();
    p.arch = "qwen2";
    p.tied = 0;
    sd_model *m;
    if (synth_load(&p, "info", &m) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_model_info info;
    sd_model_get_info(m, &info);
    CHECK(strcmp(info.arch, "qwen2") == 0, "arch %s", info.arch);
    CHECK(info.n_vocab == 320 && info.n_embd == 64 && info.n_layer == 2 && info.n_head == 4 && info.n_head_kv == 2 &&
              info.head_dim == 16 && info.n_ff == 128 && info.n_ctx_train == 512,
          "hparams");
    CHECK(m->hp.rope_type == SD_ROPE_NEOX && m->layers[0].bq != NULL && m->output != m->tok_embd, "qwen2 details");
    CHECK(sd_model_tokenizer(m) != NULL, "no tokenizer");
    sd_session *s = new_session(m, 0, 0, 0);
    CHECK(s && sd_session_n_ctx(s) == 512 && sd_session_model(s) == m, "default session");
    sd_session_free(s);
    sd_model_free(m);
}

// ---------------------------------------------------------------- the default model

static void test_default_model(void) {
    if (t_slow_family()) SKIP("%s", t_slow_family());
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s absent (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    CHECK(m->hp.n_layer == 30 && m->hp.n_head_kv == 3 && m->hp.n_vocab == 49152 && sd_model_file_tensor(m, m->output) == m->tok_embd,
          "hparams");
    sd_session *s = new_session(m, 256, 64, 1);
    CHECK(s != NULL, "%s", g_err);
    if (!s) {
        sd_model_free(m);
        return;
    }
    // "The capital of France is" -> " Paris" "." "\n" "\n" (greedy; ids from
    // the vocabulary, expected continuation from a float64 numpy forward over
    // the dequantized weights, whose top-2 margins at these steps are 2.5,
    // 1.3, 1.4, 1.3: comfortably above the ~0.3 typical logit noise of 8-bit
    // activations).
    const int32_t prompt[5] = {504, 3575, 282, 4649, 314};
    const int32_t expect[4] = {7042, 30, 198, 198};
    sd_batch b = {.n = 5, .tokens = prompt};
    int ok = sd_session_forward(s, &b, g_err, sizeof g_err) == 0;
    CHECK(ok, "%s", g_err);
    int32_t got[4] = {0};
    for (int k = 0; k < 4 && ok; k++) {
        const float *lg = sd_session_logits(s, k == 0 ? 4 : 0);
        int best = 0;
        for (int v = 1; v < m->hp.n_vocab; v++)
            if (lg[v] > lg[best]) best = v;
        got[k] = best;
        sd_session_commit(s, NULL, 0, g_err, sizeof g_err);
        sd_batch b1 = {.n = 1, .tokens = &got[k]};
        ok = sd_session_forward(s, &b1, g_err, sizeof g_err) == 0;
    }
    CHECK(memcmp(got, expect, sizeof got) == 0, "greedy: got %d %d %d %d, expected %d %d %d %d", got[0], got[1],
          got[2], got[3], expect[0], expect[1], expect[2], expect[3]);
    sd_session_free(s);
    // Batch semantics on the real model. With the scalar kernels
    // (sd_quant_init(1)) batched and single runs agree exactly (measured 0).
    // The optimized kernels sum a batch (gemm) in a different order than a
    // single row (vec_dot), about 1e-6 relative; over 30 layers of 8-bit
    // activation rounding this grows to max differences of 0.6..1.2 here
    // (logit std ~3.5, values up to ~30), worst row means 0.15..0.65,
    // changing with every kernel revision. Measured effects of real bugs on
    // a row: one wrong token in the attended context (a mask or commit error)
    // gives a row mean of ~7.8; positions off by one for the last two tokens
    // ~0.65, inside the noise. Tolerances: max 5, row mean 2: this catches
    // mask and commit errors on the real model; position errors are caught by
    // the synthetic models above, whose tolerances are tight.
    const sem_tol tol = {5.0f, 2.0f};
    g_sem_threads = 1; // the big model with one thread: robust on a busy machine
    const int32_t chain[7] = {7042, 30, 198, 198, 504, 3575, 282};
    const int32_t ttok[10] = {7042, 30, 13, 11, 198, 28, 198, 504, 314, 253};
    check_chain(m, prompt, 5, chain, &tol, "SmolLM2");
    check_tree(m, prompt, 5, ttok, &tol, "SmolLM2");
    check_commit(m, prompt, 5, ttok, &tol, "SmolLM2");
    g_sem_threads = 2;
    sd_model_free(m);
}

int main(int argc, char **argv) {
    (void)argc;
    t_families(argv); // every case under each kernel family this CPU has
    T_RUN(test_load_errors);
    T_RUN(test_model_info);
    T_RUN(test_rope_linear_scaling);
    T_RUN(test_forward_errors);
    T_RUN(test_forward_vs_reference);
    T_RUN(test_long_context_vs_reference);
    T_RUN(test_batch_tree_commit_llama);
    T_RUN(test_batch_tree_commit_qwen2);
    T_RUN(test_explicit_pos_and_logit_mask);
    T_RUN(test_default_model);
    T_EXIT();
}
