// cli_head.c - `--head FILE|auto` (cli_head.h).
#include "cli_head.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"

// The heads/ folders `auto` looks in: of the working directory, then beside
// the binary's folder (<repo>/build/specdec -> <repo>/heads). Their count.
static int head_dirs(char dirs[2][4096]) {
    int nd = 0;
    snprintf(dirs[nd++], sizeof dirs[0], "heads");
    char exe[3072];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[nd++], sizeof dirs[0], "%s/../heads", exe);
        }
    }
    return nd;
}

// The first file of kind `type` made for m in the folders (SD_HEAD_NONE: any
// kind); loaded into *out and said on stderr unless quiet. 0 (*out NULL
// when none), or 1 after a message.
static int find_load(const sd_model *m, sd_head_type type, int quiet, sd_head **out) {
    char dirs[2][4096], path[4096], err[768];
    const int nd = head_dirs(dirs);
    *out = NULL;
    for (int i = 0; i < nd; i++) {
        int rc = sd_head_find_type(m, dirs[i], type, path, sizeof path, err, sizeof err);
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
    return 0;
}

const char *cli_head_kind_name(sd_head_type t) {
    return t == SD_HEAD_EAGLE3 ? "EAGLE-3 head" : t == SD_HEAD_MEDUSA ? "Medusa head" : t == SD_HEAD_MOA ? "MoA drafter" : "head";
}

const char *cli_head_kind_arg(sd_head_type t) {
    return t == SD_HEAD_MEDUSA ? "medusa" : t == SD_HEAD_MOA ? "moa" : "eagle3";
}

void cli_env_set_head(sd_method_env *env, const sd_head *h) {
    if (!h) return;
    const sd_head_type t = sd_head_get_type(h);
    *(t == SD_HEAD_MEDUSA ? &env->head_medusa : t == SD_HEAD_MOA ? &env->head_moa : &env->head_eagle3) = h;
}

static void none_found(const char *model_path, const char *what) {
    fprintf(stderr, "specdec: --head auto: no %s in heads/ was made for %s; going on without one (train one: "
                    "specdec train-head)\n", what, model_path);
}

int cli_head_load_type(const char *spec, const sd_model *m, const char *model_path, sd_head_type want, int quiet,
                       sd_head **out) {
    *out = NULL;
    if (strcmp(spec, "auto")) {
        char err[768];
        if (!cli_file_ok("head file", spec)) return 1;
        if (sd_head_load(out, spec, m, err, sizeof err) < 0) return cli_error("--head: %s", err);
        return 0;
    }
    if (find_load(m, want == SD_HEAD_NONE ? SD_HEAD_EAGLE3 : want, quiet, out)) return 1;
    if (!*out && want == SD_HEAD_NONE && find_load(m, SD_HEAD_NONE, quiet, out)) return 1;
    if (!*out && quiet != 1) none_found(model_path, cli_head_kind_name(want));
    return 0;
}

int cli_head_load(const char *spec, const sd_model *m, const char *model_path, int quiet, sd_head **out) {
    return cli_head_load_type(spec, m, model_path, SD_HEAD_NONE, quiet, out);
}

int cli_heads_load(const char *spec, const sd_model *m, const char *model_path, int quiet, sd_head **out, int max,
                   int *n) {
    if (strcmp(spec, "auto")) {
        if (*n == max) return cli_error("--head: at most %d heads", max);
        if (cli_head_load_type(spec, m, model_path, SD_HEAD_NONE, quiet, &out[*n])) return 1;
        ++*n;
        return 0;
    }
    static const sd_head_type kinds[] = {SD_HEAD_EAGLE3, SD_HEAD_MEDUSA, SD_HEAD_MOA};
    const int n0 = *n;
    for (int k = 0; k < 3; k++) {
        sd_head *h = NULL;
        if (find_load(m, kinds[k], quiet, &h)) return 1;
        if (!h) continue;
        if (*n == max) {
            sd_head_free(h);
            return cli_error("--head: at most %d heads", max);
        }
        out[(*n)++] = h;
    }
    if (*n == n0 && quiet != 1) none_found(model_path, "head");
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
