"""mpi_common.py - what tests/mpi/test_mpi.py and test_mpi_serve.py share:
the paths, mpirun's environment (as root, oversubscribed), running the
program on one process or under mpirun, the reason to skip, the greedy
comparison of a split with one process, the ranks' processes, and a
server under mpirun (start, stop, one chat request)."""
import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

BIN = os.path.abspath(os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec")))
SYNTH = os.path.join(ROOT, "build", "tests", "tool_synth_model")
RHEAD = os.path.join(ROOT, "build", "tests", "tool_random_head")
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
KEEP = "-mca orte_abort_on_non_zero_status 0"   # mpirun keeps the job going when a rank dies (docs/mpi.md)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def mpirun(n, args, timeout=240, extra=()):
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), *extra, BIN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)


def single(args, timeout=240):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def why_skip():
    if not os.path.exists(BIN):
        return f"{BIN} not built"
    if subprocess.run(["which", "mpirun"], capture_output=True).returncode != 0:
        return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    r = single(["generate", "--pp", "1", "-m", "/nonexistent"])
    if "built without MPI" in r.stderr:
        return "build/specdec was built without MPI (make MPI=1, or make test-mpi)"
    if not os.path.exists(SYNTH) or not os.path.exists(RHEAD):
        return "build/tests/tool_synth_model or tool_random_head not built (make test-mpi)"
    return None


def skip_all(cases):
    """Prints SKIP with the reason for every case and returns True when the
    MPI tests cannot run here."""
    why = why_skip()
    for c in cases if why else ():
        print(f"SKIP {c}: {why}")
    return bool(why)


def compare(name, model, prompt, methods, splits, n, extra=()):
    """Greedy text of every method on one process, then under each split; a
    list of failures."""
    bad = []
    base = ["generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1", "-c", "512", *extra]
    for label, margs in methods:
        ref = single(base + margs)
        if ref.returncode != 0 or not ref.stdout.strip():
            bad.append(f"{name}/{label}: one process failed: {ref.stderr.strip()[-300:]}")
            continue
        for ranks, split in splits:
            r = mpirun(ranks, base + margs + split)
            if r.returncode != 0:
                bad.append(f"{name}/{label} {' '.join(split)}: rc {r.returncode}: {r.stderr.strip()[-300:]}")
            elif r.stdout != ref.stdout:
                bad.append(f"{name}/{label} {' '.join(split)}: the text differs from one process's:\n"
                           f"  one:  {ref.stdout[:160]!r}\n  pipe: {r.stdout[:160]!r}")
    return bad


def alive(pids):
    """The ranks of {rank: pid} whose process still runs (not a zombie, not gone)."""
    out = []
    for r, pid in pids.items():
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
                out.append(r)
        except OSError:
            pass
    return out


def rank_pids(mpirun_pid):
    """{rank: pid} of mpirun's children."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"OMPI_COMM_WORLD_RANK" in env:
                out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(d)
        except (OSError, ValueError, IndexError):
            continue
    return out


def resume_and_reap(p, pids):
    for pid in (pids or {}).values():
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    if p.poll() is None:
        p.kill()
        p.wait()


def start_server(R, args, extra=()):
    """mpirun -np R serve --pp R on SmolLM2: (process, its stderr lines so far, [port or None])."""
    import re
    import threading
    cmd = ["mpirun", "--oversubscribe", *extra, "-np", str(R), BIN, "serve", "-m", SMOL, "--port", "0", "-t", "1",
           "--pp", str(R), *args]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    log, port, ready = [], [None], threading.Event()

    def drain():
        for line in p.stderr:
            log.append(line.rstrip("\n"))
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port[0] = int(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    ready.wait(120)
    return p, log, port


def stop_server(p):
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None


def chat(port, q, spec, n, stream=False, timeout=300):
    """One chat completion: (status, text or error message)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": n, "speculation": spec,
            "stream": stream}
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        data = json.loads(r.read())
        return r.status, (data["choices"][0]["message"]["content"] if r.status == 200 else data["error"]["message"])
    text, error = "", None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            error = ev["error"]["message"]
        else:
            text += ev["choices"][0]["delta"].get("content") or ""
    return (r.status if error is None else 500), (text if error is None else error)
