"""Strict per-key order under trouble: many keys over 4 ordered partitions, consumers that
REQ at random, let messages time out, drop their connection, and an nsqd that is killed
(-9) and restarted mid-way. A checker watches every delivery of every key: a message may
come again (at-least-once) but never before the key's earlier message was finished (no
gap, no overtaking), and in the end every message was finished.

Run longer with NSQX_ORDERED_KEYS=200 NSQX_ORDERED_SEQ=100.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from nsqx.client import Producer, key_partition
from nsqx.protocol import v2
from tests.client.helpers import run, start_fixed
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory
from tests.support.rawclient import ConnectionClosed, NoFrame, RawClient

pytestmark = pytest.mark.slow

PARTS = 4
KEYS = int(os.environ.get("NSQX_ORDERED_KEYS", "24"))
SEQ = int(os.environ.get("NSQX_ORDERED_SEQ", "15"))


class Checker:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: dict[str, int] = {}  # key -> highest seq finished in order (-1: none)
        self.violations: list[str] = []
        self.deliveries = 0

    def delivered(self, key: str, seq: int) -> None:
        with self.lock:
            self.deliveries += 1
            last = self.done.get(key, -1)
            if seq > last + 1:
                self.violations.append(f"{key}: got {seq} before {last + 1} was finished")

    def finished(self, key: str, seq: int) -> None:
        with self.lock:
            if seq == self.done.get(key, -1) + 1:
                self.done[key] = seq

    def complete(self) -> bool:
        with self.lock:
            return len(self.done) == KEYS and all(v == SEQ - 1 for v in self.done.values())


def consume(address_of, part: int, checker: Checker, stop: threading.Event,  # type: ignore[no-untyped-def]
            rnd: random.Random) -> None:
    while not stop.is_set():
        try:
            with RawClient(address_of(), timeout=2) as c:
                c.identify({"msg_timeout": 1000})
                c.send(v2.sub_ordered("keys", "audit", part))
                c.expect_ok()
                c.send(v2.rdy(10))
                while not stop.is_set():
                    try:
                        m = c.read_message(timeout=0.5)
                    except NoFrame:
                        continue
                    key, seq = m.body.decode().rsplit(":", 1)
                    checker.delivered(key, int(seq))
                    r = rnd.random()
                    if r < 0.08:
                        c.send(v2.req(m.id, rnd.choice([0, 50])))
                    elif r < 0.11:
                        pass  # no answer: it times out and comes again
                    elif r < 0.13:
                        break  # drop the connection, its message in flight
                    else:
                        c.send(v2.fin(m.id))
                        checker.finished(key, int(seq))
        except (ConnectionClosed, OSError, AssertionError):
            time.sleep(0.1)  # nsqd restarting


def test_per_key_order_survives_req_timeouts_reconnects_and_kill(
        nsqd_factory: NsqdFactory) -> None:
    nsqd = start_fixed(nsqd_factory)
    r = http_api.post(nsqd.http_address, "/topic/create", topic="keys",
                      partition_num=str(PARTS), orderedmulti="true")
    assert r.status == 200
    keys = [f"key-{i}" for i in range(KEYS)]
    assert {key_partition(k, PARTS) for k in keys} == set(range(PARTS))

    async def produce(lo: int, hi: int) -> None:
        async with Producer(nsqd.tcp_address) as p:
            for seq in range(lo, hi):
                for k in keys:
                    await p.publish("keys", f"{k}:{seq}".encode(), key=k, partitions=PARTS)

    run(produce(0, SEQ // 2))
    checker = Checker()
    stop = threading.Event()
    threads = [threading.Thread(target=consume, daemon=True,
                                args=(lambda: nsqd.tcp_address, p, checker, stop,
                                      random.Random(p)))
               for p in range(PARTS)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
        nsqd.kill()  # kill -9 mid-way, consumers connected, messages in flight
        nsqd.start()
        run(produce(SEQ // 2, SEQ))
        deadline = time.monotonic() + 90
        while not checker.complete() and time.monotonic() < deadline and not checker.violations:
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not checker.violations, checker.violations[:10]
    assert checker.complete(), {k: v for k, v in checker.done.items() if v != SEQ - 1}
    assert checker.deliveries >= KEYS * SEQ
