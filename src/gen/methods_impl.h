// methods_impl.h - internal to src/gen/: a parsed method (method_cfg) and
// the parse/make pair each method of the registry (methods.c) gives; the
// layer-skip method lives in method_skip.c.
#ifndef SD_GEN_METHODS_IMPL_H
#define SD_GEN_METHODS_IMPL_H

#include <stddef.h>

#include "draft/draft_model.h"
#include "specdec_spec.h"

// A parsed method (one part of a merge).
typedef struct method_cfg {
    char name[SD_METHOD_NAME_MAX]; // the part's string, e.g. "chain:4"
    int kind;                   // enum sd_method_kind
    int needs_draft_model;      // 1: fails without draft models
    sd_draft_model_params dp;   // MODEL, SKIP: the draft's shape
    int ngram_n, ngram_k;       // NGRAM: context n-gram length, tokens drafted
    int tree_auto;              // NGRAM: 1 = tree sized automatically; MODEL uses dp.shape == SD_DRAFT_AUTO
    char skip_list[256];        // SKIP: "auto" or a comma-separated layer list ("1,2")
    int la_w, la_n, la_g;       // LOOKAHEAD: window width, n-gram size, n-grams verified per step
    int tree_nodes;             // nodes of the largest tree one draft proposes, root included
    int extra_nodes;            // batch nodes evaluated beside the tree each step
} method_cfg;

// ---- skip:auto | skip:L1-L2-... (method_skip.c)
int gen_parse_skip(const char *args, method_cfg *m, char *err, size_t errlen);
int gen_make_skip(const method_cfg *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen);
// Resolves skip:auto into m->skip_list (search or --load-skip); no-op for a given list.
int gen_skip_resolve(method_cfg *m, const sd_method_env *env, double *speedup, char *err, size_t errlen);

#endif
