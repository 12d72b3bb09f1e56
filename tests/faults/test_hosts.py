"""The namespace harness itself: nodes on their own addresses, and nftables cuts that bite."""

from __future__ import annotations

import pytest

from tests.faults.hosts import HostCluster
from tests.support.cluster import wait_until

pytestmark = [pytest.mark.slow]


def test_nodes_announce_their_own_addresses_and_cuts_bite(host_cluster: HostCluster) -> None:
    c = host_cluster
    registered = {r["id"]: r for r in c.stats()["nodes"]}
    for n in c.nodes:
        assert registered[c.node_id(n)]["http_address"] == f"{n.host.ip}:4151"
    c.create_topic("smoke")
    leader = c.leader("smoke")
    code, body = c.get(f"http://{leader.host.ip}:4151/pub?topic=smoke", "POST", b"hello")
    assert code == 200, body
    # a one-way block: the client no longer reaches the leader; healing brings it back
    c.net.block("client", leader.name)
    with pytest.raises(OSError):
        c.get(f"http://{leader.host.ip}:4151/ping", timeout=1)
    c.net.heal()
    wait_until(lambda: c.get(f"http://{leader.host.ip}:4151/ping", timeout=1)[0] == 200,
               what="the leader reachable again")
