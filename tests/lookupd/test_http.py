"""nsqlookupd's HTTP API against a real process: every endpoint, upstream's V1 conventions
(X-NSQ-Content-Type, {"message": CODE} errors, raw bodies), routing errors, hostile input."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

import pytest

from nsqx.protocol import lookup_v1 as lk
from tests.lookupd.rawpeer import RawPeer, ident
from tests.support.http_api import Response
from tests.support.lookupd_process import LookupdProcess

V1 = "nsq; version=1.0"
ACCEPT_V1 = "application/vnd.nsq; version=1.0"


@pytest.fixture
def lookupd(shared_lookupd: LookupdProcess) -> LookupdProcess:
    return shared_lookupd


def call(lookupd: LookupdProcess, method: str, path: str, headers: dict | None = None,
         body: bytes | None = None, **params) -> Response:
    url = f"http://{lookupd.http_address}{path}"
    if params:
        url += "?" + urlencode(params)
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                            resp.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def get(lookupd, path, **params):
    return call(lookupd, "GET", path, **params)


def post(lookupd, path, **params):
    return call(lookupd, "POST", path, body=b"", **params)


def assert_error(r: Response, status: int, code: str) -> None:
    assert r.status == status, (r.status, r.body)
    assert r.body == json.dumps({"message": code}, separators=(",", ":")).encode()
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert r.headers["x-nsq-content-type"] == V1


def raw_http(lookupd: LookupdProcess, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", lookupd.http_port), timeout=5) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


# ---------------------------------------------------------------- basics

def test_ping(lookupd):
    r = get(lookupd, "/ping")
    assert (r.status, r.body) == (200, b"OK")
    assert r.headers["content-type"].startswith("text/plain")


def test_info(lookupd):
    r = get(lookupd, "/info")
    assert r.status == 200
    assert r.body == b'{"version":"1.3.0"}'
    assert r.headers["x-nsq-content-type"] == V1
    assert r.headers["content-type"] == "application/json; charset=utf-8"


@pytest.mark.parametrize("path", ["/ping", "/info", "/topics", "/nodes", "/debug",
                                  "/lookup?topic=nope", "/channels?topic=x", "/nope"])
def test_accept_header_changes_nothing(lookupd, path):
    """Since nsq 1.0 every client gets V1, whatever it sends in Accept."""
    plain = call(lookupd, "GET", path)
    v1 = call(lookupd, "GET", path, headers={"Accept": ACCEPT_V1})
    other = call(lookupd, "GET", path, headers={"Accept": "text/html"})
    assert plain.status == v1.status == other.status
    assert plain.body == v1.body == other.body
    for r in (plain, v1, other):
        assert r.headers["x-nsq-content-type"] == V1


# ---------------------------------------------------------------- lookup / topics / channels

def test_lookup_errors(lookupd):
    assert_error(get(lookupd, "/lookup"), 400, "MISSING_ARG_TOPIC")
    assert_error(get(lookupd, "/lookup", topic="http_never"), 404, "TOPIC_NOT_FOUND")
    assert_error(get(lookupd, "/lookup?topic=%zz"), 400, "INVALID_REQUEST")
    assert_error(get(lookupd, "/lookup?topic=a;b"), 400, "INVALID_REQUEST")
    assert_error(get(lookupd, "/lookup?topic="), 404, "TOPIC_NOT_FOUND")
    assert_error(get(lookupd, "/channels"), 400, "MISSING_ARG_TOPIC")
    assert_error(get(lookupd, "/channels?x=%"), 400, "INVALID_REQUEST")


def test_topic_create_and_lookup(lookupd):
    assert_error(post(lookupd, "/topic/create"), 400, "MISSING_ARG_TOPIC")
    assert_error(post(lookupd, "/topic/create", topic="bad topic"), 400, "INVALID_ARG_TOPIC")
    assert_error(post(lookupd, "/topic/create", topic="x" * 65), 400, "INVALID_ARG_TOPIC")
    r = post(lookupd, "/topic/create", topic="http_t1")
    assert (r.status, r.body) == (200, b"")
    assert r.headers["x-nsq-content-type"] == V1
    r = get(lookupd, "/lookup", topic="http_t1")
    assert r.status == 200
    assert r.body == b'{"channels":[],"producers":[]}'
    assert "http_t1" in get(lookupd, "/topics").json()["topics"]
    assert get(lookupd, "/channels", topic="http_t1").json() == {"channels": []}
    assert get(lookupd, "/channels", topic="http_unknown").json() == {"channels": []}


def test_channel_create_delete(lookupd):
    for params, code in (({}, "MISSING_ARG_TOPIC"),
                         ({"topic": "a/b"}, "INVALID_ARG_TOPIC"),
                         ({"topic": "http_t2"}, "MISSING_ARG_CHANNEL"),
                         ({"topic": "http_t2", "channel": "c c"}, "INVALID_ARG_CHANNEL")):
        assert_error(post(lookupd, "/channel/create", **params), 400, code)
        assert_error(post(lookupd, "/channel/delete", **params), 400, code)
    r = post(lookupd, "/channel/create", topic="http_t2", channel="c1")
    assert (r.status, r.body) == (200, b"")
    post(lookupd, "/channel/create", topic="http_t2", channel="c2#ephemeral")
    # the topic is created with it
    assert get(lookupd, "/lookup", topic="http_t2").json() == {
        "channels": ["c1", "c2#ephemeral"], "producers": []}
    assert get(lookupd, "/channels", topic="http_t2").json() == {"channels": ["c1", "c2#ephemeral"]}
    assert_error(post(lookupd, "/channel/delete", topic="http_t2", channel="c3"), 404,
                 "CHANNEL_NOT_FOUND")
    assert post(lookupd, "/channel/delete", topic="http_t2", channel="c1").status == 200
    assert get(lookupd, "/channels", topic="http_t2").json() == {"channels": ["c2#ephemeral"]}
    assert_error(post(lookupd, "/channel/delete", topic="http_t2", channel="c1"), 404,
                 "CHANNEL_NOT_FOUND")


def test_topic_delete(lookupd):
    assert_error(post(lookupd, "/topic/delete"), 400, "MISSING_ARG_TOPIC")
    post(lookupd, "/channel/create", topic="http_t3", channel="c1")
    post(lookupd, "/channel/create", topic="http_t3", channel="c2")
    with RawPeer(lookupd.tcp_address) as p:
        p.identify(ident(7001))
        assert p.call(lk.register("http_t3", "c1")) == b"OK"
        r = post(lookupd, "/topic/delete", topic="http_t3")
        assert (r.status, r.body) == (200, b"")
        assert_error(get(lookupd, "/lookup", topic="http_t3"), 404, "TOPIC_NOT_FOUND")
        assert get(lookupd, "/channels", topic="http_t3").json() == {"channels": []}
        assert "http_t3" not in get(lookupd, "/topics").json()["topics"]
        # the nsqd's registrations went with it; its connection is fine
        nodes = [n for n in get(lookupd, "/nodes").json()["producers"]
                 if n["remote_address"] == p.local_address]
        assert nodes[0]["topics"] == []
        assert p.call(lk.ping()) == b"OK"
    # deleting an unknown topic is not an error (upstream)
    assert post(lookupd, "/topic/delete", topic="http_never").status == 200


def test_lookup_output_format(lookupd):
    with RawPeer(lookupd.tcp_address) as p:
        p.identify(ident(7101, hostname="h<&>", topology_zone="z"))
        assert p.call(lk.register("http_t4", "c1")) == b"OK"
        r = get(lookupd, "/lookup", topic="http_t4")
        assert r.status == 200
        # Go's struct field order and Go's HTML-safe string escapes
        expected = (
            '{"channels":["c1"],"producers":[{"remote_address":"ADDR",'
            '"hostname":"h\\u003c\\u0026\\u003e","broadcast_address":"127.0.0.1",'
            '"tcp_port":7101,"http_port":7102,"version":"1.3.0","topology_zone":"z",'
            '"topology_region":""}]}').replace("ADDR", p.local_address)
        assert r.body.decode() == expected


def test_nodes_and_debug(lookupd):
    with RawPeer(lookupd.tcp_address) as p:
        p.identify(ident(7201))
        for line in (lk.register("http_t5", "c"), lk.register("http_t5b")):
            assert p.call(line) == b"OK"
        nodes = [n for n in get(lookupd, "/nodes").json()["producers"]
                 if n["remote_address"] == p.local_address]
        assert len(nodes) == 1
        node = nodes[0]
        assert list(node) == ["remote_address", "hostname", "broadcast_address", "tcp_port",
                              "http_port", "version", "topology_zone", "topology_region",
                              "tombstones", "topics"]
        assert node["topics"] == ["http_t5", "http_t5b"]
        assert node["tombstones"] == [False, False]
        debug = get(lookupd, "/debug")
        assert debug.status == 200
        data = debug.json()
        assert list(data) == sorted(data)
        for key in ("client::", "topic:http_t5:", "channel:http_t5:c", "topic:http_t5b:"):
            entries = [e for e in data[key] if e["id"] == p.local_address]
            assert len(entries) == 1, key
            e = entries[0]
            assert e["tcp_port"] == 7201 and e["http_port"] == 7202
            assert e["tombstoned"] is False
            assert e["tombstoned_at"] == -6795364578871345152  # Go's zero time
            assert isinstance(e["last_update"], int) and e["last_update"] > 0


def test_tombstone(lookupd):
    assert_error(post(lookupd, "/topic/tombstone"), 400, "MISSING_ARG_TOPIC")
    assert_error(post(lookupd, "/topic/tombstone", topic="x"), 400, "MISSING_ARG_NODE")
    with RawPeer(lookupd.tcp_address) as a, RawPeer(lookupd.tcp_address) as b:
        a.identify(ident(7301))
        b.identify(ident(7401))
        for p in (a, b):
            assert p.call(lk.register("http_t6", "c")) == b"OK"
            assert p.call(lk.register("http_t6b")) == b"OK"
        r = post(lookupd, "/topic/tombstone", topic="http_t6", node="127.0.0.1:7302")
        assert (r.status, r.body) == (200, b"")
        producers = get(lookupd, "/lookup", topic="http_t6").json()["producers"]
        assert [x["tcp_port"] for x in producers] == [7401]
        # only that topic
        assert len(get(lookupd, "/lookup", topic="http_t6b").json()["producers"]) == 2
        # /nodes still lists the node, with the tombstone flag per topic
        node = next(n for n in get(lookupd, "/nodes").json()["producers"]
                    if n["remote_address"] == a.local_address)
        assert dict(zip(node["topics"], node["tombstones"], strict=True)) == {
            "http_t6": True, "http_t6b": False}
        entry = next(e for e in get(lookupd, "/debug").json()["topic:http_t6:"]
                     if e["id"] == a.local_address)
        assert entry["tombstoned"] is True and entry["tombstoned_at"] > 0
        # an unknown node or topic changes nothing
        post(lookupd, "/topic/tombstone", topic="http_t6", node="127.0.0.1:1")
        post(lookupd, "/topic/tombstone", topic="http_nope", node="127.0.0.1:7402")
        assert len(get(lookupd, "/lookup", topic="http_t6").json()["producers"]) == 1


def test_wildcard_topic_like_upstream(lookupd):
    """Upstream's registry treats "*" as a wildcard, /lookup?topic=* included."""
    post(lookupd, "/channel/create", topic="http_w1", channel="cw")
    data = get(lookupd, "/lookup", topic="*").json()
    assert "cw" in data["channels"]


# ---------------------------------------------------------------- routing

def test_not_found_and_method_not_allowed(lookupd):
    assert_error(get(lookupd, "/nope"), 404, "NOT_FOUND")
    assert_error(get(lookupd, "/"), 404, "NOT_FOUND")
    assert_error(post(lookupd, "/nope"), 404, "NOT_FOUND")
    r = post(lookupd, "/lookup", topic="x")
    assert_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "GET, OPTIONS"
    r = get(lookupd, "/topic/create", topic="x")
    assert_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "POST, OPTIONS"
    assert_error(call(lookupd, "PUT", "/topics", body=b"x"), 405, "METHOD_NOT_ALLOWED")
    assert_error(call(lookupd, "DELETE", "/nope"), 404, "NOT_FOUND")
    r = call(lookupd, "OPTIONS", "/lookup")
    assert r.status == 200 and r.headers["allow"] == "GET, OPTIONS"


def test_sloppy_paths_redirect_like_httprouter(lookupd):
    raw = raw_http(lookupd, b"GET /lookup/?topic=x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 301")
    assert b"Location: /lookup?topic=x" in raw
    raw = raw_http(lookupd, b"GET /TOPICS HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 301") and b"Location: /topics" in raw
    raw = raw_http(lookupd, b"POST /topic//create?topic=a HTTP/1.1\r\nHost: a\r\n"
                            b"Content-Length: 0\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 308") and b"Location: /topic/create?topic=a" in raw


def test_head_is_not_get(lookupd):
    raw = raw_http(lookupd, b"HEAD /ping HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 405")


# ---------------------------------------------------------------- hostile input

def test_request_body_is_ignored(lookupd):
    big = b"x" * (4 * 1024 * 1024)
    r = call(lookupd, "POST", "/topic/create?topic=http_big", body=big)
    assert r.status == 200
    assert get(lookupd, "/lookup", topic="http_big").status == 200


@pytest.mark.parametrize("data", [
    b"GARBAGE\r\n\r\n",
    b"GET /ping HTTP/9.9\r\n\r\n",
    b"GET /lookup?topic=" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: a\r\nX: " + b"b" * 100_000 + b"\r\n\r\n",
    b"POST /topic/create?topic=a HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
    b"POST /topic/create?topic=a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"\x00\xff\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
])
def test_malformed_http_never_hurts(lookupd, data):
    before = len(lookupd.log_bytes())
    out = raw_http(lookupd, data)
    assert not out or out.startswith(b"HTTP/1.")
    assert b"aiohttp" not in out and b"\r\nServer:" not in out
    assert get(lookupd, "/ping").body == b"OK"
    new = lookupd.log_bytes()[before:]  # the client's mistake: no traceback, no ERROR
    assert b"Traceback" not in new, new  # (TCP lines of the shared lookupd's probes aside)
    assert not [ln for ln in new.splitlines() if b"ERROR" in ln and b"HTTP" in ln], new


def test_unicode_and_odd_query_values(lookupd):
    assert_error(get(lookupd, "/lookup?topic=%C3%A9t%C3%A9"), 404, "TOPIC_NOT_FOUND")
    assert_error(get(lookupd, "/lookup?topic=%FF"), 404, "TOPIC_NOT_FOUND")
    assert_error(post(lookupd, "/topic/create?topic=%FF"), 400, "INVALID_ARG_TOPIC")
    assert get(lookupd, "/channels?topic=a&topic=b").status == 200


def test_inactive_producer_timeout_and_tombstone_lifetime(lookupd_factory):
    ld = lookupd_factory.start(["--inactive-producer-timeout=600ms", "--tombstone-lifetime=600ms"])
    with RawPeer(ld.tcp_address) as a, RawPeer(ld.tcp_address) as b:
        a.identify(ident(7501))
        b.identify(ident(7601))
        for p in (a, b):
            assert p.call(lk.register("t", "c")) == b"OK"
        assert ld.get_json("/info")[0] == 200
        post(ld, "/topic/tombstone", topic="t", node="127.0.0.1:7502")
        ports = [x["tcp_port"] for x in ld.get_json("/lookup?topic=t")[1]["producers"]]
        assert ports == [7601]
        time.sleep(0.4)
        assert b.call(lk.ping()) == b"OK"
        time.sleep(0.35)
        # a: tombstone over but no PING for > 600ms -> inactive; b pinged
        ports = [x["tcp_port"] for x in ld.get_json("/lookup?topic=t")[1]["producers"]]
        assert ports == [7601]
        assert [n["tcp_port"] for n in ld.get_json("/nodes")[1]["producers"]] == [7601]
        assert a.call(lk.ping()) == b"OK"
        ports = [x["tcp_port"] for x in ld.get_json("/lookup?topic=t")[1]["producers"]]
        assert sorted(ports) == [7501, 7601]
        # inactive producers are filtered, never dropped: /topics, /channels, /debug keep them
        time.sleep(0.7)
        assert ld.get_json("/lookup?topic=t")[1] == {"channels": ["c"], "producers": []}
        assert ld.get_json("/nodes")[1] == {"producers": []}
        assert len(ld.get_json("/debug")[1]["topic:t:"]) == 2


def test_debug_tasks_lists_the_servers_tasks(lookupd):
    r = get(lookupd, "/debug/tasks")
    assert r.status == 200
    body = r.body.decode()
    assert body.startswith("tasks: ") and "\n--- " in body
