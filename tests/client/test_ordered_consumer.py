"""Consumer on an ordered topic: every partition read, each in log order, no new option."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from nsqx.client import Consumer, Message
from nsqx.cluster.etcd_server import EtcdServer
from tests.client.helpers import run
from tests.support.cluster import Cluster
from tests.support.lookupd_process import LookupdFactory
from tests.support.nsqd_process import NsqdFactory, NsqdProcess

PARTITIONS = 3
PER_PARTITION = 20


def post(address: str, path: str, body: bytes = b"") -> None:
    req = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def make_ordered_topic(nsqd: NsqdProcess, topic: str) -> list[bytes]:
    """An ordered topic of PARTITIONS partitions; publishes ``p<k>-<i>`` to partition k."""
    post(nsqd.http_address,
         f"/topic/create?topic={topic}&partition_num={PARTITIONS}&orderedmulti=true")
    bodies = []
    for i in range(PER_PARTITION):
        for k in range(PARTITIONS):
            body = b"p%d-%03d" % (k, i)
            post(nsqd.http_address, f"/pub?topic={topic}&partition={k}", body)
            bodies.append(body)
    return bodies


def assert_each_partition_in_order(got: list[bytes]) -> None:
    for k in range(PARTITIONS):
        mine = [b for b in got if b.startswith(b"p%d-" % k)]
        assert mine == [b"p%d-%03d" % (k, i) for i in range(PER_PARTITION)], mine


def test_consumer_reads_every_partition_of_an_ordered_topic_in_order(nsqd: NsqdProcess) -> None:
    bodies = make_ordered_topic(nsqd, "ordered_c")

    async def main() -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        def handle(m: Message) -> None:
            got.append(m.body)
            if len(got) >= len(bodies):
                done.set()

        c = Consumer("ordered_c", "ch", handle, nsqd_tcp_addresses=nsqd.tcp_address,
                     max_in_flight=10)
        await c.start()
        try:
            async with asyncio.timeout(30):
                await done.wait()
            assert sorted(conn.partition for conn in c.connections) == list(range(PARTITIONS))
        finally:
            await c.close()
        return got

    got = run(main())
    assert sorted(got) == sorted(bodies)
    assert_each_partition_in_order(got)


@pytest.mark.slow
def test_consumer_reads_an_ordered_topic_of_a_cluster_through_lookupd(
        etcd_server: EtcdServer, nsqd_factory: NsqdFactory,
        lookupd_factory: LookupdFactory) -> None:
    """Partitions led by different nodes: each node answers SUB_ORDERED for the ones it
    leads and E_FAILED_ON_NOT_LEADER for the others, which the consumer skips."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=2)
    cluster.create_topic("ordered_cl", partitions=PARTITIONS, replicas=1,
                         extra="&orderedmulti=true")
    leaders = {cluster.node_id(cluster.leader("ordered_cl", k)) for k in range(PARTITIONS)}
    assert len(leaders) == 2  # the test needs partitions on both nodes
    bodies = []
    for i in range(PER_PARTITION):
        for k in range(PARTITIONS):
            body = b"p%d-%03d" % (k, i)
            post(cluster.leader("ordered_cl", k).http_address,
                 f"/pub?topic=ordered_cl&partition={k}", body)
            bodies.append(body)

    async def main() -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        def handle(m: Message) -> None:
            got.append(m.body)
            if len(got) >= len(bodies):
                done.set()

        async with Consumer("ordered_cl", "ch", handle, max_in_flight=10,
                            lookupd_http_addresses=cluster.lookupd.http_address):
            async with asyncio.timeout(60):
                await done.wait()
        return got

    got = run(main(), 90)
    assert sorted(got) == sorted(bodies)
    assert_each_partition_in_order(got)
