// cli_head.c - `--head FILE|auto` (cli_head.h).
#include "cli_head.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_common.h"

// The folders `auto` looks in for sub (a path below the repository:
// "heads", "data/datastore"): of the working directory, then beside the
// binary's folder (<repo>/build/specdec -> <repo>/sub). Their count.
static int repo_dirs(char dirs[2][4096], const char *sub) {
    int nd = 0;
    snprintf(dirs[nd++], sizeof dirs[0], "%s", sub);
    char exe[3072];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[nd++], sizeof dirs[0], "%s/../%s", exe, sub);
        }
    }
    return nd;
}

static int head_dirs(char dirs[2][4096]) { return repo_dirs(dirs, "heads"); }

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

// The names a model's datastore may have: the model file's name without
// ".gguf" (NAME.Q4_1), then without its last dot part (NAME: the name the
// heads have). Their count.
static int datastore_names(const char *model_path, char names[2][512]) {
    const char *base = strrchr(model_path, '/');
    base = base ? base + 1 : model_path;
    size_t L = strlen(base);
    if (L > 5 && !strcmp(base + L - 5, ".gguf")) L -= 5;
    if (L == 0 || L >= sizeof names[0]) return 0;
    memcpy(names[0], base, L);
    names[0][L] = 0;
    char *dot = strrchr(names[0], '.');
    if (!dot || dot == names[0]) return 1;
    memcpy(names[1], names[0], (size_t)(dot - names[0]));
    names[1][dot - names[0]] = 0;
    return 2;
}

// A note before the first use of a datastore, whose indexing takes a while
// (the n-gram drafter writes FILE.sdsa; a stale index is rebuilt too).
static void say_indexing(const char *path, int quiet) {
    char idx[4800];
    struct stat st, si;
    if (quiet == 1 || stat(path, &st) != 0 || snprintf(idx, sizeof idx, "%s.sdsa", path) >= (int)sizeof idx) return;
    if (stat(idx, &si) == 0 && si.st_mtime >= st.st_mtime) return;
    fprintf(stderr, "specdec: indexing the datastore %s into %s (once; about 10 s for 20 MB of text)\n", path, idx);
}

int cli_datastore_resolve(const char *spec, const char *head_spec, const char *model_path, int quiet, char *path,
                          size_t pathlen) {
    path[0] = 0;
    const int implied = !spec && head_spec && !strcmp(head_spec, "auto");
    if (!spec && !implied) return 0;
    if (spec && !strcmp(spec, "none")) return 0;
    if (spec && strcmp(spec, "auto")) {   // a file
        if (!cli_file_ok("datastore file", spec)) return 1;
        if (strlen(spec) >= pathlen) return cli_error("--datastore: path too long: %s", spec);
        memcpy(path, spec, strlen(spec) + 1);
        say_indexing(path, quiet);
        return 0;
    }
    char dirs[2][4096], names[2][512];
    const int nd = repo_dirs(dirs, "data/datastore"), nn = datastore_names(model_path, names);
    for (int i = 0; i < nd; i++)
        for (int k = 0; k < nn; k++) {
            char p[4800];
            struct stat st;
            if (snprintf(p, sizeof p, "%s/%s.txt", dirs[i], names[k]) >= (int)sizeof p) continue;
            if (stat(p, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) continue;
            if (strlen(p) >= pathlen) return cli_error("--datastore auto: path too long: %s", p);
            memcpy(path, p, strlen(p) + 1);
            if (quiet == 0) fprintf(stderr, "specdec: --datastore auto: %s\n", p);
            say_indexing(path, quiet);
            return 0;
        }
    // Said when asked for by name, or with -v when --head auto implied it.
    if (quiet == 0 || (!implied && quiet != 1))
        fprintf(stderr, "specdec: --datastore auto: no data/datastore/%s.txt for %s; going on without one "
                        "(make one: make datastore, or python3 scripts/make-datastore.py)\n",
                nn > 1 ? names[1] : nn ? names[0] : "NAME", model_path);
    return 0;
}
