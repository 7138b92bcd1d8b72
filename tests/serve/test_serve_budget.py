#!/usr/bin/env python3
"""test_serve_budget.py - the server's draft budget (--draft-budget, budget.h)
end to end: a client alone drafts its method's whole shape (nothing is
withheld), clients at once share passes and the budget withholds draft
nodes, the texts stay those of `specdec generate` with the same method
either way, `--draft-budget off` withholds nothing, and a bad value is a
clear error.

Prints PASS/FAIL/SKIP lines like the C tests (scripts/run-tests.sh counts
them). SPECDEC_BIN picks another binary (make asan-serve), SPECDEC_MODEL
another model.
"""
import json
import os
import re
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
from serve_proc import ServeProcess  # noqa: E402

BIN = os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec"))
MODEL = os.environ.get("SPECDEC_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
N_TOK = 32
CASES = ["budget_alone_withholds_nothing", "budget_concurrent_equals_generate", "budget_off_withholds_nothing",
         "budget_bad_value"]
# Prompts whose continuations repeat (prompt lookup drafts on them).
PROMPTS = ["Once upon a time a small robot walked through the old city looking for its friend. " * 6,
           "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. " * 5,
           "one two three four five six seven eight nine ten " * 8,
           "Lily liked to play in the park with her red ball every day. " * 6]


def generate(prompt):
    cmd = [BIN, "generate", "-m", MODEL, "-p", prompt, "--temp", "0", "-n", str(N_TOK), "--draft-ngram", "3,8"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.decode())
    text = out.stdout.decode()
    return text[:-1] if text.endswith("\n") else text


def metric(srv, name):
    _, _, data = srv.raw("GET", "/metrics")
    m = re.search(r"^" + re.escape(name) + r" ([0-9.]+)$", data.decode(), re.M)
    return float(m.group(1)) if m else None


def complete(srv, prompt):
    body = json.dumps({"prompt": prompt, "temperature": 0, "max_tokens": N_TOK})
    status, _, data = srv.raw("POST", "/v1/completions", body)
    r = json.loads(data)
    return r["choices"][0]["text"] if status == 200 else f"HTTP {status}: {r}", r.get("usage", {})


def concurrent(srv):
    res = [None] * len(PROMPTS)

    def one(i):
        res[i] = complete(srv, PROMPTS[i])

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res


def main():
    if not os.path.exists(MODEL):
        for c in CASES:
            print(f"SKIP {c}: model {MODEL} not found (scripts/fetch-models.sh)")
        return 0
    h = subprocess.run([BIN, "serve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if h.returncode != 0:
        for c in CASES:
            print(f"SKIP {c}: specdec was built without the server: {h.stderr.decode().strip()}")
        return 0
    want = [generate(p) for p in PROMPTS]
    srv = ServeProcess(BIN, MODEL, "--parallel", str(len(PROMPTS)))   # default method ngram:3-8, budget auto
    try:
        text, usage = complete(srv, PROMPTS[0])
        withheld = metric(srv, "specdec_draft_budget_withheld_total")
        drafted = (usage.get("speculation") or {}).get("drafted", 0)
        report("budget_alone_withholds_nothing", text == want[0] and withheld == 0 and drafted > 0,
               f"text {text!r} vs {want[0]!r}; withheld {withheld}; drafted {drafted}; log {srv.log[-3:]}")
        res = concurrent(srv)
        withheld = metric(srv, "specdec_draft_budget_withheld_total")
        bad = [(i, t, w) for i, ((t, _), w) in enumerate(zip(res, want)) if t != w]
        report("budget_concurrent_equals_generate", not bad and withheld and withheld > 0,
               f"differ: {bad}; withheld {withheld}")
    finally:
        srv.stop()
    srv = ServeProcess(BIN, MODEL, "--parallel", str(len(PROMPTS)), "--draft-budget", "off")
    try:
        res = concurrent(srv)
        withheld = metric(srv, "specdec_draft_budget_withheld_total")
        bad = [(i, t, w) for i, ((t, _), w) in enumerate(zip(res, want)) if t != w]
        report("budget_off_withholds_nothing", not bad and withheld == 0, f"differ: {bad}; withheld {withheld}")
    finally:
        srv.stop()
    out = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--draft-budget", "sometimes"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    err = out.stderr.decode()
    report("budget_bad_value", out.returncode != 0 and "--draft-budget" in err and "auto or off" in err,
           f"exit {out.returncode}: {err!r}")
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
