// quant_check.c - see quant_check.h.
#include "quant_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

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
    sd_mm_ctx ctx = {.pool = pool, .wbuf_size = sd_matmul_wsize(t, n_in, n_tok_max)};
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

static float unif(uint32_t (*u32)(void)) { return (u32() >> 8) / 16777216.f * 2 - 1; } // [-1, 1)

void qc_k_random_blocks(int type, uint8_t *w, int64_t nb, uint32_t (*u32)(void)) {
    const size_t bsize = sd_row_size(type, SD_QK_K);
    for (size_t i = 0; i < (size_t)nb * bsize; i++) w[i] = (uint8_t)u32();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * bsize;
        uint16_t d = sd_fp32_to_fp16(0.001f + 0.05f * fabsf(unif(u32)));
        uint16_t dm = sd_fp32_to_fp16(0.001f + 0.05f * fabsf(unif(u32)));
        if (type == SD_TYPE_Q6_K) {
            memcpy(blk + 208, &d, 2);
        } else {
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dm, 2);
        }
    }
}

void qc_q8_K_extreme(sd_block_q8_K *x, int64_t nb, uint32_t (*u32)(void)) {
    for (int64_t b = 0; b < nb; b++) {
        x[b].d = 0.01f + 0.1f * fabsf(unif(u32));
        for (int i = 0; i < SD_QK_K; i++) x[b].qs[i] = (int8_t)(u32() & 1 ? -128 : (int)(u32() % 256) - 128);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int k = 0; k < 16; k++) s += x[b].qs[16 * g + k];
            x[b].bsums[g] = (int16_t)s;
        }
    }
}
