// ckpt.c - checkpoints of head training (ckpt.h).
#include "train/ckpt.h"

#include <errno.h>
#include <unistd.h>

#include "common.h"
#include "model/model.h"

// The fixed part of the file.
typedef struct ck_hdr {
    char magic[8];            // "SDHCKPT\0"
    uint32_t version;
    // the head's hyper-parameters (sd_head_hp, field by field)
    int32_t type, n_embd, n_head, n_head_kv, head_dim, n_ff, n_medusa, n_draft_vocab;
    float rms_eps, rope_base;
    int32_t extract[3], norm_before_residual;
    int32_t target_n_vocab, target_n_embd, target_n_layer;
    uint64_t target_vocab_hash;
    uint64_t n_w;
    int64_t adam_t;
    sd_ckpt_recipe recipe;
    sd_ckpt_state state;
} ck_hdr;

#define CK_P 0x100000001b3ull
// FNV-1a over 8-byte words (tail bytewise), continuing h: the checksum of
// ~100 MB of moments in a few tens of milliseconds.
static uint64_t hash_words(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * CK_P;
    }
    for (; i < n; i++) h = (h ^ b[i]) * CK_P;
    return h;
}

// Writes n bytes and continues the checksum. 0 or -1 (errno set).
static int put(FILE *f, const void *p, size_t n, uint64_t *h) {
    *h = hash_words(*h, p, n);
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int get(FILE *f, void *p, size_t n, uint64_t *h) {
    if (n && fread(p, 1, n, f) != n) return -1;
    *h = hash_words(*h, p, n);
    return 0;
}

int sd_ckpt_save(const char *path, const sd_head *h, const sd_adamw *o, const sd_ckpt_recipe *r,
                 const sd_ckpt_state *s, char *err, size_t errlen) {
    ck_hdr k;
    memset(&k, 0, sizeof k);   // padding bytes too: the checksum reads them
    memcpy(k.magic, "SDHCKPT", 8);
    k.version = SD_CKPT_VERSION;
    const sd_head_hp *hp = &h->hp;
    k.type = hp->type;
    k.n_embd = hp->n_embd;
    k.n_head = hp->n_head;
    k.n_head_kv = hp->n_head_kv;
    k.head_dim = hp->head_dim;
    k.n_ff = hp->n_ff;
    k.n_medusa = hp->n_medusa;
    k.n_draft_vocab = hp->n_draft_vocab;
    k.rms_eps = hp->rms_eps;
    k.rope_base = hp->rope_base;
    for (int i = 0; i < 3; i++) k.extract[i] = hp->extract[i];
    k.norm_before_residual = hp->norm_before_residual;
    k.target_n_vocab = hp->target_n_vocab;
    k.target_n_embd = hp->target_n_embd;
    k.target_n_layer = hp->target_n_layer;
    k.target_vocab_hash = hp->target_vocab_hash;
    if (hp->type == SD_HEAD_MOA) {   // (fields an MoA head does not use carry its own; docs/moa.md)
        k.extract[0] = hp->moa_tli, k.extract[1] = hp->moa_no_lsa | hp->moa_ca_hidden << 1 | hp->moa_sa_hidden << 2 |
                        hp->moa_sa_full << 3;
        k.extract[2] = hp->moa_lsa_n_head;
        k.norm_before_residual = hp->moa_lsa_n_head_kv;
        k.n_medusa = hp->moa_lsa_n_ff;
    }
    k.n_w = h->n_w;
    k.adam_t = o->t;
    k.recipe = *r;
    k.state = *s;
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return sd_err(err, errlen, "checkpoint: path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return sd_err(err, errlen, "cannot write the checkpoint %s: %s", tmp, strerror(errno));
    uint64_t hs = 1469598103934665603ull;
    const size_t nw = h->n_w * sizeof(float);
    int bad = put(f, &k, sizeof k, &hs) || put(f, h->d2t, sizeof(int32_t) * (size_t)hp->n_draft_vocab, &hs) ||
              put(f, h->w, nw, &hs) || put(f, o->m, nw, &hs) || put(f, o->v, nw, &hs);
    uint64_t sum = hs;
    bad = bad || fwrite(&sum, sizeof sum, 1, f) != 1 || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        remove(tmp);
        return sd_err(err, errlen, "writing the checkpoint %s failed: %s (the previous checkpoint, if any, is kept)",
                      path, strerror(e ? e : EIO));
    }
    return 0;
}

int sd_ckpt_load(const char *path, const sd_model *m, sd_head **hout, sd_adamw *o, sd_ckpt_recipe *r,
                 sd_ckpt_state *s, char *err, size_t errlen) {
    *hout = NULL;
    memset(o, 0, sizeof *o);
    FILE *f = fopen(path, "rb");
    if (!f) return sd_err(err, errlen, "cannot read the checkpoint %s: %s", path, strerror(errno));
    ck_hdr k;
    uint64_t hs = 1469598103934665603ull;
    sd_head *h = NULL;
    if (get(f, &k, sizeof k, &hs) < 0 || memcmp(k.magic, "SDHCKPT", 8)) {
        fclose(f);
        return sd_err(err, errlen, "%s is not a specdec training checkpoint", path);
    }
    if (k.version != SD_CKPT_VERSION) {
        fclose(f);
        return sd_err(err, errlen, "%s: checkpoint version %u, this build reads version %d", path, k.version,
                      SD_CKPT_VERSION);
    }
    sd_head_hp hp;
    memset(&hp, 0, sizeof hp);
    hp.type = k.type;
    hp.n_embd = k.n_embd;
    hp.n_head = k.n_head;
    hp.n_head_kv = k.n_head_kv;
    hp.head_dim = k.head_dim;
    hp.n_ff = k.n_ff;
    hp.n_medusa = k.n_medusa;
    hp.n_draft_vocab = k.n_draft_vocab;
    hp.rms_eps = k.rms_eps;
    hp.rope_base = k.rope_base;
    for (int i = 0; i < 3; i++) hp.extract[i] = k.extract[i];
    hp.norm_before_residual = k.norm_before_residual;
    hp.target_n_vocab = k.target_n_vocab;
    hp.target_n_embd = k.target_n_embd;
    hp.target_n_layer = k.target_n_layer;
    hp.target_vocab_hash = k.target_vocab_hash;
    if (hp.type == SD_HEAD_MOA) {   // the MoA fields, where sd_ckpt_save put them
        hp.moa_tli = k.extract[0], hp.moa_no_lsa = k.extract[1] & 1, hp.moa_ca_hidden = k.extract[1] >> 1 & 1;
        hp.moa_sa_hidden = k.extract[1] >> 2 & 1;
        hp.moa_sa_full = k.extract[1] >> 3 & 1;
        if (k.extract[1] & ~15) hp.moa_no_lsa = k.extract[1];   // (refused below as an unknown value)
        hp.moa_lsa_n_head = k.extract[2];
        hp.moa_lsa_n_head_kv = k.norm_before_residual;
        hp.moa_lsa_n_ff = k.n_medusa;
        hp.moa_kv_width = 2 * m->hp.n_head_kv * m->hp.head_dim;
        hp.moa_lsa_head_dim = hp.moa_lsa_n_head > 0 ? hp.moa_kv_width / hp.moa_lsa_n_head : 0;
        memset(hp.extract, 0, sizeof hp.extract);
        hp.norm_before_residual = hp.n_medusa = 0;
    }
    char e2[512];
    if (sd_head_new(&h, &hp, e2, sizeof e2) < 0) {
        fclose(f);
        return sd_err(err, errlen, "%s: %s", path, e2);
    }
    if (sd_head_check_target(h, m, e2, sizeof e2) < 0) {
        fclose(f);
        sd_head_free(h);
        return sd_err(err, errlen, "the checkpoint %s belongs to another target: %s", path, e2);
    }
    if (h->n_w != k.n_w) {
        fclose(f);
        sd_head_free(h);
        return sd_err(err, errlen, "%s: %llu parameters stored, the head has %zu", path, (unsigned long long)k.n_w,
                      h->n_w);
    }
    if (sd_adamw_init(o, h->n_w, e2, sizeof e2) < 0) {
        fclose(f);
        sd_head_free(h);
        return sd_err(err, errlen, "%s", e2);
    }
    const size_t nw = h->n_w * sizeof(float);
    int32_t *d2t = malloc(sizeof(int32_t) * (size_t)hp.n_draft_vocab);
    uint64_t sum = 0;
    int bad = !d2t || get(f, d2t, sizeof(int32_t) * (size_t)hp.n_draft_vocab, &hs) || get(f, h->w, nw, &hs) ||
              get(f, o->m, nw, &hs) || get(f, o->v, nw, &hs) || fread(&sum, sizeof sum, 1, f) != 1;
    int extra = !bad && fgetc(f) != EOF;
    fclose(f);
    if (bad || extra || sum != hs) {
        free(d2t);
        sd_head_free(h);
        sd_adamw_free(o);
        return sd_err(err, errlen, "the checkpoint %s is %s", path,
                      bad ? "truncated" : extra ? "longer than its contents (corrupted)" : "corrupted (checksum mismatch)");
    }
    int rv = sd_head_set_vocab(h, d2t, hp.n_draft_vocab, e2, sizeof e2);
    free(d2t);
    if (rv < 0) {
        sd_head_free(h);
        sd_adamw_free(o);
        return sd_err(err, errlen, "%s: %s", path, e2);
    }
    o->t = k.adam_t;
    *r = k.recipe;
    *s = k.state;
    *hout = h;
    return 0;
}
