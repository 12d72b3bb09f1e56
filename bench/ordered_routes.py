"""Route-managed ordered topics (issue 13) on one real nsqd: how long a split or merge
takes under keyed load, how many retries a publish needs across it, and how ordered
consumption scales with the number of physical partitions.

    .venv/bin/python bench/ordered_routes.py [--producers 16] [--messages 40000]

1. change: a topic of 1 physical partition over 1,024 logical ones, one channel; 16
   nsqx.client producers (one connection each, one publish at a time, keys of their
   own) publish keyed messages while the bench splits, splits, merges and moves. For each
   change: the HTTP call (pending -> seal -> command message -> commit), and the time from
   the request to the first publish acknowledged afterwards for a key in the changed
   range (publishes resume on the new route); and the most retries any one publish
   needed (issue targets: < 2 s, <= 1 retry).
2. scaling: for P = 1, 2, 4, 8 a topic split into P physical partitions is loaded with
   the same keyed messages, then one consumer connection (plain SUB: every partition, one
   message in flight per partition, FIN each) drains it: msgs/s and the ratio to P = 1.

Consumers and producers run in this process, nsqd in another; everything binds to
127.0.0.1 and is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.client import Producer  # noqa: E402
from nsqx.protocol import v2  # noqa: E402
from nsqx.protocol.routes import logical_partition  # noqa: E402
from ordered import _Consumer  # noqa: E402  (bench/ordered.py: the same FIN-each consumer)

LOGICAL = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(http: str, path: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{http}{path}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return r.status, json.loads(body) if body else {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def routes(http: str, topic: str) -> dict:
    with urllib.request.urlopen(f"http://{http}/topic/route?topic={topic}", timeout=10) as r:
        return json.loads(r.read())


def newest(http: str, topic: str) -> list[list]:
    return routes(http, topic)["versions"][-1]["routes"]  # [lo, hi, partition, node]


async def change_run(tcp: str, http: str, producers: int) -> None:
    topic = "chg"
    assert post(http, f"/topic/create?topic={topic}&partition_num=1&logical={LOGICAL}")[0] == 200
    assert post(http, f"/channel/create?topic={topic}&channel=c")[0] == 200
    acks: list[tuple[float, str]] = []  # (time acknowledged, key)
    max_retry = 0
    sent = 0
    stop = asyncio.Event()

    async def produce(i: int) -> None:
        nonlocal max_retry, sent
        p = Producer(tcp, nsqd_http_addresses=[http])
        keys = [f"p{i}k{j}" for j in range(32)]
        seq = 0
        try:
            while not stop.is_set():
                k = keys[seq % len(keys)]
                before = p.route_retries
                await p.publish(topic, f"{k}:{seq}".encode(), key=k)
                max_retry = max(max_retry, p.route_retries - before)
                acks.append((time.monotonic(), k))
                sent += 1
                seq += 1
        finally:
            await p.close()

    tasks = [asyncio.create_task(produce(i)) for i in range(producers)]
    await asyncio.sleep(1.0)
    node = "elsewhere:4150"  # a standalone nsqd relabels the moved range's new partition
    print(f"{'change':<34} {'HTTP call':>10} {'publishes resume':>17}")
    plan = [("split", lambda r: f"/topic/split?topic={topic}&partition={r[0][2]}&at=512"),
            ("split", lambda r: f"/topic/split?topic={topic}&partition={r[0][2]}&at=256"),
            ("merge", lambda r: f"/topic/merge?topic={topic}&a={r[0][2]}&b={r[1][2]}"),
            ("move", lambda r: f"/topic/move?topic={topic}&partition={r[-1][2]}&node={node}")]
    worst = 0.0
    for kind, make in plan:
        await asyncio.sleep(1.0)
        before = newest(http, topic)
        path = make(before)
        t0 = time.monotonic()
        code, body = await asyncio.to_thread(post, http, path)
        t_http = time.monotonic() - t0
        if code != 200:
            raise SystemExit(f"{path}: {code} {body}")
        after = newest(http, topic)
        changed = [(lo, hi) for lo, hi, p, _n in after
                   if [lo, hi, p] not in [r[:3] for r in before]]
        mark = len(acks)
        resumed = None
        for _ in range(1000):
            for t, k in acks[mark:]:
                lp = logical_partition(k, LOGICAL)
                if t > t0 + t_http and any(lo <= lp < hi for lo, hi in changed):
                    resumed = t - t0
                    break
            if resumed is not None:
                break
            await asyncio.sleep(0.01)
        worst = max(worst, resumed or 99.0)
        label = f"{kind} ({path.split('?', 1)[1].split('&', 1)[1]})"
        print(f"{label:<34} {t_http * 1000:>8.0f} ms {(resumed or 0) * 1000:>14.0f} ms")
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks)
    print(f"{sent:,} keyed publishes from {producers} producers; the most retries one "
          f"publish needed: {max_retry} (target <= 1); slowest change {worst * 1000:.0f} ms "
          f"(target < 2,000 ms)")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scaling_run(tcp: str, http: str, messages: int, pid: int) -> None:
    base = None
    print(f"{'physical partitions':<20} {'ordered drain msgs/s':>21} {'vs 1':>6} "
          f"{'nsqd CPU/msg':>13}")
    for parts in (1, 2, 4, 8):
        topic = f"scale{parts}"
        assert post(http, f"/topic/create?topic={topic}&partition_num=1&logical={LOGICAL}")[0] == 200
        assert post(http, f"/channel/create?topic={topic}&channel=c")[0] == 200
        while len(newest(http, topic)) < parts:  # halve the widest range until P
            lo, hi, p, _n = max(newest(http, topic), key=lambda r: r[1] - r[0])
            code, body = post(http, f"/topic/split?topic={topic}&partition={p}&at={(lo + hi) // 2}")
            assert code == 200, body
        prod = Producer(tcp, nsqd_http_addresses=[http])
        keys = [f"key{j}" for j in range(256)]
        batch = 50
        for i in range(0, messages, batch * len(keys)):
            await asyncio.gather(*(prod.mpublish(topic, [b"%s:%d" % (k.encode(), i + s)
                                                        for s in range(batch)], key=k)
                                   for k in keys))
        total = (messages + batch * len(keys) - 1) // (batch * len(keys)) * batch * len(keys)
        await prod.close()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        c0 = cpu_s(pid)
        t0 = time.perf_counter()
        host, port = tcp.split(":")
        tr, _ = await loop.create_connection(
            lambda t=topic, n=total, f=fut: _Consumer(b"SUB %s c\n" % t.encode() + v2.rdy(64), n, f),
            host, int(port))
        got = await fut
        rate = got / (time.perf_counter() - t0)
        us = (cpu_s(pid) - c0) / got * 1e6
        tr.close()
        base = base or rate
        print(f"{parts:<20} {rate:>21,.0f} {rate / base:>5.2f}x {us:>10.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--messages", type=int, default=40_000,
                    help="messages per topic in the scaling part")
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="bench-routes-")
    tcp, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address={tcp}",
                             f"--http-address={http}", f"--data-path={data}",
                             "--log-level=warn"], stdin=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://{http}/ping", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        asyncio.run(change_run(tcp, http, args.producers))
        asyncio.run(scaling_run(tcp, http, args.messages, proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
