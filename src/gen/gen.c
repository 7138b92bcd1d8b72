// gen.c - a generation driven step by step (include/specdec_spec.h): the
// prompt phase, one speculative step (draft, one target forward, verify,
// commit, tell the drafter) and the end conditions, each in one place.
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "draft/drafter.h"
#include "runtime/race.h"
#include "runtime/session.h"
#include "spec/verify.h"
#include "specdec_spec.h"

struct sd_gen {
    sd_session *s;
    sd_sampler *smp;
    sd_drafter *d;
    const sd_tokenizer *tok;
    int n_ctx, nv, greedy;
    int race;           // sampling with SD_DRAW_RACE: tokens are race draws, verification follows them
    sd_tree_race rk;    // race: this text's key (pos0 set per step, for the drafter)
    int n_batch;        // prompt tokens per forward
    int max_nodes;      // tree nodes per forward, root included
    int n_predict;      // as given (<= 0: until EOG or full context)
    int n_gen_max;      // n_predict, or n_ctx
    int fast_prompt;

    int32_t *seq;       // (seq_cap) prompt then emitted tokens
    int n_seq, seq_cap;
    int32_t *out;       // (max_nodes + 1) tokens of the last step
    int32_t *path;      // (max_nodes) accepted path
    int32_t *path2;     // (max_nodes) scratch of the verifier's row callback
    float *prow;        // (n_vocab) target distribution of one node
    float *qscr;        // (n_vocab) verifier scratch
    uint8_t *want;      // (session n_batch) logits mask
    int32_t *b_tok;     // (session n_batch) tree + auxiliary nodes
    int32_t *b_par;     // (session n_batch)
    int32_t *aux_tok, *aux_par; // (session n_batch) auxiliary nodes
    uint8_t *aux_lg;    // (session n_batch)
    // hidden-state rows for drafters that read them (sd_drafter.n_hidden_layers > 0)
    int n_hid;          // layers per node, 0: none
    size_t hid_row;     // floats per node: n_hid * n_embd
    uint8_t *hid_want;  // (session n_batch) 1 for tree nodes
    float *hid_out;     // (max_nodes, n_hid, n_embd) rows of the tree nodes, by node
    float *hid_path;    // (max_nodes, n_hid, n_embd) rows of the accepted path, in order
    float *hid_prompt;  // (n_batch, n_hid, n_embd) rows of a prompt chunk (drafters with a prompt hook)
    sd_aux_nodes aux;
    sd_tree tree;
    int tree_ok;

    int prompt_given;   // sd_gen_set_prompt (or a prefill) was called
    int n_prompt;       // prompt tokens (seq[0..n_prompt))
    int pf_next;        // prompt tokens the session holds; the next prompt chunk starts here
    int step_chunk;     // the step between begin and end evaluates prompt tokens [pf_next, pf_next + step_chunk)
    int prefilled;      // the whole prompt is evaluated
    int first_pending;  // the first token is still to be sampled from the prompt's logits
    int prompt_row;     // logits row of the last prompt token
    float *first_logits;// (n_vocab) the prompt's last logits, restored with a state saved before the first token
    int finish;         // enum sd_finish
    atomic_int stop;    // sd_gen_stop was called

    // the step between begin and end
    int in_step;        // 1 between begin and end
    int step_n_past;    // session n_past when the step began
    int step_max;       // node limit of the step
    int step_limit;     // sd_gen_set_step_limit: a cap on the nodes of the next steps, 0 = none
    double t_begin, t_drafted;
    double last_accept_ms; // drafter accept time of the previous step
    // the last finished step, for sd_gen_cut
    int last_base;      // rows the plain loop's cache holds before the step's first token
    int last_n_tokens;  // tokens the last step emitted
    int last_first;     // 1: the last step was the first (no forward)

    double t_prefill_end;
    long n_step_tokens; // tokens emitted by steps with a forward
    sd_gen_stats st;
};

sd_gen_params sd_gen_default_params(void) {
    sd_gen_params p;
    p.n_predict = 256;
    p.n_batch = 0;
    p.max_nodes = 16;
    p.fast_prompt = 1;
    p.seed = 0;
    return p;
}

const char *sd_finish_name(int finish) {
    switch (finish) {
    case SD_FINISH_NONE: return "none";
    case SD_FINISH_LENGTH: return "length";
    case SD_FINISH_EOG: return "eog";
    case SD_FINISH_CTX: return "ctx";
    case SD_FINISH_STOPPED: return "stopped";
    default: return "unknown";
    }
}

void sd_gen_free(sd_gen *g) {
    if (!g) return;
    free(g->seq);
    free(g->out);
    free(g->path);
    free(g->path2);
    free(g->prow);
    free(g->qscr);
    free(g->want);
    free(g->b_tok);
    free(g->b_par);
    free(g->aux_tok);
    free(g->aux_par);
    free(g->aux_lg);
    free(g->hid_want);
    free(g->hid_out);
    free(g->hid_path);
    free(g->hid_prompt);
    free(g->first_logits);
    if (g->tree_ok) sd_tree_free(&g->tree);
    free(g);
}

int sd_gen_new(sd_gen **out, sd_session *s, sd_sampler *smp, sd_drafter *d, const sd_gen_params *p,
               char *err, size_t errlen) {
    *out = NULL;
    if (!s || !smp) return sd_err(err, errlen, "generation: a session and a sampler are required");
    sd_gen_params gp = p ? *p : sd_gen_default_params();
    sd_gen *g = calloc(1, sizeof *g);
    if (!g) return sd_err(err, errlen, "generation: out of memory");
    const sd_model *m = sd_session_model(s);
    sd_model_info info;
    sd_model_get_info(m, &info);
    g->s = s;
    g->smp = smp;
    g->d = d;
    g->tok = sd_model_tokenizer(m);
    g->nv = info.n_vocab;
    g->n_ctx = sd_session_n_ctx(s);
    g->greedy = sd_sampler_get_params(smp)->temp <= 0.0f;
    g->race = !g->greedy && sd_sampler_get_params(smp)->draw == SD_DRAW_RACE;
    g->n_batch = gp.n_batch > 0 ? SD_MIN(gp.n_batch, s->n_batch) : s->n_batch;
    g->max_nodes = SD_MIN(gp.max_nodes > 0 ? gp.max_nodes : 16, s->n_batch);
    g->n_predict = gp.n_predict;
    g->n_gen_max = gp.n_predict > 0 ? gp.n_predict : g->n_ctx;
    g->fast_prompt = gp.fast_prompt;
    g->finish = SD_FINISH_NONE;
    g->st.finish = SD_FINISH_NONE;
    atomic_init(&g->stop, 0);

    const size_t nb = (size_t)s->n_batch, mn = (size_t)g->max_nodes;
    g->seq_cap = g->n_ctx + g->max_nodes + 2;
    g->seq = malloc(sizeof(int32_t) * (size_t)g->seq_cap);
    g->out = malloc(sizeof(int32_t) * (mn + 1));
    g->path = malloc(sizeof(int32_t) * mn);
    g->path2 = malloc(sizeof(int32_t) * mn);
    g->prow = malloc(sizeof(float) * (size_t)g->nv);
    g->qscr = malloc(sizeof(float) * (size_t)g->nv);
    g->want = malloc(nb);
    const int use_aux = d && d->vt->aux;
    if (use_aux) {
        g->b_tok = malloc(sizeof(int32_t) * nb);
        g->b_par = malloc(sizeof(int32_t) * nb);
        g->aux_tok = malloc(sizeof(int32_t) * nb);
        g->aux_par = malloc(sizeof(int32_t) * nb);
        g->aux_lg = malloc(nb);
    }
    g->n_hid = d ? d->n_hidden_layers : 0;
    if (g->n_hid < 0 || g->n_hid > SD_MAX_HIDDEN_LAYERS) {
        sd_gen_free(g);
        return sd_err(err, errlen, "generation: drafter '%s' asks for %d hidden layers (0..%d)", d->vt->name,
                      d->n_hidden_layers, SD_MAX_HIDDEN_LAYERS);
    }
    if (g->n_hid > 0) {
        g->hid_row = (size_t)g->n_hid * (size_t)info.n_embd;
        g->hid_want = malloc(nb);
        g->hid_out = malloc(sizeof(float) * g->hid_row * mn);
        g->hid_path = malloc(sizeof(float) * g->hid_row * mn);
        if (d->vt->prompt) g->hid_prompt = malloc(sizeof(float) * g->hid_row * (size_t)g->n_batch);
    }
    g->tree_ok = sd_tree_init(&g->tree, g->max_nodes, g->nv, g->max_nodes) == 0;
    if (!g->seq || !g->out || !g->path || !g->path2 || !g->prow || !g->qscr || !g->want || !g->tree_ok ||
        (use_aux && (!g->b_tok || !g->b_par || !g->aux_tok || !g->aux_par || !g->aux_lg)) ||
        (g->n_hid > 0 && (!g->hid_want || !g->hid_out || !g->hid_path || (d->vt->prompt && !g->hid_prompt)))) {
        sd_gen_free(g);
        return sd_err(err, errlen, "generation: out of memory");
    }
    // The race's noise of this text: the sampler's next text (the first
    // after a reseed is the seed's first), so that a seed gives its text
    // again and successive generations on one sampler draw independently.
    if (g->race) g->rk.key = sd_sampler_next_text(smp);
    if (d) {
        // A fresh stream per generation: draft randomness reused across
        // generations would correlate the drafts with one another, and the
        // output would no longer follow the target's distribution.
        uint64_t seed = gp.seed ? gp.seed : (uint64_t)(sd_sampler_uniform(smp) * 9007199254740992.0);
        seed = sd_rng_derive(seed, 1);
        sd_rng_seed(&d->rng, seed);
    }
    *out = g;
    return 0;
}

// Contract in specdec_spec.h. prompt[0..n_cached) are taken to be the
// session's committed rows (the caller vouches for them: a server slot that
// kept a prompt prefix); they join the generation's text, which the drafter
// sees, without being evaluated again. The rest is evaluated by the next
// steps, a chunk each (prompt_chunk_begin / _end).
int sd_gen_set_prompt(sd_gen *g, const int32_t *prompt, int n, int n_cached, char *err, size_t errlen) {
    if (g->prompt_given) return sd_err(err, errlen, "generation: the prompt was already given");
    if (!prompt || n <= 0) return sd_err(err, errlen, "generation: the prompt is empty");
    const int n_past0 = sd_session_n_past(g->s);
    if (n_cached < 0 || n_cached >= n)
        return sd_err(err, errlen, "generation: %d cached tokens of a %d-token prompt (at least one must be evaluated)",
                      n_cached, n);
    if (n_cached > 0 && n_cached != n_past0)
        return sd_err(err, errlen, "generation: %d cached prompt tokens but the session holds %d", n_cached, n_past0);
    if (n_past0 - n_cached + n > g->n_ctx)
        return sd_err(err, errlen, "prompt has %d tokens but the context is %d%s", n + n_past0 - n_cached, g->n_ctx,
                      n_past0 > n_cached ? " (including the tokens already in the cache)" : "");
    memcpy(g->seq, prompt, sizeof(int32_t) * (size_t)n);
    g->n_seq = g->n_prompt = n;
    g->pf_next = n_cached;
    g->prompt_given = 1;
    g->st.n_prompt_tokens = n - n_cached;
    g->st.prompt_ms = 0;
    return 0;
}

int sd_gen_prompt_left(const sd_gen *g) { return g->prompt_given ? g->n_prompt - g->pf_next : 0; }

// A step over the next prompt chunk: at most n_batch tokens (and the step
// limit), logits for the prompt's last token only, the drafter's hidden rows
// when it reads them.
static void prompt_chunk_begin(sd_gen *g, sd_batch *b) {
    int nb = SD_MIN(g->n_batch, g->n_prompt - g->pf_next);
    if (g->step_limit > 0) nb = SD_MIN(nb, g->step_limit);
    memset(g->want, 0, (size_t)nb);
    if (g->pf_next + nb == g->n_prompt) g->want[nb - 1] = 1;
    *b = (sd_batch){.n = nb, .tokens = g->seq + g->pf_next, .logits = g->want, .precise = !g->fast_prompt};
    if (g->hid_prompt) {   // the drafter reads the prompt's hidden rows
        b->hidden_layers = g->d->hidden_layers;
        b->n_hidden_layers = g->n_hid;
        b->hidden_out = g->hid_prompt;
    }
    g->step_chunk = nb;
}

// The chunk's rows committed, told to the drafter; the prompt done when it was its last.
static int prompt_chunk_end(sd_gen *g, char *err, size_t errlen) {
    const int nb = g->step_chunk;
    char ferr[256];
    g->step_chunk = 0;
    if (sd_session_commit(g->s, NULL, 0, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "prompt evaluation failed: %s", ferr);
    if (g->hid_prompt && g->d->vt->prompt(g->d, g->seq, g->pf_next, nb, g->hid_prompt, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "drafter '%s': %s", g->d->vt->name, ferr);
    g->pf_next += nb;
    g->t_prefill_end = sd_time_ms();
    g->st.prompt_ms += g->t_prefill_end - g->t_begin;
    if (g->pf_next == g->n_prompt) {
        g->prompt_row = nb - 1;
        g->prefilled = 1;
        g->first_pending = 1;
    }
    return 0;
}

int sd_gen_prefill_cached(sd_gen *g, const int32_t *prompt, int n, int n_cached, char *err, size_t errlen) {
    if (sd_gen_set_prompt(g, prompt, n, n_cached, err, errlen) < 0) return -1;
    while (g->pf_next < g->n_prompt) {   // the prompt's steps: chunks through begin, forward, end
        sd_step st;
        const int rc = sd_gen_step(g, &st, err, errlen);
        if (rc < 0) return rc;
        if (st.finish != SD_FINISH_NONE) break;   // stopped
    }
    return 0;
}

int sd_gen_prefill(sd_gen *g, const int32_t *prompt, int n, char *err, size_t errlen) {
    return sd_gen_prefill_cached(g, prompt, n, 0, err, errlen);
}

// Appends emitted token t, which the plain loop would emit holding
// n_past_equiv cache rows; sets g->finish when generation ends with it.
static void emit(sd_gen *g, int32_t t, int n_past_equiv) {
    g->seq[g->n_seq++] = t;
    g->st.n_generated++;
    if (sd_token_is_eog(g->tok, t)) g->finish = SD_FINISH_EOG;
    else if (g->st.n_generated >= g->n_gen_max) g->finish = g->n_predict > 0 ? SD_FINISH_LENGTH : SD_FINISH_CTX;
    else if (n_past_equiv >= g->n_ctx) g->finish = SD_FINISH_CTX;
}

static void stats_update_totals(sd_gen *g) {
    sd_gen_stats *st = &g->st;
    st->finish = g->finish;
    st->generate_ms = sd_time_ms() - g->t_prefill_end;
    st->tokens_per_second = st->generate_ms > 0 ? st->n_generated * 1000.0 / st->generate_ms : 0.0;
    st->mean_accepted = st->n_target_forwards ? (double)g->n_step_tokens / st->n_target_forwards : 0.0;
    for (int k = 1; k <= SD_SPEC_MAX_DEPTH; k++)
        st->acceptance_by_depth[k] =
            st->n_depth_proposed[k] ? (double)st->n_depth_accepted[k] / st->n_depth_proposed[k] : 0.0;
}

// The drafter's tree (and auxiliary nodes) for this step, checked.
static int draft_tree(sd_gen *g, int n_past, char *err, size_t errlen) {
    sd_drafter *d = g->d;
    char ferr[256];
    sd_tree_reset(&g->tree, g->seq[g->n_seq - 1]);
    g->aux = (sd_aux_nodes){0, 0, g->aux_tok, g->aux_par, g->aux_lg};
    // A step that drafts nothing (its limit 1) still tells a drafter reading the target's states where the text
    // stands (a propose of one node: the root), so the step's accepted row lands at its position.
    if (!d || g->step_max < 1 || (g->step_max == 1 && d->n_hidden_layers == 0)) return 0;
    g->rk.pos0 = g->n_seq;   // the root's children stand at the text's next position
    sd_draft_ctx dc = {g->seq, g->n_seq, g->step_max, !g->greedy, sd_sampler_get_params(g->smp), &d->rng,
                       g->race ? &g->rk : NULL, g->s};
    if (d->vt->propose(d, &dc, &g->tree, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "drafter '%s' failed: %s", d->vt->name, ferr);
    if (g->tree.n > g->step_max || g->tree.n < 1 || g->tree.token[0] != g->seq[g->n_seq - 1])
        return sd_err(err, errlen, "drafter '%s' broke the tree contract (%d nodes, limit %d)", d->vt->name,
                      g->tree.n, g->step_max);
    if (!d->vt->aux) return 0;
    // Auxiliary nodes go after the tree in the same batch; they need batch
    // room and context room for their rows.
    g->aux.cap = SD_MIN(g->s->n_batch, g->n_ctx - n_past) - g->tree.n;
    if (g->aux.cap > 0 && d->vt->aux(d, &dc, &g->tree, &g->aux, ferr, sizeof ferr) < 0)
        return sd_err(err, errlen, "drafter '%s' failed: %s", d->vt->name, ferr);
    if (g->aux.n < 0 || g->aux.n > SD_MAX(g->aux.cap, 0))
        return sd_err(err, errlen, "drafter '%s' added %d auxiliary nodes (limit %d)", d->vt->name, g->aux.n,
                      SD_MAX(g->aux.cap, 0));
    for (int j = 0; j < g->aux.n; j++)
        if (g->aux.parent[j] < 0 || g->aux.parent[j] >= g->tree.n + j || g->aux.token[j] < 0 ||
            g->aux.token[j] >= g->nv)
            return sd_err(err, errlen, "drafter '%s' gave auxiliary node %d parent %d token %d", d->vt->name, j,
                          g->aux.parent[j], g->aux.token[j]);
    return 0;
}

void sd_gen_set_step_limit(sd_gen *g, int max_nodes) { g->step_limit = SD_MAX(0, max_nodes); }

int sd_gen_step_begin(sd_gen *g, sd_batch *b, char *err, size_t errlen) {
    memset(b, 0, sizeof *b);
    if (!g->prompt_given) return sd_err(err, errlen, "generation: no prompt yet (sd_gen_set_prompt, sd_gen_prefill)");
    if (g->in_step) return sd_err(err, errlen, "generation: the previous step was not ended");
    g->in_step = 1;
    g->t_begin = sd_time_ms();
    if (g->finish != SD_FINISH_NONE || g->first_pending || atomic_load(&g->stop)) return 0;
    if (!g->prefilled) {   // the prompt's next chunk: a step like decoding's, through the same phases
        prompt_chunk_begin(g, b);
        return 0;
    }
    const int n_past = sd_session_n_past(g->s);
    g->step_n_past = n_past;
    g->step_max = SD_MIN(g->max_nodes, g->n_ctx - n_past);
    if (g->step_limit > 0) g->step_max = SD_MIN(g->step_max, g->step_limit);
    if (draft_tree(g, n_past, err, errlen) < 0) {
        g->in_step = 0;
        return -1;
    }
    g->t_drafted = sd_time_ms();
    sd_tree *t = &g->tree;
    *b = (sd_batch){.n = t->n, .tokens = t->token, .parent = t->parent};
    if (g->aux.n > 0) {
        memcpy(g->b_tok, t->token, sizeof(int32_t) * (size_t)t->n);
        memcpy(g->b_par, t->parent, sizeof(int32_t) * (size_t)t->n);
        memcpy(g->b_tok + t->n, g->aux.token, sizeof(int32_t) * (size_t)g->aux.n);
        memcpy(g->b_par + t->n, g->aux.parent, sizeof(int32_t) * (size_t)g->aux.n);
        memset(g->want, 1, (size_t)t->n);
        for (int j = 0; j < g->aux.n; j++) g->want[t->n + j] = g->aux.logits ? g->aux.logits[j] != 0 : 1;
        b->n = t->n + g->aux.n;
        b->tokens = g->b_tok;
        b->parent = g->b_par;
        b->logits = g->want;
    }
    if (g->n_hid > 0) {   // the drafter reads the hidden rows of the accepted path: ask for the tree's
        memset(g->hid_want, 0, (size_t)b->n);
        memset(g->hid_want, 1, (size_t)t->n);
        b->hidden_layers = g->d->hidden_layers;
        b->n_hidden_layers = g->n_hid;
        b->hidden = g->hid_want;
        b->hidden_out = g->hid_out;
    }
    return 0;
}

// Text up to and including tree node i (for the repetition penalty): the
// path below the root, written after the generation's text; its length.
static int node_hist(sd_gen *g, int i) {
    int np = sd_tree_path(&g->tree, i, g->path2);
    for (int k = 1; k < np; k++) g->seq[g->n_seq + k - 1] = g->tree.token[g->path2[k]];
    return g->n_seq + np - 1;
}

static float *target_row(void *st, int node) {
    sd_gen *g = st;
    const float *lg = sd_session_logits(g->s, node);
    if (!lg) return NULL;
    sd_sampler_probs(g->smp, lg, g->seq, node_hist(g, node), g->prow);
    return g->prow;
}

// The target's greedy choice after node i; -1 if the node has no logits.
static int32_t target_next(void *st, int node) {
    sd_gen *g = st;
    const float *lg = sd_session_logits(g->s, node);
    if (!lg) return -1;
    return sd_sampler_sample(g->smp, lg, g->seq, node_hist(g, node));
}

// The target's race draw after node i (the token at position n_seq + depth
// of i); -1 if the node has no logits.
static int32_t target_draw(void *st, int node) {
    sd_gen *g = st;
    const float *lg = sd_session_logits(g->s, node);
    if (!lg) return -1;
    const int n = node_hist(g, node);
    return sd_sampler_race_sample(g->smp, lg, g->seq, n, g->rk.key, n);
}

static double target_uniform(void *st) { return sd_sampler_uniform((sd_sampler *)st); }

static const float *batch_logits(void *st, int i) { return sd_session_logits((const sd_session *)st, i); }

// The first token, sampled from the prompt's logits (no forward).
static int step_first(sd_gen *g, sd_step *st, char *err, size_t errlen) {
    const float *lg = g->first_logits ? g->first_logits : sd_session_logits(g->s, g->prompt_row);
    if (!lg) return sd_err(err, errlen, "generation: the prompt's logits are gone (a forward ran in between)");
    g->first_pending = 0;
    g->last_first = 1;
    g->last_base = sd_session_n_past(g->s);
    int32_t t = g->race ? sd_sampler_race_sample(g->smp, lg, g->seq, g->n_seq, g->rk.key, g->n_seq)
                        : sd_sampler_sample(g->smp, lg, g->seq, g->n_seq);
    emit(g, t, sd_session_n_past(g->s));
    g->out[0] = g->seq[g->n_seq - 1];
    st->n_tokens = 1;
    return 0;
}

// Verifies the evaluated tree, commits the accepted rows, tells the drafter
// and emits the tokens.
static int step_verify(sd_gen *g, sd_step *st, char *err, size_t errlen) {
    char ferr[256];
    sd_tree *t = &g->tree;
    sd_drafter *d = g->d;
    const int n_past = g->step_n_past;
    int n_path = 0;
    int32_t bonus = -1;
    if (g->greedy) {
        if (sd_verify_greedy_fn(t, target_next, g, g->path, &n_path, &bonus) < 0)
            return sd_err(err, errlen, "a tree node has no target logits");
    } else if (g->race) {
        if (sd_verify_race(t, target_draw, g, g->path, &n_path, &bonus) < 0)
            return sd_err(err, errlen, "a tree node has no target logits");
    } else if (sd_verify_stochastic(t, target_row, g, target_uniform, g->smp, g->qscr, g->path, &n_path, &bonus, ferr,
                                    sizeof ferr) < 0) {
        return sd_err(err, errlen, "%s", ferr);
    }
    if (sd_session_commit(g->s, g->path, n_path, ferr, sizeof ferr) < 0) return sd_err(err, errlen, "%s", ferr);
    double tc = sd_time_ms();
    st->draft_ms = g->t_drafted - g->t_begin;
    st->verify_ms = tc - g->t_drafted;
    if (d) {
        for (int k = 0; g->n_hid > 0 && k < n_path; k++)   // tree nodes come first among the wanted rows
            memcpy(g->hid_path + (size_t)k * g->hid_row, g->hid_out + (size_t)g->path[k] * g->hid_row,
                   sizeof(float) * g->hid_row);
        sd_step_record rec = {.tree = t, .path = g->path, .n_path = n_path, .bonus = bonus, .aux = &g->aux,
                              .draft_ms = st->draft_ms, .verify_ms = st->verify_ms, .logits = batch_logits,
                              .lstate = g->s, .hidden = g->n_hid > 0 ? g->hid_path : NULL};
        if (d->vt->accept(d, &rec, ferr, sizeof ferr) < 0)
            return sd_err(err, errlen, "drafter '%s' failed: %s", d->vt->name, ferr);
    }
    double ta = sd_time_ms() - tc;
    st->draft_ms += ta;

    sd_gen_stats *gs = &g->st;
    int depth = sd_tree_max_depth(t);
    gs->n_target_forwards++;
    gs->n_aux_nodes += g->aux.n;
    gs->n_draft_nodes += t->n - 1;
    gs->n_draft_accepted += n_path - 1;
    gs->max_depth = SD_MAX(gs->max_depth, depth);
    gs->draft_ms += st->draft_ms;
    gs->verify_ms += st->verify_ms;
    for (int k = 1; k <= depth && k <= SD_SPEC_MAX_DEPTH; k++) {
        gs->n_depth_proposed[k]++;
        if (k < n_path) gs->n_depth_accepted[k]++;
    }
    st->n_drafted = t->n - 1;
    st->n_accepted = n_path - 1;
    st->n_aux = g->aux.n;
    // Emit the accepted drafts, then the bonus, as the plain loop would: its
    // cache would hold n_past + k rows at the k-th token.
    g->last_first = 0;
    g->last_base = n_past;
    for (int k = 1; k <= n_path && g->finish == SD_FINISH_NONE; k++) {
        int32_t tk = k < n_path ? t->token[g->path[k]] : bonus;
        g->out[st->n_tokens++] = tk;
        g->n_step_tokens++;
        emit(g, tk, n_past + k);
        if (g->finish != SD_FINISH_NONE && k < n_path &&
            sd_session_truncate(g->s, n_past + k, ferr, sizeof ferr) < 0)   // ended inside the path
            return sd_err(err, errlen, "%s", ferr);
    }
    return 0;
}

int sd_gen_step_end(sd_gen *g, sd_step *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    st->tokens = g->out;
    st->finish = g->finish;
    if (!g->in_step) return sd_err(err, errlen, "generation: sd_gen_step_end without sd_gen_step_begin");
    g->in_step = 0;
    g->last_n_tokens = 0;
    if (g->step_chunk > 0) {   // a prompt chunk: its rows committed (the first token comes with the next step)
        int rc = prompt_chunk_end(g, err, errlen);
        if (rc == 0 && atomic_load(&g->stop)) g->finish = SD_FINISH_STOPPED;
        st->finish = g->finish;
        return rc;
    }
    if (g->finish != SD_FINISH_NONE) return 0;
    int rc;
    if (atomic_load(&g->stop)) {
        g->finish = SD_FINISH_STOPPED;
        rc = 0;
    } else if (g->first_pending) {
        rc = step_first(g, st, err, errlen);
    } else {
        rc = step_verify(g, st, err, errlen);
    }
    g->last_n_tokens = st->n_tokens;
    st->finish = g->finish;
    stats_update_totals(g);
    return rc;
}

int sd_gen_step(sd_gen *g, sd_step *st, char *err, size_t errlen) {
    sd_batch b;
    if (sd_gen_step_begin(g, &b, err, errlen) < 0) {
        memset(st, 0, sizeof *st);
        return -1;
    }
    if (b.n > 0) {
        char ferr[256];
        const int fr = sd_session_forward(g->s, &b, ferr, sizeof ferr);
        if (fr < 0) {   // its code kept (no room, busy, ...)
            if (g->step_chunk > 0)
                sd_err(err, errlen, "prompt evaluation failed: %s", ferr);
            else
                sd_err(err, errlen, "target forward failed after %d tokens: %s", g->st.n_generated, ferr);
            g->in_step = 0;
            g->step_chunk = 0;
            memset(st, 0, sizeof *st);
            return fr;
        }
    }
    return sd_gen_step_end(g, st, err, errlen);
}

void sd_gen_stop(sd_gen *g) { atomic_store(&g->stop, 1); }

int sd_gen_cut(sd_gen *g, int n_keep, char *err, size_t errlen) {
    if (g->in_step) return sd_err(err, errlen, "generation: cut inside a step");
    if (n_keep < 0 || n_keep > g->last_n_tokens)
        return sd_err(err, errlen, "generation: cut keeps %d tokens of a step that emitted %d", n_keep,
                      g->last_n_tokens);
    int drop = g->last_n_tokens - n_keep;
    if (drop == 0 && g->finish != SD_FINISH_NONE) return 0;   // ends where it ended anyway
    g->n_seq -= drop;
    g->st.n_generated -= drop;
    if (!g->last_first) g->n_step_tokens -= drop;
    g->last_n_tokens = n_keep;
    // The plain loop's cache after the n_keep-th token of the step.
    int rows = g->last_first ? g->last_base : g->last_base + n_keep;
    if (rows < sd_session_n_past(g->s) && sd_session_truncate(g->s, rows, err, errlen) < 0) return -1;
    g->finish = SD_FINISH_STOPPED;
    stats_update_totals(g);
    return 0;
}

const int32_t *sd_gen_tokens(const sd_gen *g, int *n) {
    if (n) *n = g->n_seq;
    return g->seq;
}

const sd_gen_stats *sd_gen_get_stats(const sd_gen *g) { return &g->st; }

int sd_gen_finished(const sd_gen *g) { return g->finish; }

int sd_generate(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                const sd_gen_params *p, sd_token_cb cb, void *user, sd_gen_stats *stats, char *err,
                size_t errlen) {
    sd_gen *g;
    if (stats) memset(stats, 0, sizeof *stats);
    if (sd_gen_new(&g, s, smp, d, p, err, errlen) < 0) return -1;
    int rc = sd_gen_prefill(g, prompt, n_prompt, err, errlen);
    sd_step st;
    while (rc == 0 && sd_gen_finished(g) == SD_FINISH_NONE) {
        rc = sd_gen_step(g, &st, err, errlen);
        for (int k = 0; rc == 0 && k < st.n_tokens; k++)
            if (cb && cb(st.tokens[k], user)) {
                rc = sd_gen_cut(g, k + 1, err, errlen);
                break;
            }
    }
    if (stats) *stats = *sd_gen_get_stats(g);
    sd_gen_free(g);
    return rc;
}

// ---------------------------------------------------------------- state
// Layout (little endian, 8-byte fields): magic "SDGS", version; n_seq,
// n_prompt, pf_next, finish, first_pending, n_vocab; n_generated, the race
// key, the session state's bytes; the text (n_seq int32, padded to 8); with
// first_pending the prompt's last logits (n_vocab floats, padded); then the
// session's state (sd_session_state_save).
#define GS_MAGIC 0x53474453u   // "SDGS"
#define GS_VERSION 1u
#define GS_HEADER 64u

static size_t gs_pad8(size_t n) { return (n + 7) & ~(size_t)7; }

size_t sd_gen_state_size(const sd_gen *g) {
    return GS_HEADER + gs_pad8(sizeof(int32_t) * (size_t)g->n_seq) +
           (g->first_pending ? gs_pad8(sizeof(float) * (size_t)g->nv) : 0) + sd_session_state_size(g->s);
}

int sd_gen_state_save(const sd_gen *g, void *buf, size_t size, char *err, size_t errlen) {
    if (!g->prompt_given) return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: no prompt given yet");
    if (g->in_step) return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: saved inside a step (between begin and end)");
    const size_t need = sd_gen_state_size(g), sess = sd_session_state_size(g->s);
    if (!buf || size < need)
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: the buffer holds %zu bytes, the state needs %zu", size,
                       need);
    const float *lg = NULL;
    if (g->first_pending) {
        lg = g->first_logits ? g->first_logits : sd_session_logits(g->s, g->prompt_row);
        if (!lg) return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: the prompt's logits are gone");
    }
    uint8_t *o = buf;
    memset(o, 0, GS_HEADER);
    const uint32_t h[8] = {GS_MAGIC, GS_VERSION, (uint32_t)g->n_seq, (uint32_t)g->n_prompt, (uint32_t)g->pf_next,
                           (uint32_t)(g->finish + 1), (uint32_t)g->first_pending, (uint32_t)g->nv};
    const uint64_t q[3] = {(uint64_t)g->st.n_generated, g->rk.key, (uint64_t)sess};
    memcpy(o, h, sizeof h);
    memcpy(o + sizeof h, q, sizeof q);
    o += GS_HEADER;
    memcpy(o, g->seq, sizeof(int32_t) * (size_t)g->n_seq);
    o += gs_pad8(sizeof(int32_t) * (size_t)g->n_seq);
    if (lg) {
        memcpy(o, lg, sizeof(float) * (size_t)g->nv);
        o += gs_pad8(sizeof(float) * (size_t)g->nv);
    }
    int rc = sd_session_state_save(g->s, o, sess, err, errlen);
    return rc < 0 ? rc : (int)SD_MIN(need, (size_t)INT32_MAX);
}

int sd_gen_state_load(sd_gen *g, const void *buf, size_t size, char *err, size_t errlen) {
    if (g->prompt_given)
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: load it into a fresh generation (sd_gen_new, no prompt)");
    const uint8_t *in = buf;
    uint32_t h[8];
    uint64_t q[3];
    if (!buf || size < GS_HEADER)
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: %zu bytes is too short for a state", size);
    memcpy(h, in, sizeof h);
    memcpy(q, in + sizeof h, sizeof q);
    if (h[0] != GS_MAGIC) return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: not a generation state (bad magic)");
    if (h[1] != GS_VERSION)
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: version %u, this build reads version %u", h[1],
                       GS_VERSION);
    const int n_seq = (int)h[2], n_prompt = (int)h[3], pf_next = (int)h[4], finish = (int)h[5] - 1, first = (int)h[6];
    if (h[7] != (uint32_t)g->nv)
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: saved with a vocabulary of %u, this model's is %d",
                       h[7], g->nv);
    if (n_prompt < 1 || n_seq < n_prompt || pf_next < 0 || pf_next > n_prompt || finish < SD_FINISH_NONE ||
        finish > SD_FINISH_STOPPED || first > 1 || (first && pf_next != n_prompt) || (pf_next < n_prompt && n_seq != n_prompt))
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: corrupt header");
    if (n_seq > g->seq_cap - g->max_nodes - 1)
        return sd_errc(SD_ERR_NO_ROOM, err, errlen, "generation state: %d tokens of text, but this generation's context "
                       "is %d", n_seq, g->n_ctx);
    const size_t text = gs_pad8(sizeof(int32_t) * (size_t)n_seq), lgs = first ? gs_pad8(sizeof(float) * (size_t)g->nv) : 0;
    if (size != GS_HEADER + text + lgs + q[2])
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: %zu bytes where the header says %zu (truncated or "
                       "corrupt)", size, (size_t)(GS_HEADER + text + lgs + q[2]));
    for (int i = 0; i < n_seq; i++) {
        int32_t t;
        memcpy(&t, in + GS_HEADER + sizeof t * (size_t)i, sizeof t);
        if (t < 0 || t >= g->nv) return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: token %d out of range", t);
    }
    if (first && !g->first_logits && !(g->first_logits = malloc(sizeof(float) * (size_t)g->nv)))
        return sd_errc(SD_ERR_OOM, err, errlen, "generation state: out of memory");
    int rc = sd_session_state_load(g->s, in + GS_HEADER + text + lgs, (size_t)q[2], err, errlen);
    if (rc < 0) return rc;
    // the session's rows: the prompt's evaluated part, or the text but its last token (the next root)
    const int want_rows = pf_next < n_prompt || first ? pf_next : n_seq - 1;
    if (sd_session_n_past(g->s) != want_rows && finish == SD_FINISH_NONE) {
        sd_session_truncate(g->s, 0, NULL, 0);
        return sd_errc(SD_ERR_INPUT, err, errlen, "generation state: the session holds %d rows where the text needs %d",
                       sd_session_n_past(g->s), want_rows);
    }
    memcpy(g->seq, in + GS_HEADER, sizeof(int32_t) * (size_t)n_seq);
    if (first) memcpy(g->first_logits, in + GS_HEADER + text, sizeof(float) * (size_t)g->nv);
    g->n_seq = n_seq;
    g->n_prompt = n_prompt;
    g->pf_next = pf_next;
    g->prompt_given = 1;
    g->prefilled = pf_next == n_prompt;
    g->first_pending = first;
    g->finish = finish;
    g->st.finish = finish;
    g->st.n_generated = (int)q[0];
    g->st.n_prompt_tokens = n_prompt;
    g->rk.key = q[1];
    g->t_prefill_end = sd_time_ms();
    if (g->d) sd_drafter_reset(g->d);   // it re-learns the text as it drafts (its state is not part of this)
    return 0;
}
