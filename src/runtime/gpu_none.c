// gpu_none.c - the device calls of gpu.h in a build without CUDA (the
// default): each fails with the way to get a CUDA build. `make CUDA=1`
// replaces this file with src/runtime/cuda/.
#include <stdio.h>

#include "runtime/gpu.h"

#define NO_CUDA "this specdec was built without CUDA (rebuild with `make CUDA=1` on a machine with the CUDA toolkit)"

int sd_cu_available(char *info, size_t infolen) {
    snprintf(info, infolen, "%s", NO_CUDA);
    return -1;
}
int sd_cu_model_new(const sd_cu_model_desc *d, sd_cu_model **out, char *err, size_t errlen) {
    (void)d;
    *out = NULL;
    snprintf(err, errlen, "%s", NO_CUDA);
    return -1;
}
void sd_cu_model_free(sd_cu_model *g) { (void)g; }
size_t sd_cu_model_bytes(const sd_cu_model *g) {
    (void)g;
    return 0;
}
int sd_cu_kv_new(sd_cu_model *g, int n_ctx, sd_cu_kv **out, char *err, size_t errlen) {
    (void)g;
    (void)n_ctx;
    *out = NULL;
    snprintf(err, errlen, "%s", NO_CUDA);
    return -1;
}
void sd_cu_kv_free(sd_cu_kv *kv) { (void)kv; }
int sd_cu_kv_pin_logits(sd_cu_kv *kv, void *p, size_t bytes) {
    (void)kv, (void)p, (void)bytes;
    return -1;
}
int sd_cu_kv_move(sd_cu_kv *kv, const int32_t *dst, const int32_t *src, int n, const uint8_t *layer_skip, char *err,
                  size_t errlen) {
    (void)kv, (void)dst, (void)src, (void)n, (void)layer_skip;
    snprintf(err, errlen, "%s", NO_CUDA);
    return -1;
}
int sd_cu_kv_read(sd_cu_kv *kv, int l, int n, uint16_t *k, uint16_t *v, char *err, size_t errlen) {
    (void)kv, (void)l, (void)n, (void)k, (void)v;
    snprintf(err, errlen, "%s", NO_CUDA);
    return -1;
}
int sd_cu_kv_write(sd_cu_kv *kv, int l, int n, const uint16_t *k, const uint16_t *v, char *err, size_t errlen) {
    (void)kv, (void)l, (void)n, (void)k, (void)v;
    snprintf(err, errlen, "%s", NO_CUDA);
    return -1;
}
int sd_cu_forward(sd_cu_model *g, const sd_cu_pass *p, char *err, size_t errlen) {
    (void)g, (void)p;
    snprintf(err, errlen, "%s", NO_CUDA);
    return -1;
}
void sd_cu_set_graphs(sd_cu_model *g, int on) { (void)g, (void)on; }
int sd_cu_selftest(int verbose) {
    (void)verbose;
    printf("SKIP cuda_selftest: %s\n", NO_CUDA);
    return 0;
}
