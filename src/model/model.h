// model.h - internal: the immutable model (weights in the mapped GGUF file).
#ifndef SD_MODEL_H
#define SD_MODEL_H

#include "specdec.h"
#include "model/gguf.h"
#include "kernels/quant.h"

enum sd_arch { SD_ARCH_LLAMA = 0, SD_ARCH_QWEN2 = 1 };
enum sd_rope_type { SD_ROPE_NORM = 0, SD_ROPE_NEOX = 1 }; // NORM: pairs (2i, 2i+1); NEOX: pairs (i, i + d/2)

typedef struct sd_hparams {
    int arch;            // enum sd_arch
    int n_vocab;         // rows of token_embd
    int n_embd;          // model width
    int n_layer;
    int n_head;          // query heads
    int n_head_kv;       // key/value heads (GQA: n_head % n_head_kv == 0)
    int head_dim;        // n_embd / n_head unless the file says otherwise
    int n_ff;            // feed-forward width
    int n_ctx_train;
    int n_rot;           // rotary dimensions (<= head_dim)
    int rope_type;       // enum sd_rope_type (llama: NORM, qwen2: NEOX)
    float rope_base;     // rope.freq_base, default 10000
    float rope_scale;    // linear position scale: pos / rope_scale (1 = none)
    float rms_eps;
} sd_hparams;

typedef struct sd_layer {
    const sd_tensor *attn_norm;           // (n_embd) f32
    const sd_tensor *wq, *wk, *wv, *wo;   // (n_embd -> n_head*hd), (n_embd -> n_head_kv*hd) x2, (n_head*hd -> n_embd)
    const sd_tensor *bq, *bk, *bv;        // biases (qwen2) or NULL
    const sd_tensor *ffn_norm;            // (n_embd) f32
    const sd_tensor *w_gate, *w_up, *w_down; // (n_embd -> n_ff) x2, (n_ff -> n_embd)
} sd_layer;

struct sd_model {
    sd_gguf *gguf;             // owns the mapping
    sd_hparams hp;
    char arch_name[16];
    char name[128];
    const sd_tensor *tok_embd; // (n_vocab, n_embd)
    const sd_tensor *out_norm; // (n_embd) f32
    const sd_tensor *output;   // (n_vocab, n_embd); == tok_embd when tied
    sd_layer *layers;          // (n_layer)
    sd_tokenizer *tok;
    size_t n_bytes;            // tensor bytes
    // A part of the model (pipeline parallelism, sd_model_load_part): only
    // the weights of layers [layer_lo, layer_hi) (and, with has_output, the
    // final norm and output matrix) are repacked or read; the other tensors
    // are validated but their pages are never touched. The whole model: 0,
    // n_layer, 1.
    int layer_lo, layer_hi;
    int has_output;
    size_t n_bytes_held;       // tensor bytes of the held layers and output
    // A split client's file (docs/split.md): 1, with the target's layer count
    // as n_layer, and the tensors of layers [client_lo, n_layer) only (an MoA
    // drafter's TLI layers; n_layer: none); held layers [n_layer, n_layer), no
    // output held: no session runs on it (sd_session_new refuses).
    int client, client_lo;
    // A program's hook on each new session of this model
    // (sd_model_set_session_hook), or NULL.
    int (*on_session)(void *arg, sd_session *s, char *err, size_t errlen);
    void *on_session_arg;
    // Matrices rewritten at load into a kernel's layout (sd_quant_repack_type):
    // the layer / output pointers above then point into rp, whose data lie
    // in one arena, in the order the forward reads them (the file's copy
    // stays mapped for token_embd).
    sd_tensor *rp;             // (n_rp_max) tensor headers, type = the repacked id
    void *rp_arena;            // owned anonymous mapping, 2 MiB aligned (huge pages)
    size_t rp_arena_size;      // its bytes
    const sd_tensor **rp_src;  // (n_rp_max) the file's tensor each rp entry was made from
    int n_rp;                  // used entries
    // The CUDA path's device twin (runtime/gpu.c), made by the model's first
    // GPU session and freed with the model; NULL in CPU use.
    void *gpu;
    void (*gpu_free)(void *gpu);
};

// The file's tensor behind t: t itself, or for a repacked matrix the mapped
// original (for code that reads weights in the file's layout, e.g. a
// reference forward in the tests).
const sd_tensor *sd_model_file_tensor(const sd_model *m, const sd_tensor *t);

#endif
