// utf8.c - UTF-8 boundaries for the programs' text output (utf8.h).
#include "utf8.h"

// Length of the UTF-8 sequence starting with lead byte c (0: invalid lead).
static int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

// Bytes of the valid UTF-8 character at s (n bytes available): 0 if invalid,
// -1 if valid so far but incomplete.
int utf8_char(const unsigned char *s, size_t n) {
    int L = utf8_len(s[0]);
    if (L == 0) return 0;
    for (int k = 1; k < L; k++) {
        if ((size_t)k >= n) return -1;
        if ((s[k] & 0xC0) != 0x80) return 0;
    }
    if (L == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
    if (L == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))) return 0;
    return L;
}

size_t utf8_complete(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        int L = utf8_char(s + i, n - i);
        if (L < 0) break;      // incomplete at the end: hold back
        i += L ? (size_t)L : 1; // invalid bytes pass through one at a time
    }
    return i;
}
