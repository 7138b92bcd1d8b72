#!/usr/bin/env python3
"""test_serve.py - specdec serve end to end: the official OpenAI client
(streaming and not), greedy output equal to `specdec generate`, concurrent
clients equal to sequential ones, prefix reuse, stop strings, every bad input
(401, 400, 404, 405, 413, 503), hostile input (slow clients, half-closed
sockets, conflicting headers, HEAD, refused or clamped fields: `test_serve.py
hostile` runs only those), a client that disconnects mid-stream, /metrics,
/tokenize round trips, a clean exit on SIGTERM, and draft heads (--head):
greedy output with a randomly initialised EAGLE-3 head (and a Medusa head)
equal to plain `specdec generate`, on the precise and --fast-prompt prompt
paths, a request's eagle3:/medusa: speculation, 400 without the head, and
`--head auto`.

Prints PASS/FAIL/SKIP lines like the C tests (scripts/run-tests.sh counts
them). Needs the default model, build/specdec built with the server, and the
`openai` package; otherwise every case is skipped with the reason.
SPECDEC_BIN picks another binary (make asan-serve runs the AddressSanitizer
build), SPECDEC_MODEL another model.
"""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
from serve_proc import ServeProcess  # noqa: E402
from serve_hostile import HOSTILE_CASES, hostile_servers  # noqa: E402

BIN = os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec"))
MODEL = os.environ.get("SPECDEC_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
N_TOK = 24  # tokens per generation: short, the machine may be shared

CASES = ["openai_chat", "openai_chat_stream", "openai_completion", "greedy_equals_generate_chat",
         "greedy_equals_generate_completion", "long_prompt_chunked", "fast_prompt_batched", "concurrent_equals_sequential", "prefix_reuse", "stop_strings",
         "sampling_seed", "bad_json_400", "wrong_type_400", "unknown_model_served", "prompt_too_long_400",
         "body_too_large_413", "unknown_endpoint_404", "api_key_401", "queue_full_503",
         "disconnect_frees_slot", "disconnect_nonstream_frees_slot", "tiny_temperature_greedy", "metrics", "tokenize_roundtrip", "sigterm_mid_stream", "shutdown_clean",
         "head_missing_400"]
# Cases of the servers started with draft heads (build/tests/tool_random_head makes them).
HEAD_CASES = ["head_greedy_equals_generate", "head_stream_equals_generate", "head_speculation_eagle3_chain3",
              "head_medusa", "head_shutdown_clean", "head_fast_prompt", "head_auto"]
HEAD_TOOL = os.path.join(ROOT, "build", "tests", "tool_random_head")



def skip_all(why):
    for c in CASES + HEAD_CASES + HOSTILE_CASES:
        print(f"SKIP {c}: {why}")
    sys.exit(0)


class Server(ServeProcess):
    """A specdec serve process on a free port, with JSON requests."""

    def __init__(self, *args):
        super().__init__(BIN, MODEL, *args)

    def request(self, method, path, body=None, headers=None, timeout=300):
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        status, _, data = self.raw(method, path, body, headers, timeout)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data.decode("utf-8", "replace")

    def metric(self, name, headers=None):
        _, text = self.request("GET", "/metrics", headers=headers)
        m = re.search(r"^" + re.escape(name) + r" ([0-9.]+)$", text, re.M)
        return float(m.group(1)) if m else None


def generate(prompt, chat, method_args):
    cmd = [BIN, "generate", "-m", MODEL, "-p", prompt, "--temp", "0", "-n", str(N_TOK)] + method_args
    if chat:
        cmd.append("--chat")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.decode())
    text = out.stdout.decode()
    return text[:-1] if text.endswith("\n") else text


def sse_open(port, path, body, headers=None):
    """Sends a streaming request on a raw socket; returns the socket."""
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    s.sendall(head.encode() + b"\r\n" + data)
    return s


def read_until(s, marker, limit=10 << 20):
    buf = b""
    while marker not in buf and len(buf) < limit:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def chat_body(q, **kw):
    b = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": N_TOK}
    b.update(kw)
    return b


def run_main_server(client_mod):
    srv = Server("--parallel", "3")
    try:
        main_cases(srv, client_mod)
    finally:
        rc = srv.stop()
        report("shutdown_clean", rc == 0, f"exit status {rc}; log: {' | '.join(srv.log[-8:])}")


def main_cases(srv, openai):
    base = f"http://127.0.0.1:{srv.port}/v1"
    client = openai.OpenAI(base_url=base, api_key="none", timeout=300, max_retries=0)
    model_id = client.models.list().data[0].id
    q = "What is the capital of France?"

    # the official client, not streaming and streaming
    try:
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": q}], temperature=0,
                                           max_tokens=N_TOK)
        text = r.choices[0].message.content
        spec = (r.usage.model_extra or {}).get("speculation", {})
        report("openai_chat", bool(text) and r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0 and
               "tau" in spec and "drafted" in spec and "accepted" in spec, f"text={text!r} usage={r.usage}")
    except Exception as e:  # noqa: BLE001
        text = None
        report("openai_chat", False, repr(e))
    try:
        parts, usage, finish = [], None, None
        for ch in client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": q}],
                                                 temperature=0, max_tokens=N_TOK, stream=True,
                                                 stream_options={"include_usage": True}):
            if ch.choices:
                parts.append(ch.choices[0].delta.content or "")
                finish = ch.choices[0].finish_reason or finish
            if ch.usage:
                usage = ch.usage
        streamed = "".join(parts)
        report("openai_chat_stream", streamed == text and usage is not None and finish in ("stop", "length"),
               f"streamed={streamed!r} vs {text!r}, usage={usage}, finish={finish}")
    except Exception as e:  # noqa: BLE001
        report("openai_chat_stream", False, repr(e))
    p = "The cat sat on the"
    try:
        r = client.completions.create(model=model_id, prompt=p, temperature=0, max_tokens=N_TOK)
        ctext = r.choices[0].text
        parts = [ch.choices[0].text for ch in client.completions.create(
            model=model_id, prompt=p, temperature=0, max_tokens=N_TOK, stream=True) if ch.choices]
        report("openai_completion", bool(ctext) and "".join(parts) == ctext, f"{ctext!r} vs {''.join(parts)!r}")
    except Exception as e:  # noqa: BLE001
        ctext = None
        report("openai_completion", False, repr(e))

    # greedy output equals specdec generate's, with and without speculation
    try:
        bad = []
        for spec, args in (("ngram:3-8", ["--draft-ngram", "3,8"]), ("off", [])):
            want = generate(q, True, args)
            st, got = srv.request("POST", "/v1/chat/completions", chat_body(q, speculation=spec))
            got = got["choices"][0]["message"]["content"] if st == 200 else got
            if got != want:
                bad.append(f"{spec}: server {got!r} vs generate {want!r}")
        report("greedy_equals_generate_chat", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("greedy_equals_generate_chat", False, repr(e))
    try:
        bad = []
        for spec, args in (("ngram:3-8", ["--draft-ngram", "3,8"]), ("off", [])):
            want = generate(p, False, args)
            st, got = srv.request("POST", "/v1/completions", {"prompt": p, "temperature": 0, "max_tokens": N_TOK,
                                                             "speculation": spec})
            got = got["choices"][0]["text"] if st == 200 else got
            if got != want:
                bad.append(f"{spec}: server {got!r} vs generate {want!r}")
        report("greedy_equals_generate_completion", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("greedy_equals_generate_completion", False, repr(e))

    # a prompt of several prefill chunks (64 tokens each, evaluated between
    # rounds) while another client streams: both texts equal generate's
    try:
        lp = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep. " * 12
        sq = "Name a planet."
        want_long = generate(lp, False, ["--draft-ngram", "3,8"])
        want_short = generate(sq, True, ["--draft-ngram", "3,8"])
        res = {}

        def long_req():
            res["long"] = srv.request("POST", "/v1/completions", {"prompt": lp, "temperature": 0, "max_tokens": N_TOK})

        t = threading.Thread(target=long_req)
        t.start()
        res["short"] = srv.request("POST", "/v1/chat/completions", chat_body(sq))
        t.join()
        (sl, rl), (ss, rs) = res["long"], res["short"]
        got_long = rl["choices"][0]["text"] if sl == 200 else rl
        got_short = rs["choices"][0]["message"]["content"] if ss == 200 else rs
        n_prompt = rl["usage"]["prompt_tokens"] if sl == 200 else 0
        report("long_prompt_chunked", got_long == want_long and got_short == want_short and n_prompt > 128,
               f"long ({n_prompt} prompt tokens) {got_long!r} vs {want_long!r}; short {got_short!r} vs {want_short!r}")
    except Exception as e:  # noqa: BLE001
        report("long_prompt_chunked", False, repr(e))

    # three clients at once get the texts they get one by one
    qs = ["Name three colors.", "What is 2+2?", "Write a haiku about the sea."]
    try:
        seq = []
        for x in qs:
            st, r = srv.request("POST", "/v1/chat/completions", chat_body(x))
            seq.append(r["choices"][0]["message"]["content"] if st == 200 else f"HTTP {st} {r}")
        conc = [None] * 3

        def one(i):
            st, r = srv.request("POST", "/v1/chat/completions", chat_body(qs[i]))
            conc[i] = r["choices"][0]["message"]["content"] if st == 200 else f"HTTP {st} {r}"

        ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        report("concurrent_equals_sequential", seq == conc and all(seq), f"sequential {seq} vs concurrent {conc}")
    except Exception as e:  # noqa: BLE001
        report("concurrent_equals_sequential", False, repr(e))

    # the same prompt again: all but one prompt token come from a slot's cache, same text
    try:
        body = chat_body("Tell me about the moon.")
        _, a = srv.request("POST", "/v1/chat/completions", body)
        _, b = srv.request("POST", "/v1/chat/completions", body)
        ua, ub = a["usage"], b["usage"]
        report("prefix_reuse", a["choices"][0]["message"] == b["choices"][0]["message"] and
               ub["prompt_tokens_details"]["cached_tokens"] == ub["prompt_tokens"] - 1,
               f"first {a['choices'][0]} {ua}, second {b['choices'][0]} {ub}")
    except Exception as e:  # noqa: BLE001
        report("prefix_reuse", False, repr(e))

    # stop strings: the text ends before the first match, finish_reason stop, stream and not
    try:
        full = text or ""
        words = [w for w in re.findall(r"\w+", full) if len(w) >= 4]
        bad = []
        if len(words) < 2:
            bad.append(f"greedy answer {full!r} has too few words for the test")
        else:
            stop = words[1]
            want = full[:full.index(stop)]
            st, r = srv.request("POST", "/v1/chat/completions", chat_body(q, stop=[stop, "zzzz-never"]))
            got = r["choices"][0]["message"]["content"] if st == 200 else r
            if got != want or r["choices"][0]["finish_reason"] != "stop":
                bad.append(f"stop {stop!r}: {got!r} vs {want!r}")
            parts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": q}], temperature=0, max_tokens=N_TOK,
                stop=stop, stream=True) if ch.choices]
            if "".join(parts) != want:
                bad.append(f"streamed stop {stop!r}: {''.join(parts)!r} vs {want!r}")
        report("stop_strings", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("stop_strings", False, repr(e))

    # sampling: the same seed gives the same text (with speculation), another seed is allowed to differ
    try:
        body = chat_body("Write a story about a dog.", temperature=0.9, seed=42, top_k=40, top_p=0.95, min_p=0.05)
        _, a = srv.request("POST", "/v1/chat/completions", body)
        _, b = srv.request("POST", "/v1/chat/completions", body)
        ta, tb = a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]
        report("sampling_seed", ta == tb and len(ta) > 0, f"{ta!r} vs {tb!r}")
    except Exception as e:  # noqa: BLE001
        report("sampling_seed", False, repr(e))

    # bad inputs
    def expect(name, status, method, path, body, needle, headers=None):
        try:
            st, r = srv.request(method, path, body, headers)
            msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
            ok = st == status and isinstance(r, dict) and "type" in r.get("error", {}) and needle in msg
            return ok, f"HTTP {st} {r}"
        except Exception as e:  # noqa: BLE001
            return False, repr(e)

    ok, why = expect("bad_json", 400, "POST", "/v1/chat/completions", '{"messages": [', "invalid JSON")
    report("bad_json_400", ok, why)
    checks = [expect("", 400, "POST", "/v1/chat/completions", {"messages": "hi"}, "'messages'"),
              expect("", 400, "POST", "/v1/chat/completions", chat_body(q, temperature="hot"), "'temperature'"),
              expect("", 400, "POST", "/v1/chat/completions", chat_body(q, max_tokens=2.5), "'max_tokens'"),
              expect("", 400, "POST", "/v1/completions", {"prompt": 5}, "'prompt'"),
              expect("", 400, "POST", "/v1/chat/completions", chat_body(q, stop=[1]), "'stop[0]'"),
              expect("", 400, "POST", "/v1/chat/completions", chat_body(q, speculation="chain:x"), "speculation"),
              expect("", 400, "POST", "/v1/chat/completions", chat_body(q, speculation="chain:4"), "draft model"),
              expect("", 400, "POST", "/v1/chat/completions",
                     {"messages": [{"role": "robot", "content": "hi"}]}, "robot"),
              expect("", 400, "POST", "/v1/chat/completions", [1, 2], "JSON object"),
              expect("", 400, "POST", "/detokenize", {"tokens": [10 ** 9]}, "tokens[0]"),
              expect("", 400, "POST", "/detokenize", {"tokens": [1] * 200000}, "more than the context")]
    report("wrong_type_400", all(c[0] for c in checks), "; ".join(c[1] for c in checks if not c[0]))
    # a temperature too small to divide by is greedy (1 / a subnormal float is inf: with no
    # top-k / min-p cut every probability was NaN and the text came out empty)
    tiny = dict(max_tokens=12, top_k=0, min_p=0, top_p=1, seed=7)
    st0, g0 = srv.request("POST", "/v1/chat/completions", chat_body(q, temperature=0, **tiny))
    st1, g1 = srv.request("POST", "/v1/chat/completions", chat_body(q, temperature=1e-40, **tiny))
    c0 = g0["choices"][0]["message"]["content"] if st0 == 200 else None
    c1 = g1["choices"][0]["message"]["content"] if st1 == 200 else None
    report("tiny_temperature_greedy", st0 == st1 == 200 and c0 == c1 and c0, f"HTTP {st0}/{st1}: {c0!r} / {c1!r}")
    # any model name is served (as by llama-server); a name that is not a string is a 400
    ok, why = expect("", 400, "POST", "/v1/chat/completions", chat_body(q, model=["gpt-4"]), "'model'")
    st, r = srv.request("POST", "/v1/chat/completions", chat_body(q, model="gpt-4", max_tokens=2))
    report("unknown_model_served", ok and st == 200 and r.get("model") == model_id, f"{why} / gpt-4: HTTP {st} {r}")
    # a head's methods on a server without that head: a 400 that says what to start it with
    checks = [expect("", 400, "POST", "/v1/chat/completions", chat_body(q, speculation="eagle3:chain:3"),
                     "needs an EAGLE-3 head"),
              expect("", 400, "POST", "/v1/completions", {"prompt": p, "speculation": "eagle3:dyn:2-4-8"},
                     "--head"),
              expect("", 400, "POST", "/v1/chat/completions", chat_body(q, speculation="medusa:2-2"),
                     "needs a Medusa head")]
    report("head_missing_400", all(c[0] for c in checks), "; ".join(c[1] for c in checks if not c[0]))
    ok, why = expect("", 400, "POST", "/v1/completions", {"prompt": "word " * 3000, "max_tokens": 4}, "context")
    report("prompt_too_long_400", ok, why)
    # The server answers 413 as soon as it has the headers (it never reads the
    # body), so the client sends only the headers: a client that went on
    # writing the body could meet a closed socket, depending on timing.
    def too_large():
        import socket
        try:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sk:
                sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % ((1 << 20) + 100))
                data = b""
                while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                    chunk = sk.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            head = data.split(b"\r\n", 1)[0].decode(errors="replace")
            return " 413 " in head + " " and b"larger" in data, head
        except Exception as e:  # noqa: BLE001
            return False, repr(e)
    ok, why = too_large()
    report("body_too_large_413", ok, why)
    ok1, why1 = expect("", 404, "GET", "/v2/nothing", None, "endpoint")
    ok2, why2 = expect("", 405, "GET", "/v1/chat/completions", None, "POST")
    report("unknown_endpoint_404", ok1 and ok2, why1 + " / " + why2)

    # /metrics: every family, counts that moved
    try:
        _, m = srv.request("GET", "/metrics")
        names = ["specdec_requests_total", "specdec_prompt_tokens_total", "specdec_generated_tokens_total",
                 "specdec_slots_busy", "specdec_queue_length", "specdec_draft_tokens_total",
                 "specdec_draft_accepted_total", "specdec_tau", "specdec_prompt_tokens_cached_total",
                 "specdec_tokens_per_second", "specdec_batch_rows_per_forward", "specdec_batch_forwards_total",
                 "specdec_time_to_first_token_seconds", "specdec_prefill_chunks_total"]
        missing = [n for n in names if n not in m]
        gen = srv.metric("specdec_generated_tokens_total")
        # the concurrent cases above shared passes: more slot batches than passes
        passes, slots = srv.metric("specdec_batch_forwards_total"), srv.metric("specdec_batch_slots_total")
        report("metrics", not missing and gen and gen > 0 and srv.metric("specdec_tau") >= 1.0 and
               passes and slots > passes, f"missing {missing}, generated {gen}, passes {passes}, slot batches {slots}")
    except Exception as e:  # noqa: BLE001
        report("metrics", False, repr(e))

    # /tokenize -> /detokenize round trip (special tokens included)
    try:
        s = "Hello <|im_start|>user\nwörld 123!"
        st1, t = srv.request("POST", "/tokenize", {"content": s})
        st2, d = srv.request("POST", "/detokenize", {"tokens": t["tokens"]})
        report("tokenize_roundtrip", st1 == 200 and st2 == 200 and d["content"] == s and 1 in t["tokens"],
               f"{t} -> {d}")
    except Exception as e:  # noqa: BLE001
        report("tokenize_roundtrip", False, repr(e))


def fast_prompt_server():
    """--fast-prompt: prompt chunks ride in the rounds' passes beside other
    slots' steps; a long prompt and a short chat at once equal generate
    --fast-prompt's texts."""
    srv = Server("--parallel", "2", "--fast-prompt")
    try:
        lp = "Once upon a time a small robot walked through the old city looking for its friend. " * 10
        sq = "Name a planet."
        args = ["--draft-ngram", "3,8", "--fast-prompt"]
        want_long, want_short = generate(lp, False, args), generate(sq, True, args)
        res = {}

        def long_req():
            res["long"] = srv.request("POST", "/v1/completions", {"prompt": lp, "temperature": 0, "max_tokens": N_TOK})

        t = threading.Thread(target=long_req)
        t.start()
        res["short"] = srv.request("POST", "/v1/chat/completions", chat_body(sq))
        t.join()
        (sl, rl), (ss, rs) = res["long"], res["short"]
        got_long = rl["choices"][0]["text"] if sl == 200 else rl
        got_short = rs["choices"][0]["message"]["content"] if ss == 200 else rs
        chunks = srv.metric("specdec_prefill_chunks_total")
        report("fast_prompt_batched", got_long == want_long and got_short == want_short and chunks and chunks >= 3,
               f"long {got_long!r} vs {want_long!r}; short {got_short!r} vs {want_short!r}; chunks {chunks}")
    except Exception as e:  # noqa: BLE001
        report("fast_prompt_batched", False, repr(e))
    finally:
        srv.stop()


def limits_server():
    """--parallel 1 --queue 1 --api-key: 401, 503, disconnect, SIGTERM mid-stream."""
    key = {"Authorization": "Bearer sekrit"}
    srv = Server("--parallel", "1", "--queue", "1", "--api-key", "sekrit", "--ctx", "512")
    try:
        st1, r1 = srv.request("POST", "/v1/chat/completions", chat_body("hi"))
        st2, r2 = srv.request("POST", "/v1/chat/completions", chat_body("hi"), {"Authorization": "Bearer wrong"})
        st3, _ = srv.request("GET", "/health")
        st4, _ = srv.request("GET", "/v1/models", None, key)
        report("api_key_401", st1 == 401 and st2 == 401 and st3 == 200 and st4 == 200 and
               r1["error"]["type"] == "authentication_error", f"{st1} {r1} / {st2} / health {st3} / models {st4}")

        # A streams for long (speculation off, counting), B waits in the queue, C is refused.
        long_body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 1000, "temperature": 0,
                     "speculation": "off", "stream": True}
        a = sse_open(srv.port, "/v1/completions", long_body, key)
        first = read_until(a, b"data: ")
        b_res = {}

        def run_b():
            b_res["r"] = srv.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4,
                                                                "temperature": 0}, key)
            b_res["t"] = time.time()

        tb = threading.Thread(target=run_b)
        tb.start()
        deadline = time.time() + 60
        while time.time() < deadline and srv.metric("specdec_queue_length", key) != 1:
            time.sleep(0.05)
        st, r = srv.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4}, key)
        report("queue_full_503", b"data: " in first and st == 503 and "busy" in r["error"]["message"],
               f"HTTP {st} {r}")

        # A goes away mid-stream: its slot is freed at once, B then runs.
        t_close = time.time()
        a.close()
        tb.join(120)
        gen_before = srv.metric("specdec_generated_tokens_total", key)
        ok_b = "r" in b_res and b_res["r"][0] == 200
        waited = b_res.get("t", 1e9) - t_close
        errors = srv.metric('specdec_requests_total{result="error"}', key)
        _, mt = srv.request("GET", "/metrics", None, key)
        m = re.search(r'specdec_requests_total\{result="error"\} (\d+)', mt)
        errors = int(m.group(1)) if m else 0
        report("disconnect_frees_slot", ok_b and waited < 30 and errors >= 1 and gen_before < 1000,
               f"B {b_res.get('r')}, waited {waited:.1f}s, cancelled {errors}, generated {gen_before}")

        # A non-streaming request whose client resets its socket: its generation stops too,
        # although nothing is written to it before the reply (a plain close, a FIN, looks like
        # a half-close until a write: such a request runs on, docs/serve.md).
        gen0 = srv.metric("specdec_generated_tokens_total", key)
        a2 = sse_open(srv.port, "/v1/completions", dict(long_body, stream=False), key)
        a2.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close = reset
        deadline = time.time() + 60
        while time.time() < deadline and srv.metric("specdec_slots_busy", key) != 1:
            time.sleep(0.02)
        a2.close()
        t_close = time.time()
        while time.time() < t_close + 60 and srv.metric("specdec_slots_busy", key) != 0:
            time.sleep(0.02)
        freed = time.time() - t_close
        gen1 = srv.metric("specdec_generated_tokens_total", key)
        report("disconnect_nonstream_frees_slot", freed < 30 and gen1 - gen0 < 300,
               f"slot freed {freed:.1f} s after the close, {gen1 - gen0:.0f} tokens generated (up to ~490 "
               "if it ran on)")

        # SIGTERM with a stream in flight: the stream ends cleanly ([DONE]), the server exits 0.
        c = sse_open(srv.port, "/v1/completions", long_body, key)
        read_until(c, b"data: ")
        srv.p.send_signal(signal.SIGTERM)
        rest = read_until(c, b"data: [DONE]")
        c.close()
        rc = srv.p.wait(60)
        report("sigterm_mid_stream", b"data: [DONE]" in rest and rc == 0,
               f"exit {rc}, tail {rest[-200:]!r}; log: {' | '.join(srv.log[-6:])}")
    except Exception as e:  # noqa: BLE001
        report("limits_server", False, repr(e))
        srv.stop()


def completion_text(kind, status, r):
    """The text of a non-streamed answer, or a description of the failure."""
    if status != 200:
        return f"HTTP {status} {r}"
    return r["choices"][0]["message"]["content"] if kind == "chat" else r["choices"][0]["text"]


def stream_text(srv, path, body):
    """A streamed request's text (the deltas joined) and its last usage, read
    through http.client (which undoes the chunked transfer encoding)."""
    st, _, data = srv.raw("POST", path, json.dumps(dict(body, stream=True, stream_options={"include_usage": True})))
    if st != 200:
        return f"HTTP {st} {data[:200]!r}", None
    parts, usage = [], None
    for line in data.decode().split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices", []):
            parts.append((ch["delta"].get("content") if "delta" in ch else ch.get("text")) or "")
        usage = ev.get("usage") or usage
    return "".join(parts), usage


def head_server(e3, md):
    """A server with an EAGLE-3 and a Medusa head (random: they draft badly,
    the text must be plain decoding's), started with --method eagle3:chain:4;
    a long prompt is evaluated in chunks while a chat generates, so both
    slots' drafters get their prompt rows from the scheduler's chunk passes."""
    srv = Server("--parallel", "2", "--head", e3, "--head", md, "--method", "eagle3:chain:4")
    q, p = "What is the capital of France?", "The cat sat on the"
    lp = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep. " * 6
    try:
        want_q, want_p, want_lp = generate(q, True, []), generate(p, False, []), generate(lp, False, [])
        # a long completion and a chat at once, then each again (from the slots' caches), then the completion
        res = {}

        def long_req():
            res["long"] = srv.request("POST", "/v1/completions", {"prompt": lp, "temperature": 0, "max_tokens": N_TOK})

        t = threading.Thread(target=long_req)
        t.start()
        res["chat"] = srv.request("POST", "/v1/chat/completions", chat_body(q))
        t.join()
        got = [("long", completion_text("completion", *res["long"]), want_lp),
               ("chat", completion_text("chat", *res["chat"]), want_q)]
        st, r = srv.request("POST", "/v1/chat/completions", chat_body(q))
        got.append(("chat again", completion_text("chat", st, r), want_q))
        spec = r.get("usage", {}).get("speculation", {}) if st == 200 else {}
        st, r = srv.request("POST", "/v1/completions", {"prompt": p, "temperature": 0, "max_tokens": N_TOK})
        got.append(("completion", completion_text("completion", st, r), want_p))
        bad = [f"{n}: server {g!r} vs generate {w!r}" for n, g, w in got if g != w]
        if spec.get("method") != "eagle3:chain:4" or not spec.get("drafted"):
            bad.append(f"--method eagle3:chain:4: usage.speculation {spec}")
        n_long = res["long"][1]["usage"]["prompt_tokens"] if res["long"][0] == 200 else 0
        if n_long <= 64:
            bad.append(f"the long prompt has {n_long} tokens, one chunk")
        report("head_greedy_equals_generate", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        want_q = want_p = None
        report("head_greedy_equals_generate", False, repr(e))
    try:
        bad = []
        for path, kind, body, want in (("/v1/chat/completions", "chat", chat_body(q), want_q),
                                       ("/v1/completions", "completion",
                                        {"prompt": p, "temperature": 0, "max_tokens": N_TOK}, want_p)):
            text, usage = stream_text(srv, path, body)
            spec = (usage or {}).get("speculation", {})
            if text != want or spec.get("method") != "eagle3:chain:4":
                bad.append(f"{kind}: streamed {text!r} vs generate {want!r}, usage {usage}")
        report("head_stream_equals_generate", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("head_stream_equals_generate", False, repr(e))
    for name, spec_s in (("head_speculation_eagle3_chain3", "eagle3:chain:3"), ("head_medusa", "medusa:2-2")):
        try:
            bad = []
            st, r = srv.request("POST", "/v1/chat/completions", chat_body(q, speculation=spec_s))
            got = completion_text("chat", st, r)
            spec = r.get("usage", {}).get("speculation", {}) if st == 200 else {}
            if got != want_q or spec.get("method") != spec_s or not spec.get("drafted"):
                bad.append(f"{got!r} vs generate {want_q!r}, usage.speculation {spec}")
            text, usage = stream_text(srv, "/v1/completions",
                                      {"prompt": p, "temperature": 0, "max_tokens": N_TOK, "speculation": spec_s})
            if text != want_p:
                bad.append(f"streamed completion {text!r} vs generate {want_p!r}")
            report(name, not bad, "; ".join(bad))
        except Exception as e:  # noqa: BLE001
            report(name, False, repr(e))
    rc = srv.stop()
    report("head_shutdown_clean", rc == 0, f"exit status {rc}; log: {' | '.join(srv.log[-8:])}")


def head_fast_prompt_server(e3):
    """--fast-prompt with an EAGLE-3 head: the prompt chunks (and their hidden
    rows) ride in the rounds' passes beside the other slot's steps; the texts
    equal generate --fast-prompt's without speculation."""
    srv = Server("--parallel", "2", "--fast-prompt", "--head", e3)
    try:
        lp = "Once upon a time a small robot walked through the old city looking for its friend. " * 10
        sq = "Name a planet."
        want_long, want_short = generate(lp, False, ["--fast-prompt"]), generate(sq, True, ["--fast-prompt"])
        res = {}

        def long_req():
            res["long"] = srv.request("POST", "/v1/completions", {"prompt": lp, "temperature": 0, "max_tokens": N_TOK})

        t = threading.Thread(target=long_req)
        t.start()
        res["short"] = srv.request("POST", "/v1/chat/completions", chat_body(sq))
        t.join()
        got_long, got_short = completion_text("completion", *res["long"]), completion_text("chat", *res["short"])
        chunks = srv.metric("specdec_prefill_chunks_total")
        report("head_fast_prompt", got_long == want_long and got_short == want_short and chunks and chunks >= 3,
               f"long {got_long!r} vs {want_long!r}; short {got_short!r} vs {want_short!r}; chunks {chunks}")
    except Exception as e:  # noqa: BLE001
        report("head_fast_prompt", False, repr(e))
    finally:
        srv.stop()


def head_auto():
    """--head auto: the head in heads/ made for the model, whose default
    method is then ngram:3-8/eagle3:auto (ngram:5-8:auto/eagle3:auto where
    --head auto also found the model's datastore, `make datastore`), or
    (none) a note and the usual default; --method eagle3:... without a head
    stops with a message."""
    try:
        srv = Server("--parallel", "1", "--head", "auto")
        log = "\n".join(srv.log)
        rc = srv.stop()
        none = "no head in heads/ was made for" in log and "method ngram:3-8" in log
        ds = "--datastore auto: " in log and "data/datastore/" in log
        found = re.search(r"--head auto: \S+\.gguf", log) and \
            f"method {'ngram:5-8:auto' if ds else 'ngram:3-8'}/eagle3:auto" in log
        out = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--method", "eagle3:chain:3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        err = out.stderr.decode()
        report("head_auto", (none or found) and rc == 0 and out.returncode != 0 and "needs an EAGLE-3 head" in err,
               f"log {log!r}, exit {rc}; --method eagle3:chain:3 without a head: exit {out.returncode} {err!r}")
    except Exception as e:  # noqa: BLE001
        report("head_auto", False, repr(e))


def head_servers():
    if not os.access(HEAD_TOOL, os.X_OK):
        for c in HEAD_CASES:
            print(f"SKIP {c}: {HEAD_TOOL} not built (make)")
        return
    with tempfile.TemporaryDirectory(prefix="specdec-heads-") as d:
        e3, md = os.path.join(d, "eagle3.gguf"), os.path.join(d, "medusa.gguf")
        for path, kind in ((e3, "eagle3"), (md, "medusa")):
            out = subprocess.run([HEAD_TOOL, MODEL, path, kind, "7"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 timeout=300)
            if out.returncode != 0:
                for c in HEAD_CASES:
                    report(c, False, f"tool_random_head {kind}: {out.stderr.decode().strip()}")
                return
        head_server(e3, md)
        head_fast_prompt_server(e3)
    head_auto()


def main():
    if not os.path.exists(MODEL):
        skip_all(f"model {MODEL} not found (scripts/fetch-models.sh)")
    if not os.access(BIN, os.X_OK):
        skip_all(f"{BIN} not built")
    h = subprocess.run([BIN, "serve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if h.returncode != 0:
        skip_all("specdec was built without the server: " + h.stderr.decode().strip())
    try:
        import openai
    except ImportError:
        skip_all("the openai package is not installed (python3 -m pip install openai)")
    if sys.argv[1:] == ["hostile"]:   # only the hostile-input cases
        hostile_servers(Server)
        sys.exit(exit_status())
    run_main_server(openai)
    hostile_servers(Server)
    fast_prompt_server()
    limits_server()
    head_servers()
    sampling_race_seeded()
    sys.exit(exit_status())


def sampling_race_seeded():
    """sampling_race_seeded: with the race draw (the default), three identical
    seeded requests at temperature 0.8 with eagle3:auto, sent at once (so that
    they share the rounds' passes and the draft budget), and one with
    ngram:3-8/eagle3:auto return one text: plain sampling's (speculation off)
    with that seed."""
    name = "sampling_race_seeded"
    head = os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct.eagle3.gguf")
    if not os.path.exists(head):
        print(f"SKIP {name}: {head} not found")
        return
    try:
        srv = Server("--head", head, "--parallel", "3")
        try:
            def ask(spec, out=None, i=0):
                body = {"messages": [{"role": "user", "content": "Write a short poem about the sea."}],
                        "temperature": 0.8, "seed": 1234, "max_tokens": 48, "speculation": spec}
                st, r = srv.request("POST", "/v1/chat/completions", body)
                res = (r["choices"][0]["message"]["content"], r["usage"].get("speculation", {})) if st == 200 else (
                    f"HTTP {st} {r}", {})
                if out is not None:
                    out[i] = res
                return res

            plain, _ = ask("off")
            got = [None] * 3
            ts = [threading.Thread(target=ask, args=("eagle3:auto", got, i)) for i in range(3)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(600)
            got.append(ask("ngram:3-8/eagle3:auto"))
            bad = [f"request {i}: {g[0]!r}" for i, g in enumerate(got) if g is None or g[0] != plain]
            drafted = sum(g[1].get("accepted", 0) for g in got if g)
            if not plain or drafted == 0:
                bad.append(f"nothing to compare: plain {plain!r}, {drafted} drafts accepted")
            report(name, not bad, f"plain {plain!r}; " + "; ".join(bad))
        finally:
            srv.stop()
    except Exception as e:  # noqa: BLE001
        report(name, False, repr(e))


if __name__ == "__main__":
    main()
