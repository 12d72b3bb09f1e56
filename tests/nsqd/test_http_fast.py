"""nsqd's HTTP /pub fast path (nsqd.http_fast): what it takes, what it hands to aiohttp."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from nsqx.nsqd.http_fast import NEED_MORE, parse_fast_request, parse_simple_pub
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import consumer

MAX = 1000


def req(target: bytes = b"/pub?topic=t", body: bytes = b"hi", *, method: bytes = b"POST",
        version: bytes = b"HTTP/1.1", headers: list[bytes] | None = None) -> bytes:
    hs = headers if headers is not None else [b"Host: x", b"Content-Length: %d" % len(body)]
    return b"%s %s %s\r\n%s\r\n\r\n%s" % (method, target, version, b"\r\n".join(hs), body)


def test_parse_simple_pub_takes_plain_requests() -> None:
    assert parse_simple_pub(req(), MAX) == (b"t", b"hi")
    assert parse_simple_pub(req(headers=[b"content-length:   2", b"host: x", b"User-Agent: curl"]), MAX) == (
        b"t", b"hi")
    assert parse_simple_pub(req(body=b"x" * MAX), MAX) == (b"t", b"x" * MAX)
    assert parse_simple_pub(req(headers=[b"Connection: Keep-Alive", b"Host: x", b"Content-Length: 2"]),
                            MAX) == (b"t", b"hi")  # python-requests sends it


@pytest.mark.parametrize("data", [
    req(method=b"PUT"), req(b"/mpub?topic=t"), req(b"/pub?topic=t&defer=10"),
    req(b"/pub?topic=bad%20name"), req(b"/pub?topic=a#ephemeral"), req(b"/pub?topic="),
    req(version=b"HTTP/1.0"), req(body=b""), req(body=b"x" * (MAX + 1)),
    req(headers=[b"Host: x"]),  # no Content-Length
    req(headers=[b"Content-Length: 2"]),  # no Host: aiohttp answers 400
    req(headers=[b"Host: x", b"Content-Length: 2", b"Content-Length: 2"]),
    req(headers=[b"Host: x", b"Content-Length: +2"]),
    req(headers=[b"Host: x", b"Content-Length : 2"]),
    req(headers=[b"Host: x", b"Content-Length: 2", b"Transfer-Encoding: chunked"]),
    req(headers=[b"Host: x", b"Content-Length: 2", b"Expect: 100-continue"]),
    req(headers=[b"Host: x", b"Content-Length: 2", b"Connection: close"]),
    req(headers=[b"Host: x", b"Content-Length: 2", b"Connection: Upgrade"]),
    req(headers=[b"Host: x", b"Content-Length: 2", b" folded"]),
    req(headers=[b"Host: x", b"Content-Length: 2", b"junk"]),
    req() + b"G",  # the start of a pipelined request
    b"GET /stats HTTP/1.1\r\n", b"POST /pub?topic=t HTTP/1.1\r\n" + b"X: y\r\n" * 2000,
])
def test_parse_simple_pub_refuses_the_rest(data: bytes) -> None:
    assert parse_simple_pub(data, MAX) is None


@pytest.mark.parametrize("data", [b"", b"PO", b"POST /pub?topic=t HTTP/1.1\r\nHost: x",
                                  req()[:-1], req(body=b"")[:-2]])
def test_parse_simple_pub_waits_for_the_rest(data: bytes) -> None:
    assert parse_simple_pub(data, MAX) == NEED_MORE


def test_parse_fast_request_takes_mpub_and_pipelined_requests() -> None:
    assert parse_fast_request(req(b"/mpub?topic=t", b"a\nb"), MAX, 4 * MAX) == (
        "mpub", b"t", b"a\nb", len(req(b"/mpub?topic=t", b"a\nb")))
    for q, kind in ((b"&binary=true", "mpub_bin"), (b"&binary=1", "mpub_bin"),
                    (b"&binary=false", "mpub"), (b"&binary=0", "mpub")):
        assert parse_fast_request(req(b"/mpub?topic=t" + q), MAX, 4 * MAX)[0] == kind
    # /mpub bodies may be up to max_body_size, /pub bodies up to max_msg_size
    assert parse_fast_request(req(b"/mpub?topic=t", b"x" * 3 * MAX), MAX, 4 * MAX)[0] == "mpub"
    assert parse_fast_request(req(body=b"x" * 3 * MAX), MAX, 4 * MAX) is None
    two = req(body=b"one") + req(b"/mpub?topic=u", b"two")
    kind, topic, body, end = parse_fast_request(two, MAX, MAX)
    assert (kind, topic, body) == ("pub", b"t", b"one") and two[end:] == req(b"/mpub?topic=u",
                                                                            b"two")
    assert parse_fast_request(two[end:], MAX, MAX)[:3] == ("mpub", b"u", b"two")


@pytest.mark.parametrize("target", [b"/mpub?topic=t&binary=yes", b"/mpub?topic=t&x=1",
                                    b"/mpub?binary=true&topic=t", b"/mpub?topic=bad%20n",
                                    b"/mpubx?topic=t", b"/pub?topic=t&binary=true"])
def test_parse_fast_request_refuses_other_queries(target: bytes) -> None:
    assert parse_fast_request(req(target), MAX, MAX) is None


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NsqdProcess]:
    factory = NsqdFactory(Path(tmp_path_factory.mktemp("nsqd-http-fast")))
    try:
        yield factory.start()
    finally:
        complaints = factory.close()
    assert not complaints, complaints


def responses(sock: socket.socket, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read n HTTP/1.1 responses (Content-Length bodies) from a keep-alive socket."""
    buf = b""
    out = []
    sock.settimeout(10)
    while len(out) < n:
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0:
            lines = buf[:head_end].decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            end = head_end + 4 + int(headers["content-length"])
            if len(buf) >= end:
                out.append((int(lines[0].split()[1]), headers, buf[head_end + 4 : end]))
                buf = buf[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, "server closed the connection"
        buf += chunk
    assert buf == b""
    return out


def test_fast_and_general_requests_on_one_connection(node: NsqdProcess) -> None:
    topic = "fastpub"
    host, port = node.http_address.rsplit(":", 1)
    expected = []
    with socket.create_connection((host, int(port))) as s:
        for i in range(20):  # all fast, the first creating the topic
            body = b"m%02d" % i
            s.sendall(req(b"/pub?topic=" + topic.encode(), body))
            ((status, headers, got),) = responses(s, 1)
            assert (status, got) == (200, b"OK")
            assert headers["content-type"] == "text/plain; charset=utf-8"
            assert headers["x-nsq-content-type"] == "nsq; version=1.0"
            expected.append(body)
        # two requests in one send: handed to aiohttp, answered in order
        s.sendall(req(b"/pub?topic=" + topic.encode(), b"p1") + req(b"/pub?topic=" + topic.encode(),
                                                                     b""))
        (st1, _, b1), (st2, _, b2) = responses(s, 2)
        assert (st1, b1, st2, b2) == (200, b"OK", 400, b'{"message":"MSG_EMPTY"}')
        expected.append(b"p1")
        s.sendall(req(b"/pub?topic=" + topic.encode(), b"after"))  # still served
        assert responses(s, 1)[0][:1] == (200,)
        expected.append(b"after")
    with socket.create_connection((host, int(port))) as s:  # head and body sent apart
        for part in (b"PO", b"ST /pub?topic=" + topic.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Le",
                     b"ngth: 5\r\n\r\n", b"sp", b"lit"):
            s.sendall(part)
            time.sleep(0.05)
        assert responses(s, 1)[0][::2] == (200, b"OK")
        expected.append(b"split")
    with socket.create_connection((host, int(port))) as s:  # cut short: aiohttp answers 400
        s.sendall(b"POST /pub?topic=" + topic.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 9\r\n\r\nab")
        s.shutdown(socket.SHUT_WR)
        s.settimeout(10)
        rest = b""
        while chunk := s.recv(65536):
            rest += chunk
        assert b"OK" not in rest  # nothing published, whatever aiohttp says
    with socket.create_connection((host, int(port))) as s:  # chunked: aiohttp's job
        s.sendall(b"POST /pub?topic=" + topic.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n5\r\nchunk\r\n0\r\n\r\n")
        assert responses(s, 1)[0][::2] == (200, b"OK")
        expected.append(b"chunk")
    topics = http_api.stats(node.http_address, topic)["topics"]
    assert [t["message_count"] for t in topics if t["topic_name"] == topic] == [len(expected)]
    with consumer(node.tcp_address, topic, "c", rdy=100) as c:
        assert [m.body for m in c.drain_messages(quiet=0.5)] == expected


def test_mpub_and_pipelining_on_the_fast_path(node: NsqdProcess) -> None:
    """Text and binary /mpub, and pipelined requests (answered in order, each after its
    commit), with one request upstream refuses in the middle (aiohttp answers it and
    everything after it); the messages arrive in order."""
    import struct

    topic = b"fastmpub"
    host, port = node.http_address.rsplit(":", 1)
    binary = struct.pack(">i", 2) + struct.pack(">i", 2) + b"b1" + struct.pack(">i", 2) + b"b2"
    with socket.create_connection((host, int(port))) as s:
        s.sendall(req(b"/mpub?topic=" + topic, b"t1\n\nt2\n"))
        assert responses(s, 1)[0][::2] == (200, b"OK")
        s.sendall(req(b"/mpub?topic=" + topic + b"&binary=true", binary)
                  + req(b"/pub?topic=" + topic, b"p1") + req(b"/mpub?topic=" + topic, b"p2\np3"))
        assert [(st, b) for st, _, b in responses(s, 3)] == [(200, b"OK")] * 3
        # a binary body with a bad size: 413 BAD_MESSAGE from aiohttp, then the next one
        bad = struct.pack(">i", 1) + struct.pack(">i", 99) + b"x"
        s.sendall(req(b"/pub?topic=" + topic, b"p4") + req(b"/mpub?topic=" + topic
                                                           + b"&binary=true", bad)
                  + req(b"/pub?topic=" + topic, b"p5"))
        got = [(st, b) for st, _, b in responses(s, 3)]
        assert got == [(200, b"OK"), (413, b'{"message":"BAD_MESSAGE"}'), (200, b"OK")]
    expected = [b"t1", b"t2", b"b1", b"b2", b"p1", b"p2", b"p3", b"p4", b"p5"]
    with consumer(node.tcp_address, topic.decode(), "c", rdy=100) as c:
        assert [m.body for m in c.drain_messages(quiet=0.5)] == expected


class _Transport:
    """What FastPubProtocol writes, and whether it closed the connection."""

    def __init__(self) -> None:
        self.out = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> None:
        return None


class _Inner:
    """aiohttp's RequestHandler as the fast path drives it: what it was handed, in order."""

    def __init__(self, log: list[tuple[str, object]]) -> None:
        self.log = log

    def connection_made(self, transport: object) -> None:
        self.log.append(("made", transport))

    def data_received(self, data: bytes) -> None:
        self.log.append(("data", data))

    def eof_received(self) -> bool:
        self.log.append(("eof", None))
        return True

    def connection_lost(self, exc: object) -> None:
        self.log.append(("lost", exc))


class _Node:
    exiting = False
    opts = SimpleNamespace(max_msg_size=MAX, max_body_size=MAX)

    def __init__(self) -> None:
        self.error: str | None = None

    def health(self) -> str:
        return "OK" if self.error is None else f"NOK - {self.error}"

    def is_healthy(self) -> bool:
        return self.error is None


def test_while_aiohttp_loads_ping_is_answered_and_the_rest_waits() -> None:
    """The plain listener opens before aiohttp is loaded (issue 24): /ping answers with the
    node's health, any other request is held, in order, and handed over once it is there."""
    import asyncio

    from nsqx.nsqd.http_fast import DeferredApp, FastPubProtocol

    async def main() -> None:
        loop = asyncio.get_running_loop()
        app, node, log = DeferredApp(loop), _Node(), []
        p, t = FastPubProtocol(node, app), _Transport()  # type: ignore[arg-type]
        p.connection_made(t)  # type: ignore[arg-type]
        p.data_received(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert t.out.startswith(b"HTTP/1.1 200 OK\r\n") and t.out.endswith(b"\r\n\r\nOK")
        node.error, t.out = "disk full", b""
        p.data_received(b"GET /ping HTTP/1.1\r\nhost: x\r\nConnection: keep-alive\r\n\r\n")
        assert t.out.startswith(b"HTTP/1.1 500 ") and t.out.endswith(b"NOK - disk full")
        t.out = b""
        stats = b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n"
        p.data_received(stats[:10])
        p.data_received(stats[10:])
        p.data_received(b"GET /ping HTTP/1.1\r\n\r\n")  # no Host, and after a delegated one
        assert p.eof_received() is True  # held open: aiohttp answers what came
        assert t.out == b"" and not t.closed
        app.set(lambda: _Inner(log))
        await asyncio.sleep(0)
        assert log == [("made", t), ("data", stats + b"GET /ping HTTP/1.1\r\n\r\n"),
                       ("eof", None)]
        p.data_received(b"more")
        assert log[-1] == ("data", b"more")
        # a connection made once aiohttp is there goes to aiohttp from the start, /ping too
        log.clear()
        q, t2 = FastPubProtocol(node, app), _Transport()  # type: ignore[arg-type]
        q.connection_made(t2)  # type: ignore[arg-type]
        q.data_received(b"GET /ping HTTP/1.1\r\n\r\n")
        assert t2.out == b"" and log == [("made", t2), ("data", b"GET /ping HTTP/1.1\r\n\r\n")]
        # a /ping without Host is aiohttp's to answer (a 400), so it waits too
        later = DeferredApp(loop)
        h, t4 = FastPubProtocol(node, later), _Transport()  # type: ignore[arg-type]
        h.connection_made(t4)  # type: ignore[arg-type]
        h.data_received(b"GET /ping HTTP/1.1\r\n\r\n")
        assert t4.out == b"" and h.delegated
        # the API failed to load: a held request's connection is closed, not left hanging
        failed = DeferredApp(loop)
        r, t3 = FastPubProtocol(node, failed), _Transport()  # type: ignore[arg-type]
        r.connection_made(t3)  # type: ignore[arg-type]
        r.data_received(stats)
        failed.fail(RuntimeError("no aiohttp"))
        await asyncio.sleep(0)
        assert t3.closed and t3.out == b""

    asyncio.run(main())
