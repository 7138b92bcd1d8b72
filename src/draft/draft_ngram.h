// draft_ngram.h - the prompt-lookup / retrieval drafter (no draft model).
//
// Usage (CLI `--draft-ngram N,K [--datastore FILE]`, bench method `ngram:N-K`):
//
//   sd_draft_ngram_params np = sd_draft_ngram_default_params();
//   np.n_max = N;  np.k_max = K;            // from "N,K" / "N-K"
//   np.datastore = path_or_NULL;            // --datastore FILE (indexed to FILE.sdsa on first use)
//   sd_drafter *d;
//   if (sd_draft_ngram_new(&d, &np, sd_model_tokenizer(target), err, sizeof err) < 0) { print err; fail }
//   if (np.datastore) puts(sd_draft_ngram_note(d));   // "datastore: loaded ..." / "indexed ..."
//   sd_generate(session, sampler, d, prompt, n_prompt, &gp, cb, user, &stats, err, sizeof err);
//   sd_drafter_free(d);
//
// tok may be NULL when no datastore is used. The drafter can be combined with
// a draft model through sd_draft_merge_new (draft_merge.h).
//
// What it proposes at each step: the last n tokens of the committed text
// (n = n_max down to 1, the first n with an earlier occurrence wins) are
// looked up in an incremental hash index of the whole committed text (prompt
// and generated tokens, the final position itself excluded); the up to
// max_matches most recent occurrences give continuations of up to k_max
// tokens. With a datastore, the longest suffix of the text (up to n_max
// tokens) found in the corpus's suffix array gives up to ds_max_matches more
// continuations. All continuations go into one trie weighted by frequency
// (context matches weigh ctx_weight, corpus matches 1); the tree keeps the
// heaviest trie nodes first (ties: most recent match first), at most
// max_branches distinct continuations and at most the step's node limit.
// That is the SD_NGRAM_FILL sizing; the default, SD_NGRAM_SIZED, uses every
// n (each match's length measured), and keeps only the nodes whose estimated
// probability of acceptance pays for their verification under the target's
// cost curve (draft_ngram.c explains it). Children are deterministic
// (SD_CHILDREN_ANY), so stochastic verification stays lossless.
#ifndef SD_DRAFT_NGRAM_H
#define SD_DRAFT_NGRAM_H

#include "draft/drafter.h"
#include "draft/draft_auto.h"   // sd_draft_auto_params

#define SD_NGRAM_MAX_N 16   // largest n_max

typedef struct sd_draft_ngram_params {
    int n_max;            // N: longest n-gram matched (1..SD_NGRAM_MAX_N); default 3
    int k_max;            // K: most tokens of one continuation; default 8
    int max_branches;     // most distinct continuations in one tree; default 4 (1 = a chain)
    int max_matches;      // context occurrences examined per step (most recent first); default 16
    int ctx_weight;       // SD_NGRAM_FILL: weight of a context match in the trie (a corpus match
                          // weighs 1); default 2. (SD_NGRAM_SIZED weighs matches by their length.)
    int n_ctx;            // committed tokens the index is sized for up front (grows by doubling); default 4096
    const char *datastore;  // corpus text file for retrieval, or NULL (default); its index is FILE.sdsa
    sd_datastore *ds_shared; // a datastore already opened, shared (a reference is taken); datastore is then not read
    int ds_max_matches;   // corpus occurrences used per step (spread over the match range); default 32
    int ds_min_n;         // shortest corpus match used; default 1
    // Automatic tree sizing (draft_auto.h, tree_sizer.h), default off. With SD_NGRAM_SIZED:
    // the per-step sizer uses tree_auto.cost (the target's measured curve,
    // refined online from timed steps) instead of the built-in relative
    // curve, trees stay within tree_auto.max_nodes and depth
    // min(k_max, tree_auto.max_depth), and tree_auto.report is called once
    // at creation with the chain drafted after a fresh n_max-token match (the
    // representative choice; the tree varies per step). With SD_NGRAM_FILL:
    // each step's tree is capped to the node count and depth of the Sequoia
    // shape chosen from this drafter's acceptance statistics by depth and rank
    // and the cost curve (instead of max_branches x k_max).
    sd_draft_auto_params tree_auto;
    // How much to draft (added with the per-step sizing; see the top of
    // draft_ngram.c). SD_NGRAM_SIZED (default): every candidate node gets the
    // probability that its path is accepted (from the length of the matched
    // context, learnt online per length class, and its share of the
    // matches), and the step keeps the nodes that pay for their verification
    // (tree_sizer.h) under the target's cost curve:
    // tree_auto.cost when tree_auto.on (measured, refined online), else a
    // typical relative curve. SD_NGRAM_FILL: every step fills the tree up to
    // max_branches continuations of k_max tokens and the node limit (with
    // tree_auto.on, capped to the Sequoia shape of sd_draft_auto).
    int sizing;
} sd_draft_ngram_params;

enum { SD_NGRAM_SIZED = 0, SD_NGRAM_FILL = 1 };

sd_draft_ngram_params sd_draft_ngram_default_params(void);

// Creates the n-gram drafter. With p->datastore, opens (builds or loads) the
// corpus index with tok (required then). Returns 0 with *out set, or <0 with
// a message (bad parameters, datastore errors, out of memory).
int sd_draft_ngram_new(sd_drafter **out, const sd_draft_ngram_params *p, const sd_tokenizer *tok, char *err,
                       size_t errlen);

// What happened to the datastore ("" without one): loaded or (re)built and why.
const char *sd_draft_ngram_note(const sd_drafter *d);

// Inspection for tests and tools (d must be an n-gram drafter): the n that
// matched at the last propose (0: none), and the number of context
// continuations and corpus continuations it used.
void sd_draft_ngram_last(const sd_drafter *d, int *n_matched, int *n_ctx_matches, int *n_ds_matches);

#endif
