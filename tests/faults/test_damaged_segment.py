"""A damaged segment on one replica, made while the follower was stopped: a bit of a message
body flipped (bit rot, a bad sector) or the segment cut in the middle of the log (a lost
tail of a file). It must be detected, never served (to a follower fetching from it or to a
consumer), and repaired from the leader.

The cut is found by recovery (the batch metadata points past the file's end); the flip by
recovery's crc scrub, which checks every batch, the fsynced ones too (issue 28). Either way
the replica's log is cut at the last good batch and the rest fetched again from the leader.
See docs/operations.md, "What survives which fault"."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.test_cluster_processes import fetch_bodies
from tests.support.cluster import Cluster, http, wait_until

pytestmark = [pytest.mark.slow]

N = 300


def flip(data_path: Path, topic: str, needle: bytes) -> Path:
    """Flip one bit of the last byte of ``needle`` (a digit becomes a letter) in the replica's
    segment files."""
    for seg in sorted((data_path / "topics").rglob("*.log")):
        if topic not in str(seg):
            continue
        raw = bytearray(seg.read_bytes())
        at = raw.find(needle)
        if at >= 0:
            raw[at + len(needle) - 1] ^= 0x40
            seg.write_bytes(bytes(raw))
            return seg
    raise AssertionError(f"{needle!r} not found in {topic}'s segments under {data_path}")


def cut(data_path: Path, topic: str, needle: bytes) -> Path:
    """Truncate the replica's segment holding ``needle`` just before it."""
    for seg in sorted((data_path / "topics").rglob("*.log")):
        if topic not in str(seg):
            continue
        at = seg.read_bytes().find(needle)
        if at >= 0:
            with seg.open("r+b") as f:
                f.truncate(at)
            return seg
    raise AssertionError(f"{needle!r} not found in {topic}'s segments under {data_path}")


def damage_a_follower(cluster: Cluster, damage) -> None:  # type: ignore[no-untyped-def]
    """Publish N messages, stop a follower, ``damage`` its segment, restart it; then it must
    serve nothing but the leader's messages and come to hold exactly the leader's log."""
    cluster.create_topic("dmg", partitions=1, replicas=3)
    leader, follower, _ = cluster.roles("dmg")
    want = [b"dmg-%06d" % i for i in range(N)]
    for body in want:
        code, answer = http("POST", f"http://{leader.http_address}/pub?topic=dmg", body)
        assert code == 200, answer
    for n in cluster.nodes:
        wait_until(lambda n=n: fetch_bodies(n, "dmg") == want, what=f"{n.name} holds the log")
    follower.stop()
    damage(follower.data_path, "dmg", b"dmg-000150")
    follower.start()
    node = cluster.node_id(follower)
    wait_until(lambda: node in cluster.partitions("dmg")[0]["isr"], timeout=60,
               what="the damaged follower back in the ISR")
    served = fetch_bodies(follower, "dmg")
    assert not set(served) - set(want), f"damaged records served: {set(served) - set(want)}"
    wait_until(lambda: fetch_bodies(follower, "dmg") == want, timeout=60,
               what="the damaged replica repaired from the leader")


def test_a_cut_segment_on_a_follower_is_repaired(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                                 lookupd_factory) -> None:
    damage_a_follower(Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3), cut)


def test_bit_flip_on_a_follower_is_never_served(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                                lookupd_factory) -> None:
    damage_a_follower(Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3), flip)
