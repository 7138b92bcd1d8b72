#!/usr/bin/env python3
"""corpus-shards.py - the drafters' training corpus kept in the repository as
append-only, xz-compressed shards (data/corpus/), so that a recipe resumes on a
fresh machine instead of answering every prompt again.

  pack    append the records of a make-train-data chat.jsonl that no shard
          holds yet (by "id") as one new shard; earlier shards are never
          rewritten. Refuses when the shards would pass --cap-mib in all.
  unpack  write the shards' records into OUT/chat.jsonl (keeping the records
          already there, adding those missing; nothing is written twice), so
          that make-train-data.py continues from them and train-head reads them.
  check   verify every shard against the manifest (sha256, record count).

The manifest (data/corpus/<name>/manifest.json) lists each shard with its
sha256, record and token counts, the command that made its records and the
date; the licences of the sources sit beside it (data/corpus/README.md).
Python standard library only.
"""
import argparse
import datetime
import hashlib
import json
import lzma
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from traindata.jsonl import read_jsonl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DIR = os.path.join(ROOT, "data", "corpus", "smollm2")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def load_manifest(d):
    p = os.path.join(d, "manifest.json")
    if not os.path.exists(p):
        return {"shards": []}
    with open(p) as f:
        return json.load(f)


def save_manifest(d, m):
    p = os.path.join(d, "manifest.json")
    with open(p + ".tmp", "w") as f:
        json.dump(m, f, indent=1)
        f.write("\n")
    os.replace(p + ".tmp", p)


def read_records(path, opener=open):
    """Yields (id, line) of a JSONL file; a line that is not a JSON object with an id stops with its line number."""
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            if not isinstance(r, dict) or "id" not in r:
                sys.exit(f"{path}:{n}: a record needs an \"id\"")
            yield str(r["id"]), line, r


def shard_ids(d, m):
    ids = set()
    for s in m["shards"]:
        for rid, _, _ in read_records(os.path.join(d, s["file"]), lzma.open):
            ids.add(rid)
    return ids


def cmd_check(a):
    m = load_manifest(a.dir)
    if not m["shards"]:
        sys.exit(f"{a.dir}: no shards (manifest.json missing or empty)")
    bad = 0
    for s in m["shards"]:
        p = os.path.join(a.dir, s["file"])
        if not os.path.exists(p):
            print(f"{s['file']}: missing")
            bad += 1
            continue
        h = sha256(p)
        n = sum(1 for _ in read_records(p, lzma.open))
        ok = h == s["sha256"] and n == s["records"]
        bad += not ok
        print(f"{s['file']}: {n} records, {'ok' if ok else 'MISMATCH (sha256 or record count differs from the manifest)'}")
    if bad:
        sys.exit(f"{bad} shard(s) do not match the manifest")
    return 0


def cmd_pack(a):
    os.makedirs(a.dir, exist_ok=True)
    m = load_manifest(a.dir)
    have = shard_ids(a.dir, m)
    new, tokens, seen = [], 0, set()
    for rid, line, r in read_records(a.src):
        if rid in have or rid in seen:
            continue
        seen.add(rid)
        new.append(line)
        tokens += int((r.get("meta") or {}).get("completion_tokens") or 0)
    if not new:
        print(f"nothing to pack: every record of {a.src} is in a shard already ({len(have)} records)")
        return 0
    name = f"{len(m['shards']):04d}.jsonl.xz"
    path = os.path.join(a.dir, name)
    if os.path.exists(path):
        sys.exit(f"{path} exists but the manifest does not list it: remove it or restore the manifest")
    with lzma.open(path + ".tmp", "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        for line in new:
            f.write(line + "\n")
    size = os.path.getsize(path + ".tmp")
    total = sum(os.path.getsize(os.path.join(a.dir, s["file"])) for s in m["shards"]) + size
    cap = int(a.cap_mib * (1 << 20))
    corpus_total = total
    top = os.path.dirname(os.path.abspath(a.dir))
    for sub in os.listdir(top) if os.path.isdir(top) else []:
        sd = os.path.join(top, sub)
        if os.path.isdir(sd) and os.path.abspath(sd) != os.path.abspath(a.dir):
            corpus_total += sum(os.path.getsize(os.path.join(sd, f)) for f in os.listdir(sd) if f.endswith(".xz"))
    if corpus_total > cap:
        os.unlink(path + ".tmp")
        sys.exit(f"refused: the corpus would hold {corpus_total / 2**20:.1f} MiB, over the cap of {a.cap_mib} MiB")
    os.replace(path + ".tmp", path)
    m["shards"].append({
        "file": name, "records": len(new), "completion_tokens": tokens, "bytes": size, "sha256": sha256(path),
        "made_by": a.made_by, "date": datetime.date.today().isoformat()})
    save_manifest(a.dir, m)
    print(f"{name}: {len(new)} new records, {tokens} generated tokens, {size / 2**20:.2f} MiB "
          f"(corpus {corpus_total / 2**20:.1f} of {a.cap_mib} MiB)")
    return 0


def cmd_unpack(a):
    m = load_manifest(a.dir)
    if not m["shards"]:
        sys.exit(f"{a.dir}: no shards to unpack")
    os.makedirs(a.out, exist_ok=True)
    dst = os.path.join(a.out, "chat.jsonl")
    have = set()
    if os.path.exists(dst):
        read_jsonl(dst, repair=True)   # a torn last line (a killed run) cut, a missing newline added
        have = {rid for rid, _, _ in read_records(dst)}
    added = 0
    with open(dst, "a", encoding="utf-8") as f:   # whole lines: a kill leaves at most a torn last one
        for s in m["shards"]:
            for rid, line, _ in read_records(os.path.join(a.dir, s["file"]), lzma.open):
                if rid not in have:
                    have.add(rid)
                    f.write(line + "\n")
                    added += 1
    print(f"{dst}: {added} records added from {len(m['shards'])} shard(s), {len(have)} in all")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="corpus-shards.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python3 scripts/corpus-shards.py unpack --out data/train\n"
                                        "  python3 scripts/corpus-shards.py pack --src data/train/chat.jsonl "
                                        "--made-by 'make-train-data.py --max-prompts 32000 ...'")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("pack", "unpack", "check"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=DEFAULT_DIR, help="shard folder (default data/corpus/smollm2)")
        if name == "pack":
            p.add_argument("--src", required=True, help="a make-train-data chat.jsonl")
            p.add_argument("--made-by", required=True, help="the command that made the records (kept in the manifest)")
            p.add_argument("--cap-mib", type=float, default=32, help="the cap of data/corpus in all (default 32 MiB)")
        if name == "unpack":
            p.add_argument("--out", default=os.path.join(ROOT, "data", "train"), help="folder of chat.jsonl (default data/train)")
    a = ap.parse_args(argv)
    return {"pack": cmd_pack, "unpack": cmd_unpack, "check": cmd_check}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
