// own_drafter.c - a drafter written outside the library, through the public
// API only (sd_drafter_from_callbacks): it looks the last two tokens up in
// the text so far and proposes what followed their latest earlier
// occurrence, as a chain of up to 6 tokens. The library verifies its guesses,
// so the text is exactly plain greedy decoding's.
//
//   build/examples/own_drafter MODEL.gguf [PROMPT] [N]
//
// Prints the text, then one line: tokens, target forwards, accepted drafts.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specdec.h"
#include "specdec_spec.h"

typedef struct bigram {
    int accepted, proposed;   // statistics the step callback keeps
} bigram;

static int propose(void *user, const sd_draft_request *req, sd_tree *tree, char *err, size_t errlen) {
    (void)err, (void)errlen;
    bigram *b = user;
    const int32_t *t = req->tokens;
    const int n = req->n_tokens;
    if (n < 3) return 0;
    for (int i = n - 2; i >= 1; i--) {   // the latest earlier a b, followed by something
        if (t[i - 1] != t[n - 2] || t[i] != t[n - 1]) continue;
        int parent = 0;
        for (int k = i + 1; k < n && k <= i + 6; k++) {
            parent = sd_tree_add(tree, parent, t[k], 1.0f);
            if (parent < 0) break;   // the step's room is used up
            b->proposed++;
        }
        break;
    }
    return 0;
}

static int step(void *user, const sd_draft_result *res, char *err, size_t errlen) {
    (void)err, (void)errlen;
    ((bigram *)user)->accepted += res->n_accepted;
    return 0;
}

static int emit(int32_t token, void *user) {
    char piece[256];
    int k = sd_token_to_piece(user, token, 0, piece, sizeof piece);
    if (k > 0) fwrite(piece, 1, (size_t)(k < (int)sizeof piece ? k : (int)sizeof piece), stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT] [N]\n", argv[0]);
        return 1;
    }
    const char *prompt = argc > 2 ? argv[2] : "The cat sat on the mat. The cat sat on the";
    const int n_predict = argc > 3 ? atoi(argv[3]) : 48;
    char err[512];
    sd_model *m = NULL;
    sd_session *s = NULL;
    sd_sampler *smp = NULL;
    sd_drafter *d = NULL;
    bigram b = {0, 0};
    int32_t ids[512];
    int rc = 1;

    if (sd_model_load(&m, argv[1], err, sizeof err) < 0) goto fail;
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    const int n_ids = sd_tokenize(tok, prompt, strlen(prompt), 1, 0, ids, 512);
    if (n_ids < 1 || n_ids > 512) {
        snprintf(err, sizeof err, "cannot tokenize the prompt");
        goto fail;
    }
    sd_session_params sp = sd_session_default_params();
    sd_sampler_params smp_p = sd_sampler_default_params();
    smp_p.temp = 0.0f;   // greedy
    const sd_drafter_callbacks cb = {.name = "bigram", .user = &b, .propose = propose, .step = step};
    if (sd_session_new(&s, m, &sp, err, sizeof err) < 0 ||
        sd_sampler_new(&smp, &smp_p, sd_tokenizer_n_vocab(tok), err, sizeof err) < 0 ||
        sd_drafter_from_callbacks(&d, &cb, err, sizeof err) < 0)
        goto fail;
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n_predict;
    gp.max_nodes = 8;
    sd_gen_stats st;
    if (sd_generate(s, smp, d, ids, n_ids, &gp, emit, (void *)tok, &st, err, sizeof err) < 0) goto fail;
    printf("\n%d tokens, %d target forwards, %d of %d drafts accepted\n", st.n_generated, st.n_target_forwards,
           b.accepted, b.proposed);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "own_drafter: %s\n", err);
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
    return rc;
}
