// cmd_train_head.c - specdec train-head: trains an EAGLE-3 or Medusa draft
// head for a target model on this CPU (include/specdec_train.h): the feature
// cache, the training loop, checkpoints, Ctrl-C, a live progress line.
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "cli_opts.h"
#include "specdec.h"
#include "specdec_train.h"

#define TH_MAX_DATA 64

typedef struct th_opts {
    const char *model_path, *out_path, *cache_dir, *ckpt_path, *init_path;
    const char *data[TH_MAX_DATA];
    int n_data;
    int type, out_type;
    int draft_vocab, head_ff, ttt, n_medusa, seq_len, batch, n_threads, topk, n_ctx, n_batch;
    int warmup, ckpt_every, eval_every, eval_tokens;
    uint64_t tokens, seed;
    float epochs, lr, weight_decay, clip, ckpt_minutes, heldout;
    int resume, cache_only;
    int tli, no_lsa, ca_hidden, sa_hidden, sa_full, block[2], score_answers;
} th_opts;

// A run of 1-3 decimal digits at *p (advanced past it), or -1.
static int block_num(const char **p) {
    int n = 0, d = 0;
    for (; **p >= '0' && **p <= '9' && d < 3; (*p)++, d++) n = n * 10 + (**p - '0');
    return d && !(**p >= '0' && **p <= '9') ? n : -1;
}

// "MIN-MAX" or "K" (MIN = MAX = K): digits only.
static int parse_block(const char *flag, const char *v, void *dst) {
    int *b = dst;
    const char *p = v;
    b[0] = block_num(&p);
    b[1] = *p == '-' ? (p++, block_num(&p)) : b[0];
    if (*p || b[0] < 1 || b[1] < b[0] || b[1] > SD_TRAIN_MOA_MAX_BLOCK)
        return cli_error("%s: expected MIN-MAX with 1 <= MIN <= MAX <= %d (or one K), got '%s'", flag,
                         SD_TRAIN_MOA_MAX_BLOCK, v),
               -1;
    return 0;
}

static int parse_type(const char *flag, const char *v, void *dst) {
    if (!strcmp(v, "eagle3")) *(int *)dst = SD_HEAD_EAGLE3;
    else if (!strcmp(v, "medusa")) *(int *)dst = SD_HEAD_MEDUSA;
    else if (!strcmp(v, "moa")) *(int *)dst = SD_HEAD_MOA;
    else return cli_error("%s: expected eagle3, medusa or moa, got '%s'", flag, v), -1;
    return 0;
}

static int parse_out_type(const char *flag, const char *v, void *dst) {
    if (!strcmp(v, "q8_0")) *(int *)dst = SD_TRAIN_OUT_Q8_0;
    else if (!strcmp(v, "f16")) *(int *)dst = SD_TRAIN_OUT_F16;
    else if (!strcmp(v, "f32")) *(int *)dst = SD_TRAIN_OUT_F32;
    else if (!strcmp(v, "q5_0")) *(int *)dst = SD_TRAIN_OUT_Q5_0;
    else return cli_error("%s: expected q8_0, q5_0, f16 or f32, got '%s'", flag, v), -1;
    return 0;
}

static int parse_score(const char *flag, const char *v, void *dst) {
    if (!strcmp(v, "answers")) *(int *)dst = 1;
    else if (!strcmp(v, "all")) *(int *)dst = 0;
    else return cli_error("%s: expected answers or all, got '%s'", flag, v), -1;
    return 0;
}

static int parse_data(const char *flag, const char *v, void *dst) {
    th_opts *o = dst;
    if (o->n_data == TH_MAX_DATA) return cli_error("%s: at most %d data files", flag, TH_MAX_DATA), -1;
    if (!cli_file_ok("data file", v)) return -1;
    o->data[o->n_data++] = v;
    return 0;
}

// argv -> o (defaults first). Returns a cli_parse result.
static int th_parse(int argc, char **argv, th_opts *o) {
    const sd_train_head_params d = sd_train_head_default_params();
    *o = (th_opts){.type = d.type, .out_type = d.out_type, .draft_vocab = d.draft_vocab, .ttt = d.ttt_steps,
                   .n_medusa = d.n_medusa, .seq_len = d.seq_len, .batch = d.batch, .topk = d.topk, .n_ctx = d.n_ctx,
                   .n_batch = d.n_batch, .warmup = (int)d.warmup, .eval_every = (int)d.eval_every,
                   .eval_tokens = (int)d.eval_tokens, .seed = d.seed, .epochs = (float)d.epochs, .lr = d.lr,
                   .weight_decay = d.weight_decay, .clip = d.clip, .ckpt_minutes = (float)d.ckpt_minutes,
                   .heldout = (float)d.heldout, .block = {d.moa_block_min, d.moa_block_max}};
    const cli_opt opts[] = {
        {"--model", "-m", CLI_FILE, &o->model_path, .meta = "FILE", .what = "model file",
         .required = "a target model is required (-m TARGET.gguf)", .help = "target model (required)"},
        {"--type", NULL, CLI_CUSTOM, &o->type, .fn = parse_type, .meta = "eagle3|medusa|moa", .def = "eagle3",
         .help = "the head: EAGLE-3 (one decoder layer on three of the target's layers), Medusa (residual "
                 "heads on its last state; docs/heads.md) or the Mixture of Attentions drafter (reads the "
                 "target's KV cache; docs/moa.md)"},
        {"--data", NULL, CLI_CUSTOM, o, .fn = parse_data, .meta = "FILE",
         .help = "training corpus, JSON lines: {\"messages\": [{\"role\", \"content\"}, ...]} (formatted with the "
                 "model's chat template) or {\"text\": \"...\"} (as is); other keys are ignored. Repeat for "
                 "several files (required)"},
        {"--out", "-o", CLI_STRING, &o->out_path, .meta = "FILE", .help = "the head file to write (required)"},
        {"--out-type", NULL, CLI_CUSTOM, &o->out_type, .fn = parse_out_type, .meta = "q8_0|q5_0|f16|f32", .def = "q8_0",
         .help = "type of the head's matrices (norm gains and biases stay f32); q5_0: 40% smaller than q8_0, "
                 "the type the drafters run at by default (--head-bits 5), less precise with --head-bits 8"},
        {"--threads", "-t", CLI_INT, &o->n_threads, .lo = 1, .hi = 1024, .meta = "N",
         .help = "threads (default: number of cores); a run is deterministic for a seed and a thread count"},
        {"--seed", NULL, CLI_U64, &o->seed, .meta = "S", .def = CLI_DEF_VALUE,
         .help = "initialisation and shuffling"},
        {.kind = CLI_SECTION, .help = "\nthe head:"},
        {"--draft-vocab", NULL, CLI_INT, &o->draft_vocab, .lo = 1, .hi = 1 << 24, .meta = "N",
         .def = "8192; with --init, the init head's",
         .help = "draft vocabulary: the N tokens the target predicts most often in the data (capped at the "
                 "target's vocabulary); with --init and N above the head's own, its vocabulary grows: its tokens "
                 "and rows kept, the data's most predicted tokens it lacks added (their rows start as the "
                 "target's)"},
        {"--ff", NULL, CLI_INT, &o->head_ff, .lo = 0, .hi = 1 << 20, .meta = "N",
         .help = "EAGLE-3 and MoA: width of the feed-forward layers (MoA: SA's and CA's) (default: the target's); "
                 "a smaller one makes the drafter cheaper to run, train and ship"},
        {"--ttt", NULL, CLI_INT, &o->ttt, .lo = 1, .hi = SD_TRAIN_MAX_K, .meta = "K", .def = CLI_DEF_VALUE,
         .help = "EAGLE-3 training-time-test steps (the head continues from its own outputs K-1 times)"},
        {"--tli", NULL, CLI_INT, &o->tli, .lo = 0, .hi = 4096, .meta = "N",
         .help = "MoA: run the target's last N layers after the drafter's cross-attention (target layer "
                 "inference; default 0)"},
        {"--no-lsa", NULL, CLI_FLAG, &o->no_lsa,
         .help = "MoA: no layer self-attention (the mean of the layers' K,V rows is projected directly; with TLI "
                 "N up to 2 it trains from a feature cache of that mean row, the last N layers' rows and the states "
                 "it needs, (1+N) Ekv + (N+1) E f16 values a token (8 KB for Qwen2.5-Coder-1.5B with TLI 1), "
                 "instead of recomputing the target's rows)"},
        {"--ca-hidden", NULL, CLI_FLAG, &o->ca_hidden,
         .help = "MoA: cross-attention's keys and values also read the target's state entering layer L-N (TLI 0: "
                 "its final normed state) at each verified position, as EAGLE reads the target's states (one "
                 "more E x E matrix; the feature cache holds the state already)"},
        {"--sa-hidden", NULL, CLI_FLAG, &o->sa_hidden,
         .help = "MoA: every drafted row's self-attention input also adds that target state of the last verified "
                 "position, as EAGLE's input reads it (one more E x E matrix)"},
        {"--sa-full", NULL, CLI_FLAG, &o->sa_full,
         .help = "MoA: self-attention sees the whole text (every verified position), as the reference's drafter "
                 "does at inference, not only the drafted rows from the last verified point; trained with the "
                 "reference's curriculum (a sequence sees the whole text with a probability rising from 0 to 1 over "
                 "the first half of the steps); not with --sa-hidden"},
        {"--moa-block", NULL, CLI_CUSTOM, o->block, .fn = parse_block, .meta = "MIN-MAX", .def = "6-15",
         .help = "MoA: a verified point every k positions, k drawn per sequence in MIN..MAX; a row d positions "
                 "after its point trains the (d+1)-th drafted token, so short blocks train the first drafted "
                 "tokens (those inference accepts most) more often (the reference draws 6-15)"},
        {"--medusa-heads", NULL, CLI_INT, &o->n_medusa, .lo = 1, .hi = SD_TRAIN_MAX_K, .meta = "N",
         .def = CLI_DEF_VALUE, .help = "Medusa heads (head k drafts the token k+2 ahead)"},
        {"--init", NULL, CLI_FILE, &o->init_path, .meta = "FILE", .what = "head file",
         .help = "start from this head (its vocabulary and parameters) instead of a fresh one; it must belong to "
                 "the target"},
        {.kind = CLI_SECTION, .help = "\ntraining:"},
        {"--tokens", NULL, CLI_U64, &o->tokens, .meta = "N",
         .help = "train on N positions (default: --epochs passes over the training split)"},
        {"--epochs", NULL, CLI_FLOAT, &o->epochs, .lo = 1e-6, .hi = 1e6, .meta = "E", .def = CLI_DEF_VALUE,
         .help = "passes over the training split, when --tokens is not given"},
        {"--seq-len", NULL, CLI_INT, &o->seq_len, .lo = 2, .hi = 1 << 16, .meta = "T", .def = CLI_DEF_VALUE,
         .help = "positions per training sequence"},
        {"--batch", NULL, CLI_INT, &o->batch, .lo = 1, .hi = 1 << 16, .meta = "B", .def = CLI_DEF_VALUE,
         .help = "sequences per optimiser step"},
        {"--lr", NULL, CLI_FLOAT, &o->lr, .lo = 1e-9, .hi = 10, .meta = "LR", .def = CLI_DEF_VALUE,
         .help = "peak learning rate (AdamW, beta 0.9/0.95; linear warm-up, cosine decay to LR/10)"},
        {"--warmup", NULL, CLI_INT, &o->warmup, .lo = -1, .hi = 1 << 30, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "warm-up steps; -1 = 5% of the steps, at most 500"},
        {"--weight-decay", NULL, CLI_FLOAT, &o->weight_decay, .lo = 0, .hi = 10, .meta = "W", .def = CLI_DEF_VALUE,
         .help = "AdamW weight decay (never on norm gains and biases)"},
        {"--clip", NULL, CLI_FLOAT, &o->clip, .lo = 0, .hi = 1e6, .meta = "C", .def = CLI_DEF_VALUE,
         .help = "gradient-norm clip; 0 = none"},
        {"--score", NULL, CLI_CUSTOM, &o->score_answers, .fn = parse_score, .meta = "answers|all", .def = "all",
         .help = "positions the loss and the agreement score: answers = only where the assistant writes in chat "
                 "records (the next token is part of an assistant turn, its end-of-turn marker included: what a "
                 "drafter drafts; text records in full), all = every position, the prompts too"},
        {"--heldout", NULL, CLI_FLOAT, &o->heldout, .lo = 0, .hi = 0.9, .meta = "F", .def = CLI_DEF_VALUE,
         .help = "fraction of the records held back for evaluation (top-1 agreement with the target)"},
        {"--eval-every", NULL, CLI_INT, &o->eval_every, .lo = 1, .hi = 1 << 30, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "steps between evaluations (and one at the end)"},
        {"--eval-tokens", NULL, CLI_INT, &o->eval_tokens, .lo = 1, .hi = 1 << 30, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "most held-back positions per evaluation"},
        {.kind = CLI_SECTION, .help = "\ncheckpoints:"},
        {"--ckpt", NULL, CLI_STRING, &o->ckpt_path, .meta = "FILE", .def = "OUT.ckpt",
         .help = "checkpoint: head, optimiser state, data position, RNG; written to FILE.tmp and renamed (a full "
                 "disk keeps the previous one)"},
        {"--ckpt-minutes", NULL, CLI_FLOAT, &o->ckpt_minutes, .lo = 0, .hi = 1e6, .meta = "M", .def = CLI_DEF_VALUE,
         .help = "minutes between checkpoints; 0 = only at Ctrl-C and at the end"},
        {"--ckpt-every", NULL, CLI_INT, &o->ckpt_every, .lo = 0, .hi = 1 << 30, .meta = "N",
         .help = "also a checkpoint every N steps"},
        {"--resume", NULL, CLI_FLAG, &o->resume,
         .help = "continue from the checkpoint, with the same options; the result is bit-identical to an "
                 "uninterrupted run on as many threads. Without it an existing checkpoint is an error"},
        {.kind = CLI_SECTION, .help = "\nthe feature cache (the target run once over the data):"},
        {"--cache", NULL, CLI_STRING, &o->cache_dir, .meta = "DIR", .def = "OUT.cache",
         .help = "cache directory: per position the token, the target's states (f16) and its top-k; resumable "
                 "(a rerun continues after the last complete record); refused for another target or other layers"},
        {"--cache-only", NULL, CLI_FLAG, &o->cache_only, .help = "build the cache and stop"},
        {"--topk", NULL, CLI_INT, &o->topk, .lo = 1, .hi = 32, .meta = "K", .def = CLI_DEF_VALUE,
         .help = "target distribution entries kept per position (renormalised: the soft labels)"},
        {"--ctx", NULL, CLI_INT, &o->n_ctx, .lo = 2, .hi = 1 << 20, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "window of the target: longer records are split into windows of N tokens, each run from an "
                 "empty context (at most the model's training context)"},
        {"--cache-batch", NULL, CLI_INT, &o->n_batch, .lo = 1, .hi = 8192, .meta = "N", .def = CLI_DEF_VALUE,
         .help = "tokens per target forward while caching"},
        {"--help", "-h", CLI_HELP, .help = "show this help"},
    };
    const cli_cmd cmd = {
        .name = "train-head",
        .usage = "usage: specdec train-head -m TARGET.gguf --data FILE.jsonl --out HEAD.gguf [options]",
        .intro = "Trains a draft head for TARGET on this CPU. The target runs once over the data\n"
                 "(the feature cache); the draft vocabulary is the tokens the target predicts most\n"
                 "often there; the head starts from the target's own read-out and is trained with\n"
                 "AdamW against the target's top-k distribution (EAGLE-3 with its training-time\n"
                 "test). Progress on stderr; Ctrl-C writes a checkpoint (--resume continues).\n",
        .notes = "exit status: 0 the head is written, 1 an error, 130 stopped by Ctrl-C (checkpoint\n"
                 "written). Example:\n"
                 "  specdec train-head -m models/SmolLM2-135M-Instruct.Q4_1.gguf --data train.jsonl \\\n"
                 "      --out heads/smollm2.eagle3.gguf --tokens 2000000\n",
        .opts = opts,
        .n_opts = CLI_N(opts),
    };
    int r = cli_parse(&cmd, argc, argv);
    if (r != CLI_PARSE_OK) return r;
    if (o->n_data == 0) return cli_error("train-head: training data is required (--data FILE.jsonl)"), CLI_PARSE_ERROR;
    if (!o->out_path && !o->cache_only)
        return cli_error("train-head: an output file is required (--out HEAD.gguf)"), CLI_PARSE_ERROR;
    if (o->n_threads <= 0) o->n_threads = sd_n_cores();
    return CLI_PARSE_OK;
}

// ---------------------------------------------------------------- progress
typedef struct th_view {
    int tty;             // stderr is a terminal: one line redrawn; else a line every few seconds
    int open;            // a progress line is on the screen without its newline
    double last_ms;      // when the last line was printed
    int64_t last_eval_step;
} th_view;

static void fmt_time(double s, char *buf, size_t n) {
    if (s < 0) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

static void fmt_count(double x, char *buf, size_t n) {
    if (x >= 1e6) snprintf(buf, n, "%.2fM", x / 1e6);
    else if (x >= 1e4) snprintf(buf, n, "%.1fk", x / 1e3);
    else snprintf(buf, n, "%.0f", x);
}

static void put_line(th_view *v, const char *line, int final) {
    if (v->tty) {
        fprintf(stderr, "\r%-100s%s", line, final ? "\n" : "");
        v->open = !final;
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
}

static void on_progress(void *user, const sd_train_progress *p) {
    th_view *v = user;
    char line[256], a[32], b[32], c[32];
    const double now = sd_time_ms();
    const int due = v->tty ? now - v->last_ms >= 200 : now - v->last_ms >= 10000;
    if (p->phase == SD_TRAIN_PHASE_NOTE) {
        if (v->open) fprintf(stderr, "\n");
        v->open = 0;
        fprintf(stderr, "train-head: %s\n", p->note);
        fflush(stderr);
        return;
    }
    if (p->phase == SD_TRAIN_PHASE_CACHE) {
        int last = p->records == p->records_total;
        if (!due && !last) return;
        fmt_count((double)p->cache_tokens, a, sizeof a);
        if (last && p->cache_tok_per_s == 0) {   // nothing new to compute
            snprintf(line, sizeof line, "feature cache: %lld records, %s tokens", (long long)p->records, a);
            put_line(v, line, 1);
            v->last_ms = now;
            return;
        }
        fmt_count(p->cache_tok_per_s, b, sizeof b);
        fmt_time(p->cache_eta_s, c, sizeof c);
        char in_rec[48] = "";   // inside a long record: how far it is
        if (p->record_tokens > 0 && !last)
            snprintf(in_rec, sizeof in_rec, " (record %lld at %.1f%%)", (long long)p->records + 1,
                     100.0 * (double)p->record_done / (double)p->record_tokens);
        snprintf(line, sizeof line, "caching %lld/%lld records%s  %s tokens  %s tok/s  ETA %s", (long long)p->records,
                 (long long)p->records_total, in_rec, a, b, c);
        put_line(v, line, last);
    } else if (p->phase == SD_TRAIN_PHASE_STEP) {
        int last = p->step == p->n_steps;
        if (!due && !last && p->step != 1) return;
        fmt_count(p->tok_per_s, a, sizeof a);
        fmt_time(p->eta_s, b, sizeof b);
        int o = snprintf(line, sizeof line, "step %lld/%lld  %s tok/s  loss %.3f  agree", (long long)p->step,
                         (long long)p->n_steps, a, p->loss);
        for (int k = 0; k < p->n_agree && o < (int)sizeof line - 8; k++)
            o += snprintf(line + o, sizeof line - (size_t)o, " %.0f%%", 100.0 * p->agree[k]);
        snprintf(line + o, sizeof line - (size_t)o, "  ETA %s", b);
        put_line(v, line, last);
    } else if (p->phase == SD_TRAIN_PHASE_EVAL) {
        int o = snprintf(line, sizeof line, "held back (%lld tokens) at step %lld: loss %.3f  agree",
                         (long long)p->eval_tokens, (long long)p->step, p->eval_loss);
        for (int k = 0; k < p->n_agree && o < (int)sizeof line - 8; k++)
            o += snprintf(line + o, sizeof line - (size_t)o, " %.0f%%", 100.0 * p->eval_agree[k]);
        if (v->open) fprintf(stderr, "\n");
        v->open = 0;
        fprintf(stderr, "%s\n", line);
        fflush(stderr);
        return;
    }
    v->last_ms = now;
}

// ---------------------------------------------------------------- Ctrl-C
static volatile sig_atomic_t g_stop;

static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
}

// The command line, for the head's recipe note.
static void join_argv(int argc, char **argv, char *out, size_t n) {
    size_t o = (size_t)snprintf(out, n, "specdec");
    for (int i = 0; i < argc && o + 2 < n; i++) o += (size_t)snprintf(out + o, n - o, " %s", argv[i]);
}

int cmd_train_head(int argc, char **argv) {
    th_opts o;
    int pr = th_parse(argc, argv, &o);
    if (pr != CLI_PARSE_OK) return cli_parse_exit(pr);
    char recipe[1024];
    join_argv(argc, argv, recipe, sizeof recipe);
    sd_train_head_params p = sd_train_head_default_params();
    p.model_path = o.model_path;
    p.type = o.type;
    p.moa_tli = o.tli;
    p.moa_no_lsa = o.no_lsa;
    p.moa_ca_hidden = o.ca_hidden;
    p.moa_sa_hidden = o.sa_hidden;
    p.moa_sa_full = o.sa_full;
    p.score_answers = o.score_answers;
    p.moa_block_min = o.block[0];
    p.moa_block_max = o.block[1];
    p.data_paths = o.data;
    p.n_data = o.n_data;
    p.cache_dir = o.cache_dir;
    p.out_path = o.out_path;
    p.out_type = o.out_type;
    p.init_path = o.init_path;
    p.draft_vocab = o.draft_vocab;
    p.head_ff = o.head_ff;
    p.ttt_steps = o.ttt;
    p.n_medusa = o.n_medusa;
    p.seq_len = o.seq_len;
    p.batch = o.batch;
    p.tokens = (int64_t)o.tokens;
    p.epochs = o.epochs;
    p.lr = o.lr;
    p.warmup = o.warmup;
    p.weight_decay = o.weight_decay;
    p.clip = o.clip;
    p.n_threads = o.n_threads;
    p.seed = o.seed;
    p.ckpt_path = o.ckpt_path;
    p.ckpt_minutes = o.ckpt_minutes;
    p.ckpt_every = o.ckpt_every;
    p.resume = o.resume;
    p.heldout = o.heldout;
    p.eval_every = o.eval_every;
    p.eval_tokens = o.eval_tokens;
    p.topk = o.topk;
    p.n_ctx = o.n_ctx;
    p.n_batch = o.n_batch;
    p.cache_only = o.cache_only;
    p.recipe = recipe;
    th_view view = {.tty = isatty(2)};
    p.progress = on_progress;
    p.user = &view;
    p.stop = &g_stop;
    struct sigaction sa;   // SA_RESETHAND: a second Ctrl-C ends the program at once
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    char err[1024];
    sd_train_head_result res;
    int r = sd_train_head(&p, &res, err, sizeof err);
    signal(SIGINT, SIG_DFL);
    if (view.open) fprintf(stderr, "\n");
    if (r < 0) return cli_error("train-head: %s", err);
    if (r == 1) {
        fprintf(stderr, "train-head: stopped; run the same command%s to continue\n",
                res.stopped == 1 ? " with --resume" : "");
        return 130;
    }
    if (o.cache_only) {
        printf("feature cache: %lld records, %lld positions\n", (long long)res.cache_records,
               (long long)res.cache_tokens);
        return 0;
    }
    char t[32];
    fmt_time(res.train_seconds, t, sizeof t);
    printf("wrote %s: %s head, draft vocabulary %d (%.1f%% of the target's argmax), %lld steps, %lld tokens, %s",
           o.out_path, o.type == SD_HEAD_EAGLE3 ? "eagle3" : o.type == SD_HEAD_MOA ? "moa" : "medusa", res.draft_vocab, 100.0 * res.coverage,
           (long long)res.step, (long long)res.tokens, t);
    if (res.eval_tokens) {
        printf("; held back: loss %.3f, agreement", res.eval_loss);
        for (int k = 0; k < res.n_agree; k++) printf(" %.1f%%", 100.0 * res.eval_agree[k]);
    }
    printf("\n");
    return 0;
}
