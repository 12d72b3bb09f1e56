"""Hypothesis fuzzing of a RUNNING nsqlookupd: arbitrary TCP streams after the magic and
arbitrary HTTP query strings. The node must answer well-formed responses (an error only as the
last one, then close), never crash, and leak no registrations once the peers are gone."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import quote

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nsqx.protocol import lookup_v1 as lk
from tests.support.lookupd_process import LookupdProcess

names = st.one_of(
    st.text(alphabet="abcXYZ09._-", min_size=1, max_size=12),
    st.sampled_from(["t#ephemeral", "*", "", "a" * 65, "bad name", "é"]),
)
ident_body = st.one_of(
    st.fixed_dictionaries({
        "version": st.sampled_from(["1.3.0", "", 3]),
        "tcp_port": st.one_of(st.integers(-5, 70000), st.just("4150")),
        "http_port": st.integers(0, 70000),
        "broadcast_address": st.sampled_from(["127.0.0.1", "", "<h>"]),
    }).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=40),
    st.sampled_from([b"null", b"{}", b"[]", b'{"tcp_port": 1e400}', b'{"a":' * 50]),
)
command = st.one_of(
    st.builds(lambda b: b"IDENTIFY\n" + len(b).to_bytes(4, "big") + b, ident_body),
    st.just(lk.identify({"version": "1.3.0", "tcp_port": 1, "http_port": 2,
                         "broadcast_address": "127.0.0.1"})),
    st.builds(lambda t, c: lk.register(t.encode(), c.encode() if c else None), names,
              st.one_of(st.none(), names)),
    st.builds(lambda t, c: lk.unregister(t.encode(), c.encode() if c else None), names,
              st.one_of(st.none(), names)),
    st.just(lk.ping()),
    st.sampled_from([b"\n", b"BOGUS\n", b"IDENTIFY\n\xff\xff\xff\xff", b"REGISTER\n",
                     b"PING" * 10, b"\r\n", b"IDENTIFY x y\n\x00\x00\x00\x02{}"]),
)
streams = st.lists(command, max_size=12).map(b"".join)


@st.composite
def mutated(draw):
    data = bytearray(draw(streams))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.integers(0, 2))
        i = draw(st.integers(0, len(data)))
        if op == 0 and i < len(data):
            data[i] = draw(st.integers(0, 255))
        elif op == 1:
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif i < len(data):
            del data[i : i + draw(st.integers(1, 8))]
    return bytes(data)


def exchange(ld: LookupdProcess, data: bytes, chunks: int) -> list[bytes]:
    """Send magic + data in ``chunks`` pieces, half-close, read every response until EOF."""
    s = socket.create_connection(("127.0.0.1", ld.tcp_port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        s.sendall(lk.MAGIC_V1)
        step = max(1, len(data) // max(1, chunks))
        try:
            for i in range(0, len(data), step):
                s.sendall(data[i:i + step])
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed after an error: fine
        reader = lk.ResponseReader()
        out: list[bytes] = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += reader.feed(chunk)
        return out
    finally:
        s.close()


def check_responses(responses: list[bytes]) -> None:
    event(f"responses: {min(len(responses), 3)}+")
    for i, r in enumerate(responses):
        event(f"saw {r[:10]!r}" if r.startswith(b"E_") or r == b"OK" else "saw IDENTIFY answer")
        if r.startswith(b"E_"):
            assert i == len(responses) - 1, "an error must be the last answer (all fatal)"
            assert r.split(b" ")[0] in (b"E_INVALID", b"E_BAD_BODY", b"E_BAD_TOPIC",
                                        b"E_BAD_CHANNEL"), r
        elif r != b"OK":
            d = json.loads(r)  # the IDENTIFY answer
            assert set(d) == {"broadcast_address", "hostname", "http_port", "tcp_port", "version"}


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=mutated(), chunks=st.integers(1, 5))
def test_tcp_fuzz_never_crashes(shared_lookupd, data, chunks):
    check_responses(exchange(shared_lookupd, data, chunks))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/lookup", "/channels", "/topics", "/nodes", "/topic/create",
                             "/topic/delete", "/channel/create", "/channel/delete",
                             "/topic/tombstone", "/debug", "/info"]),
       qs=st.one_of(
           st.dictionaries(st.sampled_from(["topic", "channel", "node", "x"]),
                           st.text(max_size=20), max_size=3)
           .map(lambda d: "&".join(f"{k}={quote(v)}" for k, v in d.items())),
           st.text(alphabet="%;&=+az#ZÿA0 ", max_size=20).map(lambda s: quote(s, safe="%;&=+"))))
def test_http_fuzz_never_500(shared_lookupd, path, qs):
    method = "GET" if path in ("/lookup", "/channels", "/topics", "/nodes", "/debug",
                               "/info") else "POST"
    url = f"http://{shared_lookupd.http_address}{path}?{qs}"
    req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, body, hdrs = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as e:
        status, body, hdrs = e.code, e.read(), e.headers
    assert status in (200, 400, 404), (status, body)
    assert hdrs["X-NSQ-Content-Type"] == "nsq; version=1.0"
    if status != 200:
        assert set(json.loads(body)) == {"message"}
    elif body:
        json.loads(body)


def test_after_fuzzing_nothing_leaked(shared_lookupd):
    """Runs after the fuzzers in this module: every peer is gone, so is every producer."""
    # one more hostile peer that stays identified until we close it
    s = socket.create_connection(("127.0.0.1", shared_lookupd.tcp_port), timeout=5)
    s.sendall(lk.MAGIC_V1 + lk.identify({"version": "1.3.0", "tcp_port": 1, "http_port": 2,
                                         "broadcast_address": "x"}) + lk.register("leak"))
    time.sleep(0.2)
    s.close()
    deadline = time.monotonic() + 5
    while True:
        debug = shared_lookupd.get_json("/debug")[1]
        nodes = shared_lookupd.get_json("/nodes")[1]["producers"]
        if not debug and not nodes:
            break
        assert time.monotonic() < deadline, (debug, nodes)
        time.sleep(0.05)
    with urllib.request.urlopen(f"http://{shared_lookupd.http_address}/ping", timeout=5) as r:
        assert r.read() == b"OK"
    assert shared_lookupd.is_running()
