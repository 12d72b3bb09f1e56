"""Tag dispatch (Youzan's ##client_dispatch_tag / desired_tag) against a real nsqd, and the
cursor's hand-over it is built on."""

from __future__ import annotations

import pytest

from nsqx.protocol import v2
from nsqx.storage.cursor import ChannelCursor, NotInFlight, NotOwner
from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import NoFrame, RawClient, consumer

TAG = "##client_dispatch_tag"


def publish(nsqd: NsqdProcess, topic: str, items: list[tuple[str, bytes]]) -> None:
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.mpub_ext(topic, [({TAG: t} if t else None, b) for t, b in items]))
        c.expect_ok()


def drain(c: RawClient, quiet: float = 0.4) -> list[bytes]:
    return sorted(m.body for m in c.drain_messages(quiet=quiet))


def make_topic(nsqd: NsqdProcess, topic: str) -> None:
    assert http_api.post(nsqd.http_address, "/topic/create", topic=topic).status == 200
    assert http_api.post(nsqd.http_address, "/channel/create", topic=topic,
                         channel="c").status == 200


def test_tagged_consumers_get_their_tag_untagged_get_the_rest(nsqd: NsqdProcess) -> None:
    make_topic(nsqd, "tg")
    with consumer(nsqd.tcp_address, "tg", "c", rdy=100, identify={"desired_tag": "a"}) as a, \
            consumer(nsqd.tcp_address, "tg", "c", rdy=100) as u:
        publish(nsqd, "tg", [("a", b"a1"), ("", b"u1"), ("b", b"b1"), ("a", b"a2"), ("", b"u2")])
        assert drain(a) == [b"a1", b"a2"]
        # no consumer asked for tag b: the untagged ones get it (Youzan's fallback)
        assert drain(u) == [b"b1", b"u1", b"u2"]
        # a REQ'd tagged message comes back to its tag, attempts counted
        publish(nsqd, "tg", [("a", b"a3")])
        m = a.read_message()
        a.send(v2.req(m.id, 0))
        again = a.read_message()
        assert (again.body, again.attempts) == (b"a3", 2)
        a.send(v2.fin(again.id))
        u.expect_nothing(0.3)
    ch = http_api.channel_stats(nsqd.http_address, "tg", "c")
    assert ch is not None and (ch["depth"], ch["in_flight_count"]) == (0, 0)
    assert ch["requeue_count"] == 1


def test_untagged_messages_wait_for_an_untagged_consumer(nsqd: NsqdProcess) -> None:
    make_topic(nsqd, "tw")
    with consumer(nsqd.tcp_address, "tw", "c", rdy=100, identify={"desired_tag": "a"}) as a:
        publish(nsqd, "tw", [("", b"u1"), ("a", b"a1"), ("x", b"x1"), ("a", b"a2")])
        assert drain(a) == [b"a1", b"a2"]  # the others are held, not given to the wrong group
        ch = http_api.channel_stats(nsqd.http_address, "tw", "c")
        assert ch is not None and ch["in_flight_count"] == 2  # held for their group
        with consumer(nsqd.tcp_address, "tw", "c", rdy=100) as u:
            msgs = u.drain_messages(quiet=0.4)
            assert sorted(m.body for m in msgs) == [b"u1", b"x1"]
            assert {m.attempts for m in msgs} == {1}  # holding is not an attempt
        # the tagged consumer leaves: its tag's messages go to untagged consumers again
    publish(nsqd, "tw", [("a", b"a3")])
    with consumer(nsqd.tcp_address, "tw", "c", rdy=10) as u:
        assert drain(u) == [b"a3"]
    ch = http_api.channel_stats(nsqd.http_address, "tw", "c")
    assert ch is not None and (ch["depth"], ch["in_flight_count"]) == (0, 0)


def test_rdy_windows_are_kept_per_group(nsqd: NsqdProcess) -> None:
    make_topic(nsqd, "tr")
    publish(nsqd, "tr", [("a", b"a%d" % i) for i in range(5)] + [("", b"u%d" % i) for i in range(5)])
    with consumer(nsqd.tcp_address, "tr", "c", rdy=2, identify={"desired_tag": "a"}) as a, \
            consumer(nsqd.tcp_address, "tr", "c", rdy=1) as u:
        first_a = a.read_messages(2)
        first_u = u.read_message()
        with pytest.raises(NoFrame):  # nobody exceeds its RDY, whatever is held
            a.read_message(0.3)
        with pytest.raises(NoFrame):
            u.read_message(0.2)
        assert all(m.body.startswith(b"a") for m in first_a) and first_u.body.startswith(b"u")
        for m in first_a:
            a.send(v2.fin(m.id))
        u.send(v2.fin(first_u.id))
        rest_a = a.drain_messages(quiet=0.4)
        rest_u = u.drain_messages(quiet=0.4)
        assert sorted(m.body for m in first_a + rest_a) == [b"a%d" % i for i in range(5)]
        assert sorted(m.body for m in [first_u, *rest_u]) == [b"u%d" % i for i in range(5)]


def test_ext_clients_see_the_tag_header(nsqd: NsqdProcess) -> None:
    from nsqx.protocol.frames import decode_ext_message

    make_topic(nsqd, "te")
    publish(nsqd, "te", [("a", b"a1")])
    with consumer(nsqd.tcp_address, "te", "c", rdy=1,
                  identify={"desired_tag": "a", "extend_support": True}) as a:
        _ts, _att, _mid, ver, ext, body = decode_ext_message(a.read_frame()[1])
        assert (ver, body) == (4, b"a1") and b'"a"' in ext


def test_cursor_reassign() -> None:
    cur = ChannelCursor(0)
    got = cur.take(-1, 3, 3, 1000, 60_000)
    assert [(d.offset, d.count) for d in got] == [(0, 3)]
    cur.reassign(1, -1, 7, 5000, 1000)
    assert (cur.in_flight_of(-1), cur.in_flight_of(7)) == (2, 1)
    with pytest.raises(NotOwner):
        cur.finish(-1, 1)
    with pytest.raises(NotOwner):
        cur.reassign(1, -1, 8, 5000, 1000)
    with pytest.raises(NotInFlight):
        cur.reassign(9, -1, 8, 5000, 1000)
    cur.finish(7, 1)
    assert cur.expire(4000) == 0  # the old run deadline (61 s) is not due, nor 1's
    assert cur.expire(70_000) == 2  # 0 and 2 time out with the run
    assert cur.in_flight_count == 0 and cur.in_flight_of(7) == 0
