"""Replay in cluster mode: a channel reset on the partition's leader is mirrored by the
followers (cursors travel with fetches) and survives a kill -9 of the leader; followers refuse
resets of their own."""

from __future__ import annotations

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.protocol import v2
from tests.support import http_api
from tests.support.cluster import Cluster, wait_until
from tests.support.rawclient import RawClient, consumer

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def channel_depth(node, topic: str, channel: str) -> int | None:  # type: ignore[no-untyped-def]
    st = http_api.stats(node.http_address, topic, channel)
    for t in st["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c["depth"]
    return None


def setoffset(node, body: bytes) -> http_api.Response:  # type: ignore[no-untyped-def]
    return http_api.request(
        "POST", f"http://{node.http_address}/channel/setoffset?topic=replay&channel=c", body)


def test_reset_is_mirrored_by_followers_and_survives_failover(cluster: Cluster) -> None:
    cluster.create_topic("replay", partitions=1, replicas=3)
    leader = cluster.leader("replay")
    followers = [n for n in cluster.nodes if n is not leader]
    assert http_api.post(leader.http_address, "/channel/create", topic="replay",
                         channel="c").status == 200
    for i in range(20):
        assert http_api.pub(leader.http_address, "replay", b"m%02d" % i).status == 200
    with consumer(leader.tcp_address, "replay", "c", rdy=20) as c:
        for m in c.read_messages(20):
            c.send(v2.fin(m.id))
        c.expect_nothing(0.3)
    wait_until(lambda: all(channel_depth(f, "replay", "c") == 0 for f in followers),
               what="followers learnt the confirmed cursor")

    r = setoffset(followers[0], b"msgcount:0")
    assert (r.status, r.json()) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})
    with RawClient(followers[0].tcp_address) as f:
        f.send(v2.sub_advanced("replay", "c", 0, "earliest"))
        f.expect_error("E_FAILED_ON_NOT_LEADER", closed=True)
    with RawClient(followers[0].tcp_address) as f:  # without a position it is a SUB
        f.send(v2.sub_advanced("replay", "c", 0))
        f.expect_error("E_FAILED_ON_NOT_LEADER", closed=True)  # only leaders deliver

    r = setoffset(leader, b"msgcount:5")
    assert r.status == 200 and r.json()["offset"] == 5
    wait_until(lambda: all(channel_depth(f, "replay", "c") == 15 for f in followers),
               what="followers mirrored the reset")

    leader.kill()
    leader_id = cluster.node_id(leader)
    new_leader = wait_until(lambda: (p := cluster.partitions("replay")[0])["leader"] not in
                            (None, leader_id) and cluster.node_by_id(p["leader"]),
                            what="a new leader")
    with consumer(new_leader.tcp_address, "replay", "c", rdy=20) as c:
        got = c.read_messages(15)
        assert [m.body for m in got] == [b"m%02d" % i for i in range(5, 20)]
