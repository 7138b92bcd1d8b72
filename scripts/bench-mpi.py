#!/usr/bin/env python3
"""bench-mpi.py - the pipeline-parallel target's figures on this machine
(docs/mpi.md), as one JSON object on stdout: for R = 1 (one process, no
MPI), 2 and 3 (mpirun --oversubscribe -np R ... --pp R), `specdec bench`
over the same prompts with plain decoding and a speculative method (tokens/s,
speedup, tau, every text equal to plain decoding's), and for R > 1 the
pipeline's own figures from --pp-stats: the overhead of one hop per forward
(rank 0's wait minus the other ranks' compute, per forward and hop), one
hop of a message sent after rank 0 computed for 5 ms (the transport and how
late a waiting rank sees it), each rank's compute per forward and peak
memory.

    make MPI=1 && scripts/bench-mpi.py [--model M] [--prompts P] [--limit N]
        [-n TOKENS] [--threads T] [--methods ar,METHOD] [--ranks 1,2,3]
        [--repeat K] [--bins A,B]

With --repeat K the ranks are run K times, interleaved (R = 1, 2, 3, 1,
2, 3, ...), each run's ratios taken against the one process of the same
round, and the output adds each figure's median and range ("summary").
--bins A,B compares builds (e.g. a copy of build/specdec made before a
change, and the new one): in each round every R > 1 runs with each binary
in turn (R = 1 with the first), so that they meet the same load.

With --serve, the server instead (`serve --pp R`, micro-batches in flight):
for each R of --ranks and each count of users of --users, the aggregate
tokens/s of that many concurrent clients (greedy, the server's default
method, one request each, a prompt each from --prompts) with one group of
slots in the ring at a time (--pp-groups 1) and with R groups in flight,
every answer compared between the two (and with R = 1, one process), and
from /metrics over the load: each rank's compute and waiting time, and how
long 0, 1, 2, ... ranks computed at once ("overlap": the share of the time
any rank computed during which two or more did).

    scripts/bench-mpi.py --serve [--users 4,8] [--ranks 1,2,3] [-n TOKENS] [--repeat K]

A benchmark, not a test (house rule 12): it prints numbers and asserts
nothing. On a machine with fewer cores than ranks x threads the ranks share
cores (oversubscribed); say so when quoting the figures.
"""
import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "specdec")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run_bench(R, a, out, binary=BIN):
    args = [binary, "bench", "-m", a.model, "--prompts", a.prompts, "--limit", str(a.limit), "-n", str(a.n),
            "-t", str(a.threads), "--methods", a.methods, "--out", out, *a.extra]
    if R > 1:
        args = ["mpirun", "--oversubscribe", *(["--bind-to", a.bind] if a.bind else []), "-np", str(R), *args, "--pp",
                str(R), "--pp-stats"]
    r = subprocess.run(args, capture_output=True, text=True, env=ENV, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"bench-mpi: R={R} failed (rc {r.returncode}):\n{r.stderr[-2000:]}")
    res = json.load(open(out))
    row = {"ranks": R, "all_equal_to_ar": res["all_equal_to_ar"], "methods": {}}
    for m in res["methods"]:
        o = m["overall"]
        row["methods"][m["name"]] = {"tokens_per_s": o["tokens_per_s"], "speedup": o["speedup"], "tau": o["tau"],
                                     "ms_per_forward": round(o["time_ms"] / max(1, o["n_target_forwards"]), 3)}
    stats = [l for l in r.stderr.splitlines() if l.startswith('{"pp"')]
    if stats:
        pp = json.loads(stats[-1])["pp"]
        f = max(1.0, pp["forwards"])
        row["hop_overhead_ms"] = pp["hop_overhead_ms"]
        row["ring_hop_ms_after_5_ms"] = pp.get("ring_hop_ms_after_5_ms")
        row["per_rank"] = [{"rank": x["rank"], "layers": x["layers"], "compute_ms_per_forward": round(x["compute_ms"] / f, 3),
                            "peak_rss_mib": x["hwm_mib"]} for x in pp["per_rank"]]
    return row


def metrics(port):
    import http.client
    import re
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        m = re.match(r"^(specdec_\w+)(\{[^}]*\})? ([-0-9.e+]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def serve_load(R, G, users, a, prompts):
    """One server, `users` concurrent clients: a row of figures and the answers."""
    import http.client
    import re
    import threading
    import time
    args = [BIN, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "--parallel", str(users), *a.extra]
    if R > 1:
        args = ["mpirun", "--oversubscribe", *(["--bind-to", a.bind] if a.bind else []), "-np", str(R), *args, "--pp",
                str(R), "--pp-groups", str(G)]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    port, ready, log = [None], threading.Event(), []

    def drain():
        for line in p.stderr:
            log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port[0] = int(m.group(1))
                ready.set()
        ready.set()
    threading.Thread(target=drain, daemon=True).start()
    ready.wait(180)
    if not port[0]:
        p.kill()
        sys.exit(f"bench-mpi: the server R={R} G={G} did not start:\n{''.join(log[-10:])}")
    answers = [None] * users

    def ask(i, n=a.n):
        c = http.client.HTTPConnection("127.0.0.1", port[0], timeout=900)
        body = {"messages": [{"role": "user", "content": prompts[i % len(prompts)]}], "temperature": 0, "max_tokens": n}
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        d = json.loads(c.getresponse().read())
        answers[i] = (d["choices"][0]["message"]["content"], d["usage"]["completion_tokens"]) if "choices" in d else (d, 0)
    try:
        ask(0, 8)   # warm-up
        m0 = metrics(port[0])
        t0 = time.monotonic()
        ts = [threading.Thread(target=ask, args=(i,)) for i in range(users)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.monotonic() - t0
        m1 = metrics(port[0])
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
    toks = sum(x[1] for x in answers)
    row = {"ranks": R, "groups": G, "users": users, "tokens": toks, "seconds": round(dt, 3),
           "tokens_per_s": round(toks / dt, 2),
           "passes": d.get("specdec_batch_forwards_total", 0), "slots_per_pass": round(
               d.get("specdec_batch_slots_total", 0) / max(1, d.get("specdec_batch_forwards_total", 0)), 2)}
    if R > 1:
        busy = [d.get(f'specdec_pp_ranks_busy_seconds_total{{busy="{k}"}}', 0) for k in range(R + 1)]
        anyb = sum(busy[1:])
        row["ranks_busy_s"] = [round(b, 3) for b in busy]
        row["overlap"] = round(sum(busy[2:]) / anyb, 4) if anyb > 0 else 0
        row["passes_in_flight_mean"] = m1.get("specdec_pp_passes_in_flight_mean", 0)
        row["per_rank"] = [{"rank": k, "compute_s": round(sum(v for kk, v in d.items() if kk.startswith(
            "specdec_pp_rank_forward_seconds_total{" + f'rank="{k}"')), 3),
            "wait_s": round(d.get(f'specdec_pp_rank_wait_seconds_total{{rank="{k}"}}', 0), 3)} for k in range(R)]
        row["network_s"] = round(d.get("specdec_pp_network_seconds_total", 0), 4)
    return row, [x[0] for x in answers]


def main_serve(a):
    prompts = [json.loads(l)["turns"][0] for l in open(a.prompts) if l.strip()]
    configs = [(u, R, G) for u in [int(x) for x in a.users.split(",")] for R in [int(x) for x in a.ranks.split(",")]
               for G in ([1] if R == 1 else [1, R])]
    runs, ref = {c: [] for c in configs}, {}
    for rep in range(a.repeat):   # the configurations interleaved, so that a change of the machine's load hits all
        for c in configs:
            users, R, G = c
            row, texts = serve_load(R, G, users, a, prompts)
            ref.setdefault(users, texts)
            row["answers_equal"] = texts == ref[users]
            runs[c].append(row)
            print(json.dumps(row), file=sys.stderr)
    rows = []
    for c in configs:   # the run of median tokens/s of each configuration, with every run's rate
        rs = sorted(runs[c], key=lambda r: r["tokens_per_s"])
        row = dict(rs[len(rs) // 2])
        row["tokens_per_s_runs"] = [r["tokens_per_s"] for r in runs[c]]
        row["answers_equal"] = all(r["answers_equal"] for r in runs[c])
        rows.append(row)
    for r in rows:
        if r["ranks"] > 1 and r["groups"] > 1:
            base = next(x for x in rows if x["users"] == r["users"] and x["ranks"] == r["ranks"] and x["groups"] == 1)
            r["vs_one_group"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
            r["vs_one_group_runs"] = [round(x / y, 3) for x, y in zip(r["tokens_per_s_runs"], base["tokens_per_s_runs"])]
    out = {"host": {"machine": platform.machine(), "cores": os.cpu_count(), "threads_per_rank": a.threads,
                    "oversubscribed": any(r["ranks"] * a.threads > (os.cpu_count() or 1) for r in rows),
                    "load_average": os.getloadavg()},
           "model": os.path.basename(a.model), "n_predict": a.n, "repeat": a.repeat, "serve": rows}
    print(json.dumps(out, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", default=os.path.join(ROOT, "..", "shared", "prompts", "dev.jsonl"))
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="ar,ngram:3-8/eagle3:auto")
    ap.add_argument("--head", default="auto", help="--head of bench (auto: the shipped head; '' for none)")
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--serve", action="store_true", help="measure serve --pp R with concurrent users instead")
    ap.add_argument("--users", default="4,8", help="--serve: concurrent clients (one server each)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each configuration, interleaved (medians and ranges)")
    ap.add_argument("--bind", default="", help="mpirun --bind-to POLICY (default: none given; specdec then undoes Open "
                    "MPI's default binding of each of 2 ranks or fewer to one core, docs/mpi.md)")
    ap.add_argument("--bins", default="", help="builds of specdec to compare, comma-separated (default build/specdec)")
    a = ap.parse_args()
    a.extra = ["--head", a.head] if a.head else []
    if a.serve:
        if a.head == "auto" and "--head" not in sys.argv:
            a.extra = []   # the server's default method (ngram:3-8) unless a head is asked for
        return main_serve(a)
    bins = [os.path.abspath(b) for b in a.bins.split(",")] if a.bins else [BIN]
    ranks = [int(x) for x in a.ranks.split(",")]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="specdec_bench_mpi_") as tmp:
        for rep in range(a.repeat):   # interleaved, so that a change of the machine's load hits every configuration
            rows = []
            for R in ranks:
                for bi, b in enumerate(bins if R > 1 else bins[:1]):
                    row = run_bench(R, a, os.path.join(tmp, f"r{R}_{bi}.json"), b)
                    if len(bins) > 1:
                        row["bin"] = b
                    rows.append(row)
            one = next((r for r in rows if r["ranks"] == 1), None)
            if one:
                fwd = one["methods"]["ar"]["ms_per_forward"]
                for r in rows:
                    if "hop_overhead_ms" in r:
                        r["hop_overhead_vs_forward"] = round(r["hop_overhead_ms"] / fwd, 4)
                    for name, m in r["methods"].items():
                        m["tokens_per_s_vs_one_process"] = round(m["tokens_per_s"] / one["methods"][name]["tokens_per_s"], 3)
            if a.repeat > 1:
                print(json.dumps(rows), file=sys.stderr)
            rounds.append(rows)
    out = {"host": {"machine": platform.machine(), "cores": os.cpu_count(), "threads_per_rank": a.threads,
                    "oversubscribed": any(R * a.threads > (os.cpu_count() or 1) for R in ranks), "bind_to": a.bind or "default",
                    "load_average": os.getloadavg()},
           "model": os.path.basename(a.model), "prompts": a.limit, "n_predict": a.n}
    if a.repeat == 1:
        out["results"] = rounds[0]
    else:
        out["rounds"] = rounds
        summary = {}
        for rows in rounds:   # each figure's values over the rounds, per (binary, R)
            for r in rows:
                key = f"R={r['ranks']}" + (f" {r['bin']}" if "bin" in r else "")
                d = summary.setdefault(key, {})
                for name, m in r["methods"].items():
                    d.setdefault(f"{name} tokens_per_s", []).append(m["tokens_per_s"])
                    if "tokens_per_s_vs_one_process" in m and r["ranks"] > 1:
                        d.setdefault(f"{name} vs_one_process", []).append(m["tokens_per_s_vs_one_process"])
                for f in ("hop_overhead_ms", "hop_overhead_vs_forward", "ring_hop_ms_after_5_ms"):
                    if r.get(f) is not None:
                        d.setdefault(f, []).append(r[f])
        for d in summary.values():
            for k, v in d.items():
                v = sorted(v)
                d[k] = {"median": v[len(v) // 2] if len(v) % 2 else round((v[len(v) // 2 - 1] + v[len(v) // 2]) / 2, 4),
                        "min": v[0], "max": v[-1], "runs": len(v)}
        out["summary"] = summary
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
