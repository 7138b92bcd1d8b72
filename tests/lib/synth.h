// synth.h - small synthetic GGUF models with random weights, for tests.
//
// Usage:
//   synth_params p = synth_default_params();   // llama, 2 layers, F32, vocab 320
//   p.wtype = SD_TYPE_Q4_K; p.n_embd = 256; p.n_ff = 512;  // K-quants: multiples of 256
//   char err[256];
//   if (synth_write("/tmp/x.gguf", &p, err, sizeof err) < 0) ...
//   sd_model_load(&m, "/tmp/x.gguf", err, sizeof err);
//
// The weights are uniform random (seeded, reproducible), scaled so that every
// projection keeps activations of order one and the logits have a standard
// deviation of a few units: distributions are neither flat nor one-hot. The
// vocabulary is a SentencePiece-style "llama" one: <unk>, <s>, </s>, the 256
// byte tokens <0x00>..<0xFF>, then pieces "▁w<k>" up to n_vocab.
#ifndef SD_TEST_SYNTH_H
#define SD_TEST_SYNTH_H

#include <stddef.h>
#include <stdint.h>

typedef struct synth_params {
    const char *arch;      // general.architecture: "llama" (default) or "qwen2"; any string is written as is
    int n_vocab;           // >= 260; default 320
    int n_embd;            // default 64 (K-quants: multiple of 256)
    int n_layer;           // default 2
    int n_head;            // default 4
    int n_head_kv;         // default 2
    int n_ff;              // default 128 (K-quants: multiple of 256)
    int n_ctx_train;       // default 512
    float rope_base;       // default 10000
    int wtype;             // enum sd_type of the layer matrices; default SD_TYPE_F32
    int embd_type;         // type of token_embd / output; -1 (default) = wtype
    int mix_type;          // type of attn_v and ffn_up (mixed files such as Q4_K_M); -1 (default) = wtype
    int tied;              // 1 (default): no output.weight, logits use token_embd
    int biases;            // 1: write attn_{q,k,v}.bias; default 1 for qwen2, 0 for llama (-1 = by arch)
    int words_only;        // 1: an output.weight (even when tied) whose rows for <unk>, <s>, </s> and the
                           // byte tokens are zero: their logits are 0, and the best word's is above 0 unless
                           // all n_vocab - 259 are negative (odds 2^-(n_vocab - 259)): greedy text is words
                           // and never ends; default 0
    int chatml;            // 1: the last two tokens are the control tokens <|im_start|> and <|im_end|>, and a
                           // ChatML tokenizer.chat_template is written (chat records, --score answers); default 0
    uint64_t seed;         // default 1234
    const char *rope_scaling_type; // "<arch>.rope.scaling.type" to write ("linear", "yarn", ...), or NULL (default)
    float rope_scaling_factor;     // "<arch>.rope.scaling.factor", written when rope_scaling_type is set
    // Fault injection for loader tests:
    const char *omit_tensor;       // tensor name not written, or NULL
    const char *bad_shape_tensor;  // tensor written with its last dimension halved, or NULL
} synth_params;

synth_params synth_default_params(void);

// Writes the model to path. Returns 0, or <0 with a message in err.
int synth_write(const char *path, const synth_params *p, char *err, size_t errlen);

#endif
