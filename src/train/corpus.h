// corpus.h - internal: the training corpus of `specdec train-head`, JSON
// lines, one record per line (blank lines are skipped):
//   {"id": "...", "source": "...", "messages": [{"role": "user", "content": "..."}, ...]}
//   {"id": "...", "source": "...", "text": "..."}
// A chat record is tokenized in the target's chat template
// (sd_chat_tokenize_messages: the template's markers as special tokens, the
// contents as plain text); a text record is tokenized as plain text (BOS
// added when the vocabulary asks for it). Other keys (id, source, anything
// else) are read over and ignored. A small JSON reader of its own: every
// string escape (\uXXXX with surrogate pairs), numbers, literals, nested
// arrays and objects; strings must be well-formed UTF-8 (as the server's
// JSON reader requires), and a UTF-8 byte order mark at the start of the
// file is skipped (columns count from after it).
#ifndef SD_TRAIN_CORPUS_H
#define SD_TRAIN_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#define SD_CORPUS_MAX_MSG 4096   // most messages of one record

// One record, valid until the next sd_corpus_next or sd_corpus_close (its
// strings live in the reader's buffers).
typedef struct sd_corpus_rec {
    int line;                 // 1-based line of the file
    uint64_t hash;            // FNV-1a 64 of the line's bytes (newline excluded)
    int parsed;               // 0: only line and hash are set (sd_corpus_next with parse = 0)
    const char *text;         // text record: the text (NUL-terminated); NULL for a chat record
    int n_msg;                // chat record: messages (>= 1); 0 for a text record
    const char *const *roles;     // (n_msg) "system", "user", "assistant" as written
    const char *const *contents;  // (n_msg)
} sd_corpus_rec;

typedef struct sd_corpus sd_corpus;

// Opens path for reading. Returns 0, or <0 with a message naming the file
// (missing, unreadable, a directory).
int sd_corpus_open(sd_corpus **out, const char *path, char *err, size_t errlen);
void sd_corpus_close(sd_corpus *c);
// Reads the next non-blank line into rec; parse = 0 skips the JSON parse
// (only line and hash: a resumed cache build passing over records it has).
// Returns 1 (a record), 0 (end of file), or <0 with a message
// "FILE:LINE: what is wrong" (bad JSON with its column, a record with neither
// "text" nor "messages", a message without a string role or content, ...).
int sd_corpus_next(sd_corpus *c, sd_corpus_rec *rec, int parse, char *err, size_t errlen);
// Non-blank lines of path (for progress), or <0 with a message.
int64_t sd_corpus_count(const char *path, char *err, size_t errlen);

// FNV-1a 64 over bytes, continuing from h (start with SD_FNV_OFF).
#define SD_FNV_OFF 1469598103934665603ull
static inline uint64_t sd_fnv64(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

#endif
