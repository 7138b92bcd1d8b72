// test_forward_part.c - a model split by layers (pipeline parallelism,
// docs/mpi.md) in one process: parts loaded with sd_model_load_part, their
// sessions run with sd_session_forward_part in order, give every logit and
// hidden row the bits of the whole model's forward, through prompts, trees,
// commits of tree paths and truncations; a session hooked
// (sd_session_set_hooks) to run the parts generates exactly the whole
// model's greedy text, plainly and with a draft tree; a part refuses the
// layers it does not hold, a whole forward and state saving, with
// a message; a part's held bytes are its share; several sessions' batches
// through parts (sd_batcher_forward_part) equal a batcher pass over the
// whole model; a model's session hook reaches every new session, a skip
// drafter's included, and their release. Synthetic models (F32 and
// Q4_1, llama and qwen2); the default model when present.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "specdec_spec.h"
#include "kernels/quant.h"
#include "lib/synth.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define MAXP 4    // parts
#define MAXN 16   // nodes per batch
#define NHID 3

static char g_err[512];

// A pipeline in one process: parts[0] holds layers [0, cut[1]) and the
// output, parts[k] layers [cut[k], cut[k + 1]).
typedef struct ppipe {
    int n_parts, n_layer, n_embd;
    int cut[MAXP + 1];
    sd_model *pm[MAXP];
    sd_session *ps[MAXP];
    float *x;        // (MAXN, n_embd) residual rows between parts
    float *x2;
    int fail;        // a hook failed
} ppipe;

static int pipe_forward(void *arg, sd_session *s, const sd_batch *b, char *err, size_t errlen) {
    ppipe *p = arg;
    (void)s;
    sd_forward_part pt = {.layer_lo = 0, .layer_hi = p->cut[1], .output = 0, .x_out = p->x};
    if (sd_session_forward_part(p->ps[0], b, &pt, err, errlen) < 0) return -1;
    for (int k = 1; k < p->n_parts; k++) {
        sd_batch bk = *b;
        bk.tokens = NULL;
        memcpy(p->x2, p->x, (size_t)b->n * p->n_embd * sizeof(float));
        bk.embd = p->x2;
        sd_forward_part q = {.layer_lo = p->cut[k], .layer_hi = p->cut[k + 1], .output = 0, .x_out = p->x};
        if (sd_session_forward_part(p->ps[k], &bk, &q, err, errlen) < 0) return -1;
    }
    sd_batch bl = *b;
    bl.tokens = NULL;
    bl.embd = p->x;
    sd_forward_part o = {.layer_lo = p->n_layer, .layer_hi = p->n_layer, .output = 1, .x_out = NULL};
    return sd_session_forward_part(p->ps[0], &bl, &o, err, errlen);
}

static void pipe_commit(void *arg, const int32_t *rows, int n) {
    ppipe *p = arg;
    char e[256];
    for (int k = 1; k < p->n_parts; k++)
        if (sd_session_commit(p->ps[k], rows, n, e, sizeof e) < 0) p->fail = 1;
}

static void pipe_truncate(void *arg, int n) {
    ppipe *p = arg;
    char e[256];
    for (int k = 1; k < p->n_parts; k++)
        if (sd_session_truncate(p->ps[k], n, e, sizeof e) < 0) p->fail = 1;
}

static sd_session *new_session(const sd_model *m, int n_ctx) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = 64;
    sp.n_threads = 2;
    sd_session *s = NULL;
    if (sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return NULL;
    return s;
}

// Loads the parts of path at the cuts (cut[0] = 0, cut[n] = n_layer) with
// n_ctx sessions, hooks set on part 0's. 0, or -1 with g_err.
static int pipe_open(ppipe *p, const char *path, const int *cut, int n_parts, int n_ctx) {
    memset(p, 0, sizeof *p);
    p->n_parts = n_parts;
    for (int k = 0; k <= n_parts; k++) p->cut[k] = cut[k];
    for (int k = 0; k < n_parts; k++) {
        if (sd_model_load_part(&p->pm[k], path, cut[k], cut[k + 1], k == 0, g_err, sizeof g_err) < 0) return -1;
        if (!(p->ps[k] = new_session(p->pm[k], n_ctx))) return -1;
    }
    sd_model_info mi;
    sd_model_get_info(p->pm[0], &mi);
    p->n_layer = mi.n_layer;
    p->n_embd = mi.n_embd;
    p->x = malloc((size_t)64 * mi.n_embd * sizeof(float));
    p->x2 = malloc((size_t)64 * mi.n_embd * sizeof(float));
    const sd_session_hooks h = {.forward = pipe_forward, .commit = pipe_commit, .truncate = pipe_truncate, .arg = p};
    sd_session_set_hooks(p->ps[0], &h);
    return 0;
}

static void pipe_close(ppipe *p) {
    for (int k = 0; k < p->n_parts; k++) {
        sd_session_free(p->ps[k]);
        sd_model_free(p->pm[k]);
    }
    free(p->x);
    free(p->x2);
}

static uint64_t g_rng = 0x2545F4914F6CDD1DULL;
static uint32_t rnd(uint32_t n) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(g_rng >> 33) % n;
}

// Rounds of random batches (a prompt chain, then trees with hidden rows),
// on the whole model's session w and the pipeline's hooked session; every
// logit and hidden row compared bit for bit, random paths committed on both,
// an occasional truncation.
static void compare_rounds(sd_session *w, ppipe *p, int n_vocab, int n_layer, int n_embd, const char *what) {
    sd_session *s = p->ps[0];
    int32_t tok[MAXN], par[MAXN];
    uint8_t want[MAXN];
    const int32_t hl[NHID] = {0, n_layer - 1, SD_HIDDEN_NORM};
    const int32_t hl2[NHID] = {n_layer / 2, SD_HIDDEN_NORM, 1 % n_layer};
    float *h1 = malloc((size_t)MAXN * NHID * n_embd * sizeof(float));
    float *h2 = malloc((size_t)MAXN * NHID * n_embd * sizeof(float));
    int bad = 0;
    for (int round = 0; round < 12 && !bad; round++) {
        const int n = round == 0 ? 9 : 1 + (int)rnd(MAXN);
        for (int i = 0; i < n; i++) {
            tok[i] = (int32_t)rnd((uint32_t)n_vocab);
            par[i] = round == 0 || i == 0 ? i - 1 : (int32_t)rnd((uint32_t)i + 1) - 1;
            want[i] = (uint8_t)(rnd(3) != 0);
        }
        sd_batch b = {.n = n, .tokens = tok, .parent = par};
        if (round % 2) {
            b.hidden_layers = round % 4 == 1 ? hl : hl2;
            b.n_hidden_layers = NHID;
            b.hidden = want;
        }
        b.hidden_out = h1;
        char e1[256], e2[256];
        int r1 = sd_session_forward(w, &b, e1, sizeof e1);
        b.hidden_out = h2;
        int r2 = sd_session_forward(s, &b, e2, sizeof e2);
        CHECK(r1 == 0 && r2 == 0, "%s round %d: forward %d '%s' / %d '%s'", what, round, r1, e1, r2, e2);
        if (r1 || r2) break;
        for (int i = 0; i < n && !bad; i++) {
            const float *a = sd_session_logits(w, i), *c = sd_session_logits(s, i);
            if (!a || !c || memcmp(a, c, (size_t)n_vocab * sizeof(float))) {
                CHECK(0, "%s round %d: logits of node %d differ", what, round, i);
                bad = 1;
            }
        }
        if (b.n_hidden_layers) {
            int nw = 0;
            for (int i = 0; i < n; i++) nw += want[i] != 0;
            if (memcmp(h1, h2, (size_t)nw * NHID * n_embd * sizeof(float))) {
                CHECK(0, "%s round %d: hidden rows differ", what, round);
                bad = 1;
            }
        }
        // commit a root-to-node path (the whole chain in round 0)
        int32_t path[MAXN];
        int np = 0;
        if (round == 0) {
            for (int i = 0; i < n; i++) path[np++] = i;
        } else {
            int leaf = (int)rnd((uint32_t)n), chain[MAXN], nc = 0;
            for (int v = leaf; v >= 0; v = par[v]) chain[nc++] = v;
            for (int i = nc - 1; i >= 0; i--) path[np++] = chain[i];
        }
        CHECK(sd_session_commit(w, path, np, e1, sizeof e1) == 0, "%s", e1);
        CHECK(sd_session_commit(s, path, np, e2, sizeof e2) == 0, "%s", e2);
        if (round % 5 == 4) {
            const int to = sd_session_n_past(w) - 3;
            CHECK(sd_session_truncate(w, to, e1, sizeof e1) == 0, "%s", e1);
            CHECK(sd_session_truncate(s, to, e2, sizeof e2) == 0, "%s", e2);
        }
        for (int k = 1; k < p->n_parts; k++)
            CHECK(sd_session_n_past(p->ps[k]) == sd_session_n_past(w), "%s: part %d holds %d rows, the whole %d", what,
                  k, sd_session_n_past(p->ps[k]), sd_session_n_past(w));
    }
    CHECK(!p->fail, "%s: a hook's commit or truncate failed", what);
    free(h1);
    free(h2);
}

static void split_synth(const char *arch, int wtype, const int *cut, int n_parts, const char *tag) {
    synth_params sp = synth_default_params();
    sp.arch = arch;
    sp.n_layer = cut[n_parts];
    sp.wtype = wtype;
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_fpart_%d_%s.gguf", (int)getpid(), tag);
    if (synth_write(path, &sp, g_err, sizeof g_err) < 0) {
        CHECK(0, "synth: %s", g_err);
        return;
    }
    sd_model *m = NULL;
    ppipe p;
    CHECK(sd_model_load(&m, path, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(pipe_open(&p, path, cut, n_parts, 256) == 0, "%s", g_err);
    sd_session *w = m ? new_session(m, 256) : NULL;
    if (w && p.ps[n_parts - 1]) compare_rounds(w, &p, sp.n_vocab, sp.n_layer, sp.n_embd, tag);
    sd_session_free(w);
    pipe_close(&p);
    sd_model_free(m);
    remove(path);
}

static void test_parts_equal_whole_synth(void) {
    const int c2[] = {0, 2, 5}, c3[] = {0, 1, 3, 5}, c4[] = {0, 1, 2, 4, 5};
    split_synth("llama", SD_TYPE_F32, c2, 2, "f32_2");
    split_synth("llama", SD_TYPE_Q4_1, c3, 3, "q41_3");
    split_synth("qwen2", SD_TYPE_Q4_1, c4, 4, "qwen_4");
}

// Greedy generation on the hooked pipeline equals the whole model's: plain,
// and with a draft tree of a second synthetic model.
static void test_pipeline_generates_whole_text(void) {
    synth_params sp = synth_default_params();
    sp.n_layer = 4;
    sp.wtype = SD_TYPE_Q4_1;
    sp.words_only = 1;
    char path[256], dpath[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_fpart_%d_gen.gguf", (int)getpid());
    snprintf(dpath, sizeof dpath, "/tmp/specdec_test_fpart_%d_dft.gguf", (int)getpid());
    synth_params dp = sp;
    dp.n_layer = 1;
    CHECK(synth_write(path, &sp, g_err, sizeof g_err) == 0 && synth_write(dpath, &dp, g_err, sizeof g_err) == 0,
          "%s", g_err);
    sd_model *m = NULL, *dm = NULL;
    CHECK(sd_model_load(&m, path, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_model_load(&dm, dpath, g_err, sizeof g_err) == 0, "%s", g_err);
    ppipe p;
    const int cut[] = {0, 1, 3, 4};
    CHECK(pipe_open(&p, path, cut, 3, 512) == 0, "%s", g_err);
    sd_session *w = m ? new_session(m, 512) : NULL;
    if (!w || !dm || !p.ps[2]) goto done;
    const char *methods[] = {NULL, "tree:2-2-1", "chain:3"};
    const int32_t prompt[] = {1, 300, 301, 302, 305, 300, 301};
    for (int mi = 0; mi < 3; mi++) {
        int32_t out[2][64];
        int n_out[2] = {0, 0};
        for (int side = 0; side < 2; side++) {
            sd_session *s = side ? p.ps[0] : w;
            sd_sampler_params smp_p = sd_sampler_default_params();
            smp_p.temp = 0;
            sd_sampler *smp = NULL;
            sd_drafter *d = NULL;
            CHECK(sd_sampler_new(&smp, &smp_p, sp.n_vocab, g_err, sizeof g_err) == 0, "%s", g_err);
            if (methods[mi]) {
                sd_method meth;
                sd_method_env env = sd_method_env_default(side ? p.pm[0] : m);
                const sd_model *drafts[1] = {dm};
                env.drafts = drafts;
                env.n_drafts = 1;
                env.n_threads = 1;
                CHECK(sd_method_parse(methods[mi], &meth, g_err, sizeof g_err) == 0 &&
                          sd_method_make(&meth, &env, &d, g_err, sizeof g_err) == 0,
                      "%s: %s", methods[mi], g_err);
            }
            sd_gen_params gp = sd_gen_default_params();
            gp.n_predict = 40;
            sd_gen *g = NULL;
            CHECK(sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err) == 0, "%s", g_err);
            if (g && sd_gen_prefill(g, prompt, 7, g_err, sizeof g_err) == 0) {
                sd_step st;
                do {
                    if (sd_gen_step(g, &st, g_err, sizeof g_err) < 0) {
                        CHECK(0, "step: %s", g_err);
                        break;
                    }
                    for (int i = 0; i < st.n_tokens && n_out[side] < 64; i++) out[side][n_out[side]++] = st.tokens[i];
                } while (st.finish == SD_FINISH_NONE);
            } else {
                CHECK(0, "prefill: %s", g_err);
            }
            sd_gen_free(g);
            sd_drafter_free(d);
            sd_sampler_free(smp);
        }
        CHECK(n_out[0] == 40 && n_out[0] == n_out[1] && !memcmp(out[0], out[1], sizeof(int32_t) * (size_t)n_out[0]),
              "%s: the pipeline's text differs from the whole model's (%d / %d tokens)",
              methods[mi] ? methods[mi] : "ar", n_out[0], n_out[1]);
    }
    CHECK(!p.fail, "a hook failed");
done:
    sd_session_free(w);
    pipe_close(&p);
    sd_model_free(m);
    sd_model_free(dm);
    remove(path);
    remove(dpath);
}

// Several sessions' batches through parts with sd_batcher_forward_part (a
// pipeline's server): every logit and hidden row equals a batcher pass over
// the whole model's twin sessions, through rounds of trees and commits.
static void test_batcher_parts_equal_whole(void) {
    synth_params sp = synth_default_params();
    sp.n_layer = 5;
    sp.wtype = SD_TYPE_Q4_1;
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_fpart_%d_bat.gguf", (int)getpid());
    CHECK(synth_write(path, &sp, g_err, sizeof g_err) == 0, "%s", g_err);
    enum { NS = 3, CUT = 2 };
    const int E = sp.n_embd, V = sp.n_vocab, L = sp.n_layer;
    sd_model *mw = NULL, *ma = NULL, *mb = NULL;
    sd_threadpool *pw = NULL, *pa = NULL, *pb = NULL;
    sd_batcher *bw = NULL, *ba = NULL, *bb = NULL;
    sd_session *w[NS] = {0}, *a[NS] = {0}, *b[NS] = {0};
    int ok = sd_model_load(&mw, path, g_err, sizeof g_err) == 0 &&
             sd_model_load_part(&ma, path, 0, CUT, 1, g_err, sizeof g_err) == 0 &&
             sd_model_load_part(&mb, path, CUT, L, 0, g_err, sizeof g_err) == 0 &&
             sd_threadpool_new(&pw, 2, g_err, sizeof g_err) == 0 && sd_threadpool_new(&pa, 2, g_err, sizeof g_err) == 0 &&
             sd_threadpool_new(&pb, 2, g_err, sizeof g_err) == 0 &&
             sd_batcher_new(&bw, mw, pw, 64, g_err, sizeof g_err) == 0 &&
             sd_batcher_new(&ba, ma, pa, 64, g_err, sizeof g_err) == 0 &&
             sd_batcher_new(&bb, mb, pb, 64, g_err, sizeof g_err) == 0;
    for (int i = 0; ok && i < NS; i++) {
        sd_session_params ps = sd_session_default_params();
        ps.n_ctx = 256;
        ps.n_batch = 32;
        ps.pool = pw;
        ok = sd_session_new(&w[i], mw, &ps, g_err, sizeof g_err) == 0;
        ps.pool = pa;
        ok = ok && sd_session_new(&a[i], ma, &ps, g_err, sizeof g_err) == 0;
        ps.pool = pb;
        ok = ok && sd_session_new(&b[i], mb, &ps, g_err, sizeof g_err) == 0;
    }
    CHECK(ok, "%s", g_err);
    float *x = malloc(sizeof(float) * NS * MAXN * E), *x2 = malloc(sizeof(float) * NS * MAXN * E);
    float *hw = malloc(sizeof(float) * NS * MAXN * NHID * E), *hp = malloc(sizeof(float) * NS * MAXN * NHID * E);
    const int32_t hl[NHID] = {1, CUT + 1, SD_HIDDEN_NORM};
    int bad = 0;
    for (int round = 0; ok && round < 8 && !bad; round++) {
        int32_t tok[NS][MAXN], par[NS][MAXN];
        sd_batch bs[NS], bsa[NS], bsb[NS], bso[NS];
        int off[NS + 1] = {0};
        for (int i = 0; i < NS; i++) {
            const int n = round == 0 ? 5 + i : 1 + (int)rnd(MAXN);
            for (int k = 0; k < n; k++) {
                tok[i][k] = (int32_t)rnd((uint32_t)V);
                par[i][k] = round == 0 || k == 0 ? k - 1 : (int32_t)rnd((uint32_t)k + 1) - 1;
            }
            bs[i] = (sd_batch){.n = n, .tokens = tok[i], .parent = par[i]};
            if (i == 1) {
                bs[i].hidden_layers = hl;
                bs[i].n_hidden_layers = NHID;
            }
            off[i + 1] = off[i] + n;
        }
        for (int i = 0; i < NS; i++) bsa[i] = bs[i];
        bs[1].hidden_out = hw;
        bsa[1].hidden_out = hp;
        char e[256];
        CHECK(sd_batcher_forward(bw, w, bs, NS, e, sizeof e) == 0, "whole: %s", e);
        const sd_forward_part p0 = {.layer_lo = 0, .layer_hi = CUT, .x_out = x};
        CHECK(sd_batcher_forward_part(ba, a, bsa, NS, &p0, e, sizeof e) == 0, "part 0: %s", e);
        for (int i = 0; i < NS; i++) {
            bsb[i] = bsa[i];
            bsb[i].tokens = NULL;
            bsb[i].embd = x + (size_t)off[i] * E;
        }
        const sd_forward_part p1 = {.layer_lo = CUT, .layer_hi = L, .x_out = x2};
        CHECK(sd_batcher_forward_part(bb, b, bsb, NS, &p1, e, sizeof e) == 0, "part 1: %s", e);
        for (int i = 0; i < NS; i++) {
            bso[i] = bsb[i];
            bso[i].embd = x2 + (size_t)off[i] * E;
        }
        const sd_forward_part po = {.layer_lo = L, .layer_hi = L, .output = 1};
        CHECK(sd_batcher_forward_part(ba, a, bso, NS, &po, e, sizeof e) == 0, "output: %s", e);
        for (int i = 0; i < NS && !bad; i++)
            for (int k = 0; k < bs[i].n && !bad; k++) {
                const float *lw = sd_session_logits(w[i], k), *lp = sd_session_logits(a[i], k);
                if (!lw || !lp || memcmp(lw, lp, sizeof(float) * (size_t)V)) {
                    CHECK(0, "round %d: session %d node %d: logits differ", round, i, k);
                    bad = 1;
                }
            }
        if (!bad && memcmp(hw, hp, sizeof(float) * (size_t)bs[1].n * NHID * E)) {
            CHECK(0, "round %d: hidden rows differ", round);
            bad = 1;
        }
        for (int i = 0; i < NS; i++) {   // commit a path on all three
            int32_t path[MAXN], chain[MAXN];
            int nc = 0, np = 0;
            for (int v = round == 0 ? bs[i].n - 1 : (int)rnd((uint32_t)bs[i].n); v >= 0; v = par[i][v]) chain[nc++] = v;
            for (int k = nc - 1; k >= 0; k--) path[np++] = chain[k];
            CHECK(sd_session_commit(w[i], path, np, e, sizeof e) == 0 && sd_session_commit(a[i], path, np, e, sizeof e) == 0 &&
                      sd_session_commit(b[i], path, np, e, sizeof e) == 0, "commit: %s", e);
        }
    }
    // a whole pass on a part is refused; a part batch with tokens past layer 0 names the session
    if (ok) {
        int32_t t1 = 5;
        sd_batch one[1] = {{.n = 1, .tokens = &t1}};
        CHECK(sd_batcher_forward(ba, a, one, 1, g_err, sizeof g_err) < 0 && strstr(g_err, "sd_batcher_forward_part"),
              "a whole pass on a part: '%s'", g_err);
        const sd_forward_part p1 = {.layer_lo = CUT, .layer_hi = L, .x_out = x2};
        CHECK(sd_batcher_forward_part(bb, b, one, 1, &p1, g_err, sizeof g_err) < 0 &&
                  sd_batcher_failed_batch(bb) == 0 && strstr(g_err, "embd"), "tokens past layer 0: '%s'", g_err);
    }
    free(x), free(x2), free(hw), free(hp);
    for (int i = 0; i < NS; i++) sd_session_free(w[i]), sd_session_free(a[i]), sd_session_free(b[i]);
    sd_batcher_free(bw), sd_batcher_free(ba), sd_batcher_free(bb);
    sd_threadpool_free(pw), sd_threadpool_free(pa), sd_threadpool_free(pb);
    sd_model_free(mw), sd_model_free(ma), sd_model_free(mb);
    remove(path);
}

// What a part refuses, with a message.
static void test_part_refusals(void) {
    synth_params sp = synth_default_params();
    sp.n_layer = 4;
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_fpart_%d_ref.gguf", (int)getpid());
    CHECK(synth_write(path, &sp, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_model *m = NULL;
    CHECK(sd_model_load_part(&m, path, 2, 6, 0, g_err, sizeof g_err) < 0 && strstr(g_err, "exceeds"),
          "a range past the last layer: '%s'", g_err);
    CHECK(sd_model_load_part(&m, path, 3, 1, 0, g_err, sizeof g_err) < 0, "a reversed range loads");
    CHECK(sd_model_load_part(&m, path, 1, 3, 0, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!m) goto done;
    sd_model_info mi;
    sd_model_get_info(m, &mi);
    CHECK(mi.layer_lo == 1 && mi.layer_hi == 3 && !mi.has_output, "info: [%d, %d) output %d", mi.layer_lo,
          mi.layer_hi, mi.has_output);
    CHECK(mi.n_bytes_held > 0 && mi.n_bytes_held < mi.n_bytes / 2 + 4096, "held %zu of %zu bytes", mi.n_bytes_held,
          mi.n_bytes);
    sd_session *s = new_session(m, 64);
    CHECK(s != NULL, "%s", g_err);
    if (!s) goto done;
    int32_t tok[2] = {5, 6};
    float x[2 * 64] = {0}, xo[2 * 64];
    sd_batch b = {.n = 2, .tokens = tok};
    CHECK(sd_session_forward(s, &b, g_err, sizeof g_err) < 0 && strstr(g_err, "holds layers [1, 3)"),
          "a whole forward on a part: '%s'", g_err);
    sd_forward_part pt = {.layer_lo = 1, .layer_hi = 3, .x_out = xo};
    CHECK(sd_session_forward_part(s, &b, &pt, g_err, sizeof g_err) < 0 && strstr(g_err, "embd"),
          "tokens into layer 1: '%s'", g_err);
    b.tokens = NULL;
    b.embd = x;
    pt.layer_hi = 4;
    CHECK(sd_session_forward_part(s, &b, &pt, g_err, sizeof g_err) < 0 && strstr(g_err, "holds layers"),
          "a layer not held: '%s'", g_err);
    pt.layer_hi = 3;
    pt.output = 1;
    CHECK(sd_session_forward_part(s, &b, &pt, g_err, sizeof g_err) < 0 && strstr(g_err, "output"),
          "an output not held: '%s'", g_err);
    pt.output = 0;
    CHECK(sd_session_forward_part(s, &b, &pt, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_session_logits(s, 0) == NULL, "a part without output gives logits");
    char buf[64];
    CHECK(sd_session_state_save(s, buf, sizeof buf, g_err, sizeof g_err) < 0 && strstr(g_err, "layers"),
          "state of a part: '%s'", g_err);
    sd_session_free(s);
done:
    sd_model_free(m);
    remove(path);
}

// A model's session hook (sd_model_set_session_hook) runs on every new
// session, a skip drafter's included, and may set hooks whose release runs
// when the session is freed; a hook that fails makes sd_session_new fail
// with its message; NULL removes it.
typedef struct hook_count {
    int made, released, fail;
} hook_count;

static void count_release(void *arg) { ((hook_count *)arg)->released++; }

static int count_new(void *arg, sd_session *s, char *err, size_t errlen) {
    hook_count *c = arg;
    if (c->fail) return snprintf(err, errlen, "hook refuses"), SD_ERR_INPUT;
    c->made++;
    const sd_session_hooks h = {.release = count_release, .arg = c};
    sd_session_set_hooks(s, &h);
    return 0;
}

static void test_session_hook(void) {
    synth_params sp = synth_default_params();
    sp.n_layer = 4;
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_fpart_%d_hook.gguf", (int)getpid());
    CHECK(synth_write(path, &sp, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_model *m = NULL;
    CHECK(sd_model_load(&m, path, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!m) goto done;
    hook_count c = {0};
    sd_model_set_session_hook(m, count_new, &c);
    sd_session *s = new_session(m, 64);
    CHECK(s && c.made == 1, "the hook ran %d times for one session", c.made);
    sd_method meth;
    sd_method_env env = sd_method_env_default(m);
    sd_drafter *d = NULL;
    CHECK(sd_method_parse("skip:1-2", &meth, g_err, sizeof g_err) == 0 &&
              sd_method_make(&meth, &env, &d, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(c.made == 2, "the skip drafter's session did not reach the hook (%d)", c.made);
    sd_drafter_free(d);
    CHECK(c.released == 1, "the drafter's session was freed, released %d", c.released);
    sd_session_free(s);
    CHECK(c.released == 2, "released %d of 2", c.released);
    c.fail = 1;
    sd_session *t = new_session(m, 64);
    CHECK(!t && strstr(g_err, "hook refuses"), "a failing hook: session %p, '%s'", (void *)t, g_err);
    sd_session_free(t);
    sd_model_set_session_hook(m, NULL, NULL);
    t = new_session(m, 64);
    CHECK(t && c.made == 2, "a removed hook still ran (%d)", c.made);
    sd_session_free(t);
done:
    sd_model_free(m);
    remove(path);
}

// The default model split in 3: the same logits and hidden rows as whole.
static void test_parts_equal_whole_smollm(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_model_info mi;
    sd_model_get_info(m, &mi);
    const int cut[] = {0, mi.n_layer / 3, 2 * mi.n_layer / 3 + 1, mi.n_layer};
    ppipe p;
    CHECK(pipe_open(&p, DEFAULT_MODEL, cut, 3, 256) == 0, "%s", g_err);
    sd_session *w = new_session(m, 256);
    if (w && p.ps[2]) compare_rounds(w, &p, mi.n_vocab, mi.n_layer, mi.n_embd, "smollm");
    sd_session_free(w);
    pipe_close(&p);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_parts_equal_whole_synth);
    T_RUN(test_pipeline_generates_whole_text);
    T_RUN(test_batcher_parts_equal_whole);
    T_RUN(test_part_refusals);
    T_RUN(test_session_hook);
    T_RUN(test_parts_equal_whole_smollm);
    T_EXIT();
}
