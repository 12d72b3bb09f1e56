"""Long delays at scale: DPUB ingest rate, nsqd's peak RSS with N pending, lateness on delivery.

    .venv/bin/python bench/delays.py [--messages 1000000] [--min-delay 30] [--max-delay 90]

Two real nsqd processes, one after the other (peak RSS is per process):

- baseline: N plain PUBs to a topic with one channel (nothing consumed);
- delayed: N DPUBs to a topic with one channel, each due at a time spread evenly over
  [start + min-delay, start + max-delay] (the body carries its due time in ms).

Commands are pipelined (``--batch`` per socket write, then that many responses read).
For each: ingest msgs/s and nsqd's VmHWM (/proc/pid/status) after ingest. Then a consumer
(RDY 2500, FIN each) reads the delayed topic for ``--window`` seconds from the first due
time and reports lateness = receive time - due time (p50/p99/max) and whether anything came
early. Targets of issue 12: <= 100 MiB RSS with 1M pending, delivered within 1 s of due.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.protocol import v2  # noqa: E402

_HDR = struct.Struct(">II")
_DUE = struct.Struct(">q")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(http: str, path: str) -> None:
    req = urllib.request.Request(f"http://{http}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM / VmRSS of a process in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS"):
            out[k] = int(v.split()[0])
    return out


class Nsqd:
    def __init__(self, extra: list[str]) -> None:
        self.data = tempfile.mkdtemp(prefix="bench-delays-")
        self.tcp = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address={self.tcp}",
             f"--http-address={self.http}", f"--data-path={self.data}", "--log-level=warn",
             *extra], stdin=subprocess.DEVNULL)
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://{self.http}/ping", timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("nsqd did not start")

    def connect(self) -> socket.socket:
        host, port = self.tcp.split(":")
        s = socket.create_connection((host, int(port)))
        s.sendall(v2.MAGIC_V2)
        return s

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        shutil.rmtree(self.data, ignore_errors=True)


def read_frame(f) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    size, ftype = _HDR.unpack(f.read(8))
    return ftype, f.read(size - 4)


def ingest(nsqd: Nsqd, make, n: int, batch: int) -> float:  # type: ignore[no-untyped-def]
    """Send n commands built by make(i), ``batch`` per write; returns msgs/s."""
    s = nsqd.connect()
    f = s.makefile("rb", buffering=1 << 20)
    t0 = time.perf_counter()
    i = 0
    while i < n:
        k = min(batch, n - i)
        s.sendall(b"".join(make(j) for j in range(i, i + k)))
        got = 0
        while got < k:
            ftype, data = read_frame(f)
            if ftype == 0 and data == b"_heartbeat_":
                s.sendall(v2.nop())
                continue
            if ftype != 0 or data != b"OK":
                raise SystemExit(f"publish failed: {data[:200]!r}")
            got += 1
        i += k
    rate = n / (time.perf_counter() - t0)
    s.close()
    return rate


def consume(nsqd: Nsqd, topic: str, until_s: float) -> list[int]:
    """Lateness in ms of every message received before ``until_s`` (wall clock)."""
    s = nsqd.connect()
    s.settimeout(0.5)
    s.sendall(v2.sub(topic, "c") + v2.rdy(2500))
    late: list[int] = []
    buf = bytearray()
    while time.time() < until_s:
        try:
            chunk = s.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            raise SystemExit("nsqd closed the connection")
        buf += chunk
        now = int(time.time() * 1000)
        out = []
        pos = 0
        while len(buf) - pos >= 8:
            size, ftype = _HDR.unpack_from(buf, pos)
            if len(buf) - pos < 4 + size:
                break
            data = bytes(buf[pos + 8:pos + 4 + size])
            pos += 4 + size
            if ftype == 0:
                if data == b"_heartbeat_":
                    out.append(v2.nop())
                continue
            if ftype == 1:
                raise SystemExit(f"error from nsqd: {data!r}")
            late.append(now - _DUE.unpack_from(data, 26)[0])
            out.append(v2.fin(data[10:26]))
        del buf[:pos]
        if out:
            s.sendall(b"".join(out))
    s.close()
    return late


def pct(xs: list[int], p: float) -> int:
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--min-delay", type=float, default=30.0, help="seconds")
    ap.add_argument("--max-delay", type=float, default=90.0, help="seconds")
    ap.add_argument("--window", type=float, default=10.0,
                    help="seconds of due messages the consumer reads")
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--size", type=int, default=100, help="body bytes")
    args = ap.parse_args()
    n = args.messages
    pad = b"x" * max(0, args.size - 8)

    base = Nsqd([])
    try:
        post(base.http, "/topic/create?topic=plain")
        post(base.http, "/channel/create?topic=plain&channel=c")
        body = _DUE.pack(0) + pad
        one = v2.pub("plain", body)
        rate_pub = ingest(base, lambda _i: one, n, args.batch)
        rss_pub = proc_status(base.proc.pid)
    finally:
        base.close()
    print(f"baseline PUB : {rate_pub:>10,.0f} msgs/s  peak RSS {rss_pub['VmHWM'] / 1024:7.1f} MiB"
          f" with {n:,} queued", flush=True)

    node = Nsqd([])
    try:
        post(node.http, "/topic/create?topic=late")
        post(node.http, "/channel/create?topic=late&channel=c")
        start_ms = int(time.time() * 1000)
        lo, span = int(args.min_delay * 1000), int((args.max_delay - args.min_delay) * 1000)

        def make(i: int) -> bytes:
            due = start_ms + lo + span * i // n
            delay = max(0, due - int(time.time() * 1000))
            return v2.dpub("late", delay, _DUE.pack(due) + pad)

        rate_dpub = ingest(node, make, n, args.batch)
        took = time.time() * 1000 - start_ms
        rss_dpub = proc_status(node.proc.pid)
        print(f"DPUB         : {rate_dpub:>10,.0f} msgs/s  peak RSS "
              f"{rss_dpub['VmHWM'] / 1024:7.1f} MiB with {n:,} pending "
              f"(RSS now {rss_dpub['VmRSS'] / 1024:.1f} MiB)", flush=True)
        if took > lo:
            print(f"  note: ingest took {took / 1000:.1f} s > min delay; the first ones were "
                  "due during ingest", flush=True)
        first_due = (start_ms + lo) / 1000
        late = sorted(consume(node, "late", first_due + args.window))
        expect = int(n * args.window * 1000) // max(1, span)
        rss_end = proc_status(node.proc.pid)
    finally:
        node.close()
    if late:
        early = sum(1 for x in late if x < 0)
        print(f"lateness     : p50 {pct(late, 0.5)} ms  p99 {pct(late, 0.99)} ms  "
              f"max {late[-1]} ms over {len(late):,} delivered in a {args.window:.0f} s window "
              f"(~{expect:,} due); {early} early", flush=True)
    else:
        print("lateness     : nothing delivered in the window", flush=True)
    print(f"ratios       : DPUB/PUB rate {rate_dpub / rate_pub:.2f}x, peak RSS "
          f"{rss_dpub['VmHWM'] / rss_pub['VmHWM']:.2f}x (final peak "
          f"{rss_end['VmHWM'] / 1024:.1f} MiB); target <= 100 MiB: "
          f"{'met' if rss_end['VmHWM'] <= 100 * 1024 else 'NOT met'}; within 1 s: "
          f"{'met' if late and late[-1] <= 1000 else 'NOT met'}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
