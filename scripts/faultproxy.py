#!/usr/bin/env python3
"""faultproxy.py - a TCP proxy on loopback that makes a network link bad on
purpose, for the split client's tests and benchmarks (docs/split.md). This
kernel has no netem qdisc, so the proxy does the work:

  latency with jitter   each chunk is delayed by a one-way delay drawn
                        uniformly in [lat - jit, lat + jit] / 2 ms per direction
                        (so a round trip gains about lat +- jit ms), in order
  bandwidth cap         each direction delivers at most --mbit Mbit/s
  loss as stall         with probability --loss per chunk a direction stalls
                        --rto ms (a TCP retransmission: loopback TCP never
                        loses bytes, so a loss shows as a stall)
  random stalls         --stall-prob P per chunk, --stall-ms each
  a cut                 --cut-after N: after N bytes from the server, every
                        connection is cut and new ones refused for --down-ms
                        (forever with -1)
  a record            --record FILE: every byte the client sends, appended
  commands on stdin     "down" (cut everything, refuse), "up", "cut-after N",
                        "quit"; each answered "ok ..." on stdout

Profiles (--profile): 4g = 20 Mbit/s, 21 +- 19 ms, 0.1% loss; 5g = 10 +- 10
ms, 0.1% loss, 100 Mbit/s (the seed paper's netem settings, as a round-trip
delay). The proxy prints "faultproxy: listening on 127.0.0.1:PORT" on stderr.

usage: faultproxy.py --listen PORT --target HOST:PORT [--profile 4g|5g]
       [--latency MS] [--jitter MS] [--mbit R] [--loss P] [--stall-prob P]
       [--stall-ms MS] [--cut-after N] [--down-ms MS] [--seed S]
"""
import argparse
import asyncio
import random
import sys
import time

PROFILES = {
    "4g": dict(latency=21.0, jitter=19.0, mbit=20.0, loss=0.001),
    "5g": dict(latency=10.0, jitter=10.0, mbit=100.0, loss=0.001),
    "none": dict(latency=0.0, jitter=0.0, mbit=0.0, loss=0.0),
}


class Link:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.down = False
        self.down_until = 0.0
        self.cut_after = a.cut_after
        self.from_server = 0
        self.conns = set()
        self.bytes = [0, 0]
        self.record = open(a.record, "ab") if a.record else None

    def is_down(self):
        if self.down and self.down_until and time.monotonic() >= self.down_until:
            self.down = False
            self.down_until = 0.0
        return self.down

    def go_down(self, ms=-1):
        self.down = True
        self.down_until = time.monotonic() + ms / 1000.0 if ms and ms > 0 else 0.0
        for w in list(self.conns):
            try:
                w.transport.abort()
            except Exception:
                pass
        self.conns.clear()

    def delay(self):
        a = self.a
        d = (a.latency + self.rng.uniform(-a.jitter, a.jitter)) / 2.0
        if a.loss and self.rng.random() < a.loss:
            d += a.rto
        if a.stall_prob and self.rng.random() < a.stall_prob:
            d += a.stall_ms
        return max(0.0, d) / 1000.0


async def pump(link, reader, writer, direction, peer):
    """Copies reader to writer with the link's delays; direction 1: server to client."""
    a = link.a
    q = asyncio.Queue()
    free_at = [0.0]  # the direction's wire is busy until then (bandwidth)

    async def deliver():
        while True:
            item = await q.get()
            if item is None:
                break
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if link.is_down():
                break
            try:
                writer.write(data)
                await writer.drain()
            except Exception:
                break
        try:
            writer.close()
        except Exception:
            pass

    task = asyncio.ensure_future(deliver())
    last_due = 0.0
    try:
        while True:
            data = await reader.read(16384)
            if not data or link.is_down():
                break
            now = time.monotonic()
            tx = len(data) * 8 / (a.mbit * 1e6) if a.mbit > 0 else 0.0
            start = max(now, free_at[0])
            free_at[0] = start + tx
            due = max(free_at[0] + link.delay(), last_due)  # in order, as TCP delivers
            last_due = due
            link.bytes[direction] += len(data)
            if direction == 0 and link.record:
                link.record.write(data)
                link.record.flush()
            if direction == 1 and link.cut_after is not None and link.cut_after >= 0:
                link.from_server += len(data)
                if link.from_server >= link.cut_after:
                    keep = len(data) - (link.from_server - link.cut_after)
                    q.put_nowait((due, data[:keep]))
                    link.cut_after = None
                    await asyncio.sleep(max(0.0, due - time.monotonic()) + 0.001)
                    print(f"faultproxy: cut after {link.from_server} bytes from the server", file=sys.stderr,
                          flush=True)
                    link.go_down(a.down_ms)
                    break
            q.put_nowait((due, data))
    except Exception:
        pass
    q.put_nowait(None)
    await task
    try:
        peer.transport.abort()
    except Exception:
        pass


async def handle(link, creader, cwriter):
    a = link.a
    if link.is_down():
        cwriter.transport.abort()
        return
    try:
        sreader, swriter = await asyncio.open_connection(a.thost, a.tport)
    except Exception:
        cwriter.transport.abort()
        return
    link.conns.add(cwriter)
    link.conns.add(swriter)
    await asyncio.gather(pump(link, creader, swriter, 0, cwriter), pump(link, sreader, cwriter, 1, swriter))
    link.conns.discard(cwriter)
    link.conns.discard(swriter)


async def commands(link, server):
    loop = asyncio.get_event_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            return  # stdin closed: keep running until killed
        w = line.decode().split()
        if not w:
            continue
        if w[0] == "down":
            link.go_down(int(w[1]) if len(w) > 1 else -1)
        elif w[0] == "up":
            link.down = False
            link.down_until = 0.0
        elif w[0] == "cut-after" and len(w) > 1:
            link.cut_after = int(w[1])
            link.from_server = 0
        elif w[0] == "quit":
            server.close()
            print("ok quit", flush=True)
            sys.exit(0)
        print("ok " + " ".join(w), flush=True)


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", type=int, default=0)
    p.add_argument("--target", required=True)
    p.add_argument("--profile", choices=sorted(PROFILES), default="none")
    p.add_argument("--latency", type=float)
    p.add_argument("--jitter", type=float)
    p.add_argument("--mbit", type=float)
    p.add_argument("--loss", type=float)
    p.add_argument("--rto", type=float, default=200.0)
    p.add_argument("--stall-prob", type=float, default=0.0)
    p.add_argument("--stall-ms", type=float, default=500.0)
    p.add_argument("--cut-after", type=int)
    p.add_argument("--down-ms", type=int, default=-1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--record")
    a = p.parse_args()
    for k, v in PROFILES[a.profile].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.thost, port = a.target.rsplit(":", 1)
    a.tport = int(port)
    link = Link(a)
    server = await asyncio.start_server(lambda r, w: handle(link, r, w), "127.0.0.1", a.listen)
    port = server.sockets[0].getsockname()[1]
    print(f"faultproxy: listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    asyncio.ensure_future(commands(link, server))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
