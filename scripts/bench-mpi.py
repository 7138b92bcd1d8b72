#!/usr/bin/env python3
"""bench-mpi.py - the pipeline-parallel target's figures on this machine
(docs/mpi.md), as one JSON object on stdout: for R = 1 (one process, no
MPI), 2 and 3 (mpirun --oversubscribe -np R ... --pp R), `specdec bench`
over the same prompts with plain decoding and a speculative method (tokens/s,
speedup, tau, every text equal to plain decoding's), and for R > 1 the
pipeline's own figures from --pp-stats: the overhead of one hop per forward
(rank 0's wait minus the other ranks' compute, per forward and hop), each
rank's compute per forward and peak memory.

    make MPI=1 && scripts/bench-mpi.py [--model M] [--prompts P] [--limit N]
        [-n TOKENS] [--threads T] [--methods ar,METHOD] [--ranks 1,2,3]

A benchmark, not a test (house rule 12): it prints numbers and asserts
nothing. On a machine with fewer cores than ranks x threads the ranks share
cores (oversubscribed); say so when quoting the figures.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "specdec")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run_bench(R, a, out):
    args = [BIN, "bench", "-m", a.model, "--prompts", a.prompts, "--limit", str(a.limit), "-n", str(a.n),
            "-t", str(a.threads), "--methods", a.methods, "--out", out, *a.extra]
    if R > 1:
        args = ["mpirun", "--oversubscribe", "-np", str(R), *args, "--pp", str(R), "--pp-stats"]
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
        row["per_rank"] = [{"rank": x["rank"], "layers": x["layers"], "compute_ms_per_forward": round(x["compute_ms"] / f, 3),
                            "peak_rss_mib": x["hwm_mib"]} for x in pp["per_rank"]]
    return row


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
    a = ap.parse_args()
    a.extra = ["--head", a.head] if a.head else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="specdec_bench_mpi_") as tmp:
        for R in [int(x) for x in a.ranks.split(",")]:
            rows.append(run_bench(R, a, os.path.join(tmp, f"r{R}.json")))
    one = next((r for r in rows if r["ranks"] == 1), None)
    if one:
        fwd = one["methods"]["ar"]["ms_per_forward"]
        for r in rows:
            if "hop_overhead_ms" in r:
                r["hop_overhead_vs_forward"] = round(r["hop_overhead_ms"] / fwd, 4)
            for name, m in r["methods"].items():
                m["tokens_per_s_vs_one_process"] = round(m["tokens_per_s"] / one["methods"][name]["tokens_per_s"], 3)
    out = {"host": {"machine": platform.machine(), "cores": os.cpu_count(), "threads_per_rank": a.threads,
                    "oversubscribed": any(r["ranks"] * a.threads > (os.cpu_count() or 1) for r in rows)},
           "model": os.path.basename(a.model), "prompts": a.limit, "n_predict": a.n, "results": rows}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
