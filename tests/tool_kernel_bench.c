// tool_kernel_bench.c - times one matrix product (sd_matmul: the best kernel
// of a weight type on this CPU, rows repacked as the model loader does,
// activations converted in the call) for 1..8 tokens and prints one JSON
// object. A measurement helper for kernel work (docs/performance.md, "The
// kernels' limits"), not a test.
//
//   build/tests/tool_kernel_bench TYPE N_IN N_OUT [COPIES [REPS [THREADS]]]
//
// TYPE: q4_0, q4_1, q5_0, q8_0, q4_K, q5_K or q6_K; COPIES (default 8):
// distinct copies of the matrix, used in turn, so that with COPIES x size
// above the last-level cache every call streams its weights from memory (1:
// hot in cache); REPS (default 41) calls per token count, whose median and
// fastest are printed; THREADS (default 1) the pool's threads.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/matmul.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// n uniform values in [-0.5, 0.5).
static void fill_random(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = rand() / (float)RAND_MAX - 0.5f;
}

static int fail(const char *msg) {
    fprintf(stderr, "tool_kernel_bench: %s\n", msg);
    return 1;
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        int type;
    } types[] = {{"q4_0", SD_TYPE_Q4_0}, {"q4_1", SD_TYPE_Q4_1}, {"q5_0", SD_TYPE_Q5_0}, {"q8_0", SD_TYPE_Q8_0},
                 {"q4_K", SD_TYPE_Q4_K}, {"q5_K", SD_TYPE_Q5_K}, {"q6_K", SD_TYPE_Q6_K}};
    if (argc < 4) {
        fprintf(stderr, "usage: %s q4_0|q4_1|q5_0|q8_0|q4_K|q5_K|q6_K N_IN N_OUT [COPIES [REPS [THREADS]]]\n",
                argv[0]);
        return 2;
    }
    int type = -1;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(argv[1], types[i].name)) type = types[i].type;
    const int64_t n_in = atoll(argv[2]), n_out = atoll(argv[3]);
    const int copies = argc > 4 ? atoi(argv[4]) : 8, reps = argc > 5 ? atoi(argv[5]) : 41;
    const int threads = argc > 6 ? atoi(argv[6]) : 1;
    if (type < 0 || n_in <= 0 || n_in % sd_type_get(type)->blck || n_out <= 0 || copies < 1 || reps < 1 ||
        threads < 1) {
        fprintf(stderr, "tool_kernel_bench: bad arguments (N_IN a multiple of the type's block)\n");
        return 2;
    }
    enum { MAX_TOK = 8 };
    const size_t bytes = sd_row_size(type, n_in) * (size_t)n_out;
    float *w = malloc(sizeof(float) * (size_t)n_in * (size_t)n_out);
    float *x = malloc(sizeof(float) * (size_t)n_in * MAX_TOK), *y = malloc(sizeof(float) * (size_t)n_out * MAX_TOK);
    void **W = calloc((size_t)copies, sizeof *W);
    double *ts = malloc(sizeof(double) * (size_t)reps);
    sd_mm_ctx mm = {.pool = threads > 1 ? sd_pool_new(threads) : NULL};
    mm.wbuf_size = sd_matmul_wsize(type, n_in, MAX_TOK);
    mm.wbuf = aligned_alloc(64, (mm.wbuf_size + 63) / 64 * 64);
    if (!w || !x || !y || !W || !ts || !mm.wbuf || (threads > 1 && !mm.pool)) return fail("out of memory");
    srand(1);
    fill_random(w, (size_t)n_in * (size_t)n_out);
    fill_random(x, (size_t)n_in * MAX_TOK);
    int rtype = type;
    for (int c = 0; c < copies; c++) {
        if (!(W[c] = aligned_alloc(64, (bytes + 63) / 64 * 64))) return fail("out of memory");
        rtype = sd_matmul_weights(type, w, n_in, n_out, W[c]);
    }
    free(w);
    printf("{\"type\": \"%s\", \"repacked\": %d, \"n_in\": %lld, \"n_out\": %lld, \"mb\": %.2f, \"copies\": %d, "
           "\"reps\": %d, \"threads\": %d, \"runs\": [",
           argv[1], rtype != type, (long long)n_in, (long long)n_out, bytes / 1e6, copies, reps, threads);
    const int toks[] = {1, 2, 3, 4, 6, 8};
    for (int k = 0, c = 0; k < 6; k++) {
        for (int i = 0; i < reps; i++, c = (c + 1) % copies) {
            const double t0 = now_ms();
            sd_matmul(&mm, rtype, W[c], n_in, n_out, x, toks[k], y);
            ts[i] = now_ms() - t0;
        }
        qsort(ts, (size_t)reps, sizeof(double), cmp_double);
        printf("%s{\"n_tok\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f}", k ? ", " : "", toks[k], ts[reps / 2], ts[0]);
    }
    printf("]}\n");
    for (int c = 0; c < copies; c++) free(W[c]);
    free(W);
    free(x);
    free(y);
    free(ts);
    free(mm.wbuf);
    sd_pool_free(mm.pool);
    return 0;
}
