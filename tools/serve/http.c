// http.c - the HTTP side of specdec serve on libmicrohttpd: one thread per
// connection (MHD's), which reads the body (bounded), checks the API key,
// parses and enqueues, then waits for the scheduler's text: a whole JSON
// reply, or server-sent events streamed as the text grows. A client that
// goes away is noticed within SV_POLL_MS (the socket hung up or was reset;
// a half-close is not leaving) or at the next write, and its generation is stopped at
// once (sv_req_cancel). Slow clients are cut by guard.c.
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve/api.h"
#include "serve/guard.h"
#include "serve/split.h"

// The request head: MHD keeps it in a per-connection pool of SV_HEAD_POOL
// bytes (its default, 32 KiB, raised) and answers a head that overflows it
// itself (an HTML 414 or 431 page: libmicrohttpd has no hook to change its
// error bodies); below that, a URI or headers over these limits get the
// JSON error.
#define SV_HEAD_POOL (96 * 1024)
#define SV_URI_MAX (16 * 1024)
#define SV_HEADERS_MAX (32 * 1024)
#define SV_POLL_MS 50   // how often a waiting connection checks that its client is still there
// At shutdown, how long the replies in flight (ended by the scheduler) may
// take to reach their clients before the connections are closed.
#define SV_DRAIN_MS 10000

struct sv_http {
    struct MHD_Daemon *d;
    sv_server *s;
    sv_guard *guard;   // request deadlines (slow clients)
    int quiesced;
};

enum { R_NONE, R_HEALTH, R_MODELS, R_METRICS, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_PAGE,
       R_SPLIT_OPEN, R_SPLIT_ROUND, R_SPLIT_CLOSE };

// Per request on a connection (MHD's *con_cls).
typedef struct conn {
    char *body;        // (len, cap) request body so far
    size_t len, cap;
    int too_large;     // the body passed SV_BODY_MAX: 413
    int responded;     // a response was queued before the body was read (401, 413)
    sv_req *r;         // the generation, once submitted (the connection's reference)
} conn;

// A streaming response (MHD's content reader state).
typedef struct stream {
    sv_server *s;
    sv_req *r;         // (a reference of its own)
    int fd;            // the client's socket, for hang-up checks
    char *ev;          // (ev_len) bytes of events not yet handed to MHD, from ev_off
    size_t ev_len, ev_off;
    size_t consumed;   // bytes of r->out already turned into events
    int started;       // the opening chunk was sent
    int ended;         // the final events were made: end of stream after ev
} stream;

// ---------------------------------------------------------------- replies

// allow: the Allow header of a 405, or NULL.
static enum MHD_Result reply_allow(struct MHD_Connection *c, unsigned status, const char *type, char *body,
                                   const char *allow) {
    if (!body) {
        status = 500;
        type = "application/json";
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":null}}");
        if (!body) return MHD_NO;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type, char *body) {
    return reply_allow(c, status, type, body, NULL);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *code, const char *msg) {
    return reply(c, status, "application/json", sv_error_json((int)status, code, msg));
}

static enum MHD_Result reply_json(struct MHD_Connection *c, char *body) {
    return reply(c, 200, "application/json", body);
}

// ---------------------------------------------------------------- waiting

static int client_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

// 1 if the client is gone: the socket hung up or failed (a reset). The end
// of the client's sending side alone (POLLRDHUP, a read of 0 bytes) is not
// taken as leaving: a client may half-close its socket (shutdown(SHUT_WR))
// once its request is sent and still read the reply (issue 27). A client
// that closed its socket altogether looks the same until something is
// written to it (its kernel answers with a reset): at a stream's next
// chunk, or at a non-streaming request's reply, so such a request runs on
// to its end (TCP cannot tell the two apart without a write).
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

// Waits (r->mu held) until r grows past `have` bytes or is done; 0, or -1
// if the client went away meanwhile.
static int wait_for(sv_req *r, size_t have, int fd) {
    while (!r->done && r->out_len == have) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SV_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        // after every wake-up, text or not: a non-streaming reply's text grows
        // all the time, and a reset went unseen while tokens came faster than
        // one per SV_POLL_MS
        if (!r->done && client_gone(fd)) return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- streams

static int stream_push(stream *st, char *ev) {
    if (!ev) return -1;
    size_t n = strlen(ev);
    char *t = realloc(st->ev, st->ev_len + n);
    if (!t) {
        free(ev);
        return -1;
    }
    memcpy(t + st->ev_len, ev, n);
    st->ev = t;
    st->ev_len += n;
    free(ev);
    return 0;
}

// The closing events of a finished request: an error event, or the finish
// chunk (with usage unless a separate usage chunk was asked for), then [DONE].
static int stream_end(stream *st) {
    sv_req *r = st->r;
    int rc = 0;
    if (r->error[0]) {
        char *e = sv_error_json(r->err_status ? r->err_status : 500, NULL, r->error);
        size_t n = e ? strlen(e) : 0;
        char *ev = e ? malloc(n + 9) : NULL;
        if (ev) snprintf(ev, n + 9, "data: %s\n\n", e);
        free(e);
        rc |= stream_push(st, ev);
    } else {
        rc |= stream_push(st, sv_chunk(st->s, r, NULL, 0, 0, r->finish, r->include_usage ? 0 : 1));
        if (r->include_usage) rc |= stream_push(st, sv_chunk(st->s, r, NULL, 0, 0, NULL, 2));
    }
    rc |= stream_push(st, strdup("data: [DONE]\n\n"));
    st->ended = 1;
    return rc;
}

// Makes the next events: the opening chunk, new text, or the end. 0, or -1
// if the client went away or memory ran out.
static int stream_next(stream *st) {
    sv_req *r = st->r;
    if (!st->started) {   // chat streams open with the assistant role at once
        st->started = 1;
        if (r->kind == SV_CHAT) return stream_push(st, sv_chunk(st->s, r, NULL, 0, 1, NULL, 0));
    }
    pthread_mutex_lock(&r->mu);
    if (wait_for(r, st->consumed, st->fd) < 0) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    size_t n = r->out_len - st->consumed;
    char *text = n ? malloc(2 * n) : NULL;   // the new bytes, then how their tokens came
    if (text) {
        memcpy(text, r->out + st->consumed, n);
        memcpy(text + n, r->how + st->consumed, n);
    }
    int done = r->done;
    st->consumed = r->out_len;
    pthread_mutex_unlock(&r->mu);
    if (n) {
        if (!text) return -1;
        int rc = stream_push(st, sv_chunk_spec(st->s, r, text, text + n, n));
        free(text);
        return rc;
    }
    return done ? stream_end(st) : 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    while (st->ev_off == st->ev_len) {
        free(st->ev);
        st->ev = NULL;
        st->ev_len = st->ev_off = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (stream_next(st) < 0) {
            sv_req_cancel(st->r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = st->ev_len - st->ev_off < max ? st->ev_len - st->ev_off : max;
    memcpy(buf, st->ev + st->ev_off, n);
    st->ev_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    sv_req_cancel(st->r);   // no-op when it finished
    sv_req_unref(st->r);
    free(st->ev);
    free(st);
}

// ---------------------------------------------------------------- endpoints

static enum MHD_Result serve_generation(sv_server *s, struct MHD_Connection *c, conn *k, int kind) {
    sv_api_err e = {{0}, {0}};
    json_t *o = sv_parse_body(k->body ? k->body : "", k->len, &e);
    if (!o) return reply_error(c, 400, e.code, e.msg);
    sv_req *r = sv_req_new();
    if (!r) {
        json_decref(o);
        return reply_error(c, 500, NULL, "out of memory");
    }
    int status = sv_parse_generation(s, kind, o, r, &e);
    json_decref(o);
    char err[256];
    if (status) {
        sv_req_unref(r);
        return reply_error(c, (unsigned)status, e.code, e.msg);
    }
    if (sv_submit(s, r, err, sizeof err) < 0) {
        sv_req_unref(r);
        return reply_error(c, 503, "server_busy", err);
    }
    k->r = r;
    int fd = client_fd(c);
    if (r->stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) return reply_error(c, 500, NULL, "out of memory");
        st->s = s;
        st->r = r;
        st->fd = fd;
        sv_req_ref(r);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st,
                                                                      stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    pthread_mutex_lock(&r->mu);
    while (!r->done) {
        if (wait_for(r, r->out_len, fd) < 0) {   // the client went away: stop, close
            pthread_mutex_unlock(&r->mu);
            sv_req_cancel(r);
            return MHD_NO;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (r->error[0]) return reply_error(c, (unsigned)(r->err_status ? r->err_status : 500), NULL, r->error);
    return reply_json(c, sv_response_json(s, r));
}

static enum MHD_Result serve_tokens(sv_server *s, struct MHD_Connection *c, conn *k, int detok) {
    sv_api_err e = {{0}, {0}};
    json_t *o = sv_parse_body(k->body ? k->body : "", k->len, &e);
    if (!o) return reply_error(c, 400, e.code, e.msg);
    char *out = NULL;
    int status = detok ? sv_detokenize_json(s, o, &out, &e) : sv_tokenize_json(s, o, &out, &e);
    json_decref(o);
    if (status) return reply_error(c, (unsigned)status, e.code, e.msg);
    return reply_json(c, out);
}

// The verification API (split_http.c): binary or JSON bodies of any length.
static enum MHD_Result serve_split(sv_server *s, struct MHD_Connection *c, conn *k, int which) {
    const char *id = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "id");
    char *out = NULL;
    size_t n = 0;
    const char *type = "application/json";
    int status = sv_split_request(s, which, id, k->body ? k->body : "", k->len, &out, &n, &type);
    if (!out) return reply_error(c, 500, NULL, "out of memory");
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, out, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(out);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result serve_health(sv_server *s, struct MHD_Connection *c) {
    sv_metrics m;
    sv_metrics_get(s, &m);
    char *b = malloc(160);
    if (b)
        snprintf(b, 160, "{\"status\":\"ok\",\"slots_idle\":%d,\"slots_processing\":%d,\"queue\":%d}",
                 m.n_slots - m.busy_slots, m.busy_slots, m.queued);
    return reply_json(c, b);
}

static int route_of(const char *url, int *post) {
    static const struct { const char *path; int route, post; } routes[] = {
        {"/health", R_HEALTH, 0},        {"/v1/health", R_HEALTH, 0},
        {"/v1/models", R_MODELS, 0},     {"/models", R_MODELS, 0},
        {"/metrics", R_METRICS, 0},      {"/v1/chat/completions", R_CHAT, 1},
        {"/chat/completions", R_CHAT, 1}, {"/v1/completions", R_COMPLETIONS, 1},
        {"/completions", R_COMPLETIONS, 1}, {"/tokenize", R_TOKENIZE, 1},
        {"/detokenize", R_DETOKENIZE, 1}, {"/", R_PAGE, 0},
        {"/v1/split/open", R_SPLIT_OPEN, 1}, {"/v1/split/round", R_SPLIT_ROUND, 1},
        {"/v1/split/close", R_SPLIT_CLOSE, 1},
    };
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(url, routes[i].path)) {
            *post = routes[i].post;
            return routes[i].route;
        }
    return R_NONE;
}

// Bearer key check in constant time (the key's length aside).
static int auth_ok(const sv_server *s, struct MHD_Connection *c) {
    const char *key = s->o->api_key;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    // the scheme is case-insensitive (RFC 9110 11.1), then one or more spaces
    if (!h || strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t')) return 0;
    h += 6;
    while (*h == ' ' || *h == '\t') h++;
    size_t n = strlen(key);
    if (strlen(h) != n) return 0;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(h[i] ^ key[i]);
    return d == 0;
}

// Content-Length headers of a request: the first value, and whether another
// one differs from it (MHD frames the body by the first; repeats of one
// value are allowed, RFC 9112 6.3).
typedef struct lengths {
    const char *first;
    int differ;
} lengths;

static enum MHD_Result count_lengths(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    lengths *L = cls;
    if (!key || strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) return MHD_YES;
    if (!L->first) L->first = value ? value : "";
    else if (strcmp(L->first, value ? value : "")) L->differ = 1;
    return MHD_YES;
}

// Bytes of a kind of request values (headers, query arguments), each
// counted with its separators.
static enum MHD_Result add_size(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += (key ? strlen(key) : 0) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

// The first call for a request: the head's size, authentication, the
// Content-Length headers and the declared body size, answered before the
// body is read.

static enum MHD_Result first_call(sv_server *s, struct MHD_Connection *c, const char *url, conn *k) {
    // A request head too large for MHD's buffer (SV_HEAD_POOL) gets MHD's
    // own 414 / 431 page; these limits answer the ones below it in JSON.
    size_t uri = strlen(url), head = 0;
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, add_size, &uri);
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_size, &head);
    if (uri > SV_URI_MAX || head > SV_HEADERS_MAX) {
        k->responded = 1;
        char msg[96];
        snprintf(msg, sizeof msg, "the request %s longer than %d bytes", uri > SV_URI_MAX ? "URI is" : "headers are",
                 uri > SV_URI_MAX ? SV_URI_MAX : SV_HEADERS_MAX);
        return uri > SV_URI_MAX ? reply_error(c, 414, "uri_too_long", msg)
                                : reply_error(c, 431, "headers_too_large", msg);
    }
    int post;
    int route = route_of(url, &post);
    // the page holds no data (it sends the key the user gives it)
    if (s->o->api_key && route != R_HEALTH && route != R_PAGE && !auth_ok(s, c)) {
        k->responded = 1;
        return reply_error(c, 401, "invalid_api_key", "missing or wrong API key (send 'Authorization: Bearer KEY')");
    }
    lengths L = {NULL, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_lengths, &L);
    if (L.differ) {   // which one frames the body? (request smuggling)
        k->responded = 1;
        return reply_error(c, 400, "bad_request", "the request has several Content-Length headers that differ");
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > SV_BODY_MAX) {
        k->responded = 1;
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %d bytes", SV_BODY_MAX);
        return reply_error(c, 413, "request_too_large", msg);
    }
    return MHD_YES;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    sv_server *s = cls;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *con_cls = k;
        atomic_fetch_add(&s->requests_open, 1);
        return first_call(s, c, url, k);
    }
    if (*upload_size) {
        if (!k->responded && !k->too_large) {
            if (k->len + *upload_size > SV_BODY_MAX) {
                k->too_large = 1;
                free(k->body);
                k->body = NULL;
                k->len = k->cap = 0;
            } else if (sv_buf_add(&k->body, &k->len, &k->cap, upload, *upload_size) < 0) {
                return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    sv_guard_received(c);   // the request is in: no deadline while it is answered
    if (k->responded) return MHD_YES;
    if (k->too_large) return reply_error(c, 413, "request_too_large", "the request body is larger than 1 MiB");
    int post;
    int route = route_of(url, &post);
    if (route == R_NONE) return reply_error(c, 404, "not_found", "no such endpoint");
    // HEAD is GET without the body (MHD sends the headers only)
    if (post ? strcmp(method, "POST") : strcmp(method, "GET") && strcmp(method, "HEAD")) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s needs %s", url, post ? "POST" : "GET");
        return reply_allow(c, 405, "application/json", sv_error_json(405, "method_not_allowed", msg),
                           post ? "POST" : "GET, HEAD");
    }
    switch (route) {
    case R_HEALTH: return serve_health(s, c);
    case R_PAGE: return reply(c, 200, "text/html; charset=utf-8", strdup(sv_page_html));
    case R_MODELS: return reply_json(c, sv_models_json(s));
    case R_METRICS: return reply(c, 200, "text/plain; version=0.0.4", sv_metrics_text(s));
    case R_CHAT: return serve_generation(s, c, k, SV_CHAT);
    case R_COMPLETIONS: return serve_generation(s, c, k, SV_COMPLETION);
    case R_TOKENIZE: return serve_tokens(s, c, k, 0);
    case R_SPLIT_OPEN: return serve_split(s, c, k, 0);
    case R_SPLIT_ROUND: return serve_split(s, c, k, 1);
    case R_SPLIT_CLOSE: return serve_split(s, c, k, 2);
    default: return serve_tokens(s, c, k, 1);
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    sv_server *s = cls;
    (void)toe;
    sv_guard_next(c);   // a keep-alive connection's next request starts arriving now
    conn *k = *con_cls;
    if (!k) return;
    if (k->r) {
        sv_req_cancel(k->r);   // no-op when it finished
        sv_req_unref(k->r);
    }
    free(k->body);
    free(k);
    *con_cls = NULL;
    atomic_fetch_sub(&s->requests_open, 1);
}

// ---------------------------------------------------------------- the daemon

int sv_http_start(sv_http **out, sv_server *s, int *port, char *err, size_t errlen) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int g = getaddrinfo(s->o->host, NULL, &hints, &ai);
    if (g != 0 || !ai) return snprintf(err, errlen, "--host '%s': %s", s->o->host, gai_strerror(g)), -1;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (v6) ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)*port);
    else ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)*port);
    sv_http *h = calloc(1, sizeof *h);
    if (!h) return snprintf(err, errlen, "out of memory"), -1;
    h->s = s;
    long deadline_ms = (long)s->o->timeout_s * 1000;
    if (!(h->guard = sv_guard_new(s->o->max_conn, deadline_ms > (1L << 30) ? (1 << 30) : (int)deadline_ms))) {
        free(h);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, (uint16_t)*port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o->max_conn,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SV_HEAD_POOL,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o->timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                            completed, s, MHD_OPTION_NOTIFY_CONNECTION, sv_guard_notify, h->guard, MHD_OPTION_END);
    if (!h->d) {
        sv_guard_free(h->guard);
        free(h);
        return snprintf(err, errlen, "cannot listen on %s:%d (address in use, or not allowed)", s->o->host, *port), -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    if (di && di->port) *port = di->port;
    *out = h;
    return 0;
}

void sv_http_quiesce(sv_http *h) {
    if (!h || h->quiesced) return;
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    h->quiesced = 1;
}

void sv_http_stop(sv_http *h) {
    if (!h) return;
    // The scheduler has ended every generation; let their last events (the
    // finish chunk, [DONE]) reach the clients before the connections close
    // (measured: a stream cut without them now and then, before this wait).
    for (int waited = 0; atomic_load(&h->s->requests_open) > 0 && waited < SV_DRAIN_MS; waited += 10)
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
    MHD_stop_daemon(h->d);
    sv_guard_free(h->guard);
    free(h);
}
