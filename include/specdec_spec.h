// specdec_spec.h - public API of speculative generation: drafters built from
// method strings, and a generation driven step by step.
//
// A generation (sd_gen) ties together a session (the target's KV cache), a
// sampler (the target's distribution and the acceptance draws) and an
// optional drafter. sd_gen_prefill evaluates a prompt; every sd_gen_step then
// drafts a token tree, evaluates it with ONE target forward, verifies it
// (greedy: the target's argmax path; sampling with the race draw, the
// default: the path of the target's own draws, sd_sampler_params.draw;
// sampling with the rejection draw: lossless speculative sampling), commits
// the accepted rows to the session's cache and tells the drafter. The tokens
// a step emits are exactly those plain decoding would emit next (greedy, and
// sampling with the race draw: the same seed gives the same text), or have
// the same distribution (the rejection draw).
//
//   sd_method meth;  sd_method_parse("ngram:3-8", &meth, err, sizeof err);
//   sd_method_env env = sd_method_env_default(model);
//   sd_drafter *d;   sd_method_make(&meth, &env, &d, err, sizeof err);
//   sd_gen *g;       sd_gen_new(&g, session, sampler, d, NULL, err, sizeof err);
//   sd_gen_prefill(g, prompt, n_prompt, err, sizeof err);
//   sd_step st;
//   while (sd_gen_step(g, &st, err, sizeof err) == 0) {
//       ... st.tokens[0 .. st.n_tokens) ...
//       if (st.finish != SD_FINISH_NONE) break;
//   }
//   sd_gen_free(g);  sd_drafter_free(d);
//
// Many generations at once (a server): each generation owns its session and
// drafter; sessions may share one model and one sd_threadpool, and steps of
// different generations run one after the other on that pool (the pool
// refuses two forwards at the same time). sd_gen_step is the three phases
// sd_gen_step_begin (draft: fills the batch of tree nodes to evaluate),
// sd_session_forward (the target) and sd_gen_step_end (verify, commit, tell
// the drafter). A scheduler that evaluates the trees of several generations
// in one batched forward calls begin on each, sd_batcher_forward (specdec.h)
// over all of their sessions and batches (each generation's nodes attend
// only to its own cache; the results are bit-identical to separate
// forwards), then end on each: the phases keep no state that another
// generation's step could disturb (examples/batch.c).
#ifndef SPECDEC_SPEC_H
#define SPECDEC_SPEC_H

#include "specdec.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- drafters
// A drafter proposes token trees for a generation (draft models, prompt
// lookup, lookahead, layer skipping, ...). Built by sd_method_make; owned by
// the caller; one drafter serves one generation at a time.
typedef struct sd_drafter sd_drafter;
SD_API void sd_drafter_free(sd_drafter *d);
// Short name, e.g. "draft-model", "ngram", "merge".
SD_API const char *sd_drafter_name(const sd_drafter *d);
// A line of drafter-specific state worth showing a user (e.g. the datastore
// an n-gram drafter indexed), or "" when there is none.
SD_API const char *sd_drafter_note(const sd_drafter *d);
// Forgets everything the drafter learnt (a fresh drafter's behaviour).
SD_API void sd_drafter_reset(sd_drafter *d);
// The hidden-state rows a drafter reads (trained heads): writes its layers
// (as sd_batch.hidden_layers: a layer index or SD_HIDDEN_NORM) into out (room
// for SD_MAX_HIDDEN_LAYERS) and returns their count; 0 for drafters that
// read none (d NULL included).
SD_API int sd_drafter_hidden_layers(const sd_drafter *d, int32_t *out);

// ---------------------------------------------------------------- a program's own drafter
// A program (a remote client, a binding, an experiment) defines its own
// drafter with a few callbacks; sd_drafter_from_callbacks wraps them as an
// sd_drafter that sd_gen_new and sd_generate take like the library's own.
// Greedy output is the target's own, and sampled output keeps the target's
// distribution (the race draw: the very text plain sampling gives for the
// seed), whatever the callbacks propose: children are verified as chosen
// by the program's rule, independent of the verifier's randomness.
//
// The tree to fill: node 0 is the root (the last token of the text, not yet
// in the target's cache). sd_tree_add appends a child of node parent (an
// existing node) with token and the drafter's probability p for it (any
// value in [0, 1]; only statistics read it) and returns the new node's
// index, or -1 when the tree is full (the step's room, max_nodes). Nodes are
// in the order added; a parent comes before its children.
typedef struct sd_tree sd_tree;
SD_API int sd_tree_add(sd_tree *t, int parent, int32_t token, float p);
SD_API int sd_tree_size(const sd_tree *t);                 // nodes, root included
SD_API int32_t sd_tree_token(const sd_tree *t, int i);     // -1 when i is not a node
SD_API int sd_tree_parent(const sd_tree *t, int i);        // -1 for the root, -2 when i is not a node

// What propose sees. Every pointer is the library's, valid during the call only.
typedef struct sd_draft_request {
    const int32_t *tokens;  // (n_tokens) the text so far, prompt included; its last token is the root
    int n_tokens;
    int max_nodes;          // most nodes the tree may hold this step, root included
    int sampling;           // 1: the target samples (temperature > 0), 0: greedy
} sd_draft_request;

// What step hears after each step. Every pointer is the library's, valid during the call only.
typedef struct sd_draft_result {
    const int32_t *accepted; // (n_accepted) the drafted tokens the target accepted, in order (a root-to-node path)
    int n_accepted;
    int32_t bonus;           // the target's own token after them: the next step's root
    // With n_hidden_layers > 0: the target's hidden rows of the root and the
    // accepted nodes, (1 + n_accepted, n_hidden_layers, n_embd) floats, in
    // the order of hidden_layers (sd_batch.hidden_out's layout); else NULL.
    const float *hidden;
} sd_draft_result;

typedef struct sd_drafter_callbacks {
    const char *name;       // shown by sd_drafter_name ("callbacks" when NULL); must outlive the drafter
    void *user;             // handed to every callback; the program's, never freed by the library but through free
    // Required: fill tree (see above); adding nothing is allowed (the step then decodes one token).
    int (*propose)(void *user, const sd_draft_request *req, sd_tree *tree, char *err, size_t errlen);
    // Optional: the step's outcome (keep the accepted path, learn from it).
    int (*step)(void *user, const sd_draft_result *res, char *err, size_t errlen);
    // Optional, with n_hidden_layers > 0: the hidden rows of prompt tokens
    // tokens[pos0 .. pos0 + n) as the prompt is evaluated, (n, n_hidden_layers, n_embd) floats.
    int (*prompt)(void *user, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                  size_t errlen);
    void (*reset)(void *user);   // optional: forget the text (a new generation starts)
    void (*free)(void *user);    // optional: called once by sd_drafter_free
    int n_hidden_layers;         // 0..SD_MAX_HIDDEN_LAYERS: the target's hidden rows wanted (EAGLE-style drafters)
    int32_t hidden_layers[SD_MAX_HIDDEN_LAYERS]; // as sd_batch.hidden_layers
} sd_drafter_callbacks;

// Wraps cb (copied) as a drafter owned by the caller (sd_drafter_free).
// Returns 0, SD_ERR_INPUT without propose or with n_hidden_layers out of
// range, SD_ERR_OOM; a message in err.
SD_API int sd_drafter_from_callbacks(sd_drafter **out, const sd_drafter_callbacks *cb, char *err, size_t errlen);

// ---------------------------------------------------------------- a drafter driven by hand
// A program whose target runs elsewhere (specdec client: a server verifies
// its trees, docs/split.md) drives a drafter itself: sd_drafter_draft fills a
// tree for the text so far, the program has it verified, and
// sd_drafter_tell hands the drafter the accepted path, the bonus token and
// the target's states of the path's positions.
// A tree of at most cap nodes over n_vocab tokens (the model's vocabulary),
// owned by the caller. SD_ERR_INPUT on bad sizes, SD_ERR_OOM.
SD_API int sd_tree_new(sd_tree **out, int cap, int n_vocab, char *err, size_t errlen);
SD_API void sd_tree_destroy(sd_tree *t);
// Empties t and sets its root token.
SD_API void sd_tree_clear(sd_tree *t, int32_t root);
// The drafter's probability of node i's token (0 for the root or no node).
SD_API float sd_tree_p(const sd_tree *t, int i);
// Makes an EAGLE-3 drafter (sd_method_make, eagle3:SHAPE, no online
// adaptation) a remote one: the states handed to sd_drafter_tell and
// sd_drafter_tell_prompt are fused rows (n, n_embd) as sd_head_fuse makes
// them, one per position, and sd_drafter_tell without states feeds the head
// its own outputs as the path's states (drafting on without the target).
// Or an MoA drafter (moa:SHAPE): the states are every target layer's K and V
// rows of each position, (n, n_layer, 2 n_head_kv head_dim) floats, a
// layer's K row then its V row (sd_session_kv_read's, K with RoPE as
// cached); the drafter keeps the positions that agree with the text, and
// reads the text after the last position with states (drafted without the
// target) through its self-attention alone. An MoA drafter that also reads
// the target's states (trained with --ca-hidden or --sa-hidden;
// sd_drafter_hidden_layers gives its one layer) takes them after the n
// positions' rows: (n, n_embd) more floats, the target's state of each
// position at that layer. SD_ERR_INPUT for other drafters.
SD_API int sd_drafter_remote(sd_drafter *d, char *err, size_t errlen);
// Fills tree (emptied, its root tokens[n_tokens - 1]) with the drafter's
// proposal for the text tokens[0 .. n_tokens) in at most max_nodes nodes,
// root included.
SD_API int sd_drafter_draft(sd_drafter *d, const int32_t *tokens, int n_tokens, int max_nodes, sd_tree *tree,
                            char *err, size_t errlen);
typedef struct sd_head sd_head;
// An MoA drafter made remote takes LSA's outputs computed by the server
// instead of every layer's K,V rows: the states of sd_drafter_tell and
// sd_drafter_tell_prompt are then (n, n_embd + N 2 n_head_kv head_dim)
// floats, each position's LSA output (sd_moa_lsa_run) then the K,V rows of
// the target's last N layers (TLI = N), a layer's K row then its V row;
// for a drafter reading the target's states, those (n, n_embd) after them,
// as sd_drafter_remote's. SD_ERR_INPUT for other drafters.
SD_API int sd_drafter_remote_lsa(sd_drafter *d, char *err, size_t errlen);
// An MoA drafter without LSA made remote takes what it reads of the target's
// layers, their mean: the states of sd_drafter_tell and
// sd_drafter_tell_prompt are then (n, (1 + N) 2 n_head_kv head_dim) floats,
// each position's mean over the target's layers of its K row then of its V
// row, then the K,V rows of the last N layers (TLI = N); for a drafter
// reading the target's states, those (n, n_embd) after them. SD_ERR_INPUT
// for other drafters.
SD_API int sd_drafter_remote_mean(sd_drafter *d, char *err, size_t errlen);
// LSA of an MoA drafter h for target m (without LSA: the layers' mean and the
// projection), run where the target's
// K,V rows are (a split server): c (n, n_embd) from kv (n, n_layer, 2
// n_head_kv head_dim) as sd_drafter_remote's, n <= 64. The drafter's
// weights in 8 bits, as the client's drafter holds them. For a drafter that
// reads the target's states, c is without their terms (the client's drafter
// adds them from the states it is told).
typedef struct sd_moa_lsa sd_moa_lsa;
SD_API int sd_moa_lsa_new(sd_moa_lsa **out, const sd_head *h, const sd_model *m, char *err, size_t errlen);
SD_API void sd_moa_lsa_free(sd_moa_lsa *x);
SD_API int sd_moa_lsa_run(sd_moa_lsa *x, const float *kv, int n, float *c, char *err, size_t errlen);
// An MoA drafter's TLI (its last target layers it runs), or -1 for another head.
SD_API int sd_head_moa_tli(const sd_head *h);
// 1 for an MoA drafter without LSA (it reads the target layers' mean K,V
// rows: sd_drafter_remote_mean), 0 with LSA, -1 for another head.
SD_API int sd_head_moa_no_lsa(const sd_head *h);
// A hash of a head's shape (TLI included), parameters and draft vocabulary:
// two programs holding the same drafter file get the same value.
SD_API uint64_t sd_head_fingerprint(const sd_head *h);
// sd_drafter_draft for a target that samples with sp (temp > 0; greedy
// otherwise: sd_drafter_draft) with the race draw, as a fresh sampler's
// first text of sp->seed draws it (a split server's generation,
// docs/split.md): children are ranked by the drafter's own distribution
// under the target's noise, so the first child of each node is the
// drafter's sample, and the target's own draw whenever the two
// distributions agree. pos_shift: the verifier's position of tokens[0]
// (0, or minus a private prefix the verifier never saw). Verification
// follows the target's draws whatever the tree: the text is plain
// sampling's for the seed. SD_ERR_INPUT for the rejection draw.
SD_API int sd_drafter_draft_sampled(sd_drafter *d, const int32_t *tokens, int n_tokens, int max_nodes,
                                    const sd_sampler_params *sp, int64_t pos_shift, sd_tree *tree, char *err,
                                    size_t errlen);
// The outcome of the last sd_drafter_draft: path[0 .. n_path) the accepted
// nodes of tree (path[0] == 0, the root; each node a child of the one before;
// the program may hand a tree of its own with the same root), bonus the
// target's token after them, states (n_path, n_embd) the fused states of the
// path's positions (a remote drafter) or NULL (none known: a remote drafter
// uses its own predictions).
SD_API int sd_drafter_tell(sd_drafter *d, const sd_tree *tree, const int32_t *path, int n_path, int32_t bonus,
                           const float *states, char *err, size_t errlen);
// States of prompt positions pos0 .. pos0 + n of tokens (the text so far up
// to pos0 + n), as sd_drafter_tell's.
SD_API int sd_drafter_tell_prompt(sd_drafter *d, const int32_t *tokens, int pos0, int n, const float *states,
                                  char *err, size_t errlen);
// The fused states an EAGLE-3 head reads, out (n, n_embd) = fc . rows, from
// the target's hidden rows (n, 3, n_embd) of the head's layers
// (sd_drafter_hidden_layers), in float. SD_ERR_INPUT for other heads.
typedef struct sd_head sd_head;
SD_API int sd_head_fuse(const sd_head *h, const float *rows, int n, float *out, char *err, size_t errlen);
// A split client's file (specdec split-client): the target's keys
// (tokenizer, chat template, shape), its token embeddings and output norm,
// and the drafter at head_path (checked against the target): an EAGLE-3
// head, or an MoA drafter with the target's output matrix and, for TLI = N,
// the target's last N layers. sd_model_load reads it as a model that holds
// no layer to run (sd_model_info: layer_lo = layer_hi = n_layer, the
// target's count): its tokenizer, embeddings (and TLI layers) serve the
// drafter; sd_session_new refuses it.
SD_API int sd_client_file_write(const char *target_path, const char *head_path, const char *out_path, char *err,
                                size_t errlen);
// The head a client file holds (*out NULL and 0 when path holds none).
SD_API int sd_client_file_head(const char *path, const sd_model *m, sd_head **out, char *err, size_t errlen);

// ---------------------------------------------------------------- cost curve
// The target's measured forward time against the number of tree nodes,
// which automatic ("auto", "tree:auto") trees are sized by.
typedef struct sd_cost_curve sd_cost_curve;
// Measures it on session s, whose cache must be empty (call before the
// prompt): 2 timed forwards per point (1, 2, 3, 4, 6, 8, 16, 32, ... nodes)
// up to max_nodes, the minimum kept.
SD_API int sd_cost_curve_new(sd_cost_curve **out, sd_session *s, int max_nodes, char *err, size_t errlen);
SD_API void sd_cost_curve_free(sd_cost_curve *c);
// One line for users: "0.52 ms at 1 node, 1.90 ms at 32 nodes".
SD_API int sd_cost_curve_describe(const sd_cost_curve *c, char *buf, size_t len);
// The estimated ms of a forward of n nodes (rows): interpolated between the
// measured points, extrapolated along the last two beyond them.
SD_API double sd_cost_curve_ms(const sd_cost_curve *c, int n);

// ---------------------------------------------------------------- draft heads
// A draft head is a small trained network that reads the target's hidden
// states (EAGLE-3, Medusa; docs/heads.md). Heads are GGUF files: EAGLE-3 in
// llama.cpp's `eagle3` layout, Medusa in specdec's `medusa` layout;
// `specdec train-head` makes them. A head is immutable once loaded and may be
// shared by many drafters.
typedef struct sd_head sd_head;
// Loads and validates a head file (every key and tensor shape). target: the
// model the head will draft for (NULL: no check); a head made for another
// target is refused with a message naming what differs (hidden size,
// vocabulary size, layer count, vocabulary fingerprint).
SD_API int sd_head_load(sd_head **out, const char *path, const sd_model *target, char *err, size_t errlen);
SD_API void sd_head_free(sd_head *h);
// "eagle3" or "medusa".
SD_API const char *sd_head_type_name(const sd_head *h);
// Its kind: SD_HEAD_EAGLE3 or SD_HEAD_MEDUSA.
SD_API sd_head_type sd_head_get_type(const sd_head *h);
// One line for users: type, draft vocabulary, layers read, and the recipe
// facts the file records. Returns the length (may exceed len: truncated).
SD_API int sd_head_describe(const sd_head *h, char *buf, size_t len);
// Rewrites the head file in_path in the current layout (docs/heads.md,
// "Files") at out_path (written to out_path.tmp, then renamed: out_path may
// be in_path): an EAGLE-3 head in llama.cpp's `eagle3` layout with target's
// tokenizer, which llama.cpp (`llama-speculative-simple --spec-type
// draft-eagle3`) loads as a draft model. Reads every layout sd_head_load
// reads; the matrices keep their type (Q8_0, Q5_0, F16 or F32; another
// becomes Q8_0). target: the model the head was made for (another is
// refused, as sd_head_load refuses it). Returns 1 when an EAGLE-3 file was in
// an older layout or had no tokenizer, 0 otherwise (rewritten all the same),
// <0 on error with a message. MoA and Medusa files are rewritten as they are.
SD_API int sd_head_convert(const char *in_path, const char *out_path, const sd_model *target, char *err,
                           size_t errlen);
// The matrices' type of sd_head_convert_type's output.
enum sd_head_out_type {
    SD_HEAD_OUT_KEEP = 0,   // as the input file's (sd_head_convert)
    SD_HEAD_OUT_Q8_0 = 1,
    SD_HEAD_OUT_Q5_0 = 2,   // the type drafters run at by default (--head-bits 5): 40% smaller than Q8_0
    SD_HEAD_OUT_F16 = 3,
    SD_HEAD_OUT_F32 = 4,
};
// sd_head_convert with the matrices written as out_type (enum
// sd_head_out_type). A Q8_0 file written as Q5_0 drafts exactly as the Q8_0
// file does at --head-bits 5 (the same rounding, done once on disk).
SD_API int sd_head_convert_type(const char *in_path, const char *out_path, const sd_model *target, int out_type,
                                char *err, size_t errlen);
// `--head auto`: the first head file (*.gguf, in name order) in dir made for
// target. Returns 1 and its path, 0 when none matches, <0 on error.
SD_API int sd_head_find(const sd_model *target, const char *dir, char *path, size_t pathlen, char *err, size_t errlen);
// The same among the files of one kind (SD_HEAD_EAGLE3, _MEDUSA, _MOA;
// SD_HEAD_NONE: any, as sd_head_find).
SD_API int sd_head_find_type(const sd_model *target, const char *dir, sd_head_type type, char *path, size_t pathlen,
                             char *err, size_t errlen);

// Online adaptation (docs/heads.md, "Online adaptation"): an EAGLE-3
// drafter made with head_online.on = 1 trains its own copy of the head while
// it drafts, from what every verification forward already computed (the
// accepted positions' hidden rows and the target's distribution after each),
// in one background thread per drafter that never holds up a step: the
// drafter takes the newest parameters at the start of a step when they are
// ready, and keeps the old ones otherwise. The head given stays untouched.
// Output is unaffected (greedy: plain decoding's text; sampled: the target's
// distribution): only the drafts change, and the verifier decides.
typedef struct sd_head_online_params {
    int on;               // 1: adapt online (one training thread per drafter); 0 (default): off
    float lr;             // AdamW learning rate (no warm-up, no decay). default 1e-4
    int window;           // positions per training window: a window of this many consecutive verified
                          // positions of one text makes one AdamW step. default 64 (8..512)
    int min_window;       // a text that ends with at least this many untrained positions trains them as
                          // a shorter window. default 16 (2..window)
    int ttt_steps;        // training-time-test steps (train-head's --ttt). default 3 (1..8)
    int steps_per_window; // AdamW steps on each window. default 1 (1..16)
    int nice;             // niceness of the training thread (Linux; it yields to the target's threads when
                          // the cores are busy). default 10 (0..19)
    int deterministic;    // 1: no thread: a window is trained inside the step that completes it and the
                          // new parameters drafts from the next step on (reproducible; steps wait for
                          // training). default 0
} sd_head_online_params;
SD_API sd_head_online_params sd_head_online_default_params(void);

// What online adaptation did so far.
typedef struct sd_head_online_stats {
    int64_t n_positions;  // verified positions collected
    int64_t n_windows;    // windows trained (AdamW steps / steps_per_window)
    int64_t n_dropped;    // windows dropped unseen because training fell behind (the newest are kept)
    int64_t n_updates;    // parameter sets the drafter took up
    double last_loss;     // training loss of the last window, before its update
    double agree;         // the head's top-1 agreement with the target on the last windows (up to 8),
                          // measured before it trained on them: 0..1
    double train_ms;      // time spent training, in total (ms)
} sd_head_online_stats;
// A drafter with a reduced draft vocabulary (an EAGLE-3 head): how many
// verified positions it checked since it was made (the target's choice after
// each accepted node) and how many of those choices its vocabulary holds;
// returns 1. Other drafters: 0, with both counts 0.
SD_API int sd_drafter_vocab_coverage(const sd_drafter *d, int64_t *n_checked, int64_t *n_in);
// Fills *st for an online drafter and returns 1; returns 0 (and zeroes *st)
// for any other drafter.
SD_API int sd_drafter_online_stats(const sd_drafter *d, sd_head_online_stats *st);
// An online drafter: ends the current run of positions (its last window
// is trained when long enough, sd_head_online_params.min_window) and waits
// until every window collected so far is trained, so that training competes
// with nothing that follows (a benchmark times another method next). Returns
// 0, or <0 with a message (deterministic training failed); 0 at once for
// other drafters.
SD_API int sd_drafter_online_wait(sd_drafter *d, char *err, size_t errlen);
// Writes the drafter's head as it is now (an online drafter: what it learnt,
// after sd_drafter_online_wait; otherwise the head it was made with) as a head file with Q8_0 matrices, its note extended by
// "online.*" lines (windows, positions, last loss). Written to path.tmp and
// renamed. Returns 0, or <0 with a message (a drafter without an EAGLE-3
// head, a write error).
SD_API int sd_drafter_save_head(sd_drafter *d, const char *path, char *err, size_t errlen);

// ---------------------------------------------------------------- methods
typedef struct sd_threadpool sd_threadpool;  // (specdec.h)
// A method string names a drafter and its shape:
//   ar                  no drafting (one token per target forward)
//   chain:K             draft model(s): a chain of K tokens (K in 1..64)
//   tree:W1-W2-...      draft model(s): W1 children of the root, W2 of each, ... (widths 1..64)
//   tree:auto           draft model(s): a hardware-aware tree sized from the cost curve
//   dyn:B-D-M           draft model(s): EAGLE-2 dynamic tree (B, D in 1..16, M >= 2 nodes)
//   ngram:N-K[:auto]    prompt lookup: last n <= N tokens, up to K drafted (":auto": auto tree)
//   skip:auto|skip:L1-L2-...  layer-skip self-speculation (0-based layers; auto = searched)
//   lookahead:W-N-G     lookahead decoding (W, G in 1..64, N in 2..16)
//   eagle3:SHAPE        the EAGLE-3 head (env.head_eagle3, --head): SHAPE is chain:K,
//                       tree:W1-W2-..., dyn:B-D-M or auto (a tree sized from the cost curve)
//   medusa:W1-W2-...    the Medusa head (env.head_medusa): Wk of head k's top tokens at depth k+1,
//                       the product grown best joint probability first (at most 64 nodes)
//   moa:SHAPE           the Mixture of Attentions drafter (env.head_moa, --head; docs/moa.md):
//                       SHAPE as eagle3's
//   auto                eagle3:auto with an EAGLE-3 head, tree:auto with draft models,
//                       else ngram:3-8:auto
//   A+B[+...]           the trees of several methods merged by token path (SpecInfer),
//                       e.g. "chain:4+ngram:3-8"
//   A/B[/...]           the first non-empty tree: A's, or B's when A drafts nothing, e.g.
//                       "ngram:3-8/eagle3:auto" (prompt lookup where the text repeats, the
//                       head elsewhere); a head (eagle3, medusa) may be the last part only
// With several draft models, a draft-model method builds one drafter per
// model and merges their trees.
#define SD_METHOD_NAME_MAX 128  // longest method string, NUL included
#define SD_METHOD_MAX_DRAFTS 8  // most draft models
#define SD_METHOD_AUTO_NODES 32 // automatic trees: most nodes, root included

enum sd_method_kind {
    SD_METHOD_AR = 0,
    SD_METHOD_MODEL = 1,      // chain, tree, dyn
    SD_METHOD_NGRAM = 2,
    SD_METHOD_SKIP = 3,
    SD_METHOD_LOOKAHEAD = 4,
    SD_METHOD_AUTO = 5,
    SD_METHOD_MERGE = 6,      // A+B
    SD_METHOD_EAGLE3 = 7,     // eagle3:SHAPE
    SD_METHOD_MEDUSA = 8,     // medusa:...
    SD_METHOD_FIRST = 9,      // A/B: A's tree, or B's when A drafts nothing
    SD_METHOD_MOA = 10,       // moa:SHAPE
};

// A parsed method: what a program needs to know before building it.
typedef struct sd_method {
    char name[SD_METHOD_NAME_MAX]; // the string as given
    enum sd_method_kind kind; // of the whole string
    int needs_draft_model;    // 1: sd_method_make fails without env.drafts
    sd_head_type needs_head;  // SD_HEAD_EAGLE3 / _MEDUSA / _MOA: fails without that head in env; SD_HEAD_NONE
    int uses_cost_curve;      // 1: sd_method_make needs env.cost (automatic trees)
    int tree_nodes;           // nodes of the largest tree one step proposes with one
                              // draft model, root included (1 for ar)
    int extra_nodes;          // batch nodes evaluated beside the tree (lookahead window)
    int uses_ngram;           // 1: some part may draft by n-gram lookup (ngram:N-K, or auto without draft
                              // models or head), the drafters that env.datastore feeds
    char skip_list[256];      // skip: the layer list, "auto" until sd_method_prepare resolved it
} sd_method;

// Progress and reports from building a drafter, as one line of text each
// (no newline); user is sd_method_env.user.
typedef void (*sd_method_report_fn)(void *user, const char *line);

// ---------------------------------------------------------------- datastore
// A retrieval datastore (REST-style: a text corpus, tokenized and indexed by
// a suffix array saved beside it as FILE.sdsa, reused while the corpus and
// the tokenizer stay the same). sd_method_env.datastore names the file for
// each n-gram drafter to open; a program running many drafters (a server's
// slots) opens it once and shares it through sd_method_env.datastore_loaded.
typedef struct sd_datastore sd_datastore;
// Opens (loads, or builds and saves) the datastore of corpus_path for the
// tokenizer tok. 0 with *out set, or <0 with a message.
SD_API int sd_datastore_open(sd_datastore **out, const char *corpus_path, const sd_tokenizer *tok, char *err,
                             size_t errlen);
// What opening it did ("datastore: loaded FILE.sdsa (N tokens)", "indexed ...").
SD_API const char *sd_datastore_note(const sd_datastore *ds);
// Releases the caller's hold; the drafters sharing it keep their own.
SD_API void sd_datastore_free(sd_datastore *ds);

// What building a drafter may need. sd_method_env_default fills the defaults.
// Lifetimes (what a drafter made by sd_method_make keeps):
//   - kept, borrowed, must outlive the drafter: target, head_eagle3,
//     head_medusa, every draft model drafts[i], and report with user (called
//     while it drafts: automatic tree choices);
//   - kept as a reference that the drafter releases: pool (reference-counted);
//   - read during sd_method_prepare / sd_method_make only (the caller may free
//     or change them afterwards): the drafts array itself, datastore and the
//     skip_save / skip_load paths (the datastore is loaded into the drafter),
//     cost (copied), head_online (copied), and every number.
typedef struct sd_method_env {
    const sd_model *target;
    const sd_head *head_eagle3;   // eagle3 methods (and auto): a loaded EAGLE-3 head, or NULL
    const sd_head *head_medusa;   // medusa methods: a loaded Medusa head, or NULL
    sd_head_online_params head_online; // eagle3 methods (and auto with a head): online adaptation; default off
    int head_bits;             // a head's matrices in memory: 8 (Q8_0), 5 (Q5_0, default) or 4 (Q4_1) bits
                               // per weight (the head file's own type does not matter: they are requantised)
    const sd_model *const *drafts; // (n_drafts) loaded draft models, or NULL
    int n_drafts;
    int n_ctx;                 // KV length of draft sessions; 0 = their default
    int n_threads;             // threads of draft sessions when pool is NULL; 0 = cores
    sd_threadpool *pool;       // draft sessions run on this pool (the target's), or NULL
    float p_min;               // draft models: no children below this top draft probability (0 = off)
    const char *datastore;     // ngram: corpus file also searched, or NULL
    sd_datastore *datastore_loaded; // ngram: a datastore opened once (sd_datastore_open) that the drafters
                                    // share, each holding a reference; when set, datastore is not read again
    const char *skip_save;     // skip:auto: write the chosen set here, or NULL
    const char *skip_load;     // skip:auto: read the set from here instead of searching, or NULL
    const sd_cost_curve *cost; // automatic trees: the target's cost curve, or NULL
    int auto_nodes;            // automatic trees: most nodes, root included; 0 = SD_METHOD_AUTO_NODES
    sd_method_report_fn report;// skip search progress, automatic tree choices; NULL: silent
    void *user;                // for report
    const sd_head *head_moa;   // moa methods (and auto without an EAGLE-3 head): a loaded MoA drafter, or NULL
} sd_method_env;
SD_API sd_method_env sd_method_env_default(const sd_model *target);

// Parses a method string. Returns 0, or <0 with a message naming the
// accepted syntax ("method chain:K needs K in 1..64, got 'chain:x'").
SD_API int sd_method_parse(const char *s, sd_method *m, char *err, size_t errlen);
// Parses a comma-separated list of at most max methods, "ar" first (added
// when missing). Returns the count, or <0 with a message.
SD_API int sd_methods_parse(const char *list, sd_method *ms, int max, char *err, size_t errlen);
// Work a method does once rather than per drafter: skip:auto searches its
// layer set (or reads env.skip_load) and keeps it in m->skip_list, so later
// sd_method_make calls reuse it; *speedup (may be NULL) gets the search's
// estimate (0 when nothing was searched). No-op for other methods.
SD_API int sd_method_prepare(sd_method *m, const sd_method_env *env, double *speedup, char *err, size_t errlen);
// Builds the drafter of m (*out = NULL for ar). Returns 0, or <0 with a
// message (no draft model for a draft-model method, vocabulary mismatch, ...).
SD_API int sd_method_make(const sd_method *m, const sd_method_env *env, sd_drafter **out, char *err, size_t errlen);
// Tree nodes a step of m asks for by default with n_drafts draft models
// (merged trees add up), root included.
SD_API int sd_method_default_nodes(const sd_method *m, int n_drafts);
// The accepted syntax, one line, for help texts.
SD_API const char *sd_methods_syntax(void);

// What is loaded beside the target, for planning a method.
typedef struct sd_method_have {
    int n_drafts;      // draft models loaded
    int eagle3_head;   // 1: an EAGLE-3 head is loaded
    int medusa_head;   // 1: a Medusa head is loaded
    int n_batch;       // most rows of one forward (the session's n_batch); 0 = 512
    int max_nodes;     // the caller's limit on tree nodes per forward, root included; 0 = the method's own size
    int moa_head;      // 1: an MoA drafter is loaded
    int datastore;     // 1: a datastore feeds the n-gram lookup (sd_method_env.datastore)
} sd_method_have;
// What a method needs and takes, worked out once by the library so that no
// program re-derives it from the method string.
typedef struct sd_method_plan {
    int spec;            // 1: some drafter (0 for ar)
    int max_nodes;       // tree nodes per target forward, root included: sd_gen_params.max_nodes
    int step_rows;       // rows one step takes in a forward: max_nodes + the nodes beside the tree (lookahead)
    int model_nodes;     // nodes of its draft-model (or head) trees merged, root included; 0: none
    int total_nodes;     // nodes of all its trees merged (the largest for A/B), root included
    int auto_nodes;      // automatic trees: the most nodes, root included (the cost curve's range); 0: none
    int uses_drafts;     // 1: some part drafts with the draft models
    int uses_ngram;      // 1: some part drafts by n-gram lookup (what a datastore feeds)
    sd_head_type needs_head; // SD_HEAD_EAGLE3, SD_HEAD_MEDUSA, SD_HEAD_MOA, or SD_HEAD_NONE
    int uses_cost_curve; // 1: building it needs the target's cost curve (sd_method_env.cost)
} sd_method_plan;
// Plans m for what h says is loaded. Returns 0, or <0 with a message:
// SD_ERR_INPUT when a draft model or head it needs is missing ("method
// 'chain:4' needs a draft model") or the limits are invalid; SD_ERR_NO_ROOM
// when its draft-model tree does not fit h->max_nodes or h->n_batch (p is
// then filled, so that a program can word the message with its own flags).
SD_API int sd_method_plan_make(const sd_method *m, const sd_method_have *h, sd_method_plan *p, char *err, size_t errlen);
// The default method for what is loaded: "ngram:3-8/eagle3:auto" with an
// EAGLE-3 head ("ngram:5-8:auto/eagle3:auto" with a datastore too: the
// lookup drafts only where its sized tree pays, the head elsewhere),
// "chain:4" with draft models, else "ngram:3-8". The method 'auto' drafts
// as this default.
SD_API const char *sd_method_default(const sd_method_have *h);
// Parses "W1,W2,..." (sep ',') or "W1-W2-..." (sep '-') into at most max
// positive integers in [lo, hi], as method arguments are parsed; flag names
// the option in messages ("--tree: expected comma-separated positive
// integers, got '4,x'"). Returns the count, or <0 with a message.
SD_API int sd_parse_ints(const char *flag, const char *s, char sep, int *out, int max, int lo, int hi, char *err,
                  size_t errlen);

// ---------------------------------------------------------------- generation
enum sd_finish {
    SD_FINISH_NONE = -1,    // still generating
    SD_FINISH_LENGTH = 0,   // n_predict tokens generated
    SD_FINISH_EOG = 1,      // an end-of-generation token was emitted (and is the last token)
    SD_FINISH_CTX = 2,      // the context (KV cache) is full
    SD_FINISH_STOPPED = 3,  // stop requested (sd_gen_stop, sd_gen_cut)
};
// "none", "length", "eog", "ctx", "stopped".
SD_API const char *sd_finish_name(int finish);

typedef struct sd_gen_params {
    int n_predict;    // most tokens to generate (EOG included); <= 0: until EOG or full context. default 256
    int n_batch;      // prompt tokens per forward call; 0 = the session's n_batch
    int max_nodes;    // tree nodes per target forward, root included; 0 = 16. Capped by the session's n_batch
    int fast_prompt;  // 1 (default): the prompt uses 8-bit activations like generated tokens, as llama.cpp;
                      // 0: float activations (sd_batch.precise), several times slower, a cache nearer
                      // exact arithmetic (docs/numerics.md)
    uint64_t seed;    // seed of the drafter's own RNG; 0 (default) = drawn from the sampler's RNG, so that
                      // successive generations draft independently (a fixed seed reused over many
                      // generations makes their drafts correlated, never their single outputs wrong)
} sd_gen_params;
SD_API sd_gen_params sd_gen_default_params(void);

#define SD_SPEC_MAX_DEPTH 64   // depths tracked by the acceptance statistics

// What one step did.
typedef struct sd_step {
    const int32_t *tokens;  // (n_tokens) emitted this step, in order: accepted draft tokens, then the
                            // target's own token (bonus); valid until the next call on the generation
    int n_tokens;
    int n_drafted;          // draft nodes in the step's tree (root excluded)
    int n_accepted;         // draft tokens accepted (the bonus not counted)
    int n_aux;              // auxiliary batch nodes beside the tree (lookahead)
    double draft_ms;        // time in the drafter this step (propose and the previous accept)
    double verify_ms;       // target forward + verification + commit
    enum sd_finish finish;  // SD_FINISH_NONE, or why the generation ended with this step
} sd_step;

// Totals over a generation.
typedef struct sd_gen_stats {
    int n_prompt_tokens;       // tokens evaluated by prefill
    int n_generated;           // tokens emitted, the final EOG token included
    double prompt_ms;          // wall time of prefill (ms)
    double generate_ms;        // wall time from the end of prefill to the end of the last step (ms)
    double tokens_per_second;  // n_generated / generate_ms * 1000 (0 if nothing was generated)
    enum sd_finish finish;
    int n_target_forwards;     // target forwards of steps (the first token needs none)
    int n_draft_nodes;         // draft nodes proposed in total (roots excluded)
    int n_draft_accepted;      // draft tokens accepted in total
    double mean_accepted;      // tokens emitted per target forward, bonus included (tau)
    int n_depth_proposed[SD_SPEC_MAX_DEPTH + 1];  // steps whose tree reached depth d
    int n_depth_accepted[SD_SPEC_MAX_DEPTH + 1];  // steps that accepted a draft token at depth d
    double acceptance_by_depth[SD_SPEC_MAX_DEPTH + 1]; // accepted / proposed at depth d (index 0 unused)
    int max_depth;             // deepest tree depth seen
    double draft_ms;           // time in the drafter in total (ms)
    double verify_ms;          // target forwards + verification + commit in total (ms)
    long n_aux_nodes;          // auxiliary batch nodes in total
} sd_gen_stats;

typedef struct sd_gen sd_gen;
// Makes a generation over session s (its committed tokens are the context
// the prompt continues), sampler smp (temp <= 0: greedy) and drafter d (NULL:
// plain decoding). The drafter keeps what it learnt from earlier texts (its
// pools, statistics, cache) and follows the new text by itself; call
// sd_drafter_reset for a fresh start. Its RNG is reseeded (sd_gen_params.seed).
// With the race draw the generation takes the sampler's next text's noise
// (specdec.h, sd_sampler_reseed): the first generation after a reseed with
// seed S gives the text of seed S, with or without a drafter.
// Nothing is owned: s, smp and d
// must outlive the generation. Allocates everything its steps need.
SD_API int sd_gen_new(sd_gen **out, sd_session *s, sd_sampler *smp, sd_drafter *d, const sd_gen_params *p,
               char *err, size_t errlen);
SD_API void sd_gen_free(sd_gen *g);
// Evaluates n prompt tokens after the session's committed tokens (in chunks
// of n_batch) and samples nothing yet. Once per generation. Errors: empty
// prompt, prompt longer than the free context (the message gives both
// lengths), forward errors.
SD_API int sd_gen_prefill(sd_gen *g, const int32_t *prompt, int n, char *err, size_t errlen);
// As sd_gen_prefill for a prompt whose first n_cached tokens the session
// already holds as its committed rows (n_past == n_cached; a server slot
// that kept the prefix its previous request shares with this one): only
// prompt[n_cached..n) is evaluated, but the whole prompt becomes the
// generation's text, so the drafter sees the full context. The caller
// vouches that the cached rows are those tokens. n_cached = 0 is
// sd_gen_prefill. Errors: n_cached outside [0, n) (at least one token is
// evaluated: the first token is sampled from its logits), n_cached > 0 not
// equal to the session's n_past, the prompt longer than the context.
// stats.n_prompt_tokens counts the evaluated tokens only.
SD_API int sd_gen_prefill_cached(sd_gen *g, const int32_t *prompt, int n, int n_cached, char *err, size_t errlen);
// The prompt as steps: gives the generation its prompt (the same checks and
// n_cached as sd_gen_prefill_cached) without evaluating it. The following
// steps then evaluate it, a chunk each, through the same begin / forward /
// end phases as decoding: begin returns the chunk (at most the generation's
// n_batch tokens, and the step limit of sd_gen_set_step_limit; logits for
// the prompt's last token only; the drafter's hidden rows when it reads
// them), end commits it and hands the drafter its rows; such a step emits
// no token. A scheduler so batches prompt chunks with other generations'
// steps. sd_gen_prefill(_cached) is this and a loop of such steps.
SD_API int sd_gen_set_prompt(sd_gen *g, const int32_t *prompt, int n, int n_cached, char *err, size_t errlen);
// Prompt tokens the next steps still evaluate (0 once the prompt is in the cache).
SD_API int sd_gen_prompt_left(const sd_gen *g);
// A generation's state between steps -- its text (prompt and tokens so far),
// how far its prompt got, the token count, the race draw's key, the prompt's
// last logits while the first token is pending, and its session's state
// (sd_session_state_*) -- as bytes, so that a generation can be suspended,
// moved, or resumed after a reconnect. Loaded into a fresh generation
// (sd_gen_new on a session of the same model whose context fits the text,
// with the same sampling parameters and n_predict, no prompt given), it
// continues with exactly the tokens the saved one would have produced:
// greedy, and sampled with the race draw (the rejection draw continues from
// the sampler's own state, which is the caller's). The drafter is reset on
// load and picks the text up as it drafts: its own state (a head's cache,
// what it learnt) is not part of the state, so its first drafts may be
// accepted less often; the output is the same.
SD_API size_t sd_gen_state_size(const sd_gen *g);
// Returns the bytes written, or SD_ERR_INPUT (no prompt yet, inside a step,
// buffer too small) with a message.
SD_API int sd_gen_state_save(const sd_gen *g, void *buf, size_t size, char *err, size_t errlen);
// 0, or SD_ERR_INPUT (not a state, another version or vocabulary, corrupt,
// truncated, g not fresh), SD_ERR_NO_ROOM (the text does not fit this
// generation's context), SD_ERR_OOM; on error g is as before (its session
// may have been emptied) and another state can be loaded.
SD_API int sd_gen_state_load(sd_gen *g, const void *buf, size_t size, char *err, size_t errlen);
// One step (see the top of this file). The first step after prefill emits the
// token sampled from the prompt's logits without a forward. Returns 0 with
// *st filled (st->finish says whether the generation ended), or <0 with a
// message (a failed forward's sd_status kept: SD_ERR_NO_ROOM, SD_ERR_BUSY,
// ...). A step on an ended generation returns 0 with no tokens.
SD_API int sd_gen_step(sd_gen *g, sd_step *st, char *err, size_t errlen);
// The phases of sd_gen_step, for a scheduler batching several generations.
// begin drafts and returns in *b the batch to evaluate on the generation's
// session (valid until end): a prompt chunk while the prompt is not all
// evaluated (sd_gen_set_prompt), else the tree; *b->n == 0 means no forward
// is needed (the first step, or an ended generation). The caller evaluates it
// (sd_session_forward), then calls end.
SD_API int sd_gen_step_begin(sd_gen *g, sd_batch *b, char *err, size_t errlen);
SD_API int sd_gen_step_end(sd_gen *g, sd_step *st, char *err, size_t errlen);
// Caps the tree of the next steps at max_nodes nodes, root included (1: no
// drafting; 0: no cap beyond sd_gen_params.max_nodes), e.g. a scheduler
// that shares one forward among several generations. The text does not
// change: only what the drafter may propose.
SD_API void sd_gen_set_step_limit(sd_gen *g, int max_nodes);
// Asks the generation to stop: the next step emits nothing and ends with
// SD_FINISH_STOPPED. Safe from a signal handler or another thread.
SD_API void sd_gen_stop(sd_gen *g);
// Ends the generation after the first n_keep tokens of the last step (e.g. a
// stop string matched inside it): the rest are removed from the text and the
// session's cache, finish becomes SD_FINISH_STOPPED (the statistics count
// only kept tokens).
SD_API int sd_gen_cut(sd_gen *g, int n_keep, char *err, size_t errlen);
// The committed text: prompt (this prefill's) and every emitted token.
SD_API const int32_t *sd_gen_tokens(const sd_gen *g, int *n);
SD_API const sd_gen_stats *sd_gen_get_stats(const sd_gen *g);
SD_API int sd_gen_finished(const sd_gen *g);   // the finish reason, SD_FINISH_NONE while running

// Convenience loops over the step API: prefill, then steps until the end,
// calling cb once per emitted token in order (a non-zero return stops
// generation after that token, SD_FINISH_STOPPED, the cache cut there as
// plain decoding would hold it). d NULL: plain decoding. stats may be NULL.
typedef int (*sd_token_cb)(int32_t token, void *user);
SD_API int sd_generate(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                const sd_gen_params *p, sd_token_cb cb, void *user, sd_gen_stats *stats, char *err,
                size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
