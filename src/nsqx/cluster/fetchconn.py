"""A follower's keep-alive HTTP/1.1 connection for ``GET /nsqx/replica/fetch``.

The same requests and answers as through aiohttp's client, without its per-request
machinery (request objects, URL building, header multidicts, stream readers): a follower
fetches hundreds of times a second and that machinery was a quarter of its Python time
(py-spy). One request at a time; bodies must carry a Content-Length (every answer of the
replication API does). Any error, timeout or unexpected answer closes the connection, and
the next request opens a new one.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlencode

__all__ = ["FetchConnection", "parse_head"]

MAX_HEAD = 64 << 10


class _Proto(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.want = 0  # wake the waiter once this many bytes are buffered (0: any)
        self.waiter: asyncio.Future[None] | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        w = self.waiter
        if w is not None and not w.done() and self.size >= self.want:
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("connection closed by the leader")
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(self.lost)

    def joined(self) -> bytes:
        """The buffered bytes as one (kept buffered: joined once, not on every read)."""
        buf = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks = [buf]
        return buf

    def take(self) -> bytes:
        data = self.joined()
        self.chunks = []
        self.size = 0
        return data

    async def wait_for(self, nbytes: int) -> None:
        while self.size < nbytes:
            if self.lost is not None:
                raise self.lost
            self.want = nbytes
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None


class FetchConnection:
    """GET requests to one ``host:port``, answered as (status, body)."""

    def __init__(self, address: str, ssl: ssl.SSLContext | None = None) -> None:
        self.address = address
        self.ssl = ssl  # TLS between members (--cluster-tls-*)
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self._proto: _Proto | None = None

    async def get(self, path: str, params: dict[str, str], timeout: float,
                  headers: dict[str, str] | None = None) -> tuple[int, memoryview]:
        """(status, body): the body a view of the received bytes (never copied again);
        ``headers`` (the cluster signature) go with the request."""
        try:
            async with asyncio.timeout(timeout):
                return await self._get(path, params, headers)
        except BaseException:
            self.close()  # unknown state: never reuse it
            raise

    async def _get(self, path: str, params: dict[str, str], headers: dict[str, str] | None
                   ) -> tuple[int, memoryview]:
        proto = self._proto
        if proto is None or proto.lost is not None or proto.transport is None \
                or proto.transport.is_closing():
            loop = asyncio.get_running_loop()
            _, proto = await loop.create_connection(
                _Proto, self.host, self.port, ssl=self.ssl,
                server_hostname=self.host if self.ssl is not None else None)
            self._proto = proto
        assert proto.transport is not None
        proto.take()  # nothing may be left from an earlier answer
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        proto.transport.write(f"GET {path}?{urlencode(params)} HTTP/1.1\r\n"
                              f"Host: {self.address}\r\n{extra}\r\n".encode())
        # the head: status line and headers
        await proto.wait_for(1)
        while True:
            buf = proto.joined()
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD:
                raise ValueError("answer head too long")
            await proto.wait_for(proto.size + 1)
        status, length, close = parse_head(buf[:end])
        start = end + 4
        await proto.wait_for(start + length)
        data = proto.take()
        if len(data) > start + length:
            raise ValueError("more bytes than the answer's Content-Length")
        body = memoryview(data)[start:]
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()


def parse_head(head: bytes) -> tuple[int, int, bool]:
    """An HTTP/1.x answer's head (without the blank line) -> (status, Content-Length,
    whether the server closes); ValueError for anything else, a chunked answer or one
    without a length (the replica stream reads its refusals with it too)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    status = int(parts[1])
    length = -1
    close = parts[0] == b"HTTP/1.0"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            v = value.strip().lower()
            close = v == b"close" or (close and v != b"keep-alive")
        elif name == b"transfer-encoding" and value.strip().lower() != b"identity":
            raise ValueError("chunked answers are not supported here")
    if length < 0:
        raise ValueError("answer without a Content-Length")
    return status, length, close
