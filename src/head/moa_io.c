// moa_io.c - the `moa` keys of an MoA drafter's GGUF file (docs/moa.md). The
// common keys (embedding length, epsilon, specdec.target.*, the note, d2t)
// and the tensors go through head_io.c like every head's.
#include <math.h>
#include <stdio.h>

#include "common.h"
#include "head/moa.h"

void sd_moa_write_hp(sd_gguf_writer *w, const sd_head_hp *hp) {
    sd_gguf_w_u32(w, "moa.feed_forward_length", (uint32_t)hp->n_ff);
    sd_gguf_w_u32(w, "moa.attention.head_count", (uint32_t)hp->n_head);
    sd_gguf_w_u32(w, "moa.attention.head_count_kv", (uint32_t)hp->n_head_kv);
    sd_gguf_w_u32(w, "moa.attention.key_length", (uint32_t)hp->head_dim);
    sd_gguf_w_f32(w, "moa.rope.freq_base", hp->rope_base);
    sd_gguf_w_u32(w, "moa.kv_width", (uint32_t)hp->moa_kv_width);
    sd_gguf_w_u32(w, "moa.tli", (uint32_t)hp->moa_tli);
    sd_gguf_w_bool(w, "moa.no_lsa", hp->moa_no_lsa);
    if (hp->moa_ca_hidden) sd_gguf_w_bool(w, "moa.ca_hidden", 1);   // (absent: 0, files before it)
    if (hp->moa_sa_hidden) sd_gguf_w_bool(w, "moa.sa_hidden", 1);
    if (hp->moa_sa_full) sd_gguf_w_bool(w, "moa.sa_full", 1);
    if (!hp->moa_no_lsa) {
        sd_gguf_w_u32(w, "moa.lsa.head_count", (uint32_t)hp->moa_lsa_n_head);
        sd_gguf_w_u32(w, "moa.lsa.head_count_kv", (uint32_t)hp->moa_lsa_n_head_kv);
        sd_gguf_w_u32(w, "moa.lsa.key_length", (uint32_t)hp->moa_lsa_head_dim);
        sd_gguf_w_u32(w, "moa.lsa.feed_forward_length", (uint32_t)hp->moa_lsa_n_ff);
    }
}

// A required integer key in [lo, hi].
static int req_int(const sd_gguf *g, const char *key, int64_t lo, int64_t hi, int *out, char *err, size_t errlen) {
    int64_t v = 0;
    char e2[200];
    int rc = sd_gguf_get_i64(g, key, &v, e2, sizeof e2);
    if (rc < 0) return sd_err(err, errlen, "head file: %s", e2);
    if (rc == 1) return sd_err(err, errlen, "head file: key '%s' is missing", key);
    if (v < lo || v > hi)
        return sd_err(err, errlen, "head file: %s = %lld is out of range (%lld..%lld)", key, (long long)v,
                      (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

int sd_moa_read_hp(const sd_gguf *g, sd_head_hp *hp, char *err, size_t errlen) {
    if (req_int(g, "moa.feed_forward_length", 1, 1 << 20, &hp->n_ff, err, errlen) < 0 ||
        req_int(g, "moa.attention.head_count", 1, 1024, &hp->n_head, err, errlen) < 0 ||
        req_int(g, "moa.attention.head_count_kv", 1, 1024, &hp->n_head_kv, err, errlen) < 0 ||
        req_int(g, "moa.attention.key_length", 2, 65536, &hp->head_dim, err, errlen) < 0 ||
        req_int(g, "moa.kv_width", 2, 65536, &hp->moa_kv_width, err, errlen) < 0 ||
        req_int(g, "moa.tli", 0, 4096, &hp->moa_tli, err, errlen) < 0)
        return -1;
    if (hp->n_head % hp->n_head_kv)
        return sd_err(err, errlen, "head file: moa.attention.head_count_kv = %d does not divide "
                      "moa.attention.head_count = %d", hp->n_head_kv, hp->n_head);
    if (hp->head_dim % 2)
        return sd_err(err, errlen, "head file: moa.attention.key_length = %d must be even (RoPE pairs)", hp->head_dim);
    char e2[200];
    hp->rope_base = 10000.0f;
    if (sd_gguf_get_f32(g, "moa.rope.freq_base", &hp->rope_base, e2, sizeof e2) < 0)
        return sd_err(err, errlen, "head file: %s", e2);
    if (!isfinite(hp->rope_base) || !(hp->rope_base > 1.0f && hp->rope_base < 1e12f))
        return sd_err(err, errlen, "head file: moa.rope.freq_base = %g, expected a finite number in (1, 1e12)",
                      (double)hp->rope_base);
    const sd_gguf_kv *kv = sd_gguf_find_key(g, "moa.no_lsa");
    if (!kv) return sd_err(err, errlen, "head file: key 'moa.no_lsa' is missing");
    if (kv->type != SD_GGUF_BOOL || *(const uint8_t *)kv->data > 1)
        return sd_err(err, errlen, "head file: moa.no_lsa must be a boolean 0 or 1");
    hp->moa_no_lsa = *(const uint8_t *)kv->data;
    const char *opt[3] = {"moa.ca_hidden", "moa.sa_hidden", "moa.sa_full"};   // optional: absent in older files
    int *val[3] = {&hp->moa_ca_hidden, &hp->moa_sa_hidden, &hp->moa_sa_full};
    for (int i = 0; i < 3; i++) {
        kv = sd_gguf_find_key(g, opt[i]);
        if (kv && (kv->type != SD_GGUF_BOOL || *(const uint8_t *)kv->data > 1))
            return sd_err(err, errlen, "head file: %s must be a boolean 0 or 1", opt[i]);
        *val[i] = kv ? *(const uint8_t *)kv->data : 0;
    }
    if (!hp->moa_no_lsa) {
        if (req_int(g, "moa.lsa.head_count", 1, 1024, &hp->moa_lsa_n_head, err, errlen) < 0 ||
            req_int(g, "moa.lsa.head_count_kv", 1, 1024, &hp->moa_lsa_n_head_kv, err, errlen) < 0 ||
            req_int(g, "moa.lsa.key_length", 2, 65536, &hp->moa_lsa_head_dim, err, errlen) < 0 ||
            req_int(g, "moa.lsa.feed_forward_length", 1, 1 << 20, &hp->moa_lsa_n_ff, err, errlen) < 0)
            return -1;
        if (hp->moa_lsa_n_head % hp->moa_lsa_n_head_kv || hp->moa_lsa_head_dim % 2 ||
            hp->moa_lsa_n_head * hp->moa_lsa_head_dim != hp->moa_kv_width)
            return sd_err(err, errlen,
                          "head file: LSA shape moa.lsa.head_count = %d x moa.lsa.key_length = %d (kv heads %d) does "
                          "not fit moa.kv_width = %d",
                          hp->moa_lsa_n_head, hp->moa_lsa_head_dim, hp->moa_lsa_n_head_kv, hp->moa_kv_width);
    }
    return 0;
}
