// draft_remote.c - a drafter driven by hand (include/specdec_spec.h): a
// program whose target runs elsewhere (specdec client: a server verifies)
// asks the drafter for a tree, has it verified, and tells the drafter what
// was accepted with the target's states of those positions: for EAGLE-3
// fused by the server (sd_head_fuse) or, offline, none (the head's own
// predictions); for MoA every layer's K,V rows (sd_session_kv_read), and
// for an MoA drafter reading the target's states, those states after them.
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/draft_eagle3.h"
#include "draft/draft_moa.h"
#include "draft/drafter.h"
#include "head/head.h"
#include "head/moa.h"
#include "kernels/quant.h"
#include "runtime/race.h"

int sd_tree_new(sd_tree **out, int cap, int n_vocab, char *err, size_t errlen) {
    *out = NULL;
    if (cap < 1 || cap > 4096 || n_vocab < 1)
        return sd_errc(SD_ERR_INPUT, err, errlen, "tree: %d nodes (1..4096) over %d tokens", cap, n_vocab);
    sd_tree *t = calloc(1, sizeof *t);
    if (!t || sd_tree_init(t, cap, n_vocab, cap) < 0) {
        if (t) sd_tree_free(t);
        free(t);
        return sd_errc(SD_ERR_OOM, err, errlen, "tree: out of memory");
    }
    sd_tree_reset(t, 0);
    *out = t;
    return 0;
}

void sd_tree_destroy(sd_tree *t) {
    if (!t) return;
    sd_tree_free(t);
    free(t);
}

void sd_tree_clear(sd_tree *t, int32_t root) { sd_tree_reset(t, root); }

float sd_tree_p(const sd_tree *t, int i) { return t && i >= 0 && i < t->n ? t->p[i] : 0.0f; }

int sd_drafter_remote(sd_drafter *d, char *err, size_t errlen) {
    if (sd_draft_eagle3_set_fused(d, 1) < 0 && sd_draft_moa_set_remote(d, 1) < 0)
        return sd_errc(SD_ERR_INPUT, err, errlen,
                       "drafter '%s': only an EAGLE-3 drafter without online adaptation or an MoA drafter "
                       "drafts remotely",
                       d ? sd_drafter_name(d) : "(none)");
    return 0;
}

// An MoA drafter made remote in mode (draft_moa.h), or SD_ERR_INPUT saying what takes it.
static int moa_remote(sd_drafter *d, int mode, const char *takes, char *err, size_t errlen) {
    if (sd_draft_moa_set_remote(d, mode) < 0)
        return sd_errc(SD_ERR_INPUT, err, errlen, "drafter '%s': only %s", d ? sd_drafter_name(d) : "(none)",
                       takes);
    return 0;
}

int sd_drafter_remote_lsa(sd_drafter *d, char *err, size_t errlen) {
    return moa_remote(d, 2, "an MoA drafter takes LSA's outputs", err, errlen);
}

int sd_drafter_remote_mean(sd_drafter *d, char *err, size_t errlen) {
    return moa_remote(d, 3, "an MoA drafter without LSA takes the layers' mean K,V rows", err, errlen);
}

struct sd_moa_lsa {
    sd_moa_run *r;
};

int sd_moa_lsa_new(sd_moa_lsa **out, const sd_head *h, const sd_model *m, char *err, size_t errlen) {
    *out = NULL;
    if (!h || h->hp.type != SD_HEAD_MOA)
        return sd_errc(SD_ERR_INPUT, err, errlen, "moa lsa: an MoA drafter is required");
    sd_moa_lsa *x = calloc(1, sizeof *x);
    if (!x) return sd_errc(SD_ERR_OOM, err, errlen, "moa lsa: out of memory");
    if (sd_moa_run_new(&x->r, h, m, 1, SD_MOA_ROWS, SD_TYPE_Q8_0, 1, NULL, err, errlen) < 0) {
        free(x);
        return SD_ERR_INPUT;
    }
    *out = x;
    return 0;
}

void sd_moa_lsa_free(sd_moa_lsa *x) {
    if (!x) return;
    sd_moa_run_free(x->r);
    free(x);
}

int sd_moa_lsa_run(sd_moa_lsa *x, const float *kv, int n, float *c, char *err, size_t errlen) {
    if (!x || !kv || !c || n < 1 || n > SD_MOA_ROWS)
        return sd_errc(SD_ERR_INPUT, err, errlen, "moa lsa: 1..%d rows", SD_MOA_ROWS);
    sd_moa_run_lsa(x->r, kv, n, c);
    return 0;
}

int sd_head_moa_tli(const sd_head *h) { return h && h->hp.type == SD_HEAD_MOA ? h->hp.moa_tli : -1; }

int sd_head_moa_no_lsa(const sd_head *h) { return h && h->hp.type == SD_HEAD_MOA ? h->hp.moa_no_lsa != 0 : -1; }

uint64_t sd_head_fingerprint(const sd_head *h) {
    uint64_t x = 0xcbf29ce484222325ull;   // FNV-1a over the shape, the parameters' bytes and the draft vocabulary
    const sd_head_hp *hp = &h->hp;
    const int64_t shape[] = {hp->type, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff,
                             hp->n_draft_vocab, hp->moa_tli, hp->moa_no_lsa | hp->moa_ca_hidden << 1 | hp->moa_sa_hidden << 2 |
                                 hp->moa_sa_full << 3,
                             hp->moa_kv_width};
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++)
        for (int k = 0; k < 8; k++) x = (x ^ (uint8_t)(shape[i] >> (8 * k))) * 0x100000001b3ull;
    const uint8_t *b = (const uint8_t *)h->w;
    for (size_t i = 0; i < h->n_w * sizeof(float); i++) x = (x ^ b[i]) * 0x100000001b3ull;
    b = (const uint8_t *)h->d2t;
    for (size_t i = 0; i < (size_t)h->hp.n_draft_vocab * sizeof(int32_t); i++) x = (x ^ b[i]) * 0x100000001b3ull;
    return x;
}

int sd_drafter_draft(sd_drafter *d, const int32_t *tokens, int n_tokens, int max_nodes, sd_tree *tree, char *err,
                     size_t errlen) {
    if (!d || !tokens || n_tokens < 1 || !tree || max_nodes < 1)
        return sd_errc(SD_ERR_INPUT, err, errlen, "drafter: draft needs a drafter, a text and a tree");
    sd_tree_reset(tree, tokens[n_tokens - 1]);
    const sd_draft_ctx ctx = {.tokens = tokens, .n_tokens = n_tokens, .max_nodes = SD_MIN(max_nodes, tree->cap),
                              .stochastic = 0, .rng = &d->rng};
    return d->vt->propose(d, &ctx, tree, err, errlen) < 0 ? -1 : 0;
}

int sd_drafter_draft_sampled(sd_drafter *d, const int32_t *tokens, int n_tokens, int max_nodes,
                             const sd_sampler_params *sp, int64_t pos_shift, sd_tree *tree, char *err, size_t errlen) {
    if (!sp || sp->temp <= 0.0f) return sd_drafter_draft(d, tokens, n_tokens, max_nodes, tree, err, errlen);
    if (!d || !tokens || n_tokens < 1 || !tree || max_nodes < 1)
        return sd_errc(SD_ERR_INPUT, err, errlen, "drafter: draft needs a drafter, a text and a tree");
    if (sp->draw != SD_DRAW_RACE)
        return sd_errc(SD_ERR_INPUT, err, errlen, "drafter: sampled drafts by hand follow the race draw only");
    sd_tree_reset(tree, tokens[n_tokens - 1]);
    // the noise of a fresh sampler's first text (sd_sampler_next_text), as the verifier's generation draws it
    const sd_tree_race rk = {.key = sd_race_key(sp->seed, 0), .pos0 = (int64_t)n_tokens + pos_shift};
    const sd_draft_ctx ctx = {.tokens = tokens, .n_tokens = n_tokens, .max_nodes = SD_MIN(max_nodes, tree->cap),
                              .stochastic = 1, .sp = sp, .rng = &d->rng, .race = &rk};
    return d->vt->propose(d, &ctx, tree, err, errlen) < 0 ? -1 : 0;
}

int sd_drafter_tell(sd_drafter *d, const sd_tree *tree, const int32_t *path, int n_path, int32_t bonus,
                    const float *states, char *err, size_t errlen) {
    if (!d || !tree || !path || n_path < 1 || n_path > tree->n || path[0] != 0)
        return sd_errc(SD_ERR_INPUT, err, errlen, "drafter: a path starts at the root (node 0) of the tree");
    for (int k = 1; k < n_path; k++)
        if (path[k] < 1 || path[k] >= tree->n || tree->parent[path[k]] != path[k - 1])
            return sd_errc(SD_ERR_INPUT, err, errlen, "drafter: path node %d is not a child of the one before", k);
    sd_step_record rec = {.tree = tree, .path = path, .n_path = n_path, .bonus = bonus, .draft_ms = -1,
                          .verify_ms = -1, .hidden = states};
    static const sd_aux_nodes none = {0};
    rec.aux = &none;
    return d->vt->accept(d, &rec, err, errlen) < 0 ? -1 : 0;
}

int sd_drafter_tell_prompt(sd_drafter *d, const int32_t *tokens, int pos0, int n, const float *states, char *err,
                           size_t errlen) {
    if (!d || !tokens || pos0 < 0 || n < 0 || (n > 0 && !states))
        return sd_errc(SD_ERR_INPUT, err, errlen, "drafter: prompt states need tokens and rows");
    if (!d->vt->prompt || n == 0) return 0;
    return d->vt->prompt(d, tokens, pos0, n, states, err, errlen) < 0 ? -1 : 0;
}

int sd_head_fuse(const sd_head *h, const float *rows, int n, float *out, char *err, size_t errlen) {
    if (!h || h->hp.type != SD_HEAD_EAGLE3)
        return sd_errc(SD_ERR_INPUT, err, errlen, "sd_head_fuse: an EAGLE-3 head is required");
    const int d = h->hp.n_embd;
    const float *fc = sd_head_w(h, SD_E3_FC);   // (d rows of 3d)
    for (int i = 0; i < n; i++) {
        const float *x = rows + (size_t)i * 3 * d;
        for (int o = 0; o < d; o++) {
            const float *w = fc + (size_t)o * 3 * d;
            float s = 0.0f;
            for (int j = 0; j < 3 * d; j++) s += w[j] * x[j];
            out[(size_t)i * d + o] = s;
        }
    }
    return 0;
}
