"""Server->client frames: ``[4B BE size][4B BE frame_type][data]``, size = 4 + len(data).

A message frame is also nsqx's stored record, so building frames for a batch is done with
C-level ``struct``/``join`` over iterators, never a Python loop per message.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import chain, repeat, starmap
from operator import add

from .errors import ProtocolError

__all__ = [
    "BAD_PROTOCOL_FRAME",
    "CLOSE_WAIT_FRAME",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "FRAME_RESPONSE",
    "HEARTBEAT",
    "HEARTBEAT_FRAME",
    "MESSAGE_HEADER_SIZE",
    "OK_FRAME",
    "FrameReader",
    "build_message_frame",
    "build_message_frames",
    "decode_message",
    "encode_error",
    "encode_frame",
    "encode_response",
    "patch_attempts",
]

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

HEARTBEAT = b"_heartbeat_"
# timestamp(8) + attempts(2) + id(16)
MESSAGE_HEADER_SIZE = 26
ATTEMPTS_OFFSET = 16  # in a full frame: size(4) + type(4) + timestamp(8)

_HDR = struct.Struct(">ii")
_U16 = struct.Struct(">H")
# size, frame type, timestamp, attempts, id: the 34-byte prefix of a message frame
_MSG_PREFIX = struct.Struct(">iiqH16s")
_MSG_DATA_HDR = struct.Struct(">qH16s")


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return _HDR.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return _HDR.pack(len(data) + 4, FRAME_RESPONSE) + data


def encode_error(code: str | ProtocolError, text: str = "") -> bytes:
    """Error frame ``"<CODE> <text>"``; accepts a ProtocolError directly."""
    if isinstance(code, ProtocolError):
        data = code.payload
    else:
        data = f"{code} {text}".encode("utf-8", "surrogateescape")
    return _HDR.pack(len(data) + 4, FRAME_ERROR) + data


OK_FRAME = encode_response(b"OK")
# wrong 4-byte magic: upstream sends this error frame (no text after the code) and closes
BAD_PROTOCOL_FRAME = encode_frame(FRAME_ERROR, b"E_BAD_PROTOCOL")
HEARTBEAT_FRAME = encode_response(HEARTBEAT)
CLOSE_WAIT_FRAME = encode_response(b"CLOSE_WAIT")


def build_message_frame(body: bytes, msg_id: bytes, timestamp_ns: int, attempts: int = 1) -> bytes:
    return _MSG_PREFIX.pack(30 + len(body), FRAME_MESSAGE, timestamp_ns, attempts, msg_id) + body


def build_message_frames(
    bodies: Sequence[bytes], ids: bytes, timestamp_ns: int, attempts: int = 1
) -> bytes:
    """Concatenated message frames for ``bodies`` with ``ids`` (16 bytes each, concatenated).

    Every per-message step is a C-level iterator (map/starmap/zip/join).
    """
    n = len(bodies)
    if len(ids) != 16 * n:
        raise ValueError(f"ids must be {16 * n} bytes, got {len(ids)}")
    if n == 1:
        return _MSG_PREFIX.pack(30 + len(bodies[0]), FRAME_MESSAGE, timestamp_ns, attempts, ids) + bodies[0]
    id_list = map(ids.__getitem__, map(slice, range(0, 16 * n, 16), range(16, 16 * n + 16, 16)))
    sizes = map(add, map(len, bodies), repeat(30))
    prefixes = starmap(
        _MSG_PREFIX.pack,
        zip(sizes, repeat(FRAME_MESSAGE), repeat(timestamp_ns), repeat(attempts), id_list),
    )
    return b"".join(chain.from_iterable(zip(prefixes, bodies, strict=True)))


def patch_attempts(frame: bytes, attempts: int) -> bytes:
    """Copy of a full message frame with its attempts field set (redelivery)."""
    return frame[:ATTEMPTS_OFFSET] + _U16.pack(attempts) + frame[ATTEMPTS_OFFSET + 2 :]


def decode_message(data: bytes) -> tuple[int, int, bytes, bytes]:
    """Message frame *data* (after size and type) -> (timestamp_ns, attempts, id, body)."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise ValueError(f"message frame data too short ({len(data)} bytes)")
    ts, attempts, mid = _MSG_DATA_HDR.unpack_from(data)
    return ts, attempts, mid, bytes(data[MESSAGE_HEADER_SIZE:])


EXT_VERSION_NONE = 0  # Youzan's ext versions: no ext, tag (unused here), JSON header
EXT_VERSION_JSON = 4


def ext_message_frame(frame: bytes | memoryview, ext: bytes) -> bytes:
    """A stored (stock) message frame rebuilt in Youzan's ext layout for clients that
    IDENTIFY ``extend_support``: ``[8 ts][2 attempts][16 id][1 ext version]`` then, when
    there is a header, ``[2 ext len][ext json]``, then the body."""
    head = frame[8:34]
    body = frame[34:]
    extra = b"\x04" + _U16.pack(len(ext)) + ext if ext else b"\x00"
    return b"".join((_HDR.pack(30 + len(extra) + len(body), FRAME_MESSAGE), head, extra, body))


def decode_ext_message(data: bytes) -> tuple[int, int, bytes, int, bytes, bytes]:
    """Ext message frame data -> (timestamp_ns, attempts, id, ext version, ext bytes, body)."""
    if len(data) < MESSAGE_HEADER_SIZE + 1:
        raise ValueError(f"ext message frame data too short ({len(data)} bytes)")
    ts, attempts, mid = _MSG_DATA_HDR.unpack_from(data)
    ver = data[MESSAGE_HEADER_SIZE]
    pos = MESSAGE_HEADER_SIZE + 1
    ext = b""
    if ver:
        if len(data) < pos + 2:
            raise ValueError("ext message frame: truncated ext length")
        n = _U16.unpack_from(data, pos)[0]
        ext = bytes(data[pos + 2 : pos + 2 + n])
        if len(ext) != n:
            raise ValueError("ext message frame: truncated ext")
        pos += 2 + n
    return ts, attempts, mid, ver, ext, bytes(data[pos:])


class FrameReader:
    """Client side: feed raw bytes, get complete ``(frame_type, data)`` tuples.

    Sizes are validated before buffering (``size < 4`` or ``size - 4 > max_frame_size``
    raises immediately), so a corrupt size never makes the reader allocate.
    """

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._need = 8

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        if len(buf) < self._need:
            return []
        out: list[tuple[int, bytes]] = []
        mv = memoryview(buf)
        pos = 0
        end = len(buf)
        unpack = _HDR.unpack_from
        try:
            while end - pos >= 8:
                size, ftype = unpack(buf, pos)
                if size < 4 or size - 4 > self.max_frame_size:
                    raise ProtocolError("E_BAD_FRAME", f"invalid frame size {size}")
                if end - pos - 4 < size:
                    self._need = size + 4
                    break
                out.append((ftype, bytes(mv[pos + 8 : pos + 4 + size])))
                pos += 4 + size
            else:
                self._need = 8
        finally:
            mv.release()
        if pos:
            del buf[:pos]
        return out
