#!/usr/bin/env python3
"""test_page.py - the chat page of specdec serve (GET /, tools/serve/page.c)
and the per-token "specdec" field of the stream chunks it colours tokens by.

Cases: the page is served as HTML with its chat elements and nothing fetched
from elsewhere; a streamed chat carries the field in every text chunk, its
pieces add up to the text and its accepted/target counts to usage; then, in a
real headless Chromium (skipped with the reason when there is none), the page
opened at /?q=... streams an answer whose tokens are coloured spans with tau
and tokens/s under it (the DOM read once the answer is done), and a
screenshot is written to build/page.png (the test's artifact). Chromium is
driven over --remote-debugging-pipe: --dump-dom and --screenshot with
--virtual-time-budget do not wait for a streamed fetch body.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them). SPECDEC_BIN,
SPECDEC_MODEL and CHROMIUM pick other binaries / model.
"""
import base64
import html.parser
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
from serve_proc import ServeProcess  # noqa: E402

BIN = os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec"))
MODEL = os.environ.get("SPECDEC_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
SHOT = os.path.join(ROOT, "build", "page.png")
CASES = ["page_served", "stream_token_kinds", "browser_dom", "browser_screenshot", "shutdown_clean"]


def skip(names, why):
    for c in names:
        print(f"SKIP {c}: {why}", flush=True)


class Server(ServeProcess):
    """A specdec serve process on a free port."""

    def __init__(self, *args):
        super().__init__(BIN, MODEL, *args)

    def get(self, path, method="GET", body=None):
        status, ctype, data = self.raw(method, path, body)
        return status, ctype, data.decode("utf-8", "replace")


def page_served(srv):
    st, ctype, body = srv.get("/?q=ignored")
    need = ['id="log"', 'id="q"', 'id="send"', "/v1/chat/completions", "getReader", "include_usage",
            'class="acc"', 'class="tgt"', "textContent"]
    missing = [n for n in need if n not in body]
    external = re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", body)
    report("page_served", st == 200 and ctype.startswith("text/html") and not missing and not external
           and "innerHTML" not in body,
           f"status {st} type {ctype!r} missing {missing} external {external}")


def stream_token_kinds(srv):
    # a list the n-gram drafter predicts well: accepted drafts and target tokens both appear
    body = json.dumps({"messages": [{"role": "user", "content": "Count from 1 to 30, separated by commas."}],
                       "temperature": 0, "max_tokens": 64, "stream": True,
                       "stream_options": {"include_usage": True}})
    st, _, text = srv.get("/v1/chat/completions", "POST", body)
    events = [l[6:] for l in text.split("\n") if l.startswith("data: ")]
    why = []
    if st != 200 or not events or events[-1] != "[DONE]":
        return report("stream_token_kinds", False, f"status {st}, stream {text[:300]!r}")
    chunks = [json.loads(e) for e in events[:-1]]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    content, acc, tgt, kinds = "", 0, 0, set()
    for c in chunks:
        d = c["choices"][0]["delta"].get("content") if c["choices"] else None
        if d:
            sd = c.get("specdec")
            if not sd:
                why.append(f"text chunk without specdec: {c}")
                continue
            if "".join(p[0] for p in sd["tokens"]) != d:
                why.append(f"pieces {sd['tokens']} != content {d!r}")
            kinds.update(p[1] for p in sd["tokens"])
            acc += sd["accepted"]
            tgt += sd["target"]
            content += d
        elif c.get("specdec"):
            why.append(f"specdec on a chunk without text: {c}")
    if len(usage) != 1:
        why.append(f"{len(usage)} usage chunks")
    else:
        u = usage[0]
        sp = u["speculation"]
        # finish "length": no stop cut, no end-of-text token; every token has text here
        if acc != sp["accepted"] or acc + tgt != u["completion_tokens"]:
            why.append(f"chunks: {acc} accepted + {tgt} target; usage: {sp['accepted']} accepted of "
                       f"{u['completion_tokens']}")
        if sp["accepted"] == 0 or kinds != {0, 1}:
            why.append(f"want both kinds: accepted {sp['accepted']}, kinds {kinds}")
    report("stream_token_kinds", not why and content, "; ".join(why) or "no text")


class Dom(html.parser.HTMLParser):
    """Collects the answer boxes: their token spans (class, text) and stats."""

    def __init__(self):
        super().__init__()
        self.answers, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "div" and "answer" in cls:
            self.answers.append({"done": a.get("data-done"), "spans": [], "stats": ""})
        self.stack.append((tag, cls))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if not self.answers or not self.stack:
            return
        tag, cls = self.stack[-1]
        if tag == "span" and "tok" in cls:
            self.answers[-1]["spans"].append((cls, data))
        elif "stats" in cls:
            self.answers[-1]["stats"] += data


def chromium():
    for name in [os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Cdp:
    """Chromium driven over --remote-debugging-pipe (the DevTools protocol as
    NUL-terminated JSON on fds 3 and 4; no websocket library needed)."""

    def __init__(self, exe, url):
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()

        def fds():   # (copies first: the pipes may themselves be fds 3 and 4)
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.p = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                   "--no-first-run", "--window-size=1000,800", "--remote-debugging-pipe", url],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=fds, close_fds=False)
        os.close(cmd_r)
        os.close(res_w)
        self.buf, self.id = b"", 0
        self.r = os.fdopen(self.res_r, "rb", buffering=0)

    def call(self, method, params=None, session=None, timeout=60):
        self.id += 1
        m = {"id": self.id, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = session
        os.write(self.cmd_w, json.dumps(m).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" in self.buf:
                msg, self.buf = self.buf.split(b"\0", 1)
                j = json.loads(msg)
                if j.get("id") == self.id:
                    if "error" in j:
                        raise RuntimeError(f"{method}: {j['error']}")
                    return j["result"]
            r, _, _ = select.select([self.r], [], [], 1)
            if r:
                data = self.r.read(1 << 16)
                if not data:
                    raise RuntimeError("chromium exited: " + self.p.stderr.read().decode("utf-8", "replace")[-300:])
                self.buf += data
        raise RuntimeError(f"{method}: no answer in {timeout} s")

    def close(self):
        try:
            os.write(self.cmd_w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.p.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()
        os.close(self.cmd_w)
        self.r.close()


# Wraps the page's fetch: its chat request gets "temperature": 0 (counted in __pinned).
PIN_GREEDY = """
(() => {
  const f = window.fetch.bind(window);
  window.__pinned = 0;
  window.fetch = (u, o) => {
    if (String(u).endsWith("/v1/chat/completions") && o && typeof o.body === "string") {
      const j = JSON.parse(o.body);
      j.temperature = 0;
      o = Object.assign({}, o, { body: JSON.stringify(j) });
      window.__pinned++;
    }
    return f(u, o);
  };
})();
"""


def browser(srv):
    exe = chromium()
    names = ["browser_dom", "browser_screenshot"]
    if not exe:
        return skip(names, "no headless Chromium (apt-get install chromium)")
    url = f"http://127.0.0.1:{srv.port}/?q=Count%20from%201%20to%2020."
    b = None
    try:
        b = Cdp(exe, "about:blank")
        page = None
        for _ in range(100):   # the page target appears once the browser is up
            page = next((t for t in b.call("Target.getTargets")["targetInfos"] if t["type"] == "page"), None)
            if page:
                break
            time.sleep(0.1)
        if not page:
            raise RuntimeError("no page target")
        sess = b.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
        # The page sends no temperature, so the server would sample with a fresh seed and
        # the answer's length would vary; the test pins its own request to greedy (the
        # page's code is unchanged) and then opens the page.
        b.call("Page.enable", None, sess)
        b.call("Page.addScriptToEvaluateOnNewDocument", {"source": PIN_GREEDY}, sess)
        b.call("Page.navigate", {"url": url}, sess)
    except (OSError, RuntimeError) as e:
        if b:
            b.close()
        return skip(names, f"{exe} cannot start here: {e}")
    try:
        def js(expr):
            return b.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, sess)["result"].get("value")

        done, deadline = None, time.time() + 120
        while time.time() < deadline and done not in ("1", "error"):   # the answer streams in
            done = js("(document.querySelector('.answer') || {dataset: {}}).dataset.done || null")
            time.sleep(0.2)
        dom = js("document.documentElement.outerHTML") or ""
        p = Dom()
        p.feed(dom)
        a = p.answers[0] if p.answers else None
        kinds = {c for s in (a["spans"] if a else []) for c in s[0] if c in ("acc", "tgt")}
        pinned = js("window.__pinned || 0")
        report("browser_dom", a is not None and a["done"] == "1" and len(a["spans"]) > 3 and "tgt" in kinds
               and "tau" in a["stats"] and "tokens/s" in a["stats"] and pinned == 1,
               f"requests pinned {pinned}, answer {a}" if a else "no answer box: " + dom[-400:])
        png = base64.b64decode(b.call("Page.captureScreenshot", {"format": "png"}, sess)["data"])
        os.makedirs(os.path.dirname(SHOT), exist_ok=True)
        with open(SHOT, "wb") as f:
            f.write(png)
        report("browser_screenshot", png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, f"{len(png)} bytes")
    except RuntimeError as e:
        report("browser_dom" if not os.path.exists(SHOT) else "browser_screenshot", False, str(e))
    finally:
        b.close()


def main():
    if not os.path.exists(MODEL):
        return skip(CASES, f"model {MODEL} not found (scripts/fetch-models.sh)")
    if not os.access(BIN, os.X_OK):
        return skip(CASES, f"{BIN} not built")
    h = subprocess.run([BIN, "serve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if h.returncode != 0:
        return skip(CASES, "specdec was built without the server: " + h.stderr.decode().strip())
    srv = Server("--parallel", "2")
    try:
        page_served(srv)
        stream_token_kinds(srv)
        browser(srv)
    finally:
        rc = srv.stop()
        report("shutdown_clean", rc == 0, f"exit status {rc}; log: {' | '.join(srv.log[-8:])}")
    sys.exit(exit_status())


if __name__ == "__main__":
    main()
