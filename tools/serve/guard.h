// guard.h - slow clients (guard.c): every connection's request head and
// body must arrive within a deadline counted from the request's start, and
// when the connections near their limit, the ones that have been sending a
// request for long are closed at once, so that a crowd of slow clients
// (slowloris) cannot hold every connection. libmicrohttpd's own timeout
// (MHD_OPTION_CONNECTION_TIMEOUT) restarts on every byte received, so a
// client sending a byte now and then never meets it; the guard closes such
// a connection by shutting its socket down, which MHD's connection thread
// sees as the client leaving.
#ifndef SD_SERVE_GUARD_H
#define SD_SERVE_GUARD_H

#include <microhttpd.h>

// Under pressure, a connection still sending its request after this long is closed.
#define SV_GUARD_SLOW_MS 2000
#define SV_GUARD_TICK_MS 100   // how often the deadlines are checked

typedef struct sv_guard sv_guard;

// A guard for at most max_conn connections whose requests must arrive
// within deadline_ms; pressure starts at max_conn - max(1, max_conn / 8)
// open connections. Starts its thread. NULL when out of memory.
sv_guard *sv_guard_new(int max_conn, int deadline_ms);
// Stops the thread and frees (after MHD_stop_daemon: no connection left).
void sv_guard_free(sv_guard *g);
// MHD_OPTION_NOTIFY_CONNECTION's callback (cls: the guard): tracks the
// connection from its start to its close.
void sv_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);
// The connection's request has arrived in full (head and body): the guard
// leaves it alone while it is answered.
void sv_guard_received(struct MHD_Connection *c);
// The connection's request ended: the next one (keep-alive) starts now.
void sv_guard_next(struct MHD_Connection *c);

#endif
