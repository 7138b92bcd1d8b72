#!/usr/bin/env python3
"""test_mpi_serve.py - `specdec serve --pp R` over MPI (docs/mpi.md), run
with `mpirun --oversubscribe -np R build/specdec serve ... --pp R` on
SmolLM2 on this machine:

- serve --pp 2 with 2 slots: two concurrent requests' greedy answers (with
  and without speculation) equal to generate's, both slots in one pass round
  the ring (the server's batching kept), each rank's forward time in
  /metrics; SIGTERM stops every rank;
- serve --pp 3 with micro-batches in flight (--pp-groups 3): concurrent
  clients, streamed and not, plain / n-gram / EAGLE-3, a long prompt in
  several chunks, and again with --precise-prompt: every answer equal to
  generate's, the passes in flight together (/metrics);
- serve under `mpirun -mca orte_abort_on_non_zero_status 0` with a worker rank killed while
  one answer streams and another is computed: an SSE error event and an
  HTTP 503 naming the rank, every process gone within 20 s;
- rank 0 of such a server killed (the others watch its pid) or stopped
  (its keep-alives stop: the others wait --pp-timeout + 15 s at most):
  every process gone, with a message naming the rank;

Needs build/specdec built with `make MPI=1` (make test-mpi), mpirun and
SmolLM2; skipped with the reason otherwise. Prints PASS/FAIL/SKIP lines.
Case names as arguments run only those. The generation cases:
tests/mpi/test_mpi.py.
"""
import json
import os
import signal
import subprocess
import sys
import time

from mpi_common import KEEP, SMOL, alive, chat, rank_pids, resume_and_reap, single, skip_all, start_server, stop_server
from report import exit_status, report  # noqa: E402

CASES = ["mpi_serve_equals_generate", "mpi_serve_groups", "mpi_serve_killed_rank", "mpi_serve_root_gone"]


def case_serve_groups():
    """serve --pp 3 with 3 groups in flight (--pp-groups 3): concurrent
    clients (streamed and not; plain, n-gram and EAGLE-3 speculation; a long
    prompt evaluated in several chunks), every answer equal to generate's;
    the passes were in flight together. Then with --precise-prompt, whose
    prompt passes go round the ring while groups are in flight."""
    if not os.path.exists(SMOL):
        print(f"SKIP mpi_serve_groups: {SMOL} not present (scripts/fetch-models.sh)")
        return
    import http.client
    import re
    import threading
    long_q = "Summarise this. " + " ".join(["Please answer carefully and explain your reasoning step by step."] * 25)
    spec_args = {"off": [], "ngram:3-8": ["--draft-ngram", "3,8"], "eagle3:auto": ["--head", "auto", "--method",
                                                                                    "eagle3:auto"]}
    reqs = [("Name three colours.", "ngram:3-8"), (long_q, "off"), ("Write a haiku about rain.", "eagle3:auto"),
            ("Count from 1 to 10.", "ngram:3-8"), ("What is 2+2?", "off"), ("Name a fruit.", "eagle3:auto")]
    bad = []
    for phase, extra, qs in (("", [], reqs), ("--precise-prompt: ", ["--precise-prompt"], reqs[:3])):
        p, log, port = start_server(3, ["--parallel", str(len(qs)), "--head", "auto", "--pp-groups", "3", *extra])
        try:
            if not port[0]:
                bad.append(phase + "the server did not start: " + " | ".join(log[-5:]))
                continue
            got = [None] * len(qs)

            def ask(i):
                got[i] = chat(port[0], qs[i][0], qs[i][1], 32, stream=i % 3 == 0)
            ts = [threading.Thread(target=ask, args=(i,)) for i in range(len(qs))]
            for t in ts:
                t.start()
                time.sleep(0.1)   # arrivals spread: prompts start while other groups are in flight
            for t in ts:
                t.join(400)
            for i, (q, spec) in enumerate(qs):
                want = single(["generate", "-m", SMOL, "--chat", "-p", q, "--temp", "0", "-n", "32", "-t", "1",
                               *extra, *spec_args[spec]]).stdout
                want = want[:-1] if want.endswith("\n") else want
                if got[i] != (200, want):
                    bad.append(f"{phase}{q[:40]!r} ({spec}): server {got[i]!r} vs generate {want!r}")
            c = http.client.HTTPConnection("127.0.0.1", port[0], timeout=60)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()

            def metric(name):
                mm = re.search(r"^" + re.escape(name) + r" ([0-9.]+)$", text, re.M)
                return float(mm.group(1)) if mm else -1
            busy = [metric(f'specdec_pp_ranks_busy_seconds_total{{busy="{k}"}}') for k in range(4)]
            fl = metric("specdec_pp_passes_in_flight_mean")
            print(f"  info: {phase}passes in flight {fl:.2f} on average; time with k ranks computing "
                  f"{', '.join(f'{k}: {b:.2f} s' for k, b in enumerate(busy))}")
            if metric("specdec_pp_groups") != 3 or not fl > 1.0 or min(busy) < 0:
                bad.append(phase + "the groups were not in flight together: " +
                           " | ".join(l for l in text.splitlines() if "_pp_" in l and not l.startswith("#")))
        finally:
            if stop_server(p) is None:
                bad.append(phase + "SIGTERM did not stop it")
    report("mpi_serve_groups", not bad, "\n".join(bad))


def case_serve_killed_rank():
    """mpirun -mca orte_abort_on_non_zero_status 0: a worker rank killed while rank 0 streams
    one answer and computes another; both clients get an error naming the
    rank (an error event in the stream, an HTTP 503), and every process is
    gone within 20 s."""
    if not os.path.exists(SMOL):
        print(f"SKIP mpi_serve_killed_rank: {SMOL} not present (scripts/fetch-models.sh)")
        return
    import http.client
    import threading
    # SPECDEC_MPI_KEEP: how mpirun is told to keep the job going when a rank dies (or --enable-recovery)
    keep = tuple(os.environ.get("SPECDEC_MPI_KEEP", KEEP).split())
    p, log, port = start_server(3, ["--parallel", "2"], extra=keep)
    bad, pids = [], {}
    try:
        if not port[0]:
            report("mpi_serve_killed_rank", False, "the server did not start: " + " | ".join(log[-5:]))
            return
        pids = rank_pids(p.pid)
        q = "Write a very long story about a dragon."
        plain = [None]
        t = threading.Thread(target=lambda: plain.__setitem__(0, chat(port[0], q + " And a knight.", "off", 4000)))
        t.start()
        c = http.client.HTTPConnection("127.0.0.1", port[0], timeout=120)
        body = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 4000, "stream": True}
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events, t0 = [], None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 8 and 1 in pids:   # the stream is under way: kill rank 1
                t0 = time.monotonic()
                os.kill(pids[1], signal.SIGKILL)
        t.join(60)
        errs = [json.loads(e)["error"]["message"] for e in events if e.startswith('{"error"')]
        if t0 is None:
            bad.append(f"rank 1 not found ({pids}) or the stream ended early ({len(events)} events)")
        elif not errs or "rank 1" not in errs[0] or events[-1] != "[DONE]":
            bad.append(f"the stream did not end with an error event naming rank 1: {events[-3:]}")
        if not plain[0] or plain[0][0] != 503 or "rank 1" not in plain[0][1]:
            bad.append(f"the other request did not get a 503 naming rank 1: {plain[0]}")
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            pass

        while t0 and alive(pids) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        dt = time.monotonic() - t0 if t0 else -1
        lines = [l for l in log if l.startswith("specdec:")]
        print(f"  info: every process gone {dt:.2f} s after rank 1 was killed; client saw: {errs[:1]}; "
              f"rank 0: {lines[:1]}")
        if alive(pids) or p.poll() is None or dt > 20:
            bad.append(f"processes left {alive(pids)} or mpirun still running {dt:.1f} s after the kill")
        if not any("rank 1" in l and "died" in l for l in lines):
            bad.append("no message naming rank 1 from rank 0: " + " | ".join(log[-6:]))
        # without --pp-groups: 3 groups when the host has the 3 cores the ranks need (-t 1), else 1
        want = "3 groups of slots in flight" if (os.cpu_count() or 1) >= 3 else "1 group of slots in flight: the 3 ranks"
        if not any(want in l for l in log):
            bad.append(f"the default groups: no '{want}' line: " + " | ".join(l for l in log if "pipeline" in l))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    report("mpi_serve_killed_rank", not bad, "\n".join(bad))


def case_serve_root_gone():
    """When mpirun keeps the job going after a rank dies, the other ranks
    must see rank 0 go: killed (its pid, watched by the ranks on its host),
    or stopped (an idle server's keep-alives stop: each other rank waits at
    most --pp-timeout + 15 s). Either way every process is gone, the first
    message naming rank 0; under --enable-recovery, where MPI_Abort ends only
    its caller, each rank stops on its own."""
    if not os.path.exists(SMOL):
        print(f"SKIP mpi_serve_root_gone: {SMOL} not present (scripts/fetch-models.sh)")
        return
    bad = []
    for how, sig, limit, keep in (("killed", signal.SIGKILL, 10, KEEP), ("stopped", signal.SIGSTOP, 40, KEEP),
                                  ("killed", signal.SIGKILL, 10, "--enable-recovery")):
        p, log, port = start_server(3, ["--parallel", "1", "--pp-timeout", "3"], extra=tuple(keep.split()))
        how = how if keep == KEEP else how + " (--enable-recovery)"
        pids = {}
        try:
            if not port[0]:
                bad.append(f"{how}: the server did not start: " + " | ".join(log[-5:]))
                continue
            pids = rank_pids(p.pid)
            if chat(port[0], "Name a fruit.", "off", 4)[0] != 200 or 0 not in pids:
                bad.append(f"{how}: no answer or no rank 0 ({pids})")
                continue
            time.sleep(6.5)   # idle: a keep-alive went round
            t0 = time.monotonic()
            os.kill(pids[0], sig)
            try:
                p.wait(limit + 10)
            except subprocess.TimeoutExpired:
                pass

            while alive(pids) and time.monotonic() - t0 < limit + 10:
                time.sleep(0.1)
            dt = time.monotonic() - t0
            lines = [l for l in log if l.startswith("specdec:")]
            print(f"  info: rank 0 {how}: every other process gone {dt:.2f} s later; message: {lines[:1]}")
            want = "rank 0 (pid" if how.startswith("killed") else "within 18 s (--pp-timeout + 3 keep-alives of rank 0)"
            # the first line names rank 0; others (mpirun stops the ranks with SIGTERM first, and a rank
            # may see another go meanwhile) are about the same fault
            if lines and not all("died" in l or "within" in l for l in lines):
                bad.append(f"{how}: a line about something else: {lines}")
            if alive(pids) or dt > limit or not lines or want not in lines[0]:
                bad.append(f"{how}: {dt:.1f} s, left {alive(pids)}, messages {lines[:2]}, log {log[-4:]}")
        finally:
            resume_and_reap(p, pids)
    report("mpi_serve_root_gone", not bad, "\n".join(bad))


def case_serve_equals_generate():
    if not os.path.exists(SMOL):
        print(f"SKIP mpi_serve_equals_generate: {SMOL} not present (scripts/fetch-models.sh)")
        return
    import http.client
    import re
    import threading
    # one group (--pp-groups 1): every slot in the one pass round the ring
    p, log, port = start_server(2, ["--parallel", "2", "--pp-groups", "1"])
    bad = []
    try:
        if not port[0]:
            report("mpi_serve_equals_generate", False, "the server did not start: " + " | ".join(log[-5:]))
            return
        qs = [("Name three colours.", "ngram:3-8", ["--draft-ngram", "3,8"]), ("What is the capital of France?", "off", [])]
        got = [None] * len(qs)

        def ask(i):
            q, spec, _ = qs[i]
            c = http.client.HTTPConnection("127.0.0.1", port[0], timeout=240)
            body = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 24,
                    "speculation": spec}
            c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = json.loads(r.read())
            got[i] = data["choices"][0]["message"]["content"] if r.status == 200 else data
        ts = [threading.Thread(target=ask, args=(i,)) for i in range(len(qs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        for i, (q, spec, args) in enumerate(qs):
            want = single(["generate", "-m", SMOL, "--chat", "-p", q, "--temp", "0", "-n", "24", "-t", "1", *args]).stdout
            want = want[:-1] if want.endswith("\n") else want
            if got[i] != want:
                bad.append(f"{spec}: server {got[i]!r} vs generate {want!r}")
        c = http.client.HTTPConnection("127.0.0.1", port[0], timeout=60)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        m = re.search(r'specdec_pp_rank_forward_seconds_total\{rank="1",layers="11-29"\} ([0-9.]+)', text)
        if not m or float(m.group(1)) <= 0 or "specdec_pp_network_seconds_total" not in text:
            bad.append("/metrics lacks rank 1's forward time or the network time: " +
                       " | ".join(l for l in text.splitlines() if "_pp_" in l))

        def metric(name):
            mm = re.search(r"^" + name + r" ([0-9.]+)$", text, re.M)
            return float(mm.group(1)) if mm else -1
        # the two slots went round the ring together in some passes (one
        # sd_batcher_forward_part per rank), none fell back to slot by slot
        if not metric("specdec_batch_slots_total") > metric("specdec_batch_forwards_total") > 0 or \
                metric("specdec_batch_fallbacks_total") != 0:
            bad.append("no pass of both slots, or fallbacks: " +
                       " | ".join(l for l in text.splitlines() if l.startswith("specdec_batch_")))
    finally:
        rc = stop_server(p)
    # mpirun passes SIGTERM on: rank 0's server stops (the workers ignore
    # it and end with rank 0's quit); mpirun itself exits 1 for the signal
    if rc is None or not any("specdec serve: stopped" in l for l in log):
        bad.append(f"SIGTERM: exit status {rc}; log: {' | '.join(log[-6:])}")
    report("mpi_serve_equals_generate", not bad, "\n".join(bad))


def main():
    if skip_all(CASES):
        return 0
    only = set(sys.argv[1:])   # case names to run (all by default)
    cases = [("mpi_serve_equals_generate", case_serve_equals_generate), ("mpi_serve_groups", case_serve_groups),
             ("mpi_serve_killed_rank", case_serve_killed_rank), ("mpi_serve_root_gone", case_serve_root_gone)]
    for name, fn in cases:
        if not only or name in only:
            fn()
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
