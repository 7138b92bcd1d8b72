// head.c - draft heads: hyper-parameters, the tensor table, initialisation,
// the draft vocabulary and the target fingerprint (files: head/head_io.c).
#include "head/head.h"

#include "head/eagle3.h"
#include "head/moa.h"

#include <math.h>

#include "common.h"
#include "kernels/vmath.h"
#include "model/model.h"

sd_head_hp sd_head_default_hp(const sd_model *m, int type) {
    const sd_hparams *mp = &m->hp;
    sd_head_hp hp;
    memset(&hp, 0, sizeof hp);
    hp.type = type;
    hp.n_embd = mp->n_embd;
    hp.n_head = mp->n_head;
    hp.n_head_kv = mp->n_head_kv;
    hp.head_dim = mp->head_dim;
    hp.n_ff = mp->n_ff;
    hp.n_medusa = 4;
    hp.n_draft_vocab = SD_MIN(8192, mp->n_vocab);
    hp.rms_eps = mp->rms_eps;
    hp.rope_base = mp->rope_base;
    int L = mp->n_layer;
    int ex[3] = {2, L / 2, L - 3};
    for (int i = 0; i < 3; i++) hp.extract[i] = SD_MAX(0, SD_MIN(L - 1, ex[i]));
    hp.norm_before_residual = 0;
    sd_head_bind_target(&hp, m);
    if (type == SD_HEAD_MOA) sd_moa_default_hp(&hp, m);
    return hp;
}

void sd_head_add_tensor(sd_head *h, const char *name, int64_t ne0, int64_t ne1, int is_norm, size_t *off) {
    sd_head_tensor *t = &h->t[h->n_t++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->is_norm = is_norm;
    t->off = *off;
    *off += (size_t)((ne0 * ne1 + 15) / 16 * 16);   // each tensor 64-byte aligned
}

static int check_hp(const sd_head_hp *hp, char *err, size_t errlen) {
    if (hp->type != SD_HEAD_EAGLE3 && hp->type != SD_HEAD_MEDUSA && hp->type != SD_HEAD_MOA)
        return sd_err(err, errlen, "head: unknown type %d", hp->type);
    if (hp->n_embd < 1 || hp->n_embd > 65536) return sd_err(err, errlen, "head: width %d out of range", hp->n_embd);
    if (hp->n_draft_vocab < 1 || hp->n_draft_vocab > hp->target_n_vocab)
        return sd_err(err, errlen, "head: draft vocabulary of %d tokens (the target has %d)", hp->n_draft_vocab,
                      hp->target_n_vocab);
    if (hp->type == SD_HEAD_EAGLE3) {
        if (hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv || hp->head_dim < 2 ||
            hp->head_dim % 2 || hp->n_ff < 1)
            return sd_err(err, errlen, "head: bad attention shape (%d heads, %d kv heads, head size %d, n_ff %d)",
                          hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff);
        for (int i = 0; i < 3; i++)
            if (hp->extract[i] < 0 || hp->extract[i] >= hp->target_n_layer)
                return sd_err(err, errlen, "head: extract layer %d is outside the target's %d layers", hp->extract[i],
                              hp->target_n_layer);
    } else if (hp->type == SD_HEAD_MOA) {
        if (sd_moa_check_hp(hp, err, errlen) < 0) return -1;
    } else if (hp->n_medusa < 1 || hp->n_medusa > SD_HEAD_MAX_MEDUSA) {
        return sd_err(err, errlen, "head: %d Medusa heads (1..%d)", hp->n_medusa, SD_HEAD_MAX_MEDUSA);
    }
    if (!(isfinite(hp->rms_eps) && hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return sd_err(err, errlen, "head: rms epsilon %g, expected a finite number in (0, 1)", (double)hp->rms_eps);
    if (hp->type == SD_HEAD_EAGLE3 && !(isfinite(hp->rope_base) && hp->rope_base > 1.0f))
        return sd_err(err, errlen, "head: RoPE base %g, expected a finite number > 1", (double)hp->rope_base);
    if (hp->type == SD_HEAD_EAGLE3 && (hp->norm_before_residual & ~1))
        return sd_err(err, errlen, "head: norm_before_residual %d, expected 0 or 1", hp->norm_before_residual);
    if (hp->target_n_embd != hp->n_embd)
        return sd_err(err, errlen, "head: made for a target of hidden size %d, its width is %d", hp->target_n_embd,
                      hp->n_embd);
    return 0;
}

int sd_head_new(sd_head **out, const sd_head_hp *hp, char *err, size_t errlen) {
    *out = NULL;
    if (check_hp(hp, err, errlen) < 0) return -1;
    sd_head *h = calloc(1, sizeof *h);
    if (!h) return sd_err(err, errlen, "head: out of memory");
    h->hp = *hp;
    if (hp->type == SD_HEAD_EAGLE3) {   // fields of the other types are zero
        h->hp.n_medusa = 0;
    } else if (hp->type == SD_HEAD_MOA) {
        h->hp.n_medusa = 0;
        h->hp.norm_before_residual = 0;
        memset(h->hp.extract, 0, sizeof h->hp.extract);
        if (h->hp.moa_no_lsa)
            h->hp.moa_lsa_n_head = h->hp.moa_lsa_n_head_kv = h->hp.moa_lsa_head_dim = h->hp.moa_lsa_n_ff = 0;
    } else {
        h->hp.n_head = h->hp.n_head_kv = h->hp.head_dim = h->hp.n_ff = 0;
        h->hp.rope_base = 0.0f;
        h->hp.norm_before_residual = 0;
        memset(h->hp.extract, 0, sizeof h->hp.extract);
    }
    hp = &h->hp;
    size_t off = 0;
    const int64_t d = hp->n_embd, V = hp->n_draft_vocab;
    if (hp->type == SD_HEAD_MOA) {
        sd_moa_build_table(h, &off);
    } else if (hp->type == SD_HEAD_EAGLE3) {
        const int64_t qd = (int64_t)hp->n_head * hp->head_dim, kd = (int64_t)hp->n_head_kv * hp->head_dim;
        sd_head_add_tensor(h, "fc.weight", 3 * d, d, 0, &off);
        sd_head_add_tensor(h, "blk.0.attn_norm.weight", d, 1, 1, &off);
        sd_head_add_tensor(h, "blk.0.attn_norm_2.weight", d, 1, 1, &off);   // llama.cpp's name (files before 2026-11-28: blk.0.hidden_norm.weight)
        sd_head_add_tensor(h, "blk.0.attn_q.weight", 2 * d, qd, 0, &off);
        sd_head_add_tensor(h, "blk.0.attn_k.weight", 2 * d, kd, 0, &off);
        sd_head_add_tensor(h, "blk.0.attn_v.weight", 2 * d, kd, 0, &off);
        sd_head_add_tensor(h, "blk.0.attn_output.weight", qd, d, 0, &off);
        sd_head_add_tensor(h, "blk.0.ffn_norm.weight", d, 1, 1, &off);
        sd_head_add_tensor(h, "blk.0.ffn_gate.weight", d, hp->n_ff, 0, &off);
        sd_head_add_tensor(h, "blk.0.ffn_up.weight", d, hp->n_ff, 0, &off);
        sd_head_add_tensor(h, "blk.0.ffn_down.weight", hp->n_ff, d, 0, &off);
        sd_head_add_tensor(h, "output_norm.weight", d, 1, 1, &off);
        sd_head_add_tensor(h, "output.weight", d, V, 0, &off);
    } else {
        char nm[48];
        for (int k = 0; k < hp->n_medusa; k++) {
            snprintf(nm, sizeof nm, "medusa.%d.fc.weight", k);
            sd_head_add_tensor(h, nm, d, d, 0, &off);
            snprintf(nm, sizeof nm, "medusa.%d.fc.bias", k);
            sd_head_add_tensor(h, nm, d, 1, 0, &off);
            snprintf(nm, sizeof nm, "medusa.%d.output.weight", k);
            sd_head_add_tensor(h, nm, d, V, 0, &off);
        }
    }
    h->n_w = off;
    h->w = aligned_alloc(64, (off * sizeof(float) + 63) / 64 * 64);
    h->d2t = malloc(sizeof(int32_t) * (size_t)V);
    h->t2d = malloc(sizeof(int32_t) * (size_t)hp->target_n_vocab);
    if (!h->w || !h->d2t || !h->t2d) {
        sd_head_free(h);
        return sd_err(err, errlen, "head: out of memory for %zu parameters", off);
    }
    memset(h->w, 0, off * sizeof(float));
    for (int i = 0; i < hp->target_n_vocab; i++) h->t2d[i] = i < V ? i : -1;
    for (int i = 0; i < V; i++) h->d2t[i] = i;
    *out = h;
    return 0;
}

void sd_head_free(sd_head *h) {
    if (!h) return;
    sd_e3_pack_free(h->e3_shared);
    sd_moa_w_free(h->moa_shared);
    free(h->w);
    free(h->d2t);
    free(h->t2d);
    free(h);
}

int sd_head_copy(sd_head **out, const sd_head *h, char *err, size_t errlen) {
    if (sd_head_new(out, &h->hp, err, errlen) < 0) return -1;
    sd_head *c = *out;
    SD_ASSERT(c->n_w == h->n_w && c->n_t == h->n_t);
    memcpy(c->w, h->w, sizeof(float) * h->n_w);
    memcpy(c->d2t, h->d2t, sizeof(int32_t) * (size_t)h->hp.n_draft_vocab);
    memcpy(c->t2d, h->t2d, sizeof(int32_t) * (size_t)h->hp.target_n_vocab);
    memcpy(c->note, h->note, sizeof c->note);
    return 0;
}

void sd_head_init(sd_head *h, uint64_t seed) {
    sd_rng r;
    sd_rng_seed(&r, seed);
    for (int i = 0; i < h->n_t; i++) {
        const sd_head_tensor *t = &h->t[i];
        float *w = h->w + t->off;
        size_t n = (size_t)(t->ne0 * t->ne1);
        if (t->is_norm) {
            for (size_t j = 0; j < n; j++) w[j] = 1.0f;
        } else if (t->ne1 == 1) {   // a bias
            memset(w, 0, n * sizeof(float));
        } else {
            float a = 1.0f / sqrtf((float)t->ne0);
            for (size_t j = 0; j < n; j++) w[j] = (float)((2.0 * sd_rng_uniform(&r) - 1.0) * a);
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int sd_head_set_vocab(sd_head *h, const int32_t *ids, int n, char *err, size_t errlen) {
    if (n != h->hp.n_draft_vocab)
        return sd_err(err, errlen, "head: %d draft tokens given, the head has %d", n, h->hp.n_draft_vocab);
    int32_t *s = malloc(sizeof(int32_t) * (size_t)n);
    if (!s) return sd_err(err, errlen, "head: out of memory");
    memcpy(s, ids, sizeof(int32_t) * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_i32);
    for (int i = 0; i < n; i++) {
        if (s[i] < 0 || s[i] >= h->hp.target_n_vocab || (i && s[i] == s[i - 1])) {
            int bad = s[i];
            free(s);
            return sd_err(err, errlen, "head: draft token %d is %s", bad,
                          bad < 0 || bad >= h->hp.target_n_vocab ? "outside the target vocabulary" : "listed twice");
        }
    }
    memcpy(h->d2t, s, sizeof(int32_t) * (size_t)n);
    free(s);
    for (int i = 0; i < h->hp.target_n_vocab; i++) h->t2d[i] = -1;
    for (int i = 0; i < n; i++) h->t2d[h->d2t[i]] = i;
    return 0;
}

uint64_t sd_head_vocab_hash(const sd_model *m) {
    uint64_t x = 1469598103934665603ull;
    const uint64_t P = 1099511628211ull;
    int n = sd_tokenizer_n_vocab(m->tok);
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *s = sd_token_text(m->tok, i, &len);
        if (!s) len = 0;
        for (size_t j = 0; j < len; j++) x = (x ^ (uint8_t)s[j]) * P;
        for (int b = 0; b < 4; b++) x = (x ^ (uint8_t)(len >> (8 * b))) * P;
    }
    return x;
}

void sd_head_bind_target(sd_head_hp *hp, const sd_model *m) {
    hp->target_n_vocab = m->hp.n_vocab;
    hp->target_n_embd = m->hp.n_embd;
    hp->target_n_layer = m->hp.n_layer;
    hp->target_vocab_hash = sd_head_vocab_hash(m);
}

int sd_head_check_target(const sd_head *h, const sd_model *m, char *err, size_t errlen) {
    const sd_head_hp *hp = &h->hp;
    const char *what = hp->type == SD_HEAD_MEDUSA ? "Medusa head" : hp->type == SD_HEAD_MOA ? "MoA drafter" : "EAGLE-3 head";
    if (hp->target_n_embd != m->hp.n_embd || hp->n_embd != m->hp.n_embd)
        return sd_err(err, errlen, "%s made for a target of hidden size %d; this model has %d", what,
                      hp->target_n_embd, m->hp.n_embd);
    if (hp->target_n_vocab != m->hp.n_vocab)
        return sd_err(err, errlen, "%s made for a vocabulary of %d tokens; this model has %d", what,
                      hp->target_n_vocab, m->hp.n_vocab);
    if (hp->target_n_layer != m->hp.n_layer)   // a split client's file: the target's count
        return sd_err(err, errlen, "%s made for a target of %d layers; this model has %d", what, hp->target_n_layer,
                      m->hp.n_layer);
    uint64_t vh = sd_head_vocab_hash(m);
    if (hp->target_vocab_hash != vh)
        return sd_err(err, errlen,
                      "%s made for another vocabulary (fingerprint %016llx; this model's is %016llx): same sizes, "
                      "different tokens",
                      what, (unsigned long long)hp->target_vocab_hash, (unsigned long long)vh);
    if (hp->type == SD_HEAD_MOA) return sd_moa_check_target(h, m, err, errlen);
    return 0;
}

const char *sd_head_type_name(const sd_head *h) {
    return h->hp.type == SD_HEAD_MEDUSA ? "medusa" : h->hp.type == SD_HEAD_MOA ? "moa" : "eagle3";
}

sd_head_type sd_head_get_type(const sd_head *h) {
    return h->hp.type == SD_HEAD_MEDUSA || h->hp.type == SD_HEAD_MOA ? h->hp.type : SD_HEAD_EAGLE3;
}

int sd_head_describe(const sd_head *h, char *buf, size_t len) {
    const sd_head_hp *hp = &h->hp;
    char facts[256] = "";
    // The recipe's headline facts (key=value lines of the note), space-separated.
    size_t o = 0;
    for (const char *p = h->note; *p && o + 2 < sizeof facts;) {
        size_t L = strcspn(p, "\n");
        if (!strncmp(p, "tokens=", 7) || !strncmp(p, "loss=", 5) || !strncmp(p, "agree=", 6) || !strncmp(p, "seed=", 5) ||
            !strncmp(p, "online.windows=", 15))
            o += (size_t)snprintf(facts + o, sizeof facts - o, " %.*s", (int)L, p);
        p += L + (p[L] == '\n');
    }
    if (hp->type == SD_HEAD_MOA)
        return snprintf(buf, len, "moa drafter: TLI %d, %s%s%s, draft vocabulary %d of %d tokens%s", hp->moa_tli,
                        hp->moa_no_lsa ? "no LSA" : "LSA", hp->moa_sa_full ? ", full-text SA" : "",
                        hp->moa_sa_hidden ? (hp->moa_ca_hidden ? ", SA and CA read the target's state" : ", SA reads the target's state")
                                          : hp->moa_ca_hidden ? ", CA reads the target's state" : "",
                        hp->n_draft_vocab, hp->target_n_vocab, facts);
    if (hp->type == SD_HEAD_MEDUSA)
        return snprintf(buf, len, "medusa head: %d heads, draft vocabulary %d of %d tokens%s", hp->n_medusa,
                        hp->n_draft_vocab, hp->target_n_vocab, facts);
    return snprintf(buf, len, "eagle3 head: layers %d,%d,%d fused, draft vocabulary %d of %d tokens%s", hp->extract[0],
                    hp->extract[1], hp->extract[2], hp->n_draft_vocab, hp->target_n_vocab, facts);
}

void sd_head_draft_probs(const sd_head *h, const float *lg, float *row, int n_row) {
    const int V = h->hp.n_draft_vocab;
    const int32_t *d2t = h->d2t;
    int i = 0;
    vf vm = vf_set1(lg[0]);
    for (; i + SD_VW <= V; i += SD_VW) vm = vf_max(vm, vf_load(lg + i));
    float mx = vf_hmax(vm);
    for (; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
    memset(row, 0, sizeof(float) * (size_t)n_row);
    // exp(lg - mx) scattered to the target ids, summed in double
    double sum = 0.0;
    float e[SD_VW];
    const vf vmx = vf_set1(mx);
    for (i = 0; i + SD_VW <= V; i += SD_VW) {
        vf_store(e, vf_exp(vf_sub(vf_load(lg + i), vmx)));
        for (int l = 0; l < SD_VW; l++) sum += row[d2t[i + l]] = e[l];
    }
    for (; i < V; i++) sum += row[d2t[i]] = expf(lg[i] - mx);
    const float inv = (float)(1.0 / sum);
    for (i = 0; i < V; i++) row[d2t[i]] *= inv;
}
