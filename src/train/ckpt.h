// ckpt.h - internal: checkpoints of head training (train/loop.c). One file
// holds everything a run needs to continue bit for bit: the head (its
// hyper-parameters, draft vocabulary and parameters), the AdamW moments and
// step, the loop's position (step, epoch, data cursor, the shuffling RNG as
// of the epoch's start) and the recipe the run was started with.
//
// File (little-endian, as this machine writes it): a fixed header
// (magic "SDHCKPT\0", version, the head's hyper-parameters and target, the
// recipe, the state), then int32 d2t[n_draft_vocab], float w[n_w],
// m[n_w], v[n_w], then a u64 checksum of all that. Written to PATH.tmp,
// synced and renamed over PATH (house rule 15): a full disk or a crash
// leaves the previous checkpoint intact.
#ifndef SD_TRAIN_CKPT_H
#define SD_TRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "head/head.h"
#include "train/train.h"

#define SD_CKPT_VERSION 1

// What a resumed run must share with the run that wrote the checkpoint.
typedef struct sd_ckpt_recipe {
    int32_t type, draft_vocab, ttt_steps, n_medusa, seq_len, batch, topk, n_ctx;
    int32_t extract[3];
    int16_t moa_block;        // MoA: the block length's range, min | max << 8 (0 in older files: 6..15)
    int16_t score_answers;    // --score answers (0 in older files, where this was moa_block's high half)
    uint64_t seed;
    float lr, weight_decay, clip, heldout;
    int64_t warmup, n_steps;
    int64_t cache_records, cache_positions;   // the data the run trains on
} sd_ckpt_recipe;

// Where the run stands.
typedef struct sd_ckpt_state {
    int64_t step;             // optimiser steps taken
    int64_t epoch;            // current pass over the training sequences, from 0
    int64_t cursor;           // next index into the epoch's shuffled order
    int64_t tokens;           // training positions consumed so far
    uint64_t rng_epoch[4];    // the shuffling RNG as of the current epoch's start (its order is redrawn from it)
    double seconds;           // training wall time so far (s), for the head's note
    int32_t n_threads;        // threads of the run (the results are bit-identical for the same count)
    int32_t pad;
} sd_ckpt_state;

// Writes the checkpoint (PATH.tmp, fsync, rename). h, o (moments of h->n_w
// floats, o->t), r and s as described. Returns 0, or <0 with a message; on
// error the file at path is untouched and PATH.tmp removed.
int sd_ckpt_save(const char *path, const sd_head *h, const sd_adamw *o, const sd_ckpt_recipe *r,
                 const sd_ckpt_state *s, char *err, size_t errlen);
// Reads a checkpoint for target m: *h (new head; free with sd_head_free),
// o (sd_adamw_init'ed here for h->n_w; the caller sets lr etc. and frees it),
// r, s. Refuses a checkpoint of another target (naming what differs), a
// truncated or corrupted file (checksum), another version. Returns 0 or <0.
int sd_ckpt_load(const char *path, const sd_model *m, sd_head **h, sd_adamw *o, sd_ckpt_recipe *r, sd_ckpt_state *s,
                 char *err, size_t errlen);

#endif
