// draft_auto.c - automatic tree sizing for a drafter: times propose and
// verification, feeds the accepted paths and timings to the sd_tree_auto
// bundle, probes with one draft token while the choice is not to draft, and
// reports changed shapes. See draft_auto.h.
#include "draft/draft_auto.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

struct sd_draft_auto {
    sd_tree_auto *ta;               // owned bundle
    sd_draft_auto_params p;         // as given (cost pointer not used after creation)
    double t_begin, t_end;          // sd_time_ms at the start / end of the last propose; 0 = none pending
    sd_tree_shape probe;            // one draft token: drafted every DA_PROBE_EVERY steps while the choice is
                                    // "no drafting", so that the statistics can still change the choice
    int idle_steps;                 // steps in a row drafted with the choice n == 1
};
#define DA_PROBE_EVERY 8

// The current shape through the report callback, as one line.
static void report_shape(const sd_draft_auto *a) {
    if (!a->p.report) return;
    char buf[1024], line[1100];
    sd_tree_shape_format(&a->ta->shape, buf, sizeof buf);
    snprintf(line, sizeof line, "tree auto: %s", buf);
    a->p.report(a->p.user, line);
}

sd_draft_auto_params sd_draft_auto_default_params(void) {
    sd_draft_auto_params p;
    memset(&p, 0, sizeof p);
    p.max_nodes = 32;
    p.max_depth = 12;
    p.reopt_every = 16;
    return p;
}

int sd_draft_auto_new(sd_draft_auto **out, const sd_draft_auto_params *p, char *err, size_t errlen) {
    *out = NULL;
    if (!p || !p->cost || p->cost->n_points < 1)
        return sd_err(err, errlen, "automatic tree: the target's cost curve is missing");
    if (p->max_nodes < 2 || p->max_nodes > SD_TA_MAX_NODES)
        return sd_err(err, errlen, "automatic tree: max_nodes %d out of range 2..%d", p->max_nodes, SD_TA_MAX_NODES);
    if (p->max_depth < 1 || p->max_depth > SD_TA_MAX_DEPTH)
        return sd_err(err, errlen, "automatic tree: max_depth %d out of range 1..%d", p->max_depth, SD_TA_MAX_DEPTH);
    sd_draft_auto *a = calloc(1, sizeof *a);
    if (!a) return sd_err(err, errlen, "automatic tree: out of memory");
    a->p = *p;
    a->p.cost = NULL;
    sd_tree_auto_params tp = sd_tree_auto_default_params();
    tp.opt.max_nodes = p->max_nodes;
    tp.opt.max_depth = p->max_depth;
    tp.reopt_every = p->reopt_every;
    if (sd_tree_auto_new(&a->ta, &tp, err, errlen) < 0) {
        free(a);
        return -1;
    }
    if (p->prior_top1 > 0 && p->prior_top1 < 1) {   // every rank's prior in proportion
        const double f = p->prior_top1 / a->ta->stats.prior_mean[0];
        for (int r = 0; r < SD_TA_MAX_RANK; r++) a->ta->stats.prior_mean[r] = SD_MIN(0.99, a->ta->stats.prior_mean[r] * f);
    }
    double fixed = a->ta->cost.draft_ms_fixed, pd = a->ta->cost.draft_ms_per_depth,
           pn = a->ta->cost.draft_ms_per_node;
    if (p->draft_ms_per_depth > 0 || p->draft_ms_per_node > 0) pd = p->draft_ms_per_depth, pn = p->draft_ms_per_node;
    a->ta->cost = *p->cost;   // the target's curve; the drafter's cost as measured, else learnt online from 0
    a->ta->cost.draft_ms_fixed = fixed, a->ta->cost.draft_ms_per_depth = pd, a->ta->cost.draft_ms_per_node = pn;
    if (sd_tree_auto_optimise(a->ta, err, errlen) < 0) {
        sd_draft_auto_free(a);
        return -1;
    }
    sd_tree_shape *pr = &a->probe;
    pr->n = 2, pr->depth = 1;
    pr->parent[0] = -1, pr->parent[1] = 0;
    pr->rank[0] = pr->rank[1] = 0;
    pr->depth_of[0] = 0, pr->depth_of[1] = 1;
    pr->f[0] = 1.0, pr->f[1] = 0.5;
    pr->expected_tokens = 1.5;
    report_shape(a);
    *out = a;
    return 0;
}

void sd_draft_auto_free(sd_draft_auto *a) {
    if (!a) return;
    sd_tree_auto_free(a->ta);
    free(a);
}

const sd_tree_shape *sd_draft_auto_begin(sd_draft_auto *a) {
    a->t_begin = sd_time_ms();
    a->t_end = 0;
    if (a->ta->shape.n > 1) {
        a->idle_steps = 0;
        return &a->ta->shape;
    }
    return ++a->idle_steps % DA_PROBE_EVERY == 0 ? &a->probe : &a->ta->shape;
}

void sd_draft_auto_end(sd_draft_auto *a) { a->t_end = sd_time_ms(); }

int sd_draft_auto_accept(sd_draft_auto *a, const sd_step_record *rec, char *err, size_t errlen) {
    const sd_tree *tree = rec->tree;
    double draft_ms = 0, verify_ms = rec->verify_ms;
    if (a->t_end > 0 && a->t_begin > 0) draft_ms = a->t_end - a->t_begin;
    a->t_begin = a->t_end = 0;
    if (tree->n <= 1) draft_ms = 0;   // nothing drafted: no information on the drafter's cost
    // draft_ms or verify_ms <= 0: not used by the cost refinement
    int rc = sd_tree_auto_observe(a->ta, tree, rec->path, rec->n_path, draft_ms > 0 ? draft_ms : -1.0,
                                  verify_ms > 0 ? verify_ms : -1.0, err, errlen);
    if (rc < 0) return -1;
    if (rc == 1) report_shape(a);
    return 0;
}

void sd_draft_auto_reset(sd_draft_auto *a) {
    if (a) a->t_begin = a->t_end = 0;
}

const sd_tree_shape *sd_draft_auto_shape(const sd_draft_auto *a) { return &a->ta->shape; }
