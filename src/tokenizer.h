// tokenizer.h - internal: building the tokenizer from GGUF metadata.
// The struct sd_tokenizer is private to tokenizer.c; the public calls are in
// include/specdec.h (sd_tokenize, sd_token_to_piece, sd_chat_format, ...).
#ifndef SD_TOKENIZER_H
#define SD_TOKENIZER_H

#include "../include/specdec.h"
#include "gguf.h"

// Builds the tokenizer described by tokenizer.ggml.* (model "llama" =
// SentencePiece-style with scores and byte fallback, or "gpt2" = byte-level
// BPE with merges and a pre-tokenizer chosen by tokenizer.ggml.pre) and
// tokenizer.chat_template. Strings are copied: the result does not depend on g.
int sd_tokenizer_load(sd_tokenizer **out, const sd_gguf *g, char *err, size_t errlen);
void sd_tokenizer_free(sd_tokenizer *t);

#endif
