// spec_cli.c - method strings -> drafters (see spec_cli.h).
#include "spec_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/draft_lookahead.h"
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
    if (!strcmp(args, "auto")) {   // hardware-aware tree (tree_auto.h)
        m->kind = SPEC_MODEL;
        m->needs_draft_model = 1;
        m->dp = sd_draft_model_default_params();
        m->dp.shape = SD_DRAFT_AUTO;
        m->dp.tree_auto.max_nodes = SPEC_AUTO_NODES;
        m->tree_nodes = SPEC_AUTO_NODES;
        return 0;
    }
    int n = spec_parse_ints("tree", args, '-', w, SD_DRAFT_MAX_WIDTHS, 1, 64, e2, sizeof e2);
    if (n < 1) {
        snprintf(err, errlen, "method tree:W1-W2-... needs 1..%d widths in 1..64 (or tree:auto), got 'tree:%s'",
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
    if (dp.shape == SD_DRAFT_AUTO) {
        if (!env->cost) {
            snprintf(err, errlen, "method '%s': the automatic tree needs the target's cost curve", m->name);
            return -1;
        }
        dp.tree_auto.cost = env->cost;
        dp.tree_auto.report = env->tree_report;
        dp.tree_auto.user = env->tree_user;
    }
    dp.p_min = env->p_min;
    dp.n_ctx = env->n_ctx;
    dp.n_threads = env->n_threads;
    dp.share_threads = env->share_threads;
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
    if (m->tree_auto) {
        if (!env->cost) {
            snprintf(err, errlen, "method '%s': the automatic tree needs the target's cost curve", m->name);
            return -1;
        }
        np.tree_auto.on = 1;
        np.tree_auto.max_nodes = SD_MIN(SPEC_AUTO_NODES, m->tree_nodes);
        np.tree_auto.max_depth = SD_MIN(np.tree_auto.max_depth, m->ngram_k);
        np.tree_auto.cost = env->cost;
        np.tree_auto.report = env->tree_report;
        np.tree_auto.user = env->tree_user;
    }
    return sd_draft_ngram_new(out, &np, sd_model_tokenizer(env->target), err, errlen);
}

// ---- layer skip: skip:auto | skip:L1-L2-... (layers 0-based, ranges A..B not in the bench form)
static int parse_skip(const char *args, spec_method *m, char *err, size_t errlen) {
    size_t len = strlen(args);
    if (len == 0 || len >= sizeof m->skip_list) {
        snprintf(err, errlen,
                 "method skip:auto|skip:L1-L2-... needs 'auto' or a dash-separated layer list, got 'skip:%s'", args);
        return -1;
    }
    if (strcmp(args, "auto")) {   // syntax only; the range is checked against the model at make time
        int ok = 1;
        for (const char *c = args; *c && ok; c++) {
            int sep = *c == '-' || *c == ',';
            if (sep) ok = c != args && c[1] && c[1] != '-' && c[1] != ',';
            else ok = *c >= '0' && *c <= '9';
        }
        if (!ok) {
            snprintf(err, errlen,
                     "method skip:auto|skip:L1-L2-... needs 'auto' or 0-based layer numbers separated by '-', "
                     "got 'skip:%s'",
                     args);
            return -1;
        }
    }
    m->kind = SPEC_SKIP;
    m->needs_draft_model = 0;
    m->dp = sd_draft_skip_default_params();
    m->tree_nodes = 1 + m->dp.k;
    memcpy(m->skip_list, args, len + 1);
    for (char *c = m->skip_list; *c; c++)
        if (*c == '-') *c = ',';
    return 0;
}

// Resolves skip:auto into m->skip_list (search or --load-skip); no-op for a given list.
static int skip_resolve(spec_method *m, const spec_env *env, double *speedup, char *err, size_t errlen) {
    if (speedup) *speedup = 0;
    if (strcmp(m->skip_list, "auto")) return 0;
    sd_model_info info;
    sd_model_get_info(env->target, &info);
    uint8_t *skip = calloc((size_t)info.n_layer, 1);
    if (!skip) return snprintf(err, errlen, "out of memory"), -1;
    char e2[512];
    int rc;
    if (env->skip_load) {
        rc = sd_skip_load(env->skip_load, env->target, skip, e2, sizeof e2);
    } else {
        sd_skip_search_params sp = sd_skip_search_default_params();
        sp.dp = m->dp;
        sp.share_threads = env->share_threads;
        sp.n_threads = env->n_threads;
        sp.progress = env->skip_progress;
        sp.user = env->skip_user;
        sd_skip_search_result res;
        rc = sd_skip_search_texts(env->target, NULL, 0, 1, &sp, skip, &res, e2, sizeof e2);
        if (rc >= 0 && speedup) *speedup = res.speedup;
    }
    if (rc < 0) {
        free(skip);
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    if (rc == 0) {
        free(skip);
        snprintf(err, errlen, "the skip set is empty (nothing to skip)");
        return -1;
    }
    if (env->skip_save && !env->skip_load && sd_skip_save(env->skip_save, env->target, skip, e2, sizeof e2) < 0) {
        free(skip);
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    int need = sd_skip_format(skip, info.n_layer, m->skip_list, sizeof m->skip_list);
    free(skip);
    if (need >= (int)sizeof m->skip_list) return snprintf(err, errlen, "skip set too long to keep"), -1;
    return 0;
}

static int make_skip(const spec_method *m, const spec_env *env, sd_drafter **out, char *err, size_t errlen) {
    spec_method mm = *m;
    if (skip_resolve(&mm, env, NULL, err, errlen) < 0) return -1;
    sd_model_info info;
    sd_model_get_info(env->target, &info);
    uint8_t *skip = calloc((size_t)info.n_layer, 1);
    if (!skip) return snprintf(err, errlen, "out of memory"), -1;
    char e2[512];
    if (sd_skip_parse(mm.skip_list, info.n_layer, skip, e2, sizeof e2) < 0) {
        free(skip);
        snprintf(err, errlen, "%s (the model has %d layers, numbered 0..%d)", e2,
                 info.n_layer, info.n_layer - 1);
        return -1;
    }
    sd_draft_model_params dp = m->dp;
    dp.n_ctx = env->n_ctx;
    dp.n_threads = env->n_threads;
    dp.share_threads = env->share_threads;
    if (env->p_min > 0) dp.p_min = env->p_min;
    int rc = sd_draft_skip_new(out, env->target, skip, &dp, err, errlen);
    free(skip);
    return rc;
}

// ---- lookahead:W-N-G
static int parse_lookahead(const char *args, spec_method *m, char *err, size_t errlen) {
    int v[3];
    char e2[160];
    int n = spec_parse_ints("lookahead", args, '-', v, 3, 1, 64, e2, sizeof e2);
    if (n != 3 || v[1] < 2 || v[1] > 16) {
        snprintf(err, errlen, "method lookahead:W-N-G needs W in 1..64, N in 2..16, G in 1..64, got 'lookahead:%s'",
                 args);
        return -1;
    }
    m->kind = SPEC_LOOKAHEAD;
    m->la_w = v[0], m->la_n = v[1], m->la_g = v[2];
    m->tree_nodes = 1 + v[2] * (v[1] - 1);
    m->extra_nodes = v[0] * (v[1] - 1);
    return 0;
}

static int make_lookahead(const spec_method *m, const spec_env *env, sd_drafter **out, char *err, size_t errlen) {
    sd_draft_lookahead_params lp = sd_draft_lookahead_default_params();
    lp.W = m->la_w, lp.N = m->la_n, lp.G = m->la_g;
    sd_model_info info;
    sd_model_get_info(env->target, &info);
    return sd_draft_lookahead_new(out, &lp, info.n_vocab, err, errlen);
}

// ---- auto: draft model(s) + tree:auto with --draft, else ngram:3-8 + automatic tree
static int parse_auto(const char *args, spec_method *m, char *err, size_t errlen) {
    if (*args) {
        snprintf(err, errlen, "method 'auto' takes no arguments, got 'auto:%s'", args);
        return -1;
    }
    m->kind = SPEC_AUTO;
    m->tree_nodes = SPEC_AUTO_NODES;
    return 0;
}

static int make_auto(const spec_method *m, const spec_env *env, sd_drafter **out, char *err, size_t errlen) {
    spec_method mm;
    const char *as = env->n_drafts > 0 ? "tree:auto" : "ngram:3-8";
    if (spec_method_parse(as, &mm, err, errlen) < 0) return -1;
    if (mm.kind == SPEC_NGRAM) mm.tree_auto = 1;
    memcpy(mm.name, m->name, sizeof mm.name);
    return (env->n_drafts > 0 ? make_model : make_ngram)(&mm, env, out, err, errlen);
}

// Add a method here: {name, syntax, parse, make}.
// A method whose drafter needs no draft model leaves needs_draft_model 0.
static const method_def g_methods[] = {
    {"ar", "ar", parse_ar, NULL},
    {"chain", "chain:K", parse_chain, make_model},
    {"tree", "tree:W1-W2-...", parse_tree, make_model},
    {"dyn", "dyn:B-D-M", parse_dyn, make_model},
    {"ngram", "ngram:N-K", parse_ngram, make_ngram},
    {"skip", "skip:auto|skip:L1-L2-...", parse_skip, make_skip},
    {"lookahead", "lookahead:W-N-G", parse_lookahead, make_lookahead},
    {"auto", "auto", parse_auto, make_auto},
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
    if (d->make && !colon && d->parse != parse_auto) {
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

int spec_method_prepare(spec_method *m, const spec_env *env, double *speedup, char *err, size_t errlen) {
    if (speedup) *speedup = 0;
    if (m->kind != SPEC_SKIP) return 0;
    return skip_resolve(m, env, speedup, err, errlen);
}

int spec_method_uses_auto(const spec_method *m) {
    return m->kind == SPEC_AUTO || (m->kind == SPEC_NGRAM && m->tree_auto) ||
           (m->kind == SPEC_MODEL && m->dp.shape == SD_DRAFT_AUTO);
}

void spec_env_init(spec_env *env, const sd_model *target, const sd_session *s, int n_drafts, int draft_threads,
                   float p_min) {
    memset(env, 0, sizeof *env);
    env->target = target;
    env->n_drafts = n_drafts;
    env->n_ctx = sd_session_n_ctx(s);
    env->n_threads = draft_threads;
    env->share_threads = draft_threads ? NULL : s;
    env->p_min = p_min;
    env->skip_progress = spec_print_skip_progress;
}

void spec_print_skip_progress(void *user, const sd_skip_progress *pr) {
    static const char *phase[] = {"baseline", "single layers", "greedy"};
    char best[256];
    sd_skip_format(pr->best, pr->n_layer, best, sizeof best);
    fprintf(stderr, "%sskip search [%s] #%d", user ? (const char *)user : "",
            phase[pr->phase < 0 || pr->phase > 2 ? 0 : pr->phase], pr->n_eval);
    if (pr->layer >= 0) fprintf(stderr, " layer %d", pr->layer);
    fprintf(stderr, ": est %.2fx (tau %.2f)%s | best {%s} %.2fx | %.1f s\n", pr->score, pr->accept_len,
            pr->kept ? " kept" : "", best, pr->best_score, pr->elapsed_s);
}

int spec_measure_cost(sd_cost_curve *c, sd_session *s, int max_nodes, char *err, size_t errlen) {
    static const int all[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128};
    int ns[sizeof all / sizeof all[0]], n = 0;
    for (int i = 0; i < (int)(sizeof all / sizeof all[0]) && all[i] <= max_nodes; i++) ns[n++] = all[i];
    if (n == 0) ns[n++] = 1;
    sd_cost_curve_init(c);
    if (sd_cost_curve_measure(c, s, ns, n, 3, 0.0, err, errlen) < 0) return -1;
    if (c->n_points < 1) return snprintf(err, errlen, "cannot measure the target's forward cost"), -1;
    return 0;
}

int spec_method_default_nodes(const spec_method *m, int n_drafts) {
    long n = m->tree_nodes;
    if ((m->kind == SPEC_MODEL || (m->kind == SPEC_AUTO && n_drafts > 0)) && n_drafts > 1)
        n = 1 + (long)(n - 1) * n_drafts;
    return n > (1 << 20) ? 1 << 20 : (int)n;
}
