"""``nsqd --workers=2`` against ``--workers=1``: four topics written at once.

    .venv/bin/python bench/workers.py [--messages 200000] [--publishers 4] [--runs 3]

Each run starts a fresh nsqd per worker count (1 then 2, alternating, ``--runs`` times),
creates the topics, then ``--publishers`` processes (one topic each, ``bench-<k>``, or with
``--spread`` every topic in turn, which makes a worker forward) publish
``--messages`` bodies of ``--size`` bytes each at the same moment, in MPUBs of ``--batch``
with ``--depth`` batches in flight (``nsqx.client.Producer.mpublish``, Go's
``bench_writer`` shape). A publisher's connection lands on whichever worker the kernel
gives it; its first publish moves it to the owner of that topic (handover), so with one
topic each nothing is forwarded, and with ``--spread`` about half the batches are.

Printed per run and as medians: msgs/s (all publishers' messages over the wall time from
the start signal to the last answer), the server's CPU per message (utime + stime of the
nsqd process and of every worker, from /proc), the publishers' CPU per message, and the
ratio 2 workers / 1 worker. On a 2-core machine the publishers share the server's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from nsqd_proc import SRC, cpu_seconds, start_workers, stop, tree

sys.path.insert(0, SRC)

from nsqx.client import Producer  # noqa: E402


async def publish(addr: str, topics: list[str], messages: int, size: int, batch: int,
                  depth: int) -> None:
    body = b"x" * size
    n_batches = messages // batch
    async with Producer(addr, max_pending=depth * 2) as p:
        async def lane(k: int) -> None:
            for i in range(k, n_batches, depth):
                await p.mpublish(topics[i % len(topics)], [body] * batch)
        await asyncio.gather(*(lane(k) for k in range(depth)))


def publisher(addr: str, topics: list[str], args: argparse.Namespace, go: mp.Event,
              out: mp.Queue) -> None:
    go.wait()
    cpu0 = time.process_time()
    asyncio.run(publish(addr, topics, args.messages, args.size, args.batch, args.depth))
    out.put((time.monotonic(), time.process_time() - cpu0))


def one_run(tmp: Path, workers: int, args: argparse.Namespace) -> dict[str, float]:
    data = tmp / f"data-{workers}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    proc, tcp, http = start_workers(data, workers)
    try:
        topics = [f"bench-{k}" for k in range(args.publishers)]
        for t in topics:  # created before measuring (and their owner's log opened)
            urllib.request.urlopen(urllib.request.Request(
                f"http://{http}/pub?topic={t}", data=b"warm"), timeout=10).read()
        go, out = mp.Event(), mp.Queue()
        # --spread: every publisher writes every topic, in turn (from the second worker's
        # view, about half the batches are another worker's: forwarded)
        mine = [topics[k:] + topics[:k] if args.spread else [topics[k]]
                for k in range(len(topics))]
        procs = [mp.Process(target=publisher, args=(tcp, m, args, go, out)) for m in mine]
        for p in procs:
            p.start()
        time.sleep(0.5)  # every publisher imported and waiting
        pids = tree(proc.pid)
        cpu0 = sum(cpu_seconds(p) for p in pids)
        t0 = time.monotonic()
        go.set()
        results = [out.get(timeout=600) for _ in procs]
        t1 = max(r[0] for r in results)
        cpu1 = sum(cpu_seconds(p) for p in pids)
        for p in procs:
            p.join()
        total = args.messages // args.batch * args.batch * len(topics)
        return {"rate": total / (t1 - t0), "server_us": (cpu1 - cpu0) / total * 1e6,
                "client_us": sum(r[1] for r in results) / total * 1e6}
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000, help="per publisher")
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spread", action="store_true", help="every publisher writes every "
                    "topic in turn (measures forwarding), instead of one topic each")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nsqx-bench-workers-"))
    res: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    try:
        print(f"{args.publishers} publishers x {args.messages} msgs of {args.size} B, MPUB "
              f"{args.batch}, {args.depth} in flight, "
              f"{'every topic each' if args.spread else 'one topic each'}; "
              f"{os.cpu_count()} cores")
        for run in range(args.runs):
            for w in (1, 2):
                r = one_run(tmp, w, args)
                res[w].append(r)
                print(f"run {run + 1} --workers={w}: {r['rate']:,.0f} msgs/s, server "
                      f"{r['server_us']:.2f} us/msg, publishers {r['client_us']:.2f} us/msg",
                      flush=True)
        med = {w: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
               for w, rs in res.items()}
        for w in (1, 2):
            m = med[w]
            print(f"median --workers={w}: {m['rate']:,.0f} msgs/s, server "
                  f"{m['server_us']:.2f} us/msg, publishers {m['client_us']:.2f} us/msg")
        print(f"ratio 2/1: rate {med[2]['rate'] / med[1]['rate']:.2f}x, server CPU per msg "
              f"{med[2]['server_us'] / med[1]['server_us']:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
