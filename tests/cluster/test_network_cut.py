"""A network cut between a partition's leader and the rest of the cluster, under pynsq load.

Every nsqd sits behind fault-injecting TCP proxies (``tests/support/faultproxy.py``): one
for its TCP port, one for its HTTP port and one for its cluster listener, registered in
etcd as its broadcast ports (so followers fetch, nodes forward and clients connect through
them), and one on its way to etcd. A cycle cuts the leader's HTTP and cluster proxies (its
followers can no longer fetch) and its etcd
proxy (it can neither keep its lease nor change its ISR) while its TCP proxy stays open,
so the pynsq producer keeps publishing to it: the case where an isolated leader could
acknowledge what nobody else has. The cut alternates between dropping bytes (peers learn
only through their timeouts) and refusing connections, and lasts past the node lease and
the ISR lag timeout; then it heals.

Checked: the isolated leader's acknowledged end stays frozen for the whole cut (min ISR:
it acks nothing its followers lack, and cannot shrink its ISR without etcd); the others
elect a new leader with a higher epoch and publishes succeed again during the cut; after
healing the old leader is fenced by the epoch, truncates its unacknowledged tail and
rejoins the ISR; at the end every acknowledged message was consumed (0 lost) and is in the
final leader's log, and every replica holds the same log. Consumers of the isolated leader
are delivered nothing past its acknowledged end (the high watermark): every consumed message
was acknowledged or is in the final log.

CI runs NSQX_CHAOS_CYCLES=2 cycles (~1 min); more with e.g. NSQX_CHAOS_CYCLES=10.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.chaos_check import Load
from tests.cluster.test_cluster_processes import fetch_bodies
from tests.support.cluster import Cluster, wait_until
from tests.support.faultproxy import FaultProxy, free_port

pytestmark = [pytest.mark.slow, pytest.mark.compat]

CYCLES = int(os.environ.get("NSQX_CHAOS_CYCLES", "2"))
HOLD = 8.0  # seconds a cut lasts: past the node lease (3 s) and the ISR lag timeout (3 s)


class ProxiedNode:
    def __init__(self, cluster: Cluster, etcd_port: int) -> None:
        tcp, http = free_port(), free_port()
        self.tcp = FaultProxy(tcp, name="tcp").start()
        self.http = FaultProxy(http, name="http").start()
        self.etcd = FaultProxy(etcd_port, name="etcd").start()
        internal = free_port()  # the cluster listener (replication) is cut with HTTP
        self.internal = FaultProxy(internal, name="cluster").start()
        self.proc = cluster.add_node(
            [f"--broadcast-tcp-port={self.tcp.port}", f"--broadcast-http-port={self.http.port}",
             f"--cluster-address=127.0.0.1:{internal}",
             f"--broadcast-cluster-port={self.internal.port}"],
            ports=(tcp, http), etcd_endpoint=f"http://{self.etcd.address}")
        self.id = ""

    def cut(self, mode: str) -> None:
        self.http.cut(mode)
        self.internal.cut(mode)
        self.etcd.cut(mode)

    def heal(self) -> None:
        self.http.heal()
        self.internal.heal()
        self.etcd.heal()

    def stop(self) -> None:
        for p in (self.tcp, self.http, self.internal, self.etcd):
            p.stop()


def leader_view(cluster: Cluster, node: ProxiedNode, topic: str) -> dict:
    """The node's own view of the partition (asked directly, not through its proxies)."""
    for p in cluster.state(node.proc)["partitions"]:
        if p["topic"] == topic and p["partition"] == 0:
            return p
    return {}


def test_network_cut_of_the_leader_loses_nothing(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                                 lookupd_factory, tmp_path: Path) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=0)
    etcd_port = urllib.parse.urlsplit(etcd_server.endpoint).port
    assert etcd_port
    nodes = [ProxiedNode(cluster, etcd_port) for _ in range(3)]
    try:
        wait_until(lambda: len(cluster.stats()["nodes"]) == 3, what="3 nodes registered")
        by_id = {}
        for n in nodes:
            n.id = cluster.node_id(n.proc)
            by_id[n.id] = n
        # the cluster knows each node by its proxies: peers and clients go through them
        registered = {r["id"]: r for r in cluster.stats()["nodes"]}
        for n in nodes:
            assert registered[n.id]["http_address"] == n.http.address
            assert registered[n.id]["tcp_address"] == n.tcp.address
        cluster.create_topic("cut", partitions=1, replicas=3)
        load = Load(cluster.lookupd.http_address, "cut", 6 + CYCLES * (HOLD + 10), tmp_path)
        try:
            wait_until(lambda: load.acked() > 200, what="traffic before the first cut")
            for cycle in range(CYCLES):
                mode = ("drop", "refuse")[cycle % 2]
                before = cluster.partitions("cut")[0]
                old = by_id[before["leader"]]
                t0 = time.monotonic()
                old.cut(mode)
                time.sleep(1.0)  # acks in flight when the cut began are settled
                frozen = leader_view(cluster, old, "cut")
                assert frozen["role"] == "leader", frozen
                wait_until(lambda e=before["epoch"], o=old.id:
                           (p := cluster.partitions("cut")[0])["epoch"] > e
                           and p["leader"] not in (None, o), timeout=30,
                           what=f"cycle {cycle}: a new leader on the other side of the cut")
                failover = time.monotonic() - t0
                n = load.acked()
                wait_until(lambda n=n: load.acked() > n + 100, timeout=30,
                           what=f"cycle {cycle}: publishes succeed again during the cut")
                recovered = time.monotonic() - t0
                time.sleep(max(0.0, HOLD - (time.monotonic() - t0)))
                # all along the cut the isolated leader acknowledged nothing more
                still = leader_view(cluster, old, "cut")
                assert still["role"] == "leader" and still["epoch"] == before["epoch"], still
                assert still["acked_end"] == frozen["acked_end"], (frozen, still)
                # its consumers were handed nothing beyond that end (the high watermark)
                assert still["readable_end"] <= still["acked_end"], still
                unacked_tail = still["log_end"] - still["acked_end"]
                assert not cluster.state(old.proc)["etcd_ok"]
                old.heal()
                t1 = time.monotonic()
                wait_until(lambda o=old.id: o in cluster.partitions("cut")[0]["isr"],
                           timeout=40, what=f"cycle {cycle}: the old leader back in the ISR")
                after = cluster.partitions("cut")[0]
                view = leader_view(cluster, old, "cut")
                # fenced: it follows the new epoch, unless (as the preferred replica) it got
                # its leadership back at once, with a newer epoch still
                if view["epoch"] != after["epoch"]:
                    after = cluster.partitions("cut")[0]
                role = "leader" if after["leader"] == old.id else "follower"
                assert view["role"] == role and view["epoch"] == after["epoch"], (view, after)
                assert after["epoch"] > before["epoch"]
                print(f"cycle {cycle} ({mode}): new leader {failover:.2f} s after the cut, "
                      f"publishes acked again after {recovered:.2f} s; isolated leader's acked "
                      f"end frozen at {frozen['acked_end']} with {unacked_tail} unacked records "
                      f"behind it; rejoined {time.monotonic() - t1:.2f} s after healing")
                time.sleep(2)
            tally = load.finish()
        finally:
            load.stop()
        print(f"network cut: {tally}")
        assert len(tally.acked) > 500, str(tally)
        assert not tally.lost, f"lost acknowledged messages: {sorted(tally.lost)[:20]}"
        assert tally.duplicates <= CYCLES * 600, str(tally)
        # every acknowledged message is in the final leader's log, and every replica has it
        p = cluster.partitions("cut")[0]
        leader_log = fetch_bodies(cluster.node_by_id(p["leader"]), "cut")
        assert tally.acked <= {int(b) for b in leader_log}
        # consumers (some on the isolated leader during the cuts) saw only acknowledged
        # messages or ones the final log kept: never a tail that was truncated
        phantom = set(tally.seen) - tally.acked - {int(b) for b in leader_log}
        assert not phantom, f"consumed but truncated: {sorted(phantom)[:20]} ({len(phantom)})"
        assert len(p["isr"]) == 3
        for r in p["replicas"]:
            wait_until(lambda r=r: fetch_bodies(cluster.node_by_id(r), "cut") == leader_log,
                       what=f"{r} holds the leader's log")
        truncated = [n.id for n in nodes if b"truncating" in n.proc.log_bytes()]
        print(f"replicas that truncated a diverged tail: {truncated}")
    finally:
        for n in nodes:
            n.stop()
