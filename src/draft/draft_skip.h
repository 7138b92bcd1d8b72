// draft_skip.h - self-speculative drafting by layer skipping (Draft & Verify,
// SWIFT): the draft is the target model itself with a set of layers skipped.
// It shares the target's weights (the same sd_model; no second copy), runs in
// a session of its own (see the KV note in draft_skip.c) and is otherwise the
// draft-model drafter (draft_model.h), with adaptive drafting on by default.
// The skip set comes from a list, a file, or the search of skip_search.h.
//
// Usage:
//   uint8_t skip[n_layer];
//   sd_skip_parse("3,5,7-9", n_layer, skip, err, sizeof err);       // or sd_skip_load / sd_skip_search
//   sd_draft_model_params dp = sd_draft_skip_default_params();
//   sd_drafter *d;  sd_draft_skip_new(&d, target, skip, &dp, err, sizeof err);
//   sd_generate(session, sampler, d, ...);
//   sd_drafter_free(d);
#ifndef SD_DRAFT_SKIP_H
#define SD_DRAFT_SKIP_H

#include <stddef.h>
#include <stdint.h>

#include "draft/draft_model.h"

// Draft-model parameters suited to a skip drafter: chain of up to k = 8
// tokens, adaptive p_min starting at 0.4 (see sd_draft_adapt_p_min).
sd_draft_model_params sd_draft_skip_default_params(void);

// Creates the skip drafter: a draft-model drafter whose draft model is target
// (shared, not owned; it must outlive the drafter) with the layers skip[l] != 0
// skipped (skip has target n_layer bytes; copied). p == NULL: the defaults
// above; p->layer_skip is ignored (skip is used). Fails if skip is NULL or
// skips every layer.
int sd_draft_skip_new(sd_drafter **out, const sd_model *target, const uint8_t *skip,
                      const sd_draft_model_params *p, char *err, size_t errlen);

// Parses a layer list "L1,L2,..." where an item may be a range "A-B"
// (inclusive); spaces are ignored; "" or "none" is the empty set. Layers are
// 0-based and must be < n_layer. Fills skip (n_layer bytes, 0/1). Returns the
// number of skipped layers, <0 with a message (bad syntax, out of range, all
// layers skipped).
int sd_skip_parse(const char *spec, int n_layer, uint8_t *skip, char *err, size_t errlen);

// Writes skip as a sorted list "1,4,7" (ranges are not folded), "none" when
// empty, NUL-terminated. Returns the length needed (excluding the NUL; the
// output is truncated when it is >= size).
int sd_skip_format(const uint8_t *skip, int n_layer, char *buf, size_t size);

// ------------------------------------------------------------ files
// A tiny text format, one key per line ('#' starts a comment line):
//   specdec-skip 1
//   model <general.name of the model, may be empty>
//   n_layer <n>
//   skip <list as sd_skip_format writes it>
// sd_skip_save writes it for model m. sd_skip_load reads it, checks that
// n_layer (and the model name, when both are non-empty) match m and fills
// skip (m's n_layer bytes). Both return the number of skipped layers, <0 with
// a message naming the file (and line) on any error.
int sd_skip_save(const char *path, const sd_model *m, const uint8_t *skip, char *err, size_t errlen);
int sd_skip_load(const char *path, const sd_model *m, uint8_t *skip, char *err, size_t errlen);

#endif
