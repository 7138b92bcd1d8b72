// gpu_session.h - internal: what session.c, forward.c and batcher.c call of
// the CUDA path (gpu.c). A session with s->gkv set runs its passes on the
// device; every session of a pass must then be one.
#ifndef SD_GPU_SESSION_H
#define SD_GPU_SESSION_H

#include "runtime/forward.h"

// The device scratch holds at least this many rows (at least the largest graph bucket, 64).
#define SD_GPU_MIN_ROWS 512
// Logit rows of a session's buffer pinned for the device's copies (a tree's worth).
#define SD_GPU_PIN_ROWS 64

// want: 1 on the device, -1 on the CPU, 0 as sd_gpu_enable says. 0, or <0 with a message.
int sd_gpu_session_init(sd_session *s, int want, char *err, size_t errlen);
void sd_gpu_session_free(sd_session *s);
// sd_fwd_run on the device: 0, or <0 with a message (the sessions then hold no pending rows).
int sd_gpu_fwd_run(const sd_fwd_pass *p, char *err, size_t errlen);
// The KV moves of a commit (rows[first..n_rows) to slots n_past + k).
int sd_gpu_commit(sd_session *s, const int32_t *rows, int first, int n_rows, char *err, size_t errlen);

#endif
