// llama2c.h - converter from llama2.c checkpoints to GGUF.
#ifndef SD_LLAMA2C_H
#define SD_LLAMA2C_H

#include <stddef.h>

// Converts a llama2.c checkpoint (legacy v0 header of 7 int32, or the v1
// header: magic "ak42", version 1, 7 int32, shared-classifier byte, padded to
// 256 bytes; fp32 weights) and its tokenizer.bin into a GGUF file of
// architecture llama with F32 tensors (ggml names, ne[0] = input dimension)
// and a SentencePiece-style ("llama") vocabulary. llama2.c rotates
// consecutive pairs, the GGUF llama convention, so weights are copied without
// permutation. The checkpoint size is checked against its header. Returns 0,
// or <0 with a message (missing, truncated or unknown files, I/O errors).
int sd_llama2c_convert(const char *ckpt, const char *tok, const char *out, char *err, size_t errlen);

#endif
