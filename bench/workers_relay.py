"""``nsqd --workers=2``: what relaying a compressed SUB costs against serving it on the owner.

    .venv/bin/python bench/workers_relay.py [--messages 50000] [--samples 3] [--deflate]

One node of two workers, one topic. Each try creates a new channel, publishes
``--messages`` bodies of ``--size`` bytes to it (MPUB over HTTP, before the clock starts),
then one snappy (or ``--deflate``) consumer connects, SUBs with RDY 500, reads every
message and FINs it (one write per read). The kernel gives the connection to either
worker: on the topic's owner the SUB is handed over (SCM_RIGHTS) and the owner compresses
its deliveries itself; on the other worker the connection is relayed (the owner writes
plain frames into a socketpair, the accepting worker compresses them, and decompresses the
FINs on the way back). The server log's ``relayed to worker`` lines say which it was.
Tries go on until each kind has ``--samples`` runs (or 8 x samples tries).

Printed per try and as medians per kind: the server's CPU per message (utime + stime of
the supervisor and both workers, from /proc) and the consumer's wall-clock rate. The
consumer is Python and shares the 2 cores.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nsqd_proc  # the scripts' shared process helpers, beside this one
from nsqd_proc import SRC, cpu_seconds, stop, tree

sys.path.insert(0, SRC)

from nsqx.protocol import v2  # noqa: E402
from nsqx.protocol.compress import (  # noqa: E402
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
)

FRAME = struct.Struct(">ii")


def http_post(http: str, path: str, body: bytes = b"") -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://{http}{path}", data=body,
                                                  method="POST"), timeout=30).read()


class Reader:
    """A blocking NSQ consumer connection with snappy or deflate."""

    def __init__(self, tcp: str, deflate: bool) -> None:
        host, port = tcp.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.buf = b""
        feature = {"deflate": True, "deflate_level": 6} if deflate else {"snappy": True}
        self.sock.sendall(v2.MAGIC_V2 + v2.identify({"feature_negotiation": True, **feature}))
        self.plain_frame()  # the IDENTIFY response, uncompressed
        self.enc = DeflateEncoder(6) if deflate else SnappyEncoder()
        self.dec = DeflateDecoder() if deflate else SnappyDecoder()
        rest, self.buf = self.buf, b""
        self.feed(rest)
        assert self.frame() == (0, b"OK")

    def plain_frame(self) -> bytes:
        while len(self.buf) < 4 or len(self.buf) < 4 + FRAME.unpack_from(self.buf)[0]:
            self.buf += self.sock.recv(1 << 16)
        size = FRAME.unpack_from(self.buf)[0]
        frame, self.buf = self.buf[8:4 + size], self.buf[4 + size:]
        return frame

    def feed(self, data: bytes) -> None:
        out = self.dec.decode(data)
        while self.dec.pending:
            out += self.dec.decode(b"")
        self.buf += out

    def frames(self) -> list[tuple[int, bytes]]:
        """Every whole frame read so far (reads once when there is none)."""
        out = []
        while True:
            buf = self.buf
            pos = 0
            while len(buf) - pos >= 8:
                size, ftype = FRAME.unpack_from(buf, pos)
                if len(buf) - pos < 4 + size:
                    break
                out.append((ftype, buf[pos + 8:pos + 4 + size]))
                pos += 4 + size
            self.buf = buf[pos:]
            if out:
                return out
            data = self.sock.recv(1 << 18)
            if not data:
                raise ConnectionError("closed by the server")
            self.feed(data)

    def frame(self) -> tuple[int, bytes]:
        return self.frames()[0]

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.enc.encode(data))


def one_try(tcp: str, http: str, topic: str, channel: str, args: argparse.Namespace,
            pids: list[int]) -> tuple[float, float]:
    """(server CPU µs per message, consumer msgs/s)."""
    http_post(http, f"/channel/create?topic={topic}&channel={channel}")
    body = b"x" * args.size
    batch = struct.pack(">i", 1000) + (struct.pack(">i", len(body)) + body) * 1000
    for _ in range(args.messages // 1000):
        http_post(http, f"/mpub?topic={topic}&binary=true", batch)
    cpu0 = sum(cpu_seconds(p) for p in pids)
    t0 = time.monotonic()
    r = Reader(tcp, args.deflate)
    r.send(v2.sub(topic, channel) + v2.rdy(500))
    got = 0
    ok = False
    while got < args.messages:
        fins = []
        for ftype, data in r.frames():
            if ftype == 2:
                fins.append(b"FIN " + data[10:26] + b"\n")
            elif ftype == 0 and data == b"OK" and not ok:
                ok = True
            elif ftype == 0 and data == b"_heartbeat_":
                fins.append(b"NOP\n")
            elif ftype == 1:
                raise RuntimeError(data.decode())
        got += sum(1 for f in fins if f.startswith(b"FIN"))
        if fins:
            r.send(b"".join(fins))
    wall = time.monotonic() - t0
    r.sock.close()
    time.sleep(0.2)  # the FINs of the last read are taken
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    return cpu / args.messages * 1e6, args.messages / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--deflate", action="store_true", help="deflate instead of snappy")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nsqx-relay-"))
    logpath = tmp / "nsqd.log"

    def ready() -> bool:
        return logpath.exists() and logpath.read_bytes().count(b"INFO: ready: ") >= 2
    proc, tcp, http = nsqd_proc.start_nsqd(tmp / "data", "--workers=2", log=logpath,
                                           ready=ready)
    results: dict[str, list[tuple[float, float]]] = {"owner": [], "relayed": []}
    try:
        pids = tree(proc.pid)
        topic = "relay-bench"
        http_post(http, f"/topic/create?topic={topic}")
        for i in range(8 * args.samples):
            if min(len(v) for v in results.values()) >= args.samples:
                break
            before = logpath.read_bytes().count(b"relayed to worker")
            us, rate = one_try(tcp, http, topic, f"c{i}", args, pids)
            kind = "relayed" if logpath.read_bytes().count(b"relayed to worker") > before \
                else "owner"
            results[kind].append((us, rate))
            print(f"try {i}: {kind:8s} server {us:6.2f} µs/msg, consumer {rate:9.0f} msgs/s",
                  flush=True)
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'deflate' if args.deflate else 'snappy'}, {args.messages} messages of "
          f"{args.size} B, RDY 500; medians:")
    for kind, rows in results.items():
        if rows:
            print(f"  {kind:8s} server {statistics.median(r[0] for r in rows):6.2f} µs/msg, "
                  f"consumer {statistics.median(r[1] for r in rows):9.0f} msgs/s "
                  f"({len(rows)} runs)")
    if all(results.values()):
        ratio = (statistics.median(r[0] for r in results["relayed"])
                 / statistics.median(r[0] for r in results["owner"]))
        print(f"  relayed / owner server CPU per message: {ratio:.2f}x")


if __name__ == "__main__":
    main()
