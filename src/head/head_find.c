// head_find.c - `--head auto`: the shipped head made for a target.
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/head.h"
#include "model/gguf.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// 1 when the file at path may hold a head of kind type (SD_HEAD_NONE: any),
// from its header's general.architecture alone; the load decides the rest.
static int kind_is(const char *path, sd_head_type type) {
    if (type == SD_HEAD_NONE) return 1;
    static const char *arch[] = {[SD_HEAD_EAGLE3] = "eagle3", [SD_HEAD_MEDUSA] = "medusa", [SD_HEAD_MOA] = "moa"};
    sd_gguf *g = NULL;
    char e[256];
    if (sd_gguf_open_map(&g, path, 0, e, sizeof e) < 0) return 0;
    sd_str a;
    const int is = sd_gguf_get_str(g, "general.architecture", &a, e, sizeof e) == 0 &&
                   a.len == strlen(arch[type]) && !memcmp(a.ptr, arch[type], a.len);
    sd_gguf_close(g);
    return is;
}

int sd_head_find(const sd_model *target, const char *dir, char *path, size_t pathlen, char *err, size_t errlen) {
    return sd_head_find_type(target, dir, SD_HEAD_NONE, path, pathlen, err, errlen);
}

int sd_head_find_type(const sd_model *target, const char *dir, sd_head_type type, char *path, size_t pathlen, char *err,
                      size_t errlen) {
    DIR *dp = opendir(dir);
    if (!dp) return 0;   // no heads folder: nothing found
    char *names[256];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dp)) && n < 256) {
        size_t L = strlen(de->d_name);
        if (L > 5 && !strcmp(de->d_name + L - 5, ".gguf")) names[n++] = strdup(de->d_name);
    }
    closedir(dp);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    int found = 0;
    for (int i = 0; i < n; i++) {
        char p[4096], e2[512];
        sd_head *h = NULL;
        if (!found && names[i] && snprintf(p, sizeof p, "%s/%s", dir, names[i]) < (int)sizeof p &&
            kind_is(p, type) && sd_head_load(&h, p, target, e2, sizeof e2) == 0) {
            sd_head_free(h);
            if (strlen(p) >= pathlen) {
                found = sd_err(err, errlen, "head path too long: %s", p);
            } else {
                memcpy(path, p, strlen(p) + 1);
                found = 1;
            }
        }
        free(names[i]);
    }
    return found;
}
