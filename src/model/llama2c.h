// llama2c.h - converter from llama2.c checkpoints to GGUF.
#ifndef SD_LLAMA2C_H
#define SD_LLAMA2C_H

#include <stddef.h>

// sd_llama2c_convert is public: include/specdec.h.
#include "specdec.h"

#endif
