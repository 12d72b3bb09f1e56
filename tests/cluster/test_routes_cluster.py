"""Route-managed ordered topics in a cluster (nsqx.cluster.route_coord, route_store, the
member's seal and barrier passes): created and changed through nsqlookupd, stored in etcd,
sealed by the retired partitions' leaders, learnt by every node from its watch."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.cluster.routes import RouteHistory
from nsqx.protocol import v2
from tests.support.cluster import Cluster, http, wait_until
from tests.support.rawclient import RawClient

pytestmark = [pytest.mark.slow]


def lk(cluster: Cluster, method: str, path: str, **params: object) -> tuple[int, dict]:
    q = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
    return http(method, f"http://{cluster.lookupd.http_address}{path}?{q}", timeout=60)


def node_route(n, topic: str) -> dict:  # type: ignore[no-untyped-def]
    code, body = http("GET", f"http://{n.http_address}/topic/route?topic={topic}")
    assert code == 200, body
    return body


def test_lookupd_route_api_changes_and_refusals(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                               lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    code, body = lk(cluster, "POST", "/topic/create", topic="r", partition_num=2, replicator=2,
                    orderedmulti="true", logical=64)
    assert code == 200, body
    assert [r[:3] for r in body["route"]["versions"][0]["routes"]] == [[0, 32, 0], [32, 64, 1]]
    # the same shape again is a no-op; another is refused
    assert lk(cluster, "POST", "/topic/create", topic="r", partition_num=2, replicator=2,
              logical=64)[0] == 200
    code, body = lk(cluster, "POST", "/topic/create", topic="r", partition_num=2, replicator=2,
                    logical=32)
    assert code == 400 and "already exists" in body["detail"], body
    wait_until(lambda: all(cluster.role_of(cluster.node_by_id(p["leader"]), "r", p["partition"])
                           == "leader" for p in cluster.partitions("r")), what="leaders")
    code, h = lk(cluster, "GET", "/topic/route", topic="r")
    assert code == 200 and set(h["leaders"]) == {"0", "1"}, h
    RouteHistory.from_json(json.dumps(h))  # nsqd's shape, plus leaders
    # bad input: 400 with the rule's text
    for path, params, text in [
        ("/topic/split", {"partition": 0, "at": 32}, "boundary must be strictly inside"),
        ("/topic/split", {"partition": 0}, "MISSING_ARG_AT"),
        ("/topic/merge", {"a": 0, "b": 0}, "cannot merge partition 0 with itself"),
        ("/topic/move", {"partition": 0, "node": "nowhere:1:2"}, "is not a live node"),
        ("/topic/split", {"partition": 9, "at": 3}, "(unknown)"),
    ]:
        code, body = lk(cluster, "POST", path, topic="r", **params)
        assert code == 400 and text in body["message"], (path, params, body)
    code, body = lk(cluster, "POST", "/topic/split", topic="nope", partition=0, at=3)
    assert code == 400 and "not a route-managed topic" in body["message"], body
    # a cluster node refuses to change the route itself
    n0 = cluster.nodes[0]
    code, body = http("POST", f"http://{n0.http_address}/topic/split?topic=r&partition=0&at=8")
    assert code == 400 and "through nsqlookupd" in body["message"], body

    old_leader = cluster.node_by_id(cluster.partitions("r")[0]["leader"])
    # split 0 -> 2, 3 (on 0's leader); merge non-adjacent 2 + 1 refused; merge 3 + 1 -> 4;
    # move 4 to a node that is not its leader -> 5
    code, body = lk(cluster, "POST", "/topic/split", topic="r", partition=0, at=16)
    assert code == 200, body
    assert [x[:3] for x in body["versions"][1]["routes"]] == [[0, 16, 2], [16, 32, 3], [32, 64, 1]]
    assert body["pending"] is None
    with RawClient(old_leader.tcp_address) as c:  # the sealed partition refuses, naming v1
        c.send(b"PUB r 0 1\n" + (1).to_bytes(4, "big") + b"x")
        assert "route version 1 " in c.expect_error("E_BAD_PARTITION")
    code, body = lk(cluster, "POST", "/topic/merge", topic="r", a=2, b=1)
    assert code == 400 and "not adjacent" in body["message"], body
    code, body = lk(cluster, "POST", "/topic/merge", topic="r", a=3, b=1)
    assert code == 200, body
    leader4 = next(p for p in cluster.partitions("r") if p["partition"] == 4)["leader"]
    target = next(n for n in (cluster.node_id(x) for x in cluster.nodes) if n != leader4)
    tcp = cluster.node_by_id(target).tcp_address  # a node may be named by its TCP address
    code, body = lk(cluster, "POST", "/topic/move", topic="r", partition=4, node=tcp)
    assert code == 200, body
    assert [x[2:] for x in body["versions"][3]["routes"]] == [[2, body["versions"][1]["routes"][0][3]],
                                                              [5, target]]
    # every node learnt version 3 through its member's watch
    for n in cluster.nodes:
        wait_until(lambda n=n: len(node_route(n, "r")["versions"]) == 4, what="v3 on nodes")
    parts = {p["partition"]: p for p in cluster.partitions("r")}
    assert set(parts) == {0, 1, 2, 3, 4, 5} and parts[5]["leader"] == target
    # a keyed publish with the new version lands on the new partition's leader
    with RawClient(cluster.node_by_id(target).tcp_address) as c:
        c.send(b"PUB r 5 3\n" + (1).to_bytes(4, "big") + b"y")
        c.expect_ok()
    with RawClient(cluster.node_by_id(parts[4]["leader"]).tcp_address) as c:
        c.send(v2.pub("r", b"z", partition=4))
        assert "route version 3 " in c.expect_error("E_BAD_PARTITION")
