#!/usr/bin/env python3
"""compare-heads.py - two or more draft heads for one target, side by side.

Runs `specdec bench` once per head and round, the heads interleaved (A, B, A,
B, ...), on the same prompts, methods and threads, and prints one JSON
object: for each head, plain decoding's tokens/s in its runs, and for
each method, tau, acceptance by depth and the speedup
over ar measured inside the same bench run (min / median / max over the
rounds), and the ratio of each head's speedup to the first head's within a
round (the noise of a shared machine cancels in it), with tau's ratio too.
A head may be an EAGLE-3 head or an MoA drafter (docs/moa.md): for an MoA
file every `eagle3:` of the methods runs as `moa:` (its JSON says which ran),
so `--methods eagle3:chain:3` compares the two kinds shape for shape. A head
that does not load, or text that differs from plain decoding, is an error
(exit 1).

usage: scripts/compare-heads.py --head A.gguf --head B.gguf [--head C.gguf]
         [-m MODEL] [--prompts FILE] [--methods LIST] [--rounds R] [-n N]
         [-t T] [--limit K] [--temp T]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def host():
    """The CPU, its core count and the widest kernel family it supports."""
    info = {}
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            key, _, val = line.partition(":")
            info.setdefault(key.strip(), val.strip())
    except OSError:
        pass
    flags = info.get("flags", "").split()
    fam = "avx512-vnni" if "avx512_vnni" in flags else "avx2" if "avx2" in flags else "scalar"
    return {"cpu": info.get("model name", platform.processor()), "cores": os.cpu_count(),
            "kernel_family": fam, "kernel": platform.release()}


def gguf_arch(path):
    """general.architecture of a GGUF file (read from its metadata), or ''."""
    import struct
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return ""
        _ver, _nt, nkv = struct.unpack("<IQQ", f.read(20))

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def skip(t):
            if t == 8:
                string()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                for _ in range(n):
                    skip(et)
            else:
                f.read(sizes[t])

        for _ in range(min(nkv, 4096)):
            key = string()
            (t,) = struct.unpack("<I", f.read(4))
            if key == "general.architecture" and t == 8:
                return string()
            skip(t)
    return ""


def head_methods(methods, head):
    """The methods as they run with this head: eagle3: -> moa: for an MoA drafter."""
    if gguf_arch(head) == "moa":
        return ",".join(m.replace("eagle3:", "moa:") for m in methods.split(","))
    return methods


def bench(a, head, out):
    cmd = [a.bin, "bench", "-m", a.model, "--prompts", a.prompts, "--methods", head_methods(a.methods, head), "--head", head,
           "-n", str(a.n), "--temp", str(a.temp), "--out", out]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    if a.limit:
        cmd += ["--limit", str(a.limit)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not os.path.exists(out):
        sys.exit(f"compare-heads: bench with {head} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return json.load(open(out, encoding="utf-8"))


def spread(xs):
    return {"min": round(min(xs), 4), "median": round(statistics.median(xs), 4), "max": round(max(xs), 4)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", action="append", required=True, help="a head file (give 2 or more)")
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "prompts", "dev.jsonl")))
    ap.add_argument("--methods", default="eagle3:chain:3,eagle3:auto")
    ap.add_argument("--rounds", type=int, default=2, help="bench runs per head, interleaved (default 2)")
    ap.add_argument("-n", type=int, default=128, help="tokens per prompt (default 128)")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "specdec"))
    a = ap.parse_args()
    if len(a.head) < 2:
        ap.error("give at least two --head files")
    for f in a.head + [a.model, a.prompts, a.bin]:
        if not os.path.exists(f):
            ap.error(f"{f}: not found")
    runs = [[] for _ in a.head]
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for i, h in enumerate(a.head):
                print(f"compare-heads: round {r + 1}/{a.rounds}, head {i + 1}/{len(a.head)} ({h})",
                      file=sys.stderr, flush=True)
                res = bench(a, h, os.path.join(d, f"{r}-{i}.json"))
                if a.temp == 0 and not res.get("all_equal_to_ar"):
                    sys.exit(f"compare-heads: with {h} a method's text differs from plain decoding")
                names = dict(zip(head_methods(a.methods, h).split(","), a.methods.split(",")))
                runs[i].append({names.get(m["name"], m["name"]): m["overall"] for m in res["methods"]})
                missing = [m for m in a.methods.split(",") if m not in runs[i][-1]]
                if missing:   # (before the other rounds: bench names a method its own way)
                    sys.exit(f"compare-heads: bench reported {sorted(runs[i][-1])}, not {missing}: give the "
                             "methods as bench names them (specdec bench --help)")
    out = {"host": host(), "model": a.model, "prompts": a.prompts, "n_predict": a.n, "temp": a.temp,
           "rounds": a.rounds, "limit": a.limit, "heads": []}
    for i, h in enumerate(a.head):
        per = {}
        for m in a.methods.split(","):
            rows = [run[m] for run in runs[i]]
            e = {"speedup": spread([x["speedup"] for x in rows]), "tau": spread([x["tau"] for x in rows]),
                 "tokens_per_s": spread([x["tokens_per_s"] for x in rows]),
                 "acceptance_by_depth": [round(v, 4) for v in rows[-1]["acceptance_by_depth"]],
                 "ran_as": head_methods(m, h)}
            if rows[-1].get("draft_ms_per_node_vs_forward") is not None:
                e["draft_per_node_vs_forward"] = spread([x["draft_ms_per_node_vs_forward"] for x in rows])
            if i:
                e["speedup_vs_first_head"] = spread([x["speedup"] / y[m]["speedup"]
                                                     for x, y in zip(rows, runs[0])])
                e["tau_vs_first_head"] = spread([x["tau"] / y[m]["tau"] for x, y in zip(rows, runs[0])])
            per[m] = e
        out["heads"].append({"file": h, "ar_tokens_per_s": spread([run["ar"]["tokens_per_s"] for run in runs[i]]),
                             "methods": per})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
