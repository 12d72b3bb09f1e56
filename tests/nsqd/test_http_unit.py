"""nsqd HTTP API against a fake node facade: every endpoint and upstream error code."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqx import NSQ_VERSION
from nsqx.nsqd.http import make_app, parse_go_query, parse_mpub_binary
from nsqx.nsqd.options import TLS_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, Options
from tests.nsqd.nsqd_fakes import FakeClient, FakeNSQD

V1 = "nsq; version=1.0"

Scenario = Callable[[TestClient, FakeNSQD], Awaitable[None]]


def run(scenario: Scenario, nsqd: FakeNSQD | None = None, **app_kw: Any) -> FakeNSQD:
    node = nsqd or FakeNSQD()

    async def main() -> None:
        client = TestClient(TestServer(make_app(node, **app_kw), host="127.0.0.1"))
        await client.start_server()
        try:
            await scenario(client, node)
        finally:
            await client.close()

    asyncio.run(main())
    return node


async def expect(resp: Any, status: int, body: bytes | str | None = None) -> bytes:
    data = await resp.read()
    assert resp.status == status, (resp.status, data)
    assert resp.headers.get("X-NSQ-Content-Type") == V1
    if body is not None:
        assert data == (body.encode() if isinstance(body, str) else body)
    return data


async def raw(c: TestClient, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """Send a request line byte for byte (the client library would re-quote it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", c.server.port)
    writer.write(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode("utf-8", "surrogateescape") + body)
    data = await reader.read()
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 400 or b"nsq; version=1.0" in head:
        assert b"X-NSQ-Content-Type: nsq; version=1.0" in head
    return status, payload


def err(code: str) -> bytes:
    return orjson.dumps({"message": code})


# ---------------------------------------------------------------- basics

def test_ping_ok_and_unhealthy() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.get("/ping"), 200, "OK")
        n.error = "failed to write to disk"
        await expect(await c.get("/ping"), 500, "NOK - failed to write to disk")

    run(s)


def test_info_shape() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        r = await c.get("/info")
        info = orjson.loads(await expect(r, 200))
        assert r.headers["Content-Type"].startswith("application/json")
        assert list(info) == [
            "version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time",
            "max_heartbeat_interval", "max_output_buffer_size", "max_output_buffer_timeout",
            "max_deflate_level", "topology_zone", "topology_region",
        ]
        assert info["version"] == NSQ_VERSION
        assert info["broadcast_address"] == "node1.example"
        assert info["tcp_port"] == 4150 and info["http_port"] == 4151
        assert info["max_heartbeat_interval"] == 60_000_000_000
        assert info["max_output_buffer_timeout"] == 30_000_000_000
        assert info["max_output_buffer_size"] == 65536
        assert info["max_deflate_level"] == 6
        assert info["start_time"] == n.start_time

    run(s)


def test_not_found_and_method_not_allowed() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.get("/not_found"), 404, err("NOT_FOUND"))
        await expect(await c.post("/stats"), 405, err("METHOD_NOT_ALLOWED"))
        await expect(await c.get("/pub?topic=t"), 405, err("METHOD_NOT_ALLOWED"))
        await expect(await c.delete("/config/log_level"), 405, err("METHOD_NOT_ALLOWED"))
        await expect(await c.head("/ping"), 405)

    run(s)


def test_internal_error_has_no_traceback() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        n.stats_error = RuntimeError("secret internals")
        data = await expect(await c.get("/stats?format=json"), 500, err("INTERNAL_ERROR"))
        assert b"secret" not in data and b"Traceback" not in data

    run(s)


# ---------------------------------------------------------------- /pub

def test_pub() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.post("/pub?topic=t1", data=b"hello"), 200, "OK")
        await expect(await c.post("/pub?topic=t1&defer=1000", data=b"later"), 200, "OK")
        await expect(await c.post("/pub?topic=t1&defer=3600000", data=b"max"), 200, "OK")
        assert n.topics["t1"].messages == [(b"hello", 0), (b"later", 1000), (b"max", 3600000)]
        # a body with newlines and binary bytes is one message
        await expect(await c.post("/pub?topic=t2%23ephemeral", data=b"a\nb\x00\xff"), 200)
        assert n.topics["t2#ephemeral"].messages == [(b"a\nb\x00\xff", 0)]

    run(s)


def test_pub_errors() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.post("/pub", data=b"x"), 400, err("MISSING_ARG_TOPIC"))
        await expect(await c.post("/pub?topic=bad!name", data=b"x"), 400, err("INVALID_TOPIC"))
        await expect(await c.post("/pub?topic=" + "a" * 65, data=b"x"), 400, err("INVALID_TOPIC"))
        await expect(await c.post("/pub?topic=", data=b"x"), 400, err("INVALID_TOPIC"))
        await expect(await c.post("/pub?topic=t"), 400, err("MSG_EMPTY"))
        await expect(await c.post("/pub?topic=t", data=b"x" * 1025), 413, err("MSG_TOO_BIG"))
        await expect(await c.post("/pub?topic=t", data=b"x" * 1024), 200, "OK")
        for bad in ("abc", "-1", "3600001", "1.5", "", "+"):
            r = await c.post(f"/pub?topic=t&defer={bad}", data=b"x")
            await expect(r, 400, err("INVALID_DEFER"))
        for q in ("topic=t&x=%zz", "topic=t;x=1", "topic=t%", "topic=%e"):
            assert await raw(c, "POST", f"/pub?{q}", b"x") == (400, err("INVALID_REQUEST"))
        assert await raw(c, "POST", "/pub?topic=%74", b"x") == (200, b"OK")
        n.publish_error = RuntimeError("log closed")
        await expect(await c.post("/pub?topic=t", data=b"x"), 503, err("EXITING"))
        n.publish_error = None
        n.exiting = True
        await expect(await c.post("/pub?topic=new", data=b"x"), 503, err("EXITING"))

    run(s, FakeNSQD(max_msg_size=1024, max_req_timeout=3600.0))


def test_pub_chunked_too_big_is_refused_without_buffering() -> None:
    sent = 0

    async def body():  # no Content-Length: chunked
        nonlocal sent
        for _ in range(10_000):
            sent += 1
            yield b"x" * 1000

    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.post("/pub?topic=t", data=body()), 413, err("MSG_TOO_BIG"))
        assert "t" not in n.topics or not n.topics["t"].messages

    run(s, FakeNSQD(max_msg_size=4096))


# ---------------------------------------------------------------- /mpub

def mpub_body(msgs: list[bytes]) -> bytes:
    return struct.pack(">i", len(msgs)) + b"".join(struct.pack(">i", len(m)) + m for m in msgs)


def test_mpub_text_and_binary() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.post("/mpub?topic=t", data=b"a\n\nb\nc\n"), 200, "OK")
        assert [m for m, _ in n.topics["t"].messages] == [b"a", b"b", b"c"]
        await expect(await c.post("/mpub?topic=t", data=b"x\r\n"), 200, "OK")
        assert n.topics["t"].messages[-1][0] == b"x\r"
        n.topics["t"].messages.clear()
        msgs = [b"one", b"two\nlines", b"\x00" * 10]
        for flag in ("true", "1", "yes"):
            await expect(await c.post(f"/mpub?topic=t&binary={flag}", data=mpub_body(msgs)), 200)
        assert [m for m, _ in n.topics["t"].messages] == msgs * 3
        n.topics["t"].messages.clear()
        for flag in ("false", "0"):
            await expect(await c.post(f"/mpub?topic=t&binary={flag}", data=b"p\nq"), 200)
        assert [m for m, _ in n.topics["t"].messages] == [b"p", b"q"] * 2
        # an empty text body publishes nothing and still answers OK (upstream)
        await expect(await c.post("/mpub?topic=t"), 200, "OK")

    run(s)


def test_mpub_errors() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.post("/mpub", data=b"x"), 400, err("MISSING_ARG_TOPIC"))
        await expect(await c.post("/mpub?topic=a/b", data=b"x"), 400, err("INVALID_TOPIC"))
        await expect(await c.post("/mpub?topic=t", data=b"x" * 101), 413, err("MSG_TOO_BIG"))
        await expect(await c.post("/mpub?topic=t", data=b"x\n" * 600), 413, err("BODY_TOO_BIG"))
        b = "/mpub?topic=t&binary=true"
        await expect(await c.post(b, data=b"\x00\x00"), 413, err("BAD_BODY"))
        await expect(await c.post(b, data=struct.pack(">i", 0)), 413, err("BAD_BODY"))
        await expect(await c.post(b, data=struct.pack(">i", -1)), 413, err("BAD_BODY"))
        await expect(await c.post(b, data=struct.pack(">i", 1000)), 413, err("BAD_BODY"))
        await expect(await c.post(b, data=struct.pack(">ii", 1, 0)), 413, err("BAD_MESSAGE"))
        await expect(await c.post(b, data=struct.pack(">ii", 1, 5) + b"abc"), 413,
                     err("BAD_MESSAGE"))
        await expect(await c.post(b, data=struct.pack(">ii", 2, 1) + b"a"), 413,
                     err("BAD_MESSAGE"))
        await expect(await c.post(b, data=mpub_body([b"y" * 101])), 413, err("BAD_MESSAGE"))
        n.publish_error = OSError("disk full")
        await expect(await c.post("/mpub?topic=t", data=b"a\nb"), 503, err("EXITING"))
        assert not n.topics["t"].messages

    run(s, FakeNSQD(max_msg_size=100, max_body_size=1000))


def test_parse_mpub_binary_trailing_bytes_ignored() -> None:
    body = mpub_body([b"a", b"bc"]) + b"junk"
    assert parse_mpub_binary(body, 10, 100) == [b"a", b"bc"]


# ---------------------------------------------------------------- topics

def test_topic_endpoints() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.post("/topic/create?topic=t"), 200, b"")
        assert "t" in n.topics
        await expect(await c.post("/topic/create"), 400, err("MISSING_ARG_TOPIC"))
        await expect(await c.post("/topic/create?topic=b@d"), 400, err("INVALID_TOPIC"))

        n.topics["t"].depth = 5
        await expect(await c.post("/topic/empty?topic=t"), 200, b"")
        assert n.topics["t"].emptied == 1 and n.topics["t"].depth == 0
        assert n.persisted == 1  # kept before the answer: a crash must not refill it
        await expect(await c.post("/topic/empty"), 400, err("MISSING_ARG_TOPIC"))
        await expect(await c.post("/topic/empty?topic=b@d"), 400, err("INVALID_TOPIC"))
        await expect(await c.post("/topic/empty?topic=nope"), 404, err("TOPIC_NOT_FOUND"))

        await expect(await c.post("/topic/pause?topic=t"), 200, b"")
        assert n.topics["t"].paused and n.persisted == 2
        await expect(await c.post("/topic/unpause?topic=t"), 200, b"")
        assert not n.topics["t"].paused and n.persisted == 3
        await expect(await c.post("/topic/pause"), 400, err("MISSING_ARG_TOPIC"))
        await expect(await c.post("/topic/unpause?topic=nope"), 404, err("TOPIC_NOT_FOUND"))

        await expect(await c.post("/topic/delete"), 400, err("MISSING_ARG_TOPIC"))
        await expect(await c.post("/topic/delete?topic=nope"), 404, err("TOPIC_NOT_FOUND"))
        await expect(await c.post("/topic/delete?topic=t"), 200, b"")
        assert "t" not in n.topics

    run(s)


def test_channel_endpoints() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.post("/channel/create?topic=t&channel=c"), 404,
                     err("TOPIC_NOT_FOUND"))
        n.get_topic("t")
        await expect(await c.post("/channel/create?topic=t&channel=c"), 200, b"")
        assert "c" in n.topics["t"].channels
        for path in ("create", "delete", "empty", "pause", "unpause"):
            url = f"/channel/{path}"
            await expect(await c.post(url), 400, err("MISSING_ARG_TOPIC"))
            await expect(await c.post(url + "?topic=b@d"), 400, err("INVALID_ARG_TOPIC"))
            await expect(await c.post(url + "?topic=t"), 400, err("MISSING_ARG_CHANNEL"))
            await expect(await c.post(url + "?topic=t&channel=b@d"), 400,
                         err("INVALID_ARG_CHANNEL"))
            await expect(await c.post(url + "?topic=zz&channel=c"), 404, err("TOPIC_NOT_FOUND"))
            if path != "create":
                await expect(await c.post(url + "?topic=t&channel=nope"), 404,
                             err("CHANNEL_NOT_FOUND"))
        ch = n.topics["t"].channels["c"]
        ch.depth = ch.in_flight_count = ch.deferred_count = 3
        created = n.persisted  # /channel/create answers once nsqd.dat names the channel
        assert created >= 1
        await expect(await c.post("/channel/empty?topic=t&channel=c"), 200, b"")
        assert ch.emptied == 1 and ch.depth == ch.in_flight_count == ch.deferred_count == 0
        await expect(await c.post("/channel/pause?topic=t&channel=c"), 200, b"")
        assert ch.paused and n.persisted == created + 1
        await expect(await c.post("/channel/unpause?topic=t&channel=c"), 200, b"")
        assert not ch.paused and n.persisted == created + 2
        await expect(await c.post("/channel/delete?topic=t&channel=c"), 200, b"")
        assert "c" not in n.topics["t"].channels

    run(s)


# ---------------------------------------------------------------- /stats

def _populated() -> FakeNSQD:
    n = FakeNSQD()
    t = n.get_topic("orders")
    assert t is not None
    t.message_count, t.message_bytes, t.depth, t.paused = 10, 100, 2, True
    ch = t.get_channel("archive")
    assert ch is not None
    ch.depth, ch.in_flight_count, ch.message_count = 4, 1, 8
    ch.clients[1] = FakeClient()
    n.get_topic("users")
    n.producers.append(FakeClient(pub_counts=[{"topic": "orders", "count": 10}], client_id="p1"))
    return n


def test_stats_json() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        st_ = orjson.loads(await expect(await c.get("/stats?format=json"), 200))
        assert list(st_) == ["version", "health", "start_time", "topics", "memory", "producers"]
        assert st_["version"] == NSQ_VERSION and st_["health"] == "OK"
        assert [t["topic_name"] for t in st_["topics"]] == ["orders", "users"]
        ch = st_["topics"][0]["channels"][0]
        assert ch["channel_name"] == "archive" and ch["depth"] == 4
        assert ch["clients"][0]["user_agent"] == "go-nsq/1.1.0"
        assert set(st_["memory"]) == {
            "heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
            "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
            "gc_total_runs",
        }
        assert st_["producers"][0]["client_id"] == "p1"

        st_ = orjson.loads(await expect(
            await c.get("/stats?format=json&include_mem=false&include_clients=0"), 200))
        assert "memory" not in st_
        assert st_["topics"][0]["channels"][0]["clients"] == []
        st_ = orjson.loads(await expect(await c.get("/stats?format=json&topic=users"), 200))
        assert [t["topic_name"] for t in st_["topics"]] == ["users"]
        st_ = orjson.loads(await expect(await c.get("/stats?format=json&topic=nope"), 200))
        assert st_["topics"] == []
        st_ = orjson.loads(await expect(
            await c.get("/stats?format=json&topic=orders&channel=nope"), 200))
        assert st_["topics"][0]["channels"] == []
        assert await raw(c, "GET", "/stats?format=json&%") == (400, err("INVALID_REQUEST"))

    run(s, _populated())


def test_stats_text() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        text = (await expect(await c.get("/stats"), 200)).decode()
        assert text.startswith(f"nsqd v{NSQ_VERSION} (built w/python")
        assert "\nHealth: OK\n" in text
        assert "\nMemory:\n   heap_objects" in text
        assert "\n*P [orders         ] depth: 2     be-depth: 2     msgs: 10       e2e%: \n" in text
        assert ("      [archive                  ] depth: 4     be-depth: 4     inflt: 1    "
                "def: 0    re-q: 0     timeout: 0     msgs: 8        e2e%: \n") in text
        assert "        [V2 host1:50000 go-nsq/1.1.0] state: 3 inflt: 0    rdy: 1    " in text
        assert "connected: 1m5s" in text
        assert "\nProducers:\n   [V2 host1:50000 go-nsq/1.1.0] msgs: 10       topics: orders=10" \
            in text
        text = (await expect(await c.get("/stats?format=text&include_mem=false&topic=x"), 200))
        assert b"Memory" not in text and b"\nTopics: None\n" in text

    run(s, _populated())


# ---------------------------------------------------------------- /config

def test_config_get() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        async def get(opt: str) -> Any:
            return orjson.loads(await expect(await c.get(f"/config/{opt}"), 200))

        assert await get("nsqlookupd_tcp_addresses") == []
        assert await get("msg_timeout") == 60_000_000_000
        assert await get("max_rdy_count") == 2500
        assert await get("log_level") == 2  # upstream's lg.INFO
        assert await get("id") == 7
        assert await get("tls_required") == 0
        assert await get("tls_min_version") == 0x0301
        assert await get("statsd_prefix") == "nsq.%s"
        assert await get("e2e_processing_latency_percentiles") == []
        assert await get("deflate") is True
        for bad in ("nope", "node_id", "config", "client_timeout"):
            await expect(await c.get(f"/config/{bad}"), 400, err("INVALID_OPTION"))

    run(s)


def test_config_put() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        url = "/config/nsqlookupd_tcp_addresses"
        addrs = b'["127.0.0.1:4160","127.0.0.1:4161"]'
        await expect(await c.put(url, data=addrs), 200, addrs)
        assert n.lookupd == [["127.0.0.1:4160", "127.0.0.1:4161"]]
        await expect(await c.put(url, data=b"[1,2]"), 400, err("INVALID_VALUE"))
        await expect(await c.put(url, data=b"{not json"), 400, err("INVALID_VALUE"))
        await expect(await c.put(url, data=b""), 413, err("INVALID_VALUE"))
        await expect(await c.put(url, data=b"x" * 2000), 413, err("INVALID_VALUE"))
        await expect(await c.put("/config/log_level", data=b"fatal"), 200, b"5")
        assert n.opts.log_level == "fatal"
        await expect(await c.put("/config/log_level", data=b"DEBUG"), 200, b"1")
        await expect(await c.put("/config/log_level", data=b"bad"), 400, err("INVALID_VALUE"))
        await expect(await c.put("/config/log_level", data=b"\xff"), 400, err("INVALID_VALUE"))
        await expect(await c.put("/config/max_rdy_count", data=b"5"), 400,
                     err("INVALID_OPTION"))

    run(s, FakeNSQD(max_msg_size=1024))


# ---------------------------------------------------------------- TLS required

def _tls_node(required: int) -> FakeNSQD:
    n = FakeNSQD(Options(node_id=1, tls_required=required, tls_cert="c", tls_key="k"))
    n.https_port = 4152
    return n


def test_tls_required_plain_listener() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        body = b'{"message": "TLS_REQUIRED", "https_port": 4152}'
        for path in ("/ping", "/stats", "/nope"):
            await expect(await c.get(path), 403, body)
        await expect(await c.post("/pub?topic=t", data=b"x"), 403, body)
        assert not n.topics

    run(s, _tls_node(TLS_REQUIRED))


def test_tls_listener_and_tcp_https_serve_normally() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        await expect(await c.get("/ping"), 200, "OK")

    run(s, _tls_node(TLS_REQUIRED), tls_listener=True)
    run(s, _tls_node(TLS_REQUIRED_EXCEPT_HTTP))


# ---------------------------------------------------------------- /metrics, /debug

def test_metrics_and_debug() -> None:
    async def s(c: TestClient, n: FakeNSQD) -> None:
        r = await c.get("/metrics")
        text = (await expect(r, 200)).decode()
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert 'nsq_topic_depth{topic="orders"} 2' in text
        assert 'nsq_channel_in_flight{topic="orders",channel="archive"} 1' in text
        assert 'nsq_channel_clients{topic="orders",channel="archive"} 1' in text
        assert "process_resident_memory_bytes " in text
        tasks = (await expect(await c.get("/debug/tasks"), 200)).decode()
        assert tasks.startswith("tasks: ") and "Stack for" in tasks
        await expect(await c.post("/debug/freememory"), 200, b"")

    run(s, _populated())


# ---------------------------------------------------------------- query parsing

def test_parse_go_query() -> None:
    assert parse_go_query("topic=a&topic=b&x=1+2&e=%41&&flag") == {
        "topic": ["a", "b"], "x": ["1 2"], "e": ["A"], "flag": [""],
    }
    for bad in ("a=%", "a=%4", "a=%zz", "a=1;b=2"):
        with pytest.raises(ValueError):
            parse_go_query(bad)


# ---------------------------------------------------------------- fuzz

ENDPOINTS = [
    ("POST", "/pub"), ("POST", "/mpub"), ("GET", "/stats"), ("POST", "/topic/create"),
    ("POST", "/topic/delete"), ("POST", "/topic/empty"), ("POST", "/topic/pause"),
    ("POST", "/channel/create"), ("POST", "/channel/delete"), ("POST", "/channel/empty"),
    ("POST", "/channel/unpause"), ("GET", "/config/log_level"), ("PUT", "/config/log_level"),
    ("PUT", "/config/nsqlookupd_tcp_addresses"), ("GET", "/info"), ("GET", "/metrics"),
]
_name = st.one_of(
    st.sampled_from(["t", "c", "t#ephemeral", "", "a" * 64, "a" * 65, "b@d", "%ff", "%zz",
                     "%C3%A9", "%00", "..", "a+b", "%", "t%23ephemeral"]),
    st.text(max_size=20).map(lambda s: s.replace("&", "").replace("#", "")),
)
_param = st.tuples(
    st.sampled_from(["topic", "channel", "binary", "defer", "format", "include_clients",
                     "include_mem", "x"]),
    _name,
)
_body = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n, parts: struct.pack(">i", n) + b"".join(parts),
              st.integers(-(2**31), 2**31 - 1),
              st.lists(st.builds(lambda sz, b: struct.pack(">i", sz) + b,
                                 st.integers(-5, 300), st.binary(max_size=50)), max_size=5)),
    st.just(b"\xff\xfe\xfd" * 200),
    st.just(b"x" * 5000),
)


def test_fuzz_never_500() -> None:
    async def main() -> None:
        node = FakeNSQD(max_msg_size=200, max_body_size=1000)
        node.get_topic("t").get_channel("c")  # type: ignore[union-attr]
        client = TestClient(TestServer(make_app(node), host="127.0.0.1"))
        await client.start_server()
        loop = asyncio.get_running_loop()
        try:
            @settings(max_examples=300, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])
            @given(endpoint=st.sampled_from(ENDPOINTS), params=st.lists(_param, max_size=4),
                   body=_body)
            def check(endpoint: tuple[str, str], params: list[tuple[str, str]],
                      body: bytes) -> None:
                method, path = endpoint
                query = "&".join(f"{k}={v}" for k, v in params)
                url = path + ("?" + query if query else "")

                async def one() -> None:
                    r = await client.request(method, url, data=body)
                    data = await r.read()
                    assert r.status != 500, (url, body, data)
                    assert b"Traceback" not in data
                    assert r.headers.get("X-NSQ-Content-Type") == V1 or r.status == 400

                asyncio.run_coroutine_threadsafe(one(), loop).result(timeout=30)

            await loop.run_in_executor(None, check)
        finally:
            await client.close()

    asyncio.run(main())


def test_fuzz_raw_query_strings_never_500() -> None:
    """Query strings sent byte for byte: bad escapes, bad UTF-8, odd separators."""
    async def main() -> None:
        node = FakeNSQD(max_msg_size=200, max_body_size=1000)
        node.get_topic("t").get_channel("c")  # type: ignore[union-attr]
        client = TestClient(TestServer(make_app(node), host="127.0.0.1"))
        await client.start_server()
        loop = asyncio.get_running_loop()
        try:
            chars = st.sampled_from(list("abct=&;%+#.-_09AFzZ") + ["%ff", "%C3", "%00", "\udcff"])

            @settings(max_examples=200, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])
            @given(endpoint=st.sampled_from(ENDPOINTS), query=st.lists(chars, max_size=30),
                   body=_body)
            def check(endpoint: tuple[str, str], query: list[str], body: bytes) -> None:
                method, path = endpoint
                target = path + "?" + "".join(query)

                async def one() -> None:
                    status, data = await raw(client, method, target, body)
                    assert status != 500, (target, body, data)
                    assert b"Traceback" not in data

                asyncio.run_coroutine_threadsafe(one(), loop).result(timeout=30)

            await loop.run_in_executor(None, check)
        finally:
            await client.close()

    asyncio.run(main())
