"""Stage c: text.jsonl, raw documentation sections and standard-library
functions for teacher forcing (appended to, up to --max-raw records)."""
import json
import os

from . import h12, norm, say
from .jsonl import read_jsonl
from .prompts import filter_items, interleave


def stage_text(args, m, srcs, excl):
    path = os.path.join(args.out, "text.jsonl")
    have = read_jsonl(path)
    if len(have) >= args.max_raw:
        say(f"stage c (text): done already, {len(have)} records in {path} (--max-raw {args.max_raw})")
        return
    say(f"stage c (text): {len(have)} records present, up to {args.max_raw}")
    groups = {}
    for name in ("pydoc", "pystdlib"):
        r = srcs.get(name)
        if r and r[1]:
            groups[name] = [{"id": f"{name}-t-{h12(name, t)}", "source": name, "text": t,
                             "meta": {"kind": k, "from": f}} for t, k, f in r[1]]
    seen = {norm(r["text"]) for r in have}
    stats = {}
    items = interleave({k: filter_items(v, excl, seen, stats, args.max_text_chars * 2) for k, v in groups.items()},
                       args.seed)
    new = items[:args.max_raw - len(have)]
    with open(path, "a", encoding="utf-8") as f:
        for r in new:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    stats.pop("_dropped_examples", None)
    dropped = sum(s["spec_bench"] for s in stats.values())
    m.d.setdefault("stages", {})["text"] = {"records": len(have) + len(new), "max_raw": args.max_raw,
                                            "available": len(items) + len(have),
                                            "spec_bench_dropped": dropped}
    m.save()
    say(f"  +{len(new)} records -> {path} ({len(have) + len(new)} in all, {len(items) + len(have)} available; "
        f"{dropped} dropped for overlapping the Spec-Bench prompts)")
