"""nsqx.cluster.etcd against a real etcd: KV, CAS, leases, watches, and etcd going away."""

from __future__ import annotations

import asyncio

import pytest

from nsqx.cluster.etcd import Compare, EtcdClient, EtcdUnavailable, Op, prefix_end
from nsqx.cluster.etcd_server import EtcdServer, free_port
from tests.client.helpers import run


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


def test_kv_roundtrip_and_prefix(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            assert await etcd.get(b"/t/missing") is None
            await etcd.put(b"/t/a", b"1")
            await etcd.put(b"/t/b", b"\x00binary\xff")
            await etcd.put(b"/u/c", b"other")
            kv = await etcd.get(b"/t/b")
            assert kv is not None and kv.value == b"\x00binary\xff" and kv.version == 1
            kvs, rev = await etcd.get_prefix(b"/t/")
            assert [k.key for k in kvs] == [b"/t/a", b"/t/b"] and rev >= 3
            assert await etcd.delete(b"/t/", prefix=True) == 2
            assert (await etcd.get_prefix(b"/t/"))[0] == []
            assert await etcd.get(b"/u/c") is not None

    run(body())


def test_txn_compare_and_swap(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            ok, _ = await etcd.txn([Compare.absent(b"/k")], [Op.put(b"/k", b"v1")])
            assert ok
            ok, _ = await etcd.txn([Compare.absent(b"/k")], [Op.put(b"/k", b"v2")])
            assert not ok  # second creator loses
            kv = await etcd.get(b"/k")
            assert kv is not None and kv.value == b"v1"
            # swap only from the revision we read
            ok, _ = await etcd.txn([Compare.mod_revision(b"/k", kv.mod_revision)],
                                   [Op.put(b"/k", b"v3")])
            assert ok
            ok, _ = await etcd.txn([Compare.mod_revision(b"/k", kv.mod_revision)],
                                   [Op.put(b"/k", b"stale")], [Op.put(b"/lost", b"1")])
            assert not ok
            assert (await etcd.get(b"/k")).value == b"v3"  # type: ignore[union-attr]
            assert (await etcd.get(b"/lost")) is not None  # failure branch ran

    run(body())


def test_lease_expiry_deletes_keys(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            lease = await etcd.lease_grant(1)
            await etcd.put(b"/nodes/n1", b"alive", lease=lease)
            assert await etcd.lease_keepalive(lease) > 0
            assert await etcd.get(b"/nodes/n1") is not None
            for _ in range(100):  # etcd expires a 1 s lease within a few seconds
                await asyncio.sleep(0.1)
                if await etcd.get(b"/nodes/n1") is None:
                    break
            assert await etcd.get(b"/nodes/n1") is None
            assert await etcd.lease_keepalive(lease) == 0
            await etcd.lease_revoke(lease)  # revoking a gone lease is not an error

    run(body())


def test_watch_sees_changes_in_order_and_from_a_revision(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            first = await etcd.put(b"/w/a", b"1")
            await etcd.put(b"/w/b", b"2")
            await etcd.delete(b"/w/a")
            await etcd.put(b"/x/ignored", b"3")
            seen = []
            async for events in etcd.watch_prefix(b"/w/", first):
                seen.extend((e.type, e.kv.key) for e in events)
                if len(seen) >= 3:
                    break
            assert seen == [("PUT", b"/w/a"), ("PUT", b"/w/b"), ("DELETE", b"/w/a")]

    run(body())


def test_watch_survives_an_etcd_restart(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            got: list[bytes] = []

            async def watcher() -> None:
                async for events in etcd.watch_prefix(b"/r/"):
                    got.extend(e.kv.value for e in events)
                    if len(got) >= 2:
                        return

            task = asyncio.create_task(watcher())
            await asyncio.sleep(0.3)
            await etcd.put(b"/r/1", b"before")
            await asyncio.to_thread(etcd_server.restart)
            await etcd.put(b"/r/2", b"after")
            await asyncio.wait_for(task, 20)
            assert got == [b"before", b"after"]

    run(body())


def test_unreachable_etcd_is_a_clear_error() -> None:
    async def body() -> None:
        async with EtcdClient([f"http://127.0.0.1:{free_port()}"], timeout=1) as etcd:
            with pytest.raises(EtcdUnavailable, match="etcd unreachable"):
                await etcd.get(b"/x")

    run(body())


def test_second_endpoint_is_used_when_the_first_is_down(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        dead = f"http://127.0.0.1:{free_port()}"
        async with EtcdClient([dead, etcd_server.endpoint], timeout=1) as etcd:
            await etcd.put(b"/f", b"ok")
            assert (await etcd.get(b"/f")).value == b"ok"  # type: ignore[union-attr]

    run(body())
