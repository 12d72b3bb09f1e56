"""A fast path for HTTP ``POST /pub`` in front of aiohttp, on nsqd's plain HTTP listener.

Speed: aiohttp spends ~150 us of server CPU on a keep-alive ``/pub`` (request and
response objects, middlewares, routing); Go nsqd ~30. A read holding exactly one plain
``POST /pub?topic=<name> HTTP/1.1`` with a Content-Length body is answered
here with the same status and headers (~20 us), also when the head and the body come
in separate reads. Anything else (another path or method, a query beyond ``topic``,
chunked bodies, ``Expect``, ``Connection`` other than keep-alive, pipelined requests, requests cut short,
errors) hands the connection to aiohttp for good, so every rule and error of the
HTTP API stays in one place (``nsqd.http``).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from typing import Any

from nsqx.httpapi import V1_HEADER, V1_VALUE
from nsqx.protocol.names import valid_topic_name

__all__ = ["NEED_MORE", "FastPubProtocol", "parse_simple_pub"]

log = logging.getLogger("nsqx.nsqd.http")

_PREFIX = b"POST /pub?topic="
_SUFFIX = b" HTTP/1.1"
_REFUSED = (b"transfer-encoding", b"expect", b"connection", b"upgrade")


NEED_MORE = 0  # parse_simple_pub: a plain request so far, not complete yet
MAX_HEAD = 8192  # a longer head is not a plain request: aiohttp decides


def parse_simple_pub(data: bytes, max_msg_size: int) -> tuple[bytes, bytes] | int | None:
    """(topic, body) when ``data`` is exactly one plain HTTP/1.1 POST /pub, NEED_MORE
    when it is the start of one (clients often send the head and the body apart),
    else None."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        plausible = data.startswith(_PREFIX) or _PREFIX.startswith(data)
        return NEED_MORE if plausible and len(data) < MAX_HEAD else None
    line_end = data.find(b"\r\n")
    if not data.startswith(_PREFIX) or not data.endswith(_SUFFIX, 0, line_end):
        return None
    topic = data[len(_PREFIX) : line_end - len(_SUFFIX)]
    if b"#" in topic or not valid_topic_name(topic):  # '#' would start a URL fragment
        return None
    length = -1
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
        elif name == b"connection" and value.strip().lower() == b"keep-alive":
            continue  # what requests/urllib3 send: HTTP/1.1's default anyway
        elif name in _REFUSED:
            return None
    if not 0 < length <= max_msg_size or len(data) > head_end + 4 + length:
        return None
    if len(data) < head_end + 4 + length:
        return NEED_MORE
    return topic, data[head_end + 4 :]


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


class FastPubProtocol(asyncio.Protocol):
    """Answers plain ``/pub`` requests itself; delegates the connection to aiohttp else."""

    def __init__(self, nsqd: Any, inner: asyncio.Protocol) -> None:
        self.nsqd = nsqd
        self.inner = inner  # aiohttp's RequestHandler for this connection
        self.transport: asyncio.Transport | None = None
        self.delegated = False
        self._busy = False  # a fast publish waits for its commit
        self._held: list[bytes] = []  # what came meanwhile (answered in order after it)
        self._partial = b""  # the start of a plain request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def eof_received(self) -> bool | None:
        if self._busy:
            return True  # keep the transport open until the pending answer is out
        if self._partial:  # a request cut short: aiohttp answers it as it would
            self.delegated = True
            data, self._partial = self._partial, b""
            self.inner.data_received(data)
        return self.inner.eof_received()

    def data_received(self, data: bytes) -> None:
        if self.delegated:
            self.inner.data_received(data)
            return
        if self._busy:
            self._held.append(data)
            return
        if self._partial:
            data = self._partial + data
            self._partial = b""
        if not self._try_fast(data):
            self.delegated = True
            self.inner.data_received(data)

    def _try_fast(self, data: bytes) -> bool:
        nsqd = self.nsqd
        if nsqd.exiting:
            return False
        req = parse_simple_pub(data, nsqd.opts.max_msg_size)
        if req is None:
            return False
        if req == NEED_MORE:
            self._partial = data
            return True
        assert isinstance(req, tuple)
        topic = nsqd.get_topic(req[0].decode("ascii"))  # creates it, as /pub does
        if topic is None:
            return False
        from nsqx.nsqd.topic import BadPartition

        try:
            part = topic.route(None)
        except BadPartition:  # ordered topic: the general path answers the error
            return False
        self._busy = True
        producer = ""
        if part.tracer is not None and self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            producer = str(peer[0]) if isinstance(peer, tuple) else ""
        part.publish([req[1]], 0, self._committed, producer=producer)
        return True

    def _committed(self, _base: int, exc: Exception | None) -> None:
        self._busy = False
        t = self.transport
        if t is None or t.is_closing():
            return
        if exc is None:
            t.write(_response(b"200 OK", b"text/plain; charset=utf-8", b"OK"))
            if log.isEnabledFor(logging.DEBUG):  # the line nsqd.http's middleware logs
                log.debug("200 POST /pub (%s) fast path", t.get_extra_info("peername"))
        else:
            log.error("HTTP publish failed - %s", exc)
            from nsqx.nsqd.topic import PublishRefused

            code = b"E_PUB_FAILED" if isinstance(exc, PublishRefused) else b"EXITING"
            t.write(_response(b"503 Service Unavailable", b"application/json; charset=utf-8",
                              b'{"message":"%s"}' % code))
        if self._held:
            data = b"".join(self._held)
            self._held = []
            self.data_received(data)
