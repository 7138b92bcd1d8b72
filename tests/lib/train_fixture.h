// train_fixture.h - what the head-training tests share (test_train_cache,
// test_train_loop): a scratch directory, small files, tiny synthetic targets,
// corpora of text records, a real target (stories260K as GGUF, or the default
// model).
#ifndef SD_TEST_TRAIN_FIXTURE_H
#define SD_TEST_TRAIN_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "specdec_train.h"

// Creates the scratch directory /tmp/specdec_<tag>_<pid> (removed by tf_done).
void tf_init(const char *tag);
void tf_done(void);
// out = scratch directory / name.
void tf_path(char *out, size_t n, const char *name);
const char *tf_dir(void);

void tf_rm_rf(const char *path);
int tf_write_file(const char *path, const char *text);
long tf_file_len(const char *path);   // -1 if absent
int tf_same_file(const char *a, const char *b);   // 1: same bytes

// A synthetic llama target (vocabulary 320: pieces "▁w0".."▁w60"), or NULL
// with a message in err.
sd_model *tf_synth_model(int n_embd, int n_layer, uint64_t seed, char *err, size_t errlen);
// The same target written to the GGUF file path (for the command). 0, or <0
// with a message in err.
int tf_synth_gguf(const char *path, int n_embd, int n_layer, uint64_t seed, char *err, size_t errlen);
// n text records of random words "w0".."w59" (record i: 3 + (i * 7) %
// len_spread words; a blank line after the second); one chat record last
// when chat.
void tf_write_corpus(const char *path, int n, int len_spread, uint64_t seed, int chat);
// sd_train_head_default_params for target m on the corpus paths[0] with
// these cache, output and checkpoint paths (one data file; paths must
// outlive the run).
sd_train_head_params tf_run_params(const sd_model *m, const char *const *paths, const char *cache, const char *out,
                                   const char *ckpt);
// copies x 4 text records of short stories (for a real target).
void tf_stories_corpus(const char *path, int copies);
// stories260K converted to GGUF in the scratch directory (once) from
// shared_dir/models, or NULL with the reason in why.
const char *tf_stories_gguf(const char *shared_dir, char *why, size_t n);
// A real target for the cases whose bars need one (a model that predicts
// the stories of tf_stories_corpus well): stories260K (tf_stories_gguf)
// where shared_dir has it, else the default model
// models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-models.sh; slower,
// about 20 s of CPU for a short training run), else NULL with the reason in
// why.
const char *tf_real_target(const char *shared_dir, char *why, size_t n);

#endif
