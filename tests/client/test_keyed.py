"""Producer routing by partition or key, and an ordered consumer reading a partition."""

from __future__ import annotations

import zlib

import pytest

from nsqx.client import Producer, key_partition
from nsqx.client.errors import NSQError
from nsqx.protocol import v2
from tests.client.helpers import run
from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess
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
