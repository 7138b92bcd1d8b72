// specdec.h - public C API of the specdec inference engine.
//
// Lifetimes (docs/house-rules.md, rule 1): an sd_model is immutable after loading and can be
// shared by many sessions; an sd_session owns all mutable state (KV cache,
// logits, scratch), sized once at creation. Every function that can fail
// returns 0 (or a non-negative count) on success and a negative value on error,
// with a message in the caller's buffer (err, errlen). The library never
// prints and never exits.
#ifndef SPECDEC_H
#define SPECDEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// SD_API marks the functions the library exports (build/libspecdec.so
// exports exactly these; tests/house/test_exports.py checks it).
#if defined(__GNUC__) || defined(__clang__)
#define SD_API __attribute__((visibility("default")))
#else
#define SD_API
#endif

// What kind of failure a negative return value is. Functions that predate
// these codes return -1 (SD_ERR_INPUT) for every failure; those that document
// sd_status return the specific code.
typedef enum sd_status {
    SD_OK = 0,
    SD_ERR_INPUT = -1,    // bad arguments or bad data (a file's contents, a state's bytes)
    SD_ERR_NO_ROOM = -2,  // no room in the KV cache / context for what was asked
    SD_ERR_ABORTED = -3,  // stopped by the caller (a callback asked to stop)
    SD_ERR_OOM = -4,      // out of memory
    SD_ERR_IO = -5,       // a file could not be opened, read or written
    SD_ERR_BUSY = -6,     // the thread pool is held by another forward at that moment
} sd_status;

// The kinds of trained draft heads (one enum for files, methods and training).
typedef enum sd_head_type { SD_HEAD_NONE = 0, SD_HEAD_EAGLE3 = 1, SD_HEAD_MEDUSA = 2, SD_HEAD_MOA = 3 } sd_head_type;

// The library's version, "MAJOR.MINOR.PATCH" (also SPECDEC_VERSION).
#define SPECDEC_VERSION "0.2.0"
SD_API const char *sd_version(void);

typedef struct sd_model sd_model;
typedef struct sd_session sd_session;
typedef struct sd_tokenizer sd_tokenizer;
typedef struct sd_sampler sd_sampler;
typedef struct sd_threadpool sd_threadpool;

// ---------------------------------------------------------------- model
// Loads and validates a GGUF model (architectures: llama, qwen2), including
// its tokenizer. The file is memory-mapped; weights are used in place.
// Returns 0, SD_ERR_IO (the file cannot be opened or mapped), SD_ERR_OOM,
// or SD_ERR_INPUT (not a valid model), with a message.
SD_API int sd_model_load(sd_model **out, const char *path, char *err, size_t errlen);
// A part of a model, for pipeline parallelism (one model's layers split
// over processes, docs/mpi.md): the file is validated as a whole, but only
// the weights of layers [layer_lo, layer_hi) and, with output != 0, the
// final norm and the output matrix are read (repacked, mapped in); the other
// pages of the file are never touched, so the process's memory is about its
// share. layer_lo = 0, layer_hi = -1, output = 1 is the whole model
// (sd_model_load). Sessions of a part cache only its layers and run only its
// layers (sd_session_forward_part). Returns as sd_model_load, and
// SD_ERR_INPUT for a range outside [0, n_layer].
SD_API int sd_model_load_part(sd_model **out, const char *path, int layer_lo, int layer_hi, int output, char *err,
                              size_t errlen);
SD_API void sd_model_free(sd_model *m);

typedef struct sd_model_info {
    const char *arch;   // "llama" or "qwen2"
    const char *name;   // general.name or ""
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int n_ctx_train;    // context length the model was trained with
    size_t n_bytes;     // bytes of tensor data
    int layer_lo, layer_hi; // the layers held (sd_model_load_part): [lo, hi); the whole model: 0, n_layer;
                            // a split client's file (docs/split.md): n_layer, n_layer (none: it runs nothing)
    int has_output;     // 1: the final norm and output matrix are held
    size_t n_bytes_held; // bytes of tensor data of the held layers and output
} sd_model_info;
SD_API void sd_model_get_info(const sd_model *m, sd_model_info *info);
SD_API const sd_tokenizer *sd_model_tokenizer(const sd_model *m);
// The input embedding of token (a row of token_embd, dequantized with the
// reference conversion of its type): n_embd floats into out. A batch of
// these rows (sd_batch.embd) gives the same bits as the batch of the tokens.
// Returns 0, or <0 if token is out of range [0, n_vocab).
SD_API int sd_model_token_embd(const sd_model *m, int32_t token, float *out, char *err, size_t errlen);

// ---------------------------------------------------------------- threads
// A pool of worker threads that sessions run their forward passes on (house
// rule 8). Made once and passed to every session that should share it (a
// target and its draft models, the slots of a server): sessions sharing a
// pool take turns, they never run forward calls at the same time. The rule
// is enforced: a forward on a pool that another forward (or
// sd_threadpool_run) holds at that moment fails with a message instead of
// corrupting either. Reference-counted: a session keeps the pool alive, so
// the pool may be freed before or after the sessions that use it.
//
// sd_threadpool_new starts n_threads threads, the calling thread included
// (0 = the number of online cores; at most 1024). Returns 0, or <0 with a
// message.
SD_API int sd_threadpool_new(sd_threadpool **out, int n_threads, char *err, size_t errlen);
// Releases the caller's reference; the threads stop with the last one. NULL: nothing.
SD_API void sd_threadpool_free(sd_threadpool *p);
// Threads of the pool, the caller included (1 for NULL).
SD_API int sd_threadpool_size(const sd_threadpool *p);
// Calls fn(arg, ith, nth) on every thread of the pool (the caller is thread
// 0, nth = sd_threadpool_size(p)) and waits for all (p NULL: fn(arg, 0, 1)).
// It takes its turn: it waits while a forward holds the pool, and a forward
// that starts meanwhile fails. Not reentrant: fn must not run a forward or
// sd_threadpool_run on the same pool.
SD_API void sd_threadpool_run(sd_threadpool *p, void (*fn)(void *arg, int ith, int nth), void *arg);

// ---------------------------------------------------------------- session
typedef struct sd_session_params {
    int n_ctx;       // KV cache length in tokens; 0 = min(model's n_ctx_train, 4096)
    int n_batch;     // most tokens in one forward call; 0 = 512
    int n_threads;   // 0 = number of online cores (ignored with pool)
    sd_threadpool *pool; // NULL: the session starts its own pool of n_threads; otherwise it runs on this
                         // one (and keeps a reference to it); sessions on one pool take turns
    int gpu;         // 1: the KV cache and every forward on the GPU (a CUDA build: `make CUDA=1`);
                     // -1: on the CPU; 0: as sd_gpu_enable set it for the process (default: CPU)
} sd_session_params;
// The CUDA path. sd_gpu_available: 0 and a line naming the device, or <0
// and the reason (no CUDA in this build, no device). sd_gpu_enable(1): the
// sessions created afterwards run on the GPU unless their params say -1
// (the model's weights go to the device, dequantised to bf16, with its first
// GPU session); fails when sd_gpu_available does. docs/gpu.md.
SD_API int sd_gpu_available(char *info, size_t infolen);
SD_API int sd_gpu_enable(int on, char *err, size_t errlen);
SD_API sd_session_params sd_session_default_params(void);
// Returns 0, SD_ERR_OOM (the KV cache and scratch do not fit in memory) or
// SD_ERR_INPUT (bad parameters), with a message.
SD_API int sd_session_new(sd_session **out, const sd_model *m, const sd_session_params *p,
                   char *err, size_t errlen);
SD_API void sd_session_free(sd_session *s);

// Most entries of sd_batch.hidden_layers, and the entry that names the final
// RMS-normed state (the output matrix's input) instead of a layer's output.
#define SD_MAX_HIDDEN_LAYERS 8
#define SD_HIDDEN_NORM (-1)

// A batch of tokens (or embedding rows) evaluated in one forward call. Node i attends to the
// committed KV cache [0, n_past) and to the batch nodes on its ancestor chain
// (parent[i], parent[parent[i]], ...) and itself, nothing else. parent[i] < i,
// or -1 for a node hanging directly off the committed cache. parent == NULL
// means a chain (parent[i] = i - 1). pos == NULL means pos[i] = n_past + depth
// (depth 0 for parent -1). logits == NULL requests logits for every node,
// otherwise only where logits[i] != 0.
typedef struct sd_batch {
    int n;                   // number of nodes, 1..n_batch
    const int32_t *tokens;   // (n), or NULL with embd
    const int32_t *parent;   // (n) or NULL
    const int32_t *pos;      // (n) or NULL
    const uint8_t *logits;   // (n) or NULL
    // 1: every matrix multiply of this forward uses float activations against
    // the dequantized weights instead of 8-bit activations: slower (about 2x
    // on the default model), more accurate. Prompts are evaluated so by
    // default (sd_gen_params.fast_prompt); tokens being generated or verified
    // never are, so a token gets the same bits alone as in a tree batch.
    int precise;

    // Hidden-state rows out (EAGLE-style drafters, training data). Each entry
    // of hidden_layers names a state of the residual stream: l in
    // [0, n_layer) the stream after transformer block l (after its attention
    // and FFN residual adds; a skipped layer's equals its input), or
    // SD_HIDDEN_NORM the final RMS-normed state (the output matrix's input).
    // For the r-th wanted node (in batch order) and the k-th entry, the
    // forward writes n_embd floats at
    // hidden_out + ((size_t)r * n_hidden_layers + k) * n_embd: one node's rows
    // are contiguous. The rows are the values the forward really computed;
    // asking for them changes no logit bit. A forward that fails writes
    // nothing. n_hidden_layers == 0: none (hidden_layers, hidden and
    // hidden_out are then ignored).
    const int32_t *hidden_layers; // (n_hidden_layers) layer indices or SD_HIDDEN_NORM; entries may repeat
    int n_hidden_layers;          // 0..SD_MAX_HIDDEN_LAYERS
    const uint8_t *hidden;        // (n) nonzero: node i's rows are wanted; NULL: every node's
    float *hidden_out;            // (n_wanted, n_hidden_layers, n_embd) caller-owned, written by the forward

    // Embedding rows as input: when set, row i (n_embd floats) is node i's
    // input in place of the token embedding lookup (a drafter feeding fused
    // features, a soft prompt). Exactly one of tokens and embd must be set.
    const float *embd;            // (n, n_embd) or NULL: tokens
} sd_batch;

// Evaluates the batch. The KV rows of the batch are written as pending rows
// after the committed ones; they become part of the cache only through
// sd_session_commit. A new forward call discards the pending rows of the
// previous one. Fails, leaving the session untouched, when the session's
// thread pool is held at that moment by another forward or
// sd_threadpool_run (sessions sharing a pool must take turns).
// Returns 0, SD_ERR_NO_ROOM (the batch does not fit the context),
// SD_ERR_BUSY (the pool is held), or SD_ERR_INPUT (a bad batch), with a message.
SD_API int sd_session_forward(sd_session *s, const sd_batch *b, char *err, size_t errlen);

// Pipeline parallelism (docs/mpi.md): one forward split by layers over the
// sessions of several processes, each on a model part (sd_model_load_part).
// sd_session_forward_part runs layers [layer_lo, layer_hi) of batch b --
// which must lie in the part the model holds, unless empty -- writing their
// KV rows as pending rows, as sd_session_forward does for every layer. Its
// input is the batch's token embeddings when layer_lo is 0, else the batch's
// embd rows: the residual stream entering layer_lo (what the part before
// wrote to x_out). With x_out, every node's residual stream after layer
// layer_hi - 1 is written there (n, n_embd); with output (layer_hi ==
// n_layer, a part loaded with its output) the final norm and the output
// matrix run after, giving logits (sd_session_logits) and SD_HIDDEN_NORM
// rows. The wanted hidden rows (sd_batch.hidden_layers) of the layers in
// the range are written, the others left as they are; so the parts run in
// order give every logit and hidden row the bits of one whole forward. A
// part with layer_lo == layer_hi runs no layer (the output stage alone).
// Returns as sd_session_forward, SD_ERR_INPUT for a range or output the
// model does not hold.
typedef struct sd_forward_part {
    int layer_lo, layer_hi; // the layers to run, [lo, hi)
    int output;             // 1: the output stage after them (needs layer_hi == n_layer)
    float *x_out;           // (n, n_embd) the residual rows after layer_hi - 1, or NULL
} sd_forward_part;
SD_API int sd_session_forward_part(sd_session *s, const sd_batch *b, const sd_forward_part *part, char *err,
                                   size_t errlen);
// A program's hooks on a session (the pipeline's first process): with
// forward set, sd_session_forward calls it instead of evaluating the batch
// (it runs the parts, locally and elsewhere, and leaves the session as a
// whole forward would); commit and truncate are called after a successful
// sd_session_commit / sd_session_truncate of the session (rows NULL: all
// n_rows pending rows of a chain), so that the other parts' caches follow.
// Everything the step API and the drafters do goes through these. release,
// when set, is called as sd_session_free begins (the other parts free their
// copies). h NULL removes them; the struct is copied.
typedef struct sd_session_hooks {
    int (*forward)(void *arg, sd_session *s, const sd_batch *b, char *err, size_t errlen);
    void (*commit)(void *arg, const int32_t *rows, int n_rows);
    void (*truncate)(void *arg, int n_past);
    void *arg;
    void (*release)(void *arg);
} sd_session_hooks;
SD_API void sd_session_set_hooks(sd_session *s, const sd_session_hooks *h);
// A program's hook on every new session of model m (the pipeline's first
// process): fn runs at the end of each successful sd_session_new on m --
// those a drafter makes on the target itself (layer skipping) included --
// and may set the session's hooks; when it fails (<0 with a message) the
// session is freed and sd_session_new returns its code and message. fn NULL
// removes it. Sessions made before are not touched.
SD_API void sd_model_set_session_hook(sd_model *m, int (*fn)(void *arg, sd_session *s, char *err, size_t errlen),
                                      void *arg);

// Logits (n_vocab floats) of batch node i of the last forward, or NULL if not requested.
SD_API const float *sd_session_logits(const sd_session *s, int i);
// Keeps pending rows rows[0..n_rows) (batch indices forming a root-to-node
// chain, in order) and appends them to the committed cache; drops the other
// pending rows. rows == NULL keeps all n rows of the last batch (a chain).
SD_API int sd_session_commit(sd_session *s, const int32_t *rows, int n_rows, char *err, size_t errlen);
// Drops committed rows so that n_past becomes n (n <= n_past).
SD_API int sd_session_truncate(sd_session *s, int n, char *err, size_t errlen);
SD_API int sd_session_n_past(const sd_session *s);
SD_API int sd_session_n_ctx(const sd_session *s);
SD_API int sd_session_n_batch(const sd_session *s);   // most nodes of one forward
SD_API const sd_model *sd_session_model(const sd_session *s);
// The committed K and V rows of positions pos .. pos+n-1 of layer, as floats:
// k and v (n, n_head_kv * head_dim) each, K with RoPE applied as cached. For
// a program whose drafter reads the target's cache elsewhere (the split's
// MoA client, docs/split.md). 0, or SD_ERR_INPUT (rows not committed, a
// layer the session does not hold, a session whose cache is on the GPU).
SD_API int sd_session_kv_read(const sd_session *s, int layer, int pos, int n, float *k, float *v, char *err,
                              size_t errlen);
// The pool the session runs on (its own or the one it was given).
SD_API sd_threadpool *sd_session_pool(const sd_session *s);
// A session's committed state -- its KV cache rows [0, n_past) and its
// layer-skip mask -- as bytes, so that a generation can be suspended, moved to
// another session of the same model (any n_ctx >= n_past, any thread count)
// or resumed after a reconnect: a session loaded with a state continues
// exactly as the saved one would have (same logits, bit for bit, with the same
// kernel family). Pending rows are not part of it. The caller keeps the
// tokens it committed (the step API's state adds them, specdec_spec.h).
// Bytes a state of the session takes now (depends on n_past).
SD_API size_t sd_session_state_size(const sd_session *s);
// Writes the state into buf (size bytes, at least sd_session_state_size).
// Returns the bytes written, or SD_ERR_INPUT (buffer too small) with a message.
SD_API int sd_session_state_save(const sd_session *s, void *buf, size_t size, char *err, size_t errlen);
// Replaces the session's cache with a saved state (size: its exact bytes).
// Checked before anything changes: SD_ERR_INPUT for bytes that are not a
// state, of another version, truncated or corrupt, or saved from another
// model (dimensions or weights); SD_ERR_NO_ROOM when its rows exceed the
// session's context. Returns 0.
SD_API int sd_session_state_load(sd_session *s, const void *buf, size_t size, char *err, size_t errlen);
// The same through a file: SD_ERR_IO when it cannot be opened, read or
// written, SD_ERR_OOM without memory for the bytes, else as above.
SD_API int sd_session_state_save_file(const sd_session *s, const char *path, char *err, size_t errlen);
SD_API int sd_session_state_load_file(sd_session *s, const char *path, char *err, size_t errlen);

// Layer skipping (self-speculative drafting): skip (n_layer bytes, nonzero =
// skipped) makes every later forward of this session pass the residual stream
// through the skipped layers unchanged; they neither read nor write KV rows
// (their cache slots keep stale contents, never read while the layer stays
// skipped). skip == NULL (or all zeros) restores the full model, bit-identical
// to a session that never skipped. The mask is copied. Changing it does not
// recompute the cache: truncate to 0 (or to a point before which the KV rows
// were computed with the same mask) when switching models. Fails if every
// layer would be skipped. Returns the number of skipped layers, <0 on error.
SD_API int sd_session_set_layer_skip(sd_session *s, const uint8_t *skip, char *err, size_t errlen);
// The current mask (n_layer bytes) or NULL when no layer is skipped.
SD_API const uint8_t *sd_session_layer_skip(const sd_session *s);

// ---------------------------------------------------------------- several sessions in one forward
// A batcher evaluates the batches of several sessions (the slots of a
// server, the users of one model) in ONE forward pass: the rows of all their
// nodes go through every weight matrix together, so the weights are read
// from memory once per pass instead of once per session, while each
// session's nodes attend only to that session's committed cache and to their
// ancestors in that session's batch. It owns the scratch of such a pass,
// sized once for n_nodes nodes in all (house rule 3): a forward allocates
// nothing.
typedef struct sd_batcher sd_batcher;

// Makes a batcher for sessions of model m that run on pool (the pool they
// were made with, sd_session_params.pool, or sd_session_pool of a session;
// the batcher keeps a reference to it). n_nodes: most nodes of all sessions
// together in one sd_batcher_forward, 1..8192. Allocates the activations of
// n_nodes rows and n_nodes rows of logits (n_vocab floats each). Returns 0,
// or <0 with a message.
SD_API int sd_batcher_new(sd_batcher **out, const sd_model *m, sd_threadpool *pool, int n_nodes, char *err,
                   size_t errlen);
// Frees the batcher (its reference to the pool included). NULL: nothing.
SD_API void sd_batcher_free(sd_batcher *b);
// The n_nodes the batcher was made for.
SD_API int sd_batcher_n_nodes(const sd_batcher *b);

// Evaluates bs[i] on session ss[i] for every i < n, in one pass. Afterwards
// each session is exactly as after sd_session_forward(ss[i], &bs[i]): its
// batch's KV rows are its pending rows, sd_session_logits / commit /
// truncate behave the same, its hidden rows (bs[i].hidden_out) are written,
// and every logit and hidden row has the same bits as that call gives (house
// rule 18: a node's result does not depend on the other nodes of the pass).
// Each batch follows sd_batch's rules for its own session (tokens or embd
// rows, parents, positions, logits, hidden rows). Requirements, checked
// before anything is written (on error no session changes): n in 0..n_nodes
// (0: nothing to do, returns 0); every session of the batcher's model and
// pool; no session listed twice; every batch valid for its session
// (1..n_batch nodes, room in its context); at most n_nodes nodes in all; all
// batches precise or none (a pass multiplies all rows one way); the same
// layer-skip mask on every session. Holds the pool's busy flag for the whole
// pass: fails like sd_session_forward when another forward or
// sd_threadpool_run holds the pool (so two calls on one batcher, or a
// batcher pass and a forward of one of its sessions, never run at once).
// One session (n == 1) runs as its own sd_session_forward. Returns 0, or <0
// with a message (SD_ERR_BUSY when the pool is held).
SD_API int sd_batcher_forward(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err,
                       size_t errlen);
// After a failed sd_batcher_forward: the index i of the batch (bs[i],
// ss[i]) that failed its checks, so that a caller can drop that one and pass
// the others again (nothing was written); -1 when the call as a whole failed
// (SD_ERR_BUSY: the pool held by another forward; a bad count), or after a
// call that succeeded.
SD_API int sd_batcher_failed_batch(const sd_batcher *b);
// The batches of several sessions of a model part through layers
// [part->layer_lo, part->layer_hi) in one pass, as sd_session_forward_part
// does for one (pipeline parallelism, docs/mpi.md): each batch's input its
// tokens (layer 0) or its embd rows, part->x_out the residual rows of all
// nodes, the batches' nodes in order (sum of n rows of n_embd), the output
// stage with part->output. Each session's rows get the bits of its own
// sd_session_forward_part. Returns as sd_batcher_forward (and
// sd_batcher_failed_batch names a refused batch).
SD_API int sd_batcher_forward_part(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n,
                                   const sd_forward_part *part, char *err, size_t errlen);

// ---------------------------------------------------------------- tokenizer
// Encodes text into ids. add_bos: prepend BOS when the vocabulary asks for it
// (tokenizer.ggml.add_bos_token, default true for SentencePiece vocabularies).
// parse_special: recognise the texts of control tokens such as "<|im_start|>"
// (user-defined tokens are recognised either way). Text from a user must be
// tokenized with parse_special = 0, or it can write the model's control
// tokens; the programs take a plain (non-chat) prompt that way, and chat
// prompts go through sd_chat_tokenize. Returns the number of ids (which may
// exceed max: call again with a larger buffer), or <0 on error.
SD_API int sd_tokenize(const sd_tokenizer *t, const char *text, size_t len, int add_bos,
                int parse_special, int32_t *out, int max);
// Bytes of token id as text (SentencePiece spaces and byte tokens resolved,
// byte-level BPE mapped back to bytes). Control tokens give "" unless
// render_special. Returns the byte count (may exceed bufsize: truncated), <0 if
// id is invalid. Multi-byte UTF-8 characters may be split across tokens.
SD_API int sd_token_to_piece(const sd_tokenizer *t, int32_t id, int render_special, char *buf, int bufsize);
SD_API int sd_tokenizer_n_vocab(const sd_tokenizer *t);
SD_API int32_t sd_token_bos(const sd_tokenizer *t);   // -1 if none
SD_API int32_t sd_token_eos(const sd_tokenizer *t);   // -1 if none
// 1 if id ends generation (EOS, end-of-turn such as <|im_end|> or <|eot_id|>).
SD_API int sd_token_is_eog(const sd_tokenizer *t, int32_t id);
// The text of token id as stored in the vocabulary (NULL if invalid).
SD_API const char *sd_token_text(const sd_tokenizer *t, int32_t id, size_t *len);
// Wraps one user message (and an optional system message, NULL for the
// template's default) in the model's chat format, recognised from
// tokenizer.chat_template: ChatML or Llama 3. Writes a NUL-terminated prompt
// ending with the assistant header. Returns the length, <0 with a message if
// the template is absent or unknown or the buffer too small. The text is for
// showing; to run the prompt use sd_chat_tokenize (tokenizing this text with
// parse_special = 1 would read special-token texts inside the messages as
// the template's markers).
SD_API int sd_chat_format(const sd_tokenizer *t, const char *system, const char *user,
                   char *out, size_t outsize, char *err, size_t errlen);
// Formats a whole conversation, messages[0..n) with roles[i] one of
// "system", "user", "assistant" and contents[i] its text, in the model's chat
// format (ChatML or Llama 3, as sd_chat_format), each message a turn in
// order, then the assistant header the reply continues. ChatML templates with
// a default system message (SmolLM2, Qwen2.5) get it first when messages[0]
// is not a system message, as their templates do; Llama 3 contents are
// trimmed as its template does. BOS is written into the text only when the
// tokenizer will not add it. Writes a NUL-terminated prompt; returns its
// length, or <0 with a message: n < 1, an unknown role (named), a missing
// template, or outsize too small (the message gives the bytes needed).
// Allocates nothing. As with sd_chat_format, the text is for showing: run
// the prompt from sd_chat_tokenize_messages.
SD_API int sd_chat_format_messages(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                            char *out, size_t outsize, char *err, size_t errlen);
// The prompts of sd_chat_format and sd_chat_format_messages (same arguments,
// same turns, same errors) as token ids: BOS as sd_tokenize with add_bos = 1,
// each marker of the template (<|im_start|>, <|im_end|>, <|start_header_id|>,
// ...) its one special token, and the text between markers (role names,
// newlines, message contents) tokenized with parse_special = 0, so that no
// message can open or close a turn. For messages without special-token
// texts the ids equal sd_tokenize(formatted text, add_bos = 1,
// parse_special = 1). Writes the first max ids; returns the number of ids
// (which may exceed max: call again with a larger buffer; out may be NULL
// with max 0 to count), or <0 with a message.
SD_API int sd_chat_tokenize(const sd_tokenizer *t, const char *system, const char *user, int32_t *out, int max, char *err,
                     size_t errlen);
SD_API int sd_chat_tokenize_messages(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n,
                              int32_t *out, int max, char *err, size_t errlen);

// ---------------------------------------------------------------- sampling
// How a sampled token is drawn from the final distribution (sd_sampler_params.draw).
enum sd_sampling_draw {
    // The exponential race (Gumbel-max trick) over noise hashed from (seed,
    // position in the text, token): the token at position pos is
    // argmax_x log(u_x) / p_x. No random state advances, so the text depends
    // only on the seed and the text: speculative decoding gives plain
    // sampling's text token for token, with any method, tree or load (a
    // drafter proposes its own draw under the same noise; verification
    // accepts a child exactly when it is the target's draw). Default.
    SD_DRAW_RACE = 0,
    // Inverse-CDF draws from a sequential random number generator, and
    // speculative sampling by rejection (accept with min(1, p/q), draw the
    // residual): the most drafts accepted for a given drafter, the same
    // distribution, but the text for a seed changes with the tree's shape.
    SD_DRAW_REJECTION = 1,
};

typedef struct sd_sampler_params {
    float temp;            // <= 0: greedy (argmax). default 0.8
    int top_k;             // <= 0: off. default 40
    float top_p;           // >= 1: off. default 0.95
    float min_p;           // <= 0: off. default 0.05
    float repeat_penalty;  // 1: off. default 1.0
    int repeat_last_n;     // tokens of history the penalty looks at. default 64
    uint64_t seed;         // default 0xC0FFEE
    enum sd_sampling_draw draw; // default SD_DRAW_RACE (greedy ignores it)
} sd_sampler_params;
SD_API sd_sampler_params sd_sampler_default_params(void);
SD_API int sd_sampler_new(sd_sampler **out, const sd_sampler_params *p, int n_vocab, char *err, size_t errlen);
SD_API void sd_sampler_free(sd_sampler *s);
// The final distribution the sampler draws from, given logits and the token
// history (for the repetition penalty): penalty, temperature, top-k, top-p,
// min-p applied in that order, then normalised. probs has n_vocab entries
// (zero outside the kept set). Greedy (temp <= 0) gives a one-hot at the
// argmax (ties: lowest id). Speculative sampling uses this for the target and
// the draft alike.
SD_API void sd_sampler_probs(sd_sampler *s, const float *logits, const int32_t *hist, int n_hist, float *probs);
// Draws a token from probs (n_vocab) using the sampler's sequential RNG
// (the draw of SD_DRAW_REJECTION, whatever the sampler's draw).
SD_API int32_t sd_sampler_draw(sd_sampler *s, const float *probs);
// Samples the token that follows hist[0..n_hist) (argmax directly when
// greedy). SD_DRAW_REJECTION: probs then sd_sampler_draw. SD_DRAW_RACE: the
// race draw for position n_hist (the token's index in the text), so the same
// logits, position and seed give the same token on every call (hist may be
// NULL without a repetition penalty; n_hist still names the position).
SD_API int32_t sd_sampler_sample(sd_sampler *s, const float *logits, const int32_t *hist, int n_hist);
// Uniform double in [0, 1) from the sampler's RNG (speculative acceptance tests).
SD_API double sd_sampler_uniform(sd_sampler *s);
// Restarts the sampler's randomness from seed: the RNG, and the race's texts
// (a generation, sd_gen_new, takes the next text's noise: after a reseed the
// first generation draws as the first after sd_sampler_new with that seed).
SD_API void sd_sampler_reseed(sd_sampler *s, uint64_t seed);
SD_API const sd_sampler_params *sd_sampler_get_params(const sd_sampler *s);

// ---------------------------------------------------------------- kernels
// Fixes the family of compute kernels for the whole process: "auto" (the best
// this CPU has), "avx512-vnni", "avx2" or "scalar" (the plain C references).
// Must be called before any model is loaded; loading a model without it fixes
// "auto". Fails with a message for an unknown name, a family this CPU or
// build lacks, or once a family is fixed differently (by an earlier call or a
// model load); asking again for the family already fixed returns 0. Not to
// be called concurrently with sd_model_load.
SD_API int sd_backend_select(const char *name, char *err, size_t errlen);
// Name of the kernel family in use, e.g. "avx512-vnni", "avx2", "scalar";
// before any selection or model load, what "auto" picks (nothing is fixed by
// asking).
SD_API const char *sd_backend_name(void);

// ---------------------------------------------------------------- conversion
// Converts a llama2.c checkpoint (legacy v0 header of 7 int32, or the v1
// header: magic "ak42", version 1, 7 int32, shared-classifier byte, padded to
// 256 bytes; fp32 weights) and its tokenizer.bin into a GGUF file of
// architecture llama with F32 tensors (ggml names, ne[0] = input dimension)
// and a SentencePiece-style ("llama") vocabulary. llama2.c rotates
// consecutive pairs, the GGUF llama convention, so weights are copied without
// permutation. The checkpoint size is checked against its header. Returns 0,
// or <0 with a message (missing, truncated or unknown files, I/O errors).
SD_API int sd_llama2c_convert(const char *ckpt, const char *tok, const char *out, char *err, size_t errlen);

// ---------------------------------------------------------------- misc
// Number of online CPU cores.
SD_API int sd_n_cores(void);
// Monotonic wall clock in milliseconds (for programs' timings).
SD_API double sd_time_ms(void);

#ifdef __cplusplus
}
#endif
#endif
