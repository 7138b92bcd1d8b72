// stoptext.h - a generated text as the user sees it (generate, the split
// client): the bytes of its tokens, stop strings (--stop), and what was
// emitted. A stop string ends the text where it starts: the tokens up to the
// one that completes it are kept (as the server's generation keeps them),
// their text is emitted only up to the match, and bytes that may begin a
// stop string are held back until the next tokens tell.
#ifndef SD_TOOLS_STOPTEXT_H
#define SD_TOOLS_STOPTEXT_H

#include <stdint.h>

#include "specdec.h"

#define TX_MAX_STOP 16       // stop strings (the server's SV_MAX_STOP)
#define TX_STOP_MAX_LEN 256  // bytes per stop string

// How the text comes out, in order. The text is the concatenation of every
// emit (and emit_part), less what each retract takes back (from its end,
// counted in emitted tokens).
typedef struct tx_sink {
    void *user;
    void (*emit)(void *user, const int32_t *tokens, int n, int verified);
    // the last token's text only up to n_bytes: a stop string starts there (nothing follows)
    void (*emit_part)(void *user, int32_t token, int n_bytes, int verified);
    void (*retract)(void *user, int n_tokens, const char *why);   // the last n tokens were replaced
    void (*note)(void *user, const char *line);                   // a line for the user (stderr)
} tx_sink;

typedef struct tx_text tx_text;

// stops[0 .. n_stop): copied (empty ones ignored). n_ctx: the text's most tokens.
int tx_text_new(tx_text **out, const sd_tokenizer *tok, int n_ctx, const char *const *stops, int n_stop, char *err,
                size_t errlen);
void tx_text_free(tx_text *t);
// A new text whose first n_prompt tokens are the prompt (never emitted).
void tx_text_reset(tx_text *t, int n_prompt);
// The text was cut to its first n tokens: the emitted ones beyond are
// retracted through sink (why: a line for the user).
void tx_text_cut(tx_text *t, int n, const char *why, const tx_sink *sink);
// After the text grew: text[0 .. n), its first nv tokens verified. Looks
// for a stop string (the first one wins), emits through sink what is safe
// (all of it with final), and returns the tokens to keep: n, or fewer when a
// stop string matched (*stopped 1: the caller cuts its text there).
int tx_text_sync(tx_text *t, const int32_t *text, int n, int nv, int final, const tx_sink *sink,
                 int *stopped);
// Tokens emitted so far (prompt included); the final text's bytes when a stop
// string ended it (its start), else -1.
int tx_text_n_out(const tx_text *t);
long tx_text_stop_bytes(const tx_text *t);

#endif
