// cost_curve.c - the target's cost curve: points set by hand, measured on a
// session or parsed from bench-forward JSON; interpolation; online
// refinement from timed forwards. See cost_curve.h.
#include "spec/cost_curve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime/session.h"
#include "specdec_spec.h"

void sd_cost_curve_init(sd_cost_curve *c) {
    memset(c, 0, sizeof *c);
    c->online_weight = 0.02;
}

int sd_cost_curve_set(sd_cost_curve *c, int n, double ms) {
    if (n < 1 || !(ms >= 0)) return -1;
    int i = 0;
    while (i < c->n_points && c->n[i] < n) i++;
    if (i < c->n_points && c->n[i] == n) {
        c->ms[i] = ms;
        return 0;
    }
    if (c->n_points == SD_TA_MAX_POINTS) return -1;
    memmove(c->n + i + 1, c->n + i, (size_t)(c->n_points - i) * sizeof c->n[0]);
    memmove(c->ms + i + 1, c->ms + i, (size_t)(c->n_points - i) * sizeof c->ms[0]);
    c->n[i] = n;
    c->ms[i] = ms;
    c->n_points++;
    return 0;
}

void sd_cost_curve_set_draft(sd_cost_curve *c, double fixed, double per_depth, double per_node) {
    c->draft_ms_fixed = fixed;
    c->draft_ms_per_depth = per_depth;
    c->draft_ms_per_node = per_node;
}

double sd_cost_curve_verify_ms(const sd_cost_curve *c, int n) {
    int k = c->n_points;
    if (k == 0) return 0.0;
    if (n <= c->n[0]) return c->ms[0];
    if (k == 1) return c->ms[0] * n / c->n[0];
    for (int i = 1; i < k; i++)
        if (n <= c->n[i]) {
            double w = (double)(n - c->n[i - 1]) / (c->n[i] - c->n[i - 1]);
            return c->ms[i - 1] + w * (c->ms[i] - c->ms[i - 1]);
        }
    double slope = (c->ms[k - 1] - c->ms[k - 2]) / (c->n[k - 1] - c->n[k - 2]);
    return c->ms[k - 1] + SD_MAX(0.0, slope) * (n - c->n[k - 1]);
}

double sd_cost_curve_draft_ms(const sd_cost_curve *c, int n, int depth) {
    if (n <= 1) return 0.0;
    return c->draft_ms_fixed + c->draft_ms_per_depth * depth + c->draft_ms_per_node * (n - 1);
}

void sd_cost_curve_monotone(sd_cost_curve *c) {
    // pool adjacent violators (unweighted): blocks of equal value
    double val[SD_TA_MAX_POINTS];
    int len[SD_TA_MAX_POINTS], nb = 0;
    for (int i = 0; i < c->n_points; i++) {
        val[nb] = c->ms[i];
        len[nb] = 1;
        nb++;
        while (nb > 1 && val[nb - 2] > val[nb - 1]) {
            double v = (val[nb - 2] * len[nb - 2] + val[nb - 1] * len[nb - 1]) / (len[nb - 2] + len[nb - 1]);
            len[nb - 2] += len[nb - 1];
            val[nb - 2] = v;
            nb--;
        }
    }
    for (int b = 0, i = 0; b < nb; b++)
        for (int k = 0; k < len[b]; k++) c->ms[i++] = val[b];
}

static double sign_step(double est, double obs, double a) {
    return obs > est ? a * est : obs < est ? -a * est : 0.0;
}

void sd_cost_curve_observe(sd_cost_curve *c, int n, double ms) {
    if (n < 1 || !(ms >= 0)) return;
    double a = c->online_weight;
    int k = c->n_points;
    int i = 0;
    while (i < k && c->n[i] < n) i++;
    if (i < k && c->n[i] == n) {
        c->ms[i] += sign_step(c->ms[i], ms, a);
    } else if (k < SD_TA_MAX_POINTS) {
        sd_cost_curve_set(c, n, ms);
    } else if (i == 0 || i == k) {
        int j = i == 0 ? 0 : k - 1;
        double est = sd_cost_curve_verify_ms(c, n);
        c->ms[j] += (ms > est ? a : ms < est ? -a : 0.0) * c->ms[j];
    } else {
        double est = sd_cost_curve_verify_ms(c, n), step = sign_step(est, ms, a);
        double w = (double)(n - c->n[i - 1]) / (c->n[i] - c->n[i - 1]);
        c->ms[i - 1] += step * (1.0 - w);
        c->ms[i] += step * w;
    }
    for (int j = 0; j < c->n_points; j++) c->ms[j] = SD_MAX(0.0, c->ms[j]);
    sd_cost_curve_monotone(c);
}

void sd_cost_curve_observe_draft(sd_cost_curve *c, int n, int depth, double ms) {
    if (n <= 1 || !(ms >= 0)) return;
    if (c->draft_ms_fixed == 0 && c->draft_ms_per_depth == 0 && c->draft_ms_per_node == 0) {
        c->draft_ms_per_depth = ms / SD_MAX(1, depth);
        return;
    }
    double est = sd_cost_curve_draft_ms(c, n, depth);
    double f = ms > est ? 1.0 + c->online_weight : ms < est ? 1.0 - c->online_weight : 1.0;
    c->draft_ms_fixed *= f;
    c->draft_ms_per_depth *= f;
    c->draft_ms_per_node *= f;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

int sd_cost_curve_measure(sd_cost_curve *c, sd_session *s, const int *ns, int n_ns, int reps, double q,
                          char *err, size_t errlen) {
    static const int def_ns[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
    if (!ns) {
        ns = def_ns;
        n_ns = (int)(sizeof def_ns / sizeof def_ns[0]);
    }
    if (reps < 1) reps = 1;
    if (reps > 64) reps = 64;
    sd_model_info info;
    sd_model_get_info(sd_session_model(s), &info);
    int n_past = sd_session_n_past(s);
    int room = SD_MIN(s->n_batch, sd_session_n_ctx(s) - n_past);
    int32_t toks[SD_TA_MAX_NODES];
    for (int i = 0; i < SD_TA_MAX_NODES; i++) toks[i] = (int32_t)((1000 + (int64_t)i * 7919) % info.n_vocab);
    double times[64];
    int n_set = 0;
    for (int qi = 0; qi < n_ns; qi++) {
        int n = ns[qi];
        if (n < 1 || n > room || n > SD_TA_MAX_NODES) continue;
        sd_batch b = {.n = n, .tokens = toks};
        for (int r = qi == 0 ? -1 : 0; r < reps; r++) { // one warm-up, before the first point
            double t0 = sd_time_ms();
            if (sd_session_forward(s, &b, err, errlen) < 0) return -1;
            if (r >= 0) times[r] = sd_time_ms() - t0;
        }
        qsort(times, (size_t)reps, sizeof times[0], cmp_double);
        double pos = SD_MAX(0.0, SD_MIN(1.0, q)) * (reps - 1);
        int lo = (int)pos, hi = SD_MIN(lo + 1, reps - 1);
        double val = times[lo] + (pos - lo) * (times[hi] - times[lo]);
        if (sd_cost_curve_set(c, n, val) < 0) return sd_err(err, errlen, "cost curve: too many points");
        n_set++;
    }
    if (sd_session_truncate(s, n_past, err, errlen) < 0) return -1;
    if (n_set == 0) return sd_err(err, errlen, "cost curve: no batch size fits the session (room %d)", room);
    sd_cost_curve_monotone(c);
    return n_set;
}

int sd_cost_curve_from_json(sd_cost_curve *c, const char *json) {
    const char *p = strstr(json, "\"batches\"");
    if (!p) return -1;
    const char *end = strchr(p, ']');
    int n_set = 0;
    while ((p = strstr(p, "\"n\"")) && (!end || p < end)) {
        p += 3;
        while (*p == ' ' || *p == ':') p++;
        char *q;
        long n = strtol(p, &q, 10);
        if (q == p) return -1;
        const char *m = strstr(q, "\"ms\"");
        if (!m || (end && m > end)) return -1;
        m += 4;
        while (*m == ' ' || *m == ':') m++;
        double ms = strtod(m, &q);
        if (q == m) return -1;
        if (n >= 1 && n <= 1 << 20 && sd_cost_curve_set(c, (int)n, ms) == 0) n_set++;
        p = q;
    }
    return n_set > 0 ? n_set : -1;
}

// ---------------------------------------------------------------- the public handle (specdec_spec.h)
int sd_cost_curve_new(sd_cost_curve **out, sd_session *s, int max_nodes, char *err, size_t errlen) {
    // dense where the curve bends (a few rows cost about one), sparse beyond,
    // 2 reps: Qwen2.5-Coder-1.5B measures in ~3 s (it took ~10 with 3 reps
    // and 12, 24 as well, before a generation could start)
    static const int all[] = {1, 2, 3, 4, 6, 8, 16, 32, 64, 128};
    int ns[sizeof all / sizeof all[0]], n = 0;
    *out = NULL;
    for (int i = 0; i < (int)(sizeof all / sizeof all[0]) && all[i] <= max_nodes; i++) ns[n++] = all[i];
    if (n == 0) ns[n++] = 1;
    sd_cost_curve *c = malloc(sizeof *c);
    if (!c) return snprintf(err, errlen, "out of memory"), -1;
    sd_cost_curve_init(c);
    if (sd_cost_curve_measure(c, s, ns, n, 2, 0.0, err, errlen) < 0) {
        free(c);
        return -1;
    }
    if (c->n_points < 1) {
        free(c);
        return snprintf(err, errlen, "cannot measure the target's forward cost"), -1;
    }
    *out = c;
    return 0;
}

void sd_cost_curve_free(sd_cost_curve *c) { free(c); }

double sd_cost_curve_ms(const sd_cost_curve *c, int n) { return sd_cost_curve_verify_ms(c, n); }

int sd_cost_curve_describe(const sd_cost_curve *c, char *buf, size_t len) {
    if (!c || c->n_points < 1) return snprintf(buf, len, "no points");
    return snprintf(buf, len, "%.2f ms at %d node%s, %.2f ms at %d nodes", c->ms[0], c->n[0], c->n[0] == 1 ? "" : "s",
                    c->ms[c->n_points - 1], c->n[c->n_points - 1]);
}
