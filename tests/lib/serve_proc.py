"""serve_proc.py - a `specdec serve` process for the Python server tests:
started on a free port (--port 0, the port read from its stderr), raw HTTP
requests to it, and a SIGTERM stop that returns the exit status."""
import http.client
import re
import signal
import subprocess
import threading


class ServeProcess:
    """binary serve -m model --port 0 args...; raises RuntimeError if it does not start."""

    def __init__(self, binary, model, *args):
        cmd = [binary, "serve", "-m", model, "--port", "0"] + list(args)
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log, self.port = [], None
        ready = threading.Event()

        def drain():
            for line in self.p.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.t = threading.Thread(target=drain, daemon=True)
        self.t.start()
        ready.wait(120)
        if not self.port:
            self.p.kill()
            raise RuntimeError("server did not start: " + " | ".join(self.log[-5:]))

    def raw(self, method, path, body=None, headers=None, timeout=300):
        """One request; returns (status, content type, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, r.getheader("Content-Type") or "", data

    def stop(self):
        """SIGTERM; returns the exit status (None if it had to be killed)."""
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None
