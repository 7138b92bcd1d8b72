// test_elem.c - the per-element math that the CUDA kernels share with the C
// compiler (src/kernels/elem.h), checked on this machine against the CPU
// engine: every block type's dequantisation against the engine's reference
// to_float (bit for bit), the RoPE angles against a session's own (bit for
// bit) and the pair rotation against double precision, the online-softmax
// merge against a direct softmax, the 64-node tree mask against the ancestor
// lists that the engine's forward records, and the bf16 rounding.
#include "t.h"

#include "common.h"
#include "kernels/elem.h"
#include "kernels/quant.h"
#include "lib/synth.h"
#include "runtime/forward.h"
#include "specdec.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float frand(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }

// Random blocks whose fp16 scales are finite (random bytes elsewhere).
static void fill_blocks(int t, uint8_t *buf, int nb) {
    const int bb = sd_elem_block_bytes(t);
    for (int i = 0; i < nb * bb; i++) buf[i] = (uint8_t)rnd();
    for (int b = 0; b < nb; b++) {
        uint8_t *p = buf + (size_t)b * bb;
        uint16_t h1 = sd_fp32_to_fp16(frand() * 0.1f), h2 = sd_fp32_to_fp16(frand() * 0.1f);
        switch (t) {
        case SD_ELEM_F32: { float f = frand() * 10; memcpy(p, &f, 4); break; }
        case SD_ELEM_F16: memcpy(p, &h1, 2); break;
        case SD_ELEM_BF16: { uint16_t v = sd_fp32_to_bf16(frand() * 10); memcpy(p, &v, 2); break; }
        case SD_ELEM_Q6_K: memcpy(p + 208, &h1, 2); break;
        case SD_ELEM_Q4_0: case SD_ELEM_Q5_0: case SD_ELEM_Q8_0: memcpy(p, &h1, 2); break;
        default: memcpy(p, &h1, 2); memcpy(p + 2, &h2, 2); break; // Q4_1, Q5_1, Q4_K, Q5_K: d and m / dmin
        }
    }
}

static void dequant_every_type(void) {
    static const int types[] = {SD_ELEM_F32, SD_ELEM_F16, SD_ELEM_BF16, SD_ELEM_Q4_0, SD_ELEM_Q4_1, SD_ELEM_Q5_0,
                                SD_ELEM_Q5_1, SD_ELEM_Q8_0, SD_ELEM_Q4_K, SD_ELEM_Q5_K, SD_ELEM_Q6_K};
    sd_quant_init(1); // the scalar references
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int t = types[k];
        const sd_type_traits *tr = sd_type_get(t);
        CHECK(tr && tr->supported, "type %d", t);
        if (!tr) continue;
        CHECK(tr->blck == sd_elem_block_n(t) && (int)tr->tsize == sd_elem_block_bytes(t), "%s: block %d/%zu vs %d/%d",
              tr->name, tr->blck, tr->tsize, sd_elem_block_n(t), sd_elem_block_bytes(t));
        const int nb = 8, n = nb * tr->blck;
        uint8_t *buf = malloc((size_t)nb * tr->tsize);
        float *want = malloc(sizeof(float) * n);
        int bad = 0;
        for (int rep = 0; rep < 50; rep++) {
            fill_blocks(t, buf, nb);
            tr->to_float(buf, want, n);
            for (int j = 0; j < n; j++) {
                float got = sd_elem_row_get(t, buf, j);
                if (memcmp(&got, &want[j], 4) != 0 && !(isnan(got) && isnan(want[j]))) {
                    if (bad++ < 3) printf("  %s element %d: %g, engine %g\n", tr->name, j, got, want[j]);
                }
            }
        }
        CHECK(bad == 0, "%s: %d elements differ from the engine's to_float", tr->name, bad);
        free(buf);
        free(want);
    }
    sd_quant_init(0);
}

static void half_and_bf16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = sd_elem_h2f((uint16_t)h), b = sd_fp16_to_fp32((uint16_t)h);
        if (memcmp(&a, &b, 4) != 0 && !(isnan(a) && isnan(b))) bad++;
    }
    CHECK(bad == 0, "%d fp16 values convert differently", bad);
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = rnd() | (rnd() & 1) << 31;
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        if (sd_elem_f2bf(f) != sd_fp32_to_bf16(f)) bad++;
    }
    CHECK(bad == 0, "%d floats round to bf16 differently", bad);
}

// A session over a synthetic model records the angles and tree masks of a batch.
static sd_model *small_model(const char *arch) {
    synth_params p = synth_default_params();
    p.arch = arch;
    char path[64], err[256];
    snprintf(path, sizeof path, "/tmp/sd_test_elem_%s_%d.gguf", arch, (int)getpid());
    sd_model *m = NULL;
    if (synth_write(path, &p, err, sizeof err) < 0 || sd_model_load(&m, path, err, sizeof err) < 0) {
        printf("  %s\n", err);
        m = NULL;
    }
    unlink(path);
    return m;
}

static void rope_against_session(void) {
    const char *arches[2] = {"llama", "qwen2"};
    for (int a = 0; a < 2; a++) {
        sd_model *m = small_model(arches[a]);
        CHECK(m != NULL, "model");
        if (!m) continue;
        const sd_hparams *hp = &m->hp;
        sd_session *s = NULL;
        sd_session_params sp = sd_session_default_params();
        sp.n_ctx = 256;
        sp.n_batch = 64;
        sp.n_threads = 1;
        char err[256];
        CHECK(sd_session_new(&s, m, &sp, err, sizeof err) == 0, "%s", err);
        if (!s) {
            sd_model_free(m);
            continue;
        }
        const int half = hp->n_rot / 2, neox = hp->rope_type == SD_ROPE_NEOX;
        CHECK(neox == (a == 1), "rope type of %s", arches[a]);
        for (int i = 0; i < half; i++) {
            double f = sd_elem_rope_freq(hp->rope_base, i, hp->n_rot, hp->rope_scale);
            CHECK(f == s->rope_freq[i], "freq %d: %.17g vs %.17g", i, f, s->rope_freq[i]);
        }
        int32_t tok[5] = {3, 4, 5, 6, 7}, pos[5] = {0, 17, 100, 200, 255};
        sd_batch b = {0};
        b.n = 5;
        b.tokens = tok;
        b.pos = pos;
        CHECK(sd_fwd_check(s, &b, err, sizeof err) == 0, "%s", err);
        sd_fwd_record(s, &b);
        double worst = 0;
        for (int t = 0; t < 5; t++)
            for (int i = 0; i < half; i++) {
                double th = (double)pos[t] * sd_elem_rope_freq(hp->rope_base, i, hp->n_rot, hp->rope_scale);
                float c = (float)cos(th), sn = (float)sin(th);
                CHECK(c == s->rope_cs[(size_t)t * half * 2 + 2 * i] && sn == s->rope_cs[(size_t)t * half * 2 + 2 * i + 1],
                      "angle of pair %d at %d", i, pos[t]);
                // the rotation of a random row against double precision
                float row[256];
                for (int j = 0; j < hp->n_rot; j++) row[j] = frand();
                float x[256];
                memcpy(x, row, sizeof(float) * hp->n_rot);
                int j0, j1 = sd_elem_rope_partner(neox, hp->n_rot, i, &j0);
                sd_elem_rope_pair(&x[j0], &x[j1], c, sn, neox);
                double ra = (double)row[j0] * c - (double)row[j1] * sn, rb = (double)row[j0] * sn + (double)row[j1] * c;
                double e = fmax(fabs(x[j0] - ra), fabs(x[j1] - rb));
                if (e > worst) worst = e;
                CHECK(j1 == (neox ? i + half : 2 * i + 1) && j0 == (neox ? i : 2 * i), "pair %d", i);
            }
        CHECK(worst < 3e-7, "rotation off by %g", worst);
        sd_session_free(s);
        sd_model_free(m);
    }
}

static void tree_mask_against_session(void) {
    sd_model *m = small_model("llama");
    CHECK(m != NULL, "model");
    if (!m) return;
    sd_session *s = NULL;
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 256;
    sp.n_batch = 64;
    sp.n_threads = 1;
    char err[256];
    CHECK(sd_session_new(&s, m, &sp, err, sizeof err) == 0, "%s", err);
    for (int rep = 0; s && rep < 200; rep++) {
        int n = 1 + (int)(rnd() % 64);
        int32_t tok[64], par[64];
        for (int i = 0; i < n; i++) {
            tok[i] = (int32_t)(3 + rnd() % 200);
            par[i] = i == 0 || rnd() % 8 == 0 ? -1 : (int32_t)(rnd() % (uint32_t)i);
        }
        sd_batch b = {0};
        b.n = n;
        b.tokens = tok;
        b.parent = par;
        if (sd_fwd_check(s, &b, err, sizeof err) != 0) {
            CHECK(0, "%s", err);
            break;
        }
        sd_fwd_record(s, &b);
        uint64_t anc[64];
        sd_elem_tree_mask(par, n, anc);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            uint64_t want = 0;
            for (int k = 0; k < s->n_anc[i]; k++) want |= (uint64_t)1 << s->anc[(size_t)i * sp.n_batch + k];
            bad += want != anc[i];
            for (int j = 0; j < n; j++) bad += sd_elem_sees(anc, i, j) != (int)((want >> j) & 1);
        }
        CHECK(bad == 0, "tree of %d nodes: %d mask entries differ", n, bad);
    }
    sd_session_free(s);
    sd_model_free(m);
}

static void softmax_merge(void) {
    double worst = 0;
    for (int rep = 0; rep < 500; rep++) {
        int n = 1 + (int)(rnd() % 100), cut = (int)(rnd() % (unsigned)(n + 1));
        float sc[100], v[100];
        for (int i = 0; i < n; i++) {
            sc[i] = frand() * 30;
            v[i] = frand();
        }
        // two partial states, one per part (either may be empty), then merged
        sd_elem_sm st[2] = {{-INFINITY, 0}, {-INFINITY, 0}};
        float acc[2] = {0, 0};
        for (int i = 0; i < n; i++) {
            int k = i >= cut;
            float p, w = sd_elem_sm_add(&st[k], sc[i], &p);
            acc[k] = acc[k] * w + p * v[i];
        }
        float wa, wb;
        sd_elem_sm r = sd_elem_sm_merge(st[0], st[1], &wa, &wb);
        float got = (acc[0] * wa + acc[1] * wb) / r.l;
        double mx = -1e30, z = 0, want = 0;
        for (int i = 0; i < n; i++) mx = fmax(mx, sc[i]);
        for (int i = 0; i < n; i++) {
            z += exp(sc[i] - mx);
            want += exp(sc[i] - mx) * v[i];
        }
        want /= z;
        worst = fmax(worst, fabs(got - want));
        CHECK(r.m == (float)mx, "merged max %g vs %g", r.m, mx);
    }
    CHECK(worst < 2e-6, "softmax merge off by %g", worst);
    float wa, wb;
    sd_elem_sm e = {-INFINITY, 0}, r = sd_elem_sm_merge(e, e, &wa, &wb);
    CHECK(r.l == 0 && wa == 0 && wb == 0, "two empty states");
}

int main(void) {
    T_RUN(dequant_every_type);
    T_RUN(half_and_bf16);
    T_RUN(rope_against_session);
    T_RUN(tree_mask_against_session);
    T_RUN(softmax_merge);
    T_EXIT();
}
