"""Message headers on the way out: Youzan's ext frames, for the clients that ask for them.

Headers live in the log's header sidecar, never in the stored frames, so stock clients get
the stored frames as they are (byte ranges of the log). A client that IDENTIFYs
``extend_support: true`` gets every message in Youzan's ext layout instead (an ext
version byte after the id, then the JSON header when the message has one), which costs a
header read per commit and a rebuilt frame per message: only for those clients.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nsqx.protocol.frames import ext_message_frame
from nsqx.protocol.v2 import ext_json
from nsqx.storage.message_id import parse_id

__all__ = ["ext_frames", "headers_of"]


def headers_of(log_: Any, deliveries: Iterable[Any]) -> dict[int, dict[str, bytes]]:
    """Headers of every delivered offset that has any (one sidecar read per commit)."""
    out: dict[int, dict[str, bytes]] = {}
    for d in deliveries:
        out.update(log_.headers_range(d.offset, d.offset + d.count))
    return out


def _frames(chunks: Sequence[bytes | memoryview]) -> Iterable[memoryview]:
    data = memoryview(b"".join(chunks))
    pos, n = 0, len(data)
    while pos + 4 <= n:
        size = int.from_bytes(data[pos:pos + 4], "big")
        yield data[pos:pos + 4 + size]
        pos += 4 + size


def ext_frames(log_: Any, deliveries: Sequence[Any], chunks: Sequence[bytes | memoryview]
               ) -> list[bytes]:
    """The stored frames in ``chunks`` rebuilt in the ext layout (JSON header or none)."""
    hdrs = headers_of(log_, deliveries)
    out = []
    for frame in _frames(chunks):
        h = None
        if hdrs:
            p, off = parse_id(bytes(frame[18:34]))
            # an imported message keeps Go's id (no nsqx offset in it) and has no headers
            h = hdrs.get(off) if p == log_.partition else None
        out.append(ext_message_frame(frame, ext_json(h) if h else b""))
    return out
