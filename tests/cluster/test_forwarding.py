"""Any node of a cluster takes a publish for any topic (real etcd, lookupd, 3 nsqd).

A node leading none of a partitioned topic's partitions forwards each publish to the
leader of the partition it picked, headers and trace ids included, and answers once
that leader's ISR acked it; a topic's fsync policy (``syncdisk`` at create) reaches every
replica.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.parse
import urllib.request

import pytest

from nsqx.client import Producer
from nsqx.cluster.etcd_server import EtcdServer
from nsqx.protocol import v2
from tests.cluster.test_cluster_processes import fetch_bodies
from tests.support.cluster import Cluster, http, wait_until
from tests.support.log_checker import stored

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def test_a_node_leading_no_partition_forwards_every_kind_of_publish(cluster: Cluster) -> None:
    cluster.create_topic("multi", partitions=2, replicas=2)
    parts = cluster.partitions("multi")
    leaders = {p["leader"] for p in parts}
    outsider = next(n for n in cluster.nodes if cluster.node_id(n) not in leaders)

    sent: list[bytes] = []
    for i in range(10):  # stock HTTP /pub, no partition: spread over the partitions
        body = b"http-%d" % i
        code, resp = http("POST", f"http://{outsider.http_address}/pub?topic=multi", body)
        assert (code, resp) == (200, "OK"), resp
        sent.append(body)

    async def tcp() -> tuple[int, int]:
        async with Producer(outsider.tcp_address) as p:
            for i in range(10):
                await p.publish("multi", b"tcp-%d" % i)
            await p.publish("multi", b"to-p1", partition=1)
            await p.mpublish("multi", [b"mpub-a", b"mpub-b"], partition=0)
            await p.send_command(v2.pub_ext("multi", b"ext", {"color": "red"}, 1))
            traced = await p.send_command(v2.pub_trace("multi", 4242, b"traced", 0))
            await p.dpublish("multi", 0.05, b"deferred")
        _, tid, offset, _ = v2.parse_traced_response(traced)
        return tid, offset

    tid, traced_at = asyncio.run(tcp())
    assert cluster.state(outsider)["forwarded"] == 26  # messages, not commands
    sent += [b"tcp-%d" % i for i in range(10)]
    sent += [b"to-p1", b"mpub-a", b"mpub-b", b"ext", b"traced", b"deferred"]
    # an Idempotency-Key travels with the forward: the leader stores it once, and refuses
    # the key reused for another body with 422 (not a 503), as a standalone nsqd does
    url = f"http://{outsider.http_address}/pub?topic=multi"
    key = {"Idempotency-Key": "forwarded-key"}
    assert http("POST", url, b"keyed", headers=key) == (200, "OK")
    assert http("POST", url, b"keyed", headers=key) == (200, "OK")
    code, resp = http("POST", url, b"another body", headers=key)
    assert code == 422 and "IDEMPOTENCY_KEY_REUSED" in str(resp), (code, resp)
    sent.append(b"keyed")

    def on_leaders(p: int) -> list[bytes]:
        return fetch_bodies(cluster.node_by_id(parts[p]["leader"]), "multi", p)

    wait_until(lambda: sorted(on_leaders(0) + on_leaders(1)) == sorted(sent),
               what="every forwarded publish on a leader")
    assert b"to-p1" in on_leaders(1) and b"mpub-a" in on_leaders(0)
    assert b"traced" in on_leaders(0) and b"ext" in on_leaders(1)
    # the traced answer names the leader's offset of the message, and the trace id
    assert tid == 4242 and on_leaders(0)[traced_at] == b"traced"
    # headers made it into the leader's log
    leader1 = cluster.node_by_id(parts[1]["leader"])
    code, msg = http("GET", f"http://{leader1.http_address}/message/get?topic=multi&partition=1"
                     f"&search_mode=virtual_offset&search_pos={on_leaders(1).index(b'ext')}")
    assert code == 200 and msg["headers"] == {"color": "red"}, msg
    # each leader's followers hold what it acked
    for p in (0, 1):
        for r in parts[p]["replicas"]:
            n = cluster.node_by_id(r)
            wait_until(lambda n=n, p=p: fetch_bodies(n, "multi", p) == on_leaders(p),
                       what="replicas in step")


def test_topic_fsync_policy_reaches_every_replica(cluster: Cluster) -> None:
    cluster.create_topic("careful", partitions=1, replicas=3, extra="&syncdisk=1")
    cluster.create_topic("relaxed", partitions=1, replicas=3)
    for n in cluster.nodes:
        def policy(name: str, n=n) -> int:  # type: ignore[no-untyped-def]
            q = urllib.parse.urlencode({"format": "json", "topic": name})
            _, st = http("GET", f"http://{n.http_address}/stats?{q}")
            return st["topics"][0]["sync_every"]
        wait_until(lambda policy=policy: policy("careful") == 1, what="syncdisk=1 applied")
        assert policy("relaxed") == 2500  # the node's --sync-every
    leader = cluster.leader("careful")
    for i in range(20):
        assert http("POST", f"http://{leader.http_address}/pub?topic=careful", b"%d" % i)[0] == 200
    # acked = fsynced on every ISR member: a follower fetches past a batch (its ack) only
    # once its commit, fsync included, is done; with the node default (fsync every 2,500
    # messages or 2 s) nothing would be synced yet
    for n in cluster.nodes:
        _, doc = http("GET", f"http://{n.http_address}/nsqx/offsets?topic=careful"
                      "&uncommitted=1")
        (p,) = doc["partitions"]
        assert p["synced"] == p["latest"] == 20, (cluster.node_id(n), p)


def _post(url: str, body: bytes, key: str) -> tuple[int, str | None, bytes]:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Idempotency-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Idempotent-Replayed"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Idempotent-Replayed"), e.read()


def test_a_follower_answers_keyed_publishes_as_the_leader_does(cluster: Cluster) -> None:
    """A replay answered through a follower says ``Idempotent-Replayed: true``, as the
    leader's own answer does; a deferred keyed /pub is forwarded with its key and its
    delay, and its retry is stored once."""
    cluster.create_topic("fwdkeys", partitions=1, replicas=2)
    leader_id = cluster.partitions("fwdkeys")[0]["leader"]
    leader = cluster.node_by_id(leader_id)
    others = [n for n in cluster.nodes if cluster.node_id(n) != leader_id]
    for node in others:  # a replica and a node holding none: both forward
        base = f"http://{node.http_address}"
        k = cluster.node_id(node)
        assert _post(f"{base}/pub?topic=fwdkeys", b"p-" + k.encode(), "p-" + k) == \
            (200, None, b"OK")
        assert _post(f"{base}/pub?topic=fwdkeys", b"p-" + k.encode(), "p-" + k) == \
            (200, "true", b"OK")
        assert _post(f"{base}/mpub?topic=fwdkeys", b"m1\nm2", "m-" + k) == (200, None, b"OK")
        assert _post(f"{base}/mpub?topic=fwdkeys", b"m1\nm2", "m-" + k) == (200, "true", b"OK")
        url = f"{base}/pub?topic=fwdkeys&defer=3600000"
        assert _post(url, b"d-" + k.encode(), "d-" + k) == (200, None, b"OK")
        assert _post(url, b"d-" + k.encode(), "d-" + k) == (200, "true", b"OK")
        ext = f"{base}/pub_ext?topic=fwdkeys&ext=%7B%22%23%23trace_id%22%3A%227%22%7D"
        first = _post(ext, b"e-" + k.encode(), "e-" + k)
        assert first[:2] == (200, None) and b'"trace_id":"7"' in first[2], first
        assert _post(ext, b"e-" + k.encode(), "e-" + k) == (200, "true", first[2])
        # the Spark sink's keyed /nsqx/pub: its "duplicate" says it through a follower too
        sink = f"{base}/nsqx/pub?topic=fwdkeys&partition=0&writer=w&batch=1&task={k}"
        for duplicate in (False, True):
            code, answer = http("POST", sink, v2.mpub_body([b"s1-" + k.encode(),
                                                             b"s2-" + k.encode()]))
            assert code == 200 and answer["duplicate"] is duplicate, (code, answer)
        # the leader answers the same request the same way
        assert _post(f"http://{leader.http_address}/pub?topic=fwdkeys", b"p-" + k.encode(),
                     "p-" + k) == (200, "true", b"OK")
    expected = sorted(b for k in map(cluster.node_id, others)
                      for b in (b"p-" + k.encode(), b"m1", b"m2", b"d-" + k.encode(),
                                b"e-" + k.encode(), b"s1-" + k.encode(), b"s2-" + k.encode()))
    wait_until(lambda: sorted(fetch_bodies(leader, "fwdkeys", 0)) == expected,
               what="each keyed publish stored once on the leader")
    # the deferred ones carry their due time in the leader's log (a cluster's DPUB does),
    # the others none; nsqx's control headers are taken off, never stored
    for body, h in stored(leader.http_address, "fwdkeys", 0):
        assert ("##deliver_at_ms" in h) == body.startswith(b"d-"), (body, h)
        assert not {"##nsqx_defer", "##nsqx_ask_replayed"} & set(h), (body, h)
