"""A fast path for HTTP ``POST /pub`` and ``/mpub`` in front of aiohttp, on nsqd's plain
HTTP listener.

Speed: aiohttp spends ~150 us of server CPU on a keep-alive ``/pub`` (request and
response objects, middlewares, routing); Go nsqd ~30. A plain ``POST /pub?topic=<name>``,
``POST /mpub?topic=<name>`` or ``POST /mpub?topic=<name>&binary=true`` over HTTP/1.1 with
a Content-Length body is answered here with the same status and headers (~20 us), also
when the head and the body come in separate reads, and when requests are pipelined
(each is answered in order, after the commit of the one before). Anything else (another
path, method or query, chunked bodies, ``Expect``, ``Connection`` other than keep-alive,
a body upstream refuses, requests cut short, auth) hands the connection to aiohttp for
good, from the first request not answered here on, so every rule and error of the HTTP
API stays in one place (``nsqd.http``).

aiohttp and the rest of the API load after the listener opens (``DeferredApp``): importing
them is most of a node's start. Until they are ready this path also answers a plain
``GET /ping`` (the node takes publishes already), and a connection handed to aiohttp waits
with what it sent until aiohttp can take it, instead of being refused.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nsqx.httpbase import V1_HEADER, V1_VALUE, HTTPError
from nsqx.nsqd.http_publish import parse_mpub_binary, split_text_mpub
from nsqx.nsqd.topic import BadPartition, PublishRefused
from nsqx.protocol import v2
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.names import valid_topic_name

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI

__all__ = ["NEED_MORE", "DeferredApp", "FastPubProtocol", "parse_fast_request"]

log = logging.getLogger("nsqx.nsqd.http")

_POST = b"POST /"
_SUFFIX = b" HTTP/1.1"
# (an Idempotency-Key goes to the general path: nsqd.http_publish.publish_once)
_REFUSED = (b"transfer-encoding", b"expect", b"connection", b"upgrade", b"idempotency-key")
# the query strings taken here, after "?topic=<name>" (upstream's boolParams for binary)
_MPUB_QUERY = {b"": "mpub", b"&binary=true": "mpub_bin", b"&binary=1": "mpub_bin",
               b"&binary=false": "mpub", b"&binary=0": "mpub"}


NEED_MORE = 0  # parse_fast_request: a plain request so far, not complete yet
MAX_HEAD = 8192  # a longer head is not a plain request: aiohttp decides


def _target(line: bytes) -> tuple[str, bytes] | None:
    """(kind, topic) of a request line this path serves: "pub", "mpub" or "mpub_bin"."""
    if line.startswith(b"POST /pub?topic="):
        kind, rest = "pub", line[16:]
        topic, amp, query = rest, b"", b""
    elif line.startswith(b"POST /mpub?topic="):
        topic, amp, query = line[17:].partition(b"&")
        found = _MPUB_QUERY.get(amp + query)
        if found is None:
            return None
        kind = found
    else:
        return None
    if b"#" in topic or not valid_topic_name(topic):  # '#' would start a URL fragment
        return None
    return kind, topic


def parse_fast_request(data: bytes, max_msg_size: int, max_body_size: int
                       ) -> tuple[str, bytes, bytes, int] | int | None:
    """(kind, topic, body, end) when ``data`` starts with one whole plain HTTP/1.1
    ``POST /pub`` or ``/mpub`` (``end``: where the next, pipelined, request starts),
    NEED_MORE when it is the start of one (clients often send the head and the body
    apart), else None."""
    head_end = data.find(b"\r\n\r\n", 0, MAX_HEAD)
    if head_end < 0:
        plausible = data.startswith(_POST) or _POST.startswith(data[:6])
        return NEED_MORE if plausible and len(data) < MAX_HEAD else None
    line_end = data.find(b"\r\n")
    if not data.endswith(_SUFFIX, 0, line_end):
        return None
    target = _target(data[:line_end - len(_SUFFIX)])
    if target is None:
        return None
    kind, topic = target
    length = -1
    host = False  # HTTP/1.1 without Host is a 400: aiohttp (nsqx.httpapi) answers it
    for line in data[line_end + 2 : head_end].split(b"\r\n"):
        name, colon, value = line.partition(b":")
        if not colon or name[:1] in (b" ", b"\t") or name != name.strip():
            return None  # folded or malformed header: the general parser decides
        name = name.lower()
        if name == b"content-length":
            value = value.strip()
            if length >= 0 or not value.isdigit():
                return None
            length = int(value)
        elif name == b"host":
            host = True
        elif name == b"connection" and value.strip().lower() == b"keep-alive":
            continue  # what requests/urllib3 send: HTTP/1.1's default anyway
        elif name in _REFUSED:
            return None
    if not host or not 0 < length <= (max_msg_size if kind == "pub" else max_body_size):
        return None
    end = head_end + 4 + length
    if len(data) < end:
        return NEED_MORE
    return kind, topic, data[head_end + 4 : end], end


def parse_simple_pub(data: bytes, max_msg_size: int) -> tuple[bytes, bytes] | int | None:
    """(topic, body) when ``data`` is exactly one plain ``POST /pub``, NEED_MORE when it is
    the start of one, else None (parse_fast_request for /pub alone)."""
    req = parse_fast_request(data, max_msg_size, max_msg_size)
    if req is None or req == NEED_MORE:
        return req
    assert isinstance(req, tuple)
    kind, topic, body, end = req
    return (topic, body) if kind == "pub" and end == len(data) else None


class _Date:
    """The Date header, formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


_DATE = _Date()


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return b"".join((b"HTTP/1.1 ", status, b"\r\nContent-Type: ", content_type,
                     b"\r\n", V1_HEADER.encode(), b": ", V1_VALUE.encode(),
                     b"\r\nDate: ", _DATE.get(), b"\r\nContent-Length: ",
                     str(len(body)).encode(), b"\r\n\r\n", body))


class DeferredApp:
    """The aiohttp side of the plain listener, set once the node has built it: ``factory``
    makes one aiohttp RequestHandler per connection (None until then), ``ready`` is done
    when it is set or failed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.factory: Callable[[], asyncio.Protocol] | None = None
        self.ready: asyncio.Future[None] = loop.create_future()

    def set(self, factory: Callable[[], asyncio.Protocol]) -> None:
        self.factory = factory
        if not self.ready.done():
            self.ready.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self.ready.done():
            return
        if isinstance(exc, asyncio.CancelledError):  # the node stopped first
            self.ready.cancel()
        else:
            self.ready.set_exception(exc)
            self.ready.exception()  # retrieved: the node logs it


_PING = b"GET /ping HTTP/1.1\r\n"


class FastPubProtocol(asyncio.Protocol):
    """Answers plain ``/pub`` requests itself; delegates the connection to aiohttp else."""

    def __init__(self, nsqd: NodeAPI, app: DeferredApp) -> None:
        self.nsqd = nsqd
        self.app = app
        self.inner: asyncio.Protocol | None = None  # aiohttp's RequestHandler, once there is one
        self.transport: asyncio.Transport | None = None
        self.delegated = False
        self._busy = False  # a fast publish waits for its commit
        self._held: list[bytes] = []  # what came meanwhile (answered in order after it)
        self._partial = b""  # the start of a plain request
        self._waiting: list[bytes] | None = None  # delegated before aiohttp was ready
        self._eof = False  # ...and the peer's EOF came meanwhile

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.app.factory is not None:
            self.inner = self.app.factory()
            self.inner.connection_made(transport)
        else:  # aiohttp gets the connection once it is there, as every other one
            self.app.ready.add_done_callback(self._app_ready)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def eof_received(self) -> bool | None:
        if self._busy:
            return True  # keep the transport open until the pending answer is out
        if self._partial:  # a request cut short: aiohttp answers it as it would
            data, self._partial = self._partial, b""
            self._delegate(data)
        if self._waiting is not None:
            self._eof = True
            return True  # aiohttp answers what came once it is ready
        if self.inner is None:
            return None  # nothing was handed on: close
        return self.inner.eof_received()

    def data_received(self, data: bytes) -> None:
        if self.delegated:
            if self._waiting is not None:
                self._waiting.append(data)
            else:
                self.inner.data_received(data)  # type: ignore[union-attr]
            return
        if self._busy:
            self._held.append(data)
            return
        if self._partial:
            data = self._partial + data
            self._partial = b""
        if not self._try_fast(data):
            self._delegate(data)

    def _delegate(self, data: bytes) -> None:
        """Hand the connection to aiohttp for good, from ``data`` on."""
        self.delegated = True
        if self.inner is None:
            if self.app.factory is None:  # still loading: keep what came until it is there
                self._waiting = [data]  # (_app_ready is called then)
                return
            self.inner = self.app.factory()
            self.inner.connection_made(self.transport)  # type: ignore[arg-type]
        self.inner.data_received(data)

    def _app_ready(self, ready: asyncio.Future[None]) -> None:
        waiting, self._waiting = self._waiting, None
        t = self.transport
        if t is None or t.is_closing():
            return
        if ready.cancelled() or ready.exception() is not None or self.app.factory is None:
            if waiting is not None:
                t.close()  # the node is stopping or its API failed to load
            return
        self.inner = inner = self.app.factory()
        inner.connection_made(t)
        if waiting is not None:
            inner.data_received(b"".join(waiting))
            if self._eof and not inner.eof_received():
                t.close()

    def _ping(self, data: bytes) -> bool:
        """``GET /ping`` while aiohttp loads: the node's health, as ``nsqd.http`` answers it.
        Only a whole plain request with nothing after it; anything else waits for aiohttp."""
        end = data.find(b"\r\n\r\n", 0, MAX_HEAD)
        t = self.transport
        if end < 0 or end + 4 != len(data) or t is None:
            return False
        head = data[len(_PING):end]
        close = host = False  # HTTP/1.1 without Host: aiohttp's answer (a 400), when loaded
        for line in head.split(b"\r\n") if head else ():
            name, colon, value = line.partition(b":")
            name, value = name.lower(), value.strip().lower()
            if not colon or name != name.strip() or name == b"content-length":
                return False
            if name == b"host":
                host = True
            elif name == b"connection" and value in (b"close", b"keep-alive"):
                close = value == b"close"
            elif name in _REFUSED:
                return False
        if not host:
            return False
        health = self.nsqd.health()
        status = b"200 OK" if self.nsqd.is_healthy() else b"500 Internal Server Error"
        t.write(_response(status, b"text/plain; charset=utf-8", health.encode()))
        if close:
            t.close()
        return True

    def _try_fast(self, data: bytes) -> bool:
        nsqd = self.nsqd
        if nsqd.exiting:
            return False
        if self.app.factory is None and data.startswith(_PING) and self._ping(data):
            return True
        o = nsqd.opts
        req = parse_fast_request(data, o.max_msg_size, o.max_body_size)
        if req is None:
            return False
        if req == NEED_MORE:
            self._partial = data
            return True
        assert isinstance(req, tuple)
        kind, name, body, end = req
        if kind == "pub":
            bodies = [body]
        else:
            try:
                bodies = (parse_mpub_binary(body, o.max_msg_size, o.max_body_size)
                          if kind == "mpub_bin" else
                          split_text_mpub(body, o.max_msg_size, o.max_body_size))
            except HTTPError:  # aiohttp answers it with upstream's code
                return False
            if not bodies:
                return False
        workers = nsqd.workers
        if workers is not None and not workers.owned(name.decode("ascii")):
            # --workers: another worker's topic, forwarded as TCP's publishes are
            self._busy = True
            if end < len(data):
                self._held.append(data[end:])
            workers.forward(name.decode("ascii"),
                            v2.pub(name, bodies[0]) if kind == "pub" else v2.mpub(name, bodies),
                            self._forwarded)
            return True
        topic = nsqd.get_topic(name.decode("ascii"))  # creates it, as /pub does
        if topic is None:
            return False
        try:
            part = topic.route(None)
        except BadPartition:  # ordered topic: the general path answers the error
            return False
        self._busy = True
        if end < len(data):  # pipelined: the next request waits for this answer
            self._held.append(data[end:])
        producer = ""
        if part.tracer is not None and self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            producer = str(peer[0]) if isinstance(peer, tuple) else ""
        part.publish(bodies, 0, self._committed, producer=producer)
        return True

    def _forwarded(self, _answer: bytes | None, exc: Exception | None) -> None:
        """The owner's answer to a forwarded publish, as this node's /pub gives it."""
        if isinstance(exc, ProtocolError) and exc.code == "E_BAD_PARTITION":
            # TCP's text names the command ("PUB topic t is ordered: ..."), HTTP's not
            text = exc.text.partition(" ")[2] if exc.text.startswith(("PUB ", "MPUB ")) \
                else exc.text
            self._committed(0, None, (b"400 Bad Request", f"E_BAD_PARTITION {text}"))
            return
        self._committed(0, None if exc is None else PublishRefused(str(exc)))

    def _committed(self, _base: int, exc: Exception | None,
                   refusal: tuple[bytes, str] | None = None) -> None:
        self._busy = False
        t = self.transport
        if t is None or t.is_closing():
            return
        if refusal is not None:
            t.write(_response(refusal[0], b"application/json; charset=utf-8",
                              json.dumps({"message": refusal[1]}, separators=(",", ":")).encode()))
        elif exc is None:
            t.write(_response(b"200 OK", b"text/plain; charset=utf-8", b"OK"))
            if log.isEnabledFor(logging.DEBUG):  # the line nsqd.http's middleware logs
                log.debug("200 POST /pub|/mpub (%s) fast path", t.get_extra_info("peername"))
        else:
            log.error("HTTP publish failed - %s", exc)
            code = b"E_PUB_FAILED" if isinstance(exc, PublishRefused) else b"EXITING"
            t.write(_response(b"503 Service Unavailable", b"application/json; charset=utf-8",
                              b'{"message":"%s"}' % code))
        if self._held:
            data = b"".join(self._held)
            self._held = []
            self.data_received(data)
