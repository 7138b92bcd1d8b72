// pp_root.h - rank 0's state of a pipeline, shared by pp.c (the launch, the
// session hooks, the end) and pp_flight.c (passes of several sessions, in
// flight, and the ranks' busy time). Rank 0's scheduler thread alone writes
// it; pp_metrics_text reads it from other threads (figures only).
#ifndef SD_TOOLS_PP_ROOT_H
#define SD_TOOLS_PP_ROOT_H

#include "mpi/pp_wire.h"

#define PP_MAX_FLIGHT 16   // passes in flight at once (pp_group_begin)
#define PP_BUSY_MAX 4096   // compute intervals not yet settled (pp_busy_add)

typedef struct pp_root {
    pp_ctx c;
    int active;                // rank 0 of a pipeline
    int attached;              // session ids in use so far (a freed session's id is reused)
    int32_t *ops;              // (ops_cap) queued cache operations (op, session, n, rows...)
    int n_ops, ops_cap;
    double n_fwd, other_ms, wait_ms, self_ms; // forwards; the other ranks' compute, rank 0's wait and compute (ms)
    const sd_session *sess[PP_MAX_SESSIONS];  // the attached sessions, by id
    double rank_ms[PP_MAX_RANKS];             // each rank's forward time so far (ms; rank 0's = self_ms)
    double rank_wait[PP_MAX_RANKS];           // each other rank's time waiting for messages so far (ms, its last answer's)
    // the passes that were alone in the ring (no other in flight): rank 0's
    // wait for them and the other ranks' compute in it (the network time is
    // the difference; with passes in flight the ranks' compute overlaps)
    double solo_wait_ms, solo_other_ms, n_solo;
    int groups;                // --pp-groups: micro-batches a server keeps in flight (0: the ranks)
    // busy time: how long exactly k ranks computed at once, k = 0..size (ms),
    // settled up to busy_wm (pp_now_ms of rank 0); the intervals not yet
    // settled, (rank, start, end) in rank 0's clock
    double busy_ms[PP_MAX_RANKS + 1];
    double busy_wm;
    double busy_iv[PP_BUSY_MAX][2];
    int busy_rank[PP_BUSY_MAX], n_busy;
    long flights, flight_sum;  // passes begun in flight, and the passes in flight then (their sum)
} pp_root;
extern pp_root pp0;

// A compute interval of rank k, [t0, t1) in rank 0's clock (ms).
void pp_busy_add(int k, double t0, double t1);
// The other ranks' intervals of an answer: each rank k's rank_t0 (its own
// clock) and rank_ms, moved to rank 0's clock.
void pp_busy_answer(const pp_hdr *a);
// Settles the busy time up to the watermark: now, or the send time of the
// oldest pass still in flight (an earlier interval may still come with its
// answer).
void pp_busy_settle(void);
// 1 when pass k of pp_flight.c is in flight.
int pp_group_in_flight(int k);
// The session id of an attached session, or -1.
int pp_sid_of(const sd_session *s);
// Queues session sid's layer-skip mask for the other ranks when it changed
// since the last one sent (a skip drafter's session).
void pp_sync_skip(const sd_session *s, int sid);

#endif
