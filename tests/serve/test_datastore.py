#!/usr/bin/env python3
"""test_datastore.py - the retrieval datastore made of the model's own answers
(scripts/make-datastore.py) and `specdec bench --datastore`:

- the script writes the assistant turns of chat.jsonl, nothing of the user
  turns, keeps or drops the sampled answers as asked, and fails with a clear
  message (and no output file) on a missing or malformed chat.jsonl;
- bench with a datastore that holds the model's own greedy answer to a
  prompt retrieves it: prompt lookup's tokens per target forward (tau) rise
  by a quarter at least over what the prompt alone gives, and the text stays
  equal to plain decoding's (bench's own check, exit status 0). The bar is
  relative: the answer, and with it what the prompt alone gives, depends on
  the host's kernels (a repetitive answer gave 1.97 alone, 2.86 with the
  datastore: its repeated lines make some retrievals ambiguous);
- bench refuses a missing datastore file, and a datastore with no n-gram
  method to read it, with a clear error;
- `specdec serve --datastore` indexes the corpus at start-up and its
  requests retrieve from it alike: the same text as generate's, a tau in the
  response's usage a quarter above bench's without the datastore.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them). The bench
cases need build/specdec and the default model (SPECDEC_MODEL another, with a
chat template); without them they are skipped with the reason.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
from serve_proc import ServeProcess  # noqa: E402
SCRIPT = os.path.join(ROOT, "scripts", "make-datastore.py")
BIN = os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec"))
MODEL = os.environ.get("SPECDEC_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
PROMPT = "Write a short poem about a lighthouse keeper who talks to the sea."
N_PREDICT = 64
GAIN = 1.25   # the datastore's tau over the prompt's alone, at least


def chat(i, user, answer, mode):
    return json.dumps({"id": f"t-{i}", "source": "tasks",
                       "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                       "meta": {"mode": mode}}) + "\n"


def script(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def script_cases(tmp):
    d = os.path.join(tmp, "data")
    os.makedirs(d)
    with open(os.path.join(d, "chat.jsonl"), "w") as f:
        f.write(chat(0, "USER-ONE", "Answer one.", "greedy"))
        f.write(chat(1, "USER-TWO", "Answer two,\nwith a second line.", "sampled"))
        f.write(chat(2, "USER-THREE", "Answer three.", "greedy"))
    out = os.path.join(tmp, "ds", "all.txt")
    r = script("--data", d, "--out", out)
    text = open(out).read() if os.path.exists(out) else ""
    report("script_writes_answers",
           r.returncode == 0 and text == "Answer one.\n\nAnswer two,\nwith a second line.\n\nAnswer three.\n\n",
           f"exit {r.returncode}, {r.stderr.strip()!r}, wrote {text!r}")
    report("script_no_user_text", "USER" not in text, f"user turns in the corpus: {text!r}")
    out2 = os.path.join(tmp, "greedy.txt")
    r = script("--data", d, "--out", out2, "--greedy-only")
    text = open(out2).read() if os.path.exists(out2) else ""
    report("script_greedy_only", r.returncode == 0 and text == "Answer one.\n\nAnswer three.\n\n"
           and "1 sampled" in r.stderr, f"exit {r.returncode}, {r.stderr.strip()!r}, wrote {text!r}")
    missing = os.path.join(tmp, "nowhere")
    out3 = os.path.join(tmp, "none.txt")
    r = script("--data", missing, "--out", out3)
    report("script_missing_data", r.returncode != 0 and "chat.jsonl" in r.stderr and "make-train-data" in r.stderr
           and not os.path.exists(out3), f"exit {r.returncode}, {r.stderr.strip()!r}")
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "chat.jsonl"), "w") as f:
        f.write(chat(0, "u", "fine", "greedy") + "{not json\n")
    r = script("--data", bad, "--out", out3)
    report("script_bad_record", r.returncode != 0 and "chat.jsonl:2" in r.stderr and not os.path.exists(out3),
           f"exit {r.returncode}, {r.stderr.strip()!r}")


def bench(tmp, prompts, *extra):
    out = os.path.join(tmp, "bench.json")
    if os.path.exists(out):
        os.unlink(out)
    r = subprocess.run([BIN, "bench", "-m", MODEL, "--prompts", prompts, "-n", str(N_PREDICT), "-t", "2",
                        "--methods", "ngram:3-8", "--out", out, *extra], capture_output=True, text=True, timeout=300)
    res = json.load(open(out)) if r.returncode == 0 and os.path.exists(out) else None
    return r, res


def bench_cases(tmp):
    names = ["bench_retrieves_own_answer", "bench_missing_datastore", "bench_datastore_unused",
             "serve_retrieves_own_answer"]
    for path, what in ((BIN, "build/specdec"), (MODEL, "the default model (make test fetches it)")):
        if not os.path.exists(path):
            for n in names:
                print(f"SKIP {n}: {what} not found at {path}")
            return
    g = subprocess.run([BIN, "generate", "-m", MODEL, "-p", PROMPT, "--chat", "--temp", "0", "-n", str(N_PREDICT),
                        "-t", "2"], capture_output=True, text=True, timeout=300)
    if g.returncode != 0 or not g.stdout.strip():
        report(names[0], False, f"generate failed: exit {g.returncode}, {g.stderr.strip()[-300:]!r}")
        return
    prompts = os.path.join(tmp, "one.jsonl")
    with open(prompts, "w") as f:
        f.write(json.dumps({"question_id": 1, "category": "writing", "turns": [PROMPT]}) + "\n")
    d = os.path.join(tmp, "answers")
    os.makedirs(d)
    with open(os.path.join(d, "chat.jsonl"), "w") as f:
        f.write(chat(0, PROMPT, g.stdout, "greedy"))
    corpus = os.path.join(tmp, "own.txt")
    r = script("--data", d, "--out", corpus)
    if r.returncode != 0:
        report(names[0], False, f"make-datastore failed: {r.stderr.strip()!r}")
        return
    r0, plain = bench(tmp, prompts)
    r1, ds = bench(tmp, prompts, "--datastore", corpus)
    t0 = None
    if plain is None or ds is None:
        report(names[0], False, f"bench failed: exit {r0.returncode} / {r1.returncode}: {r1.stderr.strip()[-300:]!r}")
    else:
        t0 = plain["methods"][1]["overall"]["tau"]
        t1 = ds["methods"][1]["overall"]["tau"]
        report(names[0], ds["all_equal_to_ar"] and t1 >= GAIN * t0,
               f"tau {t0:.2f} without the datastore, {t1:.2f} with it (want {GAIN}x the former, "
               f"{GAIN * t0:.2f}); equal to ar: {ds['all_equal_to_ar']}")
    r = subprocess.run([BIN, "bench", "-m", MODEL, "--prompts", prompts, "--methods", "ngram:3-8", "--datastore",
                        os.path.join(tmp, "absent.txt")], capture_output=True, text=True, timeout=60)
    report(names[1], r.returncode == 1 and "absent.txt" in r.stderr and "datastore" in r.stderr,
           f"exit {r.returncode}, {r.stderr.strip()[-300:]!r}")
    r = subprocess.run([BIN, "bench", "-m", MODEL, "--prompts", prompts, "--methods", "lookahead:4-3-4",
                        "--datastore", corpus], capture_output=True, text=True, timeout=60)
    report(names[2], r.returncode == 1 and "--datastore needs an n-gram method" in r.stderr,
           f"exit {r.returncode}, {r.stderr.strip()[-300:]!r}")
    serve_case(names[3], corpus, g.stdout.rstrip("\n"), t0)   # generate ends its text with a newline


def serve_case(name, corpus, want, t0):
    """t0: bench's tau without the datastore (None if bench failed)."""
    if t0 is None:
        report(name, False, "no tau without the datastore to compare with: bench failed")
        return
    try:
        srv = ServeProcess(BIN, MODEL, "--parallel", "1", "--datastore", corpus, "--method", "ngram:3-8")
    except RuntimeError as e:
        if "without the server" in str(e) or "libmicrohttpd" in str(e):
            print(f"SKIP {name}: specdec was built without the server ({e})")
        else:
            report(name, False, f"serve did not start: {e}")
        return
    try:
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N_PREDICT, "temperature": 0}
        st, _, data = srv.raw("POST", "/v1/chat/completions", json.dumps(body))
        log = "\n".join(srv.log)
    finally:
        rc = srv.stop()
    try:
        r = json.loads(data)
        text = r["choices"][0]["message"]["content"]
        tau = r["usage"]["speculation"]["tau"]
    except (ValueError, KeyError, IndexError, TypeError):
        report(name, False, f"status {st}, body {data[:300]!r}")
        return
    report(name, st == 200 and rc == 0 and text == want and tau >= GAIN * t0 and "datastore:" in log,
           f"status {st}, exit {rc}, tau {tau} (want {GAIN}x bench's {t0:.2f} without the datastore), "
           f"text equal to generate's: {text == want}, "
           f"start-up log names the datastore: {'datastore:' in log}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        script_cases(tmp)
        bench_cases(tmp)
    sys.exit(exit_status())


if __name__ == "__main__":
    main()
