"""The consumers issue's features in cluster mode (real etcd, lookupd, 3 nsqd).

Dead letters (nsqd started with --max-attempts=2): the leader of a topic's partition moves a
message delivered too often to ``<topic>.dlq``, a cluster topic like any other: when another
node leads it the publish (its ``dlq_*`` headers included) is forwarded there and
acknowledged after that leader's ISR; only then is the message finished on its channel. A
dead-letter topic the cluster does not know refuses the publish, and the message stays in
flight (nothing lost) until it exists. Tracing into a cluster ``__trace`` topic, and a
leader's per-partition settings surviving a failover.
"""

from __future__ import annotations

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.protocol import v2
from tests.support.cluster import Cluster, http, wait_until
from tests.support.rawclient import RawClient, consumer, publish

pytestmark = pytest.mark.slow


def poison_twice(tcp: str, topic: str) -> None:
    with consumer(tcp, topic, "work", rdy=10) as c:
        for attempt in (1, 2):
            m = c.read_message()
            assert (m.body, m.attempts) == (b"poison", attempt)
            c.send(v2.req(m.id, 0))
        c.expect_nothing(1.0)  # no third delivery


def test_dead_letters_reach_the_dlq_topic_leader(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                                 lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(
        nodes=3, nsqd_args=["--max-attempts=2"])
    cluster.create_topic("jobs", partitions=1, replicas=3)
    leader = cluster.leader("jobs")
    # the dead-letter topic led by another node: the dead letter is forwarded
    others = [cluster.node_id(n) for n in cluster.nodes if n is not leader]
    cluster.create_topic("jobs.dlq", partitions=1, replicas=2)
    dlq_leader = cluster.leader("jobs.dlq")
    if dlq_leader is leader:  # make it another node
        code, body = http("POST", f"http://{cluster.lookupd.http_address}/topic/partition/move"
                          f"?topic=jobs.dlq&partition=0&move_leader=true&move_to={others[0]}")
        assert code == 200, body
        dlq_leader = wait_until(lambda: (n := cluster.leader("jobs.dlq")) is not leader and n,
                                what="dlq leadership moved")
    publish(leader.tcp_address, "jobs", [b"poison"])
    poison_twice(leader.tcp_address, "jobs")

    def dead_letter() -> dict | None:
        code, msg = http("GET", f"http://{dlq_leader.http_address}/message/get?topic=jobs.dlq"
                         "&search_mode=count&search_pos=0")
        return msg if code == 200 else None
    msg = wait_until(dead_letter, what="the dead letter on the dlq topic's leader")
    h = msg["headers"]
    assert msg["body"] == "poison"
    assert (h["dlq_topic"], h["dlq_channel"], h["dlq_attempts"], h["dlq_reason"]) == (
        "jobs", "work", "2", "req")
    assert cluster.state(leader)["forwarded"] == 1
    code, st = http("GET", f"http://{leader.http_address}/stats?format=json&topic=jobs")
    ch = st["topics"][0]["channels"][0]
    assert (ch["dlq_count"], ch["in_flight_count"], ch["depth"]) == (1, 0, 0)


def test_a_dlq_topic_unknown_to_the_cluster_keeps_the_message(etcd_server: EtcdServer,  # type: ignore[no-untyped-def]
                                                               nsqd_factory, lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(
        nodes=3, nsqd_args=["--max-attempts=2"])
    cluster.create_topic("tasks", partitions=1, replicas=3)
    leader = cluster.leader("tasks")
    publish(leader.tcp_address, "tasks", [b"poison"])
    poison_twice(leader.tcp_address, "tasks")
    code, st = http("GET", f"http://{leader.http_address}/stats?format=json&topic=tasks")
    ch = st["topics"][0]["channels"][0]
    assert ch["dlq_count"] == 0 and ch["in_flight_count"] + ch["depth"] == 1  # not lost


def test_tracing_in_a_cluster_records_into_the_cluster_trace_topic(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    """``__trace`` created in the cluster (3 replicas: every node holds the events); the
    traced topic's leader records pub/deliver/fin there, its search finds them."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("__trace", partitions=1, replicas=3)
    cluster.create_topic("orders", partitions=1, replicas=3)
    leader = cluster.leader("orders")
    code, body = http("POST", f"http://{leader.http_address}/topic/trace?topic=orders"
                      "&enable=true")
    assert code == 200, body
    with RawClient(leader.tcp_address) as p:
        p.send(v2.pub_trace("orders", 77, b"traced"))
        assert v2.parse_traced_response(p.expect_response())[1] == 77
    with consumer(leader.tcp_address, "orders", "ship", rdy=1) as c:
        m = c.read_message()
        c.send(v2.fin(m.id))
        c.expect_nothing(0.3)

    def events() -> list[str] | None:
        code, r = http("GET", f"http://{leader.http_address}/trace/search?topic=orders"
                       "&trace_id=77")
        if code != 200 or not r["messages"]:
            return None
        evs = [e["event"] for e in r["messages"][0]["events"]]
        return evs if len(evs) >= 3 else None
    assert wait_until(events, what="trace events recorded") == ["pub", "deliver", "fin"]


def test_topic_and_channel_settings_survive_a_failover(etcd_server: EtcdServer,  # type: ignore[no-untyped-def]
                                                       nsqd_factory, lookupd_factory) -> None:
    """Set on the leader (/channel/config, /topic/config, /topic/trace), the settings ride to
    the followers with the cursors, so the node that takes over applies them too."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("jobs", partitions=1, replicas=3)
    leader = cluster.leader("jobs")
    with consumer(leader.tcp_address, "jobs", "work", rdy=0):
        pass
    base = f"http://{leader.http_address}"
    assert http("POST", f"{base}/channel/config?topic=jobs&channel=work&max_attempts=4")[0] == 200
    assert http("POST", f"{base}/topic/config?topic=jobs&ttl=90s")[0] == 200
    assert http("POST", f"{base}/topic/trace?topic=jobs&enable=true")[0] == 200

    def settings(n) -> tuple | None:  # type: ignore[no-untyped-def]
        code, st = http("GET", f"http://{n.http_address}/stats?format=json&topic=jobs")
        if code != 200 or not st["topics"] or not st["topics"][0]["channels"]:
            return None
        t = st["topics"][0]
        return t["msg_ttl_ms"], t["trace"], t["channels"][0]["max_attempts"]
    for n in cluster.nodes:
        wait_until(lambda n=n: settings(n) == (90_000, True, 4), what="settings replicated")
    old = cluster.node_id(leader)
    leader.kill()
    new = wait_until(lambda: (p := cluster.partitions("jobs")[0])["leader"] not in (None, old)
                     and cluster.node_by_id(p["leader"]), what="a new leader")
    assert settings(new) == (90_000, True, 4)
    # and a change on the new leader reaches the remaining follower
    assert http("POST", f"http://{new.http_address}/channel/config?topic=jobs&channel=work"
                "&max_attempts=default")[0] == 200
    follower = next(n for n in cluster.nodes if n.is_running() and n is not new)
    wait_until(lambda: settings(follower) == (90_000, True, 0), what="default again")
