// guard.c - slow clients: deadlines on the arrival of each request (see
// guard.h). One thread checks every SV_GUARD_TICK_MS the connections whose
// request is still arriving; a connection past its deadline, or under
// pressure past SV_GUARD_SLOW_MS, has its socket shut down (both ways):
// MHD's connection thread then reads the end of the stream and closes the
// connection as if the client had left. The socket stays open until MHD's
// cleanup, which tells the guard first (MHD_CONNECTION_NOTIFY_CLOSED) and
// removes the entry under the guard's lock, so the guard never touches a
// descriptor that was closed and reused.
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "serve/guard.h"
#include "specdec.h"   // sd_time_ms: the monotonic clock

typedef struct gconn {
    sv_guard *g;
    int fd;
    double t0;                 // when the current request started (ms, monotonic)
    int reading;               // 1 while the request is arriving
    int cut;                   // shut down already
    struct gconn *prev, *next;
} gconn;

struct sv_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int started, stop;
    int n_open;                // connections between STARTED and CLOSED
    int pressure_at;           // n_open from which slow requests are cut early
    int deadline_ms;
    gconn *head;
};

static void check(sv_guard *g) {
    double now = sd_time_ms();
    int pressure = g->n_open >= g->pressure_at;
    for (gconn *e = g->head; e; e = e->next) {
        if (!e->reading || e->cut) continue;
        double age = now - e->t0;
        if (age > g->deadline_ms || (pressure && age > SV_GUARD_SLOW_MS)) {
            shutdown(e->fd, SHUT_RDWR);
            e->cut = 1;
        }
    }
}

static void *guard_main(void *arg) {
    sv_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SV_GUARD_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (!g->stop) check(g);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

sv_guard *sv_guard_new(int max_conn, int deadline_ms) {
    sv_guard *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    int reserve = max_conn / 8 > 1 ? max_conn / 8 : 1;
    g->pressure_at = max_conn - reserve > 1 ? max_conn - reserve : 1;
    g->deadline_ms = deadline_ms;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->th, NULL, guard_main, g) != 0) {
        sv_guard_free(g);
        return NULL;
    }
    g->started = 1;
    return g;
}

void sv_guard_free(sv_guard *g) {
    if (!g) return;
    if (g->started) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->th, NULL);
    }
    while (g->head) {   // none after MHD_stop_daemon; freed anyway
        gconn *e = g->head;
        g->head = e->next;
        free(e);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void sv_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code) {
    sv_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        gconn *e = ci ? calloc(1, sizeof *e) : NULL;
        *socket_context = e;
        pthread_mutex_lock(&g->mu);
        g->n_open++;
        if (e) {
            e->g = g;
            e->fd = ci->connect_fd;
            e->t0 = sd_time_ms();
            e->reading = 1;
            e->next = g->head;
            if (g->head) g->head->prev = e;
            g->head = e;
        }
        pthread_mutex_unlock(&g->mu);
        return;
    }
    gconn *e = *socket_context;
    pthread_mutex_lock(&g->mu);
    g->n_open--;
    if (e) {
        if (e->prev) e->prev->next = e->next;
        else g->head = e->next;
        if (e->next) e->next->prev = e->prev;
    }
    pthread_mutex_unlock(&g->mu);
    free(e);
    *socket_context = NULL;
}

static void set_reading(struct MHD_Connection *c, int reading) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    gconn *e = ci ? ci->socket_context : NULL;
    if (!e) return;
    pthread_mutex_lock(&e->g->mu);
    e->reading = reading;
    e->t0 = sd_time_ms();
    pthread_mutex_unlock(&e->g->mu);
}

void sv_guard_received(struct MHD_Connection *c) { set_reading(c, 0); }

void sv_guard_next(struct MHD_Connection *c) { set_reading(c, 1); }
