#!/usr/bin/env python3
"""test_datastore_auto.py - the model's own datastore, found by name
(`--datastore auto`, and `--head auto` in generate), and the committed corpus
as its source (`make-datastore.py --corpus`):

- the script reads a corpus's NNNN.jsonl.xz shards in name order, keeps the
  greedy answers when asked, and fails on a damaged shard naming it, leaving
  no output file;
- generate --head auto, run where data/datastore/NAME.txt holds the model's
  own greedy answer to the prompt (NAME: the model file's name without its
  quantisation), takes that datastore and the default method becomes
  ngram:5-8:auto/eagle3:auto: the text equals plain decoding's and tokens per
  forward rise by 15% at least over the same method with `--datastore none`
  (a modest bar: the sized lookup drafts by the cost curve measured at
  start-up, which a busy machine skews; 3.3 against 1.5 on an idle one);
  with `--datastore none` the default method is ngram:3-8/eagle3:auto;
- `--datastore auto` where no datastore was made says so and goes on;
- `--datastore auto` with a method that does no lookup is refused;
- bench takes the datastore only when asked (`--datastore auto`), and names
  it in its JSON, and its `auto` runs (and says it runs) the default method
  that the datastore makes;
- the first use of a datastore says that it is being indexed (it takes
  about 10 s for the default model's), a later one does not.

Each run uses a copy of build/specdec in a fresh folder, so that only the
planted files are found. Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh).
"""
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "make-datastore.py")
BIN = os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec"))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
HEAD = os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct.eagle3.gguf")
PROMPT = "Write a short poem about a lighthouse keeper who talks to the sea."
N = 128
GAIN = 1.15


def rec(i, answer, mode):
    return json.dumps({"id": f"t-{i}", "source": "tasks", "meta": {"mode": mode},
                       "messages": [{"role": "user", "content": f"USER-{i}"},
                                    {"role": "assistant", "content": answer}]}) + "\n"


def script_cases(tmp):
    d = os.path.join(tmp, "corpus")
    os.makedirs(d)
    with lzma.open(os.path.join(d, "0001.jsonl.xz"), "wt") as f:
        f.write(rec(2, "Two.", "greedy") + rec(3, "Three.", "sampled"))
    with lzma.open(os.path.join(d, "0000.jsonl.xz"), "wt") as f:
        f.write(rec(0, "Zero.", "greedy") + rec(1, "One.", "greedy"))
    out = os.path.join(tmp, "ds.txt")
    r = subprocess.run([sys.executable, SCRIPT, "--corpus", d, "--greedy-only", "--out", out],
                       capture_output=True, text=True, timeout=60)
    text = open(out).read() if os.path.exists(out) else ""
    report("script_corpus_shards", r.returncode == 0 and text == "Zero.\n\nOne.\n\nTwo.\n\n"
           and "1 sampled" in r.stderr, f"exit {r.returncode}, {r.stderr.strip()!r}, wrote {text!r}")
    with open(os.path.join(d, "0002.jsonl.xz"), "wb") as f:
        f.write(b"not xz at all")
    out2 = os.path.join(tmp, "ds2.txt")
    r = subprocess.run([sys.executable, SCRIPT, "--corpus", d, "--out", out2], capture_output=True, text=True,
                       timeout=60)
    report("script_damaged_shard", r.returncode != 0 and "0002.jsonl.xz" in r.stderr and not os.path.exists(out2)
           and not os.path.exists(out2 + ".tmp"), f"exit {r.returncode}, {r.stderr.strip()!r}")


def place(tmp, name):
    """A folder with its own copy of the binary (bin/specdec) and heads/; returns (folder, binary)."""
    d = os.path.join(tmp, name)
    os.makedirs(os.path.join(d, "bin"))
    os.makedirs(os.path.join(d, "heads"))
    shutil.copy(BIN, os.path.join(d, "bin", "specdec"))
    os.symlink(HEAD, os.path.join(d, "heads", os.path.basename(HEAD)))
    return d, os.path.join(d, "bin", "specdec")


def gen(binary, cwd, *extra):
    r = subprocess.run([binary, "generate", "-m", MODEL, "--chat", "-p", PROMPT, "--temp", "0", "-n", str(N),
                        "-t", "2", *extra], capture_output=True, text=True, timeout=300, cwd=cwd)
    try:
        j = json.loads(r.stdout) if "--json" in extra else None
    except ValueError:
        j = None
    return r, j


def engine_cases(tmp):
    names = ["head_auto_takes_datastore", "datastore_auto_none_says_so", "datastore_auto_needs_lookup",
             "bench_datastore_only_when_asked", "indexing_said_once"]
    for path, what in ((BIN, "build/specdec"), (MODEL, "the default model (make test fetches it)"),
                       (HEAD, "the shipped SmolLM2 head")):
        if not os.path.exists(path):
            for n in names:
                print(f"SKIP {n}: {what} not found at {path}")
            return
    d, b = place(tmp, "with")
    r0, plain = gen(b, d, "--json")
    if not plain:
        for n in names:
            report(n, False, f"plain generate failed: exit {r0.returncode}, {r0.stderr.strip()[-300:]!r}")
        return
    os.makedirs(os.path.join(d, "data", "datastore"))
    with open(os.path.join(d, "data", "datastore", "SmolLM2-135M-Instruct.txt"), "w") as f:
        f.write("An unrelated answer.\n\n" + plain["text"] + "\n\n")
    r1, ds = gen(b, d, "--json", "--head", "auto")
    r2, no = gen(b, d, "--json", "--head", "auto", "--datastore", "none")
    r3, same = gen(b, d, "--json", "--head", "auto", "--datastore", "none", "--method", "ngram:5-8:auto/eagle3:auto")
    if not ds or not no or not same:
        report(names[0], False, f"exit {r1.returncode} / {r2.returncode} / {r3.returncode}: "
                                f"{(r1.stderr + r2.stderr + r3.stderr).strip()[-300:]!r}")
    else:
        t1, t0 = ds["mean_accepted"], same["mean_accepted"]
        texts = [x["text"] == plain["text"] for x in (ds, no, same)]
        report(names[0], ds["method"] == "ngram:5-8:auto/eagle3:auto" and no["method"] == "ngram:3-8/eagle3:auto"
               and all(texts) and t1 >= GAIN * t0,
               f"methods {ds['method']!r} / {no['method']!r}, tokens per forward {t1:.2f} with the datastore, "
               f"{t0:.2f} without (want {GAIN}x), texts equal to plain decoding's: {texts}")
    e, be = place(tmp, "without")
    r, _ = gen(be, e, "--datastore", "auto", "--draft-ngram", "3,8")
    report(names[1], r.returncode == 0 and "no data/datastore/SmolLM2-135M-Instruct.txt" in r.stderr
           and "going on without one" in r.stderr and r.stdout.strip() == plain["text"].strip(),
           f"exit {r.returncode}, {r.stderr.strip()[-300:]!r}")
    r, _ = gen(b, d, "--datastore", "auto", "--head", "auto", "--method", "eagle3:chain:3")
    report(names[2], r.returncode == 1 and "--datastore needs an n-gram lookup" in r.stderr,
           f"exit {r.returncode}, {r.stderr.strip()[-300:]!r}")
    prompts = os.path.join(tmp, "one.jsonl")
    with open(prompts, "w") as f:
        f.write(json.dumps({"question_id": 1, "category": "writing", "turns": [PROMPT]}) + "\n")
    got = []
    for extra in ([], ["--datastore", "auto"]):
        out = os.path.join(tmp, f"bench{len(got)}.json")
        r = subprocess.run([b, "bench", "-m", MODEL, "--prompts", prompts, "-n", "16", "-t", "2", "--head", "auto",
                            "--methods", "ngram:3-8,auto", "--out", out, *extra], capture_output=True, text=True,
                           timeout=300, cwd=d)
        j = json.load(open(out)) if r.returncode == 0 and os.path.exists(out) else None
        # what auto ran, in the JSON and on the report's line, follows the datastore (sd_method_default)
        said = [ln for ln in r.stdout.splitlines() if ln.startswith("auto = ")]
        got.append((j.get("datastore", "absent"), j.get("auto_method"), said) if j
                   else f"exit {r.returncode}: {r.stderr.strip()[-200:]!r}")
    want = [(None, "ngram:3-8/eagle3:auto",
             ["auto = ngram:3-8/eagle3:auto (the default method with the heads loaded)."]),
            ("data/datastore/SmolLM2-135M-Instruct.txt", "ngram:5-8:auto/eagle3:auto",
             ["auto = ngram:5-8:auto/eagle3:auto (the default method with the heads loaded)."])]
    report(names[3], got == want, f"bench's datastore and auto's method without and with --datastore auto: {got}")
    small = os.path.join(tmp, "small.txt")
    with open(small, "w") as f:
        f.write("The keeper spoke to the sea every night.\n\n")
    said = []
    for _ in range(2):
        r = subprocess.run([b, "generate", "-m", MODEL, "-p", "The keeper", "-n", "4", "-t", "2", "--draft-ngram",
                            "3,8", "--datastore", small], capture_output=True, text=True, timeout=120)
        said.append(r.returncode == 0 and "indexing the datastore" in r.stderr)
    report(names[4], said == [True, False] and os.path.exists(small + ".sdsa"),
           f"the note said on the first and second use: {said}; index written: {os.path.exists(small + '.sdsa')}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        script_cases(tmp)
        engine_cases(tmp)
    sys.exit(exit_status())


if __name__ == "__main__":
    main()
