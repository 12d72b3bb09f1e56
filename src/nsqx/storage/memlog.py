"""MemoryLog: the PartitionLog interface without files, for ``#ephemeral`` topics.

Like upstream's ephemeral topics it keeps at most ``mem_queue_size`` messages and drops the oldest
(start_offset moves; readers see the skip through ReadResult.start). Records are the same ready
frames as on disk, so delivery code does not care which log it reads.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence

from nsqx.storage.checksum import crc32
from nsqx.storage.message_id import ids_for_range
from nsqx.storage.records import (
    BatchInfo,
    Chunk,
    LogConfig,
    LogError,
    ReadResult,
    build_frames,
    chunk_frame,
    frame_positions,
    read_chunks,
)

__all__ = ["MemoryLog"]


class MemoryLog:
    """Bounded in-memory log; sync/flush are trivial, retention is by message count."""

    imported = None  # PartitionLog's imported range (nsqx import): never in memory
    durable = False  # nothing reaches a file: no fsync policy, no syncfs tickets
    lower: None = None  # PartitionLog's archive tier (its ``LowerTier``): never under memory

    def __init__(self, partition: int = 0, mem_queue_size: int = 10000,
                 config: LogConfig | None = None) -> None:
        self.partition = partition
        self.mem_queue_size = max(0, mem_queue_size)
        self.config = config or LogConfig()
        self.path = None
        self.start_offset = 0
        self.next_offset = 0
        self._flushed = 0
        self._pending: list[tuple[Chunk, int, list | None]] = []
        self._chunks: list[Chunk] = []
        self._bases: list[int] = []
        self._meta: list[tuple[int, int, Sequence | None]] = []  # (epoch, commit id, headers)
        self._head = 0
        self._commit_id = 0
        self.dropped = 0  # messages dropped because the queue was full
        self._closed = False

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def synced_offset(self) -> int:
        return self._flushed

    def size_bytes(self) -> int:
        return sum(c.nbytes for c in self._chunks[self._head :])

    def append(self, bodies: Sequence[bytes], timestamp_ns: int | None = None, *, epoch: int = 0,
               headers: Sequence[dict[str, bytes] | None] | None = None) -> int:
        if self._closed:
            raise LogError("memory log is closed")
        n = len(bodies)
        base = self.next_offset
        if n == 0:
            return base
        if headers is not None and len(headers) != n:
            raise ValueError("headers must have one entry per body")
        ts = time.time_ns() if timestamp_ns is None else timestamp_ns
        data, flen = build_frames(bodies, ids_for_range(self.partition, base, n), ts)
        rel = None if flen else frame_positions(bodies)
        self._pending.append((Chunk(base, n, data, rel, flen, None, 0, ts), epoch,
                              list(headers) if headers and any(headers) else None))
        self.next_offset = base + n
        return base

    def flush(self) -> int:
        if not self._pending:
            return 0
        for ch, epoch, hdrs in self._pending:
            self._chunks.append(ch)
            self._bases.append(ch.base)
            self._meta.append((epoch, self._commit_id, hdrs))
            self._commit_id += 1
        self._pending = []
        n = self.next_offset - self._flushed
        self._flushed = self.next_offset
        self._trim()
        return n

    def _trim(self) -> None:
        floor = self._flushed - self.mem_queue_size
        if floor > self.start_offset:
            self.dropped += floor - self.start_offset
            self.start_offset = floor
        while self._head < len(self._chunks) and self._chunks[self._head].end <= self.start_offset:
            self._chunks[self._head] = None  # type: ignore[call-overload]
            self._meta[self._head] = None  # type: ignore[call-overload]
            self._head += 1
        if self._head > 1024 and self._head * 2 > len(self._chunks):
            del self._chunks[: self._head], self._bases[: self._head], self._meta[: self._head]
            self._head = 0

    def needs_sync(self) -> bool:
        return False

    def release_files(self) -> bool:
        """Nothing to release: a memory log has no files (the node's idle pass asks every
        topic's log)."""
        return False

    @property
    def open_files(self) -> int:
        return 0

    def sync(self) -> None:
        return None

    def write_waiting_meta(self) -> None:
        return None  # nothing is written: nothing waits

    def begin_sync(self) -> tuple:
        return ()  # not durable (storage.commit never asks): no files to sync

    def end_sync(self, ticket: tuple, *, fs_synced: bool = False) -> None:
        return None

    def _index(self, offset: int) -> int:
        return bisect_right(self._bases, offset, self._head) - 1

    def _get_chunk(self, offset: int) -> Chunk:
        return self._chunks[self._index(offset)]

    def read(self, offset: int, max_bytes: int, max_count: int | None = None) -> ReadResult:
        offset = max(offset, self.start_offset)
        if offset >= self._flushed or (max_count is not None and max_count <= 0):
            return ReadResult(b"", offset, 0, offset)
        data, n, nxt = read_chunks(self._get_chunk, offset, self._flushed, max_bytes, max_count)
        return ReadResult(data, offset, n, nxt)

    def read_one(self, offset: int) -> bytes | memoryview:
        """The frame at a readable offset (start_offset <= offset < flushed): ``read(offset,
        0, 1).data`` without the walk."""
        return chunk_frame(self._get_chunk(offset), offset)

    def read_frame(self, offset: int) -> bytes:
        if not self.start_offset <= offset < self._flushed:
            raise KeyError(offset)
        return bytes(self.read(offset, 0, 1).data)

    def offset_for_time(self, timestamp_ns: int) -> int:
        hi = -(1 << 63)
        for i in range(self._head, len(self._chunks)):
            ch = self._chunks[i]
            hi = max(hi, ch.ts)
            if hi >= timestamp_ns:
                return max(ch.base, self.start_offset)
        return self._flushed

    def truncate_to(self, offset: int) -> None:
        offset = max(offset, 0)
        self._pending = [p for p in self._pending if p[0].end <= offset]
        if offset < self._flushed:
            self._pending = []
            i = self._index(offset) if offset >= self._bases[self._head] else self._head - 1
            keep = i + 1
            if i >= self._head and self._chunks[i].base < offset:
                ch = self._chunks[i]
                k = offset - ch.base
                self._chunks[i] = Chunk(ch.base, k, ch.data, ch.pos, ch.flen, None, 0, ch.ts)
            elif i >= self._head:
                keep = i
            del self._chunks[keep:], self._bases[keep:], self._meta[keep:]
            self._head = min(self._head, len(self._chunks))
            self._flushed = offset
            if offset < self.start_offset:
                self.start_offset = offset
        self.next_offset = max(self._flushed, max((p[0].end for p in self._pending),
                                                  default=self._flushed))

    def batches(self, from_offset: int = 0) -> Iterator[BatchInfo]:
        start = max(self._head, self._index(from_offset)) if self._bases else 0
        for i in range(start, len(self._chunks)):
            ch, (epoch, cid, _h) = self._chunks[i], self._meta[i]
            yield BatchInfo(ch.base, ch.count, ch.ts, epoch, cid,
                            crc32(memoryview(ch.data)[: ch.at(ch.count)]))

    def headers(self, offset: int) -> dict[str, bytes] | None:
        if not self.start_offset <= offset < self._flushed:
            return None
        i = self._index(offset)
        hdrs = self._meta[i][2]
        if not hdrs:
            return None
        return hdrs[offset - self._chunks[i].base] or None

    def headers_range(self, lo: int, hi: int) -> dict[int, dict[str, bytes]]:
        """Extension headers of the offsets in [lo, hi) (PartitionLog's contract)."""
        out: dict[int, dict[str, bytes]] = {}
        for off in range(max(lo, self.start_offset), min(hi, self._flushed)):
            h = self.headers(off)
            if h:
                out[off] = h
        return out

    @property
    def earliest_offset(self) -> int:
        """Oldest readable offset (no archive tier for a log in memory)."""
        return self.start_offset

    def apply_retention(self, floor_offset: int, now: float | None = None) -> int:
        return self.start_offset

    def close(self) -> None:
        self.flush()
        self._closed = True
