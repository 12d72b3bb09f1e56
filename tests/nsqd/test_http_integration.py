"""Every nsqd HTTP endpoint against the real process, and HTTP-published messages read over TCP."""

from __future__ import annotations

import itertools
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqx.protocol import v2
from tests.support import http_api
from tests.support.http_api import get, post, request
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import RawClient, consumer

MAX_MSG = 2048
MAX_BODY = 16384
V1 = "nsq; version=1.0"
_topics = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NsqdProcess]:
    factory = NsqdFactory(Path(tmp_path_factory.mktemp("nsqd-http")))
    try:
        yield factory.start([f"--max-msg-size={MAX_MSG}", f"--max-body-size={MAX_BODY}",
                             "--max-req-timeout=5s"])
    finally:
        complaints = factory.close()
    assert not complaints, complaints


@pytest.fixture(autouse=True)
def node_alive(node: NsqdProcess) -> Iterator[None]:
    yield
    assert node.is_running(), "nsqd died:\n" + node.all_logs()


@pytest.fixture
def topic() -> str:
    return f"http{next(_topics)}"


def addr(node: NsqdProcess) -> str:
    return node.http_address


def err(r: http_api.Response) -> str:
    return r.json()["message"]


def drain(node: NsqdProcess, topic: str, channel: str = "c", quiet: float = 0.4) -> list[bytes]:
    with consumer(node.tcp_address, topic, channel, rdy=200) as c:
        return [m.body for m in c.drain_messages(quiet=quiet)]


# --------------------------------------------------------------------------- basics


def test_ping(node: NsqdProcess) -> None:
    r = get(addr(node), "/ping")
    assert (r.status, r.body) == (200, b"OK")
    assert r.headers.get("x-nsq-content-type") == V1


def test_info(node: NsqdProcess) -> None:
    r = get(addr(node), "/info")
    assert r.status == 200
    info = r.json()
    assert info["version"] == "1.3.0"
    assert info["tcp_port"] == node.tcp_port and info["http_port"] == node.http_port
    assert info["max_heartbeat_interval"] == 60_000_000_000  # Go duration: ns
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_deflate_level"] == 6
    assert abs(info["start_time"] - time.time()) < 3600
    for key in ("broadcast_address", "hostname", "topology_zone", "topology_region"):
        assert key in info


def test_unknown_route_and_wrong_method(node: NsqdProcess) -> None:
    r = get(addr(node), "/nope")
    assert (r.status, err(r)) == (404, "NOT_FOUND")
    r = request("GET", f"http://{addr(node)}/pub?topic=x")
    assert (r.status, err(r)) == (405, "METHOD_NOT_ALLOWED")
    r = post(addr(node), "/ping")
    assert r.status == 405


# --------------------------------------------------------------------------- publishing


def test_pub_delivered_over_tcp(node: NsqdProcess, topic: str) -> None:
    payloads = [b"hello", bytes(range(256)), b"x" * MAX_MSG]
    for p in payloads:
        r = http_api.pub(addr(node), topic, p)
        assert (r.status, r.body) == (200, b"OK"), r
    assert drain(node, topic) == payloads


def test_pub_errors(node: NsqdProcess, topic: str) -> None:
    r = http_api.pub(addr(node), topic, b"")
    assert (r.status, err(r)) == (400, "MSG_EMPTY")
    r = http_api.pub(addr(node), topic, b"x" * (MAX_MSG + 1))
    assert (r.status, err(r)) == (413, "MSG_TOO_BIG")
    r = request("POST", f"http://{addr(node)}/pub", b"x")
    assert (r.status, err(r)) == (400, "MISSING_ARG_TOPIC")
    r = http_api.pub(addr(node), "bad!", b"x")
    assert (r.status, err(r)) == (400, "INVALID_TOPIC")
    r = http_api.pub(addr(node), topic, b"x", defer_ms=5001)
    assert (r.status, err(r)) == (400, "INVALID_DEFER")
    r = request("POST", f"http://{addr(node)}/pub?topic={topic}&defer=-1", b"x")
    assert (r.status, err(r)) == (400, "INVALID_DEFER")
    # nothing of that was stored
    assert drain(node, topic) == []


def test_pub_with_defer(node: NsqdProcess, topic: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=10) as c:
        t0 = time.monotonic()
        assert http_api.pub(addr(node), topic, b"deferred", defer_ms=1000).status == 200
        assert http_api.pub(addr(node), topic, b"now").status == 200
        assert c.read_message().body == b"now"
        c.expect_nothing(0.6)
        m = c.read_message(3)
        assert m.body == b"deferred" and time.monotonic() - t0 >= 0.95


def test_mpub_text(node: NsqdProcess, topic: str) -> None:
    r = request("POST", f"http://{addr(node)}/mpub?topic={topic}", b"a\nbb\n\nccc\n")
    assert (r.status, r.body) == (200, b"OK")
    assert drain(node, topic) == [b"a", b"bb", b"ccc"]  # empty lines skipped


@pytest.mark.parametrize("flag", ["true", "1"])
def test_mpub_binary(node: NsqdProcess, topic: str, flag: str) -> None:
    bodies = [b"line\nwith newline", b"\x00\x01", b"z" * 100]
    data = struct.pack(">I", len(bodies)) + b"".join(struct.pack(">I", len(b)) + b
                                                     for b in bodies)
    r = request("POST", f"http://{addr(node)}/mpub?topic={topic}&binary={flag}", data)
    assert (r.status, r.body) == (200, b"OK"), r
    assert drain(node, topic) == bodies


def test_mpub_errors(node: NsqdProcess, topic: str) -> None:
    r = request("POST", f"http://{addr(node)}/mpub?topic={topic}", b"x" * (MAX_BODY + 1))
    assert (r.status, err(r)) in {(413, "BODY_TOO_BIG"), (413, "MSG_TOO_BIG")}
    r = request("POST", f"http://{addr(node)}/mpub?topic={topic}", b"ok\n" + b"y" * (MAX_MSG + 1))
    assert (r.status, err(r)) == (413, "MSG_TOO_BIG")
    bad = struct.pack(">I", 2) + struct.pack(">I", 1) + b"a" + struct.pack(">I", 99) + b"b"
    r = request("POST", f"http://{addr(node)}/mpub?topic={topic}&binary=true", bad)
    assert r.status in (400, 413) and err(r) in {"BAD_BODY", "BAD_MESSAGE", "MSG_TOO_BIG"}, r
    r = request("POST", f"http://{addr(node)}/mpub?topic=bad!", b"a")
    assert (r.status, err(r)) == (400, "INVALID_TOPIC")
    assert drain(node, topic) == []  # atomic: nothing of a refused batch


def test_http_and_tcp_publishers_interleave(node: NsqdProcess, topic: str) -> None:
    with RawClient(node.tcp_address) as p:
        for i in range(10):
            if i % 2:
                p.pub(topic, b"tcp%d" % i)
            else:
                assert http_api.pub(addr(node), topic, b"http%d" % i).status == 200
    assert drain(node, topic) == [(b"tcp%d" if i % 2 else b"http%d") % i for i in range(10)]


# --------------------------------------------------------------------------- topics / channels


def test_topic_lifecycle(node: NsqdProcess, topic: str) -> None:
    a = addr(node)
    assert post(a, "/topic/create", topic=topic).status == 200
    assert post(a, "/topic/create", topic=topic).status == 200  # idempotent
    st = http_api.stats(a, topic)
    assert [t["topic_name"] for t in st["topics"]] == [topic]
    # messages wait in the topic until it has a channel; empty drops them
    assert http_api.pub(a, topic, b"gone").status == 200
    assert http_api.stats(a, topic)["topics"][0]["depth"] == 1
    assert post(a, "/topic/empty", topic=topic).status == 200
    assert http_api.stats(a, topic)["topics"][0]["depth"] == 0
    assert http_api.pub(a, topic, b"kept").status == 200
    assert drain(node, topic) == [b"kept"]
    assert post(a, "/topic/delete", topic=topic).status == 200
    assert http_api.stats(a, topic)["topics"] == []
    r = post(a, "/topic/delete", topic=topic)
    assert (r.status, err(r)) == (404, "TOPIC_NOT_FOUND")
    r = post(a, "/topic/empty", topic=topic)
    assert (r.status, err(r)) == (404, "TOPIC_NOT_FOUND")


def test_topic_arg_errors(node: NsqdProcess) -> None:
    a = addr(node)
    for path in ("/topic/create", "/topic/delete", "/topic/empty", "/topic/pause"):
        r = post(a, path)
        assert (r.status, err(r)) == (400, "MISSING_ARG_TOPIC"), path
        r = post(a, path, topic="bad!")
        if path in ("/topic/delete", "/topic/pause"):
            # upstream looks these up without validating the name
            assert (r.status, err(r)) == (404, "TOPIC_NOT_FOUND"), (path, r)
        else:
            assert r.status == 400 and err(r) in {"INVALID_TOPIC", "INVALID_ARG_TOPIC"}, (path, r)


def test_channel_lifecycle(node: NsqdProcess, topic: str) -> None:
    a = addr(node)
    r = post(a, "/channel/create", topic=topic, channel="c")
    assert (r.status, err(r)) == (404, "TOPIC_NOT_FOUND")
    assert post(a, "/topic/create", topic=topic).status == 200
    assert post(a, "/channel/create", topic=topic, channel="c").status == 200
    assert post(a, "/channel/create", topic=topic, channel="d").status == 200
    # a created channel gets every message published after it, with no consumer yet
    for b in (b"1", b"2", b"3"):
        assert http_api.pub(a, topic, b).status == 200
    st = http_api.channel_stats(a, topic, "c")
    assert st is not None and st["depth"] == 3
    assert post(a, "/channel/empty", topic=topic, channel="c").status == 200
    st = http_api.channel_stats(a, topic, "c")
    assert st is not None and st["depth"] == 0
    assert drain(node, topic, "c") == []
    assert drain(node, topic, "d") == [b"1", b"2", b"3"]
    assert post(a, "/channel/delete", topic=topic, channel="c").status == 200
    assert http_api.channel_stats(a, topic, "c") is None
    r = post(a, "/channel/delete", topic=topic, channel="c")
    assert (r.status, err(r)) == (404, "CHANNEL_NOT_FOUND")
    r = post(a, "/channel/create", topic=topic)
    assert (r.status, err(r)) == (400, "MISSING_ARG_CHANNEL")
    r = post(a, "/channel/create", topic=topic, channel="bad!")
    assert (r.status, err(r)) == (400, "INVALID_ARG_CHANNEL")


def test_channel_empty_drops_in_flight(node: NsqdProcess, topic: str) -> None:
    a = addr(node)
    with consumer(node.tcp_address, topic, "c", rdy=5) as c:
        http_api.mpub(a, topic, [b"1", b"2", b"3"])
        msgs = c.read_messages(3)
        st = http_api.channel_stats(a, topic, "c")
        assert st is not None and st["in_flight_count"] == 3
        assert post(a, "/channel/empty", topic=topic, channel="c").status == 200
        st = http_api.channel_stats(a, topic, "c")
        assert st is not None and st["in_flight_count"] == 0 and st["depth"] == 0
        c.send(v2.fin(msgs[0].id))
        c.expect_error("E_FIN_FAILED", closed=False)


def test_channel_delete_closes_its_clients(node: NsqdProcess, topic: str) -> None:
    with consumer(node.tcp_address, topic, "c", rdy=1) as c:
        assert post(addr(node), "/channel/delete", topic=topic, channel="c").status == 200
        c.expect_closed(timeout=3)


@pytest.mark.parametrize("what", ["topic", "channel"])
def test_pause_unpause_shows_in_stats_and_delivery(node: NsqdProcess, topic: str,
                                                    what: str) -> None:
    a = addr(node)
    params = {"topic": topic} if what == "topic" else {"topic": topic, "channel": "c"}
    with consumer(node.tcp_address, topic, "c", rdy=10) as c:
        assert post(a, f"/{what}/pause", **params).status == 200
        st = http_api.stats(a, topic)["topics"][0]
        assert (st if what == "topic" else st["channels"][0])["paused"] is True
        http_api.pub(a, topic, b"held")
        c.expect_nothing(0.5)
        assert post(a, f"/{what}/unpause", **params).status == 200
        assert c.read_message(3).body == b"held"
        st = http_api.stats(a, topic)["topics"][0]
        assert (st if what == "topic" else st["channels"][0])["paused"] is False
    r = post(a, f"/{what}/pause", topic="nope_" + topic, **({"channel": "c"} if what == "channel" else {}))
    assert r.status == 404


# --------------------------------------------------------------------------- stats


def test_stats_json_and_filters(node: NsqdProcess, topic: str) -> None:
    a = addr(node)
    with consumer(node.tcp_address, topic, "c1", rdy=0, identify={"client_id": "cid",
                                                                 "user_agent": "raw/1"}), \
            consumer(node.tcp_address, topic, "c2", rdy=0):
        http_api.mpub(a, topic, [b"a", b"bb"])
        st = http_api.stats(a)
        assert st["version"] == "1.3.0" and st["health"] == "OK"
        t = next(x for x in st["topics"] if x["topic_name"] == topic)
        assert t["message_count"] == 2 and t["message_bytes"] == 3
        assert [c["channel_name"] for c in t["channels"]] == ["c1", "c2"]
        c1 = t["channels"][0]
        assert c1["depth"] == 2 and c1["client_count"] == 1
        cl = c1["clients"][0]
        assert cl["client_id"] == "cid" and cl["user_agent"] == "raw/1"
        assert cl["state"] == 3 and cl["ready_count"] == 0 and cl["version"] == "V2"
        # filters
        only = http_api.stats(a, topic, "c2")
        assert [x["topic_name"] for x in only["topics"]] == [topic]
        assert [c["channel_name"] for c in only["topics"][0]["channels"]] == ["c2"]
        assert http_api.stats(a, "no_such_topic")["topics"] == []
        r = get(a, "/stats", format="json", topic=topic, include_clients="false")
        assert all(c["clients"] == [] or "clients" not in c
                   for c in r.json()["topics"][0]["channels"])
        r = get(a, "/stats", format="json", include_mem="false")
        assert "memory" not in r.json()
        r = get(a, "/stats", format="json")
        assert "memory" in r.json()


def test_stats_producers(node: NsqdProcess, topic: str) -> None:
    with RawClient(node.tcp_address) as p:
        p.identify({"client_id": "producer-x"})
        p.pub(topic, b"1")
        p.pub(topic, b"2")
        st = http_api.stats(addr(node))
        prods = [x for x in st["producers"] if x["client_id"] == "producer-x"]
        assert len(prods) == 1
        assert {"topic": topic, "count": 2} in prods[0]["pub_counts"]


def test_stats_text(node: NsqdProcess, topic: str) -> None:
    a = addr(node)
    with consumer(node.tcp_address, topic, "c", rdy=0):
        http_api.pub(a, topic, b"x")
        r = get(a, "/stats")
        assert r.status == 200
        text = r.body.decode()
        assert f"[{topic}" in text and "depth" in text
        assert "[c" in text
        r = get(a, "/stats", format="text", topic=topic)
        assert f"[{topic}" in r.body.decode()


# --------------------------------------------------------------------------- config / metrics


def test_config_get(node: NsqdProcess) -> None:
    a = addr(node)
    r = get(a, "/config/max_msg_size")
    assert (r.status, r.json()) == (200, MAX_MSG)
    r = get(a, "/config/max_req_timeout")
    assert r.json() == 5_000_000_000
    r = get(a, "/config/nsqlookupd_tcp_addresses")
    assert r.json() == []
    r = get(a, "/config/no_such_option")
    assert (r.status, err(r)) == (400, "INVALID_OPTION")


def test_config_put(node: NsqdProcess) -> None:
    a = addr(node)
    url = f"http://{a}/config"
    r = request("PUT", f"{url}/log_level", b"debug")
    assert r.status == 200, r
    assert json.loads(get(a, "/config/log_level").body) in ("debug", 1, 0)
    r = request("PUT", f"{url}/log_level", b"loud")
    assert (r.status, err(r)) == (400, "INVALID_VALUE")
    r = request("PUT", f"{url}/log_level", b"info")
    assert r.status == 200
    r = request("PUT", f"{url}/max_msg_size", b"5")
    assert (r.status, err(r)) == (400, "INVALID_OPTION")
    r = request("PUT", f"{url}/nsqlookupd_tcp_addresses", b'["127.0.0.1:1"]')
    assert (r.status, r.json()) == (200, ["127.0.0.1:1"])
    r = request("PUT", f"{url}/nsqlookupd_tcp_addresses", b"[]")
    assert (r.status, r.json()) == (200, [])
    r = request("PUT", f"{url}/nsqlookupd_tcp_addresses", b"{bad")
    assert (r.status, err(r)) == (400, "INVALID_VALUE")
    # the node still works after all that
    assert get(a, "/ping").status == 200


def test_metrics(node: NsqdProcess, topic: str) -> None:
    a = addr(node)
    with consumer(node.tcp_address, topic, "c", rdy=0):
        http_api.mpub(a, topic, [b"1", b"2", b"3"])
        r = get(a, "/metrics")
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/plain")
        text = r.body.decode()
        lines = [ln for ln in text.splitlines() if topic in ln and not ln.startswith("#")]
        assert lines, text[:2000]
        assert any(ln.split()[-1] in ("3", "3.0") for ln in lines), lines


def test_http_published_delivered_with_attempts_and_timestamp(node: NsqdProcess, topic: str) -> None:
    before = time.time_ns()
    with consumer(node.tcp_address, topic, "c", rdy=5) as c:
        http_api.mpub(addr(node), topic, [b"one", b"two"])
        ms = c.read_messages(2)
    after = time.time_ns()
    assert [m.body for m in ms] == [b"one", b"two"]
    assert all(m.attempts == 1 for m in ms)
    assert all(before - 10**9 <= m.timestamp_ns <= after + 10**9 for m in ms)
    assert ms[0].id != ms[1].id and all(len(m.id) == 16 for m in ms)


def test_stats_client_counters(node: NsqdProcess, topic: str) -> None:
    a = addr(node)
    with consumer(node.tcp_address, topic, "c", rdy=5) as c:
        http_api.mpub(a, topic, [b"1", b"2", b"3"])
        ms = c.read_messages(3)
        c.send(v2.fin(ms[0].id) + v2.req(ms[1].id, 60_000))
        c.expect_nothing(0.3)
        st = http_api.channel_stats(a, topic, "c")
        assert st is not None
        assert st["in_flight_count"] == 1 and st["deferred_count"] == 1
        assert st["requeue_count"] == 1 and st["message_count"] == 3
        cl = st["clients"][0]
        assert (cl["ready_count"], cl["in_flight_count"], cl["message_count"],
                cl["finish_count"], cl["requeue_count"]) == (5, 1, 3, 1, 1)
