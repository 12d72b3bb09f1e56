"""Deleting a topic in a cluster is a cluster operation (issue 28 defect 5).

``/topic/delete`` on nsqlookupd (Youzan's) or on any nsqd removes the topic from etcd and
every replica; a topic created again under the name starts empty on every replica, also
on one that was down during the delete.
"""

from __future__ import annotations

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.test_cluster_processes import fetch_bodies, pub
from tests.support.cluster import Cluster, http, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def local_topics(node) -> set[str]:  # type: ignore[no-untyped-def]
    code, body = http("GET", f"http://{node.http_address}/stats?format=json")
    assert code == 200, body
    return {t["topic_name"] for t in body["topics"]}


def gone_everywhere(cluster: Cluster, name: str, nodes=None) -> bool:  # type: ignore[no-untyped-def]
    return name not in cluster.stats()["topics"] and all(
        name not in local_topics(n) for n in (nodes or cluster.nodes))


def test_delete_is_a_cluster_operation_and_a_new_topic_starts_empty(cluster: Cluster) -> None:
    cluster.create_topic("gone", partitions=2, replicas=3)
    leader = cluster.leader("gone")
    for i in range(10):
        assert pub(leader, "gone", b"old-%d" % i)[0] == 200
    lk = cluster.lookupd.http_address
    assert http("POST", f"http://{lk}/topic/delete?topic=gone")[0] == 200
    wait_until(lambda: gone_everywhere(cluster, "gone"), what="deleted on every replica")

    cluster.create_topic("gone", partitions=1, replicas=3)  # another shape: a new topic
    assert pub(cluster.nodes[0], "gone", b"new")[0] == 200
    for n in cluster.nodes:
        wait_until(lambda n=n: fetch_bodies(n, "gone") == [b"new"], what="only the new message")

    # nsqd's /topic/delete on a follower is the same cluster operation
    follower = next(n for n in cluster.nodes if n is not cluster.leader("gone"))
    assert http("POST", f"http://{follower.http_address}/topic/delete?topic=gone")[0] == 200
    wait_until(lambda: gone_everywhere(cluster, "gone"), what="deleted on every replica")
    # idempotent, as nsqlookupd's (nsqadmin deletes there first, then on each node)
    assert http("POST", f"http://{follower.http_address}/topic/delete?topic=gone")[0] == 200


def test_a_replica_down_during_the_delete_drops_its_copy_when_back(cluster: Cluster) -> None:
    cluster.create_topic("again", partitions=1, replicas=3)
    leader = cluster.leader("again")
    for i in range(5):
        assert pub(leader, "again", b"old-%d" % i)[0] == 200
    away = next(n for n in cluster.nodes if n is not leader)
    wait_until(lambda: len(fetch_bodies(away, "again")) == 5, what="replicated")
    away.kill()
    lk = cluster.lookupd.http_address
    assert http("POST", f"http://{lk}/topic/delete?topic=again")[0] == 200
    live = [n for n in cluster.nodes if n is not away]
    wait_until(lambda: gone_everywhere(cluster, "again", live), what="deleted on live replicas")
    # the killed node's lease outlives it by its TTL: until it expires, placement may still
    # give the new topic a replica there, which would leave it below its min ISR
    wait_until(lambda: len(cluster.stats()["nodes"]) == 2, what="the killed node's lease gone")
    code, body = http("POST", f"http://{lk}/topic/create?topic=again&partition_num=1"
                      f"&replicator=2")
    assert code == 200, body
    new_leader = cluster.leader("again")
    # the new partition's leader may still be taking its role (503 until it has)
    wait_until(lambda: pub(new_leader, "again", b"new")[0] == 200, what="the new topic writable")
    away.restart(graceful=False)
    # its old copy is deleted on the way back: not served, not mistaken for a replica
    wait_until(lambda: "again" not in local_topics(away) or
               fetch_bodies(away, "again")[:1] != [b"old-0"], timeout=40,
               what="the old copy deleted")
    replicas = cluster.partitions("again")[0]["replicas"]
    if cluster.node_id(away) in replicas:
        wait_until(lambda: fetch_bodies(away, "again") == [b"new"], what="re-replicated")
    else:
        wait_until(lambda: "again" not in local_topics(away), what="no copy left")
