// text.h - the client's text as the user sees it (docs/split.md): the bytes
// of the generated tokens, stop strings (--stop), and what was emitted. A
// stop string ends the text where it starts: the tokens up to the one that
// completes it are kept (as the server's generation keeps them), their text
// is emitted only up to the match, and bytes that may begin a stop string
// are held back until the next tokens tell.
#ifndef SD_CLIENT_TEXT_H
#define SD_CLIENT_TEXT_H

#include <stdint.h>

#include "specdec.h"

#define CL_MAX_STOP 16       // stop strings (the server's SV_MAX_STOP)
#define CL_STOP_MAX_LEN 256  // bytes per stop string

struct cl_sink;
typedef struct cl_text cl_text;

// stops[0 .. n_stop): copied (empty ones ignored). n_ctx: the text's most tokens.
int cl_text_new(cl_text **out, const sd_tokenizer *tok, int n_ctx, const char *const *stops, int n_stop, char *err,
                size_t errlen);
void cl_text_free(cl_text *t);
// A new text whose first n_prompt tokens are the prompt (never emitted).
void cl_text_reset(cl_text *t, int n_prompt);
// The text was cut to its first n tokens: the emitted ones beyond are
// retracted through sink (why: a line for the user).
void cl_text_cut(cl_text *t, int n, const char *why, const struct cl_sink *sink);
// After the text grew: text[0 .. n), its first nv tokens verified. Looks
// for a stop string (the first one wins), emits through sink what is safe
// (all of it with final), and returns the tokens to keep: n, or fewer when a
// stop string matched (*stopped 1: the caller cuts its text there).
int cl_text_sync(cl_text *t, const int32_t *text, int n, int nv, int final, const struct cl_sink *sink,
                 int *stopped);
// Tokens emitted so far (prompt included); the final text's bytes when a stop
// string ended it (its start), else -1.
int cl_text_n_out(const cl_text *t);
long cl_text_stop_bytes(const cl_text *t);

#endif
