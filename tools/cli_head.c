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

int cli_head_online_end(sd_drafter *d, const char *save_path, int quiet) {
    char err[768];
    if (sd_drafter_online_wait(d, err, sizeof err) < 0) return cli_error("--head-online: %s", err);
    sd_head_online_stats st;
    if (sd_drafter_online_stats(d, &st) && !quiet)
        fprintf(stderr,
                "specdec: head online: %lld positions, %lld windows trained (%lld dropped), %lld updates taken up, "
                "last loss %.3f, agreement %.2f, %.1f s of training\n",
                (long long)st.n_positions, (long long)st.n_windows, (long long)st.n_dropped, (long long)st.n_updates,
                st.last_loss, st.agree, st.train_ms / 1000.0);
    if (!save_path) return 0;
    if (sd_drafter_save_head(d, save_path, err, sizeof err) < 0) return cli_error("--save-head: %s", err);
    if (!quiet) fprintf(stderr, "specdec: head saved to %s\n", save_path);
    return 0;
}
