#!/usr/bin/env python3
"""test_corpus_shards.py - scripts/corpus-shards.py: pack appends only new
records as a new shard and never rewrites an earlier one; unpack adds to an
existing chat.jsonl only what it lacks; check catches a shard that differs from
the manifest; the size cap refuses a pack; and the committed shards of
data/corpus match their manifest. Prints PASS/FAIL lines."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
SCRIPT = os.path.join(ROOT, "scripts", "corpus-shards.py")


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def write(path, ids):
    with open(path, "w") as f:
        for i in ids:
            f.write(json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                {"role": "assistant", "content": f"a{i}"}], "meta": {"completion_tokens": 3}}) + "\n")


def ids_of(path):
    with open(path) as f:
        return [json.loads(line)["id"] for line in f if line.strip()]


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    with tempfile.TemporaryDirectory() as t:
        d = os.path.join(t, "corpus", "x")
        src = os.path.join(t, "chat.jsonl")
        write(src, range(10))
        rc, out = run("pack", "--dir", d, "--src", src, "--made-by", "test")
        report("pack_first", rc == 0 and os.path.exists(os.path.join(d, "0000.jsonl.xz")), out)
        h0 = digest(os.path.join(d, "0000.jsonl.xz"))
        write(src, range(15))  # 5 new records, 10 old ones
        rc, out = run("pack", "--dir", d, "--src", src, "--made-by", "test")
        m = json.load(open(os.path.join(d, "manifest.json")))
        report("pack_appends_only_new", rc == 0 and [s["records"] for s in m["shards"]] == [10, 5]
               and digest(os.path.join(d, "0000.jsonl.xz")) == h0, f"{out} {m}")
        rc, out = run("pack", "--dir", d, "--src", src, "--made-by", "test")
        report("pack_nothing_new", rc == 0 and "nothing to pack" in out
               and len(json.load(open(os.path.join(d, "manifest.json")))["shards"]) == 2, out)
        o = os.path.join(t, "train")
        os.makedirs(o)
        write(os.path.join(o, "chat.jsonl"), [3, 20])  # one record the shards hold, one they do not
        rc, out = run("unpack", "--dir", d, "--out", o)
        got = ids_of(os.path.join(o, "chat.jsonl"))
        report("unpack_union_no_duplicates", rc == 0 and len(got) == 16 and len(set(got)) == 16
               and got[:2] == ["r3", "r20"], f"{out} {got}")
        # a run killed while writing: a torn last line, or a last record without its newline
        for tail, name in ((b'{"id": "r9', "torn"), (b"", "no_newline")):
            o2 = os.path.join(t, "train-" + name)
            os.makedirs(o2)
            write(os.path.join(o2, "chat.jsonl"), [20, 21])
            with open(os.path.join(o2, "chat.jsonl"), "rb+") as f:
                data = f.read()
                f.seek(0)
                f.truncate()
                f.write(data[:-1] + tail if not tail else data + tail)
            rc, out = run("unpack", "--dir", d, "--out", o2)
            try:
                got = ids_of(os.path.join(o2, "chat.jsonl"))
            except ValueError as e:
                got = [f"not JSON: {e}"]
            report(f"unpack_after_{name}", rc == 0 and len(got) == 17 and got[:2] == ["r20", "r21"], f"{out} {got}")
        rc, out = run("check", "--dir", d)
        report("check_ok", rc == 0, out)
        p1 = os.path.join(d, "0001.jsonl.xz")
        with open(p1, "ab") as f:
            f.write(b"x")
        rc, out = run("check", "--dir", d)
        report("check_catches_change", rc != 0 and "MISMATCH" in out, out)
        write(src, range(15, 2015))
        rc, out = run("pack", "--dir", d, "--src", src, "--made-by", "test", "--cap-mib", "0.0001")
        report("cap_refuses", rc != 0 and "over the cap" in out
               and not os.path.exists(os.path.join(d, "0002.jsonl.xz")), out)
    base = os.path.join(ROOT, "data", "corpus")
    dirs = sorted(e for e in os.listdir(base) if os.path.exists(os.path.join(base, e, "manifest.json")))
    bad = []
    for e in dirs:   # every committed corpus (one folder a writer model)
        rc, out = run("check", "--dir", os.path.join(base, e))
        if rc != 0:
            bad.append(f"{e}: {out}")
    report("committed_shards_match_manifest", "smollm2" in dirs and not bad, f"folders {dirs}; " + "; ".join(bad))
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
