"""Delivery semantics over raw V2 connections against a real nsqd.

RDY windows, competing consumers, fan-out, REQ/DPUB delays, timeouts and TOUCH, CLS,
heartbeats, ordered producer responses, pause/unpause, ephemeral channels, sample_rate and
negotiated compression. One node per module; every test uses its own topic.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqx.protocol import v2
from nsqx.protocol.frames import FRAME_ERROR, FRAME_RESPONSE, HEARTBEAT
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import NoFrame, RawClient, consumer

MAX_REQ_MS = 2000
_topics = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NsqdProcess]:
    factory = NsqdFactory(Path(tmp_path_factory.mktemp("nsqd-delivery")))
    try:
        yield factory.start(["--max-req-timeout=2s"])
    finally:
        complaints = factory.close()
    assert not complaints, complaints


@pytest.fixture(autouse=True)
def node_alive(node: NsqdProcess) -> Iterator[None]:
    yield
    assert node.is_running(), "nsqd died:\n" + node.all_logs()


@pytest.fixture
def topic() -> str:
    return f"deliv{next(_topics)}_{int(time.time() * 1000) % 100000}"


def publish(node: NsqdProcess, topic: str, bodies: list[bytes]) -> None:
    with RawClient(node.tcp_address) as p:
        p.mpub(topic, bodies)


def bodies(n: int, prefix: bytes = b"m") -> list[bytes]:
    return [prefix + b"%04d" % i for i in range(n)]


def fast(msg_timeout: int = 1000, **extra: object) -> dict[str, object]:
    return {"msg_timeout": msg_timeout, **extra}


# --------------------------------------------------------------------------- RDY


def test_rdy_is_a_window(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, bodies(20))
    with consumer(node.tcp_address, topic, "c", rdy=3) as c:
        first = c.read_messages(3)
        assert [m.body for m in first] == bodies(3)
        assert all(m.attempts == 1 for m in first)
        c.expect_nothing(0.5)  # never more in flight than RDY
        c.send(v2.fin(first[0].id))
        nxt = c.read_message()
        assert nxt.body == b"m0003"
        c.expect_nothing(0.3)
        # lower the window: with 3 in flight and RDY 2, a FIN frees nothing
        c.send(v2.rdy(2))
        c.send(v2.fin(first[1].id))
        c.expect_nothing(0.4)
        c.send(v2.fin(first[2].id))  # in flight 1 < 2
        assert c.read_message().body == b"m0004"
        # RDY 0 stops delivery even with room
        c.send(v2.rdy(0))
        c.send(v2.fin(nxt.id))
        c.expect_nothing(0.5)
        # raising it delivers promptly
        c.send(v2.rdy(10))
        got = c.read_messages(9)
        assert [m.body for m in got] == [b"m%04d" % i for i in range(5, 14)]


def test_rdy_zero_then_one_delivers_promptly(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, bodies(5))
    with consumer(node.tcp_address, topic, "c", rdy=0) as c:
        c.expect_nothing(0.3)
        for i in range(5):
            c.send(v2.rdy(1))
            m = c.read_message(2)  # delivered on RDY 0 -> 1 (bounded by the read timeout)
            assert m.body == b"m%04d" % i
            c.send(v2.rdy(0))
            c.send(v2.fin(m.id))
        c.expect_nothing(0.3)


def test_rdy_without_count_means_one(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, bodies(3))
    with consumer(node.tcp_address, topic, "c", rdy=None) as c:  # type: ignore[arg-type]
        c.send(b"RDY\n")
        assert c.read_message().body == b"m0000"
        c.expect_nothing(0.4)


def test_competing_consumers_share_a_channel(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, bodies(60))
    cs = [consumer(node.tcp_address, topic, "shared", rdy=10) for _ in range(3)]
    try:
        held = []
        for c in cs:
            msgs = c.read_messages(10)  # each window fills: the channel is shared
            c.expect_nothing(0.2)
            held.append(msgs)
        seen = [m.body for g in held for m in g]
        assert len(set(seen)) == 30  # disjoint
        rest: list[bytes] = []
        for c, msgs in zip(cs, held, strict=True):
            for m in msgs:
                c.send(v2.fin(m.id))
        for c in cs:
            rest += [m.body for m in c.drain_messages(quiet=0.4)]
        assert sorted(seen + rest) == bodies(60)  # each message exactly once
    finally:
        for c in cs:
            c.close()


def test_fan_out_to_every_channel(node: NsqdProcess, topic: str) -> None:
    cs = {name: consumer(node.tcp_address, topic, name, rdy=50) for name in ("a", "b", "c")}
    try:
        publish(node, topic, bodies(20))
        for c in cs.values():
            assert [m.body for m in c.drain_messages(quiet=0.4)] == bodies(20)
        st = http_api.stats(node.http_address, topic)
        chans = {c["channel_name"]: c for c in st["topics"][0]["channels"]}
        assert set(chans) == {"a", "b", "c"}
        assert all(c["message_count"] == 20 for c in chans.values())
    finally:
        for c in cs.values():
            c.close()


# --------------------------------------------------------------------------- REQ / timeouts


def test_req_with_delay(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, [b"again"])
    with consumer(node.tcp_address, topic, "c", rdy=5) as c:
        m = c.read_message()
        assert m.attempts == 1
        t0 = time.monotonic()
        c.send(v2.req(m.id, 1000))
        c.expect_nothing(0.7)
        m2 = c.read_message(3)
        elapsed = time.monotonic() - t0
        assert (m2.id, m2.body, m2.attempts) == (m.id, b"again", 2)
        assert 0.9 <= elapsed < 3.0
        c.send(v2.req(m2.id, 0))  # immediate requeue
        m3 = c.read_message(2)
        assert (m3.id, m3.attempts) == (m.id, 3)
        c.send(v2.fin(m3.id))
        c.expect_nothing(0.3)
        st = http_api.channel_stats(node.http_address, topic, "c")
        assert st is not None and st["requeue_count"] == 2


@pytest.mark.slow
def test_req_delay_is_clamped_to_max_req_timeout(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, [b"clamped"])
    with consumer(node.tcp_address, topic, "c", rdy=1) as c:
        m = c.read_message()
        t0 = time.monotonic()
        c.send(v2.req(m.id, 3_600_000))  # 1 h, max is 2 s: clamped, not an error
        m2 = c.read_message(MAX_REQ_MS / 1000 + 3)
        elapsed = time.monotonic() - t0
        assert (m2.body, m2.attempts) == (b"clamped", 2)
        assert MAX_REQ_MS / 1000 - 0.3 <= elapsed < MAX_REQ_MS / 1000 + 2.5
        c.send(v2.fin(m2.id))


def test_msg_timeout_redelivers_to_another_client(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, [b"slow"])
    with consumer(node.tcp_address, topic, "c", rdy=1, identify=fast(1000)) as a:
        m = a.read_message()
        t0 = time.monotonic()
        a.send(v2.rdy(0))  # hold it, take nothing more: the redelivery must go to b
        with consumer(node.tcp_address, topic, "c", rdy=1) as b:
            m2 = b.read_message(4)
            assert (m2.id, m2.body, m2.attempts) == (m.id, b"slow", 2)
            assert time.monotonic() - t0 >= 0.8
            # the timed-out owner can no longer finish it (non-fatal)
            a.send(v2.fin(m.id))
            a.expect_error("E_FIN_FAILED", closed=False)
            b.send(v2.fin(m2.id))
            b.expect_nothing(0.3)
        st = http_api.channel_stats(node.http_address, topic, "c")
        assert st is not None and st["timeout_count"] >= 1


def test_touch_extends_the_deadline(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, [b"touched"])
    with consumer(node.tcp_address, topic, "c", rdy=1, identify=fast(1000)) as a, \
            consumer(node.tcp_address, topic, "c", rdy=1) as b:
        m = a.read_message()
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            a.send(v2.touch(m.id))
            b.expect_nothing(0.4)
        a.send(v2.fin(m.id))
        a.expect_nothing(0.2)  # no E_FIN_FAILED: still ours
        b.expect_nothing(1.2)  # and never redelivered


def test_cls_gives_close_wait_and_stops_delivery(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, bodies(2))
    with consumer(node.tcp_address, topic, "c", rdy=1) as c:
        m = c.read_message()
        c.send(v2.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.send(v2.fin(m.id))  # FIN still allowed while closing
        c.expect_nothing(0.5)  # RDY is 0 now: the second message stays
        c.expect_open()
    with consumer(node.tcp_address, topic, "c", rdy=5) as c:
        assert [x.body for x in c.drain_messages(quiet=0.4)] == [b"m0001"]


# --------------------------------------------------------------------------- heartbeats


def test_heartbeats_arrive_at_the_interval(node: NsqdProcess) -> None:
    with RawClient(node.tcp_address) as c:
        c.identify({"heartbeat_interval": 1000})
        t0 = time.monotonic()
        for _ in range(2):
            ftype, data = c.read_frame(2.5, heartbeats=True)
            assert (ftype, data) == (FRAME_RESPONSE, HEARTBEAT)
        # answered with NOP each time: the connection lives on
        assert 1.5 < time.monotonic() - t0 < 4.0
        c.expect_open()


@pytest.mark.slow
def test_silent_client_is_closed_after_two_intervals(node: NsqdProcess) -> None:
    with RawClient(node.tcp_address) as c:
        c.answer_heartbeats = False
        c.identify({"heartbeat_interval": 1000})
        t0 = time.monotonic()
        c.expect_closed(timeout=6)
        elapsed = time.monotonic() - t0
        assert 1.5 <= elapsed <= 4.5, elapsed
        assert (FRAME_RESPONSE, HEARTBEAT) in c.frames  # it was told, and did not answer


# --------------------------------------------------------------------------- DPUB / producers


def test_dpub_is_not_delivered_before_its_defer(node: NsqdProcess, topic: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=5) as c:
        with RawClient(node.tcp_address) as p:
            t0 = time.monotonic()
            p.dpub(topic, 1000, b"later")
            p.pub(topic, b"now")
        assert c.read_message().body == b"now"
        c.expect_nothing(0.6)
        m = c.read_message(3)
        assert (m.body, m.attempts) == (b"later", 1)
        assert time.monotonic() - t0 >= 0.95
        st = http_api.channel_stats(node.http_address, topic, "c")
        assert st is not None


def test_pipelined_producer_responses_in_order(node: NsqdProcess, topic: str) -> None:
    data = b""
    expected: list[bytes] = []
    for i in range(300):
        if i % 3 == 0:
            batch = [b"mp%04d-%d" % (i, k) for k in range(5)]
            data += v2.mpub(topic, batch)
            expected += batch
        elif i % 3 == 1:
            data += v2.pub(topic, b"p%04d" % i)
            expected.append(b"p%04d" % i)
        else:
            data += v2.dpub(topic, 0, b"d%04d" % i)
            expected.append(b"d%04d" % i)
    data += b"BOGUS\n" + v2.pub(topic, b"never")
    with RawClient(node.tcp_address) as p:
        p.send(data)
        for _ in range(300):
            p.expect_ok()
        # the error comes after every earlier answer, and nothing after it ran
        p.expect_error("E_INVALID", "invalid command BOGUS", closed=True)
    with consumer(node.tcp_address, topic, "c", rdy=1000) as c:
        got = [m.body for m in c.drain_messages(quiet=0.5)]
    assert got == expected


def test_one_at_a_time_pubs(node: NsqdProcess, topic: str) -> None:
    """A read holding one PUB takes nsqd's fast path; reads holding
    anything else take the general one. Both count, order and answer the same."""
    expected = []
    with RawClient(node.tcp_address) as p:
        for i in range(30):
            body = b"one%03d" % i
            data = v2.pub(topic, body)  # the first creates the topic
            if i % 10 == 5:
                data = data.replace(b"\n", b"\r\n", 1)  # upstream accepts CRLF lines
            p.send(data)
            p.expect_ok()
            expected.append(body)
        p.send(v2.pub(topic, b"x" * 2) + v2.pub(topic, b"y" * 3))  # two in one read
        p.expect_ok()
        p.expect_ok()
        expected += [b"xx", b"yyy"]
    with RawClient(node.tcp_address) as p:  # an existing topic, but an empty body
        p.send(b"PUB " + topic.encode() + b"\n" + b"\x00\x00\x00\x00")
        p.expect_error("E_BAD_MESSAGE", "PUB invalid message body size 0", closed=True)
    topics = http_api.stats(node.http_address, topic)["topics"]
    assert [t["message_count"] for t in topics if t["topic_name"] == topic] == [32]
    with consumer(node.tcp_address, topic, "c", rdy=100) as c:
        assert [m.body for m in c.drain_messages(quiet=0.5)] == expected


def test_publish_and_consume_on_one_connection(node: NsqdProcess, topic: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=10) as c:
        c.send(v2.pub(topic, b"self"))
        # the OK and the message may come in either order
        frames = [c.read_frame(), c.read_frame()]
        types = sorted(f[0] for f in frames)
        assert types == [0, 2], frames


# --------------------------------------------------------------------------- pause / lifecycle


@pytest.mark.parametrize("what", ["topic", "channel"])
def test_pause_and_unpause_over_http(node: NsqdProcess, topic: str, what: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=10) as c:
        params = {"topic": topic} if what == "topic" else {"topic": topic, "channel": "c"}
        r = http_api.post(node.http_address, f"/{what}/pause", **params)
        assert r.status == 200, r
        publish(node, topic, bodies(3))
        c.expect_nothing(0.7)
        st = http_api.stats(node.http_address, topic)["topics"][0]
        paused = st["paused"] if what == "topic" else st["channels"][0]["paused"]
        assert paused is True
        r = http_api.post(node.http_address, f"/{what}/unpause", **params)
        assert r.status == 200, r
        assert [m.body for m in c.drain_messages(quiet=0.5)] == bodies(3)


def test_topic_before_channel_keeps_messages_for_first_channel(node: NsqdProcess,
                                                               topic: str) -> None:
    publish(node, topic, bodies(5))
    st = http_api.stats(node.http_address, topic)["topics"][0]
    assert st["depth"] == 5 and st["channels"] == []
    with consumer(node.tcp_address, topic, "first", rdy=10) as c:
        assert [m.body for m in c.drain_messages(quiet=0.4)] == bodies(5)
    # a channel created later starts at the end (upstream: a new channel gets new messages)
    with consumer(node.tcp_address, topic, "second", rdy=10) as c:
        c.expect_nothing(0.4)
        publish(node, topic, [b"new"])
        assert [m.body for m in c.drain_messages(quiet=0.4)] == [b"new"]


def test_ephemeral_channel_deleted_when_last_client_leaves(node: NsqdProcess, topic: str) -> None:
    chan = "tmp#ephemeral"
    a = consumer(node.tcp_address, topic, chan, rdy=1)
    b = consumer(node.tcp_address, topic, chan, rdy=1)
    assert http_api.channel_stats(node.http_address, topic, chan) is not None
    a.close()
    time.sleep(0.3)
    assert http_api.channel_stats(node.http_address, topic, chan) is not None
    b.close()
    deadline = time.monotonic() + 3
    while http_api.channel_stats(node.http_address, topic, chan) is not None:
        assert time.monotonic() < deadline, "ephemeral channel not deleted"
        time.sleep(0.05)


def test_ephemeral_topic_deleted_with_its_last_channel(node: NsqdProcess) -> None:
    t = f"eph{next(_topics)}#ephemeral"
    c = consumer(node.tcp_address, t, "c#ephemeral", rdy=1)
    publish(node, t, [b"e"])
    assert c.read_message().body == b"e"
    c.close()
    deadline = time.monotonic() + 3
    while any(x["topic_name"] == t for x in http_api.stats(node.http_address)["topics"]):
        assert time.monotonic() < deadline, "ephemeral topic not deleted"
        time.sleep(0.05)


# --------------------------------------------------------------------------- client features


def test_sample_rate_drops_a_share(node: NsqdProcess, topic: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=500, identify={"sample_rate": 30}) as c:
        publish(node, topic, bodies(400))
        got = c.drain_messages(quiet=0.6)
    n = len(got)
    assert 40 <= n <= 220, n  # ~31% of 400
    assert len({m.body for m in got}) == n
    # skipped messages are consumed for this channel, not left waiting
    st = http_api.channel_stats(node.http_address, topic, "c")
    assert st is not None and st["depth"] == 0 and st["in_flight_count"] == 0


@pytest.mark.parametrize("feature", ["snappy", "deflate"])
def test_compression_negotiated_by_raw_client(node: NsqdProcess, topic: str, feature: str) -> None:
    payloads = [b"A" * 5000, bytes(range(256)) * 40, b"short"]
    with RawClient(node.tcp_address) as c:
        info = c.identify({"feature_negotiation": True, feature: True, "deflate_level": 3})
        assert isinstance(info, dict) and info[feature] is True
        if feature == "deflate":
            assert info["deflate_level"] == 3
        # commands are compressed too: PUB through the compressed stream
        for p in payloads:
            c.pub(topic, p)
        c.send(v2.sub(topic, "c"))
        c.expect_ok()
        c.send(v2.rdy(10))
        got = [m.body for m in c.drain_messages(quiet=0.5)]
        assert got == payloads
        c.expect_open()
    st = http_api.channel_stats(node.http_address, topic, "c")
    assert st is not None and st["in_flight_count"] == 0


def test_identify_then_commands_in_one_write(node: NsqdProcess, topic: str) -> None:
    """Everything after a non-negotiated IDENTIFY in the same packet is executed."""
    with RawClient(node.tcp_address) as c:
        c.send(v2.identify({"client_id": "x"}) + v2.sub(topic, "c") + v2.rdy(1)
               + v2.pub(topic, b"one"))
        c.expect_ok()
        c.expect_ok()
        frames = [c.read_frame(), c.read_frame()]
        assert sorted(f[0] for f in frames) == [0, 2]


def test_no_message_frames_to_a_publisher(node: NsqdProcess, topic: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=0), RawClient(node.tcp_address) as p:
        for i in range(5):
            p.pub(topic, b"%d" % i)
        try:
            frame = p.read_frame(0.3)
        except NoFrame:
            return
        assert frame[0] != FRAME_ERROR, frame
        raise AssertionError(f"unexpected frame to a publisher: {frame!r}")


# --------------------------------------------------------------------------- more edges


def test_fin_after_req_is_not_in_flight(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, [b"r"])
    with consumer(node.tcp_address, topic, "c", rdy=1) as c:
        m = c.read_message()
        c.send(v2.req(m.id, 1000))
        c.send(v2.fin(m.id))
        c.expect_error("E_FIN_FAILED", f"FIN {m.id.decode()} failed ID not in flight",
                       closed=False)


def test_disconnected_consumers_messages_go_to_another(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, bodies(3))
    a = consumer(node.tcp_address, topic, "c", rdy=3, identify=fast(1000))
    held = a.read_messages(3)
    a.close()
    with consumer(node.tcp_address, topic, "c", rdy=3) as b:
        got = b.read_messages(3, timeout=5)
    assert sorted(m.body for m in got) == bodies(3)
    assert {m.id for m in got} == {m.id for m in held}
    assert all(m.attempts == 2 for m in got)


def test_req_while_closing_is_allowed(node: NsqdProcess, topic: str) -> None:
    publish(node, topic, [b"x"])
    with consumer(node.tcp_address, topic, "c", rdy=1) as c:
        m = c.read_message()
        c.send(v2.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.send(v2.req(m.id, 0) + v2.touch(m.id))
        c.expect_error("E_TOUCH_FAILED", closed=False)  # requeued: no longer ours
    with consumer(node.tcp_address, topic, "c", rdy=1) as c:
        m2 = c.read_message()
        assert (m2.body, m2.attempts) == (b"x", 2)


def test_topic_delete_closes_subscribers(node: NsqdProcess, topic: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=1) as c:
        assert http_api.post(node.http_address, "/topic/delete", topic=topic).status == 200
        c.expect_closed(timeout=3)
    assert http_api.stats(node.http_address, topic)["topics"] == []


def test_large_messages_intact(node: NsqdProcess, topic: str) -> None:
    one_mib = 1024 * 1024
    big = bytes(range(256)) * (one_mib // 256)
    with RawClient(node.tcp_address, timeout=15) as p:
        p.pub(topic, big)
        p.mpub(topic, [big[:-1], big[1:], big[::-1], b"tail"])
    with consumer(node.tcp_address, topic, "c", rdy=10, timeout=15) as c:
        got = [m.body for m in c.drain_messages(quiet=1.0)]
    assert got == [big, big[:-1], big[1:], big[::-1], b"tail"]


@pytest.mark.slow
def test_pipelined_flood_with_concurrent_reader(node: NsqdProcess, topic: str) -> None:
    """20k PUBs written without waiting while OKs are read: flow control, no deadlock."""
    import threading

    n = 20000
    data = b"".join(v2.pub(topic, b"f%05d" % i) for i in range(n))
    with RawClient(node.tcp_address, timeout=20) as p:
        errors: list[BaseException] = []

        def send() -> None:
            try:
                p.sock.sendall(data)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=send)
        t.start()
        for _ in range(n):
            p.expect_ok(20)
        t.join(20)
        assert not errors
    st = http_api.stats(node.http_address, topic)["topics"][0]
    assert st["message_count"] == n


@pytest.mark.slow
def test_touch_is_capped_by_max_msg_timeout(nsqd_factory: NsqdFactory) -> None:
    n = nsqd_factory.start(["--max-msg-timeout=2s"])
    publish(n, "capped", [b"t"])
    with consumer(n.tcp_address, "capped", "c", rdy=1, identify=fast(1000)) as a:
        m = a.read_message()
        t0 = time.monotonic()
        a.send(v2.rdy(0))
        with consumer(n.tcp_address, "capped", "c", rdy=1) as b:
            got = None
            while time.monotonic() - t0 < 5:
                a.send(v2.touch(m.id))
                try:
                    got = b.read_message(0.3)
                    break
                except NoFrame:
                    continue
            assert got is not None, "TOUCH extended the deadline past --max-msg-timeout"
            assert got.attempts == 2
            assert 1.7 <= time.monotonic() - t0 <= 3.5


def test_big_output_buffer_still_flushes_promptly(node: NsqdProcess, topic: str) -> None:
    ident = {"output_buffer_size": 65536, "output_buffer_timeout": 5000}
    with consumer(node.tcp_address, topic, "c", rdy=10, identify=ident) as c:
        t0 = time.monotonic()
        publish(node, topic, [b"one"])
        assert c.read_message(4).body == b"one"
        # well before the client's 5 s output_buffer_timeout (a loose bound: behaviour, not speed)
        assert time.monotonic() - t0 < 4.5


def test_dpub_to_topic_without_channel_keeps_its_defer(node: NsqdProcess, topic: str) -> None:
    """Upstream: the topic pump hands a deferred message to the first channel as deferred."""
    with RawClient(node.tcp_address) as p:
        t0 = time.monotonic()
        p.dpub(topic, 1500, b"later")
        p.pub(topic, b"now")
    with consumer(node.tcp_address, topic, "c", rdy=5) as c:
        assert c.read_message().body == b"now"
        c.expect_nothing(max(0.0, 1.2 - (time.monotonic() - t0)))
        m = c.read_message(3)
        assert m.body == b"later" and time.monotonic() - t0 >= 1.4


def test_many_tiny_messages_fin_in_batches(node: NsqdProcess, topic: str) -> None:
    """50k messages in 10 MPUBs, consumed with RDY 2500 and FINs sent in runs."""
    n = 50_000
    with RawClient(node.tcp_address, timeout=15) as p:
        for k in range(10):
            p.mpub(topic, [b"%05d" % i for i in range(k * 5000, (k + 1) * 5000)])
    seen = bytearray(n)
    with consumer(node.tcp_address, topic, "c", rdy=2500, timeout=15) as c:
        got = 0
        while got < n:
            batch = [c.read_message(10)]
            while c.frames and len(batch) < 500:
                batch.append(c.read_message(1))
            for m in batch:
                seen[int(m.body)] += 1
            c.send(b"".join(v2.fin(m.id) for m in batch))
            got += len(batch)
        c.expect_nothing(0.5)
    assert seen == bytearray(b"\x01" * n)
    st = http_api.channel_stats(node.http_address, topic, "c")
    assert st is not None and st["depth"] == 0 and st["in_flight_count"] == 0, st
