// spec.c - the speculative generation loop.
#include "spec/spec.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime/session.h"
#include "spec/verify.h"

sd_spec_params sd_spec_default_params(void) {
    sd_spec_params p;
    p.n_predict = 256;
    p.n_batch = 0;
    p.max_nodes = 16;
    p.fast_prompt = 0;
    return p;
}

// State the target-distribution callback of the verifier needs.
typedef struct spec_rows {
    sd_session *s;
    sd_sampler *smp;
    const sd_tree *tree;
    int32_t *seq;     // (n_seq + depth) committed text, then scratch for a node's path
    int n_seq;
    int32_t *path;    // (max_nodes) scratch
    float *prow;      // (n_vocab) the one row in use: the verifier walks down and never returns
} spec_rows;

// Text up to and including tree node i (for the repetition penalty): writes
// the path below the root after the committed text; returns its length.
static int node_hist(spec_rows *r, int i) {
    int np = sd_tree_path(r->tree, i, r->path);
    for (int k = 1; k < np; k++) r->seq[r->n_seq + k - 1] = r->tree->token[r->path[k]];
    return r->n_seq + np - 1;
}

static float *spec_target_row(void *st, int node) {
    spec_rows *r = st;
    const float *lg = sd_session_logits(r->s, node);
    if (!lg) return NULL;
    int nh = node_hist(r, node);
    sd_sampler_probs(r->smp, lg, r->seq, nh, r->prow);
    return r->prow;
}

// The target's greedy choice after node i (sd_verify_greedy_fn asks only for
// the nodes on its walk). -1 if the node has no logits.
static int32_t spec_target_next(void *st, int node) {
    spec_rows *r = st;
    const float *lg = sd_session_logits(r->s, node);
    if (!lg) return -1;
    return sd_sampler_sample(r->smp, lg, r->seq, node_hist(r, node));
}

static double spec_uniform(void *st) { return sd_sampler_uniform((sd_sampler *)st); }

// Logits of batch node i of the last target forward, for drafter observe().
static const float *spec_batch_logits(void *st, int i) { return sd_session_logits((const sd_session *)st, i); }

int sd_spec_generate(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                     const sd_spec_params *p, sd_token_cb cb, void *user, sd_spec_stats *out, char *err,
                     size_t errlen) {
    sd_spec_params sp = p ? *p : sd_spec_default_params();
    sd_spec_stats st;
    memset(&st, 0, sizeof st);
    if (out) *out = st;
    if (!s || !smp) return sd_err(err, errlen, "speculative: session and sampler are required");
    if (!prompt || n_prompt <= 0) return sd_err(err, errlen, "speculative: the prompt is empty");
    const int n_ctx = sd_session_n_ctx(s);
    const int n_past0 = sd_session_n_past(s);
    if (n_past0 + n_prompt > n_ctx)
        return sd_err(err, errlen, "prompt has %d tokens but the context is %d%s", n_prompt, n_ctx,
                      n_past0 ? " (including the tokens already in the cache)" : "");
    const sd_model *m = sd_session_model(s);
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    sd_model_info info;
    sd_model_get_info(m, &info);
    const int nv = info.n_vocab;
    const int n_batch = sp.n_batch > 0 ? sp.n_batch : 512;
    const int n_gen_max = sp.n_predict > 0 ? sp.n_predict : n_ctx;
    int max_nodes = sp.max_nodes > 0 ? sp.max_nodes : 16;
    max_nodes = SD_MIN(max_nodes, s->n_batch);
    const sd_sampler_params *smp_p = sd_sampler_get_params(smp);
    const int greedy = smp_p->temp <= 0.0f;

    // Everything the loop needs, allocated once.
    size_t n_seq_max = (size_t)n_prompt + (size_t)n_gen_max + (size_t)max_nodes + 2;
    int32_t *seq = malloc(n_seq_max * sizeof(int32_t));
    int32_t *path = malloc(sizeof(int32_t) * (size_t)max_nodes);
    int32_t *path2 = malloc(sizeof(int32_t) * (size_t)max_nodes);
    float *prow = malloc(sizeof(float) * (size_t)nv);
    float *qscr = malloc(sizeof(float) * (size_t)nv);
    uint8_t *want = malloc((size_t)SD_MAX(n_batch, s->n_batch));
    // Auxiliary nodes (drafters with aux_vt) and the batch that holds
    // the tree followed by them.
    const int use_aux = d && d->aux_vt && d->aux_vt->aux;
    const size_t nb_s = (size_t)s->n_batch;
    int32_t *aux_tok = use_aux ? malloc(sizeof(int32_t) * nb_s) : NULL;
    int32_t *aux_par = use_aux ? malloc(sizeof(int32_t) * nb_s) : NULL;
    uint8_t *aux_lg = use_aux ? malloc(nb_s) : NULL;
    int32_t *b_tok = use_aux ? malloc(sizeof(int32_t) * nb_s) : NULL;
    int32_t *b_par = use_aux ? malloc(sizeof(int32_t) * nb_s) : NULL;
    sd_tree tree;
    int tree_ok = sd_tree_init(&tree, max_nodes, nv, max_nodes) == 0;
    int rc = 0;
    char ferr[256];
    double t1 = sd_time_ms();
    if (!seq || !path || !path2 || !prow || !qscr || !want || !tree_ok ||
        (use_aux && (!aux_tok || !aux_par || !aux_lg || !b_tok || !b_par))) {
        rc = sd_err(err, errlen, "speculative: out of memory");
        goto done;
    }
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n_seq = n_prompt;

    // Prompt, in chunks; logits only for the very last prompt token.
    double t0 = sd_time_ms();
    const float *logits = NULL;
    for (int i = 0; i < n_prompt; i += n_batch) {
        int n = SD_MIN(n_batch, n_prompt - i);
        memset(want, 0, (size_t)n);
        if (i + n == n_prompt) want[n - 1] = 1;
        // (the same prompt numerics as sd_generate: the cache the speculative
        // loop starts from equals plain decoding's)
        sd_batch b = {.n = n, .tokens = prompt + i, .parent = NULL, .pos = NULL, .logits = want,
                      .precise = !sp.fast_prompt};
        if (sd_session_forward(s, &b, ferr, sizeof ferr) < 0 || sd_session_commit(s, NULL, 0, ferr, sizeof ferr) < 0) {
            rc = sd_err(err, errlen, "speculative: prompt evaluation failed: %s", ferr);
            goto done;
        }
        if (i + n == n_prompt) logits = sd_session_logits(s, n - 1);
    }
    t1 = sd_time_ms();
    st.gen.n_prompt_tokens = n_prompt;
    st.gen.prompt_ms = t1 - t0;
    if (!logits) {
        rc = sd_err(err, errlen, "speculative: the forward pass returned no logits");
        goto done;
    }

    // Reports token t, emitted when the plain loop's cache would hold
    // n_past_equiv rows; 1 when generation ends.
#define EMIT(t, n_past_equiv, ended)                                                           \
    do {                                                                                       \
        int32_t t_ = (t);                                                                      \
        seq[n_seq++] = t_;                                                                     \
        st.gen.n_generated++;                                                                  \
        int stop_ = cb ? cb(t_, user) : 0;                                                     \
        (ended) = 1;                                                                           \
        if (sd_token_is_eog(tok, t_)) st.gen.finish = SD_FINISH_EOG;                           \
        else if (stop_) st.gen.finish = SD_FINISH_STOPPED;                                     \
        else if (st.gen.n_generated >= n_gen_max)                                              \
            st.gen.finish = sp.n_predict > 0 ? SD_FINISH_LENGTH : SD_FINISH_CTX;               \
        else if ((n_past_equiv) >= n_ctx) st.gen.finish = SD_FINISH_CTX;                       \
        else (ended) = 0;                                                                      \
    } while (0)

    int ended = 0;
    EMIT(sd_sampler_sample(smp, logits, seq, n_seq), sd_session_n_past(s), ended);
    long n_step_tokens = 0;
    while (!ended) {
        const int n_past = sd_session_n_past(s);
        const int step_max = SD_MIN(max_nodes, n_ctx - n_past);
        sd_tree_reset(&tree, seq[n_seq - 1]);
        double ta = sd_time_ms();
        if (d && step_max > 1) {
            sd_draft_ctx dc = {seq, n_seq, step_max, !greedy, smp_p, smp};
            if (d->vt->propose(d, &dc, &tree, ferr, sizeof ferr) < 0) {
                rc = sd_err(err, errlen, "speculative: drafter '%s' failed: %s", d->vt->name, ferr);
                goto done;
            }
            if (tree.n > step_max || tree.token[0] != seq[n_seq - 1]) {
                rc = sd_err(err, errlen, "speculative: drafter '%s' broke the tree contract (%d nodes, limit %d)",
                            d->vt->name, tree.n, step_max);
                goto done;
            }
        }
        // Auxiliary nodes go after the tree in the same batch (never verified
        // nor committed); they need batch room and context room for their rows.
        sd_aux_nodes aux = {0, 0, aux_tok, aux_par, aux_lg};
        if (use_aux) {
            aux.cap = SD_MIN(s->n_batch, n_ctx - n_past) - tree.n;
            if (aux.cap > 0) {
                sd_draft_ctx dc = {seq, n_seq, step_max, !greedy, smp_p, smp};
                if (d->aux_vt->aux(d, &dc, &tree, &aux, ferr, sizeof ferr) < 0) {
                    rc = sd_err(err, errlen, "speculative: drafter '%s' failed: %s", d->vt->name, ferr);
                    goto done;
                }
            }
            if (aux.n < 0 || aux.n > SD_MAX(aux.cap, 0)) {
                rc = sd_err(err, errlen, "speculative: drafter '%s' added %d auxiliary nodes (limit %d)", d->vt->name,
                            aux.n, SD_MAX(aux.cap, 0));
                goto done;
            }
            for (int j = 0; j < aux.n; j++) {
                if (aux.parent[j] < 0 || aux.parent[j] >= tree.n + j || aux.token[j] < 0 || aux.token[j] >= nv) {
                    rc = sd_err(err, errlen, "speculative: drafter '%s' gave auxiliary node %d parent %d token %d",
                                d->vt->name, j, aux.parent[j], aux.token[j]);
                    goto done;
                }
            }
        }
        double tb = sd_time_ms();
        st.draft_ms += tb - ta;

        sd_batch b = {.n = tree.n, .tokens = tree.token, .parent = tree.parent, .pos = NULL, .logits = NULL};
        if (aux.n > 0) {
            memcpy(b_tok, tree.token, sizeof(int32_t) * (size_t)tree.n);
            memcpy(b_par, tree.parent, sizeof(int32_t) * (size_t)tree.n);
            memcpy(b_tok + tree.n, aux.token, sizeof(int32_t) * (size_t)aux.n);
            memcpy(b_par + tree.n, aux.parent, sizeof(int32_t) * (size_t)aux.n);
            memset(want, 1, (size_t)tree.n);
            for (int j = 0; j < aux.n; j++) want[tree.n + j] = aux.logits ? aux.logits[j] != 0 : 1;
            b.n = tree.n + aux.n;
            b.tokens = b_tok;
            b.parent = b_par;
            b.logits = want;
        }
        if (sd_session_forward(s, &b, ferr, sizeof ferr) < 0) {
            rc = sd_err(err, errlen, "speculative: target forward failed after %d tokens: %s", st.gen.n_generated,
                        ferr);
            goto done;
        }
        st.n_target_forwards++;
        st.n_aux_nodes += aux.n;
        if (d && d->aux_vt && d->aux_vt->observe) {
            double to = sd_time_ms();
            if (d->aux_vt->observe(d, &tree, &aux, spec_batch_logits, s, ferr, sizeof ferr) < 0) {
                rc = sd_err(err, errlen, "speculative: drafter '%s' failed: %s", d->vt->name, ferr);
                goto done;
            }
            double dt = sd_time_ms() - to;
            st.draft_ms += dt;
            tb += dt;   // keep verify_ms for the forward and the verification
        }
        spec_rows rows = {s, smp, &tree, seq, n_seq, path2, prow};
        int n_path = 0;
        int32_t bonus = -1;
        if (greedy) {
            if (sd_verify_greedy_fn(&tree, spec_target_next, &rows, path, &n_path, &bonus) < 0) {
                rc = sd_err(err, errlen, "speculative: a tree node has no target logits");
                goto done;
            }
        } else if (sd_verify_stochastic(&tree, spec_target_row, &rows, spec_uniform, smp, qscr, path, &n_path, &bonus,
                                        ferr, sizeof ferr) < 0) {
            rc = sd_err(err, errlen, "speculative: %s", ferr);
            goto done;
        }
        if (sd_session_commit(s, path, n_path, ferr, sizeof ferr) < 0) {
            rc = sd_err(err, errlen, "speculative: %s", ferr);
            goto done;
        }
        double tc = sd_time_ms();
        st.verify_ms += tc - tb;
        if (d && d->vt->accept(d, &tree, path, n_path, bonus, ferr, sizeof ferr) < 0) {
            rc = sd_err(err, errlen, "speculative: drafter '%s' failed: %s", d->vt->name, ferr);
            goto done;
        }
        st.draft_ms += sd_time_ms() - tc;

        // Statistics.
        int depth = sd_tree_max_depth(&tree);
        st.n_draft_nodes += tree.n - 1;
        st.n_draft_accepted += n_path - 1;
        st.max_depth = SD_MAX(st.max_depth, depth);
        for (int k = 1; k <= depth && k <= SD_SPEC_MAX_DEPTH; k++) {
            st.n_depth_proposed[k]++;
            if (k < n_path) st.n_depth_accepted[k]++;
        }

        // Report the accepted drafts, then the bonus, exactly as the plain
        // loop would: its cache would hold n_past + k rows at the k-th token.
        for (int k = 1; k <= n_path && !ended; k++) {
            int32_t t = k < n_path ? tree.token[path[k]] : bonus;
            n_step_tokens++;
            EMIT(t, n_past + k, ended);
            if (ended && k < n_path) {
                // Stopped inside the path: keep the cache as plain decoding would have it.
                if (sd_session_truncate(s, n_past + k, ferr, sizeof ferr) < 0) {
                    rc = sd_err(err, errlen, "speculative: %s", ferr);
                    goto done;
                }
            }
        }
    }
#undef EMIT
    st.gen.generate_ms = sd_time_ms() - t1;
    st.gen.tokens_per_second = st.gen.generate_ms > 0 ? st.gen.n_generated * 1000.0 / st.gen.generate_ms : 0.0;
    st.mean_accepted = st.n_target_forwards ? (double)n_step_tokens / st.n_target_forwards : 0.0;
    for (int k = 1; k <= SD_SPEC_MAX_DEPTH; k++)
        st.acceptance_by_depth[k] =
            st.n_depth_proposed[k] ? (double)st.n_depth_accepted[k] / st.n_depth_proposed[k] : 0.0;

done:
    if (rc < 0 && st.gen.n_prompt_tokens) st.gen.generate_ms = sd_time_ms() - t1;
    free(seq);
    free(path);
    free(path2);
    free(prow);
    free(qscr);
    free(want);
    free(aux_tok);
    free(aux_par);
    free(aux_lg);
    free(b_tok);
    free(b_par);
    if (tree_ok) sd_tree_free(&tree);
    if (out) *out = st;
    return rc;
}
