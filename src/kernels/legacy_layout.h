// legacy_layout.h - private to the legacy-quant kernels (kernels_x86.c,
// kernels_avx2.c): the facts about the file blocks of Q4_0, Q4_1, Q5_0, Q5_1
// and Q8_0 that both panel paths need, and the packed activation block
// (xblock) both read. The panel layouts themselves differ (16 rows in 512-bit
// vectors, 8 rows in 256-bit ones) and stay in their files.
#ifndef SD_LEGACY_LAYOUT_H
#define SD_LEGACY_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"

// Bytes of a file block.
static inline size_t w_tsize(int type) {
    switch (type) {
    case SD_TYPE_Q4_0: return sizeof(sd_block_q4_0);
    case SD_TYPE_Q4_1: return sizeof(sd_block_q4_1);
    case SD_TYPE_Q5_0: return sizeof(sd_block_q5_0);
    case SD_TYPE_Q5_1: return sizeof(sd_block_q5_1);
    default: return sizeof(sd_block_q8_0);
    }
}
// 1 for the types with a min (their activations carry s = d * sum(qs)).
static inline int w_has_min(int type) { return type == SD_TYPE_Q4_1 || type == SD_TYPE_Q5_1; }
// Where the quant bytes start inside a file block.
static inline size_t w_qoff(int type) {
    return type == SD_TYPE_Q4_0 ? 2 : type == SD_TYPE_Q4_1 ? 4 : type == SD_TYPE_Q5_0 ? 6 : type == SD_TYPE_Q5_1 ? 8 : 2;
}
// Where qh (the fifth bits) starts inside a Q5 file block.
static inline size_t w_hoff(int type) { return type == SD_TYPE_Q5_0 ? 2 : 4; }

// One packed activation block of 32 (40 bytes): the scale d, then s or a0,
// then the 32 signed quant bytes (see each file's "activation layout").
typedef struct {
    float d;
    union {
        float s;    // types with a min: d * sum(qs)
        int32_t a0; // offset types: -offset * sum(qs)
    } u;
    int8_t qs[SD_QK];
} xblock;

#endif
