"""Stage b: chat.jsonl, the prompts answered by the target itself through
`specdec serve` and the openai client (greedy, and a share sampled)."""
import json
import os
import re
import signal
import subprocess
import threading
import time

from . import say, unit
from .jsonl import read_jsonl


class Server:
    """`specdec serve` on a free port (--port 0: the port is read from its log)."""

    def __init__(self, args):
        cmd = [args.bin, "serve", "-m", args.model, "--port", str(args.port), "--parallel", str(args.parallel),
               "--fast-prompt", "--max-tokens", str(max(args.max_tokens, 1)), "-c", str(args.ctx),
               "--queue", str(max(16, 2 * args.parallel))]
        if getattr(args, "method", None):
            cmd += ["--method", args.method]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        say("  " + " ".join(cmd))
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)  # Ctrl-C reaches us alone; we stop it
        self.log, self.port = [], None
        ready = threading.Event()

        def drain():
            for line in self.p.stderr:
                self.log.append(line.rstrip("\n"))
                del self.log[:-50]
                mm = re.search(r"listening on http://[^:]+:(\d+)", line)
                if mm:
                    self.port = int(mm.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        try:
            ready.wait(180)
        except BaseException:  # Ctrl-C while it loads
            self.stop()
            raise
        if not self.port:
            self.stop()
            raise SystemExit("make-train-data: the server did not start: " + " | ".join(self.log[-5:]))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def post_json(url, path, body, timeout=120):
    import urllib.request
    req = urllib.request.Request(url + path, data=json.dumps(body).encode("utf-8"),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def stage_answers(args, m, stop):
    """Returns the server (still running, for token counts) or None."""
    ppath = os.path.join(args.out, "prompts.jsonl")
    cpath = os.path.join(args.out, "chat.jsonl")
    fpath = os.path.join(args.out, "failed.jsonl")
    if not os.path.exists(ppath):
        raise SystemExit(f"make-train-data: {ppath} missing: run stage a (prompts) first")
    prompts = read_jsonl(ppath, repair=False)
    if args.sources:
        want = set(args.sources.split(","))
        prompts = [p for p in prompts if p.get("source") in want]
    prompts = prompts[:args.max_prompts]
    done = {r.get("meta", {}).get("prompt_id") for r in read_jsonl(cpath)}
    failed = {r.get("prompt_id") for r in read_jsonl(fpath)} if not args.retry_failed else set()
    todo = [p for p in prompts if p["id"] not in done and p["id"] not in failed]
    ids = {p["id"] for p in prompts}
    foreign = len(done - ids - {None})
    if todo and foreign >= len(prompts) // 2 and len(done & ids) < len(prompts) // 2:
        say(f"  warning: {cpath} holds {foreign} answers to prompts that are not among the first {len(prompts)} "
            "of prompts.jsonl: the list was built otherwise than the one they answered (another version of a "
            "source, e.g. python3-doc, or other --sources); the prompts below are answered anew")
    say(f"stage b (answers): {len(prompts)} prompts wanted (--max-prompts {args.max_prompts}"
        + (f" of the sources {args.sources}" if args.sources else "") + "), "
        f"{len(prompts) - len(todo)} answered or failed before, {len(todo)} to answer")
    if not todo:
        return None
    try:
        import openai  # noqa: F401
    except ImportError:
        raise SystemExit("make-train-data: stage b needs the openai package (python3 -m pip install openai)")
    for what, p in (("binary", args.bin), ("model", args.model)):
        if not os.path.exists(p):
            raise SystemExit(f"make-train-data: {what} {p} not found"
                             + (" (make build/specdec)" if what == "binary" else " (--model FILE)"))
    srv = Server(args)
    try:
        return answer_all(args, m, stop, srv, prompts, todo, cpath, fpath)
    except BaseException:
        rc = srv.stop()
        say(f"  server stopped (exit status {rc})")
        raise


def answer_all(args, m, stop, srv, prompts, todo, cpath, fpath):
    """Sends the prompts to the server; returns it still running."""
    import openai
    from concurrent.futures import ThreadPoolExecutor
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=600, max_retries=1)
    model_id = client.models.list().data[0].id
    lock = threading.Lock()
    counts = {"new": 0, "greedy": 0, "sampled": 0, "tokens": 0, "prompt_tokens": 0, "failed": 0, "empty": 0}
    t0 = time.time()
    cf = open(cpath, "a", encoding="utf-8")
    ff = open(fpath, "a", encoding="utf-8")

    def answer(p):
        if stop.is_set():
            return
        sampled = unit(str(args.seed), p["id"], "mode") < args.sampled_share
        seed = int(unit(str(args.seed), p["id"], "seed") * 2 ** 31)
        kw = dict(model=model_id, messages=[{"role": "user", "content": p["prompt"]}],
                  max_tokens=args.max_tokens, temperature=0.7 if sampled else 0.0)
        if sampled:
            kw["seed"] = seed
        try:
            r = client.chat.completions.create(**kw)
            text = r.choices[0].message.content or ""
            err = None if text.strip() else "empty answer"
        except Exception as e:  # noqa: BLE001 - any failure is recorded and the run goes on
            if stop.is_set():
                return
            r, text, err = None, "", f"{type(e).__name__}: {e}"
        with lock:
            if stop.is_set():
                return
            if err:
                counts["failed" if r is None else "empty"] += 1
                ff.write(json.dumps({"prompt_id": p["id"], "error": err[:300]}) + "\n")
                ff.flush()
                return
            u = r.usage
            rec = {"id": p["id"] + ("-s" if sampled else "-g"), "source": p["source"],
                   "messages": [{"role": "user", "content": p["prompt"]},
                                {"role": "assistant", "content": text}],
                   "meta": {"prompt_id": p["id"], "kind": p.get("meta", {}).get("kind"),
                            "mode": "sampled" if sampled else "greedy",
                            "temperature": kw["temperature"], "seed": seed if sampled else None,
                            "max_tokens": args.max_tokens, "finish_reason": r.choices[0].finish_reason,
                            "prompt_tokens": u.prompt_tokens if u else None,
                            "completion_tokens": u.completion_tokens if u else None,
                            "model": os.path.basename(args.model)}}
            cf.write(json.dumps(rec, ensure_ascii=False) + "\n")
            cf.flush()
            counts["new"] += 1
            counts["sampled" if sampled else "greedy"] += 1
            counts["tokens"] += (u.completion_tokens or 0) if u else 0
            counts["prompt_tokens"] += (u.prompt_tokens or 0) if u else 0

    pool = ThreadPoolExecutor(max_workers=args.parallel)
    futs = [pool.submit(answer, p) for p in todo]
    interrupted = False
    last = 0.0
    try:
        while True:
            n_done = sum(f.done() for f in futs)
            now = time.time()
            if n_done == len(futs) or now - last >= args.progress:
                last = now
                el = max(now - t0, 1e-6)
                rate = counts["new"] / el * 60
                eta = (len(todo) - n_done) / (n_done / el) if n_done else 0
                say(f"  answers {len(prompts) - len(todo) + counts['new']}/{len(prompts)}: +{counts['new']} "
                    f"(greedy {counts['greedy']}, sampled {counts['sampled']}, failed "
                    f"{counts['failed'] + counts['empty']}) {rate:.1f}/min, {counts['tokens'] / el:.1f} tok/s, "
                    f"{el:.0f} s, ETA {eta / 60:.1f} min")
            if n_done == len(futs):
                break
            time.sleep(0.5)
        for f in futs:
            f.result()
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        say("  interrupted: stopping (every finished answer is already in chat.jsonl)")
    el = time.time() - t0
    pool.shutdown(wait=not interrupted, cancel_futures=True)
    with lock:
        cf.flush()
        os.fsync(cf.fileno())
        cf.close()
        ff.close()
    run = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "answers": counts["new"], "greedy": counts["greedy"],
           "sampled": counts["sampled"], "failed": counts["failed"], "empty": counts["empty"],
           "completion_tokens": counts["tokens"], "prompt_tokens": counts["prompt_tokens"],
           "seconds": round(el, 1), "answers_per_min": round(counts["new"] / el * 60, 2) if el else None,
           "tokens_per_s": round(counts["tokens"] / el, 2) if el else None, "parallel": args.parallel,
           "max_tokens": args.max_tokens, "model": os.path.basename(args.model), "cores": os.cpu_count(),
           "interrupted": interrupted}
    m.d.setdefault("runs", []).append(run)
    m.save()
    say(f"  this run: {counts['new']} answers in {el:.0f} s = {run['answers_per_min']}/min, "
        f"{counts['tokens']} tokens = {run['tokens_per_s']} tok/s (parallel {args.parallel}, {os.cpu_count()} cores)")
    if interrupted:
        raise KeyboardInterrupt
    return srv
