// net.c - the client's HTTP calls (net.h) on libcurl.
#include "client/net.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct cl_net {
    CURL *c;
    char url[512];
    char auth[600];
    int timeout_ms;
    char *buf;
    size_t len, cap;
    int64_t sent, recv, calls, body_sent, body_recv;
    pthread_t probe;
    int probe_on;
    atomic_int up;
    atomic_int stop;
    int period_ms;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static size_t on_data(char *p, size_t sz, size_t nm, void *u) {
    cl_net *n = u;
    size_t k = sz * nm;
    if (n->len + k + 1 > n->cap) {
        size_t cap = (n->len + k + 1) * 2;
        char *b = realloc(n->buf, cap);
        if (!b) return 0;
        n->buf = b;
        n->cap = cap;
    }
    memcpy(n->buf + n->len, p, k);
    n->len += k;
    n->buf[n->len] = 0;
    return k;
}

int cl_net_new(cl_net **out, const char *url, int timeout_ms, const char *api_key, char *err, size_t errlen) {
    *out = NULL;
    static int inited;
    if (!inited) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        inited = 1;
    }
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return snprintf(err, errlen, "--server: expected http://HOST:PORT, got '%s'", url), -1;
    cl_net *n = calloc(1, sizeof *n);
    if (!n || !(n->c = curl_easy_init())) {
        free(n);
        return snprintf(err, errlen, "cannot start libcurl"), -1;
    }
    snprintf(n->url, sizeof n->url, "%s", url);
    size_t l = strlen(n->url);
    while (l > 0 && n->url[l - 1] == '/') n->url[--l] = 0;
    if (api_key) snprintf(n->auth, sizeof n->auth, "Authorization: Bearer %s", api_key);
    n->timeout_ms = timeout_ms;
    *out = n;
    return 0;
}

void cl_net_free(cl_net *n) {
    if (!n) return;
    cl_net_probe_stop(n);
    curl_easy_cleanup(n->c);
    free(n->buf);
    free(n);
}

int cl_net_post(cl_net *n, const char *path, const void *body, size_t len, const char *ctype, int long_call,
                cl_reply *r) {
    char url[1024], ct[128];
    snprintf(url, sizeof url, "%s%s", n->url, path);
    snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
    struct curl_slist *h = curl_slist_append(NULL, ct);
    h = curl_slist_append(h, "Expect:");   // no 100-continue round trip
    if (n->auth[0]) h = curl_slist_append(h, n->auth);
    CURL *c = n->c;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)len);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, n);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(n->timeout_ms < 2000 ? n->timeout_ms : 2000));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(long_call ? 10 * n->timeout_ms : n->timeout_ms));
    n->len = 0;
    if (n->buf) n->buf[0] = 0;
    double t0 = now_ms();
    CURLcode rc = curl_easy_perform(c);
    r->ms = now_ms() - t0;
    n->calls++;
    curl_off_t down = 0;
    long hs = 0, rq = 0;   // the request's size counts its body (what was sent); the headers received
    curl_easy_getinfo(c, CURLINFO_SIZE_DOWNLOAD_T, &down);
    curl_easy_getinfo(c, CURLINFO_HEADER_SIZE, &hs);
    curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &rq);
    n->sent += (int64_t)rq + (int64_t)len;   // the request size counts its head only
    n->recv += (int64_t)down + (int64_t)hs;
    n->body_sent += (int64_t)len;
    n->body_recv += (int64_t)n->len;
    curl_slist_free_all(h);
    r->body = n->buf ? n->buf : (char *)"";
    r->len = n->len;
    r->err[0] = 0;
    if (rc != CURLE_OK) {
        r->status = 0;
        snprintf(r->err, sizeof r->err, "%s", curl_easy_strerror(rc));
        return -1;
    }
    long st = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    r->status = (int)st;
    return 0;
}

void cl_net_counts(const cl_net *n, int64_t *sent, int64_t *recv, int64_t *calls) {
    *sent = n->sent;
    *recv = n->recv;
    *calls = n->calls;
}

void cl_net_body_counts(const cl_net *n, int64_t *sent, int64_t *recv) {
    *sent = n->body_sent;
    *recv = n->body_recv;
}

static size_t sink(char *p, size_t sz, size_t nm, void *u) {
    (void)p, (void)u;
    return sz * nm;
}

static void *probe_main(void *arg) {
    cl_net *n = arg;
    CURL *c = curl_easy_init();
    char url[600];
    snprintf(url, sizeof url, "%s/health", n->url);
    while (c && !atomic_load(&n->stop)) {
        curl_easy_reset(c);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
        long st = 0;
        if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
        atomic_store(&n->up, st == 200);
        for (int w = 0; w < n->period_ms && !atomic_load(&n->stop); w += 10)
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000L}, NULL);
    }
    if (c) curl_easy_cleanup(c);
    return NULL;
}

int cl_net_probe_start(cl_net *n, int period_ms) {
    if (n->probe_on) return 0;
    atomic_store(&n->stop, 0);
    atomic_store(&n->up, 0);
    n->period_ms = period_ms;
    if (pthread_create(&n->probe, NULL, probe_main, n) != 0) return -1;
    n->probe_on = 1;
    return 0;
}

void cl_net_probe_stop(cl_net *n) {
    if (!n->probe_on) return;
    atomic_store(&n->stop, 1);
    pthread_join(n->probe, NULL);
    n->probe_on = 0;
}

int cl_net_up(cl_net *n) { return atomic_load(&n->up); }
