// threadpool.h - one pool of worker threads, explicit (docs/house-rules.md, rule 8).
// sd_pool_run(p, fn, arg) calls fn(arg, ith, nth) on every thread of the pool,
// the caller being thread 0, and returns when all have finished. Workers spin
// briefly between jobs (a forward pass issues hundreds of small jobs, and a
// condition-variable wake-up per job would cost more than the job), then fall
// back to sleeping so an idle pool does not burn the CPU.
#ifndef SD_THREADPOOL_H
#define SD_THREADPOOL_H

#include <stdatomic.h>
#include <stddef.h>

// The public sd_threadpool (specdec.h) is this pool.
typedef struct sd_threadpool sd_pool;
typedef void (*sd_task_fn)(void *arg, int ith, int nth);

// Creates a pool of n_threads (>= 1; 1 means the caller alone). NULL on failure.
sd_pool *sd_pool_new(int n_threads);
// Releases one reference; the threads stop when the last one is released.
void sd_pool_free(sd_pool *p);
// Takes another reference to p (sessions that take turns share one pool:
// two pools of spinning workers on the same cores would fight each other).
sd_pool *sd_pool_ref(sd_pool *p);
int sd_pool_size(const sd_pool *p);
// Runs fn on all threads (caller included) and waits. Not reentrant: fn must
// not call sd_pool_run on the same pool. p may be NULL: fn(arg, 0, 1).
void sd_pool_run(sd_pool *p, sd_task_fn fn, void *arg);
// The take-turns rule of a shared pool: a user of the pool for a series of
// runs (a session's forward, sd_threadpool_run) holds its busy flag
// meanwhile. try_acquire returns 1 if it took the flag, 0 if another holds
// it; acquire waits its turn; release gives it back. p NULL: always free.
int sd_pool_try_acquire(sd_pool *p);
void sd_pool_acquire(sd_pool *p);
void sd_pool_release(sd_pool *p);

// Read-ahead while waiting: sets the calling thread's window to [p, p + n)
// (p NULL: none). The pool's wait loops (between jobs, and the caller's wait
// for the workers) prefetch the window one cache line per poll instead of
// idling, so the weights of the next job are on their way during the
// hand-over. sd_pool_wait_step() is one such poll for other wait loops:
// prefetches the next line and returns 1, or pauses and returns 0.
void sd_pool_prefetch(const void *p, size_t n);
int sd_pool_wait_step(void);
// Waits until *v >= target, polling with sd_pool_wait_step (then also
// yielding the time slice after a while): the wait of sd_pool_run for its
// workers, and of barriers inside a job.
void sd_pool_wait_until(const atomic_int *v, int target);

// Splits [0, n) into nth nearly equal contiguous parts; part ith is [*lo, *hi).
void sd_split_range(long n, int ith, int nth, long *lo, long *hi);

#endif
