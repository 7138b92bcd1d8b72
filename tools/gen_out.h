// gen_out.h - generate's text on its way out: streamed to stdout as complete
// UTF-8 characters, or collected for --json; stop strings (--stop) end it
// where the first one starts (stoptext.h), holding back bytes that may begin
// one until the next tokens tell.
#ifndef SD_TOOLS_GEN_OUT_H
#define SD_TOOLS_GEN_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "stoptext.h"

typedef struct gen_out {
    const sd_tokenizer *tok;
    int json;         // 1: collect text, 0: stream to stdout
    char *text;       // (cap) emitted bytes (json) or pending partial UTF-8 (stream)
    size_t len, cap;  // bytes used / allocated
    char *piece;      // (piece_cap) scratch for one token's text
    int piece_cap;
    int oom;          // an allocation failed: text is incomplete
    tx_text *tx;      // the stop strings' matcher, or NULL without --stop
    int32_t *toks;    // (n_toks) the generated tokens (with --stop)
    int n_toks, cap_toks;
    int stopped;      // a stop string ended the text
} gen_out;

// stops[0 .. n_stop) (none: no matching, tokens go straight out); n_ctx: the
// most tokens a generation has. 0, or -1 with err.
int gen_out_init(gen_out *o, const sd_tokenizer *tok, int json, const char *const *stops, int n_stop, int n_ctx,
                 char *err, size_t errlen);
// One generated token (sd_token_cb's order): 1 when a stop string ended the
// text (the generation stops after this token), else 0.
int gen_out_token(gen_out *o, int32_t t);
// The end: what was held back for a stop string that never came goes out.
void gen_out_finish(gen_out *o);
void gen_out_free(gen_out *o);

#endif
