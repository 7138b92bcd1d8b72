"""serve_hostile.py - test_serve.py's hostile-input cases (issue 27): slow
clients (slowloris) that must not keep /health from answering, half-closed
sockets, conflicting Content-Length headers, Allow and HEAD, the Bearer
scheme in any case, refused logprobs, clamped max_tokens, any model name,
speculation errors that name the field, JSON 414 / 431, and
usage.speculation.accepted equal to the streamed chunks' sum. Run alone with
`python3 tests/serve/test_serve.py hostile`."""
import http.client
import json
import socket
import threading
import time

from report import report

N_TOK = 24


def chat_body(q, **kw):
    b = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": N_TOK}
    b.update(kw)
    return b


HOSTILE_CASES = ["accepted_equals_chunks", "half_close_reply", "content_length_conflict_400",
                 "allow_and_head", "bearer_any_case", "logprobs_refused", "max_tokens_clamped", "any_model_name",
                 "speculation_errors_named", "head_limits_json", "slow_headers_deadline", "slowloris_health",
                 "hostile_shutdown_clean"]


def raw_exchange(port, data, half_close=False, timeout=60):
    """Sends data on a new socket (then shuts its sending side down when
    half_close) and reads until the server closes: the raw response bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return buf
            buf += chunk
    finally:
        s.close()


def stream_spec_sums(srv, path, body, headers):
    """A streamed request's chunks: the sums of their specdec.accepted and
    specdec.target, and the usage chunk's usage."""
    st, _, data = srv.raw("POST", path, json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
                          headers)
    acc = tgt = 0
    usage = None
    for line in data.decode().split("\n"):
        if line.startswith("data: {"):
            ev = json.loads(line[6:])
            acc += ev.get("specdec", {}).get("accepted", 0)
            tgt += ev.get("specdec", {}).get("target", 0)
            usage = ev.get("usage") or usage
    return st, acc, tgt, usage


def hostile_server(Server):
    """HTTP and API edges on one server (--api-key, --max-tokens 16)."""
    key = {"Authorization": "Bearer k3y"}
    srv = Server("--parallel", "2", "--api-key", "k3y", "--max-tokens", "16")
    rep = "one two three four five six seven eight nine ten, " * 6 + "one two"
    try:
        # usage.speculation.accepted is what the chunks delivered: cuts by
        # max_tokens and a stop string inside an accepted run of drafts
        bad, cut, total = [], False, 0
        before = srv.metric("specdec_draft_accepted_total", key)
        for body in [{"prompt": rep, "max_tokens": n} for n in (9, 10, 11, 13)] + \
                    [{"prompt": rep, "max_tokens": 16, "stop": ["seven"]}]:
            st, acc, tgt, u = stream_spec_sums(srv, "/v1/completions", dict(body, temperature=0), key)
            spec = (u or {}).get("speculation", {})
            if st != 200 or spec.get("accepted") != acc or acc + tgt > u["completion_tokens"]:
                bad.append(f"{body}: HTTP {st}, chunks accepted {acc} target {tgt}, usage {u}")
            # the drafts ran past the delivered text (8 per step: 16 drafted, 9 delivered)
            cut = cut or spec.get("drafted", 0) > acc + 1
            total += acc
        st, acc, tgt, u = stream_spec_sums(srv, "/v1/chat/completions", chat_body("Count from 1 to 20."), key)
        if st != 200 or (u or {}).get("speculation", {}).get("accepted") != acc:
            bad.append(f"chat: chunks accepted {acc}, usage {u}")
        total += acc
        after = srv.metric("specdec_draft_accepted_total", key)
        if after - before != total:   # /metrics counts the same tokens
            bad.append(f"specdec_draft_accepted_total grew by {after - before}, the chunks delivered {total}")
        report("accepted_equals_chunks", not bad and cut, "; ".join(bad) or "no step was cut inside its drafts")
    except Exception as e:  # noqa: BLE001
        report("accepted_equals_chunks", False, repr(e))

    # a client that half-closes its socket once the request is sent still gets the reply
    try:
        bad = []
        for stream in (False, True):
            b = json.dumps({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": stream}).encode()
            data = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
                                b"Content-Length: %d\r\n\r\n" % len(b) + b, half_close=True)
            if not data.startswith(b"HTTP/1.1 200") or (b"data: [DONE]" if stream else b'"text_completion"') not in data:
                bad.append(f"stream={stream}: {data[:300]!r}")
        report("half_close_reply", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("half_close_reply", False, repr(e))

    try:
        b = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
        data = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
                            b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(b) + b)
        same = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
                            b"Connection: close\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(b), len(b)) + b)
        report("content_length_conflict_400", data.startswith(b"HTTP/1.1 400") and b"Content-Length" in data and
               b'"error"' in data and same.startswith(b"HTTP/1.1 200"), f"{data[:300]!r} / same twice: {same[:80]!r}")
    except Exception as e:  # noqa: BLE001
        report("content_length_conflict_400", False, repr(e))

    # 405 says what is allowed; HEAD works where GET does, without a body
    try:
        bad = []
        for method, path, allow in (("GET", "/v1/completions", "POST"), ("POST", "/health", "GET, HEAD"),
                                    ("HEAD", "/v1/chat/completions", "POST")):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            c.request(method, path, headers=key)
            r = c.getresponse()
            r.read()
            if r.status != 405 or r.getheader("Allow") != allow:
                bad.append(f"{method} {path}: {r.status}, Allow {r.getheader('Allow')!r}")
            c.close()
        for path in ("/health", "/v1/models", "/metrics", "/"):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            c.request("HEAD", path, headers=key)
            r = c.getresponse()
            body = r.read()
            if r.status != 200 or body or int(r.getheader("Content-Length") or 0) <= 0:
                bad.append(f"HEAD {path}: {r.status}, body {body[:40]!r}, length {r.getheader('Content-Length')}")
            c.close()
        report("allow_and_head", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("allow_and_head", False, repr(e))

    try:
        got = [srv.request("GET", "/v1/models", None, {"Authorization": a})[0]
               for a in ("bearer k3y", "BEARER   k3y", "Bearer k3y", "Basic k3y", "bearer k3yy", "Bearerk3y")]
        report("bearer_any_case", got == [200, 200, 200, 401, 401, 401], f"{got}")
    except Exception as e:  # noqa: BLE001
        report("bearer_any_case", False, repr(e))

    q = "What is the capital of France?"
    try:
        out = [srv.request("POST", "/v1/chat/completions", chat_body(q, **kw), key)
               for kw in ({"logprobs": True}, {"logprobs": True, "top_logprobs": 3}, {"top_logprobs": 2})]
        out.append(srv.request("POST", "/v1/completions", {"prompt": q, "logprobs": 2}, key))
        ok_false = srv.request("POST", "/v1/chat/completions", chat_body(q, logprobs=False, max_tokens=2), key)[0]
        bad = [f"HTTP {st} {r}" for st, r in out
               if st != 400 or "not supported" not in r["error"]["message"] or "logprobs'" not in r["error"]["message"]]
        report("logprobs_refused", not bad and ok_false == 200, f"{bad}, logprobs false: {ok_false}")
    except Exception as e:  # noqa: BLE001
        report("logprobs_refused", False, repr(e))

    try:
        bad = []
        for field in ("max_tokens", "max_completion_tokens"):
            st, r = srv.request("POST", "/v1/completions", {"prompt": rep, "temperature": 0, field: 2 ** 31 + 5}, key)
            if st != 200 or r["usage"]["completion_tokens"] != 16:
                bad.append(f"{field}: HTTP {st} {r}")
        st, r = srv.request("POST", "/v1/completions", {"prompt": rep, "max_tokens": 0}, key)
        if st != 400:
            bad.append(f"max_tokens 0: HTTP {st}")
        report("max_tokens_clamped", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("max_tokens_clamped", False, repr(e))

    try:
        _, models = srv.request("GET", "/v1/models", None, key)
        served = models["data"][0]["id"]
        st, r = srv.request("POST", "/v1/chat/completions", chat_body(q, model="gpt-4o-mini", max_tokens=2), key)
        st2, _, data = srv.raw("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2, "stream": True,
                                                                     "model": "gpt-3.5-turbo"}), key)
        st3, r3 = srv.request("POST", "/v1/chat/completions", chat_body(q, model=5), key)
        report("any_model_name", st == 200 and r["model"] == served and st2 == 200 and
               f'"model":"{served}"'.encode() in data and st3 == 400, f"HTTP {st} {r} / stream {st2} / model 5: {st3}")
    except Exception as e:  # noqa: BLE001
        report("any_model_name", False, repr(e))

    # speculation errors name the field, found when parsed or when the slot builds the drafter
    try:
        bad = []
        for spec, needle in (("skip:99", "layer 99"), ("skip:0-0-0", "twice"), ("eagle3:dyn:16-16-2", "B*B*D"),
                             ("dyn:20-4-8", "B in 1..16"), ("chain:x", "chain:K")):
            for stream in (False, True):
                body = chat_body(q, speculation=spec, stream=stream)
                st, _, data = srv.raw("POST", "/v1/chat/completions", json.dumps(body), key)
                line = next((x for x in data.decode().split("\n") if "error" in x), "")
                err = json.loads(line[6:] if line.startswith("data: ") else line or "{}").get("error", {})
                msg = err.get("message", "")
                if not msg.startswith("'speculation': ") or needle not in msg or (not stream and st != 400):
                    bad.append(f"{spec} stream={stream}: HTTP {st} {data[:200]!r}")
        report("speculation_errors_named", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("speculation_errors_named", False, repr(e))

    # a long URI or long headers: the documented JSON error, not the HTTP library's HTML page
    try:
        bad = []
        for what, head, status in (
                ("uri", b"GET /health?q=" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n", 414),
                ("headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" +
                 b"".join(b"X-Pad-%d: %s\r\n" % (i, b"b" * 1000) for i in range(40)), 431)):
            data = raw_exchange(srv.port, head + b"Connection: close\r\n\r\n")
            body = data.split(b"\r\n\r\n", 1)[-1]
            if not data.startswith(b"HTTP/1.1 %d" % status) or not body.startswith(b'{"error":'):
                bad.append(f"{what}: {data[:200]!r}")
        report("head_limits_json", not bad, "; ".join(bad))
    except Exception as e:  # noqa: BLE001
        report("head_limits_json", False, repr(e))
    return srv.stop(), srv.log


class SlowClient(threading.Thread):
    """A client that sends its request head one header line at a time,
    every `every` seconds, until the server closes it (or `limit` s)."""

    def __init__(self, port, every, limit):
        super().__init__(daemon=True)
        self.port, self.every, self.limit, self.closed_after = port, every, limit, None
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=limit)
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        self.t0 = time.time()

    def run(self):
        try:
            while time.time() - self.t0 < self.limit:
                time.sleep(self.every)
                self.sock.sendall(b"X-Slow: 1\r\n")
        except OSError:
            self.closed_after = time.time() - self.t0
        finally:
            self.sock.close()


def health_within(port, seconds):
    """Seconds until GET /health answered 200 (tries every 0.2 s), or None."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return time.time() - t0
        except OSError:
            pass
        time.sleep(0.2)
    return None


def slow_clients_server(Server):
    """Slow clients (slowloris), scaled down: --max-conn 8 --timeout 3."""
    srv = Server("--parallel", "1", "--max-conn", "8", "--timeout", "3")
    try:
        # two slow clients, no pressure: closed at the 3 s deadline although
        # each sends a line every 0.3 s; /health answers meanwhile
        slow = [SlowClient(srv.port, 0.3, 15) for _ in range(2)]
        for c in slow:
            c.start()
        h = health_within(srv.port, 2)
        for c in slow:
            c.join(20)
        ends = [c.closed_after for c in slow]
        report("slow_headers_deadline", h is not None and all(e is not None and 2.5 < e < 6 for e in ends),
               f"health after {h}, slow clients closed after {ends} s")
    except Exception as e:  # noqa: BLE001
        report("slow_headers_deadline", False, repr(e))
    try:
        # as many slow clients as connections allowed: the slow ones are cut
        # within seconds and /health answers, long before the 3 s deadline
        # would have freed anything on its own
        slow = [SlowClient(srv.port, 0.3, 15) for _ in range(8)]
        for c in slow:
            c.start()
        time.sleep(0.3)
        h = health_within(srv.port, 6)
        for c in slow:
            c.join(20)
        ends = sorted(c.closed_after or 99 for c in slow)
        report("slowloris_health", h is not None and h < 4 and ends[-1] < 6,
               f"health after {h} s, slow clients closed after {ends} s")
    except Exception as e:  # noqa: BLE001
        report("slowloris_health", False, repr(e))
    return srv.stop(), srv.log


def hostile_servers(Server):
    """Every case, on servers made by Server(*args) (test_serve.py's class:
    a started specdec serve with request() and raw()). Both servers exit 0
    (under make asan-serve: no leak, no error)."""
    (rc1, log1), (rc2, log2) = hostile_server(Server), slow_clients_server(Server)
    report("hostile_shutdown_clean", rc1 == 0 and rc2 == 0,
           f"exit {rc1}: {' | '.join(log1[-6:])}; exit {rc2}: {' | '.join(log2[-6:])}")
