"""Topics with several partitions on one node, and strictly ordered channels (Youzan's shapes)."""

from __future__ import annotations

import pytest

from nsqx.protocol import v2
from tests.support import http_api
from tests.support.clients import pynsq_runner
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import RawClient, consumer


def create(nsqd: NsqdProcess, topic: str, n: int, ordered: bool = False) -> http_api.Response:
    params = {"topic": topic, "partition_num": str(n)}
    if ordered:
        params["orderedmulti"] = "true"
    return http_api.post(nsqd.http_address, "/topic/create", **params)


def topic_stats(nsqd: NsqdProcess, topic: str) -> dict:
    return next(t for t in http_api.stats(nsqd.http_address, topic)["topics"]
                if t["topic_name"] == topic)


def test_create_and_refuse_another_shape(nsqd: NsqdProcess) -> None:
    assert create(nsqd, "p4", 4).status == 200
    assert create(nsqd, "p4", 4).status == 200  # the same again: harmless
    r = create(nsqd, "p4", 3)
    assert (r.status, r.json()["message"]) == (400, "TOPIC_EXISTS")
    r = create(nsqd, "p4", 4, ordered=True)
    assert (r.status, r.json()["message"]) == (400, "TOPIC_EXISTS")
    for bad in ("0", "1025", "two", "-1"):
        r = http_api.post(nsqd.http_address, "/topic/create", topic="x", partition_num=bad)
        assert (r.status, r.json()["message"]) == (400, "INVALID_PARTITION_NUM"), bad
    r = create(nsqd, "tmp#ephemeral", 2)
    assert r.status == 400
    t = topic_stats(nsqd, "p4")
    assert [p["partition"] for p in t["partitions"]] == [0, 1, 2, 3] and not t["ordered"]


def test_publish_routing_union_subscribe_and_restart(nsqd: NsqdProcess) -> None:
    assert create(nsqd, "p4", 4).status == 200
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.pub("p4", b"to-2", partition=2))
        c.expect_ok()
        for i in range(8):  # no partition: spread round-robin
            c.pub("p4", b"rr-%d" % i)
        c.send(v2.mpub("p4", [b"m-a", b"m-b"], partition=1))
        c.expect_ok()
        c.send(v2.pub("p4", b"x", partition=9))
        c.expect_error("E_BAD_PARTITION", closed=False)
        c.send(b"PUB p4 abc\n" + (1).to_bytes(4, "big") + b"x")
        c.expect_error("E_BAD_PARTITION", closed=False)
        c.pub("p4", b"still-open")
    assert http_api.pub(nsqd.http_address, "p4", b"http-3", partition=3).status == 200
    r = http_api.post(nsqd.http_address, "/pub", topic="p4", partition="7")
    assert r.status == 400
    t = topic_stats(nsqd, "p4")
    counts = [p["message_count"] for p in t["partitions"]]
    assert sum(counts) == t["message_count"] == 13
    assert counts[2] >= 3 and counts[1] >= 4 and counts[3] >= 3 and counts[0] >= 2
    # a stock SUB reads every partition; FINs route by the partition in each id
    with consumer(nsqd.tcp_address, "p4", "all", rdy=0):
        pass  # channel created after the messages: the first channel gets them all
    with consumer(nsqd.tcp_address, "p4", "all", rdy=100) as c:
        msgs = c.read_messages(13)
        assert {m.id[:4] for m in msgs} == {b"0000", b"0001", b"0002", b"0003"}
        for m in msgs[:10]:
            c.send(v2.fin(m.id))
        c.expect_nothing(0.3)
    ch = topic_stats(nsqd, "p4")["channels"][0]
    assert ch["depth"] + ch["in_flight_count"] == 3  # 3 unfinished: timed out or in flight
    nsqd.restart()
    t = topic_stats(nsqd, "p4")
    assert len(t["partitions"]) == 4 and t["channels"][0]["channel_name"] == "all"
    with consumer(nsqd.tcp_address, "p4", "all", rdy=100) as c:
        assert len(c.read_messages(3)) == 3  # the unfinished ones, from all partitions


def test_ordered_topic_delivers_one_at_a_time_in_log_order(nsqd: NsqdProcess) -> None:
    assert create(nsqd, "o", 2, ordered=True).status == 200
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.pub("o", b"no-partition"))
        c.expect_error("E_BAD_PARTITION", closed=False)
        for i in range(4):
            c.send(v2.pub("o", b"k%d" % i, partition=1))
            c.expect_ok()
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub("o", "c"))
        c.expect_error("E_SUB_ORDER_IS_MUST", closed=True)
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub_ordered("o", "c", 1))
        c.expect_ok()
        c.send(v2.rdy(10))
        m = c.read_message()
        assert (m.body, m.attempts) == (b"k0", 1)
        c.expect_nothing(0.3)  # RDY 10, but one in flight at a time
        c.send(v2.req(m.id, 600))  # a delayed REQ: nothing passes it meanwhile
        c.expect_nothing(0.4)
        m = c.read_message(timeout=5)
        assert (m.body, m.attempts) == (b"k0", 2)
        got = []
        for _ in range(4):
            c.send(v2.fin(m.id))
            if len(got) == 3:
                break
            m = c.read_message()
            got.append(m.body)
        assert got == [b"k1", b"k2", b"k3"]
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub_ordered("o", "c", 5))
        c.expect_error("E_BAD_PARTITION", closed=True)
    with RawClient(nsqd.tcp_address) as c:
        c.send(b"SUB_ORDERED o c\n")
        c.expect_error("E_INVALID", closed=True)
    nsqd.restart()
    t = topic_stats(nsqd, "o")
    assert t["ordered"] is True and all(c["ordered"] for c in t["channels"])


@pytest.mark.compat
@pytest.mark.timeout(120)
def test_stock_pynsq_consumer_reads_every_partition(nsqd: NsqdProcess) -> None:
    assert create(nsqd, "wide", 4).status == 200
    bodies = [b"w-%02d" % i for i in range(20)]
    with RawClient(nsqd.tcp_address) as c:
        for b in bodies:
            c.pub("wide", b)
    res = pynsq_runner().run("consume", {"nsqd": nsqd.tcp_address, "conn": {}, "topic": "wide",
                                         "channel": "ch", "expect": len(bodies), "idle_s": 0.5})
    assert sorted(res.bodies()) == sorted(bodies), res.describe()
    assert topic_stats(nsqd, "wide")["channels"][0]["depth"] == 0


def test_each_partition_keeps_its_own_channel_position_across_restart(nsqd: NsqdProcess) -> None:
    """Partitions' cursors of one channel are separate files (they once shared one, so a
    restart replayed one partition from where another had got to)."""
    assert create(nsqd, "pos", 2, ordered=True).status == 200
    with RawClient(nsqd.tcp_address) as c:
        for p, body in ((1, b"p1-a"), (1, b"p1-b"), (0, b"p0-a")):
            c.send(v2.pub("pos", body, partition=p))
            c.expect_ok()
    with RawClient(nsqd.tcp_address) as c:  # partition 1 read to its end, partition 0 not
        c.send(v2.sub_ordered("pos", "c", 1))
        c.expect_ok()
        c.send(v2.rdy(10))
        for _ in range(2):
            c.send(v2.fin(c.read_message().id))
        c.expect_nothing(0.3)
    nsqd.restart()
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub_ordered("pos", "c", 1))
        c.expect_ok()
        c.send(v2.rdy(10))
        c.expect_nothing(0.5)  # nothing finished comes back
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub_ordered("pos", "c", 0))
        c.expect_ok()
        c.send(v2.rdy(10))
        m = c.read_message()
        assert m.body == b"p0-a"
        c.send(v2.fin(m.id))
