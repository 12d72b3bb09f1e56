"""A publish sent to a follower while its leader is failing over (issue 28 defect 2).

It used to keep forwarding to the dead leader until its 10 s ran out (503 E_PUB_FAILED),
although the follower itself had become the leader seconds earlier. Now each retry follows
the partition's metadata: the publish lands on the new leader, or here once this node
leads, and is acknowledged as soon as a leader exists.
"""

from __future__ import annotations

import threading
import time

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.test_cluster_processes import fetch_bodies, pub
from tests.support.cluster import Cluster, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def test_publish_to_followers_during_failover_follows_the_new_leader(cluster: Cluster) -> None:
    cluster.create_topic("orders", partitions=1, replicas=3)
    leader = cluster.leader("orders")
    leader_id = cluster.node_id(leader)
    followers = [n for n in cluster.nodes if n is not leader]
    assert pub(followers[0], "orders", b"before") == (200, "OK")
    for f in followers:
        wait_until(lambda f=f: fetch_bodies(f, "orders") == [b"before"], what="caught up")

    answers: dict[int, tuple[int, object]] = {}

    def send(i: int) -> None:
        answers[i] = pub(followers[i], "orders", b"during-%d" % i)

    leader.kill()
    t0 = time.monotonic()
    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:  # both sent while the dead leader is still the partition's leader
        t.start()
    assert cluster.partitions("orders")[0]["leader"] in (leader_id, None)
    new_leader = wait_until(lambda: (p := cluster.partitions("orders")[0])["leader"] not in
                            (None, leader_id) and cluster.node_by_id(p["leader"]),
                            what="a new leader")
    elected_s = time.monotonic() - t0
    for t in threads:
        t.join(30)
    print(f"new leader after {elected_s:.2f} s; answers {answers} after "
          f"{time.monotonic() - t0:.2f} s")
    # the follower's 10 s are counted from when it got the publish: a failover that took
    # longer on this loaded machine cannot be a success, and says so
    if elected_s > 9:
        pytest.skip(f"the failover itself took {elected_s:.1f} s (> the 10 s forward timeout)")
    assert answers == {0: (200, "OK"), 1: (200, "OK")}
    bodies = fetch_bodies(new_leader, "orders")
    assert bodies[0] == b"before" and sorted(bodies[1:]) == [b"during-0", b"during-1"]
