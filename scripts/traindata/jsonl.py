"""JSONL files a rerun resumes (a torn last line, left by a run killed while
writing, is cut off) and manifest.json."""
import json
import os

from . import say


def read_jsonl(path, repair=True):
    """The records of a JSONL file. A torn last line (a run killed while
    writing) is cut off the file; a bad line elsewhere is an error."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    recs, pos = [], 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl
        line = data[pos:end]
        if line.strip():
            try:
                recs.append(json.loads(line))
            except ValueError:
                if nl < 0 or not data[nl + 1:].strip():
                    if repair:
                        say(f"  {os.path.basename(path)}: cutting a torn last line ({len(line)} bytes)")
                        with open(path, "r+b") as f:
                            f.truncate(pos)
                    break
                raise SystemExit(f"make-train-data: {path}: line {len(recs) + 1} is not JSON; "
                                 "fix or remove the file")
        if nl < 0:
            if repair and line.strip():  # a complete record without its newline
                with open(path, "ab") as f:
                    f.write(b"\n")
            break
        pos = nl + 1
    return recs


def write_jsonl_atomic(path, recs):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Manifest:
    def __init__(self, path):
        self.path = path
        self.d = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.d = json.load(f)

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.d, f, indent=1, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, self.path)
