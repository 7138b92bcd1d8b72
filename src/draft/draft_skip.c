// draft_skip.c - self-speculative drafting by layer skipping: the drafter,
// skip-set parsing / formatting and skip files. The skip-set search is in
// skip_search.c.
//
// KV relation between the draft and the target. The skip drafter is a
// draft-model drafter (draft_model.c) whose draft model is the target sd_model
// itself (weights shared through the one mapping, no copy) and whose session
// has the layer-skip mask set. That session has its OWN KV cache, computed by
// the skip model and kept in step with the accepted text exactly as for a
// separate draft model. The alternative - letting the draft read the target's
// committed KV rows of the layers it keeps - needs no extra memory and no
// second evaluation of the prompt, but:
//   - the draft would then be a different "model" (its queries would meet
//     keys/values computed from the full model's residual stream), so what we
//     search, test and measure would not be a well-defined model: here
//     "skipping layers gives the logits of the model without those layers"
//     holds exactly and the search's teacher-forced simulation is exact;
//   - the drafter interface (drafter.h) deliberately does not see the target
//     session, and the target's pending rows / commit protocol belong to the
//     verifier: draft rows written into the target's cache would be
//     overwritten by the verification forward and would need a second,
//     drafter-owned pending area anyway.
// The cost of the separate cache: the prompt is evaluated a second time by the
// skip model (cheaper than a target forward), and memory. The session
// allocates slots for every layer, 2 x n_ctx x kv_dim x 4 bytes x n_layer (the
// skipped layers' slots are never touched, so they are never paged in by the
// OS: resident memory is that of the kept layers only). Use
// sd_draft_model_params.n_ctx to bound it.
#include "draft/draft_skip.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/model.h"

sd_draft_model_params sd_draft_skip_default_params(void) {
    sd_draft_model_params p = sd_draft_model_default_params();
    p.shape = SD_DRAFT_CHAIN;
    p.k = 8;
    p.p_min = 0.4f;
    p.adapt = 1;
    return p;
}

int sd_draft_skip_new(sd_drafter **out, const sd_model *target, const uint8_t *skip,
                      const sd_draft_model_params *p, char *err, size_t errlen) {
    *out = NULL;
    if (!target) return sd_err(err, errlen, "skip drafter: no target model");
    if (!skip) return sd_err(err, errlen, "skip drafter: no skip set");
    const int nl = target->hp.n_layer;
    int n = 0;
    for (int l = 0; l < nl; l++) n += skip[l] != 0;
    if (n == nl) return sd_err(err, errlen, "skip drafter: all %d layers would be skipped", nl);
    sd_draft_model_params dp = p ? *p : sd_draft_skip_default_params();
    dp.layer_skip = skip;
    return sd_draft_model_new(out, target, target, &dp, err, errlen);
}

// ------------------------------------------------------------ lists

int sd_skip_parse(const char *spec, int n_layer, uint8_t *skip, char *err, size_t errlen) {
    if (n_layer < 1) return sd_err(err, errlen, "skip list: model has %d layers", n_layer);
    memset(skip, 0, (size_t)n_layer);
    if (!spec) return 0;
    const char *s = spec;
    while (isspace((unsigned char)*s)) s++;
    if (!*s || !strncmp(s, "none", 4)) {
        const char *e = *s ? s + 4 : s;
        while (isspace((unsigned char)*e)) e++;
        if (!*e) return 0;
    }
    int n = 0;
    while (*s) {
        while (isspace((unsigned char)*s)) s++;
        if (!isdigit((unsigned char)*s))
            return sd_err(err, errlen, "skip list '%s': expected a layer number at '%.16s'", spec, s);
        char *e;
        errno = 0;
        long a = strtol(s, &e, 10), b = a;
        s = e;
        while (isspace((unsigned char)*s)) s++;
        if (*s == '-') {
            s++;
            while (isspace((unsigned char)*s)) s++;
            if (!isdigit((unsigned char)*s))
                return sd_err(err, errlen, "skip list '%s': range without an end at '%.16s'", spec, s);
            b = strtol(s, &e, 10);
            s = e;
        }
        if (errno || a < 0 || b < a || b >= n_layer) {
            if (b != a)
                return sd_err(err, errlen, "skip list '%s': layer range %ld-%ld invalid (layers 0..%d)", spec, a, b,
                              n_layer - 1);
            return sd_err(err, errlen, "skip list '%s': layer %ld out of range 0..%d", spec, a, n_layer - 1);
        }
        for (long l = a; l <= b; l++) {
            n += !skip[l];
            skip[l] = 1;
        }
        while (isspace((unsigned char)*s)) s++;
        if (*s == ',') {
            s++;
            while (isspace((unsigned char)*s)) s++;
            if (!*s) return sd_err(err, errlen, "skip list '%s': trailing comma", spec);
        } else if (*s) {
            return sd_err(err, errlen, "skip list '%s': unexpected '%c'", spec, *s);
        }
    }
    if (n == n_layer) return sd_err(err, errlen, "skip list '%s': all %d layers would be skipped", spec, n_layer);
    return n;
}

int sd_skip_format(const uint8_t *skip, int n_layer, char *buf, size_t size) {
    size_t len = 0;
    char tmp[16];
    int any = 0;
    if (size) buf[0] = 0;
    for (int l = 0; l < n_layer; l++) {
        if (!skip[l]) continue;
        int k = snprintf(tmp, sizeof tmp, "%s%d", any ? "," : "", l);
        any = 1;
        if (len + (size_t)k < size) memcpy(buf + len, tmp, (size_t)k + 1);
        else if (size) buf[len < size ? len : size - 1] = 0;
        len += (size_t)k;
    }
    if (!any) {
        if (size) snprintf(buf, size, "none");
        return 4;
    }
    return (int)len;
}

// ------------------------------------------------------------ files

int sd_skip_save(const char *path, const sd_model *m, const uint8_t *skip, char *err, size_t errlen) {
    const int nl = m->hp.n_layer;
    int n = 0;
    for (int l = 0; l < nl; l++) n += skip[l] != 0;
    char *list = malloc((size_t)nl * 12 + 8);
    if (!list) return sd_err(err, errlen, "out of memory");
    sd_skip_format(skip, nl, list, (size_t)nl * 12 + 8);
    FILE *f = fopen(path, "w");
    if (!f) {
        free(list);
        return sd_err(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    }
    // The name goes on one line: newlines in it are replaced.
    char name[sizeof m->name];
    snprintf(name, sizeof name, "%s", m->name);
    for (char *c = name; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    fprintf(f, "specdec-skip 1\nmodel %s\nn_layer %d\nskip %s\n", name, nl, list);
    free(list);
    if (ferror(f) | (fclose(f) != 0)) return sd_err(err, errlen, "%s: write error", path);
    return n;
}

// Strips trailing spaces / newline in place.
static void rstrip(char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
}

int sd_skip_load(const char *path, const sd_model *m, uint8_t *skip, char *err, size_t errlen) {
    const int nl = m->hp.n_layer;
    FILE *f = fopen(path, "r");
    if (!f) return sd_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    char line[4096], perr[256];
    int lineno = 0, have_magic = 0, file_nl = -1, n = -1, rc = 0;
    char fname[256] = "";
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = sd_err(err, errlen, "%s:%d: line too long", path, lineno);
            break;
        }
        rstrip(line);
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        if (!*s || *s == '#') continue;
        if (!have_magic) {
            if (strcmp(s, "specdec-skip 1") != 0) {
                rc = sd_err(err, errlen, "%s:%d: not a specdec skip file (expected 'specdec-skip 1', got '%.40s')",
                            path, lineno, s);
                break;
            }
            have_magic = 1;
        } else if (!strncmp(s, "model", 5) && (s[5] == 0 || s[5] == ' ')) {
            snprintf(fname, sizeof fname, "%s", s[5] ? s + 6 : "");
        } else if (!strncmp(s, "n_layer ", 8)) {
            char *e;
            long v = strtol(s + 8, &e, 10);
            if (*e || v < 1 || v > 100000) {
                rc = sd_err(err, errlen, "%s:%d: bad n_layer '%s'", path, lineno, s + 8);
                break;
            }
            file_nl = (int)v;
        } else if (!strncmp(s, "skip", 4) && (s[4] == 0 || s[4] == ' ')) {
            if (file_nl < 0) {
                rc = sd_err(err, errlen, "%s:%d: 'skip' before 'n_layer'", path, lineno);
                break;
            }
            if (file_nl != nl) {
                rc = sd_err(err, errlen, "%s: skip set is for a model with %d layers, this model has %d", path,
                            file_nl, nl);
                break;
            }
            n = sd_skip_parse(s[4] ? s + 5 : "", nl, skip, perr, sizeof perr);
            if (n < 0) {
                rc = sd_err(err, errlen, "%s:%d: %s", path, lineno, perr);
                break;
            }
        } else {
            rc = sd_err(err, errlen, "%s:%d: unknown line '%.40s'", path, lineno, s);
            break;
        }
    }
    fclose(f);
    if (rc < 0) return rc;
    if (!have_magic) return sd_err(err, errlen, "%s: empty file (expected 'specdec-skip 1')", path);
    if (n < 0) return sd_err(err, errlen, "%s: no 'skip' line", path);
    if (fname[0] && m->name[0] && strcmp(fname, m->name) != 0)
        return sd_err(err, errlen, "%s: skip set is for model '%s', this model is '%s'", path, fname, m->name);
    return n;
}
