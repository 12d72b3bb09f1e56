"""Replication as a stream: one connection per (follower, leader) pair carries the fetches of
every partition the follower copies from that leader, as small binary frames.

Why: over HTTP every fetch is a request the leader parses, routes and answers through
aiohttp (a third of the leader's replication CPU); on the stream a fetch is a 34-byte
frame and an answer is one header plus the log bytes as stored.

The stream is authenticated from its first byte. It opens as an HTTP request on the cluster
listener (so it goes through the members' mutual TLS when configured)::

    GET /nsqx/replica/stream?node=<id> HTTP/1.1
    Connection: Upgrade
    Upgrade: tcp
    X-Nsqx-Node/-To/-Time/-Nonce/-Signature: the cluster signature (trust.Signer), made
        for the leader's cluster address: good on that node only

which the leader checks like every internal request (signature, the signer is the node the
request names, that node's etcd registration is alive); a refusal is the ordinary HTTP
answer (401/403 with a JSON reason) and the connection ends. ``101 Switching Protocols``
starts the frames (big-endian)::

    follower -> leader  FETCH   length:u32 id:u32 partition:u32 epoch:u64 offset:u64
                                max_bytes:u32 wait_ms:u16 topic:utf-8
    leader -> follower  ANSWER  length:u32 id:u32 status:u16 head_length:u32 head frames

``length`` counts the bytes after itself. An answer's head and status are those of
``GET /nsqx/replica/fetch`` (JSON; an error's body is its head), its frames the stored log
bytes, so both paths share the follower's and the leader's fetch code; answers come in any
order (a fetch at the tail is long-polled) and are matched by id. A fetch is the follower's
ack exactly as over HTTP; the leader checks the follower's registration again on each one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import orjson
from aiohttp import web

from nsqx.cluster import fetchconn

log = logging.getLogger("nsqx.cluster.stream")

__all__ = ["PATH", "StreamConnection", "StreamRefused", "cork", "serve"]

PATH = "/nsqx/replica/stream"
FETCH = struct.Struct(">IIIQQIH")  # length, id, partition, epoch, offset, max_bytes, wait_ms
ANSWER = struct.Struct(">IIHI")  # length, id, status, head length
MAX_FETCH_FRAME = FETCH.size + 1024  # a topic name is at most 64 bytes upstream
MAX_ANSWER = 128 << 20  # the leader caps max_bytes at 64 MiB

# (topic, partition, epoch, offset, max_bytes, wait seconds) -> (status, head, frames)
FetchFn = Callable[[str, int, int, int, int, float], Awaitable[tuple[int, bytes, Any]]]


def cork(sock: Any, on: int) -> bool:
    """Set TCP_CORK on a transport's socket (False where it cannot be set)."""
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, on)
    except (OSError, AttributeError):  # (AttributeError: a platform without TCP_CORK)
        return False
    return True


# ------------------------------------------------------------------------------ leader side
class _FetchParser:
    """Takes aiohttp's payload-parser slot after the upgrade: FETCH frames in, one callback
    per frame; a malformed frame ends the stream (``bad``)."""

    def __init__(self, on_fetch: Callable[..., None], done: asyncio.Future[None]) -> None:
        self.on_fetch = on_fetch
        self.done = done
        self.buf = b""
        self.bad = ""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        buf = self.buf + data if self.buf else data
        pos, n = 0, len(buf)
        while n - pos >= 4:
            length = int.from_bytes(buf[pos:pos + 4], "big")
            if not FETCH.size - 4 <= length <= MAX_FETCH_FRAME:
                return self._fail(f"FETCH frame of {length} bytes")
            if n - pos < 4 + length:
                break
            _, rid, p, epoch, offset, max_bytes, wait_ms = FETCH.unpack_from(buf, pos)
            try:
                topic = buf[pos + FETCH.size:pos + 4 + length].decode()
            except UnicodeDecodeError:
                return self._fail("topic name is not UTF-8")
            pos += 4 + length
            self.on_fetch(rid, topic, p, epoch, offset, max_bytes, wait_ms)
        self.buf = buf[pos:]
        return False, b""

    def _fail(self, why: str) -> tuple[bool, bytes]:
        self.bad = why
        self.feed_eof()
        return False, b""

    def feed_eof(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def serve(request: web.Request, fetch: FetchFn, active: set[asyncio.Future[None]]
                ) -> web.StreamResponse:
    """Answer 101 and serve the caller's FETCH frames until it goes away (the handshake is
    checked by the caller of this function); setting the future it adds to ``active`` ends
    the stream (a node shutting down: the listener's cleanup would wait for it)."""
    transport = request.transport
    resp = web.StreamResponse(status=101, headers={"Connection": "Upgrade", "Upgrade": "tcp"})
    resp.force_close()
    if transport is None:
        return resp
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    tasks: set[asyncio.Task[None]] = set()
    sock = transport.get_extra_info("socket")
    tls = transport.get_extra_info("sslcontext") is not None

    async def answer(rid: int, topic: str, p: int, epoch: int, offset: int, max_bytes: int,
                     wait_ms: int) -> None:
        try:
            status, head, data = await fetch(topic, p, epoch, offset, max_bytes, wait_ms / 1000)
        except Exception as e:  # never leave the follower waiting for an id
            log.exception("CLUSTER: stream fetch of %s/%d failed", topic, p)
            status, head, data = 500, orjson.dumps({"message": "E_INTERNAL",
                                                    "detail": str(e)}), b""
        if transport.is_closing():
            return
        prefix = ANSWER.pack(ANSWER.size - 4 + len(head) + len(data), rid, status, len(head))
        if not data:
            transport.write(prefix + head)
            return
        if tls:
            # one call: the SSL transport encrypts both into its buffer and sends them in
            # one write (two write() calls: two sends, the follower woken for the head alone)
            transport.writelines((prefix + head, data))
            return
        # the frames go out as stored (no copy into a bigger buffer); TCP_CORK makes the
        # small prefix and the frames one transmission, as the HTTP answer's two sends
        corked = cork(sock, 1)
        try:
            transport.write(prefix + head)
            transport.write(data)
        finally:
            if corked:
                cork(sock, 0)

    def on_fetch(*args: Any) -> None:
        t = loop.create_task(answer(*args))
        tasks.add(t)
        t.add_done_callback(tasks.discard)

    # The parser takes the connection's bytes before the 101 goes out: the follower's first
    # frame may come back faster than this handler resumes. (aiohttp's C parser switches
    # protocols by itself only for websocket; bytes sent before the 101 are parsed as HTTP,
    # which is why the follower waits for it.)
    parser = _FetchParser(on_fetch, done)
    request.protocol.set_parser(parser)
    request.protocol.keep_alive(False)
    await resp.prepare(request)
    active.add(done)
    try:
        await done
    finally:
        active.discard(done)
        for t in list(tasks):
            t.cancel()
        if parser.bad:
            log.warning("CLUSTER: replication stream from %s closed: %s", request.remote,
                        parser.bad)
        transport.close()
    return resp


# ---------------------------------------------------------------------------- follower side
class StreamRefused(Exception):
    """The leader answered the handshake with ``status`` (404/405: it has no stream)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


class _Proto(fetchconn._Proto):
    """The fetch connection's buffering; frames are taken as they complete (``want``: the
    bytes the next frame needs, 0 while its header is not in) and matched to ``pending``."""

    def __init__(self) -> None:
        super().__init__()
        self.head: asyncio.Future[bytes] | None = None  # the handshake's answer head
        self.pending: dict[int, asyncio.Future[tuple[int, memoryview, memoryview]]] = {}

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        try:
            if self.head is not None:
                self._handshake()
            else:
                self._frames()
        except ValueError as e:
            self._fail(e)

    def _handshake(self) -> None:
        assert self.head is not None
        buf = self.joined()
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > fetchconn.MAX_HEAD:
                raise ValueError("handshake answer head too long")
            return
        head, self.head = self.head, None
        status = buf.split(b" ", 2)[1] if buf.startswith(b"HTTP/1.") else b""
        if status == b"101":
            self.chunks, self.size = [buf[end + 4:]], len(buf) - end - 4
            head.set_result(buf[:end])
            self._frames()
            return
        try:
            code, length, _ = fetchconn.parse_head(buf[:end])
        except ValueError as e:
            head.set_exception(e)
            return
        self.head = head  # wait for the refusal's body
        if len(buf) >= end + 4 + length:
            self.head = None
            head.set_exception(StreamRefused(code, buf[end + 4:end + 4 + length]))

    def _frames(self) -> None:
        while True:
            if not self.want:
                if self.size < ANSWER.size:
                    return
                buf = self.joined()
                length = int.from_bytes(buf[:4], "big")
                if not ANSWER.size - 4 <= length <= MAX_ANSWER:
                    raise ValueError(f"ANSWER frame of {length} bytes")
                self.want = 4 + length
            if self.size < self.want:
                return
            buf = self.joined()  # one copy of a frame that came in several reads
            _, rid, status, hlen = ANSWER.unpack_from(buf)
            view = memoryview(buf)
            want, self.want = self.want, 0
            head = view[ANSWER.size:ANSWER.size + hlen]
            frames = view[ANSWER.size + hlen:want]
            rest = buf[want:]
            self.chunks, self.size = ([rest], len(rest)) if rest else ([], 0)
            fut = self.pending.pop(rid, None)
            if fut is not None and not fut.done():  # else: given up on (cancelled, timeout)
                fut.set_result((status, head, frames))

    def _fail(self, exc: Exception) -> None:
        self.lost = exc
        for fut in [self.head, *self.pending.values()]:
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        self.pending.clear()
        self.head = None
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("replication stream closed by the leader"))


class StreamConnection:
    """A follower's stream to one leader: the fetches of all its partitions there."""

    def __init__(self, address: str, node: str, *, ssl: ssl.SSLContext | None = None,
                 sign: Callable[..., dict[str, str] | None] | None = None) -> None:
        self.address = address
        self.node = node
        self.ssl = ssl  # TLS between members (--cluster-tls-*)
        self.sign = sign  # (method, path, query, to=address) -> the signature headers
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self._proto: _Proto | None = None
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)

    async def _connected(self) -> _Proto:
        async with self._lock:
            proto = self._proto
            if proto is not None and proto.lost is None:
                return proto
            self._proto = None
            loop = asyncio.get_running_loop()
            _, proto = await loop.create_connection(
                _Proto, self.host, self.port, ssl=self.ssl,
                server_hostname=self.host if self.ssl is not None else None)
            try:
                assert proto.transport is not None
                proto.head = loop.create_future()
                query = {"node": self.node}
                extra = self.sign("GET", PATH, query, to=self.address) if self.sign else None
                lines = "".join(f"{k}: {v}\r\n" for k, v in (extra or {}).items())
                proto.transport.write(
                    f"GET {PATH}?{urlencode(query)} HTTP/1.1\r\nHost: {self.address}\r\n"
                    f"Connection: Upgrade\r\nUpgrade: tcp\r\n{lines}\r\n".encode())
                await proto.head
            except BaseException:
                if proto.transport is not None:
                    proto.transport.close()
                raise
            self._proto = proto
            return proto

    async def fetch(self, topic: str, partition: int, epoch: int, offset: int, max_bytes: int,
                    wait_ms: int, timeout: float) -> tuple[int, memoryview, memoryview]:
        """(status, head, frames) of one fetch; views of the received bytes. A timeout or
        a broken stream closes it (the next fetch opens a new one); a refused handshake is
        :class:`StreamRefused`."""
        try:
            async with asyncio.timeout(timeout):
                proto = await self._connected()
                assert proto.transport is not None
                rid = next(self._ids) & 0xFFFFFFFF
                fut: asyncio.Future[tuple[int, memoryview, memoryview]] = \
                    asyncio.get_running_loop().create_future()
                proto.pending[rid] = fut
                name = topic.encode()
                proto.transport.write(FETCH.pack(FETCH.size - 4 + len(name), rid, partition,
                                                 epoch, offset, max_bytes,
                                                 min(wait_ms, 0xFFFF)) + name)
                try:
                    return await fut
                finally:
                    proto.pending.pop(rid, None)
        except TimeoutError:
            self.close()  # the leader is silent: every partition reconnects
            raise

    def close(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()
