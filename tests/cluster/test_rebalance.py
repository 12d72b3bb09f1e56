"""A node that joins gets replicas and leaderships (issue 11), under pynsq load.

Three nodes hold a topic of 6 partitions x 2 replicas (4 replicas each); a fourth node
joins. The coordinator moves one replica at a time onto it from the most loaded nodes
(``plan_rebalance``, carried out by the move machinery: the new replica catches up outside
the ISR, then the old one leaves), until every node holds 3; leadership follows the
preferred replicas, so the new node leads some partitions. A pynsq producer and consumer
run throughout and the total-queue checker must find 0 lost acknowledged messages. With
``--cluster-rebalance=false`` on nsqlookupd the new node stays empty.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.chaos_check import Load
from tests.support.cluster import Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.compat]


def spread(cluster: Cluster, topic: str) -> tuple[Counter[str], Counter[str]]:
    replicas: Counter[str] = Counter()
    leaders: Counter[str] = Counter()
    for p in cluster.partitions(topic):
        replicas.update(p["replicas"])
        leaders[p["leader"]] += 1
    return replicas, leaders


def settled(cluster: Cluster, topic: str) -> bool:
    stats = cluster.stats()
    parts = stats["topics"][topic]["partitions"]
    return not stats["moves"] and all(
        set(p["isr"]) == set(p["replicas"]) and p["leader"] == p["replicas"][0] for p in parts)


def test_a_node_that_joins_gets_replicas_and_leaders_under_load(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory, tmp_path: Path) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("spread", partitions=6, replicas=2)
    replicas, _ = spread(cluster, "spread")
    assert sorted(replicas.values()) == [4, 4, 4]
    lk = cluster.lookupd.http_address
    load = Load(lk, "spread", 40, tmp_path)
    try:
        wait_until(lambda: load.acked() > 300, what="traffic before the node joins")
        new = cluster.add_node()
        t0 = time.monotonic()
        wait_until(lambda: len(cluster.stats()["nodes"]) == 4, what="the fourth node registered")
        new_id = cluster.node_id(new)

        def balanced() -> bool:
            reps, _ = spread(cluster, "spread")
            return reps[new_id] == 3 and sorted(reps.values()) == [3, 3, 3, 3] \
                and settled(cluster, "spread")

        wait_until(balanced, timeout=120, step=0.25, what="replicas spread onto the new node")
        took = time.monotonic() - t0
        replicas, leaders = spread(cluster, "spread")
        assert leaders[new_id] >= 1, leaders
        assert max(leaders.values()) <= 2, leaders
        assert cluster.role_of(new, "spread", next(
            p["partition"] for p in cluster.partitions("spread") if p["leader"] == new_id)) \
            == "leader"
        moves = cluster.stats()["rebalance_moves"]
        print(f"rebalance: {moves} moves onto the new node in {took:.2f} s; replicas "
              f"{dict(replicas)}, leaders {dict(leaders)}; acked so far {load.acked()}")
        n = load.acked()
        wait_until(lambda: load.acked() > n + 300, what="traffic after the rebalance")
        tally = load.finish()
    finally:
        load.stop()
    print(f"rebalance under load: {tally}")
    assert moves == 3, moves  # 4,4,4,0 -> 3,3,3,3: no move more than needed
    assert len(tally.acked) > 1000, str(tally)
    assert not tally.lost, f"lost acknowledged messages: {sorted(tally.lost)[:20]}"
    assert settled(cluster, "spread") and spread(cluster, "spread")[0] == replicas


def test_rebalance_can_be_turned_off(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                     lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(
        nodes=3, lookupd_args=["--cluster-rebalance=false"])
    cluster.create_topic("still", partitions=6, replicas=2)
    before = cluster.partitions("still")
    new = cluster.add_node()
    wait_until(lambda: len(cluster.stats()["nodes"]) == 4, what="the fourth node registered")
    time.sleep(3)  # several reconciling passes (every node registration is one)
    stats = cluster.stats()
    assert stats["rebalance"] is False and stats["rebalance_moves"] == 0
    assert cluster.partitions("still") == before
    assert cluster.node_id(new) not in spread(cluster, "still")[0]
