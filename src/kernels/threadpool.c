// threadpool.c - spinning worker pool with a sleeping fallback.
#include "kernels/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "specdec.h"

// The fields the caller writes per job (gen, fn, arg) and the counter the
// workers write (n_done) sit on separate cache lines, so a worker polling gen
// is not disturbed by another's n_done update and vice versa.
#define SD_POOL_LINE 64

// The online cores (the thread pool's default size; public in specdec.h).
int sd_n_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

// A worker polls for a new job SD_POOL_SPIN times (pause between polls),
// then yields its core between polls, then sleeps.
#ifndef SD_POOL_SPIN
#define SD_POOL_SPIN 2000
#endif

struct sd_threadpool {
    // written by the caller once per job, polled by the workers
    _Alignas(SD_POOL_LINE) _Atomic unsigned gen; // bumped once per job
    sd_task_fn fn;            // current job
    void *arg;
    int n;                    // threads including the caller
    _Atomic int stop;
    // written by the workers once per job, polled by the caller
    _Alignas(SD_POOL_LINE) _Atomic int n_done; // workers finished with the current job
    // rarely touched
    _Alignas(SD_POOL_LINE) _Atomic int n_sleeping; // workers blocked on cv
    _Atomic int n_refs;       // owners (sd_pool_ref / sd_pool_free)
    _Atomic int busy;         // 1 while a forward or sd_threadpool_run holds the pool (sd_pool_try_acquire)
    pthread_t *th;            // (n - 1) workers
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct {
    sd_pool *p;
    int ith;
} worker_arg;

// The calling thread's read-ahead window (sd_pool_prefetch): consumed one
// cache line per poll by the wait loops below.
static _Thread_local const char *pf_cur, *pf_end;

void sd_pool_prefetch(const void *p, size_t n) {
    pf_cur = p;
    pf_end = p ? pf_cur + n : NULL;
}

int sd_pool_wait_step(void) {
    if (pf_cur < pf_end) {
        __builtin_prefetch(pf_cur, 0, 2);
        pf_cur += 64;
        return 1;
    }
    SD_CPU_RELAX();
    return 0;
}

// Polls that pause before a waiter starts yielding its time slice (on a busy
// machine the peer it waits for may be descheduled).
#define SD_POOL_YIELD_AFTER 2000

void sd_pool_wait_until(const atomic_int *v, int target) {
    long spins = 0;
    while (atomic_load_explicit(v, memory_order_acquire) < target)
        if (!sd_pool_wait_step() && ++spins >= SD_POOL_YIELD_AFTER) sched_yield();
}

static void *worker_main(void *a) {
    worker_arg wa = *(worker_arg *)a;
    free(a);
    sd_pool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        long spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            // a poll (reading ahead is not counted as a spin, a pause is)
            if (sd_pool_wait_step() || ++spins < SD_POOL_SPIN) continue;
            if (spins < SD_POOL_SPIN + 18000) {
                sched_yield(); // let a descheduled peer run on a busy machine
            } else {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->n_sleeping, 1);
                while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->n_sleeping, 1);
                pthread_mutex_unlock(&p->mu);
                spins = 0;
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        p->fn(p->arg, wa.ith, p->n);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
}

sd_pool *sd_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    sd_pool *p = aligned_alloc(SD_POOL_LINE, (sizeof(*p) + SD_POOL_LINE - 1) / SD_POOL_LINE * SD_POOL_LINE);
    if (!p) return NULL;
    memset(p, 0, sizeof(*p));
    p->n = n_threads;
    atomic_store(&p->n_refs, 1);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->th = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->th) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof(*wa));
        if (!wa) {
            p->n = i;
            break;
        }
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->th[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = i;
            break;
        }
    }
    return p;
}

sd_pool *sd_pool_ref(sd_pool *p) {
    if (p) atomic_fetch_add(&p->n_refs, 1);
    return p;
}

void sd_pool_free(sd_pool *p) {
    if (!p || atomic_fetch_sub(&p->n_refs, 1) > 1) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->th);
    free(p);
}

int sd_pool_size(const sd_pool *p) { return p ? p->n : 1; }

void sd_pool_run(sd_pool *p, sd_task_fn fn, void *arg) {
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n);
    sd_pool_wait_until(&p->n_done, p->n - 1);
}

void sd_split_range(long n, int ith, int nth, long *lo, long *hi) {
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

int sd_pool_try_acquire(sd_pool *p) {
    int free_ = 0;
    return !p || atomic_compare_exchange_strong_explicit(&p->busy, &free_, 1, memory_order_acquire,
                                                         memory_order_relaxed);
}

void sd_pool_acquire(sd_pool *p) {
    long spins = 0;
    while (!sd_pool_try_acquire(p)) {
        if (++spins >= SD_POOL_YIELD_AFTER) sched_yield();
        else SD_CPU_RELAX();
    }
}

void sd_pool_release(sd_pool *p) {
    if (p) atomic_store_explicit(&p->busy, 0, memory_order_release);
}

// ---------------------------------------------------------------- public handle (specdec.h)
int sd_threadpool_new(sd_threadpool **out, int n_threads, char *err, size_t errlen) {
    *out = NULL;
    if (n_threads < 0 || n_threads > 1024) return sd_err(err, errlen, "thread pool: %d threads (0..1024)", n_threads);
    if (n_threads == 0) n_threads = sd_n_cores();
    *out = sd_pool_new(n_threads);
    if (!*out) return sd_err(err, errlen, "thread pool: cannot start %d threads", n_threads);
    return 0;
}

void sd_threadpool_free(sd_threadpool *p) { sd_pool_free(p); }

int sd_threadpool_size(const sd_threadpool *p) { return sd_pool_size(p); }

// Takes its turn like a forward does (sd_session_forward), so that neither
// can corrupt the other's run.
void sd_threadpool_run(sd_threadpool *p, void (*fn)(void *arg, int ith, int nth), void *arg) {
    sd_pool_acquire(p);
    sd_pool_run(p, fn, arg);
    sd_pool_release(p);
}
