#!/usr/bin/env python3
"""test_mpi.py - the pipeline-parallel target over MPI (docs/mpi.md), run with
`mpirun --oversubscribe -np R build/specdec ... --pp R` on this machine:

- greedy text bit-identical to one process for R = 2 and 3 and a --layers
  split, with plain decoding, a draft tree (tree:2-2-1, the target itself as
  its draft model, so paths of several nodes are committed) and an EAGLE-3
  head (a random one on the synthetic model, the shipped one on SmolLM2,
  whose extract layers lie on every rank), on a synthetic model and on
  SmolLM2;
- bench --pp: every method's text equal to plain decoding's (equal_to_ar);
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
- bad launches refused on every rank with one message and a non-zero exit:
  fewer ranks than --pp asks, --layers not covering the layers, more ranks
  than layers, different model files on different ranks;
- a rank killed (SIGKILL) mid-generation stops every process within 20 s
  with a message naming the rank, and nothing hangs;
- a rank stuck (SIGSTOP) mid-generation: rank 0 stops every process once
  --pp-timeout (3 s here) passes without an answer, with one message;
- rank 0 of a generation stopped (SIGSTOP, as if its host had gone): the
  other ranks stop every process after --pp-timeout + 15 s of silence,
  naming rank 0;
- each rank's weights at most 1/R of the model's plus 10%, and its peak
  resident memory against one process's (--pp-stats);
- layer skipping (skip:L1-L2-..., the target's own layers as the drafter)
  under --pp 2 and 3: the text and the drafter's counts (forwards, drafted
  and accepted nodes) equal to one process's, so the draft session's
  forwards round the ring give the same bits too; with layers skipped on
  every rank, all of a rank's layers skipped, a shorter chain (--max-nodes), mixed with
  n-gram lookup; bench's runs (a drafter made and freed per prompt) equal
  to plain decoding's; serve --pp 2 answering a skip: request as generate
  does; skip:auto's search refused under --pp with a message saying what
  to do, a set saved in a file (--load-skip) taken.

Needs build/specdec built with `make MPI=1` (make test-mpi) and mpirun;
skipped with the reason otherwise. Prints PASS/FAIL/SKIP lines. Case names
as arguments run only those.
"""
import json
import os
import resource  # noqa: F401  (os.wait4's rusage)
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402

BIN = os.path.abspath(os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec")))
SYNTH = os.path.join(ROOT, "build", "tests", "tool_synth_model")
RHEAD = os.path.join(ROOT, "build", "tests", "tool_random_head")
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
CASES = ["mpi_greedy_synth", "mpi_greedy_smollm", "mpi_bench_equal", "mpi_serve_equals_generate", "mpi_serve_groups",
         "mpi_serve_killed_rank", "mpi_serve_root_gone", "mpi_bad_launches", "mpi_killed_rank", "mpi_stuck_rank", "mpi_rank_memory",
         "mpi_skip", "mpi_root_stopped"]
KEEP = "-mca orte_abort_on_non_zero_status 0"   # mpirun keeps the job going when a rank dies (docs/mpi.md)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def mpirun(n, args, timeout=240, extra=()):
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), *extra, BIN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)


def single(args, timeout=240):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def why_skip():
    if not os.path.exists(BIN):
        return f"{BIN} not built"
    if subprocess.run(["which", "mpirun"], capture_output=True).returncode != 0:
        return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    r = single(["generate", "--pp", "1", "-m", "/nonexistent"])
    if "built without MPI" in r.stderr:
        return "build/specdec was built without MPI (make MPI=1, or make test-mpi)"
    if not os.path.exists(SYNTH) or not os.path.exists(RHEAD):
        return "build/tests/tool_synth_model or tool_random_head not built (make test-mpi)"
    return None


def compare(name, model, prompt, methods, splits, n, extra=()):
    """Greedy text of every method on one process, then under each split; a
    list of failures."""
    bad = []
    base = ["generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1", "-c", "512", *extra]
    for label, margs in methods:
        ref = single(base + margs)
        if ref.returncode != 0 or not ref.stdout.strip():
            bad.append(f"{name}/{label}: one process failed: {ref.stderr.strip()[-300:]}")
            continue
        for ranks, split in splits:
            r = mpirun(ranks, base + margs + split)
            if r.returncode != 0:
                bad.append(f"{name}/{label} {' '.join(split)}: rc {r.returncode}: {r.stderr.strip()[-300:]}")
            elif r.stdout != ref.stdout:
                bad.append(f"{name}/{label} {' '.join(split)}: the text differs from one process's:\n"
                           f"  one:  {ref.stdout[:160]!r}\n  pipe: {r.stdout[:160]!r}")
    return bad


def case_greedy_synth(tmp):
    model, head = os.path.join(tmp, "s6.gguf"), os.path.join(tmp, "h6.gguf")
    subprocess.run([SYNTH, model, "6"], check=True)
    subprocess.run([RHEAD, model, head, "eagle3"], check=True)
    methods = [("ar", []), ("tree", ["--draft", model, "--method", "tree:2-2-1"]),
               ("eagle3", ["--head", head, "--method", "eagle3:auto"])]
    # --pp-wait: the waits' polling never changes the text
    splits = [(2, ["--pp", "2"]), (3, ["--pp", "3"]), (3, ["--layers", "1,2,3"]), (2, ["--pp", "2", "--pp-wait", "sleep"]),
              (3, ["--pp", "3", "--pp-wait", "spin"])]
    bad = compare("synth", model, "w1 w2 w3 w4", methods, splits, 40)
    report("mpi_greedy_synth", not bad, "\n".join(bad))


def case_greedy_smollm():
    if not os.path.exists(SMOL):
        print(f"SKIP mpi_greedy_smollm: {SMOL} not present (scripts/fetch-models.sh)")
        return
    methods = [("ar", []), ("tree", ["--draft", SMOL, "--method", "tree:2-2-1"]), ("eagle3", ["--head", "auto",
                                                                                               "--method", "eagle3:auto"])]
    splits = [(2, ["--pp", "2"]), (3, ["--pp", "3"])]
    bad = compare("smollm", SMOL, "Name three colours.", methods, splits, 24, extra=("--chat",))
    report("mpi_greedy_smollm", not bad, "\n".join(bad))


# layers on every rank of --pp 2 (0-10 | 11-29) and --pp 3 (0-4 | 5-16 | 17-29)
SKIPS = "3-4-9-10-16-17-20-25"


def gen_stats(r):
    """generate --json's figures that a drafter's forwards decide."""
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return {k: d.get(k) for k in ("text", "n_target_forwards", "n_draft_nodes", "n_draft_accepted")}


def case_skip(tmp):
    if not os.path.exists(SMOL):
        print(f"SKIP mpi_skip: {SMOL} not present (scripts/fetch-models.sh)")
        return
    bad = []
    base = ["generate", "-m", SMOL, "--chat", "-p", "Name three colours and say why.", "-n", "40", "--temp", "0",
            "-t", "1", "-c", "512", "--json"]
    methods = [("skip", ["--method", f"skip:{SKIPS}"]),   # the method's default: a chain of up to 8, adaptive p_min
               ("rank 0's layers all skipped", ["--method", "skip:0-1-2-3-4-12"]),
               ("--draft-skip, 4 nodes a step", ["--draft-skip", "3,4,9,10,20", "--max-nodes", "4"]),
               ("n-gram, else skip", ["--method", f"ngram:3-8/skip:{SKIPS}"])]
    for label, margs in methods:
        ref = single(base + margs)
        want = gen_stats(ref)
        if ref.returncode != 0 or not want or not want["n_draft_nodes"]:
            bad.append(f"{label}: one process failed or drafted nothing: {ref.stderr.strip()[-300:]} {want}")
            continue
        for R in (2, 3):
            r = mpirun(R, base + margs + ["--pp", str(R)])
            got = gen_stats(r)
            if r.returncode != 0 or got != want:
                bad.append(f"{label} --pp {R}: rc {r.returncode}, {got} against one process's {want}: "
                           f"{r.stderr.strip()[-300:]}")
    # skip:auto searches every layer's cost: refused, saying what to do
    r = mpirun(2, base + ["--method", "skip:auto", "--pp", "2"])
    if r.returncode == 0 or "search in one process" not in r.stderr:
        bad.append(f"skip:auto under --pp 2: rc {r.returncode}, {r.stderr.strip()[-300:]}")
    # ... but a saved set (--load-skip) is read, not searched
    import re
    sk = os.path.join(tmp, "set.skip")
    name = "?"
    for _ in range(2):   # the model's name as the file must give it: from the refusal of a wrong one
        with open(sk, "w") as f:
            f.write(f"specdec-skip 1\nmodel {name}\nn_layer 30\nskip 3,4,9,10,16,17,20,25\n")
        margs = ["--draft-skip", "auto", "--load-skip", sk]
        ref = single(base + margs)
        m = re.search(r"this model is '([^']*)'", ref.stderr)
        if not m:
            break
        name = m.group(1)
    want = gen_stats(ref)
    r = mpirun(2, base + margs + ["--pp", "2"])
    if ref.returncode != 0 or not want or gen_stats(r) != want:
        bad.append(f"--load-skip under --pp 2: rc {ref.returncode}/{r.returncode}, {gen_stats(r)} against {want}: "
                   f"{(ref.stderr + r.stderr).strip()[-300:]}")
    # bench: a fresh drafter (its session made and freed on every rank) per prompt and run
    prompts = os.path.join(tmp, "skip.jsonl")
    with open(prompts, "w") as f:
        for i, q in enumerate(["Name three colours.", "Count from one to ten.", "What is a cat?"]):
            f.write(json.dumps({"question_id": i, "category": "t", "turns": [q]}) + "\n")
    outs = {}
    for R in (1, 2):
        out = os.path.join(tmp, f"skip{R}.json")
        args = ["bench", "-m", SMOL, "--prompts", prompts, "-n", "24", "-t", "1", "--methods", f"ar,skip:{SKIPS}",
                "--out", out]
        r = single(args) if R == 1 else mpirun(R, args + ["--pp", str(R)])
        if r.returncode != 0:
            bad.append(f"bench R={R}: rc {r.returncode}: {r.stderr.strip()[-300:]}")
            continue
        res = json.load(open(out))
        outs[R] = [(m["name"], m["overall"]["n_target_forwards"], m["overall"]["tau"]) for m in res["methods"]]
        if not res.get("all_equal_to_ar"):
            bad.append(f"bench R={R}: a text differs from plain decoding's")
    if len(outs) == 2 and outs[1] != outs[2]:
        bad.append(f"bench: forwards and tau under --pp 2 {outs[2]} against one process's {outs[1]}")
    # serve --pp 2: a skip: request answered as generate answers it
    p, log, port = start_server(2, ["--parallel", "2"])
    try:
        if not port[0]:
            bad.append("serve --pp 2 did not start: " + " | ".join(log[-5:]))
        else:
            q = "Name three colours."
            want = single(["generate", "-m", SMOL, "--chat", "-p", q, "--temp", "0", "-n", "24", "-t", "1",
                           "--method", f"skip:{SKIPS}"]).stdout.rstrip("\n")
            st, text = chat(port[0], q, f"skip:{SKIPS}", 24)
            if st != 200 or text != want:
                bad.append(f"serve --pp 2, skip: {st} {text!r} against generate's {want!r}")
    finally:
        stop_server(p)
    report("mpi_skip", not bad, "\n".join(bad))


def case_bench_equal(tmp):
    model = os.path.join(tmp, "s6.gguf")
    prompts = os.path.join(tmp, "p.jsonl")
    with open(prompts, "w") as f:
        for i in range(2):
            f.write(json.dumps({"question_id": i, "category": "t", "turns": [f"w{i + 3} w{i + 7} w9"]}) + "\n")
    out = os.path.join(tmp, "bench.json")
    r = mpirun(3, ["bench", "-m", model, "--prompts", prompts, "--no-chat", "-n", "24", "-t", "1",
                   "--methods", "ar,tree:2-2-1", "--draft", model, "--out", out, "--pp", "3"])
    if r.returncode != 0:
        report("mpi_bench_equal", False, f"rc {r.returncode}: {r.stderr.strip()[-400:]}")
        return
    text = open(out).read()
    ok = '"equal_to_ar": false' not in text and '"equal_to_ar": true' in text
    report("mpi_bench_equal", ok, f"a method's text differs from ar's under --pp 3:\n{text[:600]}")


def start_server(R, args, extra=()):
    """mpirun -np R serve --pp R on SmolLM2: (process, its stderr lines so far, [port or None])."""
    import re
    import threading
    cmd = ["mpirun", "--oversubscribe", *extra, "-np", str(R), BIN, "serve", "-m", SMOL, "--port", "0", "-t", "1",
           "--pp", str(R), *args]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    log, port, ready = [], [None], threading.Event()

    def drain():
        for line in p.stderr:
            log.append(line.rstrip("\n"))
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port[0] = int(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    ready.wait(120)
    return p, log, port


def stop_server(p):
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None


def chat(port, q, spec, n, stream=False, timeout=300):
    """One chat completion: (status, text or error message)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": n, "speculation": spec,
            "stream": stream}
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        data = json.loads(r.read())
        return r.status, (data["choices"][0]["message"]["content"] if r.status == 200 else data["error"]["message"])
    text, error = "", None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            error = ev["error"]["message"]
        else:
            text += ev["choices"][0]["delta"].get("content") or ""
    return (r.status if error is None else 500), (text if error is None else error)


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


def one_message(r, want):
    """The launch was refused: non-zero exit, one specdec line naming want."""
    lines = [l for l in r.stderr.splitlines() if l.startswith("specdec:")]
    if r.returncode == 0:
        return "exit status 0"
    if len(lines) != 1:
        return f"{len(lines)} specdec lines, expected 1: {r.stderr.strip()[-400:]}"
    if want not in lines[0]:
        return f"the message lacks '{want}': {lines[0]}"
    return None


def case_bad_launches(tmp):
    model, other = os.path.join(tmp, "s6.gguf"), os.path.join(tmp, "s6b.gguf")
    subprocess.run([SYNTH, other, "6", "llama", "77"], check=True)
    gen = ["generate", "-p", "w1", "-n", "4", "-t", "1"]
    bad = []
    checks = [
        ("ranks", mpirun(2, gen + ["-m", model, "--pp", "3"], timeout=60), "asks for 3 ranks but mpirun started 2"),
        ("coverage", mpirun(3, gen + ["-m", model, "--layers", "1,2,2"], timeout=60), "covers 5 layers, but the model has 6"),
        ("too many", mpirun(8, gen + ["-m", model, "--pp", "8"], timeout=90), "8 ranks for a model of 6 layers"),
        ("no --pp", mpirun(2, gen + ["-m", model], timeout=60), "without --pp"),
        ("--pp-wait", mpirun(2, gen + ["-m", model, "--pp", "2", "--pp-wait", "fast"], timeout=60),
         "--pp-wait takes auto, spin or sleep, got 'fast'"),
    ]
    # different files on different ranks: MPMD launch, one file per rank
    cmd = ["mpirun", "--oversubscribe", "-np", "1", BIN, *gen, "-m", model, "--pp", "2", ":",
           "-np", "1", BIN, *gen, "-m", other, "--pp", "2"]
    checks.append(("files", subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT),
                   "the model files differ between ranks"))
    for label, r, want in checks:
        w = one_message(r, want)
        if w:
            bad.append(f"{label}: {w}")
    report("mpi_bad_launches", not bad, "\n".join(bad))


def alive(pids):
    """The ranks of {rank: pid} whose process still runs (not a zombie, not gone)."""
    out = []
    for r, pid in pids.items():
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
                out.append(r)
        except OSError:
            pass
    return out


def rank_pids(mpirun_pid):
    """{rank: pid} of mpirun's children."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"OMPI_COMM_WORLD_RANK" in env:
                out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(d)
        except (OSError, ValueError, IndexError):
            continue
    return out


def start_long(tmp, extra=()):
    """mpirun -np 3 generate of a long text, stdout under way; (process, {rank: pid}) or (process, None)."""
    model = SMOL if os.path.exists(SMOL) else os.path.join(tmp, "s6.gguf")
    chat = ["--chat"] if model == SMOL else []
    cmd = ["mpirun", "--oversubscribe", "-np", "3", BIN, "generate", "-m", model, *chat, "-p",
           "Write a very long story about a dragon.", "-n", "0", "-c", "2048", "-t", "1", "--pp", "3", *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    first = p.stdout.read(8)
    pids = {}
    for _ in range(50):
        pids = rank_pids(p.pid)
        if len(pids) == 3:
            break
        time.sleep(0.1)
    return p, (pids if first and len(pids) == 3 else None)


def stop_rank(p, pids, k, wait_s):
    """Stops rank k (SIGSTOP), waits for mpirun and every rank to end (at most
    wait_s); (seconds until all were gone, their specdec: lines, stderr)."""
    t0 = time.monotonic()
    os.kill(pids[k], signal.SIGSTOP)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        err = b""
    while alive(pids) and time.monotonic() - t0 < wait_s:
        time.sleep(0.1)
    err = err.decode(errors="replace")
    return time.monotonic() - t0, [l for l in err.splitlines() if l.startswith("specdec:")], err


def resume_and_reap(p, pids):
    for pid in (pids or {}).values():
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    if p.poll() is None:
        p.kill()
        p.wait()


def case_root_stopped(tmp):
    """Rank 0 of a generation stopped (SIGSTOP; as if its host were gone,
    where no rank watches its pid): the others hear nothing for
    --pp-timeout + 15 s and stop every process, naming rank 0."""
    p, pids = start_long(tmp, ("--pp-timeout", "2"))
    bad = []
    try:
        if not pids:
            report("mpi_root_stopped", False, f"the generation did not start: {p.stderr.read().decode()[-300:]}")
            return
        dt, lines, _ = stop_rank(p, pids, 0, 60)
        print(f"  info: rank 0 stopped: every process gone {dt:.2f} s later; message: {lines[:1]}")
        if alive(pids) or dt > 40 or not lines or "nothing from rank 0 within 17 s" not in lines[0]:
            bad.append(f"{dt:.1f} s, left {alive(pids)}, messages {lines[:2]}")
    finally:
        resume_and_reap(p, pids)
    report("mpi_root_stopped", not bad, "\n".join(bad))


def case_stuck_rank(tmp):
    p, pids = start_long(tmp, ("--pp-timeout", "3"))
    try:
        if not pids:
            report("mpi_stuck_rank", False, "the ranks were not found or nothing was generated")
            return
        dt, lines, err = stop_rank(p, pids, 1, 30)
        if p.poll() is None:
            report("mpi_stuck_rank", False, "mpirun still runs 60 s after rank 1 was stopped")
            return
        gone = not alive(pids)
        print(f"  info: every process stopped {dt:.2f} s after rank 1 was stopped; message: {lines[:1]}")
        report("mpi_stuck_rank", dt < 20 and gone and len(lines) == 1 and "no answer from ranks 1..2 within 3 s" in lines[0],
               f"after {dt:.1f} s, all gone {gone}, stderr: {err.strip()[-500:]}")
    finally:
        resume_and_reap(p, pids)


def case_killed_rank(tmp):
    model = SMOL if os.path.exists(SMOL) else os.path.join(tmp, "s6.gguf")
    # a long generation (SmolLM2: a story of hundreds of tokens; the
    # synthetic model never ends, -n 0 runs to the full context)
    chat = ["--chat"] if model == SMOL else []
    cmd = ["mpirun", "--oversubscribe", "-np", "3", BIN, "generate", "-m", model, *chat, "-p",
           "Write a very long story about a dragon.", "-n", "0", "-c", "2048", "-t", "1", "--pp", "3"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    try:
        os.set_blocking(p.stdout.fileno(), True)
        first = p.stdout.read(8)   # generation under way: the ring is busy
        pids = {}
        for _ in range(50):
            pids = rank_pids(p.pid)
            if len(pids) == 3:
                break
            time.sleep(0.1)
        if 1 not in pids or not first:
            report("mpi_killed_rank", False, f"no rank 1 found among mpirun's children ({pids}) or no output")
            return
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            report("mpi_killed_rank", False, "mpirun still runs 60 s after rank 1 was killed")
            return
        err = err.decode(errors="replace")

        left = alive(pids)
        while left and time.monotonic() - t0 < 30:
            time.sleep(0.1)
            left = alive(pids)
        dt = time.monotonic() - t0
        ok = dt < 20 and p.returncode != 0 and "rank 1" in err and not left
        print(f"  info: every process stopped {dt:.2f} s after rank 1 was killed (rc {p.returncode}); message: "
              f"{[l for l in err.splitlines() if 'rank 1' in l][:1]}")
        report("mpi_killed_rank", ok, f"stopped after {dt:.1f} s, rc {p.returncode}, ranks left {left}, "
                                      f"stderr: {err.strip()[-500:]}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def case_rank_memory():
    if not os.path.exists(SMOL):
        print(f"SKIP mpi_rank_memory: {SMOL} not present (scripts/fetch-models.sh)")
        return
    args = ["generate", "-m", SMOL, "-p", "Once upon a time", "-n", "16", "--temp", "0", "-t", "1", "-c", "1024"]
    p = subprocess.Popen([BIN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    _, _, ru = os.wait4(p.pid, 0)
    one = ru.ru_maxrss / 1024.0
    bad = []
    for R in (2, 3):
        r = mpirun(R, args + ["--pp", str(R), "--pp-stats"])
        line = [l for l in r.stderr.splitlines() if l.startswith('{"pp"')]
        if r.returncode != 0 or not line:
            bad.append(f"R={R}: rc {r.returncode}, no stats: {r.stderr.strip()[-300:]}")
            continue
        st = json.loads(line[0])["pp"]
        hwm = [x["hwm_mib"] for x in st["per_rank"]]
        # the weights each rank holds: at most 1/R of the model's plus 10%
        wlim = st["weights_mib"] / R + 0.10 * st["weights_mib"]
        for x in st["per_rank"]:
            if not 0 < x["weights_mib"] <= wlim:
                bad.append(f"R={R}: rank {x['rank']} holds {x['weights_mib']} MiB of weights, over {wlim:.1f} "
                           f"({st['weights_mib']} / {R} + 10%)")
        print(f"  info: weights {st['weights_mib']} MiB; R={R}: held " +
              ", ".join(f"rank {x['rank']} {x['weights_mib']} MiB" for x in st["per_rank"]))
        print(f"  info: peak RSS one process {one:.1f} MiB; R={R}: " +
              ", ".join(f"rank {x['rank']} layers {x['layers']} {x['hwm_mib']:.1f} MiB" for x in st["per_rank"]))
        # each rank well under one process (MPI's own libraries and buffers
        # add about 25 MiB to every process, a fixed cost the goal's 1/R of
        # the weights does not count: docs/mpi.md)
        limit = one / R + 0.10 * one + 30
        for k, h in enumerate(hwm):
            if h > limit:
                bad.append(f"R={R}: rank {k} peaks at {h:.1f} MiB, over {limit:.1f} (one process {one:.1f} / {R} + 10% + 30 MiB)")
    report("mpi_rank_memory", not bad, "\n".join(bad))


def main():
    why = why_skip()
    if why:
        for c in CASES:
            print(f"SKIP {c}: {why}")
        return 0
    only = set(sys.argv[1:])   # case names to run (all by default)
    with tempfile.TemporaryDirectory(prefix="specdec_mpi_") as tmp:
        if not only or only & {"mpi_greedy_synth", "mpi_bench_equal", "mpi_bad_launches", "mpi_killed_rank",
                               "mpi_stuck_rank", "mpi_root_stopped"}:
            subprocess.run([SYNTH, os.path.join(tmp, "s6.gguf"), "6"], check=True)
        cases = [("mpi_greedy_synth", lambda: case_greedy_synth(tmp)), ("mpi_greedy_smollm", case_greedy_smollm),
                 ("mpi_bench_equal", lambda: case_bench_equal(tmp)),
                 ("mpi_serve_equals_generate", case_serve_equals_generate), ("mpi_serve_groups", case_serve_groups),
                 ("mpi_serve_killed_rank", case_serve_killed_rank), ("mpi_serve_root_gone", case_serve_root_gone),
                 ("mpi_bad_launches", lambda: case_bad_launches(tmp)),
                 ("mpi_killed_rank", lambda: case_killed_rank(tmp)), ("mpi_stuck_rank", lambda: case_stuck_rank(tmp)),
                 ("mpi_rank_memory", case_rank_memory), ("mpi_skip", lambda: case_skip(tmp)),
                 ("mpi_root_stopped", lambda: case_root_stopped(tmp))]
        for name, fn in cases:
            if not only or name in only:
                fn()
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
