// suffix.h - suffix arrays over token ids, and the retrieval datastore built
// on one (REST-style drafting: a text corpus tokenized once, indexed, saved
// next to the corpus as CORPUS.sdsa and reused while the corpus and the
// tokenizer stay the same).
//
// Usage:
//   sd_datastore *ds;
//   if (sd_datastore_open(&ds, "corpus.txt", tok, err, sizeof err) < 0) ...  // builds or loads
//   printf("%s\n", ds->note);                  // "loaded corpus.txt.sdsa" / "rebuilt ...: reason"
//   int64_t lo, hi;  sd_sa_range(ds->tok, ds->n, ds->sa, pattern, m, &lo, &hi);
//   // ds->sa[lo..hi) are the corpus positions where pattern[0..m) occurs
//   sd_datastore_free(ds);
//
// File format (.sdsa, little-endian as written by this machine), version 1:
//   char magic[8] = "SDSAIDX\0"; u32 version; u32 n_vocab; u64 vocab_hash;
//   u64 corpus_size; i64 corpus_mtime; u64 corpus_hash; u64 n_tokens;
//   u64 payload_hash;  then int32 tokens[n_tokens], int32 sa[n_tokens].
// Any mismatch (magic, version, vocabulary, corpus, checksum, size) makes
// sd_datastore_load fail with a message saying which; sd_datastore_open
// then rebuilds the index and rewrites the file.
#ifndef SD_SUFFIX_H
#define SD_SUFFIX_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "specdec_spec.h"

#define SD_SDSA_VERSION 1

// Builds the suffix array of s[0..n): sa[r] = start of the r-th smallest
// suffix (a suffix that is a prefix of another sorts first). Prefix doubling
// with two counting-sort passes per round: O(n log n) time, 3n ints of work
// memory (allocated here). Token ids must be >= 0. Returns 0, or <0 with a
// message (negative token, out of memory).
int sd_sa_build(const int32_t *s, int64_t n, int32_t *sa, char *err, size_t errlen);

// Binary search: the suffixes starting with pat[0..m) occupy sa[*lo..*hi)
// (empty when *lo == *hi). O(m log n).
void sd_sa_range(const int32_t *s, int64_t n, const int32_t *sa, const int32_t *pat, int m, int64_t *lo,
                 int64_t *hi);

// What the index must agree with to be reused.
typedef struct sd_datastore_key {
    uint32_t n_vocab;       // tokenizer vocabulary size
    uint64_t vocab_hash;    // FNV-1a over all token strings (sd_vocab_hash)
    uint64_t corpus_size;   // bytes of the corpus file
    int64_t corpus_mtime;   // seconds since the epoch
    uint64_t corpus_hash;   // FNV-1a of the corpus bytes
} sd_datastore_key;

typedef struct sd_datastore {
    int64_t n;           // tokens in the corpus
    int32_t *tok;        // (n) corpus token ids
    int32_t *sa;         // (n) suffix array of tok
    sd_datastore_key key;
    int rebuilt;         // sd_datastore_open: 1 if the index was (re)built, 0 if loaded
    char note[512];      // sd_datastore_open: what happened, for the program to print
    atomic_int refs;     // holders (sd_datastore_ref); sd_datastore_free releases one
} sd_datastore;

// Fingerprint of a tokenizer: FNV-1a over n_vocab and every token string.
uint64_t sd_vocab_hash(const sd_tokenizer *t);

// Tokenizes the corpus file with tok (no BOS), or loads corpus.sdsa when it
// matches the corpus and tokenizer; otherwise builds the suffix array and
// writes corpus.sdsa (a write failure is not fatal: noted in ds->note).
// Returns 0 with *out set, or <0 with a message (corpus unreadable or
// empty, tokenizer failure, out of memory).
int sd_datastore_open(sd_datastore **out, const char *corpus_path, const sd_tokenizer *tok, char *err,
                      size_t errlen);

// Builds a datastore over given tokens (copied) with a given key (tests,
// pre-tokenized corpora).
int sd_datastore_from_tokens(sd_datastore **out, const int32_t *tok, int64_t n, const sd_datastore_key *key,
                             char *err, size_t errlen);
// Writes ds to path in the .sdsa format. Returns 0 or <0 with a message.
int sd_datastore_save(const sd_datastore *ds, const char *path, char *err, size_t errlen);
// Reads path and checks it against key (magic, version, vocabulary, corpus,
// size, checksum, token and index ranges). Returns 0 with *out set, or <0
// with a message naming the mismatch.
int sd_datastore_load(sd_datastore **out, const char *path, const sd_datastore_key *key, char *err,
                      size_t errlen);
// One more holder of ds (the n-gram drafters that share a datastore opened
// once); returns ds. Reading it from several threads is safe: it is never
// written after it is opened.
sd_datastore *sd_datastore_ref(sd_datastore *ds);

#endif
