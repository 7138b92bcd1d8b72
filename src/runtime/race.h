// race.h - reproducible sampling: an exponential race (the Gumbel-max trick)
// over counter-based noise, shared by the target's sampler and the drafters.
//
// The token at absolute position pos of a text (its index, the prompt
// included) is drawn from the sampler's final distribution p as
//
//     x* = argmax_x log(u_x) / p_x  =  argmin_x E_x / p_x,   E_x = -log(u_x),
//
// over the tokens with p_x > 0 (ties: the lower id), where u_x in (0, 1] is a
// hash of (key, pos, x). With the E_x independent Exp(1) variables, E_x / p_x
// is exponential with rate p_x, and the first of independent exponential
// clocks to ring is x with probability p_x / sum p: x* is an exact sample of
// p. The noise of different positions is independent, so a text drawn this
// way, position after position, is distributed exactly as sampling with a
// sequential random number generator; but no state advances, so the draw
// depends only on the key (from the seed), the position and p. Speculative
// decoding then verifies a tree by following the child equal to the target's
// own draw at each node (sd_verify_race): its text equals plain sampling's
// with the same seed, whatever the tree, the drafter or the load.
//
// A drafter with its own distribution q shares the noise: it ranks the
// children of a node at position pos by E_x / q_x (smallest first), so that
// its first child is the target's draw whenever q is close enough to p.
//
// Cost: one hash per candidate (the tokens that survive the sampler's
// truncation), written as a loop over ids that compilers vectorise, and one
// log per candidate that can still win (a bound skips the others).
#ifndef SD_RACE_H
#define SD_RACE_H

#include <stdint.h>

#include "specdec.h"

// splitmix64's finaliser: a bijective 64-bit mix.
static inline uint64_t sd_race_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The noise key of text number stream (0, 1, ...) of a seed.
static inline uint64_t sd_race_key(uint64_t seed, uint64_t stream) {
    return sd_race_mix(sd_race_mix(seed ^ 0x7261636544726177ull) + stream * 0x9E3779B97F4A7C15ull);
}

// The key of one position: the tokens' hashes at pos are
// sd_race_mix(pos_key + id * golden), a splitmix64 sequence from a random
// start, independent between positions.
static inline uint64_t sd_race_pos_key(uint64_t key, int64_t pos) {
    return sd_race_mix(key ^ sd_race_mix((uint64_t)pos * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull));
}

static inline uint64_t sd_race_hash(uint64_t pos_key, int32_t id) {
    return sd_race_mix(pos_key + (uint64_t)(uint32_t)id * 0x9E3779B97F4A7C15ull);
}

// u in (0, 1] from a hash (53 bits).
static inline double sd_race_u(uint64_t h) { return (double)((h >> 11) + 1) * (1.0 / 9007199254740992.0); }

// The exponential variable E = -log(u) of token id at a position.
double sd_race_exp(uint64_t pos_key, int32_t id);

// The race draw over candidates (ids[i], p[i]), i < n (p[i] > 0 counted
// only; any scale): the index i of the winner, -1 if no p[i] > 0. scratch:
// n doubles. The same inputs give the same index on every call.
int sd_race_pick(uint64_t key, int64_t pos, const int32_t *ids, const float *p, int n, double *scratch);

// The race draw from a row over token ids (row[v] for v < n; mass on the
// entries > 0): the token, -1 if the row has no mass. For tests and callers
// with a full row; the sampler draws from its candidate list.
int32_t sd_race_draw_row(uint64_t key, int64_t pos, const float *row, int n);

// The k best tokens of a row by race score E_x / row[x] (smallest first; ties:
// lower id) into out; returns how many (at most k, only entries > 0). The row's
// mass lies on the ids support[0..n) (strictly increasing), or anywhere when
// support is NULL (n = the row's length). out[0] is sd_race_draw_row's token.
int sd_race_rank(uint64_t key, int64_t pos, const float *row, const int32_t *support, int n, int k, int32_t *out);

// ---------------------------------------------------------------- the sampler's key
// The sampler draws text number stream of its seed with key
// sd_race_key(seed, stream); sd_sampler_reseed starts again at stream 0.
// Starts the next text: returns the key it draws with (the first call after
// a reseed or sd_sampler_new returns stream 0's) and makes it the key of
// sd_sampler_sample. A generation (sd_gen_new) calls it once, so that
// generations on one sampler draw independently while a seed, reseeded,
// gives its texts again.
uint64_t sd_sampler_next_text(sd_sampler *s);
// The race draw of the sampler's final distribution for logits (penalty,
// temperature, truncation as sd_sampler_probs) at position pos with key.
// Greedy samplers return the argmax. In every draw mode.
int32_t sd_sampler_race_sample(sd_sampler *s, const float *logits, const int32_t *hist, int n_hist, uint64_t key,
                               int64_t pos);

#endif
