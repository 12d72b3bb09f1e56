"""Producer routing by partition or key, and an ordered consumer reading a partition."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from nsqx.client import Producer, key_partition
from nsqx.client.errors import NSQError
from nsqx.protocol import v2
from tests.client.helpers import run, start_fixed, wait_for
from tests.support import http_api
from tests.support.faultproxy import FaultProxy
from tests.support.log_checker import lost_and_duplicated, stored
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import RawClient


def test_key_partition_is_crc32_mod_count() -> None:
    assert key_partition("user-42", 8) == zlib.crc32(b"user-42") % 8
    assert key_partition(b"user-42", 8) == key_partition("user-42", 8)
    assert {key_partition(f"k{i}", 4) for i in range(100)} == {0, 1, 2, 3}
    with pytest.raises(ValueError):
        key_partition("x", 0)


def test_keys_keep_their_order_per_partition(nsqd: NsqdProcess) -> None:
    r = http_api.post(nsqd.http_address, "/topic/create", topic="acct", partition_num="4",
                      orderedmulti="true")
    assert r.status == 200
    keys = [f"user-{i}" for i in range(12)]

    async def produce() -> None:
        async with Producer(nsqd.tcp_address) as p:
            for seq in range(5):
                for k in keys:
                    await p.publish("acct", f"{k}:{seq}".encode(), key=k, partitions=4)
            with pytest.raises(NSQError) as ei:
                await p.publish("acct", b"no-key")  # ordered: a partition is required
            assert ei.value.code == "E_BAD_PARTITION"
            with pytest.raises(ValueError):
                await p.publish("acct", b"x", key="k")  # no partition count
            with pytest.raises(ValueError):
                await p.publish("acct", b"x", key="k", partition=1, partitions=4)

    run(produce())
    for part in range(4):
        with RawClient(nsqd.tcp_address) as c:
            c.send(v2.sub_ordered("acct", "audit", part))
            c.expect_ok()
            c.send(v2.rdy(100))
            mine = [k for k in keys if key_partition(k, 4) == part]
            seen: dict[str, list[int]] = {}
            for _ in range(5 * len(mine)):
                m = c.read_message()
                k, seq = m.body.decode().split(":")
                seen.setdefault(k, []).append(int(seq))
                c.send(v2.fin(m.id))
            assert set(seen) == set(mine)
            assert all(v == [0, 1, 2, 3, 4] for v in seen.values())  # per key, in order


@pytest.mark.slow
def test_keyed_publishes_survive_a_restart_right_after_a_split(
        nsqd_factory: NsqdFactory) -> None:
    """Keyed publishes on a route-managed topic run while the topic is split and nsqd is
    SIGKILLed and restarted at once; the route endpoint stays unreachable from the producers
    (a proxy refuses) through the split and for a while after TCP is back (as when nsqd's HTTP
    opens after its TCP). Every publish must wait for the route instead of raising
    ``no route for topic``, and every acknowledged message must be in the log."""
    from nsqx.client import Consumer

    nsqd = start_fixed(nsqd_factory)
    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="rk", partition_num=2,
                         logical=64).status == 200
    assert http_api.post(a, "/channel/create", topic="rk", channel="c").status == 200
    proxy = FaultProxy(nsqd.http_port).start()
    keys, per_key = 24, 12
    acked: set[tuple[str, int]] = set()

    async def main() -> dict[str, list[int]]:
        producers = [Producer(nsqd.tcp_address, nsqd_http_addresses=proxy.address,
                              wait_timeout=20.0) for _ in range(2)]
        started = asyncio.Event()

        async def publish_key(p: Producer, k: int) -> None:
            for s in range(per_key):
                await p.publish("rk", f"k{k}:{s}".encode(), key=f"k{k}")
                acked.add((f"k{k}", s))
                if len(acked) >= keys:
                    started.set()
                await asyncio.sleep(0.03)

        async def fault() -> None:
            await started.wait()  # every producer holds route version 0
            proxy.cut("refuse")
            r = await asyncio.to_thread(http_api.post, a, "/topic/split", topic="rk",
                                        partition=0, at=16)
            assert r.status == 200, r.body
            await asyncio.to_thread(nsqd.kill)
            await asyncio.to_thread(nsqd.start)
            await asyncio.sleep(0.5)  # TCP answers, the route endpoint does not yet
            proxy.heal()

        try:
            await asyncio.gather(fault(), *(publish_key(producers[k % 2], k)
                                            for k in range(keys)))
        finally:
            for p in producers:
                await p.close()
        seen: dict[str, list[int]] = {}

        def handle(m) -> None:  # type: ignore[no-untyped-def]
            k, s = m.body.decode().split(":")
            seen.setdefault(k, []).append(int(s))

        c = Consumer("rk", "c", handle, nsqd_tcp_addresses=nsqd.tcp_address,
                     max_in_flight=50)
        await c.start()
        try:
            await wait_for(lambda: {(k, s) for k, ss in seen.items() for s in ss} >= acked,
                           timeout=30.0, step=0.1)
        finally:
            await c.close()
        return seen

    try:
        seen = run(main(), timeout=120.0)
    finally:
        proxy.stop()
    assert len(acked) == keys * per_key  # no publish raised
    assert {(k, s) for k, ss in seen.items() for s in ss} == acked
    r = http_api.get(nsqd.http_address, "/topic/route", topic="rk")
    assert r.status == 200 and r.json()["versions"][-1]["version"] == 1


def test_routed_keyed_publishes_are_idempotent(nsqd: NsqdProcess) -> None:
    """A route-managed topic's keyed publish (routed by the producer's route source) whose
    answer is cut off is sent again with its mark and stored once; one refused by a split's
    sealed partition is routed again and stored once too."""
    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="rid", partition_num=2,
                         logical=64).status == 200
    proxy = FaultProxy(int(nsqd.tcp_address.rsplit(":", 1)[1])).start()
    sent: list[bytes] = []

    async def main() -> None:
        async with Producer(proxy.address, nsqd_http_addresses=a, wait_timeout=15,
                            publish_timeout=60) as p:
            for i in range(12):
                if i in (2, 5):
                    proxy.cut_after(0)  # written, stored, its OK lost: sent again
                if i == 8:  # partition 0 is sealed: refused, routed again by version 1
                    r = await asyncio.to_thread(http_api.post, a, "/topic/split", topic="rid",
                                                partition=0, at=16)
                    assert r.status == 200, r.body
                body = b"r-%d" % i
                if i == 4:
                    await p.mpublish("rid", [body, body + b"b"], key="k4")
                    sent.append(body + b"b")
                else:
                    await p.publish("rid", body, key=f"k{i}")
                sent.append(body)
            assert p.idempotent_retries >= 2
    try:
        run(main(), timeout=120)
    finally:
        proxy.stop()
    assert proxy.cuts == 2
    route = http_api.get(a, "/topic/route", topic="rid").json()["versions"][-1]
    got = [b for part in range(4) for b, _ in stored(a, "rid", part)]  # 0 split: 2, 3
    assert lost_and_duplicated(sent, got) == ([], []), route
