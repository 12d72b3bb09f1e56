"""Ordered consumption with many partitions: drain rate with one in flight per partition.

    .venv/bin/python bench/ordered.py [--partitions 64] [--messages 200000] [--size 200]

A real nsqd (default durable settings) gets a topic of P ordered partitions
(``orderedmulti=true``) and one of P plain partitions, each preloaded with the same
messages (MPUB per partition). Then P consumer connections (spread over
``--client-procs`` processes) drain each topic:

- ordered: ``SUB_ORDERED t c p`` per partition; the server keeps one message in flight
  per partition (RDY 10 is capped to 1), so each message costs a FIN round trip;
- baseline: ``SUB t c p`` per partition with RDY 1 (the same round-trip bound, no
  ordering rule), and with RDY 200 (what a plain channel does when it may pipeline).

Prints msgs/s for each and the ratios; the issue's target is >= 50k msgs/s per node for
the ordered drain. nsqd's and the clients' CPU per message are printed too: on this
2-core machine they share the cores, so the server's cost per message says what one
node could do with its consumers elsewhere (1e6 / that = msgs/s per core).
"""

from __future__ import annotations

import argparse
import asyncio
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(http: str, path: str, body: bytes = b"") -> None:
    req = urllib.request.Request(f"http://{http}{path}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


async def preload(tcp: str, topic: str, parts: int, per_part: int, size: int) -> None:
    host, port = tcp.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(v2.MAGIC_V2)
    body = b"x" * size
    batch = 500
    pending = 0
    for p in range(parts):
        left = per_part
        while left:
            n = min(batch, left)
            writer.write(v2.mpub(topic, [body] * n, partition=p))
            pending += 1
            left -= n
    await writer.drain()
    for _ in range(pending):
        size_, ftype = _HDR.unpack(await reader.readexactly(8))
        data = await reader.readexactly(size_ - 4)
        if ftype != 0 or data != b"OK":
            raise SystemExit(f"preload failed: {data[:200]!r}")
    writer.close()


class _Consumer(asyncio.Protocol):
    """One consumer connection: parses frames per read and FINs each message at once
    (one write per read), so the client side stays cheap next to the server's."""

    def __init__(self, cmd: bytes, want: int, done: asyncio.Future[int]) -> None:
        self.cmd, self.want, self.done = cmd, want, done
        self.buf = bytearray()
        self.got = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.transport.write(v2.MAGIC_V2 + self.cmd)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, n, out = 0, len(buf), []
        while n - pos >= 8:
            size, ftype = _HDR.unpack_from(buf, pos)
            if n - pos < 4 + size:
                break
            body = bytes(buf[pos + 8:pos + 4 + size])
            pos += 4 + size
            if ftype == 2:
                out.append(b"FIN " + body[10:26] + b"\n")
                self.got += 1
            elif ftype == 1:
                self.done.set_exception(SystemExit(f"error from nsqd: {body!r}"))
                return
            elif body == b"_heartbeat_":
                out.append(b"NOP\n")
        del buf[:pos]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))
        if self.got >= self.want and not self.done.done():
            self.done.set_result(self.got)


async def _drain_parts(tcp: str, topic: str, parts: list[int], per_part: int, ordered: bool,
                       rdy: int) -> int:
    loop = asyncio.get_running_loop()
    host, port = tcp.split(":")
    futs, transports = [], []
    for p in parts:
        cmd = v2.sub_ordered(topic, "bench", p) if ordered else \
            b"SUB %s bench %d\n" % (topic.encode(), p)
        fut: asyncio.Future[int] = loop.create_future()
        tr, _ = await loop.create_connection(
            lambda c=cmd + v2.rdy(rdy), f=fut: _Consumer(c, per_part, f), host, int(port))
        futs.append(fut)
        transports.append(tr)
    got = sum(await asyncio.gather(*futs))
    for tr in transports:
        tr.close()
    return got


def _drain_proc(args: tuple) -> tuple[int, float]:
    try:
        import uvloop  # the clients as a production consumer would run them
        uvloop.install()
    except ImportError:
        pass
    got = asyncio.run(_drain_parts(*args))
    return got, time.process_time()


def drain(tcp: str, topic: str, parts: int, per_part: int, ordered: bool, rdy: int,
          procs: int, server_pid: int) -> tuple[float, float, float, float, float]:
    """Drain with `procs` client processes (partitions dealt round-robin); returns
    (msgs/s, server CPU us per message, client CPU us per message, and the server's
    user and kernel shares)."""
    import multiprocessing

    groups = [list(range(i, parts, procs)) for i in range(procs)]
    before = _cpu_split(server_pid)
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        res = pool.map(_drain_proc, [(tcp, topic, g, per_part, ordered, rdy) for g in groups])
    wall = time.perf_counter() - t0
    got = sum(r[0] for r in res)
    after = _cpu_split(server_pid)
    user, kernel = after[0] - before[0], after[1] - before[1]
    return (got / wall, (user + kernel) / got * 1e6, sum(r[1] for r in res) / got * 1e6,
            user / got * 1e6, kernel / got * 1e6)


def _cpu(pid: int) -> float:
    return sum(_cpu_split(pid))


def _cpu_split(pid: int) -> tuple[float, float]:
    """(user, kernel) CPU seconds of a process."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--messages", type=int, default=200_000, help="per topic")
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--client-procs", type=int, default=2,
                    help="consumer processes, partitions dealt round-robin (default 2)")
    args = ap.parse_args()
    per = args.messages // args.partitions
    data = tempfile.mkdtemp(prefix="bench-ordered-")
    tcp, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address={tcp}",
                             f"--http-address={http}", f"--data-path={data}",
                             "--log-level=warn"], stdin=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{http}/ping", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        results = {}
        for name, ordered, rdy in (("ordered (SUB_ORDERED)", True, 10),
                                   ("plain, RDY 1 each", False, 1),
                                   ("plain, RDY 200 each", False, 200)):
            topic = "t" + str(len(results))
            extra = "&orderedmulti=true" if ordered else ""
            post(http, f"/topic/create?topic={topic}&partition_num={args.partitions}{extra}")
            asyncio.run(preload(tcp, topic, args.partitions, per, args.size))
            rate, server_us, client_us, user_us, kernel_us = drain(
                tcp, topic, args.partitions, per, ordered, rdy, args.client_procs, proc.pid)
            results[name] = rate
            print(f"{name:<24} {rate:>10,.0f} msgs/s  ({args.partitions} partitions x {per}, "
                  f"{args.size} B)  nsqd {server_us:.1f} us CPU/msg ({user_us:.1f} user + "
                  f"{kernel_us:.1f} kernel), clients {client_us:.1f} us/msg", flush=True)
        base = results["plain, RDY 1 each"]
        print(f"ordered / plain RDY 1: {results['ordered (SUB_ORDERED)'] / base:.2f}x; "
              f"target >= 50,000 msgs/s ordered: "
              f"{'met' if results['ordered (SUB_ORDERED)'] >= 50_000 else 'NOT met'}")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
