// drafter.c - what every drafter shares: allocation and the public handle
// functions of include/specdec_spec.h.
#include "draft/drafter.h"

#include <stdlib.h>
#include <string.h>

sd_drafter *sd_drafter_alloc(const sd_drafter_vt *vt, void *impl) {
    sd_drafter *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->vt = vt;
    d->impl = impl;
    sd_rng_seed(&d->rng, 0x5EED);
    return d;
}

void sd_drafter_free(sd_drafter *d) {
    if (d && d->vt && d->vt->free) d->vt->free(d);
}

void sd_drafter_reset(sd_drafter *d) {
    if (d) d->vt->reset(d);
}

sd_step_record sd_step_own_view(const sd_step_record *rec) {
    sd_step_record v = *rec;
    if (rec->own_tree) {
        v.tree = rec->own_tree;
        v.path = rec->own_path;
        v.n_path = rec->own_n_path;
        v.own_tree = NULL;
        v.verify_ms = -1.0;   // the forward verified the whole merged tree: no measure of its own tree's cost
    }
    return v;
}

const char *sd_drafter_name(const sd_drafter *d) { return d ? d->vt->name : "none"; }

const char *sd_drafter_note(const sd_drafter *d) {
    return d && d->vt->note ? d->vt->note(d) : "";
}

int sd_drafter_vocab_coverage(const sd_drafter *d, int64_t *n_checked, int64_t *n_in) {
    *n_checked = *n_in = 0;
    return d && d->vt->vocab_coverage ? d->vt->vocab_coverage(d, n_checked, n_in) : 0;
}

int sd_drafter_online_stats(const sd_drafter *d, sd_head_online_stats *st) {
    memset(st, 0, sizeof *st);
    return d && d->vt->online_stats ? d->vt->online_stats(d, st) : 0;
}

int sd_drafter_online_wait(sd_drafter *d, char *err, size_t errlen) {
    return d && d->vt->online_wait ? d->vt->online_wait(d, err, errlen) : 0;
}

int sd_drafter_save_head(sd_drafter *d, const char *path, char *err, size_t errlen) {
    if (!d || !d->vt->save_head)
        return sd_err(err, errlen, "drafter '%s' has no head to save (an eagle3 method has)", sd_drafter_name(d));
    return d->vt->save_head(d, path, err, errlen);
}

static const float *no_logits(void *lstate, int i) {
    (void)lstate;
    (void)i;
    return NULL;
}

int sd_drafter_accept_path(sd_drafter *d, const sd_tree *tree, const int32_t *path, int n_path, int32_t bonus,
                           char *err, size_t errlen) {
    sd_aux_nodes none = {0, 0, NULL, NULL, NULL};
    sd_step_record rec = {.tree = tree, .path = path, .n_path = n_path, .bonus = bonus, .aux = &none,
                          .draft_ms = -1.0, .verify_ms = -1.0, .logits = no_logits};
    return d->vt->accept(d, &rec, err, errlen);
}

int sd_drafter_hidden_layers(const sd_drafter *d, int32_t *out) {
    if (!d || d->n_hidden_layers <= 0) return 0;
    memcpy(out, d->hidden_layers, sizeof(int32_t) * (size_t)d->n_hidden_layers);
    return d->n_hidden_layers;
}


int sd_draft_sampler_sync(sd_sampler **smp, sd_sampler_params *have, const sd_sampler_params *want, int n_vocab,
                          char *err, size_t errlen) {
    if (*smp && memcmp(have, want, sizeof *have) == 0) return 0;
    sd_sampler_free(*smp);
    *smp = NULL;
    if (sd_sampler_new(smp, want, n_vocab, err, errlen) < 0) return -1;
    *have = *want;
    return 0;
}
