"""Benchmark of the channel cursor hot path (no I/O): deliver + FIN, timeouts, memory.

Run: .venv/bin/python bench/storage_cursor.py [--n 2000000]
Prints msgs/s for in-order and out-of-order FIN and memory per 1M in-flight messages.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc

from nsqx.storage.cursor import ChannelCursor

TIMEOUT = 60_000


def in_order(n: int, chunk: int) -> float:
    c = ChannelCursor(0)
    take, finish = c.take, c.finish
    t0 = time.perf_counter()
    done = 0
    while done < n:
        for d in take(1, chunk, n, 0, TIMEOUT):
            for o in range(d.offset, d.offset + d.count):
                finish(1, o)
            done += d.count
    dt = time.perf_counter() - t0
    assert c.confirmed == n and c.in_flight_count == 0
    return n / dt


def in_order_batched(n: int, chunk: int, fin_batch: int) -> float:
    """FINs handed over per read batch (what a session parses from one socket read)."""
    c = ChannelCursor(0)
    take, finish_many = c.take, c.finish_many
    t0 = time.perf_counter()
    done = 0
    while done < n:
        for d in take(1, chunk, n, 0, TIMEOUT):
            for b in range(d.offset, d.offset + d.count, fin_batch):
                finish_many(1, list(range(b, min(b + fin_batch, d.offset + d.count))))
            done += d.count
    dt = time.perf_counter() - t0
    assert c.confirmed == n and c.in_flight_count == 0
    return n / dt


def out_of_order(n: int, clients: int, chunk: int, seed: int = 1) -> float:
    """Several clients each hold a chunk; FINs arrive shuffled across the whole window."""
    rnd = random.Random(seed)
    window = clients * chunk
    perms = []
    for _ in range(16):
        p = list(range(window))
        rnd.shuffle(p)
        perms.append(p)
    c = ChannelCursor(0)
    take, finish = c.take, c.finish
    owner = [i // chunk + 1 for i in range(window)]
    t0 = time.perf_counter()
    base = 0
    r = 0
    n = max(window, n - n % window)
    while base < n:
        for cid in range(1, clients + 1):
            take(cid, chunk, n, 0, TIMEOUT)
        for i in perms[r & 15]:
            finish(owner[i], base + i)
        base += window
        r += 1
    dt = time.perf_counter() - t0
    assert c.confirmed == base and c.in_flight_count == 0
    return base / dt


def redeliver(n: int, chunk: int) -> float:
    """REQ 0 of everything then deliver again and FIN (the per-offset slow path)."""
    c = ChannelCursor(0)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        ds = c.take(1, chunk, n, 0, TIMEOUT)
        for d in ds:
            for o in range(d.offset, d.offset + d.count):
                c.requeue(1, o, 0, 0)
        for d in c.take(1, chunk, n, 0, TIMEOUT):
            c.finish(1, d.offset)
            done += 1
    dt = time.perf_counter() - t0
    assert c.confirmed == n
    return n / dt


def expire_cost(n: int, chunk: int) -> tuple[float, float]:
    """Seconds to find+requeue n timed-out messages, and one expire() call with nothing due."""
    c = ChannelCursor(0)
    for i in range(0, n, chunk):
        c.take(1, chunk, n, i // chunk, TIMEOUT)
    t0 = time.perf_counter()
    for _ in range(1000):
        c.expire(1)  # nothing due beyond the first couple of chunks
    idle = (time.perf_counter() - t0) / 1000
    t0 = time.perf_counter()
    got = c.expire(10**9)
    dt = time.perf_counter() - t0
    assert got + 2 * chunk >= n
    return dt, idle


def memory(n: int, chunk: int, mode: str) -> float:
    """Bytes per in-flight message for n unconfirmed messages."""
    gc.collect()
    tracemalloc.start()
    c = ChannelCursor(0)
    before = tracemalloc.get_traced_memory()[0]
    for i in range(0, n, chunk):
        c.take(1 + (i // chunk) % 8, chunk, n, 0, TIMEOUT)
    if mode == "ooo":  # every other message FINed out of order, lowest never
        for o in range(1, n, 2):
            c.finish(1 + (o // chunk) % 8, o)
    elif mode == "touched":  # every message TOUCHed: all become per-offset entries
        for o in range(n):
            c.touch(1 + (o // chunk) % 8, o, 0, TIMEOUT)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert c.in_flight_count == (n // 2 if mode == "ooo" else n)
    del c
    return used / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    args = ap.parse_args()
    n = args.n
    print(f"cursor bench, n={n:,}")
    for chunk in (100, 512, 2500):
        print(
            f"  deliver+FIN in order, chunk {chunk:5d}, finish():        "
            f"{in_order(n, chunk):12,.0f} msgs/s"
        )
    for chunk, fb in ((512, 64), (2500, 256)):
        print(
            f"  deliver+FIN in order, chunk {chunk:5d}, finish_many({fb:3d}): "
            f"{in_order_batched(n, chunk, fb):12,.0f} msgs/s"
        )
    for clients, chunk in ((4, 250), (8, 512), (25, 2500)):
        print(
            f"  deliver+FIN out of order, {clients:2d} clients x {chunk:4d} shuffled: "
            f"{out_of_order(n, clients, chunk):12,.0f} msgs/s"
        )
    print(
        f"  REQ 0 + redeliver + FIN (per-offset path):      {redeliver(n // 4, 512):12,.0f} msgs/s"
    )
    dt, idle = expire_cost(200_000, 100)
    print(
        f"  expire: 200k in flight time out in {dt * 1e3:.1f} ms; idle expire() {idle * 1e6:.2f} us"
    )
    m = 1_000_000
    for chunk in (100, 2500):
        print(
            f"  memory, 1M in flight (chunks of {chunk}):      "
            f"{memory(m, chunk, 'runs') * m / 2**20:8.2f} MiB "
            f"({memory(m, chunk, 'runs'):.1f} B/msg)"
        )
    print(
        f"  memory, 1M in flight, every other FINed OOO:   "
        f"{memory(m, 512, 'ooo') * m / 2**20:8.2f} MiB"
    )
    print(
        f"  memory, 1M in flight, all TOUCHed (worst):     "
        f"{memory(m, 512, 'touched') * m / 2**20:8.2f} MiB"
    )


if __name__ == "__main__":
    main()
