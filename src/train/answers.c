// answers.c - where the assistant writes in a chat record's tokens (answers.h).
#include <string.h>

#include "common.h"
#include "train/answers.h"

// The template renders one user message and ends with the header a reply
// continues: the header is what follows the last end-of-turn token.
int sd_answers_init(sd_answers *a, const sd_tokenizer *t, char *err, size_t errlen) {
    const char *role = "user", *content = "x", *const ends[2] = {"<|im_end|>", "<|eot_id|>"};
    int32_t ids[256], e[2];
    char e2[256];
    memset(a, 0, sizeof *a);
    int n = sd_chat_tokenize_messages(t, &role, &content, 1, ids, 256, e2, sizeof e2);
    if (n < 0) return sd_err(err, errlen, "--score answers needs the model's chat template: %s", e2);
    n = SD_MIN(n, 256);   // (a longer rendering keeps its first 256 ids; the header then is not found)
    int last = -1;
    for (int k = 0; k < 2 && last < 0; k++)
        if (sd_tokenize(t, ends[k], strlen(ends[k]), 0, 1, e, 2) == 1)
            for (int i = 0; i < n; i++)
                if (ids[i] == e[0]) last = i, a->eot = e[0];
    const int nh = last >= 0 ? n - last - 1 : 0;
    if (nh < 1 || nh > SD_ANS_MAX_HDR)
        return sd_err(err, errlen, "--score answers: cannot find the assistant's header in the model's chat template");
    a->n_hdr = nh;
    memcpy(a->hdr, ids + last + 1, sizeof(int32_t) * (size_t)nh);
    return 0;
}

void sd_answers_feed(const sd_answers *a, sd_answers_state *s, int32_t tok) {
    const int nh = a->n_hdr;
    if (tok == a->eot) s->in = 0, s->chat = 1;
    memmove(s->last, s->last + 1, sizeof(int32_t) * (size_t)(nh - 1));
    s->last[nh - 1] = tok;
    if (++s->n >= nh && !s->in && tok == a->hdr[nh - 1] && !memcmp(s->last, a->hdr, sizeof(int32_t) * (size_t)nh))
        s->in = 1;
}
