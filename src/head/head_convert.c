// head_convert.c - rewrites a head file in the current layout
// (sd_head_convert, `specdec head-convert`): an EAGLE-3 head of specdec's
// first layout becomes one that llama.cpp loads (docs/heads.md, "Files").
#include <string.h>

#include "common.h"
#include "head/head.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/model.h"

// What the file at path holds: *llama 1 when an EAGLE-3 file is already in
// llama.cpp's layout with a tokenizer, and the type its matrices are kept in
// (Q8_0 when any matrix is, else Q5_0 when any is, else F16 when any is,
// else F32; another type becomes Q8_0, the default of train-head).
static int probe(const char *path, int *llama, int *wtype, char *err, size_t errlen) {
    sd_gguf *g = NULL;
    if (sd_gguf_open(&g, path, err, errlen) < 0) return -1;
    *llama = !sd_gguf_find_key(g, "eagle3.block_count") ||   // not an EAGLE-3 file
             (sd_gguf_find_key(g, "eagle3.target_layers") && sd_gguf_find_key(g, "tokenizer.ggml.tokens"));
    int has_q8 = 0, has_q5 = 0, has_f16 = 0, has_other = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const sd_tensor *t = &g->tensors[i];
        if (t->n_dims < 2) continue;
        if (t->type == SD_TYPE_Q8_0) has_q8 = 1;
        else if (t->type == SD_TYPE_Q5_0) has_q5 = 1;
        else if (t->type == SD_TYPE_F16) has_f16 = 1;
        else if (t->type != SD_TYPE_F32) has_other = 1;
    }
    *wtype = has_q8 || has_other ? SD_TYPE_Q8_0 : has_q5 ? SD_TYPE_Q5_0 : has_f16 ? SD_TYPE_F16 : SD_TYPE_F32;
    sd_gguf_close(g);
    return 0;
}

int sd_head_convert(const char *in_path, const char *out_path, const sd_model *target, char *err, size_t errlen) {
    return sd_head_convert_type(in_path, out_path, target, SD_HEAD_OUT_KEEP, err, errlen);
}

int sd_head_convert_type(const char *in_path, const char *out_path, const sd_model *target, int out_type, char *err,
                         size_t errlen) {
    static const int types[] = {0, SD_TYPE_Q8_0, SD_TYPE_Q5_0, SD_TYPE_F16, SD_TYPE_F32};
    if (!in_path || !out_path || !target)
        return sd_err(err, errlen, "head-convert: a head file, an output path and the target are needed");
    if (out_type < SD_HEAD_OUT_KEEP || out_type > SD_HEAD_OUT_F32)
        return sd_err(err, errlen, "head-convert: unknown output type %d", out_type);
    int llama = 0, wtype = SD_TYPE_Q8_0;
    if (probe(in_path, &llama, &wtype, err, errlen) < 0) return -1;
    if (out_type != SD_HEAD_OUT_KEEP) wtype = types[out_type];
    sd_head *h = NULL;
    if (sd_head_load(&h, in_path, target, err, errlen) < 0) return -1;   // names the file and what differs
    int rc = sd_head_save_for(h, target, out_path, wtype, err, errlen);
    sd_head_free(h);
    if (rc < 0) return -1;
    return llama ? 0 : 1;
}
