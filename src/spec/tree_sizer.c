// tree_sizer.c - per-step tree sizing: acceptance per evidence class and the
// sizer that keeps the candidate nodes worth their forward time. See
// tree_sizer.h.
#include "spec/tree_sizer.h"

#include <string.h>

#include "common.h"

void sd_class_stats_init(sd_class_stats *s, int n_class, const double *prior_mean, double strength,
                         double decay) {
    memset(s, 0, sizeof *s);
    s->n_class = SD_MAX(1, SD_MIN(n_class, SD_SZ_MAX_CLASS));
    for (int c = 0; c < s->n_class; c++) {
        double m = prior_mean ? prior_mean[c] : 0.5;
        s->prior_mean[c] = m < 0 ? 0.0 : m > 0.99 ? 0.99 : m;
    }
    s->prior_strength = strength > 0 ? strength : 4.0;
    s->decay = decay > 0 && decay <= 1 ? decay : 1.0;
}

void sd_class_stats_reset(sd_class_stats *s) {
    memset(s->tried, 0, sizeof s->tried);
    memset(s->acc, 0, sizeof s->acc);
}

double sd_class_stats_p(const sd_class_stats *s, int c) {
    if (c < 0 || c >= s->n_class) return 0.0;
    double S = s->prior_strength;
    double p = (s->acc[c] + S * s->prior_mean[c]) / (s->tried[c] + S);
    return p < 0.995 ? p : 0.995;   // shares < 1 can push acc above tried: stay a probability
}

void sd_class_stats_step(sd_class_stats *s) {
    for (int c = 0; c < s->n_class; c++) {
        s->tried[c] *= s->decay;
        s->acc[c] *= s->decay;
    }
}

void sd_class_stats_add(sd_class_stats *s, int c, double share, int accepted) {
    if (c < 0 || c >= s->n_class || !(share > 0)) return;
    s->tried[c] += share > 1 ? 1.0 : share;
    if (accepted) s->acc[c] += 1.0;
}

#define SZ_PRIOR_STEPS 4.0

void sd_step_sizer_init(sd_step_sizer *z, const sd_cost_curve *c) {
    memset(z, 0, sizeof *z);
    if (c && c->n_points > 0 && sd_cost_curve_verify_ms(c, 1) > 0) {
        z->cost = *c;
        sd_cost_curve_monotone(&z->cost);   // more nodes never cost less
    } else {
        static const int n[] = {1, 2, 4, 8, 16, 32};
        static const double ms[] = {1.0, 1.15, 1.4, 2.0, 3.5, 6.5};
        sd_cost_curve_init(&z->cost);
        for (int i = 0; i < 6; i++) sd_cost_curve_set(&z->cost, n[i], ms[i]);
        z->relative = 1;
    }
    z->decay = 0.95;
    sd_step_sizer_reset(z);
}

void sd_step_sizer_reset(sd_step_sizer *z) {
    z->tok_sum = SZ_PRIOR_STEPS;
    z->ms_sum = SZ_PRIOR_STEPS * sd_cost_curve_verify_ms(&z->cost, 1);
    z->n_steps = 0;
}

double sd_step_sizer_rate(const sd_step_sizer *z) { return z->ms_sum > 0 ? z->tok_sum / z->ms_sum : 0.0; }

int sd_step_sizer_choose(const sd_step_sizer *z, const double *f, int m, double *gain) {
    double rate = sd_step_sizer_rate(z);
    double base = 1.0 - rate * sd_cost_curve_verify_ms(&z->cost, 1);
    double best = base, sum = 1.0;
    int bk = 0;
    for (int k = 1; k <= m; k++) {
        sum += f[k - 1];
        double v = sum - rate * sd_cost_curve_verify_ms(&z->cost, k + 1);
        if (v > best + 1e-12) {
            best = v;
            bk = k;
        }
    }
    if (gain) *gain = best - base;
    return bk;
}

void sd_step_sizer_observe(sd_step_sizer *z, int n_nodes, int n_tokens, double ms) {
    if (n_nodes < 1 || n_tokens < 1) return;
    z->tok_sum = z->tok_sum * z->decay + n_tokens;
    z->ms_sum = z->ms_sum * z->decay + sd_cost_curve_verify_ms(&z->cost, n_nodes);
    z->n_steps++;
    // A forward cannot take much less than the curve measured on this
    // machine (preemption only adds time): far faster "timings" measure no
    // forward at all (a caller without a target) and are ignored.
    if (!z->relative && ms > 0.5 * sd_cost_curve_verify_ms(&z->cost, n_nodes))
        sd_cost_curve_observe(&z->cost, n_nodes, ms);
}
