// tool_kernel_bench.c - times one matrix product kernel (the best gemm of a
// weight type on this CPU, rows repacked as the model loader does) on one
// thread for 1..8 tokens and prints one JSON object. A measurement helper
// for kernel work (docs/performance.md, "The kernels' limits"), not a test.
//
//   build/tests/tool_kernel_bench TYPE N_IN N_OUT [COPIES [REPS]]
//
// TYPE: q4_K, q5_K or q6_K; COPIES (default 8): distinct copies of the
// matrix, used in turn, so that with COPIES x size above the last-level
// cache every call streams its weights from memory (1: hot in cache); REPS
// (default 41) calls per token count: the median and the fastest are printed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/quant.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s q4_K|q5_K|q6_K N_IN N_OUT [COPIES [REPS]]\n", argv[0]);
        return 2;
    }
    const int type = !strcmp(argv[1], "q4_K") ? SD_TYPE_Q4_K : !strcmp(argv[1], "q5_K") ? SD_TYPE_Q5_K
                                                             : !strcmp(argv[1], "q6_K") ? SD_TYPE_Q6_K
                                                                                        : -1;
    const int rtype = type == SD_TYPE_Q4_K ? SD_TYPE_Q4_K_R : type == SD_TYPE_Q5_K ? SD_TYPE_Q5_K_R : SD_TYPE_Q6_K_R;
    const int64_t n_in = atoll(argv[2]), n_out = atoll(argv[3]);
    const int copies = argc > 4 ? atoi(argv[4]) : 8, reps = argc > 5 ? atoi(argv[5]) : 41;
    if (type < 0 || n_in <= 0 || n_in % SD_QK_K || n_out <= 0 || copies < 1 || reps < 1) {
        fprintf(stderr, "tool_kernel_bench: bad arguments (N_IN a multiple of %d)\n", SD_QK_K);
        return 2;
    }
    const sd_type_traits *tb = sd_type_get(type), *tr = sd_type_get(rtype);
    const sd_type_traits *tx = sd_type_get(tb->vec_dot_type);
    const int repacked = tr->supported && tr->gemm && tr->repack;
    const sd_type_traits *tk = repacked ? tr : tb;
    if (!tk->gemm) {
        fprintf(stderr, "tool_kernel_bench: no gemm kernel for %s on this CPU\n", argv[1]);
        return 1;
    }
    const size_t wrb = sd_row_size(type, n_in), bytes = wrb * (size_t)n_out;
    float *f = malloc(sizeof(float) * (size_t)n_in);
    void *base = malloc(bytes);
    void **W = calloc((size_t)copies, sizeof *W);
    const size_t xrb = sd_row_size(tb->vec_dot_type, n_in);
    void *xq = malloc(xrb * 8);
    float *y = malloc(sizeof(float) * (size_t)n_out * 8);
    double *ts = malloc(sizeof(double) * (size_t)reps);
    if (!f || !base || !W || !xq || !y || !ts) return fprintf(stderr, "tool_kernel_bench: out of memory\n"), 1;
    srand(1);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++) f[i] = rand() / (float)RAND_MAX - 0.5f;
        tb->from_float(f, (char *)base + (size_t)r * wrb, n_in);
    }
    for (int c = 0; c < copies; c++) {
        if (!(W[c] = aligned_alloc(64, (bytes + 63) / 64 * 64))) return fprintf(stderr, "out of memory\n"), 1;
        if (repacked ? tr->repack(base, W[c], n_in, n_out) < 0 : (memcpy(W[c], base, bytes), 0))
            return fprintf(stderr, "tool_kernel_bench: repack refused\n"), 1;
    }
    for (int t = 0; t < 8; t++) {
        for (int64_t i = 0; i < n_in; i++) f[i] = rand() / (float)RAND_MAX - 0.5f;
        tx->from_float(f, (char *)xq + (size_t)t * xrb, n_in);
    }
    printf("{\"type\": \"%s\", \"repacked\": %d, \"n_in\": %lld, \"n_out\": %lld, \"mb\": %.2f, \"copies\": %d, "
           "\"reps\": %d, \"runs\": [",
           argv[1], repacked, (long long)n_in, (long long)n_out, bytes / 1e6, copies, reps);
    const int toks[] = {1, 2, 3, 4, 6, 8};
    for (int k = 0, c = 0; k < 6; k++) {
        for (int i = 0; i < reps; i++, c = (c + 1) % copies) {
            const double t0 = now_ms();
            tk->gemm(n_in, W[c], wrb, 0, n_out, xq, xrb, toks[k], y, n_out);
            ts[i] = now_ms() - t0;
        }
        qsort(ts, (size_t)reps, sizeof(double), cmp_double);
        printf("%s{\"n_tok\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f}", k ? ", " : "", toks[k], ts[reps / 2], ts[0]);
    }
    printf("]}\n");
    return 0;
}
