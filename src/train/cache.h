// cache.h - internal: the feature cache of head training. The target runs
// once over every record of the training corpus (train/corpus.h); what the
// head trainer reads per position (the token, the target's states, the
// target's top-k next-token distribution) is stored on disk, so epochs do
// not re-run the target. docs/heads.md ("Training") describes the format.
//
// A cache is a directory:
//   header.bin   the fingerprint: magic "SDFCACHE", version, target (vocab
//                hash, n_vocab, n_embd, n_layer), head type, extract layers,
//                topk, n_feat, window; written once (tmp + rename)
//   index.bin    one 48-byte entry per sequence (a window of a record), with
//                its own checksum; a record's entries are appended after its data
//   tokens.bin   int32 per position
//   top_ids.bin  int32 x topk per position: the target's top-k next tokens, best first
//   top_p.bin    F16 x topk per position: their softmax probabilities renormalised over the top-k
//   feats.bin    F16 x n_feat per position: EAGLE-3 [s_l0; s_l1; s_l2] (3d), Medusa the final normed state (d),
//                MoA (no LSA, TLI up to N) [the layers' mean K,V row | the K,V rows of layers L-N..L-1
//                ((1 + N) Ekv) | the states entering layers L-N..L-1 | the final normed state ((N + 1) d)],
//                the K rows as the target's cache holds them (RoPE at the window's positions)
// The data files are append-only. Opening cuts a torn tail (a partial index
// entry, the entries of an unfinished record, data past the last finished
// record, a last record whose data checksum fails), so a build killed at any
// point resumes after its last complete record.
#ifndef SD_TRAIN_CACHE_H
#define SD_TRAIN_CACHE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "specdec.h"

#define SD_CACHE_VERSION 1
#define SD_CACHE_MAX_TOPK 32
#define SD_CACHE_MAX_MOA_TLI 2

// What the cache is for (all of it is in the header; a directory made with
// other values is refused).
typedef struct sd_cache_params {
    int type;                 // SD_HEAD_EAGLE3, SD_HEAD_MEDUSA or SD_HEAD_MOA (head/head.h)
    int extract[3];           // EAGLE-3: the target layers fused (sd_batch.hidden_layers); ignored otherwise
    int moa_tli;              // MoA: the TLI layers whose rows and states are kept, 0..SD_CACHE_MAX_MOA_TLI
                              // (an existing cache that keeps more serves as well)
    int topk;                 // target distribution entries kept per position, 1..SD_CACHE_MAX_TOPK; default 8
    int n_ctx;                // window: longest run of the target; longer records are split; default 2048
                              // (at most the target's n_ctx_train)
} sd_cache_params;
sd_cache_params sd_cache_default_params(void);

// One sequence of the cache: a window of a record.
typedef struct sd_cache_seq {
    uint64_t pos0;            // first position (index into the data files)
    int32_t T;                // positions (0 for a record too short to give any)
    uint32_t record;          // ordinal of the record in the data (over all files, from 0)
    uint32_t window;          // window of the record, from 0; bit 31 set on its last window
    uint32_t pad;
    uint64_t rec_hash;        // FNV-1a of the record's JSON line (checks the data on a resumed build)
    uint64_t data_hash;       // hash of the sequence's bytes in the four data files
    uint64_t entry_hash;      // hash of the fields above
} sd_cache_seq;
#define SD_CACHE_LAST_WINDOW 0x80000000u

typedef struct sd_cache sd_cache;

// Opens the cache directory dir for target m, creating it (and its header)
// when absent or empty. An existing cache must match m (vocabulary
// fingerprint, n_vocab, n_embd, n_layer) and p (type, extract layers, topk,
// window), else <0 with a message naming what differs. A torn tail is cut
// (files truncated); note receives what was done ("" or "cut a torn tail:
// ..."). Returns 0 or <0.
int sd_cache_open(sd_cache **out, const char *dir, const sd_model *m, const sd_cache_params *p, char *note,
                  size_t notelen, char *err, size_t errlen);
void sd_cache_close(sd_cache *c);

// Progress of a build: called after each record (and at the start), and
// after each forward inside a record.
typedef struct sd_cache_progress {
    int64_t records, records_total;   // records cached (old and new), records in the data
    int64_t tokens_new;               // positions computed by this build so far
    int64_t tokens;                   // positions in the cache (the record being cached: those done)
    int64_t rec_tokens, rec_done;     // the record being cached: its positions, those done (0, 0 between records)
    double ms;                        // wall time of this build so far
} sd_cache_progress;
typedef void (*sd_cache_progress_fn)(void *user, const sd_cache_progress *p);

typedef struct sd_cache_build_params {
    int n_batch;              // tokens per target forward (prompt-style, 8-bit path); default 256
    sd_threadpool *pool;      // threads of the target's forwards (NULL: one)
    volatile sig_atomic_t *stop;  // nonzero: stop after the current forward (the cache stays consistent; the
                                  // finished windows of a record are kept and the next build goes on after them)
    sd_cache_progress_fn progress;
    void *user;
} sd_cache_build_params;

// Extends the cache with the records of paths[0..n_paths) (in order) it does
// not hold yet. The records it holds are checked against the data (their
// lines' hashes): a cache made from other data is refused. Returns 1 if
// stopped by the stop flag, 0 when every record is cached, <0 with a message
// (an unreadable file, a bad JSON line as FILE:LINE, a chat record for a
// model without a chat template, a write error: the cache keeps its complete
// records).
int sd_cache_build(sd_cache *c, const sd_model *m, const char *const *paths, int n_paths,
                   const sd_cache_build_params *bp, char *err, size_t errlen);

// The sequences (index entries) and their count; totals.
const sd_cache_seq *sd_cache_seqs(const sd_cache *c, int64_t *n);
int64_t sd_cache_n_records(const sd_cache *c);
int64_t sd_cache_n_positions(const sd_cache *c);
int sd_cache_n_feat(const sd_cache *c);
int sd_cache_topk(const sd_cache *c);

// Reads positions [off, off + T) of sequence seq: tokens (T), feats (T,
// n_feat) as floats, top_ids (T, topk), top_p (T, topk); any pointer may be
// NULL (not read). Returns 0, or <0 with a message (range, I/O).
int sd_cache_read(sd_cache *c, int64_t seq, int off, int T, int32_t *tokens, float *feats, int32_t *top_ids,
                  float *top_p, char *err, size_t errlen);

// Adds, for every position of the sequences seqs[0..n) (NULL: all), 1 to
// counts[the target's argmax there] (counts: n_vocab entries, not zeroed
// here). Returns 0 or <0.
int sd_cache_argmax_counts(sd_cache *c, const int64_t *seqs, int64_t n, int64_t *counts, char *err, size_t errlen);

#endif
