// utf8.h - UTF-8 boundaries for the programs' text output: a token's piece
// may end inside a character, so streamed text is released up to the last
// complete one. Shared by the CLI and the server (neither includes the
// other's headers).
#ifndef SD_TOOLS_UTF8_H
#define SD_TOOLS_UTF8_H

#include <stddef.h>

// Bytes of the valid UTF-8 character at s (n bytes available): 0 if invalid,
// -1 if valid so far but incomplete.
int utf8_char(const unsigned char *s, size_t n);
// The longest prefix of s[0..n) that does not end inside a character that
// could still be completed (invalid bytes pass through one at a time).
size_t utf8_complete(const char *s, size_t n);

#endif
