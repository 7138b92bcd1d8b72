// unicode.h - internal: UTF-8 helpers and the Unicode classes the tokenizer's
// pre-tokenizers need (letters \p{L}, numbers \p{N}, white space \s).
// The class tables are generated (src/model/unicode_data.c, scripts/gen-unicode.py).
#ifndef SD_UNICODE_H
#define SD_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum sd_uclass {
    SD_UCLASS_OTHER = 0,   // everything else (punctuation, symbols, marks, controls, invalid bytes)
    SD_UCLASS_LETTER = 1,  // general category L*: Lu Ll Lt Lm Lo
    SD_UCLASS_NUMBER = 2,  // general category N*: Nd Nl No
    SD_UCLASS_SPACE = 3,   // Unicode White_Space property (what \s matches in the regex engines)
};

typedef struct {
    uint32_t lo, hi;  // code points, inclusive
    uint32_t cls;     // enum sd_uclass (LETTER or NUMBER)
} sd_urange;

extern const sd_urange sd_unicode_ranges[];  // (sd_unicode_n_ranges) sorted by lo
extern const int sd_unicode_n_ranges;
extern const unsigned char sd_unicode_latin1[256];  // enum sd_uclass of U+0000..U+00FF
extern const char sd_unicode_version[];      // Unicode version of the tables, e.g. "14.0.0"

// Code points >= SD_UTF8_INVALID_BASE stand for one byte of malformed UTF-8:
// SD_UTF8_INVALID_BASE + byte. Their class is OTHER.
#define SD_UTF8_INVALID_BASE 0x110000u

// Decodes the code point at s[0..len) (len >= 1). Returns the bytes consumed
// (1..4). Malformed input (bad lead byte, truncated or overlong sequence,
// surrogate, > U+10FFFF) consumes exactly one byte and gives
// SD_UTF8_INVALID_BASE + that byte, so every byte string decodes and
// re-encodes losslessly.
int sd_utf8_decode(const char *s, size_t len, uint32_t *cp);
// Writes the UTF-8 form of cp (< 0x110000) into out; returns 1..4. For an
// SD_UTF8_INVALID_BASE + b value it writes the single byte b.
int sd_utf8_encode(uint32_t cp, char out[4]);
// Length of the UTF-8 sequence introduced by lead byte c (1 for invalid leads).
int sd_utf8_len(unsigned char c);

// enum sd_uclass of cp. O(1) for code points < 256, binary search otherwise.
int sd_unicode_class(uint32_t cp);

#endif
