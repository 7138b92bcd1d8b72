// tokenizer.h - internal: building the tokenizer from GGUF metadata.
// The struct sd_tokenizer is private to the tokenizer files (tokenizer_impl.h);
// the public calls are in include/specdec.h (sd_tokenize, sd_token_to_piece,
// sd_chat_format, ...).
#ifndef SD_TOKENIZER_H
#define SD_TOKENIZER_H

#include "specdec.h"
#include "model/gguf.h"

// Builds the tokenizer described by tokenizer.ggml.* (model "llama" =
// SentencePiece-style with scores and byte fallback, or "gpt2" = byte-level
// BPE with merges and a pre-tokenizer chosen by tokenizer.ggml.pre) and
// tokenizer.chat_template. Strings are copied: the result does not depend on g.
int sd_tokenizer_load(sd_tokenizer **out, const sd_gguf *g, char *err, size_t errlen);
void sd_tokenizer_free(sd_tokenizer *t);

// Pre-tokenizer of a byte-level BPE vocabulary (tokenizer.ggml.pre): the
// split of text into the pieces that are merged independently. pre_type is
// "smollm", "qwen2", "llama-bpe", "gpt2" or "default"; anything else is an
// error naming it. Writes the first max pieces as byte ranges
// (starts[i], lens[i]) and returns the number of pieces (may exceed max), <0
// on error. Exposed for tests against the reference regexes.
int sd_pretokenize(const char *pre_type, const char *text, size_t len, size_t *starts, size_t *lens,
                   int max, char *err, size_t errlen);
// Internal pre-tokenizer number of a tokenizer.ggml.pre name, -1 if unknown.
int sd_pretokenizer_kind(const char *name);

#endif
