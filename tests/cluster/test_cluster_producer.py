"""nsqx.client.ClusterProducer against a real cluster: keys hashed over the topic's
partitions, each publish sent to its partition's leader (no forwarding hop), and a
kill -9 of a leader answered by looking the leader up again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsqx.client import ClusterProducer, NSQError, key_partition
from nsqx.client.cluster import layout_from_lookup
from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.test_cluster_processes import fetch_bodies
from tests.support.cluster import Cluster, wait_until


def test_layout_from_lookup() -> None:
    data = {"producers": [], "meta": {"partition_num": 3, "ordered": True},
            "partitions": {"0": {"broadcast_address": "127.0.0.1", "tcp_port": 4150,
                                 "epoch": 4},
                           "2": {"broadcast_address": "::1", "tcp_port": 4250}}}
    lay = layout_from_lookup("t", data)
    assert lay.partitions == 3 and lay.ordered
    assert (lay.leaders[0].address, lay.leaders[0].epoch) == ("127.0.0.1:4150", 4)
    assert lay.leaders[2].address == "[::1]:4250" and lay.leaders[2].epoch is None
    assert 1 not in lay.leaders
    with pytest.raises(ValueError, match="not a cluster topic"):
        layout_from_lookup("t", {"producers": []})


@pytest.mark.slow
def test_publishes_go_to_leaders_and_follow_a_failover(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("keyed", partitions=3, replicas=3)
    keys = [f"user-{i}" for i in range(12)]

    async def first_round(p: ClusterProducer) -> dict[str, list[bytes]]:
        sent: dict[str, list[bytes]] = {k: [] for k in keys}
        for seq in range(5):
            for k in keys:
                body = f"{k}:{seq}".encode()
                assert await p.publish("keyed", body, key=k) == key_partition(k, 3)
                sent[k].append(body)
        await p.mpublish("keyed", [b"batch-1", b"batch-2"], partition=2)
        return sent

    async def main() -> tuple[dict[str, list[bytes]], list[bytes], int, int]:
        async with ClusterProducer([cluster.lookupd.http_address], wait_timeout=30) as p:
            sent = await first_round(p)
            lay = await p.layout("keyed")
            assert set(lay.leaders) == {0, 1, 2}
            assert all(ld.epoch == 1 for ld in lay.leaders.values())
            lookups = p.lookups
            # kill the leader of partition 0 and go on publishing keys of partition 0
            victim = cluster.node_by_id(cluster.partitions("keyed")[0]["leader"])
            victim.kill()
            k0 = [k for k in keys if key_partition(k, 3) == 0]
            after: list[bytes] = []
            for k in k0:
                body = f"{k}:after".encode()
                await p.publish("keyed", body, key=k)
                after.append(body)
            return sent, after, lookups, p.lookups

    sent, after, lookups_before, lookups_after = asyncio.run(main())
    assert lookups_before == 1  # one lookup served every publish
    assert lookups_after > lookups_before  # the failover was found through lookupd
    # no node forwarded anything: every publish went straight to a leader
    for n in cluster.nodes:
        if n.is_running():
            assert cluster.state(n)["forwarded"] == 0
    for part in range(3):
        leader = cluster.node_by_id(wait_until(
            lambda part=part: cluster.partitions("keyed")[part]["leader"], what="leader"))
        log = fetch_bodies(leader, "keyed", part)
        for k in keys:
            if key_partition(k, 3) == part:
                mine = [b for b in log if b.split(b":")[0] == k.encode()]
                expected = sent[k] + ([f"{k}:after".encode()] if part == 0 else [])
                assert mine == expected, (k, mine)  # every acked message, in order
    assert set(after) <= set(fetch_bodies(cluster.node_by_id(
        cluster.partitions("keyed")[0]["leader"]), "keyed", 0))


@pytest.mark.slow
def test_a_refused_batch_moves_its_stream_to_a_new_epoch(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory,  # type: ignore[no-untyped-def]
        caplog: pytest.LogCaptureFixture) -> None:
    """A refusal stores nothing: the partition's stream goes on in a new epoch at once, and
    the next batch meets no sequence gap."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=1)
    cluster.create_topic("refused", partitions=1, replicas=1)
    caplog.set_level(logging.INFO, logger="nsqx.client")

    async def main() -> None:
        async with ClusterProducer([cluster.lookupd.http_address], wait_timeout=30) as p:
            await p.publish("refused", b"a")
            with pytest.raises(NSQError) as ei:
                await p.publish("refused", b"x" * (2 << 20))  # > --max-msg-size
            assert ei.value.code == "E_BAD_MESSAGE"
            await p.publish("refused", b"b")
    asyncio.run(main())
    gaps = [r.getMessage() for r in caplog.records if "OUT_OF_ORDER" in r.getMessage()]
    assert gaps == []
    leader = cluster.node_by_id(cluster.partitions("refused")[0]["leader"])
    assert fetch_bodies(leader, "refused", 0) == [b"a", b"b"]
