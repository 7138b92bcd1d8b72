#!/usr/bin/env python3
"""bench-serve.py - load benchmark for an OpenAI-compatible server.

Drives a running server (`specdec serve`, llama.cpp's llama-server, ...) with
K concurrent streaming chat clients over a prompt file and prints JSON: for
each speculation setting and each K, requests/s, aggregate tokens/s, per-user
tokens/s (median), time to first token and inter-token latency (p50, p99),
tau from the usage's speculation object when the server gives one, and the
benchmark's own CPU time (so the client's cost is visible).

Python standard library only (http.client + threads). The prompt file is
Spec-Bench JSONL (one {"turns": [...]} object a line); the first turn of each
is sent as a user message, read at run time.

  python3 scripts/bench-serve.py --url http://127.0.0.1:8080 \\
      --prompts /work/shared/prompts/dev.jsonl --n-prompts 16 \\
      --clients 1,4,16 --max-tokens 64 --speculation default,off

--speculation: comma list of settings, each run at every K: "default" sends
no "speculation" field (the server's own setting), anything else is sent as
the request's "speculation" field ("off", "ngram:3-8", ...).
--start-server 'CMD' starts the server (a shell command), waits for its
/health (or /v1/models), runs the load and stops it (SIGTERM) at the end.

Definitions: a request's tokens are usage.completion_tokens (the stream is
asked for usage; without it, the number of content chunks). Aggregate
tokens/s = all tokens of a K run / its wall time; per-user tokens/s = a
request's tokens / (end - send); time to first token = send to the first
content chunk; inter-token latency = gap between successive content chunks
divided by the tokens they carry when the server says (otherwise per chunk),
and tpot = (last chunk - first chunk) / (tokens - 1) per request. A run
sends max(prompts, 2K) requests (--requests), prompts cycled; each text
starts with "[run.request] " so no run meets its prompts in the server's
prefix cache (--reuse-prompts sends them as they are).
"""
import argparse
import http.client
import json
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse


def pct(xs, q):
    """Quantile q (0..1) of xs by linear interpolation, or None."""
    if not xs:
        return None
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def rnd(x, n=3):
    return None if x is None else round(x, n)


def read_prompts(path, n):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            o = json.loads(line)
            turns = o.get("turns") or []
            if turns:
                out.append(turns[0])
            if n and len(out) >= n:
                break
    if not out:
        raise SystemExit(f"bench-serve: no prompts in {path}")
    return out


class Target:
    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.base = u.path.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.api_key = api_key
        self.timeout = timeout

    def conn(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def get(self, path):
        c = self.conn()
        try:
            c.request("GET", self.base + path, headers=self.headers())
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def model_id(self):
        st, body = self.get("/v1/models")
        if st != 200:
            return None
        data = json.loads(body).get("data") or []
        return data[0]["id"] if data else None


def one_request(tg, model, prompt, args, spec):
    """Sends one streaming chat request; returns its measurements."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens,
            "temperature": args.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if spec != "default":
        body["speculation"] = spec
    rec = {"ok": False, "error": None, "chunks": [], "usage": None}
    c = tg.conn()
    t0 = time.perf_counter()
    rec["t0"] = t0
    try:
        c.request("POST", tg.base + "/v1/chat/completions", body=json.dumps(body).encode(), headers=tg.headers())
        r = c.getresponse()
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return rec
        buf = b""
        done = False
        while not done:
            data = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                try:
                    o = json.loads(payload)
                except ValueError:
                    continue
                now = time.perf_counter()
                if o.get("usage"):
                    rec["usage"] = o["usage"]
                for ch in o.get("choices") or []:
                    d = ch.get("delta") or {}
                    text = d.get("content") or ch.get("text") or ""
                    if text:
                        rec["chunks"].append(now)
                        break
        rec["t_end"] = time.perf_counter()
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001
        rec["error"] = repr(e)
    finally:
        c.close()
    return rec


def server_counters(tg):
    """The server's Prometheus counters without labels (*_total), or {}."""
    try:
        st, body = tg.get("/metrics")
    except OSError:
        return {}
    if st != 200:
        return {}
    out = {}
    for line in body.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].endswith("_total") and "{" not in parts[0]:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def run_load(tg, model, prompts, args, spec, k, run_id):
    n_req = max(len(prompts), 2 * k) if not args.requests else args.requests
    lock = threading.Lock()
    nxt = [0]
    recs = []

    def worker():
        while True:
            with lock:
                i = nxt[0]
                if i >= n_req:
                    return
                nxt[0] += 1
            p = prompts[i % len(prompts)]
            if not args.reuse_prompts:   # no run finds its prompts in a slot's cache from an earlier run
                p = f"[{run_id}.{i}] {p}"
            rec = one_request(tg, model, p, args, spec)
            with lock:
                recs.append(rec)

    m0 = server_counters(tg)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    m1 = server_counters(tg)
    server = {n: round(m1[n] - m0[n], 3) for n in m1 if n in m0 and m1[n] != m0[n]}

    ok = [r for r in recs if r["ok"] and r["chunks"]]
    errors = [r["error"] or "no content" for r in recs if not (r["ok"] and r["chunks"])]
    ttft, itl, tpot, user_tps, toks = [], [], [], [], 0
    tau_num = tau_den = 0.0
    drafted = accepted = 0
    for r in ok:
        u = r["usage"] or {}
        n = u.get("completion_tokens") or len(r["chunks"])
        toks += n
        ttft.append((r["chunks"][0] - r["t0"]) * 1000.0)
        gaps = [(b - a) * 1000.0 for a, b in zip(r["chunks"], r["chunks"][1:])]
        # chunks carry several tokens when the server streams a step at once:
        # spread each gap over the tokens it brought (evenly, as the count
        # per chunk is not given)
        per = (n - 1) / len(gaps) if gaps and n > 1 else 1.0
        itl.extend(g / per for g in gaps)
        if n > 1:
            tpot.append((r["chunks"][-1] - r["chunks"][0]) * 1000.0 / (n - 1))
        dur = r["t_end"] - r["t0"]
        if dur > 0:
            user_tps.append(n / dur)
        sp = u.get("speculation")
        if isinstance(sp, dict) and sp.get("target_forwards"):
            tau_num += (sp.get("tau") or 0.0) * sp["target_forwards"]
            tau_den += sp["target_forwards"]
            drafted += sp.get("drafted") or 0
            accepted += sp.get("accepted") or 0
    return {
        "speculation": spec,
        "clients": k,
        "requests": len(recs),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": rnd(wall),
        "requests_per_s": rnd(len(ok) / wall if wall > 0 else 0.0),
        "completion_tokens": toks,
        "aggregate_tokens_per_s": rnd(toks / wall if wall > 0 else 0.0, 2),
        "per_user_tokens_per_s_median": rnd(statistics.median(user_tps) if user_tps else None, 2),
        "ttft_ms_p50": rnd(pct(ttft, 0.5), 1),
        "ttft_ms_p99": rnd(pct(ttft, 0.99), 1),
        "itl_ms_p50": rnd(pct(itl, 0.5), 2),
        "itl_ms_p99": rnd(pct(itl, 0.99), 2),
        "tpot_ms_median": rnd(statistics.median(tpot) if tpot else None, 2),
        "tau": rnd(tau_num / tau_den, 3) if tau_den else None,
        "drafted": drafted if tau_den else None,
        "accepted": accepted if tau_den else None,
        "client_cpu_s": rnd(cpu),
        "client_cpu_share": rnd(cpu / wall if wall > 0 else 0.0),
        "server_counters": server,   # what the server's /metrics counters (*_total) moved by during the run
    }


def wait_ready(tg, proc, timeout):
    t_end = time.time() + timeout
    while time.time() < t_end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"bench-serve: the server exited with status {proc.returncode} before it was ready")
        for path in ("/health", "/v1/models"):
            try:
                st, _ = tg.get(path)
                if st == 200:
                    return
            except OSError:
                pass
        time.sleep(0.25)
    raise SystemExit(f"bench-serve: the server at {tg.host}:{tg.port} was not ready after {timeout} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (with or without /v1)")
    ap.add_argument("--prompts", default="/work/shared/prompts/dev.jsonl", help="Spec-Bench JSONL prompt file")
    ap.add_argument("--n-prompts", type=int, default=0, help="use the first N prompts (0: all)")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per run (default: max(prompts, 2K); prompts are cycled)")
    ap.add_argument("--clients", default="1,4,16", help="comma list of concurrent clients K")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--speculation", default="default",
                    help="comma list: 'default' (no field) or a value of the request's speculation field (off, ngram:3-8)")
    ap.add_argument("--reuse-prompts", action="store_true",
                    help="send the prompts as they are (default: each request's text starts with '[run.request] ', "
                         "so no run reuses a prompt prefix an earlier run left in the server's cache)")
    ap.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--warmup", type=int, default=-1,
                    help="warm-up requests sent together before measuring (default: the largest K)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request socket timeout (s)")
    ap.add_argument("--start-server", default=None, metavar="CMD", help="shell command that starts the server")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    args = ap.parse_args()

    clients = [int(x) for x in args.clients.split(",") if x.strip()]
    if not clients or min(clients) < 1:
        raise SystemExit("bench-serve: --clients needs positive integers")
    specs = [x.strip() for x in args.speculation.split(",") if x.strip()]
    prompts = read_prompts(args.prompts, args.n_prompts)
    tg = Target(args.url, args.api_key, args.timeout)

    proc = None
    if args.start_server:
        proc = subprocess.Popen(args.start_server, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        wait_ready(tg, proc, args.ready_timeout)
        model = args.model or tg.model_id()
        # warm-up: every slot the largest K will use runs once (pages of the
        # model and of the caches touched, threads up), with texts that are
        # not the prompts (no prefix of them is left in a slot's cache)
        n_warm = max(clients) if args.warmup < 0 else args.warmup
        wargs = argparse.Namespace(**{**vars(args), "max_tokens": min(args.max_tokens, 8)})
        ws = [threading.Thread(target=one_request, args=(tg, model, f"Warm-up {i}: count to three.", wargs, sp))
              for i in range(n_warm) for sp in specs[:1]]
        for t in ws:
            t.start()
        for t in ws:
            t.join()
        runs = []
        for spec in specs:
            for k in clients:
                res = run_load(tg, model, prompts, args, spec, k, len(runs) + 1)
                runs.append(res)
                print(f"bench-serve: speculation {spec}, K={k}: {res['aggregate_tokens_per_s']} tok/s, "
                      f"ttft p50 {res['ttft_ms_p50']} ms, {res['errors']} errors", file=sys.stderr, flush=True)
        out = {
            "url": args.url,
            "model": model,
            "prompts": args.prompts,
            "n_prompts": len(prompts),
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "server_cmd": args.start_server,
            "reuse_prompts": args.reuse_prompts,
            "runs": runs,
        }
        print(json.dumps(out, indent=1))
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


if __name__ == "__main__":
    main()
