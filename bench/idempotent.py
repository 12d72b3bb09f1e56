"""What idempotent publishing costs: CPU per message and msgs/s, plain vs idempotent Producer.

    .venv/bin/python bench/idempotent.py [--messages 200000] [--singles 10000] [--runs 3]

Two workloads, each run against a fresh nsqd process, plain (``idempotent=False``) and
idempotent (the default: PUB_EXT/MPUB_EXT with a ``##nsqx_producer`` mark on each batch's
first message) alternating, ``--runs`` times each:

* batched ingest: ``--messages`` bodies of ``--size`` bytes in MPUBs of ``--batch``, with
  ``--depth`` batches in flight (``nsqx.client.Producer.mpublish`` from concurrent tasks);
* one PUB at a time: ``--singles`` PUBs, each awaited before the next.

CPU per message is nsqd's (utime + stime from /proc/<pid>/stat) plus this client process's
(``time.process_time``) over the publishing, divided by the messages; msgs/s is wall clock.
Before measuring, one message is published the same way (the topic is created and, when
idempotent, the partition's index opened: a one-time cost of ~20-30 ms per partition that
would otherwise be spread over the run's messages).
Medians of the runs are compared. Issue 33's targets: idempotent <= 1.1x plain CPU per
message batched, <= 1.2x one at a time.

``--settle S`` waits S seconds after the warm-up before measuring: nsqd loads its HTTP API
in a worker thread right after it answers /ping (~0.1 s of CPU), and without a wait part of
that lands in the measured window of both sides alike (0 keeps the historical method).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nsqd_proc  # the scripts' shared process helpers, beside this one
from nsqd_proc import SRC, cpu_seconds, stop

sys.path.insert(0, SRC)

from nsqx.client import Producer  # noqa: E402


def start_nsqd(data: Path) -> tuple[subprocess.Popen, str]:
    proc, tcp, _http = nsqd_proc.start_nsqd(data, "--log-level=warn")
    return proc, tcp


async def batched(addr: str, idempotent: bool, messages: int, size: int, batch: int,
                  depth: int) -> None:
    body = b"x" * size
    n_batches = messages // batch
    async with Producer(addr, idempotent=idempotent, max_pending=depth * 2) as p:
        async def lane(k: int) -> None:
            for _ in range(k, n_batches, depth):
                await p.mpublish("bench", [body] * batch)
        await asyncio.gather(*(lane(k) for k in range(depth)))


async def singles(addr: str, idempotent: bool, count: int, size: int) -> None:
    body = b"x" * size
    async with Producer(addr, idempotent=idempotent) as p:
        for _ in range(count):
            await p.publish("bench", body)


def one_run(workload: str, idempotent: bool, args: argparse.Namespace) -> tuple[float, float]:
    """(CPU us per message, messages per second); nsqd's and the client's share printed
    with ``--verbose``."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-idem-"))
    proc, addr = start_nsqd(tmp)
    try:
        if workload == "batched":
            n = args.messages // args.batch * args.batch
            coro = batched(addr, idempotent, n, args.size, args.batch, args.depth)
        else:
            n = args.singles
            coro = singles(addr, idempotent, n, args.size)
        asyncio.run(singles(addr, idempotent, 1, args.size))  # warm-up (see the docstring)
        if args.settle > 0:
            time.sleep(args.settle)
        s0, c0, w0 = cpu_seconds(proc.pid), time.process_time(), time.monotonic()
        asyncio.run(coro)
        s1, c1, w1 = cpu_seconds(proc.pid), time.process_time(), time.monotonic()
        if args.verbose:
            print(f"    {workload} {'idempotent' if idempotent else 'plain'}: nsqd "
                  f"{(s1 - s0) / n * 1e6:.2f} + client {(c1 - c0) / n * 1e6:.2f} us/msg",
                  flush=True)
        return (s1 - s0 + c1 - c0) / n * 1e6, n / (w1 - w0)
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--singles", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workloads", default="batched,single")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds to wait after the warm-up (see the docstring)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    for workload, target in (("batched", 1.1), ("single", 1.2)):
        if workload not in args.workloads.split(","):
            continue
        res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.runs):
            for idem in (False, True):
                res[idem].append(one_run(workload, idem, args))
        med = {k: (statistics.median(c for c, _ in v), statistics.median(r for _, r in v))
               for k, v in res.items()}
        ratio = med[True][0] / med[False][0]
        print(f"{workload:8s} plain {med[False][0]:7.2f} us/msg {med[False][1]:9.0f} msg/s | "
              f"idempotent {med[True][0]:7.2f} us/msg {med[True][1]:9.0f} msg/s | "
              f"CPU ratio {ratio:.3f} (target <= {target}) "
              f"{'OK' if ratio <= target else 'OVER'}", flush=True)
        for k, v in res.items():
            print(f"    {'idempotent' if k else 'plain':10s} runs: "
                  + ", ".join(f"{c:.2f} us/{r:.0f}/s" for c, r in v), flush=True)


if __name__ == "__main__":
    main()
