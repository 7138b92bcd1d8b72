// quant_check.c - see quant_check.h.
#include "quant_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int qc_matmul_invariance_case(sd_pool *pool, int t, int64_t n_in, int64_t n_out, float (*rnd)(void),
                              qc_fail_fn fail) {
    const sd_type_traits *tr = sd_type_get(t);
    const int64_t n_tok_max = 19;
    size_t wrb = sd_row_size(t, n_in);
    float *wf = malloc(sizeof(float) * (size_t)(n_in * n_out));
    float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok_max));
    float *y1 = malloc(sizeof(float) * (size_t)(n_out * n_tok_max));
    float *yb = malloc(sizeof(float) * (size_t)(n_out * n_tok_max));
    uint8_t *W = malloc(wrb * (size_t)n_out);
    sd_mm_ctx ctx = {pool, NULL, sd_matmul_wsize(t, n_in, n_tok_max), 0};
    ctx.wbuf = malloc(ctx.wbuf_size + 1);
    int n_bad = 0;
    char msg[256];
    if (!wf || !x || !y1 || !yb || !W || !ctx.wbuf) {
        fail("out of memory");
        n_bad = 1;
        goto out;
    }
    for (int64_t i = 0; i < n_in * n_out; i++) wf[i] = rnd();
    for (int64_t r = 0; r < n_out; r++) tr->from_float(wf + r * n_in, W + (size_t)r * wrb, n_in);
    for (int64_t i = 0; i < n_in * n_tok_max; i++) x[i] = 4.0f * rnd();
    for (int64_t k = 0; k < n_tok_max; k++) sd_matmul(&ctx, t, W, n_in, n_out, x + k * n_in, 1, y1 + k * n_out);
    for (int64_t n_tok = 2; n_tok <= n_tok_max; n_tok++) {
        // tokens [off, off + n_tok) of x, so that every token lands at several tile positions
        int64_t off = (n_tok * 7) % (n_tok_max - n_tok + 1);
        sd_matmul(&ctx, t, W, n_in, n_out, x + off * n_in, n_tok, yb);
        int n_diff = 0;
        for (int64_t k = 0; k < n_tok; k++)
            for (int64_t r = 0; r < n_out; r++)
                n_diff += memcmp(&yb[k * n_out + r], &y1[(off + k) * n_out + r], sizeof(float)) != 0;
        if (n_diff) {
            snprintf(msg, sizeof msg, "%s n_in=%lld n_out=%lld n_tok=%lld pool=%d: %d outputs differ from one-token matmul",
                     tr->name, (long long)n_in, (long long)n_out, (long long)n_tok, pool != NULL, n_diff);
            fail(msg);
            n_bad++;
        }
    }
out:
    free(wf), free(x), free(y1), free(yb), free(W), free(ctx.wbuf);
    return n_bad;
}
