// cache_impl.h - private to train/cache.c and train/cache_build.c: the
// cache's in-memory state and on-disk header.
#ifndef SD_TRAIN_CACHE_IMPL_H
#define SD_TRAIN_CACHE_IMPL_H

#include <stdint.h>

#include "train/cache.h"

enum { CACHE_TOK = 0, CACHE_IDS, CACHE_P, CACHE_FEAT, CACHE_N_FILES };

// header.bin (little-endian, as this machine writes it).
typedef struct cache_hdr {
    char magic[8];            // "SDFCACHE"
    uint32_t version;         // SD_CACHE_VERSION
    uint32_t type;            // SD_HEAD_EAGLE3 / SD_HEAD_MEDUSA
    uint64_t vocab_hash;      // sd_head_vocab_hash of the target
    int32_t n_vocab, n_embd, n_layer;
    int32_t n_extract;        // entries of sd_batch.hidden_layers: 3 (EAGLE-3) or 1 (Medusa: SD_HIDDEN_NORM)
    int32_t extract[3];
    int32_t topk;
    int32_t n_feat;           // floats of state per position (3d or d)
    int32_t n_ctx;            // window
    uint64_t hash;            // FNV-1a of the bytes above
} cache_hdr;

struct sd_cache {
    char dir[4096];
    cache_hdr hdr;
    int fd_index;             // index.bin
    int fd[CACHE_N_FILES];    // tokens, top_ids, top_p, feats
    sd_cache_seq *seq;        // (cap) index entries; n_seq used
    int64_t n_seq, cap;
    int64_t n_pos;            // positions in the data files (sum of T)
    int64_t n_rec;            // complete records
    // The windows done of an unfinished record (a stop or a crash inside a
    // long record): entries seq[n_seq .. n_seq + n_part), data after n_pos.
    // Readers see only the complete records; the build goes on from there.
    int64_t n_part, part_pos;
    uint16_t *f16;            // (f16_cap bytes) read buffer of F16 rows
    size_t f16_cap;
};

size_t cache_row_bytes(const sd_cache *c, int f);
uint64_t cache_entry_hash(const sd_cache_seq *e);
// pread / pwrite all n bytes (retrying short transfers); 0 or -1 with errno.
int cache_pread(int fd, void *buf, size_t n, int64_t off);
int cache_pwrite(int fd, const void *buf, size_t n, int64_t off);

#endif
