// quant.h - tensor types, block formats, dot-product kernels (the type
// traits); the batched matrix multiply that uses them is in kernels/matmul.h.
//
// Type ids and block layouts are those of the GGUF format (ggml numbering), so
// GGUF files load without conversion. For each weight type there is:
//   - a plain scalar reference: dequantize a row, quantize a row, and a dot
//     product against the activation format (the "vec_dot_type");
//   - optimized kernels (AVX2, AVX-512, VNNI) chosen at run time from the CPU.
// Tests compare reference and optimized kernels on random blocks (rule 11).
#ifndef SD_QUANT_H
#define SD_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum sd_type {
    SD_TYPE_F32 = 0, SD_TYPE_F16 = 1, SD_TYPE_Q4_0 = 2, SD_TYPE_Q4_1 = 3,
    SD_TYPE_Q5_0 = 6, SD_TYPE_Q5_1 = 7, SD_TYPE_Q8_0 = 8, SD_TYPE_Q8_1 = 9,
    SD_TYPE_Q4_K = 12, SD_TYPE_Q5_K = 13, SD_TYPE_Q6_K = 14, SD_TYPE_Q8_K = 15,
    SD_TYPE_BF16 = 30,
    SD_TYPE_FILE_COUNT = 40, // ids below this are ggml's; a file's tensor type must be one of them
    // Internal "repacked" weight types (never valid in a file): the same matrix
    // as base type X, rows rewritten once at load into the layout the CPU's
    // kernel reads fastest (same bytes per row). See sd_quant_repack_type.
    SD_TYPE_Q4_0_R = 40, SD_TYPE_Q4_1_R = 41, SD_TYPE_Q5_0_R = 42, SD_TYPE_Q5_1_R = 43,
    SD_TYPE_Q8_0_R = 44, SD_TYPE_Q4_K_R = 45, SD_TYPE_Q5_K_R = 46, SD_TYPE_Q6_K_R = 47,
    SD_TYPE_COUNT = 48,
};

// ---- block layouts (ggml-compatible; packed, little endian) ----
#define SD_QK 32    // block size of the legacy quants
#define SD_QK_K 256 // super-block size of the K-quants
typedef struct { uint16_t d; int8_t qs[SD_QK]; } sd_block_q8_0;                       // 34 B
typedef struct { uint16_t d; uint8_t qs[SD_QK / 2]; } sd_block_q4_0;                  // 18 B
typedef struct { uint16_t d, m; uint8_t qs[SD_QK / 2]; } sd_block_q4_1;               // 20 B
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[SD_QK / 2]; } sd_block_q5_0;   // 22 B
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[SD_QK / 2]; } sd_block_q5_1; // 24 B
typedef struct { float d, s; int8_t qs[SD_QK]; } sd_block_q8_1;  // activation format: s = d * sum(qs); (internal, 40 B)
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[SD_QK_K / 2]; } sd_block_q4_K;              // 144 B
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[SD_QK_K / 8]; uint8_t qs[SD_QK_K / 2]; } sd_block_q5_K; // 176 B
typedef struct { uint8_t ql[SD_QK_K / 2]; uint8_t qh[SD_QK_K / 4]; int8_t scales[SD_QK_K / 16]; uint16_t d; } sd_block_q6_K; // 210 B
typedef struct { float d; int8_t qs[SD_QK_K]; int16_t bsums[SD_QK_K / 16]; } sd_block_q8_K; // activation format, 292 B

// Reference kernels, all scalar C.
typedef void (*sd_to_float_fn)(const void *src, float *dst, int64_t n);   // n multiple of blck
typedef void (*sd_from_float_fn)(const float *src, void *dst, int64_t n);
// Activation packer of a weight type (internal: matmul.c and the kernels):
// writes blocks [b0, b1) (of SD_QK elements) of token t of an n_tok-token
// batch, x (the token's n_in floats), into the batch's buffer dst in the
// layout the type's tile kernel reads, and returns the bytes per token (the
// buffer holds n_tok times that). A block's bytes do not depend on b0, b1.
// dst NULL: only the size.
typedef size_t (*sd_act_pack_fn)(const float *x, void *dst, int64_t n_in, int64_t t, int64_t n_tok, int64_t b0,
                                 int64_t b1);
// Dot product of one weight row (type T, n elements) with one activation row
// already converted to traits[T].vec_dot_type.
typedef float (*sd_vec_dot_fn)(int64_t n, const void *w, const void *x);
// Optional tile kernel: for weight rows r in [r0, r1) and tokens t < n_tok,
// y[t * ldy + r] = dot(row r of W, activation row t). W rows are w_row_bytes
// apart; activation rows (already converted to vec_dot_type) are x_row_bytes
// apart. Reads each weight block once for all tokens. NULL: sd_matmul falls
// back to vec_dot per (row, token).
typedef void (*sd_gemm_fn)(int64_t n_in, const void *W, size_t w_row_bytes, int64_t r0, int64_t r1,
                           const void *xq, size_t x_row_bytes, int64_t n_tok, float *y, int64_t ldy);

// Rewrites n_rows rows of n_in elements of a base type (src, the file's
// layout) into a repacked type's layout (dst, the same number of bytes).
// Returns 0, or -1 when the kernel does not handle rows of n_in elements
// (dst is then unspecified and must not be used).
typedef int (*sd_repack_fn)(const void *src, void *dst, int64_t n_in, int64_t n_rows);

typedef struct {
    const char *name;          // "Q4_K", ...
    int blck;                  // elements per block
    size_t tsize;              // bytes per block
    int supported;             // 1 if specdec can compute with this type
    int vec_dot_type;          // activation format for dots (Q8_0, Q8_1, Q8_K, F32, ...)
    sd_to_float_fn to_float;   // reference dequantization
    sd_from_float_fn from_float; // reference quantization (weights and activations)
    sd_vec_dot_fn vec_dot_ref; // reference dot
    sd_vec_dot_fn vec_dot;     // best available dot for this CPU (may equal ref)
    sd_gemm_fn gemm;           // best available tile kernel, or NULL
    // Repacked types only (ids >= SD_TYPE_FILE_COUNT): set by the kernel
    // selection when this CPU has a kernel for the layout (supported = 1,
    // gemm set, to_float / vec_dot NULL); base is the file type it stands for.
    sd_repack_fn repack;       // base rows -> this layout, or NULL
    int base;                  // base type id (meaningful when repack != NULL)
} sd_type_traits;

// Traits for type t (a zero entry with supported=0 for unknown ids < SD_TYPE_COUNT);
// NULL if t is out of range. Optimized pointers are set by the kernel
// selection; the first use without one installs "auto" (sd_quant_init(0)).
const sd_type_traits *sd_type_get(int t);
// The kernel family is fixed once per process by the public
// sd_backend_select (include/specdec.h), or "auto" by the first model load
// (sd_quant_fix_for_model). The two functions below are for TESTS ONLY, of
// kernels that never run a session: they reinstall the table at any time,
// bypassing that rule, and must not run while any session computes.
// sd_quant_init: the best kernels of this CPU (force_ref=0) or the scalar
// references everywhere (force_ref=1); thread-safe.
void sd_quant_init(int force_ref);
// Test only, as sd_quant_init: installs a family by name: "auto" (what
// sd_quant_init(0) picks), "scalar" (= sd_quant_init(1)), "avx2" (the AVX2
// kernels, legacy quants and K-quants, even on an AVX-512 CPU) or
// "avx512-vnni". Returns 0, or -1 for an unknown name or a CPU (or build)
// without it; the best family is installed then.
int sd_quant_init_backend(const char *name);
// Name of the installed kernel family, e.g. "avx512-vnni", "avx2", "scalar"
// ("scalar" before any installation; sd_backend_name installs "auto" first).
const char *sd_quant_backend(void);
// Internal (matmul.c): the vector width of the installed family, for the
// kernels outside the traits table (the float-activation tiles): 2
// "avx512-vnni", 1 "avx2", 0 "scalar" (installs "auto" first if nothing is).
int sd_quant_simd_level(void);
// Called by model loading: fixes the family for the process ("auto" unless
// sd_backend_select chose one; installed if no table is), after which
// sd_backend_select of another family fails.
void sd_quant_fix_for_model(void);
// The repacked type that file type t's matrices with rows of n_in elements
// can be rewritten to for this CPU's kernels, or -1 (none: use t as it is).
// The repacked matrix gives the same bits as t through sd_matmul.
int sd_quant_repack_type(int t, int64_t n_in);
// Bytes of a row of n elements (n must be a multiple of blck).
size_t sd_row_size(int t, int64_t n);

#endif
