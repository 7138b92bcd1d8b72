// unicode.c - UTF-8 decoding/encoding and Unicode class lookup.
#include "model/unicode.h"

int sd_utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

int sd_utf8_decode(const char *s, size_t len, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned char c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2; v = c & 0x1F; min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3; v = c & 0x0F; min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4; v = c & 0x07; min = 0x10000;
    } else {
        *cp = SD_UTF8_INVALID_BASE + c;
        return 1;
    }
    if ((size_t)n > len) {
        *cp = SD_UTF8_INVALID_BASE + c;
        return 1;
    }
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = SD_UTF8_INVALID_BASE + c;
            return 1;
        }
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = SD_UTF8_INVALID_BASE + c;
        return 1;
    }
    *cp = v;
    return n;
}

int sd_utf8_encode(uint32_t cp, char out[4]) {
    if (cp >= SD_UTF8_INVALID_BASE) {
        out[0] = (char)(unsigned char)(cp - SD_UTF8_INVALID_BASE);
        return 1;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// White_Space property (Unicode 14): the set \s matches in Python's regex
// module and in Oniguruma with Unicode enabled.
static int is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return 0;
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

static int class_search(uint32_t cp) {
    int lo = 0, hi = sd_unicode_n_ranges - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const sd_urange *r = &sd_unicode_ranges[mid];
        if (cp < r->lo) hi = mid - 1;
        else if (cp > r->hi) lo = mid + 1;
        else return (int)r->cls;
    }
    return SD_UCLASS_OTHER;
}

int sd_unicode_class(uint32_t cp) {
    if (cp < 256) return sd_unicode_latin1[cp];
    if (cp >= SD_UTF8_INVALID_BASE) return SD_UCLASS_OTHER;
    if (is_white_space(cp)) return SD_UCLASS_SPACE;
    return class_search(cp);
}
