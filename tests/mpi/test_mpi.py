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

The server under --pp: tests/mpi/test_mpi_serve.py.

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

from mpi_common import (BIN, ENV, RHEAD, ROOT, SMOL, SYNTH, alive, chat, compare, mpirun, rank_pids,
                        resume_and_reap, single, skip_all, start_server, stop_server)
from report import exit_status, report  # noqa: E402

CASES = ["mpi_greedy_synth", "mpi_greedy_smollm", "mpi_bench_equal", "mpi_bad_launches", "mpi_killed_rank",
         "mpi_stuck_rank", "mpi_rank_memory", "mpi_skip", "mpi_root_stopped"]


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
    if skip_all(CASES):
        return 0
    only = set(sys.argv[1:])   # case names to run (all by default)
    with tempfile.TemporaryDirectory(prefix="specdec_mpi_") as tmp:
        if not only or only & {"mpi_greedy_synth", "mpi_bench_equal", "mpi_bad_launches", "mpi_killed_rank",
                               "mpi_stuck_rank", "mpi_root_stopped"}:
            subprocess.run([SYNTH, os.path.join(tmp, "s6.gguf"), "6"], check=True)
        cases = [("mpi_greedy_synth", lambda: case_greedy_synth(tmp)), ("mpi_greedy_smollm", case_greedy_smollm),
                 ("mpi_bench_equal", lambda: case_bench_equal(tmp)),
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
