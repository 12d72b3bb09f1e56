"""Small synchronous publishing for scripts: no event loop, stdlib only.

    from nsqx.client import publish
    publish("127.0.0.1:4150", "events", b"hello")                # TCP or HTTP port: either works
    publish("127.0.0.1:4151", "events", b"hello", http=True)     # nsqd HTTP API
    publish("127.0.0.1:4150", "events", [b"a", b"b"], http=False)  # TCP, one MPUB

One call = one connection. Errors raise :class:`~nsqx.client.errors.NSQError` with nsqd's code
(TCP: the error frame's code; HTTP: the ``{"message": CODE}`` body).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence
from urllib.parse import urlencode

from nsqx.protocol import v2

from .conn import split_address
from .errors import ConnectionClosedError, NSQError, error_from_frame

__all__ = ["publish"]

_FRAME_ERROR = 1


def publish(
    address: str,
    topic: str,
    body: bytes | Sequence[bytes],
    *,
    http: bool | None = None,
    delay: float | None = None,
    timeout: float = 5.0,
    auth_secret: str | None = None,
) -> None:
    """Publish one message (``bytes``) or several (a list, sent as one MPUB).

    ``http=True``: ``address`` is nsqd's HTTP address (``host:port`` or ``http(s)://...``),
    ``/pub`` or binary ``/mpub``. ``http=False``: nsqd's TCP address, ``PUB``/``MPUB``/``DPUB``.
    ``http=None`` (the default): an ``http(s)://`` URL is HTTP; else TCP, and when the port
    answers as an HTTP server (it refused the V2 bytes, so nothing was published) the same
    call goes over HTTP: a script may name either of nsqd's ports.
    ``delay`` (seconds) defers a single message (DPUB / ``/pub?defer=``).
    ``auth_secret``: sent as ``AUTH`` over TCP (nsqd with ``--auth-http-address``).
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        bodies = [bytes(body)]
        single = True
    else:
        bodies = [bytes(b) for b in body]
        single = False
        if not bodies:
            raise ValueError("no messages to publish")
    if delay is not None and not single:
        raise ValueError("delay applies to a single message")
    if http is None and "://" in address:
        http = True
    if http:
        _publish_http(address, topic, bodies, single, delay, timeout)
        return
    try:
        _publish_tcp(address, topic, bodies, single, delay, timeout, auth_secret)
    except _AnsweredHTTP:
        if http is not None:
            raise ConnectionClosedError(f"{address}: an HTTP server, not nsqd's TCP port "
                                        "(http=True, or leave http out)") from None
        _publish_http(address, topic, bodies, single, delay, timeout)


class _AnsweredHTTP(Exception):
    """The TCP address is an HTTP server: it answered the V2 magic with ``HTTP/1.x 400``."""


def _publish_http(address: str, topic: str, bodies: list[bytes], single: bool,
                  delay: float | None, timeout: float) -> None:
    base = address if "://" in address else "http://" + address
    base = base.rstrip("/")
    params: dict[str, str] = {"topic": topic}
    if single:
        if delay is not None:
            params["defer"] = str(round(delay * 1000))
        url = f"{base}/pub?{urlencode(params)}"
        data = bodies[0]
    else:
        params["binary"] = "true"
        url = f"{base}/mpub?{urlencode(params)}"
        data = v2.mpub_body(bodies)
    req = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            message = json.loads(raw).get("message") or f"HTTP_{e.code}"
        except (ValueError, AttributeError):
            message = raw.decode("utf-8", "replace").strip() or f"HTTP_{e.code}"
        code, _, detail = str(message).partition(" ")  # "E_BAD_PARTITION topic t is ordered..."
        raise NSQError(code, detail or f"HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ConnectionClosedError(f"{address}: {e}") from None


def _publish_tcp(address: str, topic: str, bodies: list[bytes], single: bool,
                 delay: float | None, timeout: float, auth_secret: str | None) -> None:
    host, port = split_address(address)
    if single and delay is not None:
        cmd = v2.dpub(topic, round(delay * 1000), bodies[0])
    elif single:
        cmd = v2.pub(topic, bodies[0])
    else:
        cmd = v2.mpub(topic, bodies)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            f = sock.makefile("rb")
            out = v2.MAGIC_V2
            if auth_secret is not None:
                sock.sendall(out + v2.auth(auth_secret))
                out = b""
                _read_response(f)
            sock.sendall(out + cmd)
            data = _read_response(f)
            if data != b"OK":
                raise NSQError("E_UNEXPECTED", f"unexpected response {data[:80]!r}")
    except OSError as e:
        raise ConnectionClosedError(f"{address}: {e}") from None


def _read_response(f) -> bytes:  # type: ignore[no-untyped-def]
    while True:
        hdr = f.read(8)
        if hdr.startswith(b"HTTP/"):  # no V2 frame starts so: its size would be ~1.2 GB
            raise _AnsweredHTTP("an HTTP server answered")
        if len(hdr) < 8:
            raise ConnectionClosedError("connection closed before a response")
        size = int.from_bytes(hdr[:4], "big")
        ftype = int.from_bytes(hdr[4:], "big")
        data = f.read(size - 4)
        if len(data) < size - 4:
            raise ConnectionClosedError("connection closed inside a frame")
        if ftype == _FRAME_ERROR:
            raise error_from_frame(data)
        if data == b"_heartbeat_":
            continue  # we answer with the next command; a one-shot never waits that long
        return data
