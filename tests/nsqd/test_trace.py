"""Message tracing against a real nsqd: the per-topic switch, the events a message's life
leaves in __trace (pub, deliver, fin, req, timeout, dlq), /trace/search by id, trace id and
header, and bad input to every endpoint."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from nsqx.protocol import v2
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import RawClient, consumer


def trace(nsqd: NsqdProcess, topic: str, on: bool = True) -> http_api.Response:
    return http_api.post(nsqd.http_address, "/topic/trace", topic=topic,
                         enable="true" if on else "false")


def search(nsqd: NsqdProcess, topic: str, **q: Any) -> dict:
    r = http_api.get(nsqd.http_address, "/trace/search", topic=topic, **q)
    assert r.status == 200, r.body
    return r.json()


def events_of(result: dict) -> list[str]:
    (m,) = result["messages"]
    return [e["event"] for e in m["events"]]


def wait_events(nsqd: NsqdProcess, topic: str, mid: str, n: int) -> dict:
    """The message's timeline once it holds n events (trace writes are one turn behind)."""
    deadline = time.monotonic() + 10
    while True:
        r = search(nsqd, topic, id=mid)
        if len(r["messages"][0]["events"]) >= n or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def test_switch(nsqd: NsqdProcess) -> None:
    assert (trace(nsqd, "nope").status, trace(nsqd, "nope").json()["message"]) == (404, "TOPIC_NOT_FOUND")
    http_api.post(nsqd.http_address, "/topic/create", topic="sw")
    for params, code in [({"topic": "sw", "enable": "yes"}, "INVALID_ARG_ENABLE"),
                         ({"topic": "sw"}, "INVALID_ARG_ENABLE"),
                         ({"enable": "true"}, "MISSING_ARG_TOPIC"),
                         ({"topic": "__trace", "enable": "true"}, "INVALID_TOPIC"),
                         ({"topic": "bad!", "enable": "true"}, "INVALID_TOPIC")]:
        r = http_api.post(nsqd.http_address, "/topic/trace", **params)
        assert (r.status, r.json()["message"]) == (400, code), params
    r = http_api.post(nsqd.http_address, "/message/trace/enable", topic="sw", channel="c")
    assert (r.status, r.json()["message"]) == (400, "INVALID_ARG_CHANNEL")
    assert http_api.post(nsqd.http_address, "/message/trace/enable", topic="sw").json() == {
        "topic": "sw", "trace": True}
    assert http_api.stats(nsqd.http_address, "sw")["topics"][0]["trace"] is True
    nsqd.restart()  # kept in nsqd.dat
    assert http_api.stats(nsqd.http_address, "sw")["topics"][0]["trace"] is True
    assert http_api.post(nsqd.http_address, "/message/trace/disable", topic="sw").status == 200
    nsqd.restart()
    assert http_api.stats(nsqd.http_address, "sw")["topics"][0]["trace"] is False


def test_lifecycle_events_and_search(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory.start(["--max-attempts=3"])
    http_api.post(nsqd.http_address, "/topic/create", topic="life")
    http_api.post(nsqd.http_address, "/channel/create", topic="life", channel="work")
    assert trace(nsqd, "life").status == 200
    http_api.post(nsqd.http_address, "/topic/create", topic="quiet")  # not traced
    with RawClient(nsqd.tcp_address) as p:
        p.send(v2.pub_trace("life", 99, b"traced"))  # offset 0
        assert v2.parse_traced_response(p.expect_response())[1] == 99
        p.send(v2.mpub_ext("life", [({"order": "o-1"}, b"finned"), (None, b"requeued"),
                                    (None, b"timed-out"), (None, b"dead")]))  # 1..4
        p.expect_ok()
        p.pub("quiet", b"not traced")
    with consumer(nsqd.tcp_address, "life", "work", rdy=10,
                  identify={"msg_timeout": 1000}) as c:
        msgs = {m.body: m for m in c.read_messages(5)}
        c.send(v2.fin(msgs[b"finned"].id))
        c.send(v2.fin(msgs[b"traced"].id))
        c.send(v2.req(msgs[b"requeued"].id, 0))
        again = c.read_message()
        assert again.body == b"requeued"
        c.send(v2.fin(again.id))
        # "timed-out" and "dead" time out; "timed-out" is then finished, "dead" is left to
        # time out until its 4th delivery is refused (--max-attempts=3): dead-lettered
        done = set()
        deadline = time.monotonic() + 20
        while len(done) < 2 and time.monotonic() < deadline:
            m = c.read_message(timeout=5)
            if m.body == b"timed-out":
                c.send(v2.fin(m.id))
                done.add(m.body)
            elif m.attempts == 3:
                done.add(m.body)  # its 3rd attempt: let it time out once more
        assert done == {b"timed-out", b"dead"}
        # its 3rd attempt times out; the 4th delivery to this client is refused: dead letter
        deadline = time.monotonic() + 10
        while http_api.channel_stats(nsqd.http_address, "life", "work")["dlq_count"] < 1:
            assert time.monotonic() < deadline, "never dead-lettered"
            c.expect_nothing(0.2)
        client_port = int(c.sock.getsockname()[1])
    r = wait_events(nsqd, "life", "0000000000000000", 3)
    (m,) = r["messages"]
    assert m["trace_id"] == 99 and m["headers"] == {"##trace_id": "99"}
    assert [e["event"] for e in m["events"]] == ["pub", "deliver", "fin"]
    pub, deliver, fin = m["events"]
    assert pub["trace_id"] == 99 and pub["producer"].startswith("127.0.0.1:")
    assert pub["node"].endswith(":" + nsqd.http_address.rsplit(":", 1)[1])
    assert (deliver["channel"], deliver["attempts"]) == ("work", 1)
    assert deliver["client"]["addr"] == f"127.0.0.1:{client_port}"
    assert fin["client"]["id"] == deliver["client"]["id"]
    assert pub["ts"] <= deliver["ts"] <= fin["ts"]
    assert {k for k in pub} >= {"ts", "event", "topic", "partition", "offset", "id", "node"}
    r = wait_events(nsqd, "life", "0000000000000002", 5)
    assert events_of(r) == ["pub", "deliver", "req", "deliver", "fin"]
    assert [e.get("attempts") for e in r["messages"][0]["events"] if e["event"] == "deliver"] == [1, 2]
    assert events_of(wait_events(nsqd, "life", "0000000000000003", 5)) == [
        "pub", "deliver", "timeout", "deliver", "fin"]
    dead = wait_events(nsqd, "life", "0000000000000004", 8)["messages"][0]["events"]
    assert [e["event"] for e in dead] == ["pub", "deliver", "timeout", "deliver", "timeout",
                                          "deliver", "timeout", "dlq"]
    assert dead[-1]["attempts"] == 3 and dead[2]["attempts"] == 1
    # by trace id and by header value
    assert [x["offset"] for x in search(nsqd, "life", trace_id="99")["messages"]] == [0]
    r = search(nsqd, "life", header="order:o-1")
    assert [x["offset"] for x in r["messages"]] == [1] and events_of(r) == ["pub", "deliver", "fin"]
    assert search(nsqd, "life", header="order:nope")["messages"] == []
    assert search(nsqd, "life", trace_id="5")["messages"] == []
    # a bounded scan: the newest events only, and it says so
    r = search(nsqd, "life", id="0000000000000000", limit="3")
    assert r["truncated"] and r["scanned"] <= 3 and r["messages"][0]["events"] == []
    # the untraced topic left nothing in __trace; every event is one JSON object
    with consumer(nsqd.tcp_address, "__trace", "check", rdy=0) as c:
        pass  # channel made after the events: the first channel gets them all
    with consumer(nsqd.tcp_address, "__trace", "check", rdy=1000) as c:
        evs = [json.loads(x.body) for x in c.drain_messages(quiet=0.5)]
    assert evs and {e["topic"] for e in evs} == {"life"}
    assert {e["event"] for e in evs} == {"pub", "deliver", "fin", "req", "timeout", "dlq"}


def test_search_bad_input(nsqd: NsqdProcess) -> None:
    http_api.post(nsqd.http_address, "/topic/create", topic="s")
    for params, code in [({}, "MISSING_ARG_TOPIC"),
                         ({"topic": "bad!", "id": "0" * 16}, "INVALID_TOPIC"),
                         ({"topic": "s"}, "MISSING_ARG_ID"),
                         ({"topic": "s", "id": "0" * 16, "trace_id": "1"}, "MISSING_ARG_ID"),
                         ({"topic": "s", "id": "xyz"}, "INVALID_ID"),
                         ({"topic": "s", "id": "ABCDEF0123456789"}, "INVALID_ID"),
                         ({"topic": "s", "id": "é" * 16}, "INVALID_ID"),
                         ({"topic": "s", "trace_id": "-1"}, "INVALID_TRACE_ID"),
                         ({"topic": "s", "trace_id": "9" * 30}, "INVALID_TRACE_ID"),
                         ({"topic": "s", "header": "novalue"}, "INVALID_HEADER"),
                         ({"topic": "s", "header": ":v"}, "INVALID_HEADER"),
                         ({"topic": "s", "id": "0" * 16, "limit": "0"}, "INVALID_LIMIT"),
                         ({"topic": "s", "id": "0" * 16, "limit": "²"}, "INVALID_LIMIT"),
                         ({"topic": "s", "id": "0" * 16, "limit": "99999999999"}, "INVALID_LIMIT")]:
        r = http_api.get(nsqd.http_address, "/trace/search", **params)
        assert (r.status, r.json()["message"]) == (400, code), params
    # nothing traced yet, or an unknown topic: an empty answer, not an error
    assert search(nsqd, "s", id="0" * 16)["messages"][0]["events"] == []
    assert search(nsqd, "unknown", header="a:b")["messages"] == []


@pytest.mark.parametrize("enable", ["true", "false"])
def test_trace_switch_does_not_change_what_clients_get(nsqd: NsqdProcess, enable: str) -> None:
    http_api.post(nsqd.http_address, "/topic/create", topic="same")
    http_api.post(nsqd.http_address, "/topic/trace", topic="same", enable=enable)
    http_api.post(nsqd.http_address, "/channel/create", topic="same", channel="c")
    with RawClient(nsqd.tcp_address) as p:
        p.mpub("same", [b"a", b"b"])
    with consumer(nsqd.tcp_address, "same", "c", rdy=5) as c:
        assert [m.body for m in c.drain_messages(quiet=0.3)] == [b"a", b"b"]


def test_events_cover_runs(nsqd: NsqdProcess) -> None:
    """A batch is one event with a count (per-message events cost +220% CPU per message,
    bench/tracing.py); search finds a message inside a run."""
    http_api.post(nsqd.http_address, "/topic/create", topic="runs")
    http_api.post(nsqd.http_address, "/channel/create", topic="runs", channel="c")
    trace(nsqd, "runs")
    with RawClient(nsqd.tcp_address) as p:
        p.mpub("runs", [b"m%d" % i for i in range(50)])
    with consumer(nsqd.tcp_address, "runs", "c", rdy=100) as c:
        msgs = c.read_messages(50)
        c.send(b"".join(v2.fin(m.id) for m in msgs if m.body != b"m7"))
        c.expect_nothing(0.2)
        c.send(v2.fin(msgs[7].id))
        c.expect_nothing(0.2)
    r = wait_events(nsqd, "runs", f"{25:016x}", 3)
    pub, deliver, fin = r["messages"][0]["events"]
    assert (pub["offset"], pub["count"]) == (0, 50)
    assert (deliver["offset"], deliver["count"], deliver["attempts"]) == (0, 50, 1)
    assert fin["event"] == "fin" and fin["offset"] <= 25 < fin["offset"] + fin["count"]
    fins = [e for e in wait_events(nsqd, "runs", f"{7:016x}", 3)["messages"][0]["events"]
            if e["event"] == "fin"]
    assert [(e["offset"], e.get("count", 1)) for e in fins] == [(7, 1)]


def test_runs() -> None:
    from nsqx.nsqd.trace import runs

    assert runs([]) == []
    assert runs([4]) == [(4, 1)]
    assert runs(list(range(3, 900))) == [(3, 897)]
    assert runs([1, 2, 4, 5, 6, 9]) == [(1, 2), (4, 3), (9, 1)]
    assert runs([1, 3, 4]) == [(1, 1), (3, 2)]
