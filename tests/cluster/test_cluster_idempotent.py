"""Publishing once through a cluster leader's kill -9: idempotent ClusterProducers and
curl-style HTTP retries with an Idempotency-Key (also through followers, which forward the
key), deferred publishes among them, checked record by record: 0 lost, 0 duplicated."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from nsqx.client import ClusterProducer
from nsqx.cluster.etcd_server import EtcdServer
from tests.support.cluster import Cluster, http, wait_until
from tests.support.log_checker import lost_and_duplicated, stored

pytestmark = pytest.mark.slow


def _committed(cluster: Cluster, topic: str, partitions: int) -> list[bytes]:
    out: list[bytes] = []
    for part in range(partitions):
        leader = wait_until(lambda part=part: cluster.leader(topic, part), what="leader")
        out += [b for b, _ in stored(leader.http_address, topic, part)]
    return out


def test_kill9_of_a_leader_while_producers_publish_and_retry(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("once", partitions=2, replicas=3)
    victim = cluster.leader("once", 0)
    tcp_total, workers = 400, 4
    sent: list[bytes] = []
    http_sent: list[bytes] = []
    http_replays = 0
    stop_http = threading.Event()

    def http_client() -> None:
        """curl with retries: each request sent again (same key) until it gets a 200, to
        any node that is up (a follower forwards it to the partition's leader)."""
        nonlocal http_replays
        i = 0
        while not stop_http.is_set() or i < 40:
            body = b"http-%d" % i
            key = f"req-{i}"
            tries = 0
            while True:
                nodes = [n for n in cluster.nodes if n.is_running()]
                node = random.choice(nodes)
                try:
                    # every 5th deferred: a follower forwards its key and its delay
                    defer = "&defer=3600000" if i % 5 == 0 else ""
                    code, _ = http("POST", f"http://{node.http_address}/pub?topic=once{defer}",
                                   body, timeout=10, headers={"Idempotency-Key": key})
                except OSError:
                    code = 0
                tries += 1
                if code == 200 and tries >= 2:  # every request is also retried once after success
                    break
                if code == 200:
                    http_replays += 1
                    continue
                assert code in (0, 503), code
                time.sleep(0.2)
            http_sent.append(body)
            i += 1

    async def worker(p: ClusterProducer, w: int) -> None:
        for i in range(tcp_total // workers):
            body = b"w%d-%d" % (w, i)
            if i % 10 == 0:  # deferred ones are idempotent too (PUB_EXT, ##nsqx_defer)
                await p.dpublish("once", 3600, body, key=f"k{w}-{i % 7}")
            else:
                await p.publish("once", body, key=f"k{w}-{i % 7}")
            sent.append(body)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        async with ClusterProducer([cluster.lookupd.http_address], wait_timeout=90) as p:
            tasks = [asyncio.create_task(worker(p, w)) for w in range(workers)]
            while len(sent) < tcp_total // 3:
                await asyncio.sleep(0.01)
            await loop.run_in_executor(None, victim.kill)
            await asyncio.gather(*tasks)
            return p.retries

    t = threading.Thread(target=http_client, daemon=True)
    t.start()
    retries = asyncio.run(main())
    stop_http.set()
    t.join(180)
    assert not t.is_alive()
    assert retries > 0  # publishes were sent again to the new leader
    got = _committed(cluster, "once", 2)
    assert len(sent) == tcp_total
    lost, dup = lost_and_duplicated(sent + http_sent, got)
    assert (lost, dup) == ([], [])
    assert len(got) == len(sent) + len(http_sent)
    # some keyed HTTP requests reached followers, which forwarded them with their key
    assert sum(cluster.state(n)["forwarded"] for n in cluster.nodes if n.is_running()) > 0
    # a late retry of every HTTP request, to the nodes alive now: all answered, none stored
    for i, body in enumerate(http_sent):
        node = cluster.nodes[i % len(cluster.nodes)]
        if not node.is_running():
            continue
        defer = "&defer=3600000" if i % 5 == 0 else ""
        code, _ = http("POST", f"http://{node.http_address}/pub?topic=once{defer}", body,
                       headers={"Idempotency-Key": f"req-{i}"})
        assert code == 200
    assert len(_committed(cluster, "once", 2)) == len(got)
