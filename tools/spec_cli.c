// spec_cli.c - method strings -> drafters (see spec_cli.h).
#include "spec_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/draft_ngram.h"

int spec_parse_ints(const char *flag, const char *s, char sep, int *out, int max, int lo, int hi, char *err,
                    size_t errlen) {
    const char *what = sep == ',' ? "comma-separated" : "dash-separated";
    int n = 0;
    const char *p = s;
    if (!*s) goto bad;
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9') goto bad;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p) goto bad;
        if (v < 1) goto bad;
        if (v < lo || v > hi) {
            snprintf(err, errlen, "%s: %ld is out of range [%d, %d] in '%s'", flag, v, lo, hi, s);
            return -1;
        }
        if (n == max) {
            snprintf(err, errlen, "%s: at most %d values, got '%s'", flag, max, s);
            return -1;
        }
        out[n++] = (int)v;
        p = end;
        if (!*p) break;
        if (*p != sep) goto bad;
        p++;
    }
    return n;
bad:
    snprintf(err, errlen, "%s: expected %s positive integers, got '%s'", flag, what, s);
    return -1;
}

int spec_widths_nodes(const int *w, int n) {
    long total = 1, level = 1;
    for (int i = 0; i < n; i++) {
        level *= w[i];
        if (level > (1 << 20)) level = 1 << 20;
        total += level;
        if (total > (1 << 20)) return 1 << 20;
    }
    return (int)total;
}

// ------------------------------------------------------------ the methods
// Parses the text after "NAME:" (args, "" when there was no colon).
typedef int (*method_parse_fn)(const char *args, spec_method *m, char *err, size_t errlen);
// Builds the drafter of a parsed method.
typedef int (*method_make_fn)(const spec_method *m, const spec_env *env, sd_drafter **out, char *err,
                              size_t errlen);

typedef struct method_def {
    const char *name;       // before the colon
    const char *syntax;     // for messages and help
    method_parse_fn parse;
    method_make_fn make;    // NULL: no drafter (ar)
} method_def;

static int parse_ar(const char *args, spec_method *m, char *err, size_t errlen) {
    if (*args) {
        snprintf(err, errlen, "method 'ar' takes no arguments, got 'ar:%s'", args);
        return -1;
    }
    m->kind = SPEC_AR;
    m->tree_nodes = 1;
    return 0;
}

static int parse_chain(const char *args, spec_method *m, char *err, size_t errlen) {
    int k;
    char e2[128];
    if (spec_parse_ints("chain", args, '-', &k, 1, 1, 64, e2, sizeof e2) != 1) {
        snprintf(err, errlen, "method chain:K needs K in 1..64, got 'chain:%s'", args);
        return -1;
    }
    m->kind = SPEC_MODEL;
    m->needs_draft_model = 1;
    m->dp = sd_draft_model_default_params();
    m->dp.shape = SD_DRAFT_CHAIN;
    m->dp.k = k;
    m->tree_nodes = k + 1;
    return 0;
}

static int parse_tree(const char *args, spec_method *m, char *err, size_t errlen) {
    int w[SD_DRAFT_MAX_WIDTHS];
    char e2[160];
    int n = spec_parse_ints("tree", args, '-', w, SD_DRAFT_MAX_WIDTHS, 1, 64, e2, sizeof e2);
    if (n < 1) {
        snprintf(err, errlen, "method tree:W1-W2-... needs 1..%d widths in 1..64, got 'tree:%s'",
                 SD_DRAFT_MAX_WIDTHS, args);
        return -1;
    }
    m->kind = SPEC_MODEL;
    m->needs_draft_model = 1;
    m->dp = sd_draft_model_default_params();
    m->dp.shape = SD_DRAFT_WIDTHS;
    m->dp.n_widths = n;
    memcpy(m->dp.widths, w, sizeof(int) * (size_t)n);
    m->tree_nodes = spec_widths_nodes(w, n);
    return 0;
}

static int parse_dyn(const char *args, spec_method *m, char *err, size_t errlen) {
    int v[3];
    char e2[160];
    int n = spec_parse_ints("dyn", args, '-', v, 3, 1, 1024, e2, sizeof e2);
    if (n != 3 || v[0] > 16 || v[1] > 16 || v[2] < 2) {
        snprintf(err, errlen, "method dyn:B-D-M needs B in 1..16, D in 1..16, M >= 2, got 'dyn:%s'", args);
        return -1;
    }
    m->kind = SPEC_MODEL;
    m->needs_draft_model = 1;
    m->dp = sd_draft_model_default_params();
    m->dp.shape = SD_DRAFT_DYNAMIC;
    m->dp.dyn_b = v[0];
    m->dp.dyn_d = v[1];
    m->dp.dyn_m = v[2];
    m->tree_nodes = v[2];
    return 0;
}

// One drafter per draft model, merged when there are several.
static int make_model(const spec_method *m, const spec_env *env, sd_drafter **out, char *err, size_t errlen) {
    sd_drafter *subs[SPEC_MAX_DRAFTS];
    sd_draft_model_params dp = m->dp;
    dp.p_min = env->p_min;
    dp.n_ctx = env->n_ctx;
    dp.n_threads = env->n_threads;
    char e2[512];
    for (int i = 0; i < env->n_drafts; i++) {
        if (sd_draft_model_new(&subs[i], env->drafts[i], env->target, &dp, e2, sizeof e2) < 0) {
            for (int j = 0; j < i; j++) sd_drafter_free(subs[j]);
            if (env->n_drafts > 1) snprintf(err, errlen, "draft model %d: %s", i + 1, e2);
            else snprintf(err, errlen, "%s", e2);
            return -1;
        }
    }
    if (env->n_drafts == 1) {
        *out = subs[0];
        return 0;
    }
    sd_model_info info;
    sd_model_get_info(env->target, &info);
    return sd_draft_merge_new(out, subs, env->n_drafts, info.n_vocab, err, errlen);
}

static int parse_ngram(const char *args, spec_method *m, char *err, size_t errlen) {
    int v[2];
    char e2[160];
    int n = spec_parse_ints("ngram", args, '-', v, 2, 1, 256, e2, sizeof e2);
    if (n != 2 || v[0] > SD_NGRAM_MAX_N) {
        snprintf(err, errlen, "method ngram:N-K needs N in 1..%d and K in 1..256, got 'ngram:%s'", SD_NGRAM_MAX_N,
                 args);
        return -1;
    }
    m->kind = SPEC_NGRAM;
    m->ngram_n = v[0];
    m->ngram_k = v[1];
    sd_draft_ngram_params np = sd_draft_ngram_default_params();
    m->tree_nodes = 1 + np.max_branches * v[1];
    return 0;
}

static int make_ngram(const spec_method *m, const spec_env *env, sd_drafter **out, char *err, size_t errlen) {
    sd_draft_ngram_params np = sd_draft_ngram_default_params();
    np.n_max = m->ngram_n;
    np.k_max = m->ngram_k;
    np.datastore = env->datastore;
    if (env->n_ctx > 0) np.n_ctx = env->n_ctx;
    return sd_draft_ngram_new(out, &np, sd_model_tokenizer(env->target), err, errlen);
}

// Add a method here: {name, syntax, parse, make}. Examples of what is to come:
//   {"lookahead", "lookahead:W-N-G", parse_lookahead, make_lookahead},
//   {"skip", "skip:...", parse_skip, make_skip},
//   {"auto", "auto", parse_auto, make_auto},
// A method whose drafter needs no draft model leaves needs_draft_model 0.
static const method_def g_methods[] = {
    {"ar", "ar", parse_ar, NULL},
    {"chain", "chain:K", parse_chain, make_model},
    {"tree", "tree:W1-W2-...", parse_tree, make_model},
    {"dyn", "dyn:B-D-M", parse_dyn, make_model},
    {"ngram", "ngram:N-K", parse_ngram, make_ngram},
};
#define N_METHODS ((int)(sizeof g_methods / sizeof g_methods[0]))

const char *spec_methods_syntax(void) {
    static char buf[512];
    if (!buf[0]) {
        size_t o = 0;
        for (int i = 0; i < N_METHODS && o < sizeof buf; i++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s", i ? ", " : "", g_methods[i].syntax);
    }
    return buf;
}

static const method_def *find_def(const char *name, size_t len) {
    for (int i = 0; i < N_METHODS; i++)
        if (strlen(g_methods[i].name) == len && !memcmp(g_methods[i].name, name, len)) return &g_methods[i];
    return NULL;
}

int spec_method_parse(const char *s, spec_method *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    size_t len = strlen(s);
    if (len == 0 || len >= SPEC_NAME_MAX) {
        snprintf(err, errlen, "bad method '%s' (methods: %s)", s, spec_methods_syntax());
        return -1;
    }
    memcpy(m->name, s, len + 1);
    const char *colon = strchr(s, ':');
    size_t nlen = colon ? (size_t)(colon - s) : len;
    const method_def *d = find_def(s, nlen);
    if (!d) {
        snprintf(err, errlen, "unknown method '%s' (methods: %s)", s, spec_methods_syntax());
        return -1;
    }
    if (d->make && !colon) {
        snprintf(err, errlen, "method '%s' needs arguments: %s", s, d->syntax);
        return -1;
    }
    return d->parse(colon ? colon + 1 : "", m, err, errlen);
}

int spec_methods_parse(const char *list, spec_method *ms, int max, char *err, size_t errlen) {
    int n = 0, have_ar = 0;
    const char *p = list;
    if (!*list) {
        snprintf(err, errlen, "--methods: empty list (methods: %s)", spec_methods_syntax());
        return -1;
    }
    while (*p) {
        size_t L = strcspn(p, ",");
        char item[SPEC_NAME_MAX];
        if (L == 0 || L >= sizeof item) {
            snprintf(err, errlen, "--methods: bad list '%s' (comma-separated methods: %s)", list,
                     spec_methods_syntax());
            return -1;
        }
        memcpy(item, p, L);
        item[L] = 0;
        if (n == max - 1) {   // room for ar
            snprintf(err, errlen, "--methods: at most %d methods", max - 1);
            return -1;
        }
        char e2[256];
        if (spec_method_parse(item, &ms[n], e2, sizeof e2) < 0) {
            snprintf(err, errlen, "--methods: %s", e2);
            return -1;
        }
        for (int j = 0; j < n; j++)
            if (!strcmp(ms[j].name, item)) {
                snprintf(err, errlen, "--methods: '%s' is listed twice", item);
                return -1;
            }
        if (ms[n].kind == SPEC_AR) {
            have_ar = 1;
            if (n > 0) {   // ar goes first
                spec_method t = ms[n];
                memmove(&ms[1], &ms[0], sizeof *ms * (size_t)n);
                ms[0] = t;
            }
        }
        n++;
        p += L;
        if (*p == ',') {
            p++;
            if (!*p) {
                snprintf(err, errlen, "--methods: trailing comma in '%s'", list);
                return -1;
            }
        }
    }
    if (!have_ar) {
        memmove(&ms[1], &ms[0], sizeof *ms * (size_t)n);
        spec_method_parse("ar", &ms[0], err, errlen);
        n++;
    }
    return n;
}

int spec_method_make(const spec_method *m, const spec_env *env, sd_drafter **out, char *err, size_t errlen) {
    *out = NULL;
    const char *colon = strchr(m->name, ':');
    const method_def *d = find_def(m->name, colon ? (size_t)(colon - m->name) : strlen(m->name));
    if (!d) {
        snprintf(err, errlen, "unknown method '%s'", m->name);
        return -1;
    }
    if (!d->make) return 0;
    if (m->needs_draft_model && env->n_drafts < 1) {
        snprintf(err, errlen, "method '%s' needs a draft model (--draft D.gguf)", m->name);
        return -1;
    }
    return d->make(m, env, out, err, errlen);
}

int spec_method_default_nodes(const spec_method *m, int n_drafts) {
    long n = m->tree_nodes;
    if (m->kind == SPEC_MODEL && n_drafts > 1) n = 1 + (long)(n - 1) * n_drafts;
    return n > (1 << 20) ? 1 << 20 : (int)n;
}
