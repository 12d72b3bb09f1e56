"""One asyncio connection to nsqd (TCP protocol V2), shared by producers and consumers.

Set-up, in upstream's order (go-nsq ``conn.go``): magic ``"  V2"`` -> IDENTIFY with
feature negotiation -> TLS -> snappy or deflate (each upgrade acknowledged by an ``OK``
frame sent over the upgraded stream) -> AUTH when the IDENTIFY response says
``auth_required``. After that a reader task cuts frames and dispatches them:

* ``_heartbeat_`` is answered with ``NOP`` at once;
* other responses and errors complete the futures returned by :meth:`Connection.command`
  strictly in order (nsqd answers commands in order: that is what makes producer pipelining
  work). Non-fatal errors (``E_FIN_FAILED``, ``E_REQ_FAILED``, ``E_TOUCH_FAILED``) never
  answer a command; they go to ``on_error``. A response with nothing waiting for it (e.g.
  ``CLOSE_WAIT`` after ``CLS`` sent with :meth:`send`) goes to ``on_response``;
* messages go to ``on_message``.

Writes made in one loop turn are joined and (if negotiated) compressed once.
The protocol itself (encoders, frame reader, compression) is ``nsqx.protocol``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsqx import __version__
from nsqx.protocol import v2
from nsqx.protocol.compress import (
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
)
from nsqx.protocol.errors import NON_FATAL_CODES, ProtocolError
from nsqx.protocol.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    FrameReader,
    decode_message,
)

from .errors import ConnectionClosedError, NSQError, error_from_frame

__all__ = ["ConnConfig", "Connection", "split_address"]

log = logging.getLogger("nsqx.client")

_READ_SIZE = 256 * 1024


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` / ``"[v6]:port"`` -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid nsqd address {address!r} (want host:port)")
    return host.strip("[]"), int(port)


@dataclass
class ConnConfig:
    """Connection settings (seconds for durations). Producer/Consumer accept them as kwargs.

    ``tls``: False, True (system CAs) or an ``ssl.SSLContext``; when set and the server does
    not offer TLS the connection fails (``E_TLS_UNAVAILABLE``) instead of staying in clear.
    ``snappy`` / ``deflate``: request compression (not both). ``auth_secret``: sent with
    AUTH when nsqd says ``auth_required``. ``heartbeat_interval``: requested from nsqd; the
    connection is dropped after two intervals without any data. ``msg_timeout``: per
    connection in-flight timeout (None = nsqd's default).
    """

    tls: bool | ssl.SSLContext = False
    tls_server_hostname: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | bytes | None = None
    heartbeat_interval: float = 30.0
    msg_timeout: float | None = None
    sample_rate: int = 0
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    client_id: str | None = None
    hostname: str | None = None
    user_agent: str = f"nsqx/{__version__}"
    connect_timeout: float = 5.0
    read_timeout: float | None = None  # default: 2 x heartbeat_interval
    max_frame_size: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.snappy and self.deflate:
            raise ValueError("snappy and deflate cannot both be enabled")
        if not 1 <= self.deflate_level <= 9:
            raise ValueError("deflate_level must be 1..9")

    def identify_body(self) -> dict[str, Any]:
        hostname = self.hostname or socket.gethostname()
        body: dict[str, Any] = {
            "client_id": self.client_id or hostname.split(".")[0],
            "hostname": hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": int(self.heartbeat_interval * 1000) if self.heartbeat_interval > 0 else -1,
            "tls_v1": bool(self.tls),
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
        }
        if self.msg_timeout is not None:
            body["msg_timeout"] = int(self.msg_timeout * 1000)
        if self.output_buffer_size is not None:
            body["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            body["output_buffer_timeout"] = (
                int(self.output_buffer_timeout * 1000) if self.output_buffer_timeout > 0 else -1)
        return body

    def ssl_context(self) -> ssl.SSLContext:
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        return ssl.create_default_context()


def make_config(config: ConnConfig | None, options: dict[str, Any]) -> ConnConfig:
    if config is None:
        return ConnConfig(**options)
    if options:
        raise TypeError("give either config= or connection keyword options, not both")
    return config


MessageCallback = Callable[["Connection", Any], None]


class Connection:
    """One connection to one nsqd. ``await connect()``, then :meth:`send`/:meth:`command`.

    ``on_message(conn, Message)``, ``on_response(conn, data)``, ``on_error(conn, NSQError)``
    and ``on_close(conn, exc | None)`` are called from the reader task (never concurrently).
    ``make_message(conn, ts, attempts, id, body)`` builds the message objects.
    """

    def __init__(
        self,
        address: str,
        config: ConnConfig | None = None,
        *,
        on_message: Callable[[Connection, Any], None] | None = None,
        on_response: Callable[[Connection, bytes], None] | None = None,
        on_error: Callable[[Connection, NSQError], None] | None = None,
        on_close: Callable[[Connection, BaseException | None], None] | None = None,
        make_message: Callable[[Connection, int, int, bytes, bytes], Any] | None = None,
    ) -> None:
        self.address = address
        self.host, self.port = split_address(address)
        self.config = config or ConnConfig()
        self.on_message = on_message
        self.on_response = on_response
        self.on_error = on_error
        self.on_close = on_close
        self.make_message = make_message
        self.identify_response: dict[str, Any] = {}
        self.auth_response: dict[str, Any] | None = None
        self.max_rdy_count = 2500
        self.msg_timeout: float | None = None
        # consumer state (kept here so a consumer needs no wrapper object)
        self.rdy = 0
        self.in_flight = 0
        self.last_rdy_time = 0.0
        self.last_message_time = 0.0
        self.partition: int | None = None  # None: a partition-less SUB (all partitions)
        self.closing = False  # CLS sent
        self.close_wait = False  # CLOSE_WAIT received: nsqd sends no more messages
        # io
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._frames = FrameReader(self.config.max_frame_size)
        self._pending_frames: deque[tuple[int, bytes]] = deque()
        self._decoder: SnappyDecoder | DeflateDecoder | None = None
        self._encoder: SnappyEncoder | DeflateEncoder | None = None
        self._wbuf: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._waiters: deque[asyncio.Future[bytes]] = deque()
        self._read_task: asyncio.Task[None] | None = None
        self._closed = False
        self._connected = False
        self._close_exc: BaseException | None = None
        self._closed_event = asyncio.Event()

    def __repr__(self) -> str:
        return f"<Connection {self.address} {'open' if self.is_open else 'closed'}>"

    @property
    def is_open(self) -> bool:
        return self._connected and not self._closed

    @property
    def pending(self) -> int:
        """Commands sent with :meth:`command` still waiting for their response."""
        return len(self._waiters)

    @property
    def write_buffer_size(self) -> int:
        w = self._writer
        if w is None or w.transport.is_closing():
            return 0
        return w.transport.get_write_buffer_size()

    # -- set-up ---------------------------------------------------------------------------
    async def connect(self) -> dict[str, Any]:
        """Open, IDENTIFY, upgrade, AUTH; start the reader. Returns the IDENTIFY response."""
        cfg = self.config
        try:
            async with asyncio.timeout(cfg.connect_timeout):
                self._reader, self._writer = await asyncio.open_connection(
                    self.host, self.port, limit=_READ_SIZE)
                sock = self._writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await self._handshake()
        except BaseException as e:
            self._abort()
            if isinstance(e, NSQError):
                raise
            if isinstance(e, ssl.SSLError):  # bad certificate etc.: retrying will not help
                raise NSQError("E_TLS_FAILED", f"{self.address}: {e}") from e
            if isinstance(e, TimeoutError):
                raise ConnectionClosedError(
                    f"{self.address}: connect/handshake timed out", "E_TIMEOUT") from None
            if isinstance(e, (OSError, asyncio.IncompleteReadError, ProtocolError, ValueError)):
                raise ConnectionClosedError(f"{self.address}: {e!r}") from e
            raise
        self._connected = True
        self._read_task = asyncio.get_running_loop().create_task(
            self._read_loop(), name=f"nsqx-conn-{self.address}")
        return self.identify_response

    async def _handshake(self) -> None:
        cfg = self.config
        assert self._writer is not None
        self._writer.write(v2.MAGIC_V2 + v2.identify(cfg.identify_body()))
        data = await self._read_plain_response()
        # a server without feature negotiation answers b"OK"
        resp = json.loads(data) if data.startswith(b"{") else {}
        self.identify_response = resp
        self.max_rdy_count = int(resp.get("max_rdy_count") or 2500)
        if resp.get("msg_timeout"):
            self.msg_timeout = resp["msg_timeout"] / 1000.0
        if cfg.tls:
            if not resp.get("tls_v1"):
                raise NSQError("E_TLS_UNAVAILABLE", f"{self.address} does not offer TLS")
            await self._writer.start_tls(
                cfg.ssl_context(), server_hostname=cfg.tls_server_hostname or self.host)
            await self._expect_ok(await self._read_plain_response())
        if resp.get("snappy"):
            self._decoder = SnappyDecoder()
            self._encoder = SnappyEncoder()
            await self._expect_ok(await self._next_response())
        elif resp.get("deflate"):
            self._decoder = DeflateDecoder()
            self._encoder = DeflateEncoder(int(resp.get("deflate_level") or cfg.deflate_level))
            await self._expect_ok(await self._next_response())
        if resp.get("auth_required"):
            if cfg.auth_secret is None:
                raise NSQError("E_AUTH_REQUIRED", f"{self.address} requires AUTH; no auth_secret")
            self._write_now(v2.auth(cfg.auth_secret))
            data = await self._next_response()
            try:
                self.auth_response = json.loads(data)
            except ValueError:
                self.auth_response = {}

    async def _expect_ok(self, data: bytes) -> None:
        if data != b"OK":
            raise NSQError("E_IDENTIFY_FAILED", f"expected OK after upgrade, got {data[:80]!r}")

    async def _read_plain_response(self) -> bytes:
        """One frame read with exact sizes (no bytes read past it: an upgrade may follow)."""
        assert self._reader is not None and self._writer is not None
        while True:
            hdr = await self._reader.readexactly(8)
            size = int.from_bytes(hdr[:4], "big")
            ftype = int.from_bytes(hdr[4:], "big")
            if size < 4 or size - 4 > self.config.max_frame_size:
                raise NSQError("E_BAD_FRAME", f"invalid frame size {size}")
            data = await self._reader.readexactly(size - 4)
            if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                self._write_now(v2.nop())
                continue
            if ftype == FRAME_ERROR:
                raise error_from_frame(data)
            if ftype != FRAME_RESPONSE:
                raise NSQError("E_BAD_FRAME", f"unexpected frame type {ftype} during set-up")
            return data

    async def _next_response(self) -> bytes:
        """One frame through the (possibly compressed) stream, during set-up."""
        assert self._reader is not None
        while True:
            while not self._pending_frames:
                chunk = await self._reader.read(_READ_SIZE)
                if not chunk:
                    raise ConnectionClosedError(f"{self.address}: closed during set-up")
                self._pending_frames.extend(self._decode(chunk))
            ftype, data = self._pending_frames.popleft()
            if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                self._write_now(v2.nop())
                continue
            if ftype == FRAME_ERROR:
                raise error_from_frame(data)
            if ftype != FRAME_RESPONSE:
                raise NSQError("E_BAD_FRAME", f"unexpected frame type {ftype} during set-up")
            return data

    def _decode(self, chunk: bytes) -> list[tuple[int, bytes]]:
        dec = self._decoder
        if dec is None:
            return self._frames.feed(chunk)
        frames = self._frames.feed(dec.decode(chunk))
        while dec.pending:
            frames.extend(self._frames.feed(dec.decode(b"")))
        return frames

    # -- writing --------------------------------------------------------------------------
    def _write_now(self, data: bytes) -> None:
        assert self._writer is not None
        if self._encoder is not None:
            data = self._encoder.encode(data)
        self._writer.write(data)

    def send(self, data: bytes) -> None:
        """Queue a command; everything queued in one loop turn is written together."""
        if self._closed:
            raise ConnectionClosedError(f"{self.address}: connection closed")
        self._wbuf.append(data)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if not self._wbuf or self._closed or self._writer is None:
            self._wbuf.clear()
            return
        data = b"".join(self._wbuf) if len(self._wbuf) > 1 else self._wbuf[0]
        self._wbuf.clear()
        try:
            self._write_now(data)
        except Exception as e:  # transport gone
            self._teardown(e)

    def command(self, data: bytes) -> asyncio.Future[bytes]:
        """Send a command that nsqd answers (PUB, MPUB, DPUB, SUB, ...); the future gets
        the response data (``b"OK"``) or an NSQError. Responses are matched in order."""
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.send(data)
        self._waiters.append(fut)
        return fut

    async def drain(self) -> None:
        """Wait for the transport's write buffer to go below its high-water mark."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush()
        w = self._writer
        if w is not None and not self._closed:
            try:
                await w.drain()
            except (ConnectionError, OSError) as e:
                raise ConnectionClosedError(f"{self.address}: {e!r}") from e

    # -- reading --------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        cfg = self.config
        timeout = cfg.read_timeout
        if timeout is None and cfg.heartbeat_interval > 0:
            timeout = 2 * cfg.heartbeat_interval + 5
        exc: BaseException | None = None
        try:
            if self._pending_frames:
                frames = list(self._pending_frames)
                self._pending_frames.clear()
                self._dispatch(frames)
            while not self._closed:
                if timeout is not None:
                    async with asyncio.timeout(timeout):
                        chunk = await reader.read(_READ_SIZE)
                else:
                    chunk = await reader.read(_READ_SIZE)
                if not chunk:
                    break
                self._dispatch(self._decode(chunk))
        except asyncio.CancelledError:
            pass
        except TimeoutError:
            exc = ConnectionClosedError(f"{self.address}: no data for {timeout:.0f}s", "E_TIMEOUT")
        except Exception as e:  # socket error, corrupt stream, callback bug
            exc = e
            if not isinstance(e, (OSError, ProtocolError, NSQError)):
                log.exception("[%s] reader failed", self.address)
        self._teardown(exc)

    def _dispatch(self, frames: list[tuple[int, bytes]]) -> None:
        for ftype, data in frames:
            if self._closed:
                return
            if ftype == FRAME_MESSAGE:
                ts, attempts, mid, body = decode_message(data)
                if self.make_message is not None and self.on_message is not None:
                    self.on_message(self, self.make_message(self, ts, attempts, mid, body))
            elif ftype == FRAME_RESPONSE:
                if data == HEARTBEAT:
                    self.send(v2.nop())
                    continue
                if self._waiters:
                    fut = self._waiters.popleft()
                    if not fut.done():
                        fut.set_result(data)
                elif self.on_response is not None:
                    self.on_response(self, data)
            elif ftype == FRAME_ERROR:
                err = error_from_frame(data)
                if err.code not in NON_FATAL_CODES and self._waiters:
                    fut = self._waiters.popleft()
                    if not fut.done():
                        fut.set_exception(err)
                    continue
                log.warning("[%s] error from nsqd: %s", self.address, err)
                if self.on_error is not None:
                    self.on_error(self, err)
            else:
                raise NSQError("E_BAD_FRAME", f"unknown frame type {ftype}")

    # -- closing --------------------------------------------------------------------------
    def _abort(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.transport.abort()
        self._closed_event.set()

    def _teardown(self, exc: BaseException | None) -> None:
        if self._closed and self._closed_event.is_set():
            return
        self._closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._wbuf and self._writer is not None and exc is None:
            # a clean close: what was queued still goes out (FINs before close)
            with contextlib.suppress(Exception):
                self._write_now(b"".join(self._wbuf))
        self._wbuf.clear()
        self._close_exc = exc
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        task = self._read_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        err = exc if isinstance(exc, ConnectionClosedError) else ConnectionClosedError(
            f"{self.address}: connection closed" + (f" ({exc!r})" if exc else ""))
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # never "exception was never retrieved"
        self._closed_event.set()
        if exc is not None:
            log.warning("[%s] connection lost: %r", self.address, exc)
        if self.on_close is not None and self._connected:
            try:
                self.on_close(self, exc)
            except Exception:
                log.exception("[%s] on_close callback failed", self.address)

    def close(self) -> None:
        """Close now (queued writes are flushed first); pending commands fail."""
        if self._closed:
            return
        self._teardown(None)

    async def wait_closed(self) -> None:
        await self._closed_event.wait()
        task = self._read_task
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)
