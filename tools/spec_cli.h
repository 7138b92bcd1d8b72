// spec_cli.h - speculative decoding methods as the program names them, and
// the factory that turns a method into a drafter. Shared by generate and bench.
//
// A method string is NAME or NAME:ARGS: "ar" (no drafting), "chain:K",
// "tree:W1-W2-...", "tree:auto", "dyn:B-D-M" (draft models), "ngram:N-K"
// (prompt lookup), "skip:auto" / "skip:L1-L2-..." (layer-skip
// self-speculation), "lookahead:W-N-G" (lookahead decoding), "auto" (the best
// drafter available with an automatically sized tree). Adding a drafter means
// one entry in the table of spec_cli.c: a parse function for its arguments
// and a make function that builds the drafter.
#ifndef SD_SPEC_CLI_H
#define SD_SPEC_CLI_H

#include <stddef.h>

#include "draft/draft_merge.h"
#include "draft/draft_model.h"
#include "draft/draft_skip.h"
#include "draft/skip_search.h"
#include "specdec.h"
#include "spec/tree_opt.h"

#define SPEC_MAX_DRAFTS 8   // most --draft models
#define SPEC_NAME_MAX 64    // longest method string
#define SPEC_AUTO_NODES 32  // automatic trees: most nodes, root included

enum spec_kind {
    SPEC_AR = 0,      // plain autoregressive decoding (sd_generate), the baseline
    SPEC_MODEL = 1,   // draft model(s): dp says chain, widths or dynamic tree
    SPEC_NGRAM = 2,   // n-gram lookup in the text so far (ngram_n, ngram_k)
    SPEC_SKIP = 3,    // layer-skip self-speculation (skip_list, dp)
    SPEC_LOOKAHEAD = 4, // lookahead decoding (la_w, la_n, la_g)
    SPEC_AUTO = 5,    // "auto": draft model(s) + automatic tree with --draft, else n-gram 3-8 + automatic tree
};

typedef struct spec_method {
    char name[SPEC_NAME_MAX];   // the method string as given, e.g. "chain:4"
    int kind;                   // enum spec_kind
    int needs_draft_model;      // 1: fails without --draft
    sd_draft_model_params dp;   // SPEC_MODEL: the draft tree's shape
    int ngram_n, ngram_k;       // SPEC_NGRAM: context n-gram length, tokens drafted
    int tree_auto;              // SPEC_NGRAM: 1 = tree sized automatically (tree_auto.h); SPEC_MODEL
                                // uses dp.shape == SD_DRAFT_AUTO instead
    char skip_list[256];        // SPEC_SKIP: "auto" or a comma-separated layer list ("1,2")
    int la_w, la_n, la_g;       // SPEC_LOOKAHEAD: window width, n-gram size, n-grams verified per step
    int tree_nodes;             // nodes of the largest tree one draft proposes, root included (1 for ar)
    int extra_nodes;            // batch nodes evaluated beside the tree each step (lookahead window), >= 0
} spec_method;

// What a method needs to build its drafter.
typedef struct spec_env {
    const sd_model *target;
    const sd_model *drafts[SPEC_MAX_DRAFTS];  // (n_drafts) loaded draft models, shared
    int n_drafts;
    int n_ctx;        // KV length of draft sessions (tokens); 0 = their default
    int n_threads;    // threads of draft sessions; 0 = number of cores (unused with share_threads)
    const sd_session *share_threads;  // draft sessions run on this (the target's) session's threads, or NULL
    float p_min;      // chain/widths: no children below this top draft probability
    const char *datastore;  // ngram: corpus file for retrieval, or NULL
    // skip
    const char *skip_save;  // skip:auto: write the chosen set to this file, or NULL
    const char *skip_load;  // skip:auto: read the set from this file instead of searching, or NULL
    sd_skip_progress_fn skip_progress;  // skip:auto: search progress, or NULL
    void *skip_user;                    // for skip_progress
    // automatic trees (auto, tree:auto, ngram with tree_auto)
    const sd_cost_curve *cost;          // the target's measured cost curve (spec_measure_cost), or NULL
    sd_tree_auto_report_fn tree_report; // called when an automatic tree is chosen / changes, or NULL
    void *tree_user;                    // for tree_report
} spec_env;

// Parses a method string. Returns 0, or -1 with a message in err naming the
// accepted syntax ("chain:K with K in 1..64, got 'chain:x'").
int spec_method_parse(const char *s, spec_method *m, char *err, size_t errlen);

// Parses a comma-separated list of methods (at most max); "ar" is put first
// when it is missing. Returns the count, or -1 with a message.
int spec_methods_parse(const char *list, spec_method *ms, int max, char *err, size_t errlen);

// Builds the drafter of method m (*out = NULL for ar). With several draft
// models a model method gets one drafter per model, merged (SpecInfer).
// Returns 0, or -1 with a message (vocabulary mismatch, missing --draft, ...).
int spec_method_make(const spec_method *m, const spec_env *env, sd_drafter **out, char *err, size_t errlen);

// Work a method does once per program run rather than per drafter: for
// skip:auto the layer search (or --load-skip), whose result replaces
// m->skip_list so that every later spec_method_make reuses it (and writes
// env->skip_save). Prints nothing itself; *speedup (may be NULL) gets the
// search's estimate (0 when nothing was searched). Returns 0, or -1 with a
// message.
int spec_method_prepare(spec_method *m, const spec_env *env, double *speedup, char *err, size_t errlen);

// 1 if method m sizes its trees automatically (needs env->cost).
int spec_method_uses_auto(const spec_method *m);

// Measures the target's cost curve (ms per forward against tree nodes, up to
// max_nodes) on session s, whose cache must be empty (call before the prompt
// is evaluated): 3 timed forwards per point, the minimum kept (robust on a
// shared machine). Returns 0, or -1 with a message.
// Starts env the way every program does: zeroed, the target and its session
// (draft sessions run on the session's worker threads unless draft_threads >
// 0), the draft KV length of the session, p_min, and the skip search's
// progress printed on stderr (env->skip_user: a line prefix, or NULL).
void spec_env_init(spec_env *env, const sd_model *target, const sd_session *s, int n_drafts, int draft_threads,
                   float p_min);
// Progress of the layer-skip search as one line on stderr; user is a prefix or NULL.
void spec_print_skip_progress(void *user, const sd_skip_progress *pr);

int spec_measure_cost(sd_cost_curve *c, sd_session *s, int max_nodes, char *err, size_t errlen);

// The tree nodes a step of method m asks the verifier for by default: the
// tree of one draft times the number of draft models merged (merged trees are
// cut at this size), root included.
int spec_method_default_nodes(const spec_method *m, int n_drafts);

// The accepted syntax, for help texts.
const char *spec_methods_syntax(void);

// Parses "W1,W2,..." (sep ',') or "W1-W2-..." (sep '-') into at most max
// positive integers in [lo, hi]; flag names the option in messages:
// "--tree: expected comma-separated positive integers, got '4,x'".
// Returns the count, or -1 with a message in err.
int spec_parse_ints(const char *flag, const char *s, char sep, int *out, int max, int lo, int hi, char *err,
                    size_t errlen);

// Nodes of a full widths tree: 1 + w0 + w0*w1 + ... (saturates at 1 << 20).
int spec_widths_nodes(const int *w, int n);

#endif
