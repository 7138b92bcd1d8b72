// head.h - internal: draft heads that read the target's hidden states
// (EAGLE-3, Medusa): their hyper-parameters, their float parameters in one
// flat array (one tensor table for training, checkpoints and files alike),
// and their GGUF files. The math is written out in docs/heads.md; the
// inference forward is in head/eagle3.c and head/medusa.c, training in src/train/.
#ifndef SD_HEAD_H
#define SD_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "specdec_spec.h"

// (enum sd_head_type: include/specdec.h)

#define SD_HEAD_MAX_TENSORS 64
#define SD_HEAD_MAX_MEDUSA 8

typedef struct sd_head_hp {
    sd_head_type type;       // SD_HEAD_EAGLE3, SD_HEAD_MEDUSA or SD_HEAD_MOA
    // The head's own shape. EAGLE-3: one decoder layer of width n_embd whose
    // Q/K/V read 2*n_embd inputs. Medusa: n_medusa residual blocks of width n_embd.
    int n_embd;              // == the target's n_embd (the heads read its states directly)
    int n_head, n_head_kv, head_dim, n_ff;   // EAGLE-3 layer
    int n_medusa;            // Medusa: number of heads (head k drafts the token k+2 ahead)
    int n_draft_vocab;       // rows of the output matrix (the reduced vocabulary)
    float rms_eps;
    float rope_base;         // RoPE of the EAGLE-3 layer: pairs (2i, 2i+1), theta = base^(-2i/head_dim)
    int extract[3];          // EAGLE-3: target layers whose output rows (sd_batch.hidden_layers) are fused
    int norm_before_residual; // EAGLE-3: 1: the attention residual is the normed fused state, 0: the raw one
    // MoA (docs/moa.md): SA and CA are decoder layers of the shape above
    // (n_head, n_head_kv, head_dim, n_ff, rope_base); LSA runs over the
    // target's layers with its own shape; no draft output matrix (the
    // target's final norm and the draft-vocabulary rows of its output matrix).
    int moa_tli;             // N: target layers run after CA (0: CA predicts the last layer's output)
    int moa_no_lsa;          // 1: no LSA decoder layer (the layers' mean K,V row is projected directly)
    int moa_ca_hidden;       // 1: CA's keys and values also read the target's state entering layer L-N
                             //    (TLI 0: its final normed state), RMS-scaled, through ca.hidden (E x E)
    int moa_sa_hidden;       // 1: every drafted row's SA input also adds that state of the last verified
                             //    position, through sa.hidden (E x E) (as EAGLE's input reads it)
    int moa_sa_full;         // 1: SA also attends to every verified position's row (the whole text),
                             //    not only the root and the drafted rows after it
    int moa_kv_width;        // Ekv = 2 * target n_head_kv * target head_dim: one layer's K,V row
    int moa_lsa_n_head, moa_lsa_n_head_kv, moa_lsa_head_dim, moa_lsa_n_ff; // LSA layer (lsa_n_head * lsa_head_dim == Ekv)
    // What the head was made for (checked against a target at load).
    int target_n_vocab, target_n_embd, target_n_layer;
    uint64_t target_vocab_hash; // sd_head_vocab_hash of the target's tokenizer
} sd_head_hp;

// One parameter tensor: a matrix (ne1 rows of ne0 floats, y = W x reads a
// row per output) or a vector (ne1 == 1), at w + off.
typedef struct sd_head_tensor {
    char name[48];           // GGUF tensor name, e.g. "blk.0.attn_q.weight"
    int64_t ne0, ne1;
    size_t off;              // offset in floats into sd_head.w
    int is_norm;             // 1: an RMSNorm gain (initialised to 1, stored F32 in files)
} sd_head_tensor;

// EAGLE-3 tensor indices into sd_head.t.
enum {
    SD_E3_FC = 0,            // fc.weight (n_embd, 3*n_embd): fused state g = fc [h_l0; h_l1; h_l2]
    SD_E3_ATTN_NORM,         // blk.0.attn_norm.weight (n_embd): gain of the token embedding's norm
    SD_E3_HIDDEN_NORM,       // blk.0.attn_norm_2.weight (n_embd): gain of the fused state's norm (hidden_norm in old files)
    SD_E3_WQ,                // blk.0.attn_q.weight (n_head*head_dim, 2*n_embd)
    SD_E3_WK,                // blk.0.attn_k.weight (n_head_kv*head_dim, 2*n_embd)
    SD_E3_WV,                // blk.0.attn_v.weight (n_head_kv*head_dim, 2*n_embd)
    SD_E3_WO,                // blk.0.attn_output.weight (n_embd, n_head*head_dim)
    SD_E3_FFN_NORM,          // blk.0.ffn_norm.weight (n_embd)
    SD_E3_GATE,              // blk.0.ffn_gate.weight (n_ff, n_embd)
    SD_E3_UP,                // blk.0.ffn_up.weight (n_ff, n_embd)
    SD_E3_DOWN,              // blk.0.ffn_down.weight (n_embd, n_ff)
    SD_E3_OUT_NORM,          // output_norm.weight (n_embd)
    SD_E3_OUT,               // output.weight (n_draft_vocab, n_embd)
    SD_E3_N
};
// Medusa head k (0-based) uses tensors SD_MD_BASE(k) + {0: medusa.k.fc.weight
// (n_embd, n_embd), 1: medusa.k.fc.bias (n_embd), 2: medusa.k.output.weight
// (n_draft_vocab, n_embd)}.
#define SD_MD_PER_HEAD 3
#define SD_MD_FC(k) ((k) * SD_MD_PER_HEAD + 0)
#define SD_MD_BIAS(k) ((k) * SD_MD_PER_HEAD + 1)
#define SD_MD_OUT(k) ((k) * SD_MD_PER_HEAD + 2)

typedef struct sd_head {
    sd_head_hp hp;
    int n_t;
    sd_head_tensor t[SD_HEAD_MAX_TENSORS];
    float *w;                // (n_w) every parameter, tensor after tensor (64-byte aligned)
    size_t n_w;
    int32_t *d2t;            // (n_draft_vocab) target token id of each draft id (strictly increasing)
    int32_t *t2d;            // (target_n_vocab) draft id of each target token, -1 outside the draft vocabulary
    // Free-form facts kept in the file (training recipe, loss, agreement): "key=value" lines.
    char note[1024];
    // The EAGLE-3 runners' shared parameters in their compute type (sd_e3_new
    // with share): made by the first runner that asks, freed with the head.
    struct sd_e3_pack *e3_shared;
    // The MoA runners' shared parameters (sd_moa_run_new with share), likewise.
    struct sd_moa_w *moa_shared;
} sd_head;

// Pointer to tensor i's floats.
static inline float *sd_head_w(const sd_head *h, int i) { return h->w + h->t[i].off; }

// Default hyper-parameters of a head of type for target m: EAGLE-3 copies the
// target's attention shape and n_ff, extract = {2, L/2, L-3} (clamped into
// [0, L)); Medusa: n_medusa = 4. n_draft_vocab = min(8192, target vocab).
sd_head_hp sd_head_default_hp(const sd_model *m, int type);
// Allocates a head with hp (tensor table built from hp, parameters zero,
// d2t = the first n_draft_vocab ids until sd_head_set_vocab). Returns 0 or <0.
int sd_head_new(sd_head **out, const sd_head_hp *hp, char *err, size_t errlen);
void sd_head_free(sd_head *h);
// A new head equal to h (hyper-parameters, parameters, draft vocabulary,
// note). Returns 0 or <0 (out of memory).
int sd_head_copy(sd_head **out, const sd_head *h, char *err, size_t errlen);
// Random initialisation (deterministic for seed): matrices uniform in
// +-1/sqrt(ne0) (output and fc scaled as docs/heads.md says), norm gains 1, biases 0.
void sd_head_init(sd_head *h, uint64_t seed);
// Sets the draft vocabulary: ids (n = hp.n_draft_vocab distinct target ids,
// any order; sorted on the way in). Returns 0 or <0 (duplicates, out of range).
int sd_head_set_vocab(sd_head *h, const int32_t *ids, int n, char *err, size_t errlen);

// The draft distribution over the target's vocabulary from draft logits lg
// (n_draft_vocab): softmax(lg) at the ids d2t, zero elsewhere; row has n_row
// (>= target_n_vocab) floats.
void sd_head_draft_probs(const sd_head *h, const float *lg, float *row, int n_row);

// Appends tensor `name` (ne0 x ne1 floats; is_norm: a norm gain or bias, kept
// f32) to h's layout at *off (in floats), and moves *off past it, each tensor
// 64-byte aligned. For the layouts of every head type (head.c, moa.c).
void sd_head_add_tensor(sd_head *h, const char *name, int64_t ne0, int64_t ne1, int is_norm, size_t *off);

// Fingerprint of a target's vocabulary: FNV-1a 64 over every token's text
// and its length, in id order.
uint64_t sd_head_vocab_hash(const sd_model *m);
// Fills hp.target_* from m.
void sd_head_bind_target(sd_head_hp *hp, const sd_model *m);
// 0 if the head was made for m, else <0 with a message naming what differs
// (hidden size, vocabulary size, layer count, vocabulary fingerprint).
int sd_head_check_target(const sd_head *h, const sd_model *m, char *err, size_t errlen);

// File layouts of an EAGLE-3 head (docs/heads.md, "Files"). LLAMA:
// llama.cpp's `eagle3` (eagle3.target_layers numbering layer inputs, d2t the
// target ids, blk.0.attn_norm_2), written since 2026-11-28. V1: specdec's
// first layout (eagle3.extract_layers numbering block outputs, d2t as
// offsets, blk.0.hidden_norm), still read; written only for tests.
enum { SD_HEAD_LAYOUT_LLAMA = 0, SD_HEAD_LAYOUT_V1 = 1 };

// Writes the head as GGUF (docs/heads.md: EAGLE-3 in llama.cpp's `eagle3`
// layout, Medusa in specdec's `medusa` layout); matrices as wtype
// (SD_TYPE_F32, SD_TYPE_F16 or SD_TYPE_Q8_0), norm gains and biases F32.
// Written to path.tmp then renamed: an error (full disk) leaves an existing
// file at path intact. Without a target the file has no tokenizer: specdec
// loads it, llama.cpp does not (sd_head_save_for).
int sd_head_save(const sd_head *h, const char *path, int wtype, char *err, size_t errlen);
// The same with target's tokenizer keys (`tokenizer.*`, copied) in an EAGLE-3
// file, which llama.cpp needs to load it as a draft model. target: the model
// the head was made for (refused otherwise) or NULL (as sd_head_save).
int sd_head_save_for(const sd_head *h, const sd_model *target, const char *path, int wtype, char *err,
                     size_t errlen);
// The same in a chosen layout (SD_HEAD_LAYOUT_*; V1 writes no tokenizer).
int sd_head_save_ex(const sd_head *h, const sd_model *target, int layout, const char *path, int wtype, char *err,
                    size_t errlen);
// Loads and validates a head file (every key and tensor shape; values
// dequantized to floats). m: the target it must match (NULL: no check).
int sd_head_load(sd_head **out, const char *path, const sd_model *m, char *err, size_t errlen);
// The same from a head file's bytes in memory (buf must outlive the call only); name: for messages.
int sd_head_load_mem(sd_head **out, const void *buf, size_t size, const char *name, const sd_model *m, char *err,
                     size_t errlen);

#endif
