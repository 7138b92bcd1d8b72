#!/usr/bin/env python3
"""test_split_stop.py - stop strings in the split (docs/split.md): `specdec
client --stop TEXT` and the open's "stop".

  - the client's text (--json, --events, plain text) ends where the stop
    string first appears in the target's greedy text, nothing from it on
    (a partial token's text is cut at the match); finish "stopped"; the
    tokens end with the one completing the stop string;
  - the server stops its generation too: with the open's "stop", a round
    whose tokens complete the string answers finish 4 (stopped), its tokens
    end with the completing one, and the next round is refused (409);
  - a bad "stop" is 400.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them).
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import exit_status, report  # noqa: E402
from serve_proc import ServeProcess  # noqa: E402
from test_split import BIN, HEAD, MODEL, PROMPT2, post, round_body  # noqa: E402

CASES = ["client_json_stops", "client_events_stop", "client_text_stop", "server_stops_round", "bad_stop_400"]


def skip_all(why):
    for c in CASES:
        print(f"SKIP {c}: {why}")
    sys.exit(0)


def client(port, *extra):
    cmd = [BIN, "client", "-m", MODEL, "--head", HEAD, "--server", f"http://127.0.0.1:{port}", "--chat", "-p",
           PROMPT2, "-n", "48"] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def main():
    if not os.path.exists(BIN) or not os.path.exists(MODEL) or not os.path.exists(HEAD):
        skip_all("build/specdec, the default model or its shipped head is missing")
    if subprocess.run([BIN, "client", "--help"], capture_output=True).returncode != 0:
        skip_all("specdec was built without libcurl (the client)")
    try:
        srv = ServeProcess(BIN, MODEL, "--head", HEAD, "--split", "2", "-np", "1")
    except RuntimeError as e:
        skip_all(str(e))
    try:
        rc, out, err = client(srv.port, "--json")
        full = json.loads(out.splitlines()[-1]) if rc == 0 else {}
        text, toks = full.get("text", ""), full.get("tokens", [])
        if len(text) < 60:
            skip_all(f"the reference text is too short: {text!r} {err[-200:]}")
        # a stop string from the middle of the text, starting inside a word (a token's text cut at the match)
        at = len(text) // 2
        stop = text[at:at + 7]
        want = text[:text.find(stop)]
        rc, out, err = client(srv.port, "--json", "--stop", stop, "--stop", "never appears \u2603")
        o = json.loads(out.splitlines()[-1]) if rc == 0 and out.strip() else {}
        ot = o.get("tokens", [])
        # the tokens: a prefix of the full run's, the last one completing the stop string
        det = lambda ids: json.loads(srv.raw("POST", "/detokenize", json.dumps({"tokens": ids}))[2])["content"]
        tail_ok = len(ot) > 0 and ot == toks[:len(ot)] and stop in det(ot) and stop not in det(ot[:-1])
        report("client_json_stops", rc == 0 and o.get("text") == want and o.get("finish_reason") == "stopped" and
               tail_ok, f"rc {rc} stop {stop!r}: {o.get('text')!r} != {want!r}, tokens {ot} {err[-300:]}")
        rc, out, err = client(srv.port, "--events", "--stop", stop)
        evs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        got = "".join(e["text"] for e in evs if "tokens" in e and "done" not in e)
        report("client_events_stop", rc == 0 and got == want and evs and evs[-1].get("text") == want and
               not any("retract" in e for e in evs),
               f"rc {rc}: {got!r} != {want!r} {err[-300:]}")
        rc, out, err = client(srv.port, "--stop", stop)
        report("client_text_stop", rc == 0 and out == want + "\n", f"rc {rc}: {out!r} != {want!r}")
        # the server's own stop: rounds of the root alone (greedy decoding through the API)
        pr = json.loads(srv.raw("POST", "/tokenize", json.dumps({"content": "Once upon a time"}))[2])["tokens"]
        st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": pr, "n_predict": 64, "states": False}),
                     "application/json")
        o = json.loads(b)
        gen, root = [o["first_token"]], o["first_token"]
        for seq in range(1, 40):
            s1, r1 = post(srv.port, f"/v1/split/round?id={o['id']}", round_body(seq, [root], [-1], flags=0))
            if s1 != 200:
                break
            fin, bonus = r1[8], struct.unpack("<i", r1[12:16])[0]
            gen.append(bonus)
            root = bonus
        post(srv.port, f"/v1/split/close?id={o['id']}", b"", "application/json")
        gtext = det(gen)
        stop2 = gtext[len(gtext) // 2:len(gtext) // 2 + 5]
        st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": pr, "n_predict": 64, "states": False,
                                                             "stop": stop2}), "application/json")
        o = json.loads(b)
        got, root, fin, seq = [o["first_token"]], o["first_token"], o.get("finish", 0), 0
        while fin == 0 and seq < 40:
            seq += 1
            s1, r1 = post(srv.port, f"/v1/split/round?id={o['id']}", round_body(seq, [root], [-1], flags=0))
            if s1 != 200:
                break
            fin, bonus = r1[8], struct.unpack("<i", r1[12:16])[0]
            got.append(bonus)
            root = bonus
        s2, r2 = post(srv.port, f"/v1/split/round?id={o['id']}", round_body(seq + 1, [root], [-1], flags=0))
        report("server_stops_round", fin == 4 and got == gen[:len(got)] and stop2 in det(got) and
               stop2 not in det(got[:-1]) and s2 == 409 and b"ended" in r2,
               f"finish {fin} stop {stop2!r} {got} vs {gen[:len(got) + 2]} {s2} {r2!r}")
        st, b = post(srv.port, "/v1/split/open", json.dumps({"prompt": pr, "stop": ["ok", 7]}), "application/json")
        st2, b2 = post(srv.port, "/v1/split/open", json.dumps({"prompt": pr, "stop": ["x"] * 17}), "application/json")
        report("bad_stop_400", st == 400 and st2 == 400 and b"stop" in b and b"stop" in b2, f"{st} {b!r} {st2} {b2!r}")
    finally:
        srv.stop()
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
