// answers.h - internal: where the assistant writes in a chat record's tokens
// (train-head --score answers). A reply starts after the assistant's header
// (ChatML: "\n", <|im_start|>, "assistant\n"; the tokens the model's template
// writes before a reply) and ends with the end-of-turn token (<|im_end|>,
// <|eot_id|>), which belongs to it: a drafter drafts it too.
#ifndef SD_TRAIN_ANSWERS_H
#define SD_TRAIN_ANSWERS_H

#include <stdint.h>

#include "specdec.h"

#define SD_ANS_MAX_HDR 32   // tokens of a header (a byte-level vocabulary spells "assistant" in bytes)

typedef struct sd_answers {
    int32_t hdr[SD_ANS_MAX_HDR];
    int n_hdr;
    int32_t eot;
} sd_answers;

// The tokens of t's chat template: 0, or <0 with a message (no template, or
// one whose header or end-of-turn token cannot be found).
int sd_answers_init(sd_answers *a, const sd_tokenizer *t, char *err, size_t errlen);

// Scanning state: zero it at the start of a record.
typedef struct sd_answers_state {
    int32_t last[SD_ANS_MAX_HDR];   // the tokens just consumed, the newest last
    int n;                    // tokens consumed
    int in;                   // after the last token consumed: inside a reply
    int chat;                 // an end-of-turn token was seen (a chat record, not plain text)
} sd_answers_state;

// Consumes one token. After it, s->in tells whether the next token is part
// of a reply (the position's distribution is what a drafter must guess).
void sd_answers_feed(const sd_answers *a, sd_answers_state *s, int32_t tok);

#endif
