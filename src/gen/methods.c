// methods.c - method strings -> drafters (include/specdec_spec.h): the
// registry of speculative methods. Adding a drafter means one entry in
// g_methods: a parse function for its arguments and a make function that
// builds it. The public sd_method keeps the string and what a program needs
// to know; the parsed parameters (method_cfg) stay here and are re-derived
// from the string when the drafter is built.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/quant.h"
#include "draft/draft_eagle3.h"
#include "draft/draft_moa.h"
#include "draft/draft_lookahead.h"
#include "draft/draft_medusa.h"
#include "draft/draft_merge.h"
#include "draft/draft_model.h"
#include "draft/draft_ngram.h"
#include "train/learner.h"
#include "spec/cost_curve.h"
#include "gen/method_args.h"
#include "gen/methods_impl.h"
#include "specdec_spec.h"

#define MAX_PARTS 4   // most methods merged by '+'

#define widths_nodes sd_method_widths_nodes
// Most nodes of a tree the dynamic shapes grow (draft_model.c DM_TREE_MAX,
// draft_eagle3.c E3_TREE_MAX): dyn:B-D-M needs 1 + B*B*D within it.
#define DYN_TREE_MAX_MODEL 1024
#define DYN_TREE_MAX_EAGLE3 512

// ------------------------------------------------------------ the methods
// Parses the text after "NAME:" (args, "" when there was no colon).
typedef int (*method_parse_fn)(const char *args, method_cfg *m, char *err, size_t errlen);
// Builds the drafter of a parsed method.
typedef int (*method_make_fn)(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err,
                              size_t errlen);

typedef struct method_def {
    const char *name;       // before the colon
    const char *syntax;     // for messages and help
    method_parse_fn parse;
    method_make_fn make;    // NULL: no drafter (ar)
} method_def;

static int parse_ar(const char *args, method_cfg *m, char *err, size_t errlen) {
    if (*args) {
        snprintf(err, errlen, "method 'ar' takes no arguments, got 'ar:%s'", args);
        return -1;
    }
    m->kind = SD_METHOD_AR;
    m->tree_nodes = 1;
    return 0;
}

static int parse_chain(const char *args, method_cfg *m, char *err, size_t errlen) {
    int k;
    char got[96];
    snprintf(got, sizeof got, "chain:%s", args);
    if (sd_method_nums(args, '-', 0, &k, 1) != 1) {
        snprintf(err, errlen, "method chain:K needs K in 1..64, got '%s'", got);
        return -1;
    }
    if (sd_method_range("chain:K", "K", k, 1, 64, got, err, errlen) < 0) return -1;
    m->kind = SD_METHOD_MODEL;
    m->needs_draft_model = 1;
    m->dp = sd_draft_model_default_params();
    m->dp.shape = SD_DRAFT_CHAIN;
    m->dp.k = k;
    m->tree_nodes = k + 1;
    return 0;
}

static int parse_tree(const char *args, method_cfg *m, char *err, size_t errlen) {
    int w[SD_DRAFT_MAX_WIDTHS];
    char e2[160];
    if (!strcmp(args, "auto")) {   // hardware-aware tree (tree_opt.h)
        m->kind = SD_METHOD_MODEL;
        m->needs_draft_model = 1;
        m->dp = sd_draft_model_default_params();
        m->dp.shape = SD_DRAFT_AUTO;
        m->dp.tree_auto.max_nodes = SD_METHOD_AUTO_NODES;
        m->tree_nodes = SD_METHOD_AUTO_NODES;
        return 0;
    }
    int n = sd_method_nums(args, '-', 0, w, SD_DRAFT_MAX_WIDTHS);
    snprintf(e2, sizeof e2, "tree:%s", args);
    if (n < 1 || n > SD_DRAFT_MAX_WIDTHS) {
        snprintf(err, errlen, "method tree:W1-W2-... needs 1..%d widths in 1..64 (or tree:auto), got '%s'",
                 SD_DRAFT_MAX_WIDTHS, e2);
        return -1;
    }
    if (sd_method_widths_range("tree:W1-W2-...", w, n, 1, 64, e2, err, errlen) < 0) return -1;
    m->kind = SD_METHOD_MODEL;
    m->needs_draft_model = 1;
    m->dp = sd_draft_model_default_params();
    m->dp.shape = SD_DRAFT_WIDTHS;
    m->dp.n_widths = n;
    memcpy(m->dp.widths, w, sizeof(int) * (size_t)n);
    m->tree_nodes = widths_nodes(w, n);
    return 0;
}

// dyn:B-D-M for a drafter whose trees hold at most tree_max nodes.
static int parse_dyn_max(const char *args, method_cfg *m, int tree_max, char *err, size_t errlen) {
    int v[3];
    char got[96];
    snprintf(got, sizeof got, "dyn:%s", args);
    int n = sd_method_nums(args, '-', 0, v, 3);
    if (n != 3) {
        snprintf(err, errlen, "method dyn:B-D-M needs B in 1..16, D in 1..16, M in 2..1024, got '%s'", got);
        return -1;
    }
    if (sd_method_range("dyn:B-D-M", "B", v[0], 1, 16, got, err, errlen) < 0 ||
        sd_method_range("dyn:B-D-M", "D", v[1], 1, 16, got, err, errlen) < 0 ||
        sd_method_range("dyn:B-D-M", "M", v[2], 2, 1024, got, err, errlen) < 0)
        return -1;
    if (1 + v[0] * v[0] * v[1] > tree_max) {   // the candidates the drafter grows before keeping M
        snprintf(err, errlen, "method dyn:B-D-M needs 1 + B*B*D <= %d (the drafter's largest tree), got B = %d, "
                 "D = %d (%d nodes) in '%s'", tree_max, v[0], v[1], 1 + v[0] * v[0] * v[1], got);
        return -1;
    }
    m->kind = SD_METHOD_MODEL;
    m->needs_draft_model = 1;
    m->dp = sd_draft_model_default_params();
    m->dp.shape = SD_DRAFT_DYNAMIC;
    m->dp.dyn_b = v[0];
    m->dp.dyn_d = v[1];
    m->dp.dyn_m = v[2];
    m->tree_nodes = v[2];
    return 0;
}

static int parse_dyn(const char *args, method_cfg *m, char *err, size_t errlen) {
    return parse_dyn_max(args, m, DYN_TREE_MAX_MODEL, err, errlen);
}

// The draft-model shape of m with the environment's settings (the automatic
// tree's cost curve and report, p_min, context, pool): shared by the draft
// models and the EAGLE-3 head. 0, or -1 with a message.
static int shape_params(const method_cfg *m, const sd_method_env *env, sd_draft_model_params *out, char *err,
                        size_t errlen) {
    sd_draft_model_params dp = m->dp;
    if (dp.shape == SD_DRAFT_AUTO) {
        if (!env->cost) {
            snprintf(err, errlen, "method '%s': the automatic tree needs the target's cost curve", m->name);
            return -1;
        }
        dp.tree_auto.cost = env->cost;
        if (env->auto_nodes > 0) dp.tree_auto.max_nodes = SD_MIN(env->auto_nodes, SD_METHOD_AUTO_NODES);
        dp.tree_auto.report = env->report;
        dp.tree_auto.user = env->user;
    }
    dp.p_min = env->p_min;
    dp.n_ctx = env->n_ctx;
    dp.n_threads = env->n_threads;
    dp.pool = env->pool;
    *out = dp;
    return 0;
}

// One drafter per draft model, merged when there are several.
static int make_model(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    sd_drafter *subs[SD_METHOD_MAX_DRAFTS];
    sd_draft_model_params dp;
    if (shape_params(m, env, &dp, err, errlen) < 0) return -1;
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

static int parse_ngram(const char *args, method_cfg *m, char *err, size_t errlen) {
    int v[2];
    char e2[160], nums[64];
    size_t len = strlen(args);
    int tree_auto = len > 5 && !strcmp(args + len - 5, ":auto");
    if (tree_auto) len -= 5;
    snprintf(nums, sizeof nums, "%.*s", (int)SD_MIN(len, sizeof nums - 1), args);
    int n = sd_method_nums(nums, '-', 0, v, 2);
    snprintf(e2, sizeof e2, "ngram:%.100s", args);
    if (n != 2) {
        snprintf(err, errlen, "method ngram:N-K[:auto] needs N in 1..%d and K in 1..256, got '%s'", SD_NGRAM_MAX_N,
                 e2);
        return -1;
    }
    if (sd_method_range("ngram:N-K[:auto]", "N", v[0], 1, SD_NGRAM_MAX_N, e2, err, errlen) < 0 ||
        sd_method_range("ngram:N-K[:auto]", "K", v[1], 1, 256, e2, err, errlen) < 0)
        return -1;
    m->tree_auto = tree_auto;
    m->kind = SD_METHOD_NGRAM;
    m->ngram_n = v[0];
    m->ngram_k = v[1];
    sd_draft_ngram_params np = sd_draft_ngram_default_params();
    m->tree_nodes = 1 + np.max_branches * v[1];
    return 0;
}

static int make_ngram(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    sd_draft_ngram_params np = sd_draft_ngram_default_params();
    np.n_max = m->ngram_n;
    np.k_max = m->ngram_k;
    np.datastore = env->datastore;
    np.ds_shared = env->datastore_loaded;
    if (env->n_ctx > 0) np.n_ctx = env->n_ctx;
    if (m->tree_auto) {
        if (!env->cost) {
            snprintf(err, errlen, "method '%s': the automatic tree needs the target's cost curve", m->name);
            return -1;
        }
        np.tree_auto.on = 1;
        np.tree_auto.max_nodes = SD_MIN(SD_METHOD_AUTO_NODES, m->tree_nodes);
        if (env->auto_nodes > 0) np.tree_auto.max_nodes = SD_MIN(np.tree_auto.max_nodes, env->auto_nodes);
        np.tree_auto.max_depth = SD_MIN(np.tree_auto.max_depth, m->ngram_k);
        np.tree_auto.cost = env->cost;
        np.tree_auto.report = env->report;
        np.tree_auto.user = env->user;
    }
    return sd_draft_ngram_new(out, &np, sd_model_tokenizer(env->target), err, errlen);
}

// ---- lookahead:W-N-G
static int parse_lookahead(const char *args, method_cfg *m, char *err, size_t errlen) {
    int v[3];
    char got[96];
    snprintf(got, sizeof got, "lookahead:%s", args);
    int n = sd_method_nums(args, '-', 0, v, 3);
    if (n != 3) {
        snprintf(err, errlen, "method lookahead:W-N-G needs W in 1..64, N in 2..16, G in 1..64, got '%s'", got);
        return -1;
    }
    if (sd_method_range("lookahead:W-N-G", "W", v[0], 1, 64, got, err, errlen) < 0 ||
        sd_method_range("lookahead:W-N-G", "N", v[1], 2, 16, got, err, errlen) < 0 ||
        sd_method_range("lookahead:W-N-G", "G", v[2], 1, 64, got, err, errlen) < 0)
        return -1;
    m->kind = SD_METHOD_LOOKAHEAD;
    m->la_w = v[0], m->la_n = v[1], m->la_g = v[2];
    m->tree_nodes = 1 + v[2] * (v[1] - 1);
    m->extra_nodes = v[0] * (v[1] - 1);
    return 0;
}

static int make_lookahead(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    sd_draft_lookahead_params lp = sd_draft_lookahead_default_params();
    lp.W = m->la_w, lp.N = m->la_n, lp.G = m->la_g;
    sd_model_info info;
    sd_model_get_info(env->target, &info);
    return sd_draft_lookahead_new(out, &lp, info.n_vocab, err, errlen);
}

static int cfg_parse(const char *s, method_cfg *m, char *err, size_t errlen);

// ---- eagle3:SHAPE (the draft-model shapes, drafted by the EAGLE-3 head)
// SHAPE of a head's method (eagle3:, moa:): the draft-model shapes.
static int parse_head_shape(const char *args, const char *head, int kind, method_cfg *m, char *err, size_t errlen) {
    const char *shape = !strcmp(args, "auto") ? "tree:auto" : args;
    int rc = -1;
    if (!strncmp(shape, "chain:", 6)) rc = parse_chain(shape + 6, m, err, errlen);
    else if (!strncmp(shape, "tree:", 5)) rc = parse_tree(shape + 5, m, err, errlen);
    else if (!strncmp(shape, "dyn:", 4)) rc = parse_dyn_max(shape + 4, m, DYN_TREE_MAX_EAGLE3, err, errlen);
    else snprintf(err, errlen, "method %s:SHAPE needs SHAPE chain:K, tree:W1-W2-..., dyn:B-D-M or auto, got '%s:%s'",
                  head, head, args);
    if (rc < 0) return -1;
    m->kind = kind;
    m->needs_draft_model = 0;
    return 0;
}

static int parse_eagle3(const char *args, method_cfg *m, char *err, size_t errlen) {
    return parse_head_shape(args, "eagle3", SD_METHOD_EAGLE3, m, err, errlen);
}

// The type of a head's matrices in memory (sd_method_env.head_bits), or -1.
static int head_wtype(const sd_method_env *env, char *err, size_t errlen) {
    switch (env->head_bits) {
    case 8: return SD_TYPE_Q8_0;
    case 5: return SD_TYPE_Q5_0;
    case 4: return SD_TYPE_Q4_1;
    }
    snprintf(err, errlen, "head weights: %d bits per weight (8, 5 or 4)", env->head_bits);
    return -1;
}

// The message for a method whose kind of head is missing: what it needs,
// and what was given instead when another kind was.
static int no_head(const method_cfg *m, const sd_method_env *env, const char *need, const char *file, char *err,
                   size_t errlen) {
    const char *given = env->head_eagle3   ? "an EAGLE-3 head (eagle3:SHAPE methods)"
                        : env->head_moa    ? "an MoA drafter (moa:SHAPE methods)"
                        : env->head_medusa ? "a Medusa head (medusa:W1-W2-... methods)"
                                           : NULL;
    if (given) snprintf(err, errlen, "method '%s' needs %s; the head given is %s", m->name, need, given);
    else snprintf(err, errlen, "method '%s' needs %s (--head %s)", m->name, need, file);
    return -1;
}

static int make_eagle3(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    if (!env->head_eagle3) return no_head(m, env, "an EAGLE-3 head", "H.gguf", err, errlen);
    sd_draft_model_params dp;
    if (shape_params(m, env, &dp, err, errlen) < 0) return -1;
    const int wt = head_wtype(env, err, errlen);
    if (wt < 0) return -1;
    return sd_draft_eagle3_new(out, env->head_eagle3, env->target, &dp, wt, &env->head_online, &sd_learner_hook, err, errlen);
}

// ---- moa:SHAPE (the draft-model shapes, drafted by the MoA drafter, docs/moa.md)
static int parse_moa(const char *args, method_cfg *m, char *err, size_t errlen) {
    return parse_head_shape(args, "moa", SD_METHOD_MOA, m, err, errlen);
}

static int make_moa(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    if (!env->head_moa) return no_head(m, env, "an MoA drafter", "MOA.gguf", err, errlen);
    sd_draft_model_params dp;
    if (shape_params(m, env, &dp, err, errlen) < 0) return -1;
    const int wt = head_wtype(env, err, errlen);   // the drafter's matrices and the TLI layers it borrows
    if (wt < 0) return -1;
    return sd_draft_moa_new(out, env->head_moa, env->target, &dp, wt, err, errlen);
}

// ---- medusa:W1-W2-... (children per node at depth k from Medusa head k)
static int parse_medusa(const char *args, method_cfg *m, char *err, size_t errlen) {
    int w[SD_DRAFT_MAX_WIDTHS];
    char e2[160];
    int n = sd_method_nums(args, '-', 0, w, SD_HEAD_MAX_MEDUSA);
    snprintf(e2, sizeof e2, "medusa:%.100s", args);
    if (n < 1 || n > SD_HEAD_MAX_MEDUSA) {
        snprintf(err, errlen, "method medusa:W1-W2-... needs 1..%d widths in 1..16 (one per Medusa head), got '%s'",
                 SD_HEAD_MAX_MEDUSA, e2);
        return -1;
    }
    if (sd_method_widths_range("medusa:W1-W2-...", w, n, 1, 16, e2, err, errlen) < 0) return -1;
    m->kind = SD_METHOD_MEDUSA;
    m->dp = sd_draft_model_default_params();
    m->dp.shape = SD_DRAFT_WIDTHS;
    m->dp.n_widths = n;
    memcpy(m->dp.widths, w, sizeof(int) * (size_t)n);
    m->tree_nodes = SD_MIN(widths_nodes(w, n), 64);   // the product is cut to the best 64 nodes at most
    return 0;
}

static int make_medusa(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    if (!env->head_medusa) return no_head(m, env, "a Medusa head", "H.gguf", err, errlen);
    const int wt = head_wtype(env, err, errlen);
    if (wt < 0) return -1;
    return sd_draft_medusa_new(out, env->head_medusa, env->target, m->dp.widths, m->dp.n_widths, env->p_min, env->pool,
                               wt, err, errlen);
}

// ---- auto: draft model(s) + tree:auto with --draft, else ngram:3-8 + automatic tree
static int parse_auto(const char *args, method_cfg *m, char *err, size_t errlen) {
    if (*args) {
        snprintf(err, errlen, "method 'auto' takes no arguments, got 'auto:%s'", args);
        return -1;
    }
    m->kind = SD_METHOD_AUTO;
    m->tree_nodes = SD_METHOD_AUTO_NODES;
    return 0;
}

static int make_auto(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    if (env->head_eagle3 || env->head_moa) {   // with a head, the default method (sd_method_default): lookup, else the head
        sd_method dm;
        const sd_method_have have = {.n_drafts = env->n_drafts, .eagle3_head = env->head_eagle3 != NULL,
                                     .moa_head = env->head_moa != NULL,
                                     .datastore = env->datastore || env->datastore_loaded};
        if (sd_method_parse(sd_method_default(&have), &dm, err, errlen) < 0) return -1;
        return sd_method_make(&dm, env, out, err, errlen);
    }
    method_cfg mm;
    const char *as = env->n_drafts > 0 ? "tree:auto" : "ngram:3-8";
    if (cfg_parse(as, &mm, err, errlen) < 0) return -1;
    if (mm.kind == SD_METHOD_NGRAM) mm.tree_auto = 1;
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
    {"ngram", "ngram:N-K[:auto]", parse_ngram, make_ngram},
    {"skip", "skip:auto|skip:L1-L2-...", gen_parse_skip, gen_make_skip},
    {"lookahead", "lookahead:W-N-G", parse_lookahead, make_lookahead},
    {"eagle3", "eagle3:chain:K|tree:W1-W2-...|dyn:B-D-M|auto", parse_eagle3, make_eagle3},
    {"moa", "moa:chain:K|tree:W1-W2-...|dyn:B-D-M|auto", parse_moa, make_moa},
    {"medusa", "medusa:W1-W2-...", parse_medusa, make_medusa},
    {"auto", "auto", parse_auto, make_auto},
};
// (and A+B: several methods' trees merged; A/B: A's tree, or B's when A drafts nothing)
#define N_METHODS ((int)(sizeof g_methods / sizeof g_methods[0]))

const char *sd_methods_syntax(void) {
    static char buf[512];
    if (!buf[0]) {
        size_t o = 0;
        for (int i = 0; i < N_METHODS && o < sizeof buf; i++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s", i ? ", " : "", g_methods[i].syntax);
        if (o < sizeof buf) snprintf(buf + o, sizeof buf - o, ", A+B (trees merged), A/B (A's tree, else B's)");
    }
    return buf;
}

static const method_def *find_def(const char *name, size_t len) {
    for (int i = 0; i < N_METHODS; i++)
        if (strlen(g_methods[i].name) == len && !memcmp(g_methods[i].name, name, len)) return &g_methods[i];
    return NULL;
}

// One method (no '+').
static int cfg_parse(const char *s, method_cfg *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    size_t len = strlen(s);
    if (len == 0 || len >= SD_METHOD_NAME_MAX) {
        snprintf(err, errlen, "bad method '%s' (methods: %s)", s, sd_methods_syntax());
        return -1;
    }
    memcpy(m->name, s, len + 1);
    const char *colon = strchr(s, ':');
    size_t nlen = colon ? (size_t)(colon - s) : len;
    const method_def *d = find_def(s, nlen);
    if (!d) {
        snprintf(err, errlen, "unknown method '%s' (methods: %s)", s, sd_methods_syntax());
        return -1;
    }
    if (d->make && !colon && d->parse != parse_auto) {
        snprintf(err, errlen, "method '%s' needs arguments: %s", s, d->syntax);
        return -1;
    }
    return d->parse(colon ? colon + 1 : "", m, err, errlen);
}

static int cfg_uses_auto(const method_cfg *m) {
    return m->kind == SD_METHOD_AUTO || (m->kind == SD_METHOD_NGRAM && m->tree_auto) ||
           ((m->kind == SD_METHOD_MODEL || m->kind == SD_METHOD_EAGLE3 || m->kind == SD_METHOD_MOA) &&
            m->dp.shape == SD_DRAFT_AUTO);
}

// The separator of m->name's parts: '+' (merged trees), '/' (the first
// non-empty tree), 0 for one method, -1 for both (refused).
static int method_sep(const char *name) {
    const int plus = strchr(name, '+') != NULL, slash = strchr(name, '/') != NULL;
    return plus && slash ? -1 : plus ? '+' : slash ? '/' : 0;
}

// Splits m->name at '+' or '/' into parsed parts; returns their count or -1.
static int method_parts(const sd_method *m, method_cfg *parts, char *err, size_t errlen) {
    int n = 0;
    const int sep = method_sep(m->name);
    if (sep < 0) {
        snprintf(err, errlen, "method '%s': merge trees with '+' or take the first with '/', not both", m->name);
        return -1;
    }
    const char *p = m->name;
    for (;;) {
        size_t L = strcspn(p, "+/");
        char item[SD_METHOD_NAME_MAX];
        if (L == 0) {
            snprintf(err, errlen, "bad method '%s': empty part around '%c'", m->name, sep);
            return -1;
        }
        if (n == MAX_PARTS) {
            snprintf(err, errlen, "method '%s': at most %d methods combined", m->name, MAX_PARTS);
            return -1;
        }
        memcpy(item, p, L);
        item[L] = 0;
        if (cfg_parse(item, &parts[n], err, errlen) < 0) return -1;
        n++;
        p += L;
        if (!*p) break;
        p++;
    }
    int heads = 0;
    for (int i = 0; n > 1 && i < n; i++)
        heads += parts[i].kind == SD_METHOD_EAGLE3 || parts[i].kind == SD_METHOD_MEDUSA || parts[i].kind == SD_METHOD_MOA;
    for (int i = 0; n > 1 && i < n; i++) {
        const int k = parts[i].kind, head = k == SD_METHOD_EAGLE3 || k == SD_METHOD_MEDUSA || k == SD_METHOD_MOA;
        // ar and auto choose for themselves; lookahead's window rides beside one tree; the hidden rows of
        // a step are passed on to one head only
        if (k == SD_METHOD_AR || k == SD_METHOD_AUTO || k == SD_METHOD_LOOKAHEAD) {
            snprintf(err, errlen, "method '%s': '%s' cannot be %s other methods", m->name, parts[i].name,
                     sep == '+' ? "merged with" : "combined with");
            return -1;
        }
        if (heads > 1) {
            snprintf(err, errlen, "method '%s': at most one head (eagle3, medusa or moa) in a %s", m->name,
                     sep == '+' ? "merge" : "fallback");
            return -1;
        }
        if (head && sep == '/' && i < n - 1) {
            snprintf(err, errlen, "method '%s': the head '%s' drafts at every step, so it goes last", m->name,
                     parts[i].name);
            return -1;
        }
    }
    return n;
}

int sd_method_parse(const char *s, sd_method *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    size_t len = strlen(s);
    if (len == 0 || len >= SD_METHOD_NAME_MAX) {
        snprintf(err, errlen, "bad method '%s' (methods: %s)", s, sd_methods_syntax());
        return -1;
    }
    memcpy(m->name, s, len + 1);
    method_cfg parts[MAX_PARTS];
    int n = method_parts(m, parts, err, errlen);
    if (n < 0) return -1;
    const int first = method_sep(m->name) == '/';
    m->kind = n == 1 ? parts[0].kind : first ? SD_METHOD_FIRST : SD_METHOD_MERGE;
    m->tree_nodes = 1;
    for (int i = 0; i < n; i++) {
        m->needs_draft_model |= parts[i].needs_draft_model;
        if (parts[i].kind == SD_METHOD_EAGLE3) m->needs_head = SD_HEAD_EAGLE3;
        if (parts[i].kind == SD_METHOD_MEDUSA) m->needs_head = SD_HEAD_MEDUSA;
        if (parts[i].kind == SD_METHOD_MOA) m->needs_head = SD_HEAD_MOA;
        m->uses_cost_curve |= cfg_uses_auto(&parts[i]);
        m->uses_ngram |= parts[i].kind == SD_METHOD_NGRAM || parts[i].kind == SD_METHOD_AUTO;
        if (first) m->tree_nodes = SD_MAX(m->tree_nodes, parts[i].tree_nodes);   // one part's tree a step
        else m->tree_nodes += parts[i].tree_nodes - 1;
        m->extra_nodes += parts[i].extra_nodes;
        if (parts[i].kind == SD_METHOD_SKIP) memcpy(m->skip_list, parts[i].skip_list, sizeof m->skip_list);
    }
    return 0;
}

int sd_methods_parse(const char *list, sd_method *ms, int max, char *err, size_t errlen) {
    int n = 0, have_ar = 0;
    const char *p = list;
    if (!*list) {
        snprintf(err, errlen, "--methods: empty list (methods: %s)", sd_methods_syntax());
        return -1;
    }
    while (*p) {
        size_t L = strcspn(p, ",");
        char item[SD_METHOD_NAME_MAX];
        if (L == 0 || L >= sizeof item) {
            snprintf(err, errlen, "--methods: bad list '%s' (comma-separated methods: %s)", list,
                     sd_methods_syntax());
            return -1;
        }
        memcpy(item, p, L);
        item[L] = 0;
        if (n == max - 1) {   // room for ar
            snprintf(err, errlen, "--methods: at most %d methods", max - 1);
            return -1;
        }
        char e2[512];
        if (sd_method_parse(item, &ms[n], e2, sizeof e2) < 0) {
            snprintf(err, errlen, "--methods: %s", e2);
            return -1;
        }
        for (int j = 0; j < n; j++)
            if (!strcmp(ms[j].name, item)) {
                snprintf(err, errlen, "--methods: '%s' is listed twice", item);
                return -1;
            }
        if (ms[n].kind == SD_METHOD_AR) {
            have_ar = 1;
            if (n > 0) {   // ar goes first
                sd_method t = ms[n];
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
        sd_method_parse("ar", &ms[0], err, errlen);
        n++;
    }
    return n;
}

int sd_method_make(const sd_method *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    *out = NULL;
    method_cfg parts[MAX_PARTS];
    int n = method_parts(m, parts, err, errlen);
    if (n < 0) return -1;
    if (!env || !env->target) return snprintf(err, errlen, "method '%s': no target model", m->name), -1;
    if (m->needs_draft_model && env->n_drafts < 1) {
        snprintf(err, errlen, "method '%s' needs a draft model (--draft D.gguf)", m->name);
        return -1;
    }
    sd_drafter *subs[MAX_PARTS] = {0};
    int n_subs = 0;
    for (int i = 0; i < n; i++) {
        const char *colon = strchr(parts[i].name, ':');
        const method_def *d =
            find_def(parts[i].name, colon ? (size_t)(colon - parts[i].name) : strlen(parts[i].name));
        if (!d->make) continue;   // ar
        if (parts[i].kind == SD_METHOD_SKIP && strcmp(m->skip_list, "auto") && m->skip_list[0])
            memcpy(parts[i].skip_list, m->skip_list, sizeof parts[i].skip_list);   // resolved by prepare
        if (d->make(&parts[i], env, &subs[n_subs], err, errlen) < 0) {
            for (int j = 0; j < n_subs; j++) sd_drafter_free(subs[j]);
            return -1;
        }
        n_subs++;
    }
    if (n_subs <= 1) {
        *out = subs[0];
        return 0;
    }
    sd_model_info info;
    sd_model_get_info(env->target, &info);
    if (m->kind == SD_METHOD_FIRST) return sd_draft_first_new(out, subs, n_subs, info.n_vocab, err, errlen);
    return sd_draft_merge_new(out, subs, n_subs, info.n_vocab, err, errlen);
}

int sd_method_prepare(sd_method *m, const sd_method_env *env, double *speedup, char *err, size_t errlen) {
    if (speedup) *speedup = 0;
    method_cfg parts[MAX_PARTS];
    int n = method_parts(m, parts, err, errlen);
    if (n < 0) return -1;
    for (int i = 0; i < n; i++) {
        if (parts[i].kind != SD_METHOD_SKIP) continue;
        if (strcmp(m->skip_list, "auto")) return 0;   // already resolved (or given)
        if (gen_skip_resolve(&parts[i], env, speedup, err, errlen) < 0) return -1;
        memcpy(m->skip_list, parts[i].skip_list, sizeof m->skip_list);
    }
    return 0;
}

sd_method_env sd_method_env_default(const sd_model *target) {
    sd_method_env env;
    memset(&env, 0, sizeof env);
    env.target = target;
    env.head_online = sd_head_online_default_params();
    env.head_bits = 5;
    return env;
}

int sd_method_default_nodes(const sd_method *m, int n_drafts) {
    method_cfg parts[MAX_PARTS];
    char e[8];
    int n = method_parts(m, parts, e, sizeof e);
    if (n < 0) return m->tree_nodes;
    long total = 1;
    for (int i = 0; i < n; i++) {
        long t = parts[i].tree_nodes - 1;
        if ((parts[i].kind == SD_METHOD_MODEL || (parts[i].kind == SD_METHOD_AUTO && n_drafts > 0)) && n_drafts > 1)
            t *= n_drafts;
        if (m->kind == SD_METHOD_FIRST) {   // one part's tree a step
            total = SD_MAX(total, 1 + t);
            continue;
        }
        total += t;
    }
    return total > (1 << 20) ? 1 << 20 : (int)total;
}
