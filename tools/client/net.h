// net.h - the client's HTTP calls to a specdec server's verification API
// (libcurl): one keep-alive connection, per-call timeouts, and the bytes and
// time each call took; plus a background probe of GET /health that says
// when an unreachable server is back.
#ifndef SD_CLIENT_NET_H
#define SD_CLIENT_NET_H

#include <stddef.h>
#include <stdint.h>

typedef struct cl_net cl_net;

// What one call gave.
typedef struct cl_reply {
    int status;        // HTTP status; 0: no reply (refused, timeout, cut: err says which)
    char *body;        // (len) the reply body, NUL-terminated; owned by the cl_net, valid until the next call
    size_t len;
    double ms;         // wall time of the call
    char err[256];     // why there was no reply
} cl_reply;

// url: "http://host:port"; timeout_ms: the most a call may take (the open's
// is 10x, it evaluates the prompt); api_key may be NULL.
int cl_net_new(cl_net **out, const char *url, int timeout_ms, const char *api_key, char *err, size_t errlen);
void cl_net_free(cl_net *n);
// POST path (with its query) with body; fills r. 0 when a reply came (any
// status), -1 when none did.
int cl_net_post(cl_net *n, const char *path, const void *body, size_t len, const char *ctype, int long_call,
                cl_reply *r);
// Bytes sent and received so far over the API (HTTP headers included), and calls made (failed included).
void cl_net_counts(const cl_net *n, int64_t *sent, int64_t *recv, int64_t *calls);
// The bodies alone (the API's messages, docs/split.md's sizes).
void cl_net_body_counts(const cl_net *n, int64_t *sent, int64_t *recv);
// The background probe: GET /health every period_ms while started; cl_net_up
// says whether the last probe got an answer.
int cl_net_probe_start(cl_net *n, int period_ms);
void cl_net_probe_stop(cl_net *n);
int cl_net_up(cl_net *n);

#endif
