// common.h - small shared helpers for the specdec library (internal).
// Error convention (docs/house-rules.md, rule 4): library functions return 0 on success and
// a negative value on error, writing a human-readable message into a caller
// buffer (err, errlen). The library never prints and never exits.
#ifndef SD_COMMON_H
#define SD_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Writes a formatted message into err (if non-NULL) and returns -1, so that
// error paths read `return sd_err(err, errlen, "bad key '%s'", k);`.
int sd_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// As sd_err, returning code (one of the negative sd_status values of
// include/specdec.h) instead of -1.
int sd_errc(int code, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// Internal invariant check: names file and line, then aborts. Used only for
// programming errors, never for bad input (bad input returns an error).
#define SD_ASSERT(c)                                                          \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "specdec: assertion failed: %s (%s:%d)\n", #c,   \
                    __FILE__, __LINE__);                                      \
            abort();                                                          \
        }                                                                     \
    } while (0)

// Monotonic wall clock in milliseconds.
double sd_time_ms(void);

// fp16 / bf16 <-> fp32 conversions (exact, scalar).
float sd_fp16_to_fp32(uint16_t h);
uint16_t sd_fp32_to_fp16(float f);
float sd_bf16_to_fp32(uint16_t h);
uint16_t sd_fp32_to_bf16(float f);

// Little-endian loads from possibly unaligned bytes (file blocks).
static inline uint16_t sd_ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t sd_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t sd_ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

#define SD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SD_MAX(a, b) ((a) > (b) ? (a) : (b))

// A small seeded random number generator (xoshiro256**, seeded through
// splitmix64): the sampler's draws and each drafter's own randomness.
typedef struct sd_rng {
    uint64_t s[4];   // state
} sd_rng;
void sd_rng_seed(sd_rng *r, uint64_t seed);
uint64_t sd_rng_next(sd_rng *r);
// Uniform double in [0, 1) (53 bits).
double sd_rng_uniform(sd_rng *r);
// A seed derived from seed and a stream number (different streams of one
// seed are independent for practical purposes).
uint64_t sd_rng_derive(uint64_t seed, uint64_t stream);

// One pause in a spin-wait loop (lets the other hyperthread run; none
// outside x86).
#if defined(__x86_64__) || defined(__i386__)
#define SD_CPU_RELAX() __builtin_ia32_pause()
#else
#define SD_CPU_RELAX() ((void)0)
#endif

#endif
