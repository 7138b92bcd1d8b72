#!/usr/bin/env python3
"""test_split_moa.py - the client-server split with the MoA drafter
(docs/split.md, "(c) MoA"): the server answers each round with every layer's
K,V rows of the accepted positions (int8, a scale per row), the client's MoA
drafter runs LSA on them and fills its TLI layers' cache.

  - split-client writes MoA client files (TLI 0: no target layer; TLI 1: the
    last one) smaller than the target, and refuses a file that is no drafter;
  - greedy text through the fault proxy equal to `specdec generate`'s, TLI 0
    and TLI 1 (random drafters: they need not be good, only lossless), on a
    healthy link and on the 4G profile;
  - a drafter that is the target itself (tool_random_head moa-exact: every
    target layer as TLI) is accepted more than 2 tokens a round: the K,V rows
    reach the client's drafter where and as it reads them;
  - the reply's size is 20 + 4A + (A + 1) 2L (4 + kvd) bytes;
  - sampled text equal to `generate --temp 0.8 --seed 11`'s; the client's
    drafts are its drafter's samples under the server's race noise: with
    the exact drafter at temperature 1.5 they are accepted more than its
    most likely tokens (--greedy-drafts), both texts the target's;
  - a cut half-way through the text (the 50th token at most) and back, and the server killed and restarted
    mid-generation (the client opens it again: the drafter keeps the rows
    it holds): the final text is the target's;
  - "states" other than true/false/"kv"/"fused" is 400; --private with an
    MoA drafter is refused with the reason;
  - one generation room (--split 1) serves an EAGLE-3 generation (fused
    rows, 4 + d bytes a position), then the MoA ones (2L (4 + kvd) bytes);
  - --lsa-on-server with a server holding the same TLI 1 drafter: the text
    and tau are the K,V client's, with less than a fifth of its bytes; a
    client whose drafter is another one is refused (400);
  - drafters reading the target's states (--ca-hidden --sa-hidden; TLI 1
    with LSA, TLI 0 without): the client asks for them ("hidden_layer"),
    greedy text equal to generate's; each position's rows end with its
    state (2L (4 + kvd) + 4 + d bytes); a layer out of range, or one without
    "kv"/"lsa" states, is 400; with --lsa-on-server the text and tau are the
    K,V client's;
  - drafters without LSA get the layers' mean K,V rows and their TLI layers'
    ("mean" states, 2 (1 + TLI) rows a position): the text and tau of the
    client asking for every layer's rows (--kv-rows), less than a fifth of
    its bytes (the exact drafter without LSA, every layer as TLI, gets the
    mean and every layer's rows: tau above 2 both ways); the reply's size;
    a bad "tli" is 400; with --no-states such clients ask for nothing and
    their text is still the target's.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import exit_status, report  # noqa: E402
from serve_proc import ServeProcess  # noqa: E402
from test_split import BIN, HEAD, MODEL, PROMPT, PROMPT2, Proxy, cut_point, free_port, generate, generate_json, post, round_body, run_events  # noqa: E402,E501

RANDOM_HEAD = os.path.join(ROOT, "build", "tests", "tool_random_head")
CASES = ["client_files", "fused_then_kv", "greedy_tli0", "greedy_tli1", "profile_4g_tli1", "exact_accepted", "reply_size",
         "sampling_equals_generate", "sampled_drafts_coupled", "cut_midway_resumes", "bad_states_400", "private_refused",
         "server_restarted", "lsa_on_server", "lsa_other_drafter_400"]
HIDDEN_CASES = ["hidden_greedy", "hidden_reply_size", "hidden_layer_400", "hidden_lsa_on_server", "mean_rows",
                "mean_reply_size", "no_states_nolsa"]


def skip_all(why):
    for c in CASES + HIDDEN_CASES:
        print(f"SKIP {c}: {why}")
    sys.exit(0)


def client(url, model, prompt, n, *extra):
    cmd = [BIN, "client", "-m", model, "--server", url, "--chat", "-p", prompt, "-n", str(n)] + list(extra)
    if "--events" not in extra:
        cmd.append("--json")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return r.returncode, lines, r.stderr


def main():
    if not os.path.exists(BIN) or not os.path.exists(RANDOM_HEAD):
        skip_all("build/specdec or build/tests/tool_random_head not built")
    if not os.path.exists(MODEL):
        skip_all("the default model is missing (scripts/fetch-models.sh)")
    if subprocess.run([BIN, "client", "--help"], capture_output=True).returncode != 0:
        skip_all("specdec was built without libcurl (the client)")
    only = set(sys.argv[1:])
    want = (lambda c: not only or c in only)
    tmp = tempfile.TemporaryDirectory()
    d = tmp.name
    files = {}
    ok_files, msgs = True, []
    for kind in ("moa", "moa-tli1", "moa-exact"):
        h, cf = os.path.join(d, kind + ".gguf"), os.path.join(d, kind + ".client.gguf")
        r1 = subprocess.run([RANDOM_HEAD, MODEL, h, kind, "5"], capture_output=True, text=True)
        r2 = subprocess.run([BIN, "split-client", "-m", MODEL, "--head", h, "--out", cf], capture_output=True, text=True)
        ok_files &= r1.returncode == 0 and r2.returncode == 0
        msgs.append(f"{kind}: {r1.stderr.strip()} {r2.stderr.strip()}")
        files[kind] = cf
    if not ok_files:
        skip_all("no MoA client file: " + " | ".join(msgs))
    sz = {k: os.path.getsize(v) for k, v in files.items()}
    bad = subprocess.run([BIN, "split-client", "-m", MODEL, "--head", MODEL, "--out", os.path.join(d, "x.gguf")],
                         capture_output=True, text=True)
    # TLI 1 adds the last layer (about a thirtieth of SmolLM2's layers) to TLI 0's file; neither holds the others
    report("client_files", sz["moa"] < sz["moa-tli1"] < sz["moa"] + os.path.getsize(MODEL) * 0.1 and
           sz["moa-tli1"] < os.path.getsize(MODEL) * 0.7 and bad.returncode != 0 and "specdec:" in bad.stderr,
           f"{sz} {bad.returncode} {bad.stderr!r}")
    N = 48
    ref = generate(PROMPT, N)
    port = free_port()
    try:
        head = ["--head", HEAD] if os.path.exists(HEAD) else []
        srv = ServeProcess(BIN, MODEL, *head, "--split", "1", "-np", "1", "--port", str(port))
    except RuntimeError as e:
        skip_all(str(e))
    try:
        if want("fused_then_kv"):
            st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": [1, 504, 3458, 2196], "n_predict": 8}),
                         "application/json")
            o = json.loads(b)
            sc, _ = post(srv.port, f"/v1/split/close?id={o.get('id')}", b"", "application/json")
            if not head:
                print("SKIP fused_then_kv: no EAGLE-3 head (heads/), the server sends no fused rows")
            else:
                report("fused_then_kv", st == 200 and o.get("state_kind") == "fused" and sc == 200,
                       f"{st} {sc} {dict((k, v) for k, v in o.items() if k != 'states')}")
        px = Proxy(srv.port)
        url = f"http://127.0.0.1:{px.port}"
        for tli, kind in ((0, "moa"), (1, "moa-tli1")):
            if not want(f"greedy_tli{tli}"):
                continue
            rc, lines, err = client(url, files[kind], PROMPT, N)
            o = lines[-1] if lines else {}
            report(f"greedy_tli{tli}", rc == 0 and o.get("text") == ref and o.get("never_verified") == 0 and
                   o.get("rounds", 0) > 0, f"rc {rc}: {o.get('text')!r} != {ref!r} {err[-300:]}")
        if want("exact_accepted"):
            rc, lines, err = client(url, files["moa-exact"], PROMPT, N)
            o = lines[-1] if lines else {}
            print(f"  exact MoA drafter through the split: tau {o.get('tau')}, {o.get('calls_per_token')} calls/token")
            report("exact_accepted", rc == 0 and o.get("text") == ref and o.get("tau", 0) > 2.0,
                   f"rc {rc} tau {o.get('tau')} {o.get('text')!r} {err[-300:]}")
        px.stop()
        if want("profile_4g_tli1"):
            px = Proxy(srv.port, "--profile", "4g", "--seed", "3")
            rc, lines, err = client(f"http://127.0.0.1:{px.port}", files["moa-tli1"], PROMPT, N, "--timeout", "10000")
            px.stop()
            o = lines[-1] if lines else {}
            report("profile_4g_tli1", rc == 0 and o.get("text") == ref and o.get("never_verified") == 0,
                   f"rc {rc} {o.get('text')!r} {err[-300:]}")
        if want("reply_size"):
            st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": [1, 504, 3458, 2196], "n_predict": 16,
                                                                 "states": "kv"}), "application/json")
            o = json.loads(b)
            L, w = o.get("n_layer", 0), o.get("kv_width", 0)
            s1, r1 = post(srv.port, f"/v1/split/round?id={o.get('id')}", round_body(1, [o.get("first_token", 0), 28],
                                                                                     [-1, 0]))
            magic, seq, fin, q, na, bonus, nr, dw = struct.unpack("<IIBBHiHH", r1[:20]) if s1 == 200 else (0,) * 8
            want_len = 20 + 4 * na + (na + 1) * 2 * L * (4 + w)
            raw = len(o.get("states", "")) * 3 // 4 - o.get("states", "").count("=")
            post(srv.port, f"/v1/split/close?id={o.get('id')}", b"", "application/json")
            report("reply_size", st == 200 and o.get("state_kind") == "kv" and L == 30 and w == 192 and
                   o.get("n_states") == 4 and raw == 4 * 2 * L * (4 + w) and s1 == 200 and q == 2 and nr == na + 1
                   and dw == w and len(r1) == want_len,
                   f"open {st} {dict((k, v) for k, v in o.items() if k != 'states')} raw {raw}; round {s1} "
                   f"{len(r1)} != {want_len} (A {na}, rows {nr}, type {q})")
        if want("bad_states_400"):
            st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": [1, 504], "states": "everything"}),
                         "application/json")
            report("bad_states_400", st == 400 and b"states" in b, f"{st} {b!r}")
        if want("private_refused"):
            rc, lines, err = client(f"http://127.0.0.1:{srv.port}", files["moa"], PROMPT, 8, "--private", "secret")
            report("private_refused", rc != 0 and "--private" in err and "MoA" in err, f"rc {rc} {err!r}")
        if want("sampling_equals_generate"):
            r = subprocess.run([BIN, "generate", "-m", MODEL, "--chat", "-p", PROMPT2, "-n", "40", "--temp", "0.8",
                                "--seed", "11", "--json"], capture_output=True, text=True, timeout=600)
            sref = json.loads(r.stdout)["text"]
            rc, lines, err = client(f"http://127.0.0.1:{srv.port}", files["moa-exact"], PROMPT2, 40, "--temp", "0.8",
                                    "--seed", "11")
            o = lines[-1] if lines else {}
            report("sampling_equals_generate", rc == 0 and o.get("text") == sref,
                   f"rc {rc}: {o.get('text')!r} != {sref!r} {err[-300:]}")
        if want("sampled_drafts_coupled"):
            P3 = "Write a poem about the sea."
            r = subprocess.run([BIN, "generate", "-m", MODEL, "--chat", "-p", P3, "-n", "48", "--temp", "1.5",
                                "--seed", "3", "--json"], capture_output=True, text=True, timeout=600)
            sref = json.loads(r.stdout)["text"]
            u = f"http://127.0.0.1:{srv.port}"
            rc1, l1, e1 = client(u, files["moa-exact"], P3, 48, "--temp", "1.5", "--seed", "3")
            rc2, l2, e2 = client(u, files["moa-exact"], P3, 48, "--temp", "1.5", "--seed", "3", "--greedy-drafts")
            o1, o2 = (l1[-1] if l1 else {}), (l2[-1] if l2 else {})
            print(f"  exact drafter, temperature 1.5: tau {o1.get('tau')} sampled drafts, {o2.get('tau')} most likely")
            report("sampled_drafts_coupled", rc1 == 0 and rc2 == 0 and o1.get("text") == sref == o2.get("text") and
                   o1.get("tau", 0) > o2.get("tau", 9) + 0.3, f"{o1.get('tau')} {o2.get('tau')} {o1.get('text')!r} "
                   f"{o2.get('text')!r} {sref!r} {e1[-200:]} {e2[-200:]}")
        if want("cut_midway_resumes"):
            N2 = 72
            r2 = generate_json(PROMPT2, N2)
            ref2, cut2 = r2["text"], cut_point(r2["n_generated"])
            px = Proxy(srv.port)
            state = {"cut": False}

            def cut(_p, _e, count):
                if not state["cut"] and count >= cut2:
                    state["cut"] = True
                    px.cmd("down")
                    threading.Timer(1.0, lambda: px.cmd("up")).start()
            rc, evs, errs = run_events(f"http://127.0.0.1:{px.port}", PROMPT2, N2, cut, "--final-wait", "20000",
                                       model=files["moa-tli1"])
            px.stop()
            dd = evs[-1] if evs else {}
            unver = sum(len(e["tokens"]) for e in evs if "tokens" in e and "done" not in e and not e["verified"])
            report("cut_midway_resumes", state["cut"] and rc == 0 and dd.get("text") == ref2 and
                   dd.get("unverified_emitted", 0) > 0 and
                   dd.get("unverified_emitted") == unver and dd.get("never_verified") == 0,
                   f"rc {rc} cut at {cut2}: {state['cut']} {dd} {errs[-400:]}")
    finally:
        srv.stop()
    if want("server_restarted"):
        N2 = 72
        ref2 = generate(PROMPT2, N2)
        port = free_port()
        box = {"srv": ServeProcess(BIN, MODEL, "--split", "2", "--port", str(port))}
        state = {"done": False}

        def restart():
            box["srv"].p.kill()
            box["srv"].p.wait()
            time.sleep(1.0)
            box["srv"] = ServeProcess(BIN, MODEL, "--split", "2", "--port", str(port))

        def on(p, e, n):
            if not state["done"] and n >= 30:
                state["done"] = True
                threading.Thread(target=restart).start()
        try:
            rc, evs, err = run_events(f"http://127.0.0.1:{port}", PROMPT2, N2, on, "--final-wait", "30000",
                                      model=files["moa-tli1"])
            d = evs[-1] if evs else {}
            report("server_restarted", rc == 0 and d.get("text") == ref2 and d.get("reopened", 0) >= 1 and
                   d.get("never_verified") == 0, f"rc {rc} {d} {err[-400:]}")
        finally:
            time.sleep(2)
            box["srv"].stop()
    if want("lsa_on_server") or want("lsa_other_drafter_400"):
        srv = ServeProcess(BIN, MODEL, "--head", os.path.join(tmp.name, "moa-tli1.gguf"), "--split", "2")
        try:
            rc, lines, err = client(f"http://127.0.0.1:{srv.port}", files["moa-tli1"], PROMPT, N, "--lsa-on-server")
            o = lines[-1] if lines else {}
            rck, lk, errk = client(f"http://127.0.0.1:{srv.port}", files["moa-tli1"], PROMPT, N)
            ok_ = lk[-1] if lk else {}
            st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": [1, 504, 3458], "n_predict": 8,
                                                                 "states": "lsa", "drafter": "0"}), "application/json")
            per = o.get("body_bytes_received", 0) / max(1, o.get("n_generated", 1))
            print(f"  --lsa-on-server: {per:.0f} body bytes received a token, "
                  f"{ok_.get('body_bytes_received', 0) / max(1, ok_.get('n_generated', 1)):.0f} with K,V rows")
            report("lsa_on_server", rc == 0 and o.get("text") == ref and o.get("tau") == ok_.get("tau") and
                   0 < o.get("body_bytes_received", 0) < ok_.get("body_bytes_received", 0) / 5,
                   f"rc {rc} {o.get('text')!r} tau {o.get('tau')} vs {ok_.get('tau')} bytes "
                   f"{o.get('body_bytes_received')} vs {ok_.get('body_bytes_received')} {err[-300:]}")
            rc2, l2, err2 = client(f"http://127.0.0.1:{srv.port}", files["moa"], PROMPT, 8, "--lsa-on-server")
            report("lsa_other_drafter_400", rc2 != 0 and "not the server's" in err2 and st == 400,
                   f"rc {rc2} {err2[-300:]} {st} {b!r}")
        finally:
            srv.stop()
    if any(want(c) for c in HIDDEN_CASES):
        states_hidden(tmp.name, want, ref, N)
    tmp.cleanup()
    return exit_status()


def states_hidden(d, want, ref, N):
    """An MoA drafter reading the target's states (--ca-hidden --sa-hidden): the
    open asks for them ("hidden_layer"), each position's rows end with its state."""
    files = {}
    for kind in ("moa-tli1-hid2", "moa-nolsa-hid2", "moa-tli1-nolsa", "moa-exact-nolsa"):
        h, cf = os.path.join(d, kind + ".gguf"), os.path.join(d, kind + ".client.gguf")
        r1 = subprocess.run([RANDOM_HEAD, MODEL, h, kind, "7"], capture_output=True, text=True)
        r2 = subprocess.run([BIN, "split-client", "-m", MODEL, "--head", h, "--out", cf], capture_output=True, text=True)
        if r1.returncode or r2.returncode:
            for c in HIDDEN_CASES:
                report(c, False, f"no client file for {kind}: {r1.stderr.strip()} {r2.stderr.strip()}")
            return
        files[kind] = cf
    srv = ServeProcess(BIN, MODEL, "--head", os.path.join(d, "moa-tli1-hid2.gguf"), "--split", "2")
    try:
        u = f"http://127.0.0.1:{srv.port}"
        if want("hidden_greedy"):
            errs = []
            for kind in ("moa-tli1-hid2", "moa-nolsa-hid2"):
                rc, lines, err = client(u, files[kind], PROMPT, N)
                o = lines[-1] if lines else {}
                if not (rc == 0 and o.get("text") == ref and o.get("never_verified") == 0 and o.get("rounds", 0) > 0):
                    errs.append(f"{kind}: rc {rc}: {o.get('text')!r} != {ref!r} {err[-300:]}")
            report("hidden_greedy", not errs, "; ".join(errs))
        if want("hidden_reply_size"):
            st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": [1, 504, 3458, 2196], "n_predict": 16,
                                                                 "states": "kv", "hidden_layer": 28}),
                         "application/json")
            o = json.loads(b)
            L, w, E = o.get("n_layer", 0), o.get("kv_width", 0), o.get("n_embd", 0)
            s1, r1 = post(srv.port, f"/v1/split/round?id={o.get('id')}", round_body(1, [o.get("first_token", 0), 28],
                                                                                     [-1, 0]))
            magic, seq, fin, q, na, bonus, nr, dw = struct.unpack("<IIBBHiHH", r1[:20]) if s1 == 200 else (0,) * 8
            per = 2 * L * (4 + w) + 4 + E
            want_len = 20 + 4 * na + (na + 1) * per
            raw = len(o.get("states", "")) * 3 // 4 - o.get("states", "").count("=")
            post(srv.port, f"/v1/split/close?id={o.get('id')}", b"", "application/json")
            report("hidden_reply_size", st == 200 and o.get("hidden_layer") == 28 and E == 576 and
                   o.get("n_states") == 4 and raw == 4 * per and s1 == 200 and nr == na + 1 and len(r1) == want_len,
                   f"open {st} {dict((k, v) for k, v in o.items() if k != 'states')} raw {raw}; round {s1} "
                   f"{len(r1)} != {want_len} (A {na}, rows {nr}, type {q})")
        if want("hidden_layer_400"):
            errs = []
            for body, what in (({"states": "kv", "hidden_layer": 30}, "0..29"),
                               ({"states": "kv", "hidden_layer": "last"}, "0..29"),
                               ({"states": False, "hidden_layer": 3}, "goes with")):
                st, b = post(srv.port, "/v1/split/open", json.dumps(dict(prompt=[1, 504], **body)), "application/json")
                if st != 400 or what.encode() not in b:
                    errs.append(f"{body}: {st} {b!r}")
            report("hidden_layer_400", not errs, "; ".join(errs))
        if want("hidden_lsa_on_server"):
            cf = files["moa-tli1-hid2"]
            rc, lines, err = client(u, cf, PROMPT, N, "--lsa-on-server")
            o = lines[-1] if lines else {}
            rck, lk, errk = client(u, cf, PROMPT, N)
            ok_ = lk[-1] if lk else {}
            report("hidden_lsa_on_server", rc == 0 and o.get("text") == ref and o.get("tau") == ok_.get("tau") and
                   0 < o.get("body_bytes_received", 0) < ok_.get("body_bytes_received", 0) / 3,
                   f"rc {rc} {o.get('text')!r} tau {o.get('tau')} vs {ok_.get('tau')} bytes "
                   f"{o.get('body_bytes_received')} vs {ok_.get('body_bytes_received')} {err[-300:]}")
        if want("mean_rows"):   # drafters without LSA: the layers' mean K,V rows (the default) or every layer's
            errs = []
            for kind in ("moa-nolsa-hid2", "moa-tli1-nolsa", "moa-exact-nolsa"):
                rc, lines, err = client(u, files[kind], PROMPT, N)
                o = lines[-1] if lines else {}
                rck, lk, errk = client(u, files[kind], PROMPT, N, "--kv-rows")
                ok_ = lk[-1] if lk else {}
                print(f"  {kind}: {o.get('body_bytes_received')} body bytes received with the mean, "
                      f"{ok_.get('body_bytes_received')} with every layer's K,V rows; tau {o.get('tau')} {ok_.get('tau')}")
                if not (rc == 0 and rck == 0 and o.get("text") == ref == ok_.get("text") and
                        abs(o.get("tau", 0) - ok_.get("tau", 9)) < 0.05 and
                        (0 < o.get("body_bytes_received", 0) < ok_.get("body_bytes_received", 0) / 5 if
                         kind != "moa-exact-nolsa" else o["tau"] > 2)):   # (exact: the mean and every layer's rows)
                    errs.append(f"{kind}: rc {rc} {rck} {o.get('text')!r} tau {o.get('tau')} vs {ok_.get('tau')} "
                                f"bytes {o.get('body_bytes_received')} vs {ok_.get('body_bytes_received')} {err[-300:]}")
            rc, lines, err = client(u, files["moa-tli1-hid2"], PROMPT, 8, "--kv-rows", "--lsa-on-server")
            if rc == 0 or "--kv-rows" not in err:
                errs.append(f"--kv-rows with --lsa-on-server: rc {rc} {err[-200:]}")
            report("mean_rows", not errs, "; ".join(errs))
        if want("no_states_nolsa"):   # --no-states: the open asks for no mean, no TLI rows, no states
            errs = []
            for kind in ("moa-nolsa-hid2", "moa-tli1-nolsa"):
                rc, lines, err = client(u, files[kind], PROMPT, N, "--no-states")
                o = lines[-1] if lines else {}
                if not (rc == 0 and o.get("text") == ref):
                    errs.append(f"{kind}: rc {rc} {o.get('text')!r} {err[-300:]}")
            report("no_states_nolsa", not errs, "; ".join(errs))
        if want("mean_reply_size"):
            st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": [1, 504, 3458, 2196], "n_predict": 16,
                                                                 "states": "mean", "tli": 1}), "application/json")
            o = json.loads(b)
            L, w = o.get("n_layer", 0), o.get("kv_width", 0)
            s1, r1 = post(srv.port, f"/v1/split/round?id={o.get('id')}", round_body(1, [o.get("first_token", 0), 28],
                                                                                     [-1, 0]))
            magic, seq, fin, q, na, bonus, nr, dw = struct.unpack("<IIBBHiHH", r1[:20]) if s1 == 200 else (0,) * 8
            per = 2 * 2 * (4 + w)   # the mean's K and V rows, the last layer's
            raw = len(o.get("states", "")) * 3 // 4 - o.get("states", "").count("=")
            post(srv.port, f"/v1/split/close?id={o.get('id')}", b"", "application/json")
            bad = [post(srv.port, "/v1/split/open", json.dumps({"prompt": [1, 504], "states": st_, "tli": t}),
                        "application/json") for st_, t in (("mean", 31), ("mean", "1"), ("kv", 1))]
            report("mean_reply_size", st == 200 and o.get("state_kind") == "mean" and raw == 4 * per and s1 == 200 and
                   q == 4 and dw == w and nr == na + 1 and len(r1) == 20 + 4 * na + (na + 1) * per and
                   all(x[0] == 400 and b"tli" in x[1] for x in bad),
                   f"open {st} {dict((k, v) for k, v in o.items() if k != 'states')} raw {raw}; round {s1} "
                   f"{len(r1)} (A {na}, rows {nr}, type {q}); bad {bad}")
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
