"""nsqadmin's cluster views: the Cluster page, create-with-partitions, drain, and the
partition table on a topic's page -- all through nsqlookupd's public HTTP API.

Standalone (lookupd without cluster mode): the page says cluster mode is off and the API
answers 404 ``CLUSTER_MODE_OFF``; hostile input gets a 400 either way. Cluster mode: a real
etcd, nsqlookupd and three nsqd (slow), checked against lookupd's own ``/cluster/stats`` and
each node's ``/nsqx/cluster/state``.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest

from tests.admin.helpers import get_json, http, wait_for
from tests.support.cluster import Cluster

# (body, expected 400 code) -- refused by nsqadmin before lookupd is asked
HOSTILE_CREATES: list[tuple[Any, str]] = [
    ({"topic": "", "partitions": 2}, "INVALID_TOPIC"),
    ({"topic": "bad name", "partitions": 2}, "INVALID_TOPIC"),
    ({"topic": "../../etc", "partitions": 2}, "INVALID_TOPIC"),
    ({"topic": "x" * 65, "partitions": 2}, "INVALID_TOPIC"),
    ({"topic": "eph#ephemeral", "partitions": 2}, "INVALID_TOPIC"),
    ({"topic": ["t"], "partitions": 2}, "INVALID_TOPIC"),
    ({"partitions": 2}, "INVALID_TOPIC"),
    ({"topic": "t", "partitions": "two"}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": "1e3"}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": -1}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": 0}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": 10**30}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": "9" * 400}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": 1025}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": 2.5}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": True}, "INVALID_PARTITIONS"),
    ({"topic": "t", "partitions": 2, "replicas": 17}, "INVALID_REPLICAS"),
    ({"topic": "t", "partitions": 2, "replicas": "x"}, "INVALID_REPLICAS"),
    ({"topic": "t", "partitions": 2, "ordered": "yes"}, "INVALID_ORDERED"),
    (["t", 2], "INVALID_BODY"),
    (b"{not json", "INVALID_BODY"),
]
HOSTILE_NODES: list[tuple[str, Any, str]] = [
    ("a b", {"action": "drain"}, "INVALID_NODE"),
    ("x" * 300, {"action": "drain"}, "INVALID_NODE"),
    ("n<script>", {"action": "drain"}, "INVALID_NODE"),
    ("127.0.0.1:1:2", {"action": "explode"}, "INVALID_ACTION"),
    ("127.0.0.1:1:2", {}, "INVALID_ACTION"),
    ("127.0.0.1:1:2", b"[]", "INVALID_BODY"),
]


def _post(admin: Any, path: str, body: Any) -> Any:
    return http("POST", admin.url + path, body)


def _check_hostile(admin: Any) -> None:
    for body, code in HOSTILE_CREATES:
        r = _post(admin, "/api/cluster/topics", body)
        assert (r.status, r.json()) == (400, {"message": code}), (body, r.body)
    for node, body, code in HOSTILE_NODES:
        r = _post(admin, "/api/cluster/nodes/" + urllib.parse.quote(node, safe=""), body)
        assert (r.status, r.json()) == (400, {"message": code}), (node, body, r.body)


# ----------------------------------------------------------------------------- standalone

def test_standalone_lookupd_cluster_mode_off(cluster) -> None:
    admin = cluster.start_admin()
    r = http("GET", admin.url + "/cluster")
    assert r.status == 200
    html = r.body.decode()
    assert 'id="cluster-off"' in html and "Cluster mode is off" in html
    assert 'id="cluster-create-form"' not in html
    assert '>Cluster</a>' in html  # the nav entry
    r = http("GET", admin.url + "/api/cluster")
    assert (r.status, r.json()) == (404, {"message": "CLUSTER_MODE_OFF"})
    _check_hostile(admin)
    # valid requests: refused as cluster mode is off, and nothing was created in lookupd
    r = _post(admin, "/api/cluster/topics", {"topic": "t", "partitions": 2})
    assert (r.status, r.json()) == (404, {"message": "CLUSTER_MODE_OFF"})
    r = _post(admin, "/api/cluster/nodes/127.0.0.1%3A1%3A2", {"action": "drain"})
    assert (r.status, r.json()) == (404, {"message": "CLUSTER_MODE_OFF"})
    assert get_json(f"http://{cluster.lookupd.http_address}/topics")["topics"] == []
    # the topic page is unchanged: no partition table
    from tests.support import http_api
    http_api.mpub(cluster.nsqds[0].http_address, "plain", [b"a"])
    html = http("GET", admin.url + "/topics/plain").body.decode()
    assert "table partitions" not in html and "WARNING" not in html


def test_nsqd_mode_cluster_page_off(nsqd_factory, admin_factory) -> None:
    n = nsqd_factory.start()
    admin = admin_factory.start([f"--nsqd-http-address={n.http_address}"])
    html = http("GET", admin.url + "/cluster").body.decode()
    assert 'id="cluster-off"' in html and "--nsqd-http-address" in html
    assert http("GET", admin.url + "/api/cluster").status == 404


def test_cluster_api_needs_admin_and_csrf(cluster) -> None:
    admin = cluster.start_admin("--admin-user=alice")
    body = {"topic": "t", "partitions": 2}
    r = _post(admin, "/api/cluster/topics", body)
    assert (r.status, r.json()) == (403, {"message": "FORBIDDEN"})
    r = http("POST", admin.url + "/api/cluster/nodes/n1", {"action": "drain"},
             headers={"X-Forwarded-User": "alice", "Origin": "http://evil.example"})
    assert r.status == 403 and "CSRF" in r.json()["message"]


# ----------------------------------------------------------------------------- cluster mode

def start_admin(admin_factory: Any, c: Cluster) -> Any:
    return admin_factory.start([f"--lookupd-http-address={c.lookupd.http_address}",
                                "--http-client-request-timeout=5s"])


def lookupd_stats(c: Cluster) -> dict[str, Any]:
    return get_json(f"http://{c.lookupd.http_address}/cluster/stats?log_ends=true")


def publish_to_leaders(c: Cluster, topic: str, per_partition: int) -> int:
    """PUB to each partition's leader (a node PUBs to the partitions it leads)."""
    leaders = {p["leader"] for p in c.partitions(topic)}
    n = 0
    for lid in sorted(leaders):
        node = c.node_by_id(lid)
        led = sum(1 for p in c.partitions(topic) if p["leader"] == lid)
        for i in range(per_partition * led):
            r = http("POST", f"http://{node.http_address}/pub?topic={topic}", b"m%d" % i)
            assert r.status == 200, r.body
            n += 1
    return n


def in_sync(stats: dict[str, Any], topic: str) -> bool:
    parts = stats["topics"][topic]["partitions"]
    return all(p["leader"] and sorted(p["isr"]) == sorted(p["replicas"])
               and all(v == 0 for v in p["lag"].values()) for p in parts)


@pytest.mark.slow
def test_cluster_api_create_stats_drain(real_cluster: Cluster, admin_factory) -> None:
    c = real_cluster
    admin = start_admin(admin_factory, c)
    got = get_json(admin.url + "/api/cluster")
    want = lookupd_stats(c)
    assert got["coordinator"] == want["coordinator"] and got["coordinator"]
    assert sorted(n["id"] for n in got["nodes"]) == sorted(c.node_id(n) for n in c.nodes)
    _check_hostile(admin)
    assert lookupd_stats(c)["topics"] == {}  # nothing reached lookupd

    r = _post(admin, "/api/cluster/topics", {"topic": "parted", "partitions": "3",
                                             "replicas": 2})
    assert r.status == 200, r.body
    placed = r.json()["partitions"]
    assert [p["partition"] for p in placed] == [0, 1, 2]
    t = lookupd_stats(c)["topics"]["parted"]
    assert (t["partition_num"], t["replica"], t["ordered"]) == (3, 2, False)
    assert [p["leader"] for p in t["partitions"]] == [p["leader"] for p in placed]
    # the same shape again is harmless; another shape is refused with lookupd's words
    assert _post(admin, "/api/cluster/topics", {"topic": "parted", "partitions": 3,
                                                "replicas": 2}).status == 200
    r = _post(admin, "/api/cluster/topics", {"topic": "parted", "partitions": 2})
    assert r.status == 400
    assert r.json()["message"] == ("E_TOPIC_EXISTS: topic parted already exists with 3 "
                                   "partitions x 2 replicas")
    # min ISR more than live nodes: lookupd's refusal, not a traceback
    r = _post(admin, "/api/cluster/topics", {"topic": "toobig", "partitions": 1,
                                             "replicas": 16})
    assert r.status == 400 and r.json()["message"].startswith("E_INVALID"), r.body
    r = _post(admin, "/api/cluster/topics", {"topic": "seq", "partitions": 2, "replicas": 2,
                                             "ordered": True})
    assert r.status == 200, r.body
    assert lookupd_stats(c)["topics"]["seq"]["ordered"] is True

    # log ends and lag: lookupd's numbers are each node's own
    wait_for(lambda: all(c.role_of(c.node_by_id(p["leader"]), "parted", p["partition"])
                         == "leader" for p in c.partitions("parted")), 30, what="leaders")
    sent = publish_to_leaders(c, "parted", 4)
    stats = wait_for(lambda: (s := lookupd_stats(c)) and in_sync(s, "parted") and s, 30,
                     what="every replica caught up")
    total = 0
    for p in stats["topics"]["parted"]["partitions"]:
        ends = p["log_end"]
        assert set(ends) == set(p["replicas"])
        for rid, end in ends.items():
            mine = [x for x in c.state(c.node_by_id(rid))["partitions"]
                    if x["topic"] == "parted" and x["partition"] == p["partition"]]
            assert mine and mine[0]["log_end"] == end
        total += ends[p["leader"]]
    assert total == sent == 12
    admin_view = get_json(admin.url + "/api/cluster")["topics"]["parted"]["partitions"]
    assert [p["log_end"] for p in admin_view] == [
        p["log_end"] for p in stats["topics"]["parted"]["partitions"]]

    # drain a leader through nsqadmin: marked draining, its replicas move away
    victim = stats["topics"]["parted"]["partitions"][0]["leader"]
    r = _post(admin, "/api/cluster/nodes/" + urllib.parse.quote(victim, safe=""),
              {"action": "drain"})
    assert r.status == 200 and r.json()["draining"] is True, r.body
    assert victim in lookupd_stats(c)["draining"]
    wait_for(lambda: all(victim not in p["replicas"]
                         for t in lookupd_stats(c)["topics"].values() for p in t["partitions"]),
             60, interval=0.5, what=f"{victim}'s replicas moved")
    r = _post(admin, "/api/cluster/nodes/" + urllib.parse.quote(victim, safe=""),
              {"action": "undrain"})
    assert r.status == 200 and victim not in lookupd_stats(c)["draining"]
    r = _post(admin, "/api/cluster/nodes/127.0.0.1%3A9%3A9", {"action": "drain"})
    assert r.status == 404 and r.json()["message"].startswith("NODE_NOT_FOUND"), r.body


def test_route_changes_go_through_lookupd_in_cluster_mode(real_cluster: Cluster,
                                                          admin_factory) -> None:
    """A cluster's route-managed topic is split and merged through nsqadmin: the change goes
    to lookupd's coordinator (a node would refuse it), a refusal comes back in its words."""
    c = real_cluster
    admin = start_admin(admin_factory, c)
    q = "topic=keyed&partition_num=1&replicator=2&orderedmulti=true&logical=16"
    code, body = c_http(c, "POST", f"/topic/create?{q}")
    assert code == 200, body
    wait_for(lambda: all(p["leader"] for p in c.partitions("keyed")), 30, what="leader")
    publish_to_leaders(c, "keyed", 1)  # nsqadmin finds the topic through its producers
    wait_for(lambda: get_json(admin.url + "/api/topics/keyed").get("nodes"), 30,
             what="topic registered")
    r = _post(admin, "/api/topics/keyed", {"action": "split", "partition": 0, "at": 8})
    assert r.status == 200, r.body
    assert r.json()["node"] == "nsqlookupd" and r.json()["version"] == 1
    route = get_json(f"http://{c.lookupd.http_address}/topic/route?topic=keyed")
    assert route["versions"][-1]["version"] == 1
    r = _post(admin, "/api/topics/keyed", {"action": "split", "partition": 1, "at": 12})
    assert r.status == 400 and "boundary" in r.json()["message"], r.body
    r = _post(admin, "/api/topics/keyed", {"action": "merge", "a": 1, "b": 2})
    assert r.status == 200 and r.json()["version"] == 2, r.body
    page = http("GET", admin.url + "/topics/keyed").body.decode()
    assert 'id="route-table"' in page and "v2" in page, page[-3000:]
    # a reset of a channel goes to lookupd's coordinator too (a node alone refuses it)
    for n in c.nodes:
        r = http("POST", f"http://{n.http_address}/channel/create?topic=keyed&channel=a")
        assert r.status == 200, r.body
    r = http("POST", f"http://{c.nodes[0].http_address}/channel/setoffset?topic=keyed"
             "&channel=a", b"earliest")
    assert r.status == 400 and "lookupd" in r.body.decode(), r.body
    r = _post(admin, "/api/topics/keyed/a", {"action": "reset", "position": "earliest"})
    assert r.status == 200, r.body
    doc = r.json()
    assert doc["route_version"] == 0, doc  # earliest walks the history from version 0
    assert {x["node"] for x in doc["results"]} == {
        f"nsqlookupd (partition {p})" for p in range(4)}, doc  # 0, split 1+2, merged 3
    r = _post(admin, "/api/topics/keyed/nope", {"action": "reset", "position": "earliest"})
    assert r.status == 404 and "CHANNEL_NOT_FOUND" in r.body.decode(), r.body


def c_http(c: Cluster, method: str, path: str) -> tuple[int, Any]:
    r = http(method, f"http://{c.lookupd.http_address}{path}")
    return r.status, r.json()
