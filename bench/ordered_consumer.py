"""nsqx.client.Consumer on an ordered topic: how long until every partition is subscribed
(the consumer discovers the partitions by probing SUB_ORDERED), and its drain rate.

    .venv/bin/python bench/ordered_consumer.py [--partitions 16] [--messages 20000]

A real nsqd gets an ordered topic of P partitions, preloaded (MPUB per partition); one
Consumer with max_in_flight=P (one message in flight per partition is the server's rule)
reads it all. Prints the time from start() to P subscriptions and the msgs/s of the drain.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nsqx.client import Consumer, Message  # noqa: E402
from ordered import free_port, post, preload  # noqa: E402


async def consume(tcp: str, topic: str, parts: int, total: int) -> tuple[float, float]:
    got = 0
    done = asyncio.Event()

    def handle(m: Message) -> None:
        nonlocal got
        got += 1
        if got >= total:
            done.set()

    c = Consumer(topic, "bench", handle, nsqd_tcp_addresses=tcp, max_in_flight=parts)
    t0 = time.perf_counter()
    await c.start()
    subscribed = time.perf_counter() - t0
    if len(c.connections) != parts:
        raise SystemExit(f"{len(c.connections)} connections for {parts} partitions")
    await done.wait()
    elapsed = time.perf_counter() - t0
    await c.close()
    return subscribed, total / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=200)
    args = ap.parse_args()
    per = args.messages // args.partitions
    data = tempfile.mkdtemp(prefix="nsqx-bench-")
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
        post(http, f"/topic/create?topic=t&partition_num={args.partitions}&orderedmulti=true")
        asyncio.run(preload(tcp, "t", args.partitions, per, args.size))
        subscribed, rate = asyncio.run(consume(tcp, "t", args.partitions, per * args.partitions))
        print(f"{args.partitions} partitions: subscribed to all in {subscribed * 1000:.0f} ms; "
              f"drained {per * args.partitions} x {args.size} B at {rate:,.0f} msgs/s")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
