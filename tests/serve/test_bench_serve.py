#!/usr/bin/env python3
"""test_bench_serve.py - scripts/bench-serve.py end to end, briefly: it starts
`specdec serve` itself (--start-server), drives it with K=2 streaming
clients over 2 prompts of 8 tokens, with and without speculation, and the
JSON it prints has every field with sane values (counts, orderings of
quantiles, tau). Never a timing threshold.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them). Needs the
default model and build/specdec built with the server; SPECDEC_BIN and
SPECDEC_MODEL pick others.
"""
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec"))
MODEL = os.environ.get("SPECDEC_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
CASES = ["bench_serve_runs", "bench_serve_fields", "bench_serve_sane"]
FIELDS = ["speculation", "clients", "requests", "errors", "wall_s", "requests_per_s", "completion_tokens",
          "aggregate_tokens_per_s", "per_user_tokens_per_s_median", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50",
          "itl_ms_p99", "tpot_ms_median", "tau", "client_cpu_s", "client_cpu_share"]


def skip_all(why):
    for c in CASES:
        print(f"SKIP {c}: {why}")
    sys.exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if not os.path.exists(MODEL):
        skip_all(f"no model at {MODEL}")
    if not os.path.exists(BIN):
        skip_all(f"no binary at {BIN}")
    h = subprocess.run([BIN, "serve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if h.returncode != 0:
        skip_all("specdec was built without serve (libmicrohttpd, jansson)")
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        prompts = os.path.join(d, "p.jsonl")
        with open(prompts, "w") as f:
            f.write(json.dumps({"question_id": 1, "turns": ["Name three colors."]}) + "\n")
            f.write(json.dumps({"question_id": 2, "turns": ["Count from one to five.", "And back."]}) + "\n")
        port = free_port()
        server = f"{shlex.quote(BIN)} serve -m {shlex.quote(MODEL)} --port {port} --parallel 2"
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "bench-serve.py"), "--url", f"http://127.0.0.1:{port}",
               "--start-server", server, "--prompts", prompts, "--n-prompts", "2", "--requests", "2", "--clients", "2",
               "--max-tokens", "8", "--speculation", "default,off"]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    try:
        res = json.loads(out.stdout)
        runs = res["runs"]
    except Exception as e:  # noqa: BLE001
        print(f"FAIL bench_serve_runs: exit {out.returncode}, {e!r}; stderr: {out.stderr[-500:]}")
        for c in CASES[1:]:
            print(f"SKIP {c}: no JSON")
        sys.exit(1)
    ok = out.returncode == 0 and [(r["speculation"], r["clients"]) for r in runs] == [("default", 2), ("off", 2)]
    print(f"{'PASS' if ok else 'FAIL'} bench_serve_runs" + ("" if ok else f": exit {out.returncode}, runs {runs}"))
    fails += not ok

    missing = [(r.get("speculation"), f) for r in runs for f in FIELDS if f not in r]
    ok = not missing and res.get("n_prompts") == 2 and res.get("max_tokens") == 8 and res.get("model")
    print(f"{'PASS' if ok else 'FAIL'} bench_serve_fields" + ("" if ok else f": missing {missing}, {res}"))
    fails += not ok

    bad = []
    for r in runs:
        name = r["speculation"]
        if r["requests"] != 2 or r["errors"] != 0:
            bad.append(f"{name}: {r['requests']} requests, {r['errors']} errors ({r.get('first_error')})")
            continue
        if not 2 <= r["completion_tokens"] <= 16:
            bad.append(f"{name}: {r['completion_tokens']} tokens for 2 requests of at most 8")
        for f in ("wall_s", "requests_per_s", "aggregate_tokens_per_s", "per_user_tokens_per_s_median",
                  "ttft_ms_p50"):
            if not (isinstance(r[f], (int, float)) and r[f] > 0):
                bad.append(f"{name}: {f} = {r[f]}")
        for a, b in (("ttft_ms_p50", "ttft_ms_p99"), ("itl_ms_p50", "itl_ms_p99")):
            if r[a] is not None and r[b] is not None and r[a] > r[b]:
                bad.append(f"{name}: {a} {r[a]} > {b} {r[b]}")
        if r["tau"] is None or r["tau"] < 1.0 or (name == "off" and r["tau"] != 1.0):
            bad.append(f"{name}: tau {r['tau']}")
        if not (r["client_cpu_s"] >= 0 and r["client_cpu_share"] >= 0):
            bad.append(f"{name}: client cpu {r['client_cpu_s']}")
    print(f"{'PASS' if not bad else 'FAIL'} bench_serve_sane" + ("" if not bad else ": " + "; ".join(bad)))
    fails += bool(bad)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
