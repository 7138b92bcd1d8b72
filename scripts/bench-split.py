#!/usr/bin/env python3
"""bench-split.py - the client-server split against the OpenAI streaming API
over simulated links (docs/split.md). A `specdec serve --split` server and
the clients run as separate processes on this machine; scripts/faultproxy.py
applies each profile (4g: 20 Mbit/s, 21 +- 19 ms, 0.1% loss as stalls; 5g:
10 +- 10 ms, 0.1% loss) between them. For every profile and prompt (of
../shared/prompts/dev.jsonl, greedy, -n tokens):

  (a) openai  one streaming /v1/chat/completions call (the server drafts with
              its own method and the head): tokens/s, time to first token,
              calls and bytes per token;
  (b) split   specdec client with the EAGLE-3 head: the same, plus tau and
              round latency; its text is checked against the target's;
  (c) moa     specdec client with an MoA drafter (--moa FILE: a drafter,
              made into a client file here): the same; with --moa-lsa also
              moa_lsa, the client with --lsa-on-server (the server, given
              the drafter too, sends LSA's outputs); with --moa-kv-rows also
              moa_kv, the client with --kv-rows (a drafter without LSA: every
              layer's K,V rows instead of their mean, the default);
  cut         each split client cut off for good after 50 tokens: the share
              of the target's greedy text it reproduces offline (tokens
              until the first difference, and positions equal, over the
              tokens after the cut); with --cut-baseline also (c)'s drafter
              run with --no-states (the same drafter that never reads the
              server's states: the issue's same-size baseline).

Prints one JSON object (per-profile means, and every run) on stdout; never a
test. usage: bench-split.py [--prompts FILE] [--n-prompts K] [-n N]
[--profiles 4g,5g] [--moa FILE] [--moa-lsa] [--moa-kv-rows] [--no-eagle3] [--cut-baseline] [--out FILE]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from serve_proc import ServeProcess  # noqa: E402

BIN = os.path.join(ROOT, "build", "specdec")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
HEAD = os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct.eagle3.gguf")
PROXY = os.path.join(ROOT, "scripts", "faultproxy.py")


class Proxy:
    def __init__(self, target_port, *args):
        self.p = subprocess.Popen([sys.executable, PROXY, "--target", f"127.0.0.1:{target_port}"] + list(args),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.port = int(self.p.stderr.readline().rsplit(":", 1)[1])
        threading.Thread(target=lambda: [None for _ in self.p.stderr], daemon=True).start()
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()

    def cmd(self, c):
        """A command on the proxy's stdin (its "ok" answers are drained by a thread, never waited for)."""
        self.p.stdin.write(c + "\n")
        self.p.stdin.flush()
        time.sleep(0.05)

    def stop(self):
        self.p.kill()
        self.p.wait()


def openai_stream(port, prompt, n):
    """One streaming chat call through the proxy: (text, tokens, seconds, ttft seconds, bytes received)."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()
    s.sendall(req)
    data, ttft, text, toks = b"", None, "", 0
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                i = line.find(b"data: ")
                if i < 0 or line[i + 6:].strip() == b"[DONE]":
                    continue
                try:
                    o = json.loads(line[i + 6:])
                except ValueError:
                    continue
                for ch in o.get("choices", []):
                    d = ch.get("delta", {}).get("content")
                    if d:
                        if ttft is None:
                            ttft = time.time() - t0
                        text += d
                if o.get("usage"):
                    toks = o["usage"].get("completion_tokens", toks)
    s.close()
    return text, toks, time.time() - t0, ttft or 0.0, len(data), len(req)


EAGLE3 = ["-m", MODEL, "--head", HEAD]   # the client's files: (b) the target and its head; (c) an MoA client file


def split_client(port, prompt, n, files, *extra):
    r = subprocess.run([BIN, "client"] + files + ["--server", f"http://127.0.0.1:{port}", "--chat",
                        "-p", prompt, "-n", str(n), "--json", "--timeout", "10000"] + list(extra),
                       capture_output=True, text=True, timeout=900)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return lines[-1] if lines else {"error": r.stderr[-300:]}


def cut_run(server_port, profile, prompt, n, at, files):
    """The client through a proxy of its own, the link down for good after `at` tokens: its final event."""
    proxy = Proxy(server_port, "--profile", profile, "--seed", "5")
    cmd = [BIN, "client"] + files + ["--server", f"http://127.0.0.1:{proxy.port}", "--chat", "-p",
                                     prompt, "-n", str(n), "--events", "--final-wait", "0"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    timer = threading.Timer(600, p.kill)
    timer.start()
    count, cut, last = 0, False, {}
    for line in p.stdout:
        if not line.startswith("{"):
            continue
        e = json.loads(line)
        if "tokens" in e and "done" not in e:
            count += len(e["tokens"])
        if "retract" in e:
            count -= e["retract"]
        if not cut and count >= at:
            cut = True
            proxy.cmd("down")
        last = e
    p.wait()
    timer.cancel()
    proxy.stop()
    last["cut_happened"] = cut
    return last


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=os.path.join(ROOT, "..", "shared", "prompts", "dev.jsonl"))
    ap.add_argument("--n-prompts", type=int, default=6)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--profiles", default="4g,5g")
    ap.add_argument("--cut-at", type=int, default=50)
    ap.add_argument("--moa", help="(c): an MoA drafter for the model (or its split-client file)")
    ap.add_argument("--no-eagle3", action="store_true", help="leave (b) out")
    ap.add_argument("--cut-baseline", action="store_true", help="(c)'s cut also with --no-states")
    ap.add_argument("--moa-lsa", action="store_true", help="(c) also with --lsa-on-server")
    ap.add_argument("--moa-kv-rows", action="store_true", help="(c) also with --kv-rows (a drafter without LSA)")
    ap.add_argument("--out")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    kinds = [] if a.no_eagle3 else [("split", EAGLE3)]
    if a.moa:   # a drafter becomes a client file; a client file (NAME.client.gguf) is taken as it is
        cf = a.moa
        if not a.moa.endswith(".client.gguf"):
            cf = os.path.join(tmp.name, "moa.client.gguf")
            r = subprocess.run([BIN, "split-client", "-m", MODEL, "--head", a.moa, "--out", cf], capture_output=True,
                               text=True)
            if r.returncode != 0:
                sys.exit("bench-split: " + r.stderr.strip())
        kinds.append(("moa", ["-m", cf]))
        if a.moa_lsa:
            kinds.append(("moa_lsa", ["-m", cf, "--lsa-on-server"]))
        if a.moa_kv_rows:
            kinds.append(("moa_kv", ["-m", cf, "--kv-rows"]))
        if a.cut_baseline:
            kinds.append(("moa_nostates", ["-m", cf, "--no-states"]))
    prompts = []
    with open(a.prompts) as f:
        for line in f:
            o = json.loads(line)
            prompts.append(o["turns"][0])
    step = max(1, len(prompts) // a.n_prompts)
    prompts = prompts[::step][:a.n_prompts]
    heads = ["--head", HEAD] + (["--head", a.moa] if a.moa and a.moa_lsa else [])
    srv = ServeProcess(BIN, MODEL, *heads, "--split", "8", "-np", "1")
    gen = {}
    for pr in prompts:   # the target's own greedy text (generate), for the checks
        r = subprocess.run([BIN, "generate", "-m", MODEL, "--chat", "-p", pr, "-n", str(a.n), "--temp", "0", "--json"],
                           capture_output=True, text=True)
        gen[pr] = json.loads(r.stdout)
    out = {"model": os.path.basename(MODEL), "head": os.path.basename(HEAD), "moa": a.moa, "n": a.n,
           "prompts": len(prompts), "profiles": {}, "runs": []}
    try:
        for prof in a.profiles.split(","):
            px = Proxy(srv.port, "--profile", prof, "--seed", "3")
            rows = {"openai": []}
            for kind, _ in kinds:
                rows[kind] = []
                rows["cut_" + kind] = []
            for pr in prompts:
                text, toks, secs, ttft, brecv, bsent = openai_stream(px.port, pr, a.n)
                ra = {"profile": prof, "mode": "openai", "tokens": toks, "tokens_per_second": toks / secs,
                      "ttft_ms": ttft * 1000, "calls_per_token": 1 / max(1, toks),
                      "bytes_received_per_token": brecv / max(1, toks), "bytes_sent_per_token": bsent / max(1, toks)}
                rows["openai"].append(ra)
                out["runs"].append(ra)
                ra["openai_equals_target"] = text == gen[pr]["text"]
                ref = gen[pr]["text"]
                got = [ra]
                for kind, files in kinds:
                    rb = split_client(px.port, pr, a.n, files)
                    rs = {"profile": prof, "mode": kind, "tokens": rb.get("n_generated"),
                          "tokens_per_second": rb.get("tokens_per_second"), "ttft_ms": rb.get("ttft_ms"),
                          "calls_per_token": rb.get("calls_per_token"),
                          "bytes_received_per_token": rb.get("bytes_received_per_token"),
                          "bytes_sent_per_token": rb.get("bytes_sent_per_token"), "tau": rb.get("tau"),
                          "round_ms_mean": rb.get("round_ms_mean"), "equals_target": rb.get("text") == ref}
                    last = cut_run(srv.port, prof, pr, a.n, a.cut_at, files)
                    ct = last.get("text", "")
                    # the offline tokens after the cut against the target's (the healthy run's) tokens
                    cut_toks = last.get("tokens", [])
                    ref_toks = rb.get("tokens", [])
                    k = min(len(cut_toks), len(ref_toks))
                    verified = len(cut_toks) - last.get("never_verified", 0)
                    after = list(range(verified, k))
                    same_prefix = 0
                    for i in after:
                        if cut_toks[i] != ref_toks[i]:
                            break
                        same_prefix += 1
                    equal = sum(1 for i in after if cut_toks[i] == ref_toks[i])
                    rc = {"profile": prof, "mode": "cut_" + kind, "cut_happened": last.get("cut_happened"),
                          "never_verified": last.get("never_verified"), "cut_at": verified,
                          "offline_tokens": len(after), "kept_before_first_difference": same_prefix,
                          "share_positions_equal": equal / max(1, len(after)), "text_prefix_equal": ct[:20] == ref[:20]}
                    for r_, key in ((rs, kind), (rc, "cut_" + kind)):
                        rows[key].append(r_)
                        out["runs"].append(r_)
                    got += [rs, rc]
                print(json.dumps(got), file=sys.stderr, flush=True)
            px.stop()
            summ = {}
            for key, rs_ in rows.items():
                keys = [k for k in rs_[0] if isinstance(rs_[0][k], (int, float)) and not isinstance(rs_[0][k], bool)]
                summ[key] = {k: mean([r_.get(k) for r_ in rs_]) for k in keys}
                if key in ("split", "moa", "moa_lsa", "moa_kv", "moa_nostates"):
                    summ[key]["all_equal_target"] = all(r_["equals_target"] for r_ in rs_)
                    summ[key + "_over_openai_tokens_per_second"] = (summ[key]["tokens_per_second"] /
                                                                    summ["openai"]["tokens_per_second"])
            out["profiles"][prof] = summ
    finally:
        srv.stop()
        tmp.cleanup()
    s = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(s + "\n")
    print(s)


if __name__ == "__main__":
    main()
