// method_plan.c - what a parsed method needs and how many rows its steps
// take (sd_method_plan_make), and the default method for what is loaded
// (sd_method_default): the facts every program used to re-derive from the
// method string (include/specdec_spec.h).
#include <string.h>

#include "common.h"
#include "specdec.h"
#include "specdec_spec.h"

const char *sd_method_default(const sd_method_have *h) {
    // With an EAGLE-3 head: prompt lookup where the text repeats, else the
    // head's automatic tree (the best of the head's methods over the 37 dev
    // prompts, docs/performance.md); with draft models: their chain; else
    // prompt lookup. A Medusa head needs its widths (medusa:W1-W2-...).
    // With a datastore the lookup finds a continuation nearly every step;
    // its sized tree (:auto) drafts only where the match is worth a forward,
    // leaving the other steps to the head; matches of up to 5 tokens pick
    // its continuations (1.02-1.05x the speed with 3 in four runs;
    // docs/performance.md, "Methods on SmolLM2-135M").
    if (h && h->eagle3_head) return h->datastore ? "ngram:5-8:auto/eagle3:auto" : "ngram:3-8/eagle3:auto";
    if (h && h->moa_head) return h->datastore ? "ngram:5-8:auto/moa:auto" : "ngram:3-8/moa:auto";
    if (h && h->n_drafts > 0) return "chain:4";
    return "ngram:3-8";
}

// The parts of m ('+' merged, '/' first-that-drafts), each parsed, folded
// into p: draft-model trees, n-gram lookup, nodes merged.
static void scan_parts(const sd_method *m, const sd_method_have *h, int auto_nodes, sd_method_plan *p) {
    char s[SD_METHOD_NAME_MAX], err[256];
    snprintf(s, sizeof s, "%s", m->name);
    const int first = m->kind == SD_METHOD_FIRST;   // one part's tree a step
    int model_extra = -1, extra = 0;   // nodes beyond the root: of the draft-model trees (-1: none), of all
    char *save = NULL;
    for (char *part = strtok_r(s, "+/", &save); part; part = strtok_r(NULL, "+/", &save)) {
        sd_method pm;
        if (sd_method_parse(part, &pm, err, sizeof err) < 0) continue;   // (the whole string parsed)
        const int auto_model = pm.kind == SD_METHOD_AUTO && (h->eagle3_head || h->moa_head || h->n_drafts > 0);
        const int model = pm.kind == SD_METHOD_MODEL || pm.kind == SD_METHOD_EAGLE3 || pm.kind == SD_METHOD_MOA ||
                          auto_model;
        const int nodes = pm.uses_cost_curve ? SD_MIN(pm.tree_nodes, auto_nodes) : pm.tree_nodes;
        int merged = sd_method_default_nodes(&pm, h->n_drafts);   // one tree per draft model
        if (pm.uses_cost_curve && !model) merged = SD_MIN(merged, auto_nodes);
        // auto takes the draft models when there are some (a head's tree otherwise), prompt lookup without
        p->uses_drafts |= pm.kind == SD_METHOD_MODEL || pm.kind == SD_METHOD_AUTO;
        p->uses_ngram |= pm.kind == SD_METHOD_NGRAM || (pm.kind == SD_METHOD_AUTO && !h->n_drafts);
        if (model) model_extra = first ? SD_MAX(model_extra, nodes - 1) : SD_MAX(model_extra, 0) + nodes - 1;
        extra = first ? SD_MAX(extra, merged - 1) : extra + merged - 1;
    }
    p->model_nodes = model_extra < 0 ? 0 : 1 + model_extra;
    p->total_nodes = 1 + extra;
}

int sd_method_plan_make(const sd_method *m, const sd_method_have *h, sd_method_plan *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    const sd_method_have none = {0};
    if (!h) h = &none;
    const int n_batch = h->n_batch > 0 ? h->n_batch : 512;
    if (h->max_nodes < 0 || h->max_nodes == 1)
        return sd_err(err, errlen, "a tree needs at least 2 nodes (root included), got a limit of %d", h->max_nodes);
    if (h->max_nodes > n_batch)
        return sd_err(err, errlen, "a limit of %d nodes is more than the batch size (%d)", h->max_nodes, n_batch);
    p->spec = m->kind != SD_METHOD_AR;
    p->needs_head = m->needs_head;
    p->uses_cost_curve = m->uses_cost_curve;
    if (!p->spec) {
        p->max_nodes = p->step_rows = 1;
        return 0;
    }
    if (m->needs_draft_model && h->n_drafts <= 0)
        return sd_err(err, errlen, "method '%s' needs a draft model", m->name);
    if (m->needs_head == SD_HEAD_EAGLE3 && !h->eagle3_head)
        return sd_err(err, errlen, "method '%s' needs an EAGLE-3 head", m->name);
    if (m->needs_head == SD_HEAD_MEDUSA && !h->medusa_head)
        return sd_err(err, errlen, "method '%s' needs a Medusa head", m->name);
    if (m->needs_head == SD_HEAD_MOA && !h->moa_head)
        return sd_err(err, errlen, "method '%s' needs an MoA drafter", m->name);
    p->auto_nodes = h->max_nodes > 0 ? SD_MIN(h->max_nodes, SD_METHOD_AUTO_NODES) : SD_METHOD_AUTO_NODES;
    scan_parts(m, h, p->auto_nodes, p);
    if (!m->uses_cost_curve) p->auto_nodes = 0;
    if (m->kind == SD_METHOD_SKIP || m->kind == SD_METHOD_LOOKAHEAD) {   // drafting alone, beside a window
        const int nodes = m->tree_nodes;
        p->max_nodes = h->max_nodes > 0 ? h->max_nodes : SD_MIN(nodes, n_batch);
        if (nodes + m->extra_nodes > n_batch)
            return sd_errc(SD_ERR_NO_ROOM, err, errlen, "method '%s': %d tree nodes and %d window nodes per step do not fit the batch "
                          "size (%d)", m->name, nodes, m->extra_nodes, n_batch);
        p->step_rows = p->max_nodes + m->extra_nodes;
        return 0;
    }
    // A draft model's tree must fit; an n-gram tree is a most and is cut to the limit.
    const int nodes = p->model_nodes ? p->model_nodes : 2;
    p->max_nodes = h->max_nodes > 0 ? h->max_nodes : SD_MIN(p->total_nodes, n_batch);   // room for every tree merged
    p->step_rows = p->max_nodes + m->extra_nodes;
    if (h->max_nodes > 0 && nodes > h->max_nodes)
        return sd_errc(SD_ERR_NO_ROOM, err, errlen, "method '%s': the tree has %d nodes (root included), more than "
                       "the limit of %d", m->name, nodes, h->max_nodes);
    if (nodes > n_batch)
        return sd_errc(SD_ERR_NO_ROOM, err, errlen, "method '%s': the tree has %d nodes (root included), more than the "
                       "batch size (%d)", m->name, nodes, n_batch);
    return 0;
}
