// method_skip.c - the layer-skip method (skip:auto | skip:L1-L2-...,
// layers 0-based): its arguments, the search that resolves "auto" (or
// --load-skip), and its drafter (src/draft/draft_skip.c).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft/draft_skip.h"
#include "draft/skip_search.h"
#include "gen/method_args.h"
#include "gen/methods_impl.h"

// ---- layer skip: skip:auto | skip:L1-L2-... (layers 0-based, ranges A..B not in the bench form)
int gen_parse_skip(const char *args, method_cfg *m, char *err, size_t errlen) {
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
    if (strcmp(args, "auto")) {   // each layer once: a repeat is a typo, never two skips of one layer
        int ls[128], n = sd_method_nums(args, '-', ',', ls, 128), twice = sd_method_repeat(ls, n > 128 ? 128 : n);
        if (twice >= 0)
            return snprintf(err, errlen, "method skip:L1-L2-... lists layer %d twice in 'skip:%s'", twice, args), -1;
    }
    m->kind = SD_METHOD_SKIP;
    m->needs_draft_model = 0;
    m->dp = sd_draft_skip_default_params();
    m->tree_nodes = 1 + m->dp.k;
    memcpy(m->skip_list, args, len + 1);
    for (char *c = m->skip_list; *c; c++)
        if (*c == '-') *c = ',';
    return 0;
}

// The layer search's progress as one line through env->report.
static void skip_progress_line(void *user, const sd_skip_progress *pr) {
    static const char *phase[] = {"baseline", "single layers", "greedy"};
    const sd_method_env *env = user;
    char best[256], line[512], lay[32] = "";
    sd_skip_format(pr->best, pr->n_layer, best, sizeof best);
    if (pr->layer >= 0) snprintf(lay, sizeof lay, " layer %d", pr->layer);
    snprintf(line, sizeof line, "skip search [%s] #%d%s: est %.2fx (tau %.2f)%s | best {%s} %.2fx | %.1f s",
             phase[pr->phase < 0 || pr->phase > 2 ? 0 : pr->phase], pr->n_eval, lay, pr->score, pr->accept_len,
             pr->kept ? " kept" : "", best, pr->best_score, pr->elapsed_s);
    env->report(env->user, line);
}

int gen_skip_resolve(method_cfg *m, const sd_method_env *env, double *speedup, char *err, size_t errlen) {
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
        sp.pool = env->pool;
        sp.n_threads = env->n_threads;
        sp.progress = env->report ? skip_progress_line : NULL;
        sp.user = (void *)env;
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

int gen_make_skip(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen) {
    method_cfg mm = *m;
    if (gen_skip_resolve(&mm, env, NULL, err, errlen) < 0) return -1;
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
    dp.pool = env->pool;
    if (env->p_min > 0) dp.p_min = env->p_min;
    int rc = sd_draft_skip_new(out, env->target, skip, &dp, err, errlen);
    free(skip);
    return rc;
}
