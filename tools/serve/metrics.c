// metrics.c - GET /metrics of specdec serve: the scheduler's counters
// (sv_metrics_get, a copy taken under the server's mutex) as Prometheus
// text. Runs in connection threads; touches no slot.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

char *sv_metrics_text(sv_server *s) {
    sv_metrics *mp = malloc(sizeof *mp);
    if (!mp) return NULL;
    sv_metrics_get(s, mp);
    const sv_metrics m = *mp;
    double tau = m.forwards ? m.step_tokens / (double)m.forwards : 0.0;
    // time to first token: quantiles over the most recent requests
    int nt = (int)(m.ttft_count < SV_TTFT_RING ? m.ttft_count : SV_TTFT_RING);
    double *t = mp->ttft_ring;
    qsort(t, (size_t)nt, sizeof *t, cmp_double);
    double q[3] = {0, 0, 0};
    const double qs[3] = {0.5, 0.9, 0.99};
    for (int k = 0; k < 3 && nt > 0; k++) {
        int i = (int)(qs[k] * (nt - 1) + 0.5);
        q[k] = t[i] / 1000.0;
    }
    free(mp);
    char *buf = malloc(8192);
    if (!buf) return NULL;
    snprintf(buf, 8192,
             "# HELP specdec_requests_total Generation requests finished, by result.\n"
             "# TYPE specdec_requests_total counter\n"
             "specdec_requests_total{result=\"ok\"} %ld\n"
             "specdec_requests_total{result=\"error\"} %ld\n"
             "specdec_requests_total{result=\"rejected\"} %ld\n"
             "# HELP specdec_prompt_tokens_total Prompt tokens of finished requests.\n"
             "# TYPE specdec_prompt_tokens_total counter\n"
             "specdec_prompt_tokens_total %ld\n"
             "# HELP specdec_prompt_tokens_cached_total Prompt tokens reused from a slot's KV cache (not evaluated).\n"
             "# TYPE specdec_prompt_tokens_cached_total counter\n"
             "specdec_prompt_tokens_cached_total %ld\n"
             "# HELP specdec_generated_tokens_total Completion tokens generated.\n"
             "# TYPE specdec_generated_tokens_total counter\n"
             "specdec_generated_tokens_total %ld\n"
             "# HELP specdec_slots_busy Slots serving a request now.\n"
             "# TYPE specdec_slots_busy gauge\n"
             "specdec_slots_busy %d\n"
             "# HELP specdec_slots Slots (--parallel).\n"
             "# TYPE specdec_slots gauge\n"
             "specdec_slots %d\n"
             "# HELP specdec_queue_length Requests waiting for a slot.\n"
             "# TYPE specdec_queue_length gauge\n"
             "specdec_queue_length %d\n"
             "# HELP specdec_draft_tokens_total Draft tokens proposed (tree nodes, roots excluded).\n"
             "# TYPE specdec_draft_tokens_total counter\n"
             "specdec_draft_tokens_total %ld\n"
             "# HELP specdec_draft_accepted_total Draft tokens accepted.\n"
             "# TYPE specdec_draft_accepted_total counter\n"
             "specdec_draft_accepted_total %ld\n"
             "# HELP specdec_target_forwards_total Target forwards of generation steps.\n"
             "# TYPE specdec_target_forwards_total counter\n"
             "specdec_target_forwards_total %ld\n"
             "# HELP specdec_tau Tokens emitted per target forward over all finished requests (bonus included).\n"
             "# TYPE specdec_tau gauge\n"
             "specdec_tau %.4f\n"
             "# HELP specdec_emitted_tokens_total Tokens emitted by generation steps (live, running requests included).\n"
             "# TYPE specdec_emitted_tokens_total counter\n"
             "specdec_emitted_tokens_total %ld\n"
             "# HELP specdec_tokens_per_second Tokens emitted per second, all slots together, over the last second or so.\n"
             "# TYPE specdec_tokens_per_second gauge\n"
             "specdec_tokens_per_second %.2f\n"
             "# HELP specdec_batch_forwards_total Target passes of generation steps (one pass evaluates the batches of "
             "several slots together).\n"
             "# TYPE specdec_batch_forwards_total counter\n"
             "specdec_batch_forwards_total %ld\n"
             "# HELP specdec_batch_rows_total Batch nodes (rows) evaluated by those passes.\n"
             "# TYPE specdec_batch_rows_total counter\n"
             "specdec_batch_rows_total %ld\n"
             "# HELP specdec_batch_slots_total Slot batches evaluated by those passes.\n"
             "# TYPE specdec_batch_slots_total counter\n"
             "specdec_batch_slots_total %ld\n"
             "# HELP specdec_batch_rows_per_forward Mean rows per target pass.\n"
             "# TYPE specdec_batch_rows_per_forward gauge\n"
             "specdec_batch_rows_per_forward %.3f\n"
             "# HELP specdec_batch_slots_per_forward Mean slots per target pass.\n"
             "# TYPE specdec_batch_slots_per_forward gauge\n"
             "specdec_batch_slots_per_forward %.3f\n"
             "# HELP specdec_batch_fallbacks_total Batched passes that failed and were redone slot by slot.\n"
             "# TYPE specdec_batch_fallbacks_total counter\n"
             "specdec_batch_fallbacks_total %ld\n"
             "# HELP specdec_draft_budget_withheld_total Draft nodes the draft budget withheld from busy passes.\n"
             "# TYPE specdec_draft_budget_withheld_total counter\n"
             "specdec_draft_budget_withheld_total %ld\n"
             "# HELP specdec_batch_forward_seconds_total Wall time in the step passes (the target's forwards).\n"
             "# TYPE specdec_batch_forward_seconds_total counter\n"
             "specdec_batch_forward_seconds_total %.3f\n"
             "# HELP specdec_prefill_seconds_total Wall time evaluating prompts.\n"
             "# TYPE specdec_prefill_seconds_total counter\n"
             "specdec_prefill_seconds_total %.3f\n"
             "# HELP specdec_round_seconds_total Wall time in rounds: drafting, passes, verification, emitting.\n"
             "# TYPE specdec_round_seconds_total counter\n"
             "specdec_round_seconds_total %.3f\n"
             "# HELP specdec_prefill_chunks_total Prompt chunks evaluated between rounds.\n"
             "# TYPE specdec_prefill_chunks_total counter\n"
             "specdec_prefill_chunks_total %ld\n"
             "# HELP specdec_time_to_first_token_seconds Submission to first token; quantiles over the last %d requests.\n"
             "# TYPE specdec_time_to_first_token_seconds summary\n"
             "specdec_time_to_first_token_seconds{quantile=\"0.5\"} %.4f\n"
             "specdec_time_to_first_token_seconds{quantile=\"0.9\"} %.4f\n"
             "specdec_time_to_first_token_seconds{quantile=\"0.99\"} %.4f\n"
             "specdec_time_to_first_token_seconds_sum %.4f\n"
             "specdec_time_to_first_token_seconds_count %ld\n",
             m.requests_ok, m.requests_error, m.rejected_queue_full, m.prompt_tokens, m.prompt_tokens_cached,
             m.generated_tokens, m.busy_slots, m.n_slots, m.queued, m.drafted, m.accepted, m.forwards, tau,
             m.emitted_tokens, m.tps, m.pass_forwards, m.pass_rows, m.pass_slots,
             m.pass_forwards ? (double)m.pass_rows / m.pass_forwards : 0.0,
             m.pass_forwards ? (double)m.pass_slots / m.pass_forwards : 0.0, m.pass_fallbacks, m.budget_cut,
             m.pass_ms / 1000.0,
             m.prefill_ms / 1000.0, m.round_ms / 1000.0, m.prefill_chunks,
             SV_TTFT_RING, q[0], q[1], q[2], m.ttft_sum_ms / 1000.0, m.ttft_count);
    if (s->metrics_extra) {   // a pipeline's per-rank time (docs/mpi.md)
        const size_t used = strlen(buf);
        s->metrics_extra(buf + used, 8192 - used);
    }
    return buf;
}
