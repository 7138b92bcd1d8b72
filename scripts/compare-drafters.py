#!/usr/bin/env python3
"""compare-drafters.py - EAGLE-3 and MoA drafters trained on the same data
for the same time, then benched side by side (issue 29's comparison).

For each drafter kind it builds the feature cache once (untimed: the same
target pass over the same data for every kind of a cache: cache-eagle3,
cache-moa for the LSA kinds (tokens and labels; they recompute the K,V rows
while training), cache-moa-nolsa for the no-LSA kinds (the reduced K,V form,
kept for the largest TLI asked)), measures the
kind's training rate in probe runs, then trains it from scratch with the
same seed and threads for as long as the first kind (EAGLE-3) trained, which
is given by --minutes (positions = rate x time, so that each run's
learning-rate schedule completes; a run more than 10% off that time is
trained again once at the rate it had). Then
scripts/compare-heads.py benches them interleaved, the EAGLE-3 head first,
every `eagle3:` method running as `moa:` for an MoA drafter, and the result
(training figures and the bench's JSON) is written to WORK/compare.json and
printed. Resumable: a drafter already trained (its file and its record in
WORK/trained.json) is kept when its time is within 10% of the first kind's
or it was trained for that very time (both of its tries having missed).

Kinds: eagle3 (lr 1e-3, batch 8, 256 positions a sequence), eagle3-ttt1 (the
same trained one step ahead, --ttt 1: nearer the EAGLE baseline the MoA paper
measured against), moa, moa-nolsa,
moa-tli1, moa-tli1-nolsa, moa-tli2-nolsa (lr 1e-3, batch 4, 128 positions:
docs/moa.md), moa-nolsa-hid and moa-tli1-nolsa-hid (CA also reads the target's
states: train-head --ca-hidden), moa-nolsa-hid2 and moa-tli1-nolsa-hid2 (SA's
input too: --sa-hidden); moa-safull, moa-nolsa-safull, moa-tli1-nolsa-safull,
moa-nolsa-hid-safull and moa-tli1-nolsa-hid-safull (SA sees the whole text:
--sa-full); an MoA kind with the suffix -bMIN-MAX (moa-nolsa-b2-5) draws
its verified points every MIN-MAX positions (train-head --moa-block); any kind
with the suffix -ffN (moa-nolsa-safull-b2-5-ff768) has layers with a
feed-forward of N (train-head --ff N) whatever --ff says.

usage: scripts/compare-drafters.py -m MODEL --data FILE [--data FILE ...]
         --work DIR [--minutes M] [--kinds LIST] [--ff N] [-t T]
         [--prompts FILE] [--limit K] [-n N] [--rounds R] [--methods LIST]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = {
    "eagle3": (["--type", "eagle3", "--batch", "8", "--lr", "1e-3"], 8000),
    # trained one step ahead, without the training-time test: nearer the reference's EAGLE baseline (docs/moa.md)
    "eagle3-ttt1": (["--type", "eagle3", "--batch", "8", "--lr", "1e-3", "--ttt", "1"], 8000),
    "moa": (["--type", "moa", "--seq-len", "128", "--batch", "4", "--lr", "1e-3"], 1500),
    "moa-nolsa": (["--type", "moa", "--no-lsa", "--seq-len", "128", "--batch", "4", "--lr", "1e-3"], 3000),
    "moa-tli1": (["--type", "moa", "--tli", "1", "--seq-len", "128", "--batch", "4", "--lr", "1e-3"], 1500),
    "moa-tli1-nolsa": (["--type", "moa", "--tli", "1", "--no-lsa", "--seq-len", "128", "--batch", "4",
                        "--lr", "1e-3"], 2000),
    "moa-tli2-nolsa": (["--type", "moa", "--tli", "2", "--no-lsa", "--seq-len", "128", "--batch", "4",
                        "--lr", "1e-3"], 2000),
}
for _k in ("moa-nolsa", "moa-tli1-nolsa"):   # -hid: CA also reads the target's states (train-head --ca-hidden);
    KINDS[_k + "-hid"] = (KINDS[_k][0] + ["--ca-hidden"], KINDS[_k][1])   # -hid2: and SA's input (--sa-hidden)
    KINDS[_k + "-hid2"] = (KINDS[_k][0] + ["--ca-hidden", "--sa-hidden"], KINDS[_k][1])
for _k in ("moa", "moa-nolsa", "moa-tli1-nolsa", "moa-nolsa-hid", "moa-tli1-nolsa-hid"):
    KINDS[_k + "-safull"] = (KINDS[_k][0] + ["--sa-full"], KINDS[_k][1])   # SA sees the whole text (--sa-full)
# Kind suffixes: (pattern, valid, the train-head options added to the base kind's).
#   KIND-bMIN-MAX: an MoA kind with verified points every MIN-MAX positions (--moa-block; the kinds above
#                  keep the default 6-15);
#   KIND-ffN:      any kind with a feed-forward of N in its layers (--ff N, instead of --ff's width).
SUFFIXES = (
    (re.compile(r"^(moa[a-z0-9-]*?)-b(\d+)-(\d+)$"), lambda m: 1 <= int(m[2]) <= int(m[3]) <= 64,
     lambda m: ["--moa-block", f"{m[2]}-{m[3]}"]),
    (re.compile(r"^(.+)-ff(\d+)$"), lambda m: 16 <= int(m[2]) <= 65536, lambda m: ["--ff", m[2]]),
)


def add_kind(kind):
    """True if kind is known or is a known kind with suffixes (then registered in KINDS), else False."""
    if kind in KINDS:
        return True
    for pattern, valid, opts in SUFFIXES:
        m = pattern.match(kind)
        if m and valid(m) and add_kind(m[1]) and opts(m)[0] not in KINDS[m[1]][0]:   # each suffix once
            KINDS[kind] = (KINDS[m[1]][0] + opts(m), KINDS[m[1]][1])
            return True
    return False


DONE = re.compile(r"wrote .*\((\d+) steps, (\d+) tokens, (\d+) s of training\)")
HELD = re.compile(r"held back: loss ([0-9.]+), agreement ([0-9.% ]+)")


def log(msg):
    print(f"compare-drafters: {msg}", file=sys.stderr, flush=True)


def data_args(a):
    return [x for d in a.data for x in ("--data", d)]


def ff_args(a):
    return ["--ff", str(a.ff)] if a.ff else []


def train_opts(a, kind):
    """A kind's train-head options: its own, then --ff's width unless the kind names one (-ffN)."""
    return KINDS[kind][0] + ([] if "--ff" in KINDS[kind][0] else ff_args(a))


def nolsa(kind):
    return "--no-lsa" in KINDS[kind][0]


def tli(kind):
    o = KINDS[kind][0]
    return int(o[o.index("--tli") + 1]) if "--tli" in o else 0


def cache_name(kind):
    return "cache-eagle3" if kind.startswith("eagle3") else "cache-moa-nolsa" if nolsa(kind) else "cache-moa"


def cache_opts(kind, kinds):
    """The options of the cache build: a no-LSA kind's keeps the rows of the largest TLI of those asked."""
    if not nolsa(kind):
        return KINDS[kind][0]
    n = max(tli(k) for k in kinds if nolsa(k))
    return ["--type", "moa", "--no-lsa", "--tli", str(n)]


def train(a, kind, out, tokens, cache):
    """One train-head run from scratch; returns (steps, tokens, seconds, held-back text)."""
    opts = train_opts(a, kind)
    ckpt = out + ".ckpt"
    for f in (out, ckpt):
        if os.path.exists(f):
            os.remove(f)
    cmd = [a.bin, "train-head", "-m", a.model, *data_args(a), "--out", out,
           "--cache", cache, "--ckpt", ckpt, "--ckpt-minutes", "0", "--tokens", str(tokens), "--seed", "42",
           "-t", str(a.threads), *opts]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"compare-drafters: {kind}: train-head failed (exit {p.returncode}):\n{p.stderr[-1500:]}")
    m, h = DONE.search(p.stderr), HELD.search(p.stdout)   # the summary line is on stdout
    if not m:
        sys.exit(f"compare-drafters: {kind}: no summary line in train-head's output:\n{p.stderr[-800:]}")
    if os.path.exists(ckpt):
        os.remove(ckpt)
    held = {"loss": float(h.group(1)), "agreement_by_depth": [float(x) / 100 for x in
                                                              h.group(2).replace("%", " ").split()]} if h else None
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), held


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--data", action="append", required=True, help="training data (JSON lines; repeatable)")
    ap.add_argument("--work", required=True, help="work directory (caches, drafters, results)")
    ap.add_argument("--minutes", type=float, default=8.0, help="training time per drafter (default 8)")
    ap.add_argument("--kinds", default="eagle3,moa,moa-nolsa,moa-tli1,moa-tli1-nolsa")
    ap.add_argument("--ff", type=int, default=0,
                    help="feed-forward width of every drafter's layers (default: the target's; the Qwen head: 3072)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompts", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "prompts", "dev.jsonl")))
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", default="eagle3:chain:3,eagle3:auto")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "specdec"))
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    for k in kinds:
        if not add_kind(k):
            ap.error(f"--kinds: unknown kind '{k}' (known: {', '.join(KINDS)}, any MoA kind with a suffix "
                     "-bMIN-MAX for --moa-block MIN-MAX, and any kind with a suffix -ffN for --ff N)")
    if kinds[0] != "eagle3":
        ap.error("--kinds: the first kind must be eagle3 (the others are compared with it)")
    for f in a.data + [a.model, a.bin, a.prompts]:
        if not os.path.exists(f):
            ap.error(f"{f}: not found")
    if a.minutes <= 0:
        ap.error("--minutes must be positive")
    os.makedirs(a.work, exist_ok=True)
    rec_path = os.path.join(a.work, "trained.json")
    trained = json.load(open(rec_path)) if os.path.exists(rec_path) else {}
    target = None   # seconds of training every kind gets: the first kind's, as it ran
    for k in kinds:
        out = os.path.join(a.work, f"{k}.gguf")
        rec = trained.get(k) if os.path.exists(out) and trained.get(k, {}).get("minutes") == a.minutes else None
        real = lambda paths: [os.path.realpath(x) for x in paths]   # noqa: E731
        if rec and (rec.get("options") != train_opts(a, k) or real(rec.get("data", a.data)) != real(a.data)
                    or os.path.realpath(rec.get("model", a.model)) != os.path.realpath(a.model)):
            log(f"{k}: the drafter in {out} was trained with other options, data or target: trained again")
            rec = None
        # kept: the first kind's drafter, one within 10% of its time, or one trained for that very time
        # (whose two tries both missed by more, as a run on a loaded machine may)
        if rec and (target is None or abs(rec["seconds"] - target) <= 0.1 * target
                    or abs(rec.get("target", -1) - target) < 0.5):
            log(f"{k}: kept ({rec['tokens']} positions in {rec['seconds']} s)")
            target = target or rec["seconds"]
            continue
        want = target or a.minutes * 60
        cache = os.path.join(a.work, cache_name(k))
        t0 = time.time()
        p = subprocess.run([a.bin, "train-head", "-m", a.model, *data_args(a), "--out", out, "--cache", cache,
                            "--cache-only", "-t", str(a.threads), *cache_opts(k, kinds), *ff_args(a)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit(f"compare-drafters: {k}: the feature cache {cache} could not be built or reused "
                     f"(exit {p.returncode}):\n{p.stderr[-1200:]}\n(another --work directory, or delete {cache})")
        log(f"{k}: cache ready in {time.time() - t0:.0f} s")
        if rec:   # trained before for another length of time: scale by its own rate
            rate = rec["tokens"] / max(rec["seconds"], 1)
        else:     # a short probe, then one of about 45 s: the rate is their difference (a run's fixed costs cancel)
            probe = os.path.join(a.work, f"probe-{k}.gguf")
            _, tok1, sec1, _ = train(a, k, probe, KINDS[k][1], cache)
            _, tok2, sec2, _ = train(a, k, probe, int(tok1 / max(sec1, 1) * 45), cache)
            os.remove(probe)
            rate = (tok2 - tok1) / (sec2 - sec1) if sec2 > sec1 and tok2 > tok1 else tok2 / max(sec2, 1)
        for _ in range(2):
            tokens = int(rate * want)
            log(f"{k}: {rate:.0f} positions/s; training {tokens} positions (~{want:.0f} s)")
            steps, tok, sec, held = train(a, k, out, tokens, cache)
            log(f"{k}: {tok} positions in {sec} s; held back {held}")
            if abs(sec - want) <= 0.1 * want:
                break
            rate = tok / max(sec, 1)   # once more at the rate the run itself had
        trained[k] = {"file": out, "minutes": a.minutes, "rate": round(rate, 1), "steps": steps,
                      "tokens": tok, "seconds": sec, "target": want, "held_back": held, "options": train_opts(a, k),
                      "data": a.data, "model": a.model}
        target = target or sec
        with open(rec_path + ".tmp", "w") as f:
            json.dump(trained, f, indent=1)
        os.replace(rec_path + ".tmp", rec_path)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "compare-heads.py"), "-m", a.model, "--prompts", a.prompts,
           "--methods", a.methods, "--rounds", str(a.rounds), "-n", str(a.n), "-t", str(a.threads), "--bin", a.bin]
    if a.limit:
        cmd += ["--limit", str(a.limit)]
    for k in kinds:
        cmd += ["--head", trained[k]["file"]]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"compare-drafters: compare-heads.py failed (exit {p.returncode})")
    res = {"data": a.data, "minutes": a.minutes, "threads": a.threads,
           "trained": {k: trained[k] for k in kinds}, "bench": json.loads(p.stdout)}
    with open(os.path.join(a.work, "compare.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
