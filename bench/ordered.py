"""Ordered consumption with many partitions: drain rate with one in flight per partition.

    .venv/bin/python bench/ordered.py [--partitions 64] [--messages 200000] [--size 200]

A real nsqd (default durable settings) gets a topic of P ordered partitions
(``orderedmulti=true``) and one of P plain partitions, each preloaded with the same
messages (MPUB per partition). Then P consumer connections drain each topic:

- ordered: ``SUB_ORDERED t c p`` per partition; the server keeps one message in flight
  per partition (RDY 10 is capped to 1), so each message costs a FIN round trip;
- baseline: ``SUB t c p`` per partition with RDY 1 (the same round-trip bound, no
  ordering rule), and with RDY 200 (what a plain channel does when it may pipeline).

Prints msgs/s for each and the ratios; the issue's target is >= 50k msgs/s per node for
the ordered drain. The consumers run in this one process (asyncio); nsqd in another.
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


async def drain_one(tcp: str, topic: str, part: int, ordered: bool, rdy: int, want: int,
                    counts: list[int]) -> None:
    host, port = tcp.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(v2.MAGIC_V2)
    cmd = v2.sub_ordered(topic, "bench", part) if ordered else \
        b"SUB %s bench %d\n" % (topic.encode(), part)
    writer.write(cmd + v2.rdy(rdy))
    got = 0
    acked = False
    while got < want:
        size_, ftype = _HDR.unpack(await reader.readexactly(8))
        data = await reader.readexactly(size_ - 4)
        if ftype == 0:
            if data == b"_heartbeat_":
                writer.write(v2.nop())
            elif data == b"OK" and not acked:
                acked = True
            continue
        if ftype == 1:
            raise SystemExit(f"error from nsqd: {data!r}")
        writer.write(v2.fin(data[10:26]))
        got += 1
        counts[part] = got
    writer.close()


async def drain(tcp: str, topic: str, parts: int, per_part: int, ordered: bool,
                rdy: int) -> float:
    counts = [0] * parts
    t0 = time.perf_counter()
    await asyncio.gather(*(drain_one(tcp, topic, p, ordered, rdy, per_part, counts)
                           for p in range(parts)))
    return sum(counts) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--messages", type=int, default=200_000, help="per topic")
    ap.add_argument("--size", type=int, default=200)
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
            rate = asyncio.run(drain(tcp, topic, args.partitions, per, ordered, rdy))
            results[name] = rate
            print(f"{name:<24} {rate:>10,.0f} msgs/s  ({args.partitions} partitions x {per}, "
                  f"{args.size} B)", flush=True)
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
