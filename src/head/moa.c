// moa.c - the MoA head's shape: defaults, checks, tensor table, and the
// target weights and RoPE it borrows (docs/moa.md, moa.h).
#include "head/moa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/quant.h"

void sd_moa_default_hp(sd_head_hp *hp, const sd_model *m) {
    const sd_hparams *mp = &m->hp;
    hp->moa_kv_width = 2 * mp->n_head_kv * mp->head_dim;
    const int ekv = hp->moa_kv_width;
    hp->moa_lsa_head_dim = ekv % 64 == 0 ? 64 : mp->head_dim;
    if (ekv % hp->moa_lsa_head_dim) hp->moa_lsa_head_dim = ekv;
    hp->moa_lsa_n_head = ekv / hp->moa_lsa_head_dim;
    hp->moa_lsa_n_head_kv = hp->moa_lsa_n_head;
    hp->moa_lsa_n_ff = 2 * ekv;
    hp->moa_tli = 0;
    hp->moa_no_lsa = 0;
    hp->moa_sa_full = 0;
    memset(hp->extract, 0, sizeof hp->extract);
    hp->n_medusa = 0;
}

int sd_moa_check_hp(const sd_head_hp *hp, char *err, size_t errlen) {
    if (hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv || hp->head_dim < 2 || hp->head_dim % 2 ||
        hp->n_ff < 1)
        return sd_err(err, errlen, "moa: bad SA/CA shape (%d heads, %d kv heads, head size %d, n_ff %d)", hp->n_head,
                      hp->n_head_kv, hp->head_dim, hp->n_ff);
    if (!(isfinite(hp->rope_base) && hp->rope_base > 1.0f))
        return sd_err(err, errlen, "moa: RoPE base %g, expected a finite number > 1", (double)hp->rope_base);
    if (hp->moa_kv_width < 2 || hp->moa_kv_width > 65536)
        return sd_err(err, errlen, "moa: K,V row width %d out of range", hp->moa_kv_width);
    if (hp->moa_no_lsa & ~1) return sd_err(err, errlen, "moa: no_lsa %d, expected 0 or 1", hp->moa_no_lsa);
    if (hp->moa_ca_hidden & ~1)
        return sd_err(err, errlen, "moa: ca_hidden %d, expected 0 or 1", hp->moa_ca_hidden);
    if (hp->moa_sa_hidden & ~1)
        return sd_err(err, errlen, "moa: sa_hidden %d, expected 0 or 1", hp->moa_sa_hidden);
    if (hp->moa_sa_full & ~1)
        return sd_err(err, errlen, "moa: sa_full %d, expected 0 or 1", hp->moa_sa_full);
    if (hp->moa_sa_full && hp->moa_sa_hidden)
        return sd_err(err, errlen, "moa: full-text SA with sa_hidden is not supported (a verified row's SA input "
                      "would depend on where training put the verified points)");
    if (sd_moa_reads_states(hp) && hp->moa_tli >= hp->target_n_layer)
        return sd_err(err, errlen, "moa: a drafter reading the state entering layer L-N needs a layer before it (TLI %d)",
                      hp->moa_tli);
    if (hp->moa_tli < 0 || hp->moa_tli > hp->target_n_layer)
        return sd_err(err, errlen, "moa: TLI %d outside 0..%d (the target has %d layers)", hp->moa_tli,
                      hp->target_n_layer, hp->target_n_layer);
    if (!hp->moa_no_lsa) {
        if (hp->moa_lsa_n_head < 1 || hp->moa_lsa_n_head_kv < 1 || hp->moa_lsa_n_head % hp->moa_lsa_n_head_kv ||
            hp->moa_lsa_head_dim < 2 || hp->moa_lsa_head_dim % 2 || hp->moa_lsa_n_ff < 1 ||
            hp->moa_lsa_n_head * hp->moa_lsa_head_dim != hp->moa_kv_width)
            return sd_err(err, errlen,
                          "moa: bad LSA shape (%d heads of %d, %d kv heads, n_ff %d; heads x size must be the K,V "
                          "width %d)",
                          hp->moa_lsa_n_head, hp->moa_lsa_head_dim, hp->moa_lsa_n_head_kv, hp->moa_lsa_n_ff,
                          hp->moa_kv_width);
    }
    return 0;
}

// One pre-norm decoder layer of width w reading kv_in for K and V.
static void add_layer(sd_head *h, const char *pfx, int64_t w, int nh, int nkv, int hd, int nff, size_t *off) {
    static const char *nm[SD_MOA_PER_LAYER] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                               "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t qd = (int64_t)nh * hd, kd = (int64_t)nkv * hd;
    const int64_t shape[SD_MOA_PER_LAYER][2] = {{w, 1}, {w, qd}, {w, kd}, {w, kd}, {qd, w}, {w, 1}, {w, nff},
                                                {w, nff}, {nff, w}};
    char name[48];
    for (int i = 0; i < SD_MOA_PER_LAYER; i++) {
        snprintf(name, sizeof name, "%s.%s.weight", pfx, nm[i]);
        sd_head_add_tensor(h, name, shape[i][0], shape[i][1], i == SD_MOA_ATTN_NORM || i == SD_MOA_FFN_NORM, off);
    }
}

void sd_moa_build_table(sd_head *h, size_t *off) {
    const sd_head_hp *hp = &h->hp;
    const int64_t E = hp->n_embd, ekv = hp->moa_kv_width;
    add_layer(h, "sa", E, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, off);
    add_layer(h, "ca", E, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, off);
    sd_head_add_tensor(h, "lsa.proj.weight", ekv, E, 0, off);
    sd_head_add_tensor(h, "lsa.proj.bias", E, 1, 0, off);
    if (!hp->moa_no_lsa)
        add_layer(h, "lsa", ekv, hp->moa_lsa_n_head, hp->moa_lsa_n_head_kv, hp->moa_lsa_head_dim, hp->moa_lsa_n_ff,
                  off);
    if (hp->moa_ca_hidden) {
        SD_ASSERT(h->n_t == sd_moa_hidden_t(hp));
        sd_head_add_tensor(h, "ca.hidden.weight", E, E, 0, off);
    }
    if (hp->moa_sa_hidden) {
        SD_ASSERT(h->n_t == sd_moa_sa_hidden_t(hp));
        sd_head_add_tensor(h, "sa.hidden.weight", E, E, 0, off);
    }
}

int sd_moa_hidden_layer(const sd_head_hp *hp) {
    return hp->moa_tli > 0 ? hp->target_n_layer - hp->moa_tli - 1 : SD_HIDDEN_NORM;
}

float sd_moa_sa_scale(const sd_model *m) {
    const int E = m->hp.n_embd, n = SD_MIN(m->hp.n_vocab, 4096);
    float *row = malloc(sizeof(float) * (size_t)E);
    double sum = 0.0;
    int k = 0;
    for (int t = 0; row && t < n; t++) {
        if (sd_model_token_embd(m, t, row, NULL, 0) < 0) continue;
        double s = 0.0;
        for (int i = 0; i < E; i++) s += (double)row[i] * row[i];
        sum += sqrt(s / E);
        k++;
    }
    free(row);
    return k ? (float)(sum / k / sqrt((double)E)) : 0.0f;
}

void sd_moa_hidden_scale(const float *h, int n, float *out) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)h[i] * h[i];
    const float sc = s > 0 ? (float)(1.0 / sqrt(s / n + 1e-6)) : 0.0f;
    for (int i = 0; i < n; i++) out[i] = h[i] * sc;
}

int sd_moa_check_target(const sd_head *h, const sd_model *m, char *err, size_t errlen) {
    const sd_head_hp *hp = &h->hp;
    const int ekv = 2 * m->hp.n_head_kv * m->hp.head_dim;
    if (hp->moa_kv_width != ekv)
        return sd_err(err, errlen, "MoA drafter made for K,V rows of %d floats per layer; this model's are %d",
                      hp->moa_kv_width, ekv);
    if (hp->moa_tli > m->hp.n_layer)
        return sd_err(err, errlen, "MoA drafter runs the last %d target layers; this model has %d", hp->moa_tli,
                      m->hp.n_layer);
    return 0;
}

int sd_moa_dequant(const sd_model *m, const sd_tensor *t, const int32_t *rows, int n_rows, float *dst, char *err,
                   size_t errlen) {
    const sd_tensor *ft = sd_model_file_tensor(m, t);
    const sd_type_traits *tr = sd_type_get(ft->type);
    if (!tr || (ft->type != SD_TYPE_F32 && !tr->to_float))
        return sd_err(err, errlen, "moa: target tensor of type %d has no float conversion", ft->type);
    const int64_t ne0 = ft->ne[0], nr = rows ? n_rows : ft->ne[1];
    const size_t rb = sd_row_size(ft->type, ne0);
    for (int64_t r = 0; r < nr; r++) {
        const int64_t src_r = rows ? rows[r] : r;
        const uint8_t *src = (const uint8_t *)ft->data + (size_t)src_r * rb;
        if (ft->type == SD_TYPE_F32) memcpy(dst + r * ne0, src, rb);
        else tr->to_float(src, dst + r * ne0, ne0);
    }
    return 0;
}

void sd_moa_target_freq(const sd_model *m, double *freq) {
    const sd_hparams *hp = &m->hp;
    for (int i = 0; i < hp->n_rot / 2; i++) freq[i] = pow((double)hp->rope_base, -2.0 * i / hp->n_rot) / hp->rope_scale;
}

void sd_moa_rope(float *row, int n_heads, int hd, int n_rot, int neox, const double *freq, int pos) {
    const int half = n_rot / 2;
    for (int k = 0; k < half; k++) {
        const double th = (double)pos * freq[k];
        const float c = (float)cos(th), s = (float)sin(th);
        for (int h = 0; h < n_heads; h++) {
            float *v = row + (size_t)h * hd;
            const int i0 = neox ? k : 2 * k, i1 = neox ? k + half : 2 * k + 1;
            const float a = v[i0], b = v[i1];
            v[i0] = a * c - b * s;
            v[i1] = b * c + a * s;
        }
    }
}
