// pp_none.c - the default build's pipeline glue (pp.h): no MPI, so --pp and
// --layers are refused with one message saying how to build a specdec that
// has them, and a launch on several MPI ranks is refused too (every rank
// would otherwise run the whole command on its own).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/pp.h"

static int is_pp_flag(const char *a) {
    return !strcmp(a, "--pp") || !strncmp(a, "--pp=", 5) || !strcmp(a, "--layers") || !strncmp(a, "--layers=", 9) ||
           !strncmp(a, "--pp-", 5);
}

int pp_main(int *argc, char **argv) {
    for (int i = 1; i < *argc; i++)
        if (is_pp_flag(argv[i])) {
            fprintf(stderr, "specdec: %s: this specdec was built without MPI; build it with `make MPI=1` (Open MPI: "
                            "apt-get install openmpi-bin libopenmpi-dev) and launch it with mpirun -np R ... --pp R\n",
                    argv[i]);
            return 1;
        }
    const char *size = getenv("OMPI_COMM_WORLD_SIZE");
    if (size && atoi(size) > 1) {
        const char *rank = getenv("OMPI_COMM_WORLD_RANK");
        if (!rank || atoi(rank) == 0)
            fprintf(stderr, "specdec: launched on %d MPI ranks without --pp, and this specdec was built without MPI: "
                            "build it with `make MPI=1` and add --pp %d\n",
                    atoi(size), atoi(size));
        return 1;
    }
    return -1;
}

int pp_active(void) { return 0; }

int pp_model_load(sd_model **out, const char *path, char *err, size_t errlen) {
    return sd_model_load(out, path, err, errlen);
}

int pp_forward_many(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen) {
    return sd_batcher_forward(b, ss, bs, n, err, errlen);
}

void pp_metrics_text(char *buf, size_t n) {
    if (n) buf[0] = 0;
}

int pp_attach(sd_session *s, char *err, size_t errlen) {
    (void)s;
    (void)err;
    (void)errlen;
    return 0;
}

int pp_group_begin(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen) {
    (void)b, (void)ss, (void)bs, (void)n;
    return snprintf(err, errlen, "no pipeline (a build without MPI)"), -1;
}

int pp_group_end(sd_batcher *b, int ticket, char *err, size_t errlen) {
    (void)b, (void)ticket;
    return snprintf(err, errlen, "no pipeline (a build without MPI)"), -1;
}

int pp_groups(void) { return 1; }

int pp_groups_pick(int n_threads, char *note, size_t len) {
    (void)n_threads;
    if (len) note[0] = 0;
    return 1;
}

void pp_on_fault(void (*fn)(void *arg, const char *msg), void *arg) {
    (void)fn, (void)arg;
}

int pp_recovery(void) { return 0; }

void pp_keepalive(void) {}
