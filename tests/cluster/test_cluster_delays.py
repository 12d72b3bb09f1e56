"""A DPUB's delay survives a failover (real etcd, lookupd, 3 nsqd).

The leader stamps each deferred message's due time into the log (``##deliver_at_ms``),
so the follower that takes over defers it again instead of delivering it at once.
"""

from __future__ import annotations

import time

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.protocol import v2
from tests.support.cluster import Cluster, wait_until
from tests.support.rawclient import RawClient, consumer

pytestmark = pytest.mark.slow

DELAY_S = 20.0  # long enough that a slow failover under CI load still ends well before it


def test_a_deferred_message_is_not_delivered_early_after_failover(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("later", partitions=1, replicas=3)
    leader = cluster.leader("later")
    with consumer(leader.tcp_address, "later", "work", rdy=0):
        pass  # the channel exists (followers mirror it with the cursors)
    with RawClient(leader.tcp_address) as p:
        p.send(v2.pub("later", b"now"))
        p.expect_ok()
        p.send(v2.dpub("later", int(DELAY_S * 1000), b"due-later"))
        p.expect_ok()
    t_pub = time.monotonic()
    for n in cluster.nodes:  # every replica has both messages and the channel
        wait_until(lambda n=n: any(x["topic"] == "later" and x["log_end"] == 2
                                   for x in cluster.state(n)["partitions"]),
                   what="replicated")
    old = cluster.node_id(leader)
    leader.kill()
    new = wait_until(lambda: (p := cluster.partitions("later")[0])["leader"] not in (None, old)
                     and cluster.node_by_id(p["leader"]), what="a new leader")
    with consumer(new.tcp_address, "later", "work", rdy=10) as c:
        m = c.read_message()
        assert m.body == b"now"
        c.send(v2.fin(m.id))
        left = DELAY_S - (time.monotonic() - t_pub)
        assert left > 3, f"failover took too long to check anything ({left:.1f} s left)"
        c.expect_nothing(left - 2)  # not before its due time
        m = c.read_message(timeout=15)
        assert m.body == b"due-later"
        assert time.monotonic() - t_pub >= DELAY_S - 1
        c.send(v2.fin(m.id))
