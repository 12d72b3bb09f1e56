"""A raw-socket NSQ V2 test client: every byte on the wire is under the test's control.

Commands are built with :mod:`nsqx.protocol.v2`'s encoders (or given as raw bytes), frames are
cut with :class:`nsqx.protocol.frames.FrameReader`. Every read has a timeout; nothing blocks
forever. Heartbeats are answered with NOP and skipped unless a test asks to see them.

    c = RawClient(nsqd.tcp_address)          # connects and sends the magic
    c.send(v2.pub("t", b"x")); c.expect_ok()
    c.send(b"BOGUS\\n"); c.expect_error("E_INVALID", "invalid command BOGUS", closed=True)
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any

from nsqx.protocol import v2
from nsqx.protocol.compress import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder
from nsqx.protocol.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    FrameReader,
    decode_message,
)

DEFAULT_TIMEOUT = 5.0


class ConnectionClosed(AssertionError):
    """The server closed the connection while the test expected a frame."""


class NoFrame(AssertionError):
    """No frame arrived within the timeout."""


@dataclass
class Message:
    timestamp_ns: int
    attempts: int
    id: bytes
    body: bytes


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class RawClient:
    """One TCP connection to nsqd speaking V2 by hand."""

    def __init__(self, address: str, *, magic: bytes | None = v2.MAGIC_V2,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.address = address
        self.timeout = timeout
        self.sock = socket.create_connection(split_address(address), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = FrameReader()
        self.frames: list[tuple[int, bytes]] = []  # parsed, not yet consumed
        self.closed_by_peer = False
        self.heartbeats = 0
        self.answer_heartbeats = True
        self._encoder: Any = None
        self._decoder: Any = None
        self._leftover = b""
        if magic:
            self.sock.sendall(magic)

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- output ------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self._encoder is not None:
            data = self._encoder.encode(data)
        self.sock.sendall(data)

    def try_send(self, data: bytes) -> bool:
        """Send; False if the peer has already gone (EPIPE/ECONNRESET)."""
        try:
            self.send(data)
            return True
        except OSError:
            return False

    # -- input -------------------------------------------------------------------------
    def _recv(self, deadline: float) -> bool:
        """Read once; False on timeout. Sets closed_by_peer on EOF/reset."""
        if self.closed_by_peer:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed_by_peer = True
            return False
        if self._decoder is not None:
            data = self._decoder.decode(data)
            while self._decoder.pending:
                data += self._decoder.decode(b"")
        self.frames.extend(self.reader.feed(data))
        return True

    def read_frame(self, timeout: float | None = None, *,
                   heartbeats: bool = False) -> tuple[int, bytes]:
        """The next frame (type, data); heartbeats are answered (NOP) and skipped unless asked."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            while self.frames:
                ftype, data = self.frames.pop(0)
                if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                    self.heartbeats += 1
                    if self.answer_heartbeats:
                        self.try_send(v2.nop())
                    if not heartbeats:
                        continue
                return ftype, data
            if not self._recv(deadline):
                if self.closed_by_peer:
                    raise ConnectionClosed(f"connection to {self.address} closed by the server")
                raise NoFrame(f"no frame from {self.address} within "
                              f"{self.timeout if timeout is None else timeout:.1f}s")

    def expect_response(self, expected: bytes | None = None, timeout: float | None = None) -> bytes:
        ftype, data = self.read_frame(timeout)
        assert ftype == FRAME_RESPONSE, f"expected a response frame, got type {ftype}: {data[:300]!r}"
        if expected is not None:
            assert data == expected, f"expected response {expected!r}, got {data[:300]!r}"
        return data

    def expect_ok(self, timeout: float | None = None) -> None:
        self.expect_response(b"OK", timeout)

    def expect_error(self, code: str, text: str | None = None, *, closed: bool | None = None,
                     timeout: float | None = None) -> str:
        """Read an error frame ``"<code> <text>"``; with closed=True/False also check whether
        the server closes the connection after it. Returns the whole payload."""
        ftype, data = self.read_frame(timeout)
        payload = data.decode("utf-8", "replace")
        assert ftype == FRAME_ERROR, f"expected error {code}, got frame type {ftype}: {data[:300]!r}"
        got_code, _, got_text = payload.partition(" ")
        assert got_code == code, f"expected error code {code}, got {payload!r}"
        if text is not None:
            assert got_text == text, f"expected error text {code} {text!r}, got {payload!r}"
        if closed is True:
            self.expect_closed()
        elif closed is False:
            self.expect_open()
        return payload

    def expect_closed(self, timeout: float = 3.0) -> None:
        """The server closes the connection (after any frames still in flight)."""
        deadline = time.monotonic() + timeout
        while not self.closed_by_peer:
            if time.monotonic() > deadline:
                raise AssertionError(f"server did not close the connection within {timeout}s "
                                     f"(unread frames: {self.frames[:5]!r})")
            self._recv(deadline)
        extra = [f for f in self.frames if f != (FRAME_RESPONSE, HEARTBEAT)]
        assert not extra, f"frames after a fatal error: {extra[:5]!r}"

    def expect_open(self) -> None:
        """The connection is still usable: a PUB round-trip succeeds."""
        assert not self.closed_by_peer, "connection was closed by the server"
        self.send(v2.pub("rawclient_ping", b"ping"))
        self.expect_ok()

    def expect_nothing(self, duration: float) -> None:
        """No frame (other than heartbeats) arrives for ``duration`` seconds."""
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            try:
                frame = self.read_frame(deadline - time.monotonic())
            except NoFrame:
                return
            raise AssertionError(f"unexpected frame: {frame[0]} {frame[1][:200]!r}")

    def read_message(self, timeout: float | None = None) -> Message:
        ftype, data = self.read_frame(timeout)
        assert ftype == FRAME_MESSAGE, f"expected a message frame, got type {ftype}: {data[:300]!r}"
        ts, attempts, mid, body = decode_message(data)
        return Message(ts, attempts, mid, body)

    def read_messages(self, n: int, timeout: float | None = None) -> list[Message]:
        """Exactly ``n`` messages within ``timeout`` seconds overall."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out = []
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoFrame(f"got {len(out)} of {n} messages")
            out.append(self.read_message(left))
        return out

    def drain_messages(self, quiet: float = 0.5, limit: float = 30.0,
                       fin: bool = True) -> list[Message]:
        """Read messages until none arrives for ``quiet`` seconds (FIN each when fin=True)."""
        end = time.monotonic() + limit
        out = []
        while time.monotonic() < end:
            try:
                m = self.read_message(quiet)
            except NoFrame:
                break
            out.append(m)
            if fin:
                self.send(v2.fin(m.id))
        return out

    # -- compound commands -------------------------------------------------------------
    def identify(self, data: dict[str, Any] | None = None, *,
                 ssl_context: ssl.SSLContext | None = None) -> dict[str, Any] | bytes:
        """IDENTIFY; returns the JSON response (feature negotiation) or b"OK". Negotiated
        TLS (with ``ssl_context``), snappy and deflate are switched on and their extra OK
        frames are read."""
        data = dict(data or {})
        self.send(v2.identify(data))
        if not data.get("feature_negotiation"):
            resp = self.expect_response()
            assert resp == b"OK", resp
            return resp
        # the JSON response is plain; whatever follows it may already be compressed, so
        # it must not go through the plain frame reader
        ftype, resp = self._read_plain_frame()
        assert ftype == FRAME_RESPONSE, f"IDENTIFY failed: {resp[:300]!r}"
        info = json.loads(resp)
        if info.get("tls_v1"):
            assert ssl_context is not None, "server negotiated TLS: pass ssl_context"
            assert not self._leftover, "plain bytes after the IDENTIFY response"
            self.sock.settimeout(self.timeout)
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname="127.0.0.1")
            self.expect_ok()
        if not info.get("snappy") and not info.get("deflate") and self._leftover:
            self.frames.extend(self.reader.feed(self._leftover))
            self._leftover = b""
        if info.get("snappy"):
            self._upgrade(SnappyEncoder(), SnappyDecoder())
            self.expect_ok()
        if info.get("deflate"):
            self._upgrade(DeflateEncoder(int(info.get("deflate_level") or 6)), DeflateDecoder())
            self.expect_ok()
        return info

    def _read_plain_frame(self) -> tuple[int, bytes]:
        assert not self.frames and not self.reader.buffered and self._decoder is None
        buf = b""
        deadline = time.monotonic() + self.timeout
        while True:
            if len(buf) >= 4:
                size = struct.unpack(">i", buf[:4])[0]
                if len(buf) >= 4 + size:
                    ftype = struct.unpack(">i", buf[4:8])[0]
                    # leave the rest for _upgrade (or the plain reader)
                    self.reader = FrameReader()
                    self._leftover = buf[4 + size:]
                    return ftype, buf[8:4 + size]
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoFrame("no IDENTIFY response")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            if not chunk:
                self.closed_by_peer = True
                raise ConnectionClosed("connection closed during IDENTIFY")
            buf += chunk

    def _upgrade(self, encoder: Any, decoder: Any) -> None:
        # bytes that came after the IDENTIFY response are already compressed
        leftover, self._leftover = self._leftover, b""
        assert not self.frames, f"frames after the IDENTIFY response: {self.frames!r}"
        self._encoder, self._decoder = encoder, decoder
        if leftover:
            data = decoder.decode(leftover)
            while decoder.pending:
                data += decoder.decode(b"")
            self.frames.extend(self.reader.feed(data))

    def subscribe(self, topic: str, channel: str, rdy: int | None = None,
                  identify: dict[str, Any] | None = None) -> RawClient:
        if identify is not None:
            self.identify(identify)
        self.send(v2.sub(topic, channel))
        self.expect_ok()
        if rdy is not None:
            self.send(v2.rdy(rdy))
        return self

    def pub(self, topic: str, body: bytes) -> None:
        self.send(v2.pub(topic, body))
        self.expect_ok()

    def mpub(self, topic: str, bodies: list[bytes]) -> None:
        self.send(v2.mpub(topic, bodies))
        self.expect_ok()

    def dpub(self, topic: str, delay_ms: int, body: bytes) -> None:
        self.send(v2.dpub(topic, delay_ms, body))
        self.expect_ok()


def consumer(address: str, topic: str, channel: str, rdy: int = 1,
             identify: dict[str, Any] | None = None, timeout: float = DEFAULT_TIMEOUT) -> RawClient:
    """A connected, subscribed client with RDY sent."""
    c = RawClient(address, timeout=timeout)
    try:
        return c.subscribe(topic, channel, rdy, identify)
    except BaseException:
        c.close()
        raise


def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    """Publish each body with PUB on a fresh connection, waiting for every OK."""
    with RawClient(address) as c:
        for b in bodies:
            c.pub(topic, b)
