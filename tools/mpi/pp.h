// pp.h - pipeline parallelism for the commands (docs/mpi.md): `mpirun -np R
// specdec generate|bench ... --pp R` splits the target's layers over R
// processes. tools/mpi/pp.c implements it over MPI (make MPI=1);
// tools/mpi/pp_none.c is the default build's, where --pp is refused with a
// message saying how to build it. The library knows nothing of MPI: it gives
// model parts (sd_model_load_part), part forwards (sd_session_forward_part)
// and session hooks; these functions are the glue.
#ifndef SD_TOOLS_PP_H
#define SD_TOOLS_PP_H

#include <stddef.h>

#include "specdec.h"

// First thing in main: strips the pipeline's options (--pp R, --layers
// N,N,..., --pp-timeout S, --pp-groups G, --pp-stats) from argv. Returns -1 when the process
// should go on with the command (on rank 0, or without --pp), else the exit
// code the process must return now (a worker rank's end, or a refused launch,
// whose one message rank 0 has printed).
int pp_main(int *argc, char **argv);
// 1 when this process is rank 0 of a pipeline.
int pp_active(void);
// Loads the command's target: its part (the first layers, the embeddings and
// the output) on rank 0 of a pipeline, else the whole model (sd_model_load).
// On rank 0 every session later made on the part is attached as it is made
// (sd_model_set_session_hook), a skip drafter's included.
int pp_model_load(sd_model **out, const char *path, char *err, size_t errlen);
// Attaches a session of the target to the pipeline (no-op without one, or
// when attached already): the other ranks make their sessions alike, and
// the session's forward, commit, truncate, layer-skip mask and end reach
// every rank. 0, or <0 with a message.
int pp_attach(sd_session *s, char *err, size_t errlen);
// The batches of several attached sessions in one pass round the ring (a
// server's round): sd_batcher_forward's contract, on batcher b of rank 0's
// part (sd_batcher_failed_batch names a batch rank 0 refused).
int pp_forward_many(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen);
// The same pass in two halves, so that several can be in flight at once
// (micro-batches: a server's groups of slots, docs/mpi.md):
// pp_group_begin runs rank 0's layers over the batches and sends the
// message on without waiting; it returns a ticket >= 0, or <0 with a
// message (sd_batcher_failed_batch names a refused batch; nothing was
// sent). ss and bs are copied; what the batches point to (tokens,
// hidden_out, ...) must stay valid until pp_group_end. pp_group_end waits
// for that ticket's answer (tickets may end in any order) and runs the
// output layer: each session's logits as sd_batcher_forward's. At most 16
// in flight.
int pp_group_begin(sd_batcher *b, sd_session *const *ss, const sd_batch *bs, int n, char *err, size_t errlen);
int pp_group_end(sd_batcher *b, int ticket, char *err, size_t errlen);
// How many groups a server keeps in flight: --pp-groups G, else what
// pp_groups_pick chose (the number of ranks until then); 1 without a
// pipeline.
int pp_groups(void);
// Chooses it for ranks of n_threads threads each, when --pp-groups was not
// given: the number of ranks, or 1 when the ranks on rank 0's host need more
// cores than it has (several groups in flight would only take turns on the
// same cores, each reading the weights once more). A line for the log
// saying what and why into note (len bytes).
int pp_groups_pick(int n_threads, char *note, size_t len);
// On rank 0, fn(arg, message) runs once when a fault (a rank that died, an
// answer past --pp-timeout, a broken link) is about to stop every rank: a
// server answers its requests in flight with the message, then returns
// (within a few seconds) and the job ends (MPI_Abort).
void pp_on_fault(void (*fn)(void *arg, const char *msg), void *arg);
// A server's scheduler, idle: when rank 0 has sent nothing for 5 s, a
// keep-alive goes round the ring, so that the other ranks, which then wait
// for each message at most --pp-timeout + 15 s, know rank 0 is alive (and
// stop every rank when it is not). No-op without a pipeline.
void pp_keepalive(void);
// 1 when mpirun keeps the job going after a rank dies (mpirun
// --enable-recovery, or -mca orte_abort_on_non_zero_status 0), so that
// rank 0 can answer the requests in flight.
int pp_recovery(void);
// Prometheus lines of the pipeline's figures so far into buf (n bytes, NUL
// ended; nothing without a pipeline): each rank's forward time, rank 0's
// time waiting for the ring and the part of it that is not the other ranks'
// compute (messages, the network). Safe from another thread (reads only).
void pp_metrics_text(char *buf, size_t n);

#endif
