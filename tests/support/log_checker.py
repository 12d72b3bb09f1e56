"""Read back what a topic partition stored (``/nsqx/fetch``), for exactly-once checkers."""

from __future__ import annotations

import struct
import urllib.request
from collections import Counter

_HEAD = struct.Struct(">4sBBHQIQQQI")


def stored(http_address: str, topic: str, partition: int = 0
           ) -> list[tuple[bytes, dict[str, bytes]]]:
    """Every (body, headers) of the partition, in offset order."""
    out: list[tuple[bytes, dict[str, bytes]]] = []
    offset = 0
    while True:
        url = (f"http://{http_address}/nsqx/fetch?topic={topic}&partition={partition}"
               f"&offset={offset}&headers=1")
        with urllib.request.urlopen(url, timeout=30) as r:
            data = r.read()
        _, _, _, _, start, count, nxt, _, _, flen = _HEAD.unpack_from(data, 0)
        if count == 0:
            return out
        frames = data[_HEAD.size:_HEAD.size + flen]
        bodies = []
        pos = 0
        while pos < len(frames):
            (size,) = struct.unpack_from(">I", frames, pos)
            bodies.append(frames[pos + 4 + 4 + 26:pos + 4 + size])
            pos += 4 + size
        headers: dict[int, dict[str, bytes]] = {}
        tail = data[_HEAD.size + flen:]
        (n,) = struct.unpack_from(">I", tail, 0)
        pos = 4
        for _ in range(n):
            off, nkeys = struct.unpack_from(">QH", tail, pos)
            pos += 10
            h = headers[off] = {}
            for _ in range(nkeys):
                (kl,) = struct.unpack_from(">H", tail, pos)
                k = tail[pos + 2:pos + 2 + kl].decode()
                pos += 2 + kl
                (vl,) = struct.unpack_from(">I", tail, pos)
                h[k] = tail[pos + 4:pos + 4 + vl]
                pos += 4 + vl
        out += [(b, headers.get(start + i, {})) for i, b in enumerate(bodies)]
        offset = nxt


def lost_and_duplicated(expected: list[bytes], got: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """(bodies never stored, bodies stored more than once)."""
    seen = Counter(got)
    return ([b for b in expected if b not in seen], [b for b, n in seen.items() if n > 1])
