// cli_head.c - `--head FILE|auto` (cli_head.h).
#include "cli_head.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"

int cli_head_load(const char *spec, const sd_model *m, const char *model_path, int quiet, sd_head **out) {
    char err[768], path[4096];
    *out = NULL;
    if (strcmp(spec, "auto")) {
        if (!cli_file_ok("head file", spec)) return 1;
        if (sd_head_load(out, spec, m, err, sizeof err) < 0) return cli_error("--head: %s", err);
        return 0;
    }
    char dirs[2][4096];
    int nd = 0;
    snprintf(dirs[nd++], sizeof dirs[0], "heads");
    char exe[3072];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {   // <repo>/build/specdec -> <repo>/heads
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[nd++], sizeof dirs[0], "%s/../heads", exe);
        }
    }
    for (int i = 0; i < nd; i++) {
        int rc = sd_head_find(m, dirs[i], path, sizeof path, err, sizeof err);
        if (rc < 0) return cli_error("--head auto: %s", err);
        if (rc == 1) {
            if (sd_head_load(out, path, m, err, sizeof err) < 0) return cli_error("--head auto: %s", err);
            if (!quiet) {
                char desc[512];
                sd_head_describe(*out, desc, sizeof desc);
                fprintf(stderr, "specdec: --head auto: %s (%s)\n", path, desc);
            }
            return 0;
        }
    }
    if (!quiet)
        fprintf(stderr,
                "specdec: --head auto: no head in heads/ was made for %s; drafting without one "
                "(train one: specdec train-head)\n",
                model_path);
    return 0;
}
