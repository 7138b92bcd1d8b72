// loop.c - sd_train_head (include/specdec_train.h): cache, vocabulary, head,
// the AdamW loop with evaluation, checkpoints and progress, the saved head.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <unistd.h>

#include "common.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "train/loop_impl.h"

sd_train_head_params sd_train_head_default_params(void) {
    sd_train_head_params p;
    memset(&p, 0, sizeof p);
    p.type = SD_HEAD_EAGLE3;
    p.out_type = SD_TRAIN_OUT_Q8_0;
    p.draft_vocab = 0;   // 8192 for a new head; the --init head's own
    p.ttt_steps = 3;
    p.n_medusa = 4;
    p.seq_len = 256;
    p.batch = 8;
    p.epochs = 1.0;
    p.lr = 3e-4f;
    p.warmup = -1;
    p.clip = 1.0f;
    p.seed = 42;
    p.ckpt_minutes = 5.0;
    p.heldout = 0.02;
    p.eval_every = 200;
    p.eval_tokens = 16384;
    p.topk = 8;
    p.n_ctx = 2048;
    p.n_batch = 256;
    p.moa_block_min = SD_MOA_BLOCK_MIN;
    p.moa_block_max = SD_MOA_BLOCK_MAX;
    return p;
}

// ---------------------------------------------------------------- progress
static void report(loop_run *r, int phase) {
    if (!r->P.progress) return;
    r->prog.phase = phase;
    r->prog.elapsed_s = (sd_time_ms() - r->t0) / 1000.0;
    r->P.progress(r->P.user, &r->prog);
}

static void note(loop_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(loop_run *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note_buf, 1024, fmt, ap);
    va_end(ap);
    r->prog.note = r->note_buf;
    report(r, SD_TRAIN_PHASE_NOTE);
    r->prog.note = NULL;
}

static void on_cache(void *user, const sd_cache_progress *cp) {
    loop_run *r = user;
    if (r->cache_rec0 < 0) r->cache_rec0 = cp->records;   // the first report: records cached before this build
    r->prog.records = cp->records;
    r->prog.records_total = cp->records_total;
    r->prog.cache_tokens = cp->tokens;
    r->prog.cache_tok_per_s = cp->ms > 0 ? cp->tokens_new * 1000.0 / cp->ms : 0.0;
    r->prog.record_tokens = cp->rec_tokens;
    r->prog.record_done = cp->rec_done;
    // time per record of this build, over the records still to do; inside
    // the first record, its positions left at this build's rate (and the
    // records after it taken as long)
    int64_t done = cp->records - r->cache_rec0, left = cp->records_total - cp->records;
    const double tps = r->prog.cache_tok_per_s;
    if (done > 0) r->prog.cache_eta_s = cp->ms / 1000.0 / (double)done * (double)left;
    else if (cp->rec_tokens > 0 && tps > 0)
        r->prog.cache_eta_s = (double)(cp->rec_tokens - cp->rec_done) / tps + (double)(left - 1) * cp->rec_tokens / tps;
    else r->prog.cache_eta_s = -1;
    report(r, SD_TRAIN_PHASE_CACHE);
}

// ---------------------------------------------------------------- set-up
static int resolve(loop_run *r, const sd_train_head_params *p, char *err, size_t errlen) {
    r->P = *p;
    sd_train_head_params *P = &r->P;
    if (P->type != SD_HEAD_EAGLE3 && P->type != SD_HEAD_MEDUSA && P->type != SD_HEAD_MOA)
        return sd_err(err, errlen, "unknown head type %d (eagle3, medusa or moa)", P->type);
    if (P->type != SD_HEAD_MOA && (P->moa_tli || P->moa_no_lsa || P->moa_ca_hidden || P->moa_sa_hidden || P->moa_sa_full))
        return sd_err(err, errlen,
                      "--tli, --no-lsa, --ca-hidden, --sa-hidden and --sa-full are for an MoA drafter (--type moa)");
    if (P->moa_sa_full && P->moa_sa_hidden)
        return sd_err(err, errlen, "--sa-full with --sa-hidden is not supported yet: a verified row's SA input "
                      "would depend on where training put its verified points; drop one of them");
    if (!P->moa_block_min && !P->moa_block_max) P->moa_block_min = SD_MOA_BLOCK_MIN, P->moa_block_max = SD_MOA_BLOCK_MAX;
    if (P->type != SD_HEAD_MOA && (P->moa_block_min != SD_MOA_BLOCK_MIN || P->moa_block_max != SD_MOA_BLOCK_MAX))
        return sd_err(err, errlen, "--moa-block is for an MoA drafter (--type moa)");
    if (P->moa_block_min < 1 || P->moa_block_max < P->moa_block_min || P->moa_block_max > SD_TRAIN_MOA_MAX_BLOCK)
        return sd_err(err, errlen, "--moa-block %d-%d: expected MIN-MAX with 1 <= MIN <= MAX <= %d", P->moa_block_min,
                      P->moa_block_max, SD_TRAIN_MOA_MAX_BLOCK);
    if (!P->model && !P->model_path) return sd_err(err, errlen, "no target model given");
    if (P->n_data < 1 || !P->data_paths) return sd_err(err, errlen, "no training data given (--data FILE.jsonl)");
    if (!P->out_path && !P->cache_only) return sd_err(err, errlen, "no output head file given (--out HEAD.gguf)");
    if (P->out_type < SD_TRAIN_OUT_Q8_0 || P->out_type > SD_TRAIN_OUT_Q5_0)
        return sd_err(err, errlen, "unknown output type %d", P->out_type);
    if (P->draft_vocab < 0) return sd_err(err, errlen, "draft vocabulary of %d tokens", P->draft_vocab);
    if (P->head_ff < 0 || (P->head_ff > 0 && P->type == SD_HEAD_MEDUSA))
        return sd_err(err, errlen, "a feed-forward width (--ff %d) is for a new EAGLE-3 head or MoA drafter", P->head_ff);
    if (P->ttt_steps < 1 || P->ttt_steps > SD_TRAIN_MAX_K)
        return sd_err(err, errlen, "%d training-time-test steps (1..%d)", P->ttt_steps, SD_TRAIN_MAX_K);
    if (P->n_medusa < 1 || P->n_medusa > SD_HEAD_MAX_MEDUSA)
        return sd_err(err, errlen, "%d Medusa heads (1..%d)", P->n_medusa, SD_HEAD_MAX_MEDUSA);
    if (P->seq_len < 2 || P->batch < 1 || P->tokens < 0 || (P->tokens == 0 && !(P->epochs > 0)))
        return sd_err(err, errlen, "bad run length (seq_len %d, batch %d, tokens %lld, epochs %g)", P->seq_len,
                      P->batch, (long long)P->tokens, P->epochs);
    if (!(P->lr > 0) || P->weight_decay < 0 || !(P->heldout >= 0 && P->heldout < 1))
        return sd_err(err, errlen, "bad optimiser settings (lr %g, weight decay %g, held back %g)", P->lr,
                      P->weight_decay, P->heldout);
    if (P->eval_every < 1) P->eval_every = 1;
    const char *base = P->out_path ? P->out_path : "head";
    if (!P->cache_dir) snprintf(r->cache_dir, sizeof r->cache_dir, "%s.cache", base);
    else snprintf(r->cache_dir, sizeof r->cache_dir, "%s", P->cache_dir);
    if (!P->ckpt_path) snprintf(r->ckpt_path, sizeof r->ckpt_path, "%s.ckpt", base);
    else snprintf(r->ckpt_path, sizeof r->ckpt_path, "%s", P->ckpt_path);
    if (!P->cache_only) {
        int exists = access(r->ckpt_path, F_OK) == 0;
        if (P->resume && !exists)
            return sd_err(err, errlen, "no checkpoint %s to resume from (run without --resume to start)", r->ckpt_path);
        if (!P->resume && exists)
            return sd_err(err, errlen,
                          "the checkpoint %s exists: --resume continues it; delete it (or name another --ckpt) to "
                          "start over",
                          r->ckpt_path);
    }
    return 0;
}

// The head's hyper-parameters: from the checkpoint (resume), the init head
// or the target's defaults. May create r->h (resume, init).
static int plan_head(loop_run *r, sd_head_hp *hp, char *err, size_t errlen) {
    const sd_train_head_params *P = &r->P;
    if (P->resume && !P->cache_only) {
        if (sd_ckpt_load(r->ckpt_path, r->m, &r->h, &r->opt, &r->recipe, &r->st, err, errlen) < 0) return -1;
        r->have_opt = 1;
        *hp = r->h->hp;
        if (hp->type != P->type)
            return sd_err(err, errlen, "the checkpoint %s trains %s head, not %s one", r->ckpt_path,
                          hp->type == SD_HEAD_EAGLE3 ? "an EAGLE-3" : hp->type == SD_HEAD_MOA ? "an MoA" : "a Medusa",
                          P->type == SD_HEAD_EAGLE3 ? "an EAGLE-3" : P->type == SD_HEAD_MOA ? "an MoA" : "a Medusa");
        if (hp->type == SD_HEAD_MOA && (hp->moa_tli != P->moa_tli || hp->moa_no_lsa != P->moa_no_lsa ||
                                        hp->moa_ca_hidden != P->moa_ca_hidden || hp->moa_sa_hidden != P->moa_sa_hidden ||
                                        hp->moa_sa_full != P->moa_sa_full))
            return sd_err(err, errlen,
                          "the checkpoint %s trains an MoA drafter with TLI %d%s%s%s%s; this run asks for TLI %d%s%s%s%s",
                          r->ckpt_path, hp->moa_tli, hp->moa_no_lsa ? " without LSA" : "",
                          hp->moa_ca_hidden ? " with --ca-hidden" : "", hp->moa_sa_hidden ? " with --sa-hidden" : "",
                          hp->moa_sa_full ? " with --sa-full" : "", P->moa_tli, P->moa_no_lsa ? " without LSA" : "",
                          P->moa_ca_hidden ? " with --ca-hidden" : "", P->moa_sa_hidden ? " with --sa-hidden" : "",
                          P->moa_sa_full ? " with --sa-full" : "");
        int dv = P->draft_vocab ? SD_MIN(P->draft_vocab, r->m->hp.n_vocab) : hp->n_draft_vocab;
        if (!P->init_path && hp->type == SD_HEAD_EAGLE3 && P->head_ff > 0 && hp->n_ff != P->head_ff)
            return sd_err(err, errlen, "the checkpoint %s has a feed-forward width of %d; this run asks for %d",
                          r->ckpt_path, hp->n_ff, P->head_ff);
        if (!P->init_path && hp->n_draft_vocab != dv)
            return sd_err(err, errlen, "the checkpoint %s has a draft vocabulary of %d tokens; this run asks for %d",
                          r->ckpt_path, hp->n_draft_vocab, dv);
        return 0;
    }
    if (P->init_path && !P->cache_only) {
        char e2[512];
        if (sd_head_load(&r->h, P->init_path, r->m, e2, sizeof e2) < 0)
            return sd_err(err, errlen, "--init %s: %s", P->init_path, e2);
        *hp = r->h->hp;
        if (hp->type != P->type) return sd_err(err, errlen, "--init %s is not a head of the type asked for", P->init_path);
        if (P->draft_vocab && SD_MIN(P->draft_vocab, r->m->hp.n_vocab) < hp->n_draft_vocab)
            return sd_err(err, errlen,
                          "--draft-vocab %d: the --init head %s has %d tokens; a head's vocabulary can grow (its "
                          "tokens kept, the data's most predicted ones added), not shrink",
                          P->draft_vocab, P->init_path, hp->n_draft_vocab);
        if (P->draft_vocab && SD_MIN(P->draft_vocab, r->m->hp.n_vocab) > hp->n_draft_vocab && hp->type == SD_HEAD_MOA)
            return sd_err(err, errlen, "--draft-vocab %d with --init: an MoA drafter's vocabulary cannot grow (EAGLE-3 "
                          "and Medusa heads can)", P->draft_vocab);
        if (hp->type == SD_HEAD_MOA && P->moa_sa_full && !hp->moa_sa_full) {   // (no tensor changes: SA's own)
            if (hp->moa_sa_hidden)
                return sd_err(err, errlen, "--init %s reads the target's state in SA (--sa-hidden): not with --sa-full",
                              P->init_path);
            r->h->hp.moa_sa_full = hp->moa_sa_full = 1;
        }
        return 0;
    }
    *hp = sd_head_default_hp(r->m, P->type);
    if (P->draft_vocab) hp->n_draft_vocab = SD_MIN(P->draft_vocab, r->m->hp.n_vocab);   // (else the default's)
    if (P->type == SD_HEAD_MEDUSA) hp->n_medusa = P->n_medusa;
    if (P->type == SD_HEAD_EAGLE3 && P->head_ff > 0) hp->n_ff = P->head_ff;
    if (P->type == SD_HEAD_MOA) {
        hp->moa_tli = P->moa_tli;
        hp->moa_no_lsa = P->moa_no_lsa;
        hp->moa_ca_hidden = P->moa_ca_hidden;
        hp->moa_sa_hidden = P->moa_sa_hidden;
        hp->moa_sa_full = P->moa_sa_full;
        if (P->head_ff > 0) hp->n_ff = P->head_ff;
    }
    return 0;
}

static int open_cache(loop_run *r, const sd_head_hp *hp, char *err, size_t errlen) {
    sd_cache_params cp = sd_cache_default_params();
    cp.type = hp->type;
    if (hp->type == SD_HEAD_MOA && loop_moa_uses_cache(hp)) cp.moa_tli = hp->moa_tli;   // the MoA cache (loop_moa.c)
    else if (hp->type == SD_HEAD_MOA) cp.type = SD_HEAD_MEDUSA;   // tokens and labels; K,V rows recomputed
    memcpy(cp.extract, hp->extract, sizeof cp.extract);
    cp.topk = r->P.topk;
    cp.n_ctx = r->P.n_ctx;
    char cnote[1024];
    if (sd_cache_open(&r->cache, r->cache_dir, r->m, &cp, cnote, sizeof cnote, err, errlen) < 0) return -1;
    if (cnote[0]) note(r, "%s", cnote);
    sd_cache_build_params bp = {.n_batch = r->P.n_batch, .pool = r->pool, .stop = r->P.stop,
                                .progress = on_cache, .user = r};
    r->cache_rec0 = -1;
    int b = sd_cache_build(r->cache, r->m, r->P.data_paths, r->P.n_data, &bp, err, errlen);
    if (b == 1)
        note(r, "stopped while building the feature cache %s: its complete records (and the finished windows of the "
             "record in progress) are kept; run again to go on", r->cache_dir);
    return b;
}

// The head to train (r->h): fresh (vocabulary, random init, target rows),
// from --init, or from the checkpoint.
static int make_head(loop_run *r, sd_head_hp *hp, char *err, size_t errlen) {
    if (r->P.score_answers && loop_answers_init(r, err, errlen) < 0) return -1;   // (the vocabulary counts answers)
    if (r->h) {
        const int want = SD_MIN(r->P.draft_vocab, r->m->hp.n_vocab);
        if (r->P.init_path && !r->have_opt && want > r->h->hp.n_draft_vocab) {   // --init, a larger vocabulary
            const int n0 = r->h->hp.n_draft_vocab;
            if (loop_extend_vocab(r, want, err, errlen) < 0) return -1;
            note(r, "draft vocabulary of --init %s extended from %d to %d tokens (new output rows: the target's, "
                    "scaled to the head's rows)", r->P.init_path, n0, want);
        }
        if (loop_coverage(r, r->h, &r->coverage, err, errlen) < 0) return -1;
        return 0;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)hp->n_draft_vocab);
    if (!ids) return sd_err(err, errlen, "out of memory");
    int rv = loop_pick_vocab(r, hp->n_draft_vocab, ids, &r->coverage, err, errlen);
    if (rv == 0) rv = sd_head_new(&r->h, hp, err, errlen);
    if (rv == 0) rv = sd_head_set_vocab(r->h, ids, hp->n_draft_vocab, err, errlen);
    free(ids);
    if (rv < 0) return -1;
    sd_head_init(r->h, r->P.seed);
    loop_init_from_target(r->h, r->m);
    return 0;
}

// A field of the recipe that a resumed run must repeat.
#define RECIPE_CHECK(field, what, fmt, cast)                                                                         \
    if (ck->field != want->field)                                                                                    \
        return sd_err(err, errlen,                                                                                   \
                      "the checkpoint %s was made with %s " fmt "; this run has " fmt                               \
                      " (resume with the settings it was started with)",                                             \
                      r->ckpt_path, what, (cast)ck->field, (cast)want->field);

static int recipe_compare(loop_run *r, const sd_ckpt_recipe *ck, const sd_ckpt_recipe *want, char *err,
                          size_t errlen) {
    RECIPE_CHECK(ttt_steps, "--ttt", "%d", int)
    RECIPE_CHECK(n_medusa, "--medusa-heads", "%d", int)
    RECIPE_CHECK(seq_len, "--seq-len", "%d", int)
    RECIPE_CHECK(batch, "--batch", "%d", int)
    RECIPE_CHECK(topk, "--topk", "%d", int)
    RECIPE_CHECK(n_ctx, "--ctx", "%d", int)
    RECIPE_CHECK(seed, "--seed", "%llu", unsigned long long)
    RECIPE_CHECK(lr, "--lr", "%g", double)
    RECIPE_CHECK(weight_decay, "--weight-decay", "%g", double)
    RECIPE_CHECK(clip, "--clip", "%g", double)
    RECIPE_CHECK(heldout, "--heldout", "%g", double)
    RECIPE_CHECK(warmup, "--warmup", "%lld", long long)
    if (ck->moa_block != want->moa_block)
        return sd_err(err, errlen,
                      "the checkpoint %s was made with --moa-block %d-%d; this run has %d-%d (resume with the "
                      "settings it was started with)",
                      r->ckpt_path, ck->moa_block & 255, ck->moa_block >> 8, want->moa_block & 255,
                      want->moa_block >> 8);
    if (ck->score_answers != want->score_answers)
        return sd_err(err, errlen,
                      "the checkpoint %s was made with --score %s; this run has --score %s (resume with the settings "
                      "it was started with)",
                      r->ckpt_path, ck->score_answers ? "answers" : "all", want->score_answers ? "answers" : "all");
    RECIPE_CHECK(n_steps, "a run length (--tokens / --epochs) of steps", "%lld", long long)
    RECIPE_CHECK(cache_records, "a feature cache of records", "%lld", long long)
    RECIPE_CHECK(cache_positions, "a feature cache of positions", "%lld", long long)
    return 0;
}

// Steps, warm-up, the recipe; the optimiser and the trainer.
static int plan_training(loop_run *r, char *err, size_t errlen) {
    const sd_train_head_params *P = &r->P;
    // --tokens counts positions: sequences are up to seq_len long, shorter at the ends of records
    const double mean_T = (double)r->train_pos / (double)r->n_train;
    int64_t n_steps = P->tokens > 0 ? (int64_t)ceil((double)P->tokens / (mean_T * P->batch))
                                    : (int64_t)ceil(P->epochs * (double)r->n_train / P->batch);
    if (n_steps < 1) n_steps = 1;
    int64_t warmup = P->warmup >= 0 ? P->warmup : SD_MIN(500, n_steps * 5 / 100);
    sd_ckpt_recipe want;
    memset(&want, 0, sizeof want);
    want.type = r->h->hp.type;
    want.draft_vocab = r->h->hp.n_draft_vocab;
    want.ttt_steps = r->h->hp.type == SD_HEAD_EAGLE3 ? P->ttt_steps : 0;
    want.n_medusa = r->h->hp.n_medusa;
    want.seq_len = P->seq_len;
    want.batch = P->batch;
    want.topk = P->topk;
    want.n_ctx = P->n_ctx;
    memcpy(want.extract, r->h->hp.extract, sizeof want.extract);
    want.seed = P->seed;
    want.lr = P->lr;
    want.weight_decay = P->weight_decay;
    want.clip = P->clip;
    want.heldout = (float)P->heldout;
    want.warmup = warmup;
    want.n_steps = n_steps;
    want.cache_records = sd_cache_n_records(r->cache);
    want.cache_positions = sd_cache_n_positions(r->cache);
    want.score_answers = (int16_t)(P->score_answers != 0);
    if (want.type == SD_HEAD_MOA) {
        want.moa_block = (int16_t)(P->moa_block_min | P->moa_block_max << 8);
        if (r->have_opt && !r->recipe.moa_block) r->recipe.moa_block = (int16_t)(SD_MOA_BLOCK_MIN | SD_MOA_BLOCK_MAX << 8);
    }
    if (r->have_opt) {   // resumed
        if (recipe_compare(r, &r->recipe, &want, err, errlen) < 0) return -1;
        r->seconds0 = r->st.seconds;
        note(r, "resumed %s at step %lld of %lld (epoch %lld)", r->ckpt_path, (long long)r->st.step,
             (long long)n_steps, (long long)r->st.epoch);
        if (r->st.n_threads != sd_threadpool_size(r->pool))
            note(r, "the checkpoint was written by a run on %d threads, this one has %d: the result is not "
                    "bit-identical to an uninterrupted run",
                 r->st.n_threads, sd_threadpool_size(r->pool));
    } else {
        if (sd_adamw_init(&r->opt, r->h->n_w, err, errlen) < 0) return -1;
        r->have_opt = 1;
        memset(&r->st, 0, sizeof r->st);
        sd_rng_seed(&r->rng, sd_rng_derive(P->seed, 1));
        memcpy(r->st.rng_epoch, r->rng.s, sizeof r->rng.s);
    }
    r->recipe = want;
    r->st.n_threads = sd_threadpool_size(r->pool);
    r->opt.lr = P->lr;
    r->opt.beta1 = 0.9f;
    r->opt.beta2 = 0.95f;
    r->opt.eps = 1e-8f;
    r->opt.weight_decay = P->weight_decay;
    r->opt.clip = P->clip;
    r->opt.warmup = warmup;
    r->opt.total = n_steps;
    loop_shuffle(r);   // the current epoch's order, from its RNG state
    const int k = sd_cache_topk(r->cache), nf = sd_cache_n_feat(r->cache), T = P->seq_len;
    r->grad = aligned_alloc(64, (r->h->n_w * sizeof(float) + 63) / 64 * 64);
    r->b_tok = malloc(sizeof(int32_t) * (size_t)T);
    r->b_ids = malloc(sizeof(int32_t) * (size_t)T * (size_t)k);
    r->b_p = malloc(sizeof(float) * (size_t)T * (size_t)k);
    r->b_feat = malloc(sizeof(float) * (size_t)T * (size_t)nf);
    if (!r->grad || !r->b_tok || !r->b_ids || !r->b_p || !r->b_feat) return sd_err(err, errlen, "out of memory");
    if (r->h->hp.type == SD_HEAD_MOA && loop_moa_init(r, err, errlen) < 0) return -1;
    if (sd_trainer_new(&r->tr, r->h, r->m, T, P->ttt_steps, r->pool, err, errlen) < 0) return -1;
    sd_trainer_set_moa_block(r->tr, P->moa_block_min, P->moa_block_max);
    return 0;
}

// ---------------------------------------------------------------- steps, evaluation, checkpoints
static int n_agree(const loop_run *r) {   // MoA: agreement by draft depth 0..3
    return r->h->hp.type == SD_HEAD_EAGLE3 ? r->P.ttt_steps : r->h->hp.type == SD_HEAD_MOA ? 4 : r->h->hp.n_medusa;
}

static int evaluate(loop_run *r, char *err, size_t errlen) {
    sd_train_stats sum;
    memset(&sum, 0, sizeof sum);
    double loss = 0.0;
    int64_t n = 0, pos = 0;
    sd_trainer_set_moa_sa_full(r->tr, 1.0f, 0);   // (sa_full: measured as inference runs, the whole text)
    for (int64_t i = 0; i < r->n_eval && pos < r->P.eval_tokens; i++) {
        sd_train_seq seq;
        sd_train_stats st;
        if (loop_read(r, &r->eval[i], &seq, err, errlen) < 0) return -1;
        double l = sd_trainer_loss(r->tr, &seq, NULL, &st, err, errlen);
        if (l < 0) return -1;
        loss += l;
        n++;
        pos += seq.T;
        for (int k = 0; k < SD_HEAD_MAX_MEDUSA; k++) sum.n[k] += st.n[k], sum.agree[k] += st.agree[k];
    }
    if (!n) return 0;
    r->prog.eval_loss = loss / (double)n;
    r->prog.eval_tokens = pos;
    for (int k = 0; k < n_agree(r); k++)
        r->prog.eval_agree[k] = sum.n[k] ? (double)sum.agree[k] / (double)sum.n[k] : 0.0;
    report(r, SD_TRAIN_PHASE_EVAL);
    return 0;
}

// One optimiser step over P.batch sequences.
static int train_step(loop_run *r, char *err, size_t errlen) {
    const int B = r->P.batch;
    memset(r->grad, 0, r->h->n_w * sizeof(float));
    sd_train_stats sum;
    memset(&sum, 0, sizeof sum);
    double loss = 0.0;
    // sa_full's curriculum: the share of sequences whose SA sees the whole text
    // rises from 0 to 1 over the first half of the steps (the reference's)
    const int64_t half = SD_MAX(1, r->recipe.n_steps / 2);
    sd_trainer_set_moa_sa_full(r->tr, r->st.step >= half ? 1.0f : (float)r->st.step / (float)half,
                               (uint64_t)r->st.step);
    for (int b = 0; b < B; b++) {
        sd_train_seq seq;
        sd_train_stats st;
        if (loop_read(r, loop_next_chunk(r), &seq, err, errlen) < 0) return -1;
        double l = sd_trainer_loss(r->tr, &seq, r->grad, &st, err, errlen);
        if (l < 0) return -1;
        loss += l;
        r->st.tokens += seq.T;
        for (int k = 0; k < SD_HEAD_MAX_MEDUSA; k++) sum.n[k] += st.n[k], sum.agree[k] += st.agree[k];
    }
    const float inv = 1.0f / (float)B;
    for (size_t i = 0; i < r->h->n_w; i++) r->grad[i] *= inv;
    r->prog.lr = sd_adamw_lr(&r->opt, r->opt.t);
    sd_adamw_step(&r->opt, r->h, r->grad);
    r->st.step++;
    r->prog.loss = loss / B;
    for (int k = 0; k < n_agree(r); k++) r->prog.agree[k] = sum.n[k] ? (double)sum.agree[k] / (double)sum.n[k] : 0.0;
    return 0;
}

static int save_ckpt(loop_run *r, char *err, size_t errlen) {
    r->st.seconds = r->seconds0 + (sd_time_ms() - r->t_train0) / 1000.0;
    return sd_ckpt_save(r->ckpt_path, r->h, &r->opt, &r->recipe, &r->st, err, errlen);
}

// Steps until the last one or a stop. Returns 0, 1 (stopped, checkpoint written) or <0.
static int train_loop(loop_run *r, char *err, size_t errlen) {
    const sd_train_head_params *P = &r->P;
    r->t_train0 = sd_time_ms();
    r->step0 = r->st.step;
    r->tokens0 = r->st.tokens;
    double last_ckpt = r->t_train0;
    r->prog.n_steps = r->recipe.n_steps;
    r->prog.n_agree = n_agree(r);
    while (r->st.step < r->recipe.n_steps) {
        if (train_step(r, err, errlen) < 0) return -1;
        const double now = sd_time_ms(), el = (now - r->t_train0) / 1000.0;
        const int64_t done = r->st.step - r->step0;
        r->prog.step = r->st.step;
        r->prog.tokens = r->st.tokens;
        r->prog.tok_per_s = el > 0 ? (double)(r->st.tokens - r->tokens0) / el : 0.0;
        r->prog.eta_s = el / (double)done * (double)(r->recipe.n_steps - r->st.step);
        report(r, SD_TRAIN_PHASE_STEP);
        if (r->st.step % P->eval_every == 0 && r->st.step < r->recipe.n_steps && evaluate(r, err, errlen) < 0)
            return -1;
        if (P->stop && *P->stop) {
            if (save_ckpt(r, err, errlen) < 0) return -1;
            note(r, "stopped at step %lld: checkpoint %s written (--resume continues)", (long long)r->st.step,
                 r->ckpt_path);
            return 1;
        }
        int due = (P->ckpt_minutes > 0 && now - last_ckpt >= P->ckpt_minutes * 60000.0) ||
                  (P->ckpt_every > 0 && r->st.step % P->ckpt_every == 0);
        if (due && r->st.step < r->recipe.n_steps) {
            char e2[768];
            if (save_ckpt(r, e2, sizeof e2) < 0) note(r, "%s; training goes on", e2);
            else note(r, "checkpoint %s written at step %lld", r->ckpt_path, (long long)r->st.step);
            last_ckpt = sd_time_ms();
        }
    }
    return 0;
}

// ---------------------------------------------------------------- the end
static void write_note(loop_run *r) {
    const sd_train_head_params *P = &r->P;
    char data[300] = "", agree[160] = "", *o = data;
    for (int i = 0; i < P->n_data && o < data + sizeof data - 2; i++) {
        const char *b = strrchr(P->data_paths[i], '/');
        o += snprintf(o, (size_t)(data + sizeof data - o), "%s%s", i ? "," : "", b ? b + 1 : P->data_paths[i]);
    }
    o = agree;
    for (int k = 0; k < n_agree(r); k++)
        o += snprintf(o, (size_t)(agree + sizeof agree - o), "%s%.4f", k ? "," : "", r->prog.eval_agree[k]);
    snprintf(r->h->note, sizeof r->h->note,
             "trained_by=specdec train-head\ncommand=%.360s\ndata=%s\nseed=%llu\ntokens=%lld\nsteps=%lld\n"
             "seq_len=%d\nbatch=%d\nttt_steps=%d\nlr=%g\nthreads=%d\ntime_s=%.0f\nloss=%.4f\neval_loss=%.4f\n"
             "eval_agree=%s\ndraft_vocab=%d\ncoverage=%.4f\n",
             P->recipe ? P->recipe : "", data, (unsigned long long)P->seed, (long long)r->st.tokens,
             (long long)r->st.step, P->seq_len, P->batch, r->h->hp.type == SD_HEAD_EAGLE3 ? P->ttt_steps : 0,
             (double)P->lr, r->st.n_threads, r->st.seconds, r->prog.loss, r->prog.eval_loss, agree,
             r->h->hp.n_draft_vocab, r->coverage);
}

// Final evaluation, checkpoint and head file. 0 or <0.
static int finish(loop_run *r, char *err, size_t errlen) {
    if (r->n_eval && evaluate(r, err, errlen) < 0) return -1;
    char e2[768];
    if (save_ckpt(r, e2, sizeof e2) < 0) note(r, "%s", e2);   // the head below is what matters now
    write_note(r);
    static const int wtype[] = {SD_TYPE_Q8_0, SD_TYPE_F16, SD_TYPE_F32, SD_TYPE_Q5_0};
    if (sd_head_save_for(r->h, r->m, r->P.out_path, wtype[r->P.out_type], err, errlen) < 0) return -1;
    note(r, "wrote %s (%lld steps, %lld tokens, %.0f s of training)", r->P.out_path, (long long)r->st.step,
         (long long)r->st.tokens, r->st.seconds);
    return 0;
}

static void fill_result(const loop_run *r, sd_train_head_result *res, int stopped) {
    memset(res, 0, sizeof *res);
    res->stopped = stopped;
    if (r->cache) {
        res->cache_records = sd_cache_n_records(r->cache);
        res->cache_tokens = sd_cache_n_positions(r->cache);
    }
    res->train_tokens_avail = r->train_pos;
    res->eval_tokens_avail = r->eval_pos;
    res->draft_vocab = r->h ? r->h->hp.n_draft_vocab : 0;
    res->coverage = r->coverage;
    res->step = r->st.step;
    res->n_steps = r->recipe.n_steps;
    res->tokens = r->st.tokens;
    res->loss = r->prog.loss;
    res->n_agree = r->prog.n_agree;
    res->eval_loss = r->prog.eval_loss;
    memcpy(res->eval_agree, r->prog.eval_agree, sizeof res->eval_agree);
    res->eval_tokens = r->prog.eval_tokens;
    res->train_seconds = r->st.seconds;
}

static void run_free(loop_run *r) {
    sd_trainer_free(r->tr);
    if (r->have_opt) sd_adamw_free(&r->opt);
    sd_head_free(r->h);
    sd_cache_close(r->cache);
    sd_threadpool_free(r->pool);
    sd_model_free(r->own_model);
    free(r->train);
    free(r->eval);
    free(r->train_seqs);
    free(r->perm);
    free(r->grad);
    free(r->b_tok);
    free(r->b_ids);
    free(r->b_p);
    free(r->b_feat);
    free(r->b_score);
    free(r->b_pre);
    free(r->note_buf);
    loop_moa_free(r);
    free(r);
}

// Set-up through the cache: 0, 1 (stopped while caching) or <0.
static int prepare(loop_run *r, const sd_train_head_params *p, char *err, size_t errlen) {
    if (resolve(r, p, err, errlen) < 0) return -1;
    if (r->P.model) {
        r->m = r->P.model;
    } else {
        if (sd_model_load(&r->own_model, r->P.model_path, err, errlen) < 0) return -1;
        r->m = r->own_model;
    }
    if (sd_threadpool_new(&r->pool, r->P.n_threads, err, errlen) < 0) return -1;
    sd_head_hp hp;
    if (plan_head(r, &hp, err, errlen) < 0) return -1;
    int b = open_cache(r, &hp, err, errlen);
    if (b != 0 || r->P.cache_only) return b;
    if (loop_split(r, err, errlen) < 0 || make_head(r, &hp, err, errlen) < 0) return -1;
    note(r, "draft vocabulary: %d tokens, covering %.1f%% of the target's argmax on the training split (%lld positions; "
            "%lld held back)",
         r->h->hp.n_draft_vocab, 100.0 * r->coverage, (long long)r->train_pos, (long long)r->eval_pos);
    return plan_training(r, err, errlen);
}

int sd_train_head(const sd_train_head_params *p, sd_train_head_result *res, char *err, size_t errlen) {
    loop_run *r = calloc(1, sizeof *r);
    char *nb = malloc(1024);
    if (!r || !nb) {
        free(r);
        free(nb);
        return sd_err(err, errlen, "out of memory");
    }
    r->note_buf = nb;
    r->t0 = sd_time_ms();
    int rv = prepare(r, p, err, errlen), stopped = rv == 1 ? 2 : 0;
    if (rv == 0 && !r->P.cache_only) {
        rv = train_loop(r, err, errlen);
        if (rv == 1) stopped = 1;
        if (rv == 0) rv = finish(r, err, errlen);
    }
    if (res) fill_result(r, res, stopped);
    run_free(r);
    return rv;
}
