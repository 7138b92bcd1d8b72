#!/usr/bin/env python3
"""test_generate_stop.py - `specdec generate --stop` on the default model
(SmolLM2-135M), greedy, against the same run without stop strings (T):

- stop_cut: a stop string that first appears at byte k of T, starting at a
  word's second letter (inside a token): the text is T[:k] exactly, streamed and in --json, finish_reason
  "stopped", and fewer tokens generated than T's;
- stop_speculative: the same cut through ngram:3-8 and the shipped EAGLE-3
  head (eagle3:chain:3), where several tokens arrive in one step;
- stop_first_wins: of two stop strings the one that appears first in T ends
  it, whichever order they are given in;
- stop_absent: a stop string T never holds changes nothing (T, "length");
- stop_errors: 17 stop strings, or one of 257 bytes: a clear error, exit 1.

Prints PASS/FAIL/SKIP lines. Skipped without the model or the program.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
BIN = os.path.abspath(os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec")))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
HEAD = os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct.eagle3.gguf")
CASES = ["stop_cut", "stop_speculative", "stop_first_wins", "stop_absent", "stop_errors"]
PROMPT = "Write a short story about a fox who finds a lantern in the forest."


def run(extra, json_out=True):
    args = [BIN, "generate", "-m", MODEL, "--chat", "-p", PROMPT, "-n", "64", "--temp", "0", "-t", "2"] + extra
    if json_out:
        args.append("--json")
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if not json_out:
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    try:
        return p.returncode, json.loads(p.stdout), p.stderr.decode("utf-8", "replace")
    except ValueError:
        return p.returncode, None, p.stderr.decode("utf-8", "replace")


def pick_stop(text):
    """A 4-byte stop string first found at byte k > 20, starting at a word's
    second letter (inside a token, mostly: its text is then printed in part)."""
    b = text.encode()
    for k in range(24, len(b) - 8):
        s = b[k:k + 4]
        if b.find(s) == k and chr(b[k - 1]).isalpha() and not chr(b[k - 2]).isalpha() and s.isalpha():
            return k, s.decode()
    return None, None


def main():
    if not os.path.exists(MODEL) or not os.access(BIN, os.X_OK):
        for c in CASES:
            print(f"SKIP {c}: needs {MODEL} and {BIN} (make; scripts/fetch-models.sh)")
        return 0
    rc, base, err = run([])
    if rc != 0 or not base:
        for c in CASES:
            report(c, False, f"the run without --stop failed: {err[-300:]}")
        return exit_status()
    T = base["text"]
    k, stop = pick_stop(T)
    if stop is None:
        for c in CASES:
            report(c, False, f"no usable stop string in {T!r}")
        return exit_status()
    want = T.encode()[:k].decode("utf-8", "replace")

    rc, out, err = run(["--stop", stop])
    ok = rc == 0 and out and out["text"] == want and out["finish_reason"] == "stopped" and \
        out["n_generated"] < base["n_generated"]
    rc2, streamed, err2 = run(["--stop", stop], json_out=False)
    ok = ok and rc2 == 0 and streamed == want + "\n"   # generate ends its stream with a newline
    report("stop_cut", ok, f"stop {stop!r}: want {want!r}; json {out and out.get('text')!r} "
           f"({out and out.get('finish_reason')}), streamed {streamed!r}: {err[-200:]}{err2[-200:]}")

    bad = []
    for method in ["ngram:3-8"] + (["eagle3:chain:3"] if os.path.exists(HEAD) else []):
        extra = ["--method", method] + (["--head", HEAD] if method.startswith("eagle3") else [])
        rc, out, err = run(extra + ["--stop", stop])
        if rc != 0 or not out or out["text"] != want or out["finish_reason"] != "stopped":
            bad.append(f"{method}: {out and out.get('text')!r} {err[-200:]}")
    if not os.path.exists(HEAD):
        print(f"note: {HEAD} missing: stop_speculative checks ngram:3-8 only")
    report("stop_speculative", not bad, "; ".join(bad))

    later = T.encode()[k + 10:k + 16].decode("utf-8", "ignore")
    bad = []
    if later and T.find(later) > k:
        for order in ([stop, later], [later, stop]):
            rc, out, err = run(["--stop", order[0], "--stop", order[1]])
            if rc != 0 or not out or out["text"] != want:
                bad.append(f"{order}: {out and out.get('text')!r}")
    else:
        bad.append(f"no second stop string after byte {k} in {T!r}")
    report("stop_first_wins", not bad, "; ".join(bad))

    rc, out, err = run(["--stop", "\u00a7\u00a7never\u00a7\u00a7"])
    report("stop_absent", rc == 0 and out and out["text"] == T and out["finish_reason"] == base["finish_reason"],
           f"{out and out.get('text')!r} {out and out.get('finish_reason')} {err[-200:]}")

    bad = []
    many = []
    for i in range(17):
        many += ["--stop", f"s{i}"]
    rc, out, err = run(many, json_out=False)
    if rc != 1 or "stop" not in err or "16" not in err:
        bad.append(f"17 stop strings: exit {rc}, {err[-200:]!r}")
    rc, out, err = run(["--stop", "x" * 257], json_out=False)
    if rc != 1 or "256" not in err:
        bad.append(f"a 257-byte stop string: exit {rc}, {err[-200:]!r}")
    report("stop_errors", not bad, "; ".join(bad))
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
