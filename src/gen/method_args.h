// method_args.h - the numbers of method strings (method_args.c): lists of
// integers read without limits, then each checked against its parameter's
// range with a message that names the parameter and the range.
#ifndef SD_SPEC_METHOD_ARGS_H
#define SD_SPEC_METHOD_ARGS_H

#include <stddef.h>

// Reads "V1-V2-..." (sep '-'; sep2, when not 0, is a second separator)
// into at most max non-negative integers (a value past INT_MAX reads as
// INT_MAX). Returns the count, -1 when s is not such a list (empty, a
// character other than digits and separators, an empty value), or max + 1
// when it holds more values.
int sd_method_nums(const char *s, char sep, char sep2, int *out, int max);
// 0 if lo <= v <= hi; else -1 with "method SYNTAX needs NAME in lo..hi, got
// NAME = v in 'GOT'" in err.
int sd_method_range(const char *syntax, const char *name, int v, int lo, int hi, const char *got, char *err,
                    size_t errlen);
// Each width w[0..n) in lo..hi (named W1, W2, ... in the message): 0 or -1.
int sd_method_widths_range(const char *syntax, const int *w, int n, int lo, int hi, const char *got, char *err,
                           size_t errlen);
// The first value of v[0..n) that an earlier one repeats, or -1.
int sd_method_repeat(const int *v, int n);
// Nodes of a tree with widths w[0..n) per depth, root included (capped at 2^20).
int sd_method_widths_nodes(const int *w, int n);

#endif
