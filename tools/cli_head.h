// cli_head.h - `--head FILE|auto` for the commands that draft with a trained
// head (generate, bench, serve).
#ifndef SD_CLI_HEAD_H
#define SD_CLI_HEAD_H

#include "specdec.h"
#include "specdec_spec.h"

// Loads the head named by spec for target m (model_path: for messages).
// "auto" looks for a head made for m in heads/ of the working directory, then
// in heads/ beside the specdec binary's folder (the repository of a build);
// when none matches, *out is NULL and a note says so. quiet: 0 says which
// file was found too, CLI_HEAD_QUIET_FOUND only when none was, 1 nothing. A file
// that is not a head, or a head made for another model, is an error.
// Returns 0, or 1 after a message.
#define CLI_HEAD_QUIET_FOUND 2
int cli_head_load(const char *spec, const sd_model *m, const char *model_path, int quiet, sd_head **out);
// The same, where "auto" looks for a head of kind want (SD_HEAD_EAGLE3,
// _MEDUSA, _MOA; SD_HEAD_NONE: an EAGLE-3 head, else the first head of any
// kind in name order). A file named by spec is loaded whatever its kind.
int cli_head_load_type(const char *spec, const sd_model *m, const char *model_path, sd_head_type want, int quiet,
                       sd_head **out);
// For the commands that take a head of each kind (bench, serve): spec FILE
// loads that file into out[*n]; "auto" loads the first file of each kind
// (EAGLE-3, Medusa, MoA) made for m into out[*n], out[*n + 1], .. (a note
// when there is none). *n counts the loaded heads; more than max is an
// error. Returns 0, or 1 after a message.
int cli_heads_load(const char *spec, const sd_model *m, const char *model_path, int quiet, sd_head **out, int max,
                   int *n);

// --datastore FILE|auto|none (spec NULL: not given): the n-gram lookup's
// datastore into path ("" for none). auto looks for data/datastore/NAME.txt
// (NAME: the model file's name without ".gguf", then without its last dot
// part, as heads/ names them: SmolLM2-135M-Instruct) in the working
// directory, then beside the binary's folder; --head auto (head_spec)
// implies it when --datastore is not given. quiet: 0 says which file was
// found (or that none was), CLI_HEAD_QUIET_FOUND only that none was for an
// explicit auto, 1 nothing. A FILE that cannot be read is an error. Returns
// 0, or 1 after a message.
int cli_datastore_resolve(const char *spec, const char *head_spec, const char *model_path, int quiet, char *path,
                          size_t pathlen);

// The kind's name in messages ("EAGLE-3 head", "Medusa head", "MoA drafter";
// "head" for SD_HEAD_NONE) and its train-head --type value ("eagle3", ...).
const char *cli_head_kind_name(sd_head_type t);
const char *cli_head_kind_arg(sd_head_type t);
// Puts h (NULL: nothing) in env's slot for its kind (head_eagle3,
// head_medusa or head_moa).
void cli_env_set_head(sd_method_env *env, const sd_head *h);

// After the runs of an online drafter (--head-online): waits for the windows
// still being trained, says what was learnt on stderr (unless quiet) and
// writes the head to save_path when given (--save-head). Returns 0, or 1
// after a message.
int cli_head_online_end(sd_drafter *d, const char *save_path, int quiet);

#endif
