// cli_run.c - see cli_run.h.
#define _POSIX_C_SOURCE 200809L
#include "cli_run.h"

#include <stdio.h>
#include <sys/wait.h>

int cli_run(const char *bin, const char *args, int merge, char *out, size_t outlen) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s %s", bin, args, merge ? "2>&1" : "2>/dev/null");
    FILE *p = popen(cmd, "r");
    out[0] = 0;
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
