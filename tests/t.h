// t.h - the tiny test harness shared by every test program.
// A test program defines cases as functions and runs them with T_RUN. Each
// case prints one line: "PASS name", "FAIL name" (after the failed checks'
// messages) or "SKIP name: reason". scripts/run-tests.sh counts these lines.
#ifndef SD_T_H
#define SD_T_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int t_case_failed;   // checks failed in the current case
static int t_case_skipped;  // current case asked to skip
static char t_skip_why[256];
static int t_n_fail;        // failed cases in this program

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            t_case_failed++;                                               \
            printf("  check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                           \
            printf("\n");                                                  \
            fflush(stdout);                                                \
        }                                                                  \
    } while (0)

// Ends the current case as skipped, with a reason that is printed.
#define SKIP(...)                                                          \
    do {                                                                   \
        t_case_skipped = 1;                                                \
        snprintf(t_skip_why, sizeof t_skip_why, __VA_ARGS__);              \
        return;                                                            \
    } while (0)

#define T_RUN(fn)                                                          \
    do {                                                                   \
        t_case_failed = 0;                                                 \
        t_case_skipped = 0;                                                \
        fn();                                                              \
        if (t_case_skipped && !t_case_failed)                              \
            printf("SKIP %s: %s\n", #fn, t_skip_why);                      \
        else if (t_case_failed) {                                          \
            printf("FAIL %s\n", #fn);                                      \
            t_n_fail++;                                                    \
        } else                                                             \
            printf("PASS %s\n", #fn);                                      \
        fflush(stdout);                                                    \
    } while (0)

#define T_EXIT() return t_n_fail ? 1 : 0

// Path of ../shared (the directory beside the repository), or NULL if absent.
// SD_SHARED overrides it for unusual layouts; naming a directory that does
// not exist, it gives NULL as a clone without ../shared does
// (`SD_SHARED=/nonexistent make test` shows what such a clone skips).
static inline const char *t_shared_dir(void) {
    const char *e = getenv("SD_SHARED");
    static const char *cands[] = {"../shared", "../../shared"};
    if (e && *e) {
        struct stat st;
        return stat(e, &st) == 0 && S_ISDIR(st.st_mode) ? e : NULL;
    }
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/models/README.md", cands[i]);
        FILE *f = fopen(p, "rb");
        if (f) {
            fclose(f);
            return cands[i];
        }
    }
    return NULL;
}

#endif
