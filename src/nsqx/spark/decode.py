"""Decode nsqd's ``/nsqx/fetch`` answers into Arrow record batches, vectorised.

A fetch answer is a 48-byte header, the stored records (ready NSQ message frames
``[4B size][4B type][8B ts ns][2B attempts][16B hex id][body]`` back to back) and optionally a
headers section (see ``nsqx.nsqd.fetch_api``). Frame starts are found per *run* of equal-sized
frames with numpy (one comparison over the run), so a batch of uniform records costs a constant
amount of Python; the columns are gathered with numpy fancy indexing and handed to Arrow as
buffers without a per-record Python step. Only the optional extension headers are decoded per
record (they are rare and small).

This module is imported on Spark executors: module globals are plain values.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

__all__ = ["FetchResult", "parse_fetch", "frame_starts", "frames_to_batch", "HEADER_FORMAT",
           "HEADER_SIZE", "FetchFormatError"]

HEADER_FORMAT = ">4sBBHQIQQQI"
HEADER_SIZE = 48
MAGIC = b"NQXF"
FRAME_OVERHEAD = 34
_PY_RUN = 256  # frames decoded by a plain loop after a short run (mixed sizes)


class FetchFormatError(ValueError):
    """The fetch answer is not what nsqd sends (truncated, wrong magic, inconsistent)."""


class FetchResult(NamedTuple):
    partition: int
    start: int
    count: int
    next_offset: int
    earliest: int
    latest: int
    frames: memoryview
    headers: dict[int, dict[str, bytes]] | None


def parse_fetch(payload: bytes) -> FetchResult:
    if len(payload) < HEADER_SIZE:
        raise FetchFormatError(f"fetch answer too short ({len(payload)} bytes)")
    magic, version, flags, part, start, count, nxt, earliest, latest, flen = struct.unpack_from(
        HEADER_FORMAT, payload, 0)
    if magic != MAGIC or version != 1:
        raise FetchFormatError(f"not a fetch answer (magic {magic!r}, version {version})")
    end = HEADER_SIZE + flen
    if end > len(payload):
        raise FetchFormatError("fetch answer truncated")
    view = memoryview(payload)
    headers = _parse_headers(view, end) if flags & 1 else None
    return FetchResult(part, start, count, nxt, earliest, latest, view[HEADER_SIZE:end], headers)


def _parse_headers(view: memoryview, p: int) -> dict[int, dict[str, bytes]]:
    (n,) = struct.unpack_from(">I", view, p)
    p += 4
    out: dict[int, dict[str, bytes]] = {}
    for _ in range(n):
        off, nk = struct.unpack_from(">QH", view, p)
        p += 10
        h = {}
        for _ in range(nk):
            (kl,) = struct.unpack_from(">H", view, p)
            k = bytes(view[p + 2:p + 2 + kl]).decode("utf-8", "replace")
            p += 2 + kl
            (vl,) = struct.unpack_from(">I", view, p)
            h[k] = bytes(view[p + 4:p + 4 + vl])
            p += 4 + vl
        out[off] = h
    return out


def frame_starts(data: Any, count: int) -> np.ndarray:
    """Start of every frame plus the end (count + 1 values), per run of equal sizes."""
    raw = memoryview(data).cast("B")
    buf = np.frombuffer(raw, dtype=np.uint8)
    n = len(buf)
    starts = np.empty(count + 1, dtype=np.int64)
    k = p = 0
    guess = count
    while k < count:
        if p + 4 > n:
            raise FetchFormatError("frames truncated")
        f = int.from_bytes(buf[p:p + 4].tobytes(), "big") + 4
        if f < FRAME_OVERHEAD:
            raise FetchFormatError(f"bad frame size {f - 4} at byte {p}")
        m = min(count - k, (n - p) // f, max(guess, 16))
        if m <= 0:
            raise FetchFormatError("frames truncated")
        rows = buf[p:p + m * f].reshape(m, f)[:, :4]
        eq = (rows == rows[0]).all(axis=1)
        r = m if eq.all() else int(np.argmin(eq))
        starts[k:k + r] = np.arange(p, p + r * f, f, dtype=np.int64)
        k += r
        p += r * f
        guess = 2 * r
        if r < 8 and k < count:  # sizes vary: walk a stretch with plain Python
            stop = min(count, k + _PY_RUN)
            while k < stop:
                if p + 4 > n:
                    raise FetchFormatError("frames truncated")
                starts[k] = p
                p += 4 + int.from_bytes(raw[p:p + 4], "big")
                k += 1
    if p > n:
        raise FetchFormatError("frames truncated")
    starts[count] = p
    return starts


def _gather(buf: np.ndarray, starts: np.ndarray, delta: int, width: int) -> np.ndarray:
    idx = starts[:, None] + (delta + np.arange(width, dtype=np.int64))
    return buf[idx]


def _const_strings(value: str, n: int) -> pa.Array:
    b = value.encode()
    offsets = np.arange(0, (n + 1) * len(b), len(b) or 1, dtype=np.int32)[: n + 1]
    if not b:
        offsets = np.zeros(n + 1, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(b * n))


def frames_to_batch(res: FetchResult, topic: str, schema: pa.Schema,
                    header_columns: bool = False) -> pa.RecordBatch:
    """One RecordBatch (columns in ``schema`` order) for the records of a fetch answer."""
    n = res.count
    buf = np.frombuffer(res.frames, dtype=np.uint8)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=schema)
    f0 = int.from_bytes(bytes(res.frames[:4]), "big") + 4
    if f0 * n == len(buf):  # maybe uniform: one reshape, one check
        mat = buf.reshape(n, f0)
        uniform = bool((mat[:, :4] == mat[0, :4]).all())
    else:
        uniform = False
    if uniform:
        ts = np.ascontiguousarray(mat[:, 8:16]).view(">i8").reshape(n)
        ids = np.ascontiguousarray(mat[:, 18:34]).reshape(-1)
        bodies = np.ascontiguousarray(mat[:, 34:]).reshape(-1)
        blen = f0 - FRAME_OVERHEAD
        body_off = np.arange(0, (n + 1) * blen, blen or 1, dtype=np.int32)[: n + 1]
        if blen == 0:
            body_off = np.zeros(n + 1, dtype=np.int32)
    else:
        starts = frame_starts(res.frames, n)
        s = starts[:-1]
        ts = _gather(buf, s, 8, 8).view(">i8").reshape(n)
        ids = _gather(buf, s, 18, 16).reshape(-1)
        lens = starts[1:] - s - FRAME_OVERHEAD
        if (lens < 0).any():
            raise FetchFormatError("frame shorter than its header")
        mark = np.zeros(len(buf) + 1, dtype=np.int8)
        mark[s + FRAME_OVERHEAD] += 1  # indices unique within each of the two steps
        mark[starts[1:]] -= 1
        mask = np.cumsum(mark[:-1], dtype=np.int8).astype(bool)
        bodies = buf[mask]
        body_off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=body_off[1:])
    cols: dict[str, Any] = {
        "topic": _const_strings(topic, n),
        "partition": pa.array(np.full(n, res.partition, dtype=np.int32)),
        "offset": pa.array(np.arange(res.start, res.start + n, dtype=np.int64)),
        "id": pa.StringArray.from_buffers(
            n, pa.py_buffer(np.arange(0, 16 * (n + 1), 16, dtype=np.int32)), pa.py_buffer(ids)),
        "timestamp": pa.array((ts.astype(np.int64) // 1000), type=pa.timestamp("us", tz="UTC")),
        "body": pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(body_off),
                                                             pa.py_buffer(bodies)]),
    }
    if header_columns:
        hdrs = res.headers or {}
        keys, tags, traces = [None] * n, [None] * n, [None] * n
        for off, h in hdrs.items():
            i = off - res.start
            if 0 <= i < n:
                keys[i] = h.get("key")
                t = h.get("tag")
                tags[i] = t.decode("utf-8", "replace") if t is not None else None
                t = h.get("trace_id", h.get("trace-id"))
                traces[i] = t.decode("utf-8", "replace") if t is not None else None
        cols["key"] = pa.array(keys, type=pa.binary())
        cols["tag"] = pa.array(tags, type=pa.string())
        cols["trace_id"] = pa.array(traces, type=pa.string())
    arrays = [cols[f.name].cast(f.type) if cols[f.name].type != f.type else cols[f.name]
              for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
