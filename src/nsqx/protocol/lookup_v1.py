"""nsqlookupd TCP protocol (magic ``"  V1"``), sans-IO: nsqd -> lookupd commands and answers.

Commands are lines (``IDENTIFY`` carries ``[4B size][JSON]``); every answer, errors
included, is ``[4B BE size][data]`` with no frame type (``OK``, JSON, or ``"E_CODE text"``).
Texts follow upstream ``nsqlookupd/lookup_protocol_v1.go``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError, raw_text
from .names import valid_channel_name, valid_topic_name
from .v2 import _GO_INT, go_json_object, go_json_string

__all__ = [
    "BAD_PROTOCOL_RESPONSE",
    "MAGIC_V1",
    "OK_RESPONSE",
    "LookupCommand",
    "LookupCommandParser",
    "PeerInfo",
    "ResponseReader",
    "cannot_identify_again",
    "encode_error",
    "encode_response",
    "identify",
    "identify_response",
    "must_identify",
    "parse_identify",
    "parse_topic_channel",
    "ping",
    "register",
    "unregister",
]

MAGIC_V1 = b"  V1"
COMMANDS = frozenset({b"PING", b"IDENTIFY", b"REGISTER", b"UNREGISTER"})

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_WS = b" \t\n\r\v\f"


# --------------------------------------------------------------------------- client (nsqd) side


def identify(info: Mapping[str, Any]) -> bytes:
    """``IDENTIFY\\n[4B size][JSON]``: version, tcp_port, http_port, hostname,
    broadcast_address, topology_zone, topology_region (what nsqd sends)."""
    body = json.dumps(dict(info), separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _U32.pack(len(body)) + body


def _b(s: str | bytes) -> bytes:
    return s.encode() if isinstance(s, str) else s


def register(topic: str | bytes, channel: str | bytes | None = None) -> bytes:
    if channel:
        return b"REGISTER " + _b(topic) + b" " + _b(channel) + b"\n"
    return b"REGISTER " + _b(topic) + b"\n"


def unregister(topic: str | bytes, channel: str | bytes | None = None) -> bytes:
    if channel:
        return b"UNREGISTER " + _b(topic) + b" " + _b(channel) + b"\n"
    return b"UNREGISTER " + _b(topic) + b"\n"


def ping() -> bytes:
    return b"PING\n"


class ResponseReader:
    """Client side: feed bytes, get complete response payloads (sizes checked first)."""

    def __init__(self, max_size: int = 5 * 1024 * 1024) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            size = _I32.unpack_from(buf, pos)[0]
            if size < 0 or size > self.max_size:
                raise ProtocolError(
                    "E_BAD_RESPONSE",
                    f"response body size ({size}) is greater than limit ({self.max_size})")
            if end - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out


# --------------------------------------------------------------------------- server (lookupd) side


def encode_response(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def encode_error(err: ProtocolError) -> bytes:
    return encode_response(err.payload)


OK_RESPONSE = encode_response(b"OK")
BAD_PROTOCOL_RESPONSE = encode_response(b"E_BAD_PROTOCOL")  # wrong magic, then close


class LookupCommand:
    __slots__ = ("name", "params", "body")

    def __init__(self, name: bytes, params: list[bytes], body: bytes | None = None) -> None:
        self.name = name
        self.params = params
        self.body = body

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LookupCommand):
            return NotImplemented
        return (self.name, self.params, self.body) == (other.name, other.params, other.body)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LookupCommand({self.name!r}, {self.params!r}, body={self.body!r})"


class LookupCommandParser:
    """Server side: ``feed(bytes) -> [LookupCommand]`` (after the magic).

    Lines are whitespace-trimmed and split on single spaces like upstream; unknown commands
    are fatal ``E_INVALID invalid command X``. Upstream reads lines and IDENTIFY bodies
    unbounded; we cap lines at ``max_line`` and bodies at ``max_body_size`` (E_BAD_BODY).
    ``precheck(name, params)`` runs before an IDENTIFY body is buffered (e.g. to answer
    ``cannot IDENTIFY again`` first). Errors behave as in ``v2.CommandParser``.
    """

    def __init__(
        self,
        max_body_size: int = 1024 * 1024,
        max_line: int = 16384,
        precheck: Callable[[bytes, list[bytes]], None] | None = None,
    ) -> None:
        self.max_body_size = max_body_size
        self.max_line = max_line
        self.precheck = precheck
        self._buf = bytearray()
        self._prechecked = False
        self.error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[LookupCommand]:
        if self.error is not None:
            raise self.error
        self._buf += data
        buf = self._buf
        out: list[LookupCommand] = []
        pos = 0
        try:
            pos = self._parse(buf, out)
        except ProtocolError as e:
            self.error = e
            buf.clear()
            e.commands = out
            raise
        if pos:
            del buf[:pos]
        return out

    def _parse(self, buf: bytearray, out: list[LookupCommand]) -> int:
        pos = 0
        end = len(buf)
        while pos < end:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if end - pos >= self.max_line:
                    raise ProtocolError("E_INVALID", f"command line too long (max {self.max_line} bytes)")
                return pos
            if nl - pos >= self.max_line:
                raise ProtocolError("E_INVALID", f"command line too long (max {self.max_line} bytes)")
            params = bytes(buf[pos:nl]).strip(_WS).split(b" ")
            name = params.pop(0)
            if name not in COMMANDS:
                if self.precheck is not None:
                    self.precheck(name, params)
                raise ProtocolError("E_INVALID", f"invalid command {raw_text(name)}")
            if name != b"IDENTIFY":
                out.append(LookupCommand(name, params))
                pos = nl + 1
                continue
            if self.precheck is not None and not self._prechecked:
                self.precheck(name, params)
                self._prechecked = True
            p = nl + 1
            if end - p < 4:
                return pos
            size = _I32.unpack_from(buf, p)[0]
            if size < 0 or size > self.max_body_size:
                raise ProtocolError("E_BAD_BODY", f"IDENTIFY invalid body size {size}")
            if end - p - 4 < size:
                return pos
            out.append(LookupCommand(name, params, bytes(buf[p + 4 : p + 4 + size])))
            self._prechecked = False
            pos = p + 4 + size
        return pos


def must_identify() -> ProtocolError:
    return ProtocolError("E_INVALID", "client must IDENTIFY")


def cannot_identify_again() -> ProtocolError:
    return ProtocolError("E_INVALID", "cannot IDENTIFY again")


def parse_topic_channel(command: str, params: list[bytes]) -> tuple[str, str | None]:
    """REGISTER/UNREGISTER params -> (topic, channel or None); upstream's texts."""
    if not params:
        raise ProtocolError("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else b""
    if not valid_topic_name(topic):
        raise ProtocolError("E_BAD_TOPIC", f"{command} topic name '{raw_text(topic)}' is not valid")
    if channel and not valid_channel_name(channel):
        raise ProtocolError(
            "E_BAD_CHANNEL", f"{command} channel name '{raw_text(channel)}' is not valid")
    return topic.decode("ascii"), (channel.decode("ascii") if channel else None)


@dataclass(frozen=True)
class PeerInfo:
    """What an nsqd says about itself in IDENTIFY (plus the address it connected from)."""

    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    topology_zone: str = ""
    topology_region: str = ""


_PEER_FIELDS: dict[str, Any] = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": _GO_INT,
    "http_port": _GO_INT,
    "version": str,
    "topology_zone": str,
    "topology_region": str,
}


def parse_identify(body: bytes, remote_address: str) -> PeerInfo:
    """IDENTIFY body -> PeerInfo; ``E_BAD_BODY`` on bad JSON or missing required fields."""
    try:
        d = go_json_object(body, _PEER_FIELDS)
    except (ValueError, RecursionError):
        raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
    info = PeerInfo(
        remote_address=remote_address,
        hostname=d.get("hostname", ""),
        broadcast_address=d.get("broadcast_address", ""),
        tcp_port=d.get("tcp_port", 0),
        http_port=d.get("http_port", 0),
        version=d.get("version", ""),
        topology_zone=d.get("topology_zone", ""),
        topology_region=d.get("topology_region", ""),
    )
    if not info.broadcast_address or not info.tcp_port or not info.http_port or not info.version:
        raise ProtocolError("E_BAD_BODY", "IDENTIFY missing fields")
    return info


def identify_response(
    *, tcp_port: int, http_port: int, version: str, broadcast_address: str, hostname: str
) -> bytes:
    """lookupd's IDENTIFY answer (a Go map: keys sorted)."""
    return (
        f'{{"broadcast_address":{go_json_string(broadcast_address)},'
        f'"hostname":{go_json_string(hostname)},"http_port":{http_port},'
        f'"tcp_port":{tcp_port},"version":{go_json_string(version)}}}'
    ).encode()
