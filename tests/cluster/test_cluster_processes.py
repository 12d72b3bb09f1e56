"""Cluster mode with real processes: etcd, nsqlookupd and three nsqd.

Replication with ISR acks, refusal on followers, kill -9 of a leader (no acknowledged
message lost, the old leader rejoins as a follower), a topic created twice, and a node
drained under its partitions.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.support.cluster import Cluster, http, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def pub(node, topic: str, body: bytes) -> tuple[int, object]:  # type: ignore[no-untyped-def]
    return http("POST", f"http://{node.http_address}/pub?topic={urllib.parse.quote(topic)}", body,
                timeout=10)


def fetch_bodies(node, topic: str, partition: int = 0) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Every body in the node's log of a partition (the fetch API, no channel involved)."""
    import struct
    import urllib.request

    out: list[bytes] = []
    offset = 0
    while True:
        with urllib.request.urlopen(f"http://{node.http_address}/nsqx/fetch?topic={topic}&uncommitted=1"
                                    f"&partition={partition}&offset={offset}",
                                    timeout=10) as r:
            raw = r.read()
        head = struct.unpack(">4sBBHQIQQQI", raw[:48])
        count, nxt, frames_len = head[5], head[6], head[9]
        data = raw[48:48 + frames_len]
        pos = 0
        while pos < len(data):
            size = struct.unpack(">I", data[pos:pos + 4])[0]
            out.append(data[pos + 34:pos + 4 + size])
            pos += 4 + size
        if count == 0:
            return out
        offset = nxt


def test_replicated_publish_failover_and_rejoin(cluster: Cluster) -> None:
    info = cluster.create_topic("events", partitions=1, replicas=3)
    assert len(info["partitions"][0]["isr"]) == 3
    lookup = cluster.lookup("events")
    assert lookup["meta"]["partition_num"] == 1 and len(lookup["producers"]) == 1
    leader = cluster.leader("events")
    assert lookup["producers"][0]["http_port"] == leader.http_port
    followers = [n for n in cluster.nodes if n is not leader]

    acked: list[bytes] = []
    for i in range(200):
        body = b"m%05d" % i
        code, resp = pub(leader, "events", body)
        assert code == 200, resp
        acked.append(body)
    # a follower forwards a publish to the leader and answers once the leader acked it
    assert pub(followers[0], "events", b"via-follower") == (200, "OK")
    acked.append(b"via-follower")
    # a name unknown to the cluster is refused everywhere: nothing is acknowledged unreplicated
    assert pub(leader, "not-created", b"x") == (503, {"message": "E_PUB_FAILED"})
    assert pub(followers[1], "not-created", b"x") == (503, {"message": "E_PUB_FAILED"})
    # every ISR member holds every acknowledged message
    for f in followers:
        wait_until(lambda f=f: fetch_bodies(f, "events")[:len(acked)] == acked,
                   what="follower caught up")

    leader_id = cluster.node_id(leader)
    t0 = time.monotonic()
    leader.kill()
    new_leader = wait_until(lambda: (p := cluster.partitions("events")[0])["leader"] not in
                            (None, leader_id) and cluster.node_by_id(p["leader"]),
                            what="a new leader")
    while pub(new_leader, "events", b"after-failover")[0] != 200:
        assert time.monotonic() - t0 < 30, "publishes never resumed"
        time.sleep(0.05)
    failover_s = time.monotonic() - t0
    acked.append(b"after-failover")
    p = cluster.partitions("events")[0]
    assert p["epoch"] == 2 and leader_id not in p["isr"] and leader_id in p["catchup"]
    print(f"failover: publishes resumed {failover_s:.2f} s after kill -9 of the leader")
    assert fetch_bodies(new_leader, "events")[:len(acked)] == acked  # 0 lost

    for i in range(50):
        body = b"n%05d" % i
        assert pub(new_leader, "events", body)[0] == 200
        acked.append(body)
    leader.restart(graceful=False)  # same data path: the same member comes back
    wait_until(lambda: leader_id in cluster.partitions("events")[0]["isr"], timeout=40,
               what="the old leader rejoined the ISR")
    assert fetch_bodies(leader, "events") == fetch_bodies(new_leader, "events")
    assert fetch_bodies(leader, "events")[:len(acked)] == acked


def test_topic_created_twice_with_another_shape_is_refused(cluster: Cluster) -> None:
    base = f"http://{cluster.lookupd.http_address}/topic/create?topic=orders"
    code, body = http("POST", base + "&partition_num=2&replicator=2")
    assert code == 200 and len(body["partitions"]) == 2
    code, body = http("POST", base + "&partition_num=2&replicator=2")
    assert code == 200  # same shape: harmless
    code, body = http("POST", base + "&partition_num=3&replicator=2")
    assert code == 400 and body["message"] == "E_TOPIC_EXISTS"
    assert "already exists with 2 partitions" in body["detail"]
    code, body = http("POST", f"http://{cluster.lookupd.http_address}/topic/create?topic=big"
                      "&partition_num=1&replicator=5")
    assert code == 400 and "more than the 3 live nodes" in body["detail"]
    for bad in ("partition_num=zero", "partition_num=0", "replicator=-1", "min_isr=9"):
        code, body = http("POST", f"http://{cluster.lookupd.http_address}/topic/create?topic=x"
                          f"&{bad}")
        assert code == 400 and body["message"] == "E_INVALID", (bad, body)
    code, body = http("POST", f"http://{cluster.lookupd.http_address}/topic/create?topic=bad%20name")
    assert code == 400 and body["message"] == "E_INVALID"
    assert set(cluster.stats()["topics"]) == {"orders"}


def test_below_min_isr_publishes_fail_then_recover(cluster: Cluster) -> None:
    cluster.create_topic("safe", partitions=1, replicas=2)  # min ISR 2 of 2
    leader = cluster.leader("safe")
    assert pub(leader, "safe", b"a")[0] == 200
    follower_id = next(r for r in cluster.partitions("safe")[0]["replicas"]
                       if r != cluster.node_id(leader))
    follower = cluster.node_by_id(follower_id)
    follower.kill()
    # the follower's lease ends: it leaves the ISR and the leader refuses unsafe writes;
    # nothing is acknowledged with fewer than min ISR replicas
    acked_during_outage = []
    deadline = time.monotonic() + 30
    while True:
        code, _ = pub(leader, "safe", b"during")
        if code == 503:
            break
        acked_during_outage.append(code)
        assert time.monotonic() < deadline, "publishes were never refused below min ISR"
    assert acked_during_outage == []  # the first publish after the kill already failed
    assert pub(leader, "safe", b"still-refused") == (503, {"message": "E_PUB_FAILED"})
    follower.restart(graceful=False)
    wait_until(lambda: pub(leader, "safe", b"b")[0] == 200, timeout=40,
               what="publishes accepted again once the follower rejoined")
    assert cluster.node_id(follower) in cluster.partitions("safe")[0]["isr"]
    bodies = fetch_bodies(follower, "safe")
    assert bodies[0] == b"a" and bodies[-1] == b"b"


def test_malformed_and_stale_replication_traffic(cluster: Cluster) -> None:
    """Bad fetches get clear errors and touch nothing; a claim of an old epoch is refused."""
    cluster.create_topic("guarded", partitions=1, replicas=3)
    leader = cluster.leader("guarded")
    for i in range(5):
        assert pub(leader, "guarded", b"g%d" % i)[0] == 200
    epoch = cluster.partitions("guarded")[0]["epoch"]
    follower = next(n for n in cluster.nodes if n is not leader)
    fid = cluster.node_id(follower)  # signed as a real follower: a member's credential
    ok = {"topic": "guarded", "partition": 0, "epoch": epoch, "node": fid}
    for query, code in [
        ({"topic": "guarded"}, 400),                                  # no epoch
        ({"topic": "guarded", "partition": "x", "epoch": epoch}, 400),
        ({**ok, "offset": "abc"}, 400),
        (ok, 400),                                                    # no offset
        ({**ok, "offset": 99999}, 416),                               # beyond the log
        ({**ok, "offset": -5}, 416),
        ({**ok, "epoch": epoch - 1, "offset": 0}, 409),               # stale epoch
        ({**ok, "epoch": epoch + 7, "offset": 0}, 409),               # made up epoch
        ({**ok, "topic": "nope", "offset": 0}, 409),
        ({**ok, "partition": 9, "offset": 0}, 409),
    ]:
        got, body = cluster.internal(leader, "GET", "/nsqx/replica/fetch", query, as_node=fid)
        assert got == code, (query, got, body)
    epochs = "/nsqx/replica/epochs"
    got, body = cluster.internal(leader, "GET", epochs, {**ok, "epoch": epoch - 1}, as_node=fid)
    assert got == 409 and body["message"] == "E_STALE_EPOCH" and body["leader_epoch"] == epoch
    got, body = cluster.internal(leader, "GET", epochs, ok, as_node=fid)
    assert got == 200 and body["end"] == 5 and body["spans"][-1][0] == epoch
    # a follower's node is not a leader: it refuses every fetch
    got, _ = cluster.internal(follower, "GET", "/nsqx/replica/fetch", {**ok, "offset": 0},
                              as_node=fid)
    assert got == 409
    # nothing above disturbed the partition: still led, same epoch, whole ISR, data intact
    p = cluster.partitions("guarded")[0]
    assert p["epoch"] == epoch and len(p["isr"]) == 3
    assert pub(leader, "guarded", b"after")[0] == 200
    assert fetch_bodies(leader, "guarded") == [b"g0", b"g1", b"g2", b"g3", b"g4", b"after"]


def test_several_partitions_spread_over_leaders(cluster: Cluster) -> None:
    """A 3-partition topic: each node leads one; stock PUB/SUB on a node use what it leads."""
    from nsqx.protocol import v2
    from tests.support.rawclient import RawClient

    cluster.create_topic("multi", partitions=3, replicas=2)
    parts = cluster.partitions("multi")
    assert len({p["leader"] for p in parts}) == 3  # leaders spread over the nodes
    lookup = cluster.lookup("multi")
    assert lookup["meta"]["partition_num"] == 3 and len(lookup["producers"]) == 3
    assert set(lookup["partitions"]) == {"0", "1", "2"}
    sent = []
    for i, n in enumerate(cluster.nodes):
        for j in range(10):
            body = b"n%d-%d" % (i, j)
            assert pub(n, "multi", body)[0] == 200  # routed to the partition n leads
            sent.append(body)
    got = []
    for n in cluster.nodes:
        with RawClient(n.tcp_address) as c:
            c.send(v2.sub("multi", "c"))
            c.expect_ok()
            c.send(v2.rdy(100))
            for m in c.read_messages(10):
                got.append(m.body)
                c.send(v2.fin(m.id))
            c.expect_nothing(0.3)
    assert sorted(got) == sorted(sent)
    # kill the leader of partition 1: its follower takes over; its messages are all there
    victim = cluster.node_by_id(parts[1]["leader"])
    victim.kill()
    new = wait_until(lambda: (p := cluster.partitions("multi")[1])["leader"] not in
                     (None, parts[1]["leader"]) and cluster.node_by_id(p["leader"]),
                     what="partition 1 failed over")
    assert cluster.partitions("multi")[1]["epoch"] == 2
    vi = cluster.nodes.index(victim)
    assert sorted(fetch_bodies(new, "multi", 1)) == sorted(b"n%d-%d" % (vi, j) for j in range(10))
    assert pub(new, "multi", b"after")[0] == 200  # the new leader takes publishes


def test_topic_cli_in_cluster_mode(cluster: Cluster) -> None:
    import subprocess
    import sys

    lk = f"--lookupd-http-address={cluster.lookupd.http_address}"

    def nsqx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", *args],
                              capture_output=True, text=True, timeout=30)

    out = nsqx("topic", "create", "clitopic", "--partitions", "2", "--replicas", "2", lk)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("topic clitopic: 2 partitions, leaders ")
    out = nsqx("topic", "describe", "clitopic", lk)
    assert out.returncode == 0, out.stderr
    assert "topic clitopic: 2 partitions x 2 replicas, min ISR 2" in out.stdout
    assert out.stdout.count(" epoch 1 ") == 2
    out = nsqx("topic", "create", "clitopic", "--partitions", "3", lk)
    assert out.returncode == 1 and "E_TOPIC_EXISTS" in out.stderr


def test_ordered_topics_cursors_ride_with_every_fetch(cluster: Cluster) -> None:
    """Followers of an ordered topic learn its channels' cursors with every fetch answer
    (an idle long poll lasts at most 0.1 s), so a failover redelivers at most that much of
    an ordered channel; other topics carry cursors once a second."""
    cluster.create_topic("ord", partitions=1, replicas=3, extra="&orderedmulti=true")
    cluster.create_topic("plain", partitions=1, replicas=3)
    for name in ("ord", "plain"):
        leader = cluster.leader(name)
        assert http("POST", f"http://{leader.http_address}/channel/create?topic={name}"
                            f"&channel=c")[0] == 200
        epoch = cluster.partitions(name)[0]["epoch"]
        # signed as a real follower (only registered members' fetches are served); its own
        # fetches share the once-a-second cursor clock, so the first probe waits for cursors
        fid = cluster.node_id(next(n for n in cluster.nodes if n is not leader))
        query = {"topic": name, "partition": 0, "epoch": epoch, "node": fid, "offset": 0,
                 "wait_ms": 0}

        def head(leader=leader, query=query, fid=fid) -> dict:  # type: ignore[no-untyped-def]
            got, raw = cluster.internal(leader, "GET", "/nsqx/replica/fetch", query, as_node=fid)
            assert got == 200, raw
            return raw if isinstance(raw, dict) else json.loads(raw.split("\n", 1)[0])

        def with_cursors(head=head) -> dict | None:  # type: ignore[no-untyped-def]
            h = head()
            return h if "channels" in h else None

        heads = [wait_until(with_cursors, timeout=5, what="a fetch answer with cursors")]
        t0 = time.monotonic()
        heads.append(head())
        took = time.monotonic() - t0
        assert heads[0]["channels"] == {"c": 0}
        if name == "ord":
            assert heads[1]["channels"] == {"c": 0}
        elif took < 0.8:  # within the once-a-second period: no cursors the second time
            assert "channels" not in heads[1]
