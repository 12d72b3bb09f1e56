"""Ordered load of the fault suite, run as a subprocess on the client host.

    python ordered_load.py produce LOOKUPD_HTTP TOPIC KEYS STOP_FILE
    python ordered_load.py consume LOOKUPD_HTTP TOPIC CHANNEL PARTITIONS SECONDS

The producer is nsqx's ClusterProducer (a key hashes to its partition; it follows the
leader): one publish at a time, keys in turn, each key's bodies numbered ``key:seq``; a
failed publish is tried again with the same number, so a key's acknowledged numbers are
0, 1, 2, ... It prints ``{"ack": key, "seq": n, "t": ...}`` per acknowledged publish and
stops once STOP_FILE exists. The consumer holds one ``SUB_ORDERED`` per partition on that
partition's leader (found through nsqlookupd; again after the connection closes or the
leader moves) and prints ``{"got": key, "seq": n}`` per delivery, FIN after.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from nsqx.client import ClusterProducer, ConnConfig, Connection
from nsqx.client.cluster import layout_from_lookup
from nsqx.protocol import v2


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def produce(lookupd: str, topic: str, keys: list[str], stop_file: str) -> None:
    seq = dict.fromkeys(keys, 0)
    i = 0
    async with ClusterProducer([lookupd], wait_timeout=10) as p:
        while not os.path.exists(stop_file):
            k = keys[i % len(keys)]
            i += 1
            try:
                await asyncio.wait_for(p.publish(topic, f"{k}:{seq[k]}".encode(), key=k), 15)
            except Exception as e:  # not acknowledged: the same number goes again
                emit({"fail": k, "seq": seq[k], "why": repr(e)[:100]})
                await asyncio.sleep(0.2)
                continue
            emit({"ack": k, "seq": seq[k], "t": time.time()})
            seq[k] += 1


def leader_of(lookupd: str, topic: str, partition: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://{lookupd}/lookup?topic={topic}&metainfo=true",
                                    timeout=2) as r:
            layout = layout_from_lookup(topic, json.loads(r.read()))
    except (OSError, ValueError):
        return None
    leader = layout.leaders.get(partition)
    return leader.address if leader else None


async def follow(lookupd: str, topic: str, channel: str, partition: int) -> None:
    loop = asyncio.get_running_loop()
    while True:
        addr = await loop.run_in_executor(None, leader_of, lookupd, topic, partition)
        if addr is None:
            await asyncio.sleep(0.5)
            continue
        closed = asyncio.Event()

        def on_message(conn: Connection, m: tuple[bytes, bytes]) -> None:
            key, n = m[1].decode().split(":")
            emit({"got": key, "seq": int(n), "p": partition})
            conn.send(v2.fin(m[0]))

        conn = Connection(addr, ConnConfig(), on_message=on_message,
                          on_close=lambda c, e, closed=closed: closed.set(),
                          make_message=lambda c, ts, att, mid, body: (mid, body))
        try:
            await asyncio.wait_for(conn.connect(), 5)
            await asyncio.wait_for(conn.command(v2.sub_ordered(topic, channel, partition)), 5)
            conn.send(v2.rdy(1))
        except Exception:
            conn.close()
            await asyncio.sleep(0.5)
            continue
        while not closed.is_set():  # until it closes or another node leads
            try:
                await asyncio.wait_for(closed.wait(), 2)
            except TimeoutError:
                now = await loop.run_in_executor(None, leader_of, lookupd, topic, partition)
                if now is not None and now != addr:
                    break
        conn.close()


async def consume(lookupd: str, topic: str, channel: str, partitions: int, seconds: float
                  ) -> None:
    tasks = [asyncio.create_task(follow(lookupd, topic, channel, p)) for p in range(partitions)]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(errors="replace").splitlines()
            if line.startswith("{")]


class OrderedLoad:
    """This script's producer and consumer as subprocesses (``prefix``: ``ip netns exec``)."""

    def __init__(self, lookupd: str, topic: str, partitions: int, tmp: Path,
                 prefix: Sequence[str] = (), keys: int = 8) -> None:
        self.stop_file = tmp / f"{topic}-stop"
        self.out, self.inp = tmp / f"{topic}-producer.jsonl", tmp / f"{topic}-consumer.jsonl"
        cmd = [*prefix, sys.executable, __file__]
        self.consumer = subprocess.Popen(
            [*cmd, "consume", lookupd, topic, "c", str(partitions), "3600"],
            stdout=self.inp.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.producer = subprocess.Popen(
            [*cmd, "produce", lookupd, topic, ",".join(f"k{i}" for i in range(keys)),
             str(self.stop_file)],
            stdout=self.out.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def acked(self) -> int:
        return sum(1 for e in _events(self.out) if "ack" in e)

    def finish(self, timeout: float = 60.0) -> tuple[list[dict], list[dict]]:
        """Stop publishing, give the consumer ``timeout`` s to get every acknowledged
        message, stop it; the producer's and the consumer's events."""
        self.stop_file.touch()
        self.producer.wait(30)
        acked = {(e["ack"], e["seq"]) for e in _events(self.out) if "ack" in e}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if acked <= {(e["got"], e["seq"]) for e in _events(self.inp) if "got" in e}:
                break
            time.sleep(0.5)
        self.stop()
        return _events(self.out), _events(self.inp)

    def stop(self) -> None:
        for p in (self.producer, self.consumer):
            if p.poll() is None:
                p.kill()
                p.wait(10)


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        asyncio.run(produce(sys.argv[2], sys.argv[3], sys.argv[4].split(","), sys.argv[5]))
    else:
        asyncio.run(consume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
                            float(sys.argv[6])))
