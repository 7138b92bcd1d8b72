// bench_prompts.h - the prompt sets of specdec bench: Spec-Bench JSON lines,
// one object per line, {"question_id": 7, "category": "coding", "turns":
// ["first user message", ...]}. Only the first turn is used. Each line is
// parsed by jansson (strict JSON: valid UTF-8, every escape, no \u0000).
#ifndef SD_BENCH_PROMPTS_H
#define SD_BENCH_PROMPTS_H

#include <stddef.h>

typedef struct bench_prompt {
    char *id;        // question_id as text (the string, an integer in decimal, another number in its
                     // shortest form), "lineN" when absent or empty; owned
    char *category;  // category, "uncategorized" when absent; owned
    char *text;      // the first turn, UTF-8, NUL-terminated; owned
    int line;        // 1-based line of the file it came from
} bench_prompt;

// Parses one JSON line (len bytes, no newline) into p (fields owned by p;
// free with bench_prompt_clear). line only fills p->line and the default id.
// Returns 0, or -1 with a message (without the line number) in err: "invalid
// JSON at column 17: ':' expected near '['" (jansson's text), "\"turns\" is
// missing", ...
int bench_prompt_parse(const char *s, size_t len, int line, bench_prompt *p, char *err, size_t errlen);
void bench_prompt_clear(bench_prompt *p);

// Reads every non-blank line of path. Returns the number of prompts (>= 1)
// with *out a malloc'd array (free with bench_prompts_free), or -1 with a
// message naming the file and line: "FILE, line 3: invalid JSON at ...".
// A file without any prompt is an error.
int bench_prompts_load(const char *path, bench_prompt **out, char *err, size_t errlen);
void bench_prompts_free(bench_prompt *p, int n);

#endif
