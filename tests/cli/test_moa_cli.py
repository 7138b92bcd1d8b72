#!/usr/bin/env python3
"""test_moa_cli.py - the MoA drafter (docs/moa.md) through the programs, on
the default model (SmolLM2-135M) with drafter files from
build/tests/tool_random_head:

- moa_generate_lossless: `specdec generate --temp 0` with moa:chain:3,
  moa:dyn:2-3-8, moa:auto, ngram:3-8/moa:auto and no --method (the default
  with an MoA file, ngram:3-8/moa:auto) (a random TLI-1 drafter) prints
  plain decoding's text; so do moa:chain:3 and moa:auto with a random
  drafter whose CA and SA also read the target's states (`--ca-hidden
  --sa-hidden`), which
  drafts on every step (no "without the target's states" note), and with a
  random TLI-1 drafter whose SA sees the whole text (`--sa-full`);
- moa_exact_accepted: a drafter that is the target itself (SA and CA pass the
  embedding through, TLI runs every layer: `moa-exact`) has most of its
  drafts accepted (its cache reading, RoPE and TLI path on a real model);
- moa_serve: `specdec serve --head MOA.gguf` takes a request with
  "speculation": "moa:chain:3" and answers plain decoding's text (the
  request with speculation "off");
- moa_compare_heads: scripts/compare-heads.py with the shipped EAGLE-3 head
  and the exact drafter, `--methods eagle3:chain:3`: the MoA file runs as
  moa:chain:3, its text equals plain decoding's, and its tau over the
  EAGLE-3 head's (tau_vs_first_head) is above 1;
- moa_refusals: clear errors for --tli (--ca-hidden, --sa-full) without --type moa, --sa-full
  with --sa-hidden, a TLI beyond the
  target's layers, moa methods without an MoA drafter (and split-client
  writes a client file for a --ca-hidden drafter: the server sends the
  states it reads); and
  scripts/compare-drafters.py's for an unknown kind (also with a -ffN suffix:
  a width below 16, an unknown base) and a list that does not start with
  eagle3.

Prints PASS/FAIL/SKIP lines. Skipped without the model or the tool.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
BIN = os.path.abspath(os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec")))
TOOL = os.path.join(ROOT, "build", "tests", "tool_random_head")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
CASES = ["moa_generate_lossless", "moa_exact_accepted", "moa_head_bits", "moa_serve", "moa_compare_heads",
         "moa_refusals"]
EAGLE = os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct.eagle3.gguf")
PROMPTS = os.path.normpath(os.path.join(ROOT, "..", "shared", "prompts", "dev.jsonl"))
PROMPT = "Name three colours of the rainbow."


def run(args, timeout=600):
    return subprocess.run([BIN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def generate(method, head=None, extra=()):
    args = ["generate", "-m", MODEL, "--chat", "-p", PROMPT, "-n", "40", "--temp", "0", "-t", "2", "-v", *extra]
    if method != "ar":
        args += (["--method", method] if method else []) + ["--head", head]
    return run(args)


def mean_accepted(stderr):
    m = re.search(r"mean accepted ([0-9.]+) tokens/forward", stderr)
    return float(m.group(1)) if m else 0.0


def main():
    if not os.path.exists(MODEL) or not os.access(BIN, os.X_OK) or not os.access(TOOL, os.X_OK):
        for c in CASES:
            print(f"SKIP {c}: needs {MODEL}, {BIN} and {TOOL} (make; scripts/fetch-models.sh)")
        sys.exit(0)
    with tempfile.TemporaryDirectory(prefix="specdec-moa-") as d:
        rnd, exact = os.path.join(d, "moa.gguf"), os.path.join(d, "exact.gguf")
        hid, full = os.path.join(d, "hid.gguf"), os.path.join(d, "safull.gguf")
        for path, kind in ((rnd, "moa-tli1"), (exact, "moa-exact"), (hid, "moa-nolsa-hid2"),
                           (full, "moa-tli1-nolsa-hid-safull")):
            out = subprocess.run([TOOL, MODEL, path, kind, "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, timeout=300)
            if out.returncode != 0:
                for c in CASES:
                    report(c, False, f"tool_random_head {kind}: {out.stderr.strip()}")
                sys.exit(exit_status())
        ar = generate("ar")
        bad = [] if ar.returncode == 0 else [f"ar: {ar.stderr[-300:]}"]
        for m in ("moa:chain:3", "moa:dyn:2-3-8", "moa:auto", "ngram:3-8/moa:auto", "ngram:2-4+moa:auto", ""):
            o = generate(m, rnd)   # "": no --method, the default of --head (ngram:3-8/moa:auto)
            if o.returncode != 0 or o.stdout != ar.stdout or (not m and "ngram:3-8/moa:auto" not in o.stderr):
                bad.append(f"{m}: exit {o.returncode}, {o.stdout!r} vs {ar.stdout!r} {o.stderr[-300:]}")
        for m in ("moa:chain:3", "moa:auto"):   # CA reads the target's states (--ca-hidden): handed in by the engine
            o = generate(m, hid)
            if o.returncode != 0 or o.stdout != ar.stdout or "without the target" in o.stderr:
                bad.append(f"ca-hidden {m}: exit {o.returncode}, {o.stdout!r} vs {ar.stdout!r} {o.stderr[-300:]}")
        for m in ("moa:chain:3", "moa:auto"):   # SA sees the whole text (--sa-full)
            o = generate(m, full)
            if o.returncode != 0 or o.stdout != ar.stdout or "without the target" in o.stderr:
                bad.append(f"sa-full {m}: exit {o.returncode}, {o.stdout!r} vs {ar.stdout!r} {o.stderr[-300:]}")
        report("moa_generate_lossless", not bad, "; ".join(bad))

        o = generate("moa:chain:4", exact)
        tau = mean_accepted(o.stderr)
        print(f"  info: the exact drafter on SmolLM2, moa:chain:4: tau {tau:.2f}")
        report("moa_exact_accepted", o.returncode == 0 and o.stdout == ar.stdout and tau > 2.0,
               f"exit {o.returncode}, tau {tau}: {o.stderr[-400:]}")

        # --head-bits: the drafter's matrices (and the target layers it borrows) at 8, 5 and 4 bits; the
        # exact drafter stays the target within the rounding, every width lossless; 6 is refused
        bad, taus = [], []
        for bits in ("8", "5", "4"):
            o = generate("moa:chain:4", exact, ("--head-bits", bits))
            taus.append(mean_accepted(o.stderr))
            if o.returncode != 0 or o.stdout != ar.stdout or taus[-1] <= 2.0:
                bad.append(f"{bits} bits: exit {o.returncode}, tau {taus[-1]}, {o.stderr[-300:]}")
        print(f"  info: the exact drafter at 8 / 5 / 4 bits: tau {' / '.join(f'{t:.2f}' for t in taus)}")
        o = generate("moa:chain:4", exact, ("--head-bits", "6"))
        if o.returncode == 0 or "8, 5 or 4" not in o.stderr:
            bad.append(f"6 bits: exit {o.returncode}, {o.stderr[-300:]}")
        report("moa_head_bits", not bad, "; ".join(bad))

        try:
            from serve_proc import ServeProcess
            s = ServeProcess(BIN, MODEL, "--head", rnd, "--method", "moa:chain:3", "-t", "2")
            texts, info = [], []
            for spec in ("moa:chain:3", "off"):
                body = json.dumps({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "speculation": spec})
                st, _, data = s.raw("POST", "/v1/completions", body)
                j = json.loads(data) if st == 200 else {}
                texts.append(j.get("choices", [{}])[0].get("text"))
                info.append((st, json.dumps(j)))
            rc = s.stop()
            report("moa_serve", texts[0] is not None and texts[0] == texts[1] and "moa:chain:3" in info[0][1],
                   f"{[i[1][-300:] for i in info]}, texts {texts}, exit {rc}")
        except Exception as e:  # noqa: BLE001
            report("moa_serve", False, repr(e))

        if not os.path.exists(PROMPTS):
            print(f"SKIP moa_compare_heads: needs {PROMPTS} (../shared beside the checkout)")
        else:
            o = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare-heads.py"), "-m", MODEL,
                                "--head", EAGLE, "--head", exact, "--methods", "eagle3:chain:3", "--rounds", "1",
                                "--limit", "2", "-n", "24", "-t", "2", "--bin", BIN, "--prompts", PROMPTS],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
            try:
                e = json.loads(o.stdout)["heads"][1]["methods"]["eagle3:chain:3"]
            except (ValueError, KeyError, IndexError):
                e = {}
            ratio = e.get("tau_vs_first_head", {}).get("median", 0.0)
            print(f"  info: compare-heads, exact MoA drafter's tau over the EAGLE-3 head's: {ratio}")
            report("moa_compare_heads", o.returncode == 0 and e.get("ran_as") == "moa:chain:3" and ratio > 1.0,
                   f"exit {o.returncode}, {e}, {o.stderr[-300:]}")

        errs = []
        data = os.path.join(d, "data.jsonl")
        with open(data, "w") as f:
            f.write('{"text": "one two three"}\n')
        o = run(["train-head", "-m", MODEL, "--type", "eagle3", "--tli", "1", "--data", data, "-o",
                 os.path.join(d, "x.gguf")])
        if o.returncode == 0 or "--type moa" not in o.stderr:
            errs.append(f"--tli with eagle3: {o.returncode} {o.stderr[-200:]}")
        for extra, want in ((["--type", "eagle3", "--moa-block", "2-5"], "--moa-block is for an MoA drafter"),
                            (["--type", "eagle3", "--ca-hidden"], "--sa-full are for an MoA drafter"),
                            (["--type", "eagle3", "--sa-hidden"], "--sa-full are for an MoA drafter"),
                            (["--type", "eagle3", "--sa-full"], "--sa-full are for an MoA drafter"),
                            (["--type", "moa", "--sa-full", "--sa-hidden"], "--sa-full with --sa-hidden"),
                            (["--type", "moa", "--moa-block", "5-2"], "1 <= MIN <= MAX <= 64"),
                            (["--type", "moa", "--moa-block", "0"], "got '0'"),
                            (["--type", "moa", "--moa-block", "2-x"], "got '2-x'"),
                            (["--type", "moa", "--moa-block", " 3"], "got ' 3'"),
                            (["--type", "moa", "--moa-block", "+2-5"], "got '+2-5'"),
                            (["--type", "moa", "--moa-block", "4294967298"], "got '4294967298'")):
            o = run(["train-head", "-m", MODEL, *extra, "--data", data, "-o", os.path.join(d, "x.gguf")])
            if o.returncode == 0 or want not in o.stderr:
                errs.append(f"train-head {' '.join(extra)}: {o.returncode} {o.stderr[-200:]}")
        o = run(["generate", "-m", MODEL, "-p", "hi", "-n", "4", "--method", "moa:chain:3"])
        if o.returncode == 0 or "MoA" not in o.stderr:
            errs.append(f"moa without a drafter: {o.returncode} {o.stderr[-200:]}")
        o = run(["generate", "-m", MODEL, "-p", "hi", "-n", "4", "--method", "moa:chain:3", "--head",
                 os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct.eagle3.gguf")])
        if o.returncode == 0 or "MoA" not in o.stderr:
            errs.append(f"moa with an EAGLE-3 head: {o.returncode} {o.stderr[-200:]}")
        print("  info: " + o.stderr.strip().splitlines()[-1] if o.stderr.strip() else "  info: (no message)")
        o = run(["split-client", "-m", MODEL, "--head", hid, "--out", os.path.join(d, "c.gguf")])
        if o.returncode != 0 or not os.path.exists(os.path.join(d, "c.gguf")):   # the server sends the states
            errs.append(f"split-client with a --ca-hidden drafter: {o.returncode} {o.stderr[-200:]}")
        cd = [sys.executable, os.path.join(ROOT, "scripts", "compare-drafters.py"), "-m", MODEL, "--data", data,
              "--work", os.path.join(d, "cd"), "--bin", BIN]
        for kinds, want in (("eagle3,moa-tli9", "unknown kind 'moa-tli9'"), ("moa,eagle3", "must be eagle3"),
                            ("eagle3,moa-ff8", "unknown kind 'moa-ff8'"), ("eagle3,moa-tli9-ff768", "unknown kind")):
            o = subprocess.run(cd + ["--kinds", kinds], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=60)
            if o.returncode == 0 or want not in o.stderr or os.path.exists(os.path.join(d, "cd")):
                errs.append(f"compare-drafters --kinds {kinds}: {o.returncode} {o.stderr[-200:]}")
        report("moa_refusals", not errs, "; ".join(errs))
    sys.exit(exit_status())


if __name__ == "__main__":
    main()
