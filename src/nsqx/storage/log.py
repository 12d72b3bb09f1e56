"""PartitionLog: one topic partition as an append-only log of NSQ message frames in a directory.

append() builds a batch's frames in memory (offsets assigned at once); flush() writes every
buffered batch with one os.writev per segment plus the metadata; sync() fsyncs and moves the
recovery point. Reads are served from the in-memory tail while readers keep up, otherwise by
pread with read-ahead; locate() gives (fd, position, nbytes, count) for sendfile.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from itertools import accumulate, repeat
from operator import add
from pathlib import Path
from typing import Protocol

from nsqx.speedups import native
from nsqx.storage import imported_ids
from nsqx.storage.checksum import crc32
from nsqx.storage.memlog import MemoryLog
from nsqx.storage.message_id import ids_for_range
from nsqx.storage.records import (
    FRAME_OVERHEAD,
    BatchInfo,
    Chunk,
    LogConfig,
    LogError,
    ReadResult,
    SegmentCorrupt,
    build_frames,
    chunk_frame,
    decode_headers,
    encode_headers,
    log_error,
    read_chunks,
    take_from_chunk,
)
from nsqx.storage.segment import (
    ENTRY_BODY,
    ENTRY_SIZE,
    SUFFIXES,
    Segment,
    list_segments,
    seg_name,
    write_all,
)

__all__ = ["LogConfig", "LogError", "PartitionLog", "MemoryLog", "ReadResult", "BatchInfo"]

log = logging.getLogger("nsqx.storage.log")
_CKPT = struct.Struct(">QI")
_PREFIX = struct.Struct(">IIqH")
_U32 = struct.Struct(">I")
_DATA_CRC = struct.calcsize(">QIQQqqIQ")  # where a commit entry's frames crc lies (ENTRY_BODY)
_LITTLE = sys.byteorder == "little"
CHECKPOINT = "recovery-point"
CHECKPOINT_INTERVAL = 5.0  # seconds between recovery-point moves after a syncfs pass
READ_AHEAD = 1 << 20
NO_LIMIT = 1 << 63  # ready_end: nothing to wait for
_DISK_CACHE = 8  # read-ahead chunks kept for lagging readers


@lru_cache(maxsize=64)
def _crcs_struct(n: int) -> struct.Struct:
    """The frames crcs of n back-to-back commit entries, in one unpack (one C call)."""
    return struct.Struct(">" + f"{_DATA_CRC}xI{ENTRY_SIZE - _DATA_CRC - 4}x" * n)


def frames_py(bodies: Sequence[bytes], partition: int, base: int, ts: int
              ) -> tuple[bytes, int, bytes | None, bytes | None]:
    """Frames of a batch of more than one body: (data, uniform frame length or 0, frame
    starts plus the end as native int64 bytes, frame lengths as 4B big-endian); the last
    two None when uniform. The twin of ``nsqx._speedups.frames``."""
    data, flen = build_frames(bodies, ids_for_range(partition, base, len(bodies)), ts)
    if flen:
        return data, flen, None, None
    fl = list(map(add, map(len, bodies), repeat(FRAME_OVERHEAD)))
    a = array("I", fl)
    if _LITTLE:
        a.byteswap()
    return data, 0, array("q", accumulate(fl, initial=0)).tobytes(), a.tobytes()


_frames = native.frames if native is not None else frames_py


class _Pending:
    __slots__ = ("base", "count", "data", "rel", "flen", "ts", "epoch", "headers", "sizes",
                 "max_ts")

    def __init__(self, base, count, data, rel, flen, ts, epoch, headers, sizes=None,
                 max_ts=None):
        self.base, self.count, self.data, self.rel = base, count, data, rel
        self.flen, self.ts, self.epoch, self.headers = flen, ts, epoch, headers
        self.sizes = sizes  # frame lengths, 4B BE each (mixed batches)
        # newest timestamp in the batch: ts unless copied frames span several (replication)
        self.max_ts = ts if max_ts is None or max_ts < ts else max_ts

    def frame_sizes(self) -> bytes:
        return self.sizes if self.sizes is not None else _U32.pack(self.flen) * self.count


class LowerTier(Protocol):
    """Older offsets kept elsewhere (the archive: nsqx.storage.archive.ArchiveTier), read
    through the log below its local start."""

    def start_for(self, local_start: int) -> int: ...
    def ready(self, offset: int, notify: Callable[[], None]) -> int: ...
    def chunk(self, offset: int) -> Chunk: ...
    def headers(self, offset: int) -> dict[str, bytes] | None: ...
    def headers_range(self, lo: int, hi: int) -> dict[int, dict[str, bytes]]: ...
    def offset_for_time(self, ts: int) -> int | None: ...


def frame_lengths(data: bytes, count: int) -> list[int]:
    """Lengths of ``count`` stored frames back to back in ``data`` (ValueError if they are not)."""
    out = []
    pos, n = 0, len(data)
    unpack = _U32.unpack_from
    for _ in range(count):
        if n - pos < 34:
            raise ValueError(f"truncated frame at byte {pos}")
        size = unpack(data, pos)[0] + 4
        if size < 34 or pos + size > n or data[pos + 4:pos + 8] != b"\0\0\0\x02":
            raise ValueError(f"malformed frame at byte {pos}")
        out.append(size)
        pos += size
    if pos != n:
        raise ValueError(f"{n - pos} bytes after {count} frames")
    return out


class PartitionLog:
    """Segment files + sparse indexes + group-writable tail; see module doc."""

    durable = True  # appends reach files (storage.commit.CommitLog)
    _fast_commit = True  # flush of one batch via Segment.write_single (tests turn it off)

    def __init__(self, path: str | Path, partition: int = 0, config: LogConfig | None = None
                 ) -> None:
        self.path = Path(path)
        self.partition = partition
        self.config = config or LogConfig()
        self._lock = threading.Lock()  # guards the sync bookkeeping shared with sync threads
        self._segments: list[Segment] = []
        self._seg_bases: list[int] = []
        self._pending: list[_Pending] = []
        self._tail: list[Chunk] = []
        self._tail_bases: list[int] = []
        self._tail_head = 0
        self._tail_bytes = 0
        self._disk_chunks: list[Chunk] = []
        self.tail_limit = self.config.mem_tail_bytes
        self._disk_cache = _DISK_CACHE
        self._read_ahead = READ_AHEAD
        self._dirty: set[Segment] = set()
        self._dir_dirty = False
        self._last_checkpoint = 0.0
        self._last_sync = time.monotonic()
        self._closed = False
        # tiered storage (set by the owner when archiving is on): offsets below the local
        # start are read from ``lower``; a segment is deleted only if ``may_delete(its end
        # offset)`` says it is archived
        self.lower: LowerTier | None = None
        self.may_delete: Callable[[int], bool] | None = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # frames that keep another broker's ids (nsqx import); None for every other log
            try:
                self.imported = imported_ids.load(self.path)
            except ValueError as e:  # damaged: recovery would cut the frames it vouches for
                raise LogError(f"opening log failed for {self.path}: {e}") from e
            self._recover()
        except OSError as e:
            for s in self._segments:
                s.close()
            raise log_error("opening log", self.path, e) from e
        self._flushed = self._segments[-1].next_offset
        if self.imported is not None:
            self._settle_imported()
        self.next_offset = self._flushed
        self._synced = self._flushed  # what survived recovery is on disk
        self._commit_id = max(s.last_commit_id for s in self._segments) + 1

    # -- recovery ------------------------------------------------------------------------
    def _read_checkpoint(self) -> int:
        try:
            raw = (self.path / CHECKPOINT).read_bytes()
            off, crc = _CKPT.unpack(raw)
            if crc32(raw[:8]) == crc:
                return off
        except (OSError, struct.error):
            pass
        return 0

    def _recover(self) -> None:
        ckpt = self._read_checkpoint()
        bases = list_segments(self.path)
        cut_at: int | None = None
        for base in bases:
            if cut_at is not None and base >= cut_at:
                log.warning("%s: segment after a torn tail at offset %d; deleting it",
                            self.path / (seg_name(base) + ".log"), cut_at)
                self._segment(base).delete()
                continue
            seg = self._segment(base)
            if self._segments and base != self._segments[-1].next_offset:
                log.warning("%s: gap or overlap before this segment (expected base %d); deleting "
                            "it and later ones", seg.paths[0], self._segments[-1].next_offset)
                seg.delete()
                cut_at = base
                continue
            cut = seg.recover(ckpt, scrub=self.config.cut_damaged_synced)
            seg.release_files()  # reopened on first use: a node of many topics starts
            self._segments.append(seg)  # without one descriptor per file of each
            if cut:
                cut_at = seg.next_offset
        if not self._segments:
            self._segments.append(self._new_segment(0))
            self._segments[0].release_files()
        self._seg_bases = [s.base for s in self._segments]
        for p in self.path.iterdir():  # orphans of deleted segments, stale checkpoint temps
            if ((p.suffix in SUFFIXES[1:] and p.stem.isdigit()
                 and int(p.stem) not in self._seg_bases)
                    or (p.name.startswith(CHECKPOINT + ".") and p.suffix == ".tmp")):
                p.unlink()

    def _segment(self, base: int) -> Segment:
        seg = Segment(self.path, base, self.partition, self.config.index_interval_bytes,
                      self.config.reclaim_files)
        seg.imported = self.imported
        return seg

    def _set_imported(self, imported: imported_ids.ImportedIds | None) -> None:
        self.imported = imported
        for s in self._segments:
            s.imported = imported

    def _settle_imported(self) -> None:
        """After recovery: forget imported offsets the log no longer holds (a torn tail: new
        frames there carry nsqx's ids; retention: nothing left to resolve)."""
        imp = self.imported
        assert imp is not None
        try:
            if self.start_offset >= imp.hi or self._flushed <= imp.lo:
                self._set_imported(None)
                (self.path / imported_ids.FILE_NAME).unlink(missing_ok=True)
            elif self._flushed < imp.hi:
                imp.cut(self._flushed)
                imp.save(self.path)
        except OSError as e:
            raise log_error("opening log", self.path, e) from e

    def record_imported(self, ids: Sequence[int]) -> None:
        """Record the ids the next ``len(ids)`` frames carry (nsqx import: Go's ids, see
        ``imported_ids``), before ``append_frames`` gets those frames; the record is written
        (``imported-ids``) by the next ``sync()``, before the recovery point covers them."""
        imp = self.imported
        if imp is None:
            imp = imported_ids.ImportedIds(self.next_offset)
            self._set_imported(imp)
        elif imp.hi != self.next_offset:
            raise ValueError(f"imported range ends at {imp.hi}, the log at {self.next_offset}")
        imp.extend(self.partition, ids)

    def _new_segment(self, base: int) -> Segment:
        seg = self._segment(base)
        self._dir_dirty = True
        return seg

    # -- properties ----------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        return self._segments[0].base

    @property
    def earliest_offset(self) -> int:
        """Oldest readable offset: the archive's start when one reaches the local start."""
        lower = self.lower
        start = self._segments[0].base
        return start if lower is None else lower.start_for(start)

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def synced_offset(self) -> int:
        return self._synced

    def closed_segments(self, *, synced_only: bool = True) -> list[tuple[int, int, int]]:
        """(base, end offset, bytes) of the segments no append touches again (all but the
        newest), only fully fsynced ones unless ``synced_only`` is false: what an archiver
        may copy."""
        synced = self._synced
        return [(s.base, s.next_offset, s.size) for s in self._segments[:-1]
                if not synced_only or s.next_offset <= synced]

    def closed_span(self, lo: int, hi: int) -> tuple[Path, int, int, bool] | None:
        """(log file, position of lo, position of hi, whether any commit of the segment has
        extension headers) when [lo, hi) lies in one closed segment, else None: an archiver
        reads those bytes itself, in its own thread and through its own descriptor (a
        closed segment's frames never change; retention deletes the file only once it is
        archived)."""
        if self._closed or not self.start_offset <= lo < hi:
            return None
        seg = self._segment_for(lo)
        if seg is self._segments[-1] or hi > seg.next_offset:
            return None
        end = seg.log_end if hi == seg.next_offset else seg.position_of(hi)
        return seg.paths[0], seg.position_of(lo), end, bool(seg.sizes[4])

    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    # -- append / flush ------------------------------------------------------------------
    def append(self, bodies: Sequence[bytes], timestamp_ns: int | None = None, *, epoch: int = 0,
               headers: Sequence[dict[str, bytes] | None] | None = None) -> int:
        """Buffer one batch as frames (ids from offsets); returns its base offset."""
        if self._closed:
            raise LogError(f"log {self.path} is closed")
        n = len(bodies)
        base = self.next_offset
        if n == 0:
            return base
        ts = time.time_ns() if timestamp_ns is None else timestamp_ns
        if n == 1:  # single PUB: same bytes as build_frames, less overhead
            body = bodies[0]
            data = b"".join((_PREFIX.pack(len(body) + 30, 2, ts, 1),
                             b"%016x" % ((self.partition << 48) | base), body))
            flen, rel, sizes = len(data), None, None
        else:
            try:
                data, flen, raw_rel, sizes = _frames(bodies, self.partition, base, ts)
            except TypeError:  # a body that is not bytes (bytearray, memoryview): the twin
                data, flen, raw_rel, sizes = frames_py(bodies, self.partition, base, ts)
            rel = None
            if raw_rel is not None:
                rel = array("q")
                rel.frombytes(raw_rel)
        if headers is not None and len(headers) != n:
            raise ValueError("headers must have one entry per body")
        self._pending.append(_Pending(base, n, data, rel, flen, ts, epoch,
                                      headers if headers and any(headers) else None, sizes))
        self.next_offset = base + n
        return base

    def append_frames(self, data: bytes, count: int, timestamp_ns: int, *, epoch: int = 0,
                      headers: Sequence[dict[str, bytes] | None] | None = None,
                      lengths: list[int] | None = None, flen: int = 0,
                      max_ts: int | None = None) -> int:
        """Buffer ready-made frames as one batch (a replica copying its leader's log).

        The frames must be this log's own for the next offsets (same partition, ids from
        those offsets, attempts 1), as a leader's fetch returns them; checked cheaply (the
        first and last ids and sizes, plus every size, or the sum of the ``lengths`` a caller
        already has, or ``count * flen`` for frames of one length ``flen``, as the leader's
        commit metadata gives them), so the replica's log holds the leader's bytes.
        ``max_ts``: the newest frame timestamp when the frames span several of the leader's
        batches (``timestamp_ns`` is the first one's).
        """
        if self._closed:
            raise LogError(f"log {self.path} is closed")
        base = self.next_offset
        if count <= 0:
            return base
        if flen:
            if flen < FRAME_OVERHEAD or flen * count != len(data):
                raise ValueError("frame length does not match the data")
            fl = None
        elif lengths is None:
            fl = frame_lengths(data, count)
        elif len(lengths) != count or sum(lengths) != len(data):
            raise ValueError("frame lengths do not match the data")
        else:
            fl = lengths  # walked by the caller (the replica's fetch loop)
        last = flen if flen else fl[-1]
        first = flen if flen else fl[0]
        for i, pos, size in ((0, 0, first), (count - 1, len(data) - last, last)):
            want = b"%016x" % ((self.partition << 48) | (base + i))
            if data[pos + 18:pos + 34] != want and self.imported is not None:
                want = self.imported.ids(self.partition, base + i, 1)  # nsqx import's frames
            if data[pos + 18:pos + 34] != want:
                raise ValueError(f"frame {i} carries id {bytes(data[pos + 18:pos + 34])!r}, "
                                 f"expected {want!r}")
            if data[pos:pos + 8] != _U32.pack(size - 4) + b"\0\0\0\x02":
                raise ValueError(f"frame {i} is not a message frame of {size} bytes")
        if flen:
            rel, sizes = None, None
        elif fl.count(fl[0]) == count:
            flen, rel, sizes = fl[0], None, None
        else:
            flen, rel = 0, list(accumulate(fl, initial=0))
            a = array("I", fl)
            if _LITTLE:
                a.byteswap()
            sizes = a.tobytes()
        if headers is not None and len(headers) != count:
            raise ValueError("headers must have one entry per frame")
        if not isinstance(data, bytes) and not (isinstance(data, memoryview) and data.readonly):
            data = bytes(data)  # kept as it is otherwise: a view of a fetch answer, no copy
        self._pending.append(_Pending(base, count, data, rel, flen, timestamp_ns, epoch,
                                      headers if headers and any(headers) else None, sizes,
                                      max_ts))
        self.next_offset = base + count
        return base

    def commits_range(self, lo: int, hi: int) -> list[tuple] | None:
        """The commits that make up exactly [lo, hi), for a replica to copy them as they are:
        (base, count, first ts, max ts, epoch, frame length, frame lengths or None) each, the
        frame lengths only for a commit of mixed sizes. None when lo or hi falls inside a
        commit, or a commit's sizes cannot be read (the caller then walks the frames).

        Per commit Python (one pread of the metadata per segment), nothing per message.
        """
        out: list[tuple] = []
        hi = min(hi, self._flushed)
        for seg in list(self._segments):
            if seg.next_offset <= lo or seg.base >= hi or not seg.bases:
                continue
            c0 = seg.commit_of(max(lo, seg.base))
            c1 = seg.commit_of(min(hi, seg.next_offset) - 1)
            raw = seg.meta_raw(c0, c1 - c0 + 1)
            if len(raw) != (c1 - c0 + 1) * ENTRY_SIZE:
                return None
            for i in range(c1 - c0 + 1):
                e = ENTRY_BODY.unpack_from(raw, i * ENTRY_SIZE)
                base, count, flen = e[0], e[1], e[12]
                if base < lo or base + count > hi:
                    return None
                lengths = None
                if not flen:
                    a = seg.frame_sizes(c0 + i)
                    if a is None:
                        return None
                    lengths = a.tolist()
                out.append((base, count, e[4], e[5], e[6], flen, lengths))
        if not out or out[0][0] != lo or out[-1][0] + out[-1][1] != hi:
            return None
        return out

    def headers_range(self, lo: int, hi: int) -> dict[int, dict[str, bytes]]:
        """Extension headers of the offsets in [lo, hi): one read per commit that has any."""
        out: dict[int, dict[str, bytes]] = {}
        hi = min(hi, self._flushed)
        if lo < self.start_offset and self.lower is not None:
            out.update(self.lower.headers_range(max(lo, self.earliest_offset),
                                                min(hi, self.start_offset)))
        for seg in list(self._segments):
            if seg.next_offset <= lo or seg.base >= hi or not seg.bases or not seg.sizes[4]:
                continue  # (an empty .headers file: no commit of the segment has any)
            for e in seg.entries(seg.commit_of(max(lo, seg.base))):
                base, count = e[0], e[1]
                if base >= hi:
                    break
                if not e[10]:
                    continue
                blob = os.pread(seg.hdr_fd, e[10], e[9])
                for off in range(max(base, lo), min(base + count, hi)):
                    h = decode_headers(blob, off - base)
                    if h:
                        out[off] = h
        return out

    def flush(self) -> int:
        """Write every buffered batch (one os.writev per segment touched) plus metadata."""
        pending = self._pending
        if not pending:
            return 0
        self._pending = []
        seg = self._segments[-1]
        if len(pending) == 1 and self._fast_commit:
            p = pending[0]
            if seg.sizes[0] == 0 or seg.sizes[0] + len(p.data) <= self.config.segment_bytes:
                return self._flush_single(seg, p)
        created: list[Segment] = []
        saved = {}  # segment -> file sizes before the write, for rollback
        applied: list[tuple[Segment, list[Chunk], tuple]] = []

        def remember(s: Segment) -> None:
            if s not in saved:
                saved[s] = list(s.sizes)

        try:
            groups: list[tuple[Segment, list[list[_Pending]]]] = []
            size = seg.size
            cur: list[_Pending] = []
            commits: list[list[_Pending]] = []
            for p in pending:
                if size > 0 and size + len(p.data) > self.config.segment_bytes:
                    if cur:
                        commits.append(cur)
                    groups.append((seg, commits))
                    seg = self._new_segment(p.base)
                    created.append(seg)
                    size, cur, commits = 0, [], []
                if cur and cur[-1].epoch != p.epoch:
                    commits.append(cur)
                    cur = []
                cur.append(p)
                size += len(p.data)
            if cur:
                commits.append(cur)
            groups.append((seg, commits))
            for s, cs in groups:
                s.write_lazy()  # the waiting entries precede this flush's (all or nothing)
                remember(s)
                snap = s.snapshot()
                applied.append((s, self._write_commits(s, cs), snap))
        except OSError as e:
            for s, _, snap in applied:
                s.restore(snap)  # earlier groups of this flush are undone too
            self._rollback(saved, created)
            raise log_error("writing", self.path, e) from e
        # success: publish
        with self._lock:
            self._dirty.update(s for s, _, _ in applied)
        for _, chunks, _ in applied:
            for ch in chunks:
                self._add_tail(ch)
        if created:
            self._segments.extend(created)
            self._seg_bases = [s.base for s in self._segments]
        n = self.next_offset - self._flushed
        self._flushed = self.next_offset
        return n

    def _flush_single(self, seg: Segment, p: _Pending) -> int:
        """flush() of one batch that fits the open segment: Segment.write_single.

        Speed: this is every flush of one PUB (or one MPUB) per loop turn; the general path
        costs ~18 us of Python for it (plans, snapshots, groups), this one a third of that.
        A batch with headers (an idempotent producer's mark is one) takes it too, eagerly.
        tests/storage/test_log_fast_commit.py checks both write the same files.
        """
        hdr = encode_headers(p.headers, 0) if p.headers is not None else b""
        try:
            if hdr:
                seg.write_lazy()  # its entry goes first: every waiting one before it
            else:
                seg.settle_lazy(p.epoch)
        except OSError as e:
            raise log_error("writing", self.path, e) from e
        saved = list(seg.sizes)
        pos = seg.log_end
        try:
            seg.write_single(p.data, p.base, p.count, p.ts, p.epoch, self._commit_id, p.flen,
                             p.rel, b"" if p.flen else p.frame_sizes(), p.max_ts, hdr)
        except OSError as e:
            self._rollback({seg: saved}, [])
            raise log_error("writing", self.path, e) from e
        self._commit_id += 1
        with self._lock:
            self._dirty.add(seg)
        self._add_tail(Chunk(p.base, p.count, p.data, p.rel, p.flen, seg.base, pos, p.ts))
        n = self.next_offset - self._flushed
        self._flushed = self.next_offset
        return n

    def _write_commits(self, s: Segment, commits: list[list[_Pending]]):
        """Plan + apply in memory, then write: entries, frames with one writev, indexes."""
        snap = s.snapshot()
        chunks = []
        log_bufs: list = []
        metas, idxs, tidxs, hdrs = [], [], [], []
        hdr_pos = s.sizes[4]
        sizes_pos = s.sizes[5]
        szs: list[bytes] = []
        commit_id = self._commit_id
        try:
            for batch in commits:
                pos = s.log_end
                first = batch[0]
                target = s.next_idx_pos
                idx: list[tuple[int, int]] = []
                crc = 0
                p = pos
                flen = first.flen
                count = 0
                max_ts = first.ts
                for b in batch:
                    if b.flen != flen:
                        flen = 0
                    if b.max_ts > max_ts:
                        max_ts = b.max_ts
                    e, target = s.plan_index(b.base, p, b.rel, b.flen, b.count, target)
                    if e:
                        idx += e
                    crc = crc32(b.data, crc)
                    chunks.append(Chunk(b.base, b.count, b.data, b.rel, b.flen, s.base, p, b.ts))
                    log_bufs.append(b.data)
                    p += len(b.data)
                    count += b.count
                hdr = (b"".join(encode_headers(b.headers, b.base - first.base) for b in batch
                                if b.headers) if any(b.headers for b in batch) else b"")
                sz = b"" if flen else b"".join([b.frame_sizes() for b in batch])
                plan = s.plan_commit(first.base, count, p - pos, first.ts, max_ts, first.epoch,
                                     commit_id, crc, hdr, hdr_pos, flen, idx, target, sz,
                                     sizes_pos)
                commit_id += 1
                hdr_pos += len(hdr)
                if sz:
                    szs.append(sz)
                    sizes_pos += len(sz)
                m, i, t = s.meta_bytes(plan)
                metas.append(m)
                if i:
                    idxs.append(i)
                if t:
                    tidxs.append(t)
                if hdr:
                    hdrs.append(hdr)
                s.apply(plan)
            # entries before frames: a crash in between leaves entries past the log's end
            # (cut at recovery), never frames without an entry that recovery would adopt
            # as a lazy commit's (Segment.write_single) and so lose their headers or epoch
            for k, bufs in ((4, hdrs), (5, szs), (1, metas)):
                if bufs:
                    write_all(s.files()[k], bufs)
                    s.sizes[k] += sum(map(len, bufs))
            for k in range(0, len(log_bufs), 1024):  # IOV_MAX: one writev per 1024 batches
                write_all(s.log_fd, log_bufs[k : k + 1024])
            s.sizes[0] = s.log_end
            for k, bufs in ((2, idxs), (3, tidxs)):
                if bufs:
                    write_all(s.files()[k], bufs)
                    s.sizes[k] += sum(map(len, bufs))
        except BaseException:
            s.restore(snap)
            raise
        self._commit_id = commit_id
        return chunks

    def _rollback(self, saved: dict, created: list[Segment]) -> None:
        """Undo a failed flush: truncate files to their pre-batch sizes, drop the batches."""
        for s, sizes in saved.items():
            if s in created:
                continue
            for fd, size in zip(s.files(), sizes, strict=True):
                try:
                    os.ftruncate(fd, size)
                    os.lseek(fd, size, os.SEEK_SET)
                except OSError as e:  # pragma: no cover - nothing more we can do
                    log.error("%s: rollback truncate failed: %s", s.paths[0], e)
            s.sizes = list(sizes)
        for s in created:
            s.delete()
        self.next_offset = self._flushed
        self._commit_id = max(s.last_commit_id for s in self._segments) + 1

    # -- tail / read-ahead ---------------------------------------------------------------
    def _add_tail(self, ch: Chunk) -> None:
        self._tail.append(ch)
        self._tail_bases.append(ch.base)
        self._tail_bytes += len(ch.data)
        self._trim_tail()

    def set_tail_limit(self, nbytes: int) -> None:
        """Memory for the newest frames (and lagging readers' read-ahead), set by the node
        so that all topics together stay within its budget; trims at once."""
        self.tail_limit = nbytes
        self._disk_cache = max(1, min(_DISK_CACHE, nbytes // READ_AHEAD))
        self._read_ahead = max(64 << 10, min(READ_AHEAD, nbytes))
        del self._disk_chunks[: max(0, len(self._disk_chunks) - self._disk_cache)]
        self._trim_tail()

    def _trim_tail(self) -> None:
        limit = self.tail_limit
        while self._tail_bytes > limit and self._tail_head < len(self._tail) - 1:
            old = self._tail[self._tail_head]
            self._tail_bytes -= len(old.data)
            self._tail[self._tail_head] = None  # type: ignore[call-overload]
            self._tail_head += 1
        if self._tail_head > 1024 and self._tail_head * 2 > len(self._tail):
            del self._tail[: self._tail_head], self._tail_bases[: self._tail_head]
            self._tail_head = 0

    def _drop_caches(self) -> None:
        self._tail, self._tail_bases, self._tail_head, self._tail_bytes = [], [], 0, 0
        self._disk_chunks = []

    def _segment_for(self, offset: int) -> Segment:
        return self._segments[bisect_right(self._seg_bases, offset) - 1]

    def _get_chunk(self, offset: int) -> Chunk:
        if self._tail_head < len(self._tail) and offset >= self._tail_bases[self._tail_head]:
            return self._tail[bisect_right(self._tail_bases, offset, self._tail_head) - 1]
        for ch in self._disk_chunks:
            if ch.base <= offset < ch.end:
                return ch
        ch = self._load_chunk(offset)
        self._disk_chunks.append(ch)
        if len(self._disk_chunks) > self._disk_cache:
            del self._disk_chunks[0]
        return ch

    def _load_chunk(self, offset: int) -> Chunk:
        """Read ahead (one large pread) of whole commits, from the one holding offset to the
        one holding the read-ahead's last byte, each checked against its crc (a damaged
        batch is refused, never served: SegmentCorrupt); frames located per commit."""
        seg = self._segment_for(offset)
        pos = seg.position_of(offset)
        c = seg.commit_of(offset)
        cpos = seg.poss[c]
        c2 = bisect_right(seg.poss, min(pos + self._read_ahead, seg.log_end) - 1) - 1
        data = os.pread(seg.log_fd, seg.commit_end(c2) - cpos, cpos)
        self._check_crcs(seg, c, c2, data)
        view = memoryview(data)[pos - cpos :]
        P = seg.positions_in(view, offset, pos)
        return Chunk(offset, len(P) - 1, view, P, 0, seg.base, pos)

    def _check_crcs(self, seg: Segment, c: int, c2: int, data: bytes) -> None:
        """Commits c..c2 of seg, read back to back into data: each one's crc (one crc32 call
        in C per commit, their crcs from one metadata read and one unpack); SegmentCorrupt
        on a mismatch."""
        n = c2 - c + 1
        crcs = _crcs_struct(n).unpack_from(seg.meta_raw(c, n))
        poss = seg.poss
        cpos = poss[c]
        ends = poss[c + 1 : c2 + 1]
        ends.append(seg.commit_end(c2))
        mv = memoryview(data)
        a = 0
        for i, (end, crc) in enumerate(zip(ends, crcs, strict=True)):
            b = end - cpos
            if b > len(data) or crc32(mv[a:b]) != crc:
                base = seg.bases[c + i]
                msg = (f"E_SEGMENT_CORRUPT {seg.paths[0]} (partition {self.partition}): record "
                       f"batch at offset {base} (byte {poss[c + i]}) fails its CRC: damaged on "
                       f"disk; not served")
                log.error("%s", msg)
                raise SegmentCorrupt(msg)
            a = b

    # -- reads ---------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int, max_count: int | None = None) -> ReadResult:
        """Whole frames from offset (at least one if any is readable); a read below the
        local start (from the archive) stops at the local start."""
        start = self.start_offset
        if offset < start and self.lower is not None:
            offset = max(offset, self.earliest_offset)
            if offset < start and (max_count is None or max_count > 0):
                data, n, nxt = read_chunks(self.lower.chunk, offset, start, max_bytes,
                                           max_count)
                return ReadResult(data, offset, n, nxt)
        offset = max(offset, start)
        if offset >= self._flushed or (max_count is not None and max_count <= 0):
            return ReadResult(b"", offset, 0, offset)
        try:
            data, n, nxt = read_chunks(self._get_chunk, offset, self._flushed, max_bytes,
                                       max_count)
        except OSError as e:
            raise log_error("reading", self.path, e) from e
        return ReadResult(data, offset, n, nxt)

    def locate(self, offset: int, max_bytes: int, max_count: int | None = None
               ) -> tuple[int, int, int, int]:
        """(fd, file position, nbytes, count) of whole frames from offset within one segment
        (for sendfile). count=0 when nothing is readable. The fd stays owned by the log."""
        offset = max(offset, self.start_offset)
        seg = self._segment_for(min(offset, self._flushed))
        if offset >= self._flushed:
            return seg.log_fd, seg.log_end, 0, 0
        seg = self._segment_for(offset)
        start = -1
        n = nbytes = 0
        cur = offset
        end = min(self._flushed, seg.next_offset)
        try:
            while cur < end and (max_count is None or n < max_count):
                ch = self._get_chunk(cur)
                rem = None if max_count is None else max_count - n
                i, j, b = take_from_chunk(ch, cur, max_bytes - nbytes, rem, n == 0)
                fpos = ch.file_pos + ch.at(i) - ch.at(0)
                if j == i or (start >= 0 and fpos != start + nbytes):
                    break
                if start < 0:
                    start = fpos
                n += j - i
                nbytes += b
                cur = ch.base + j
                if j < ch.count:
                    break
        except OSError as e:
            raise log_error("reading", self.path, e) from e
        return seg.log_fd, start, nbytes, n

    def ready_end(self, offset: int, notify: Callable[[], None]) -> int:
        """Never blocks: reads from ``offset`` up to the answer need no archive I/O
        (``NO_LIMIT`` from the local start on). ``offset`` itself: what it needs is being
        read from the archive in a thread, which calls ``notify()`` once it is there, so an
        event loop never waits for a slow store (see ArchiveTier.ready)."""
        lower = self.lower
        start = self._segments[0].base
        if lower is None or offset >= start:
            return NO_LIMIT
        offset = max(offset, lower.start_for(start))
        if offset >= start:
            return NO_LIMIT
        end = lower.ready(offset, notify)
        return NO_LIMIT if end >= start else end

    def read_one(self, offset: int) -> bytes | memoryview:
        """The frame at a readable offset (start_offset <= offset < flushed): ``read(offset,
        0, 1).data`` without the walk."""
        if offset < self._segments[0].base and self.lower is not None:
            return chunk_frame(self.lower.chunk(offset), offset)
        return chunk_frame(self._get_chunk(offset), offset)

    def read_frame(self, offset: int) -> bytes:
        if not self.earliest_offset <= offset < self._flushed:
            raise KeyError(offset)
        r = self.read(offset, 0, 1)
        return bytes(r.data)

    def offset_for_time(self, timestamp_ns: int) -> int:
        """First offset with timestamp >= ts (running max, so a clock step back is harmless);
        the archive first when it holds older offsets."""
        if self.lower is not None:
            start = self.start_offset
            if self.earliest_offset < start:
                off = self.lower.offset_for_time(timestamp_ns)
                if off is not None and off < start:
                    return max(off, self.earliest_offset)
        for seg in self._segments:
            off = seg.offset_for_time(timestamp_ns)
            if off is not None:
                return max(off, self.start_offset)
        return self._flushed

    def batches(self, from_offset: int = 0) -> Iterator[BatchInfo]:
        """Commits (the unit of write, crc and epoch) holding offsets >= from_offset."""
        for seg in list(self._segments):
            if seg.next_offset <= from_offset or not seg.bases:
                continue
            first = seg.commit_of(max(from_offset, seg.base))
            for e in seg.entries(first):
                yield BatchInfo(e[0], e[1], e[4], e[6], e[7], e[8])

    def headers(self, offset: int) -> dict[str, bytes] | None:
        if offset < self.start_offset and self.lower is not None:
            return (self.lower.headers(offset) if offset >= self.earliest_offset else None)
        if not self.start_offset <= offset < self._flushed:
            return None
        seg = self._segment_for(offset)
        c = seg.commit_of(offset)
        e = seg.entry(c)
        if not e[10]:
            return None
        blob = os.pread(seg.hdr_fd, e[10], e[9])
        return decode_headers(blob, offset - e[0])

    def release_files(self, *, wait: bool = True) -> bool:
        """Close every segment's descriptors while the log idles (they reopen on the next
        read or append). Only when everything written is flushed and synced, so no sync
        needs them; returns whether they were released. ``wait=False``: not when a sync
        holds the log's lock now (nor when the caller itself does)."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            if self._closed or self._pending or self._dirty or self._synced < self._flushed:
                return False
            for seg in self._segments:
                seg.release_files()
        finally:
            self._lock.release()
        return True

    @property
    def open_files(self) -> int:
        """Descriptors this log holds now (for /stats and the tests of release_files)."""
        return sum(len(seg.fds) for seg in self._segments)

    # -- durability ----------------------------------------------------------------------
    def write_waiting_meta(self) -> None:
        """Write the metadata entries of lazy commits (Segment.write_single). The group
        committer calls it on the loop before each fsync, so what waits in memory is at
        most one sync interval's commits and an idle log holds none."""
        for seg in self._segments[-2:]:  # a segment roll wrote the older ones
            try:
                seg.write_lazy()
            except OSError as e:
                raise log_error("writing", self.path, e) from e

    def needs_sync(self) -> bool:
        behind = self._flushed - self._synced
        if behind <= 0:
            return False
        if behind >= self.config.sync_every:
            return True
        iv = self.config.sync_interval
        return iv > 0 and time.monotonic() - self._last_sync >= iv

    def sync(self) -> None:
        """fsync data + metadata of every written segment, then move the recovery point.

        Safe to run in a thread while the loop keeps appending (fds are dup'ed)."""
        if self.imported is not None and self.imported.dirty:  # nsqx import: ids first
            try:
                self.imported.save(self.path)
            except OSError as e:
                raise log_error("writing imported ids", self.path, e) from e
        self.end_sync(self.begin_sync())

    def begin_sync(self) -> tuple:
        """First half of sync(): what is written now and must become durable (a ticket)."""
        with self._lock:
            target = self._flushed
            segs = list(self._dirty)
            self._dirty.clear()
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            fds = []
            for s in segs:
                if not s.closed:
                    fds.extend(s.fsync_fds())
        return target, segs, dir_dirty, fds

    def end_sync(self, ticket: tuple, *, fs_synced: bool = False) -> None:
        """Second half: fsync the ticket's files (unless the caller synced the whole file
        system after begin_sync, e.g. with syncfs), then move the recovery point."""
        target, segs, dir_dirty, fds = ticket
        try:
            if not fs_synced:
                for fd in fds:
                    os.fdatasync(fd)
                if dir_dirty:
                    self._fsync_dir()
            # The recovery point is a hint: after a file-system-wide sync it is moved at
            # most every CHECKPOINT_INTERVAL (writing 1,000 of them per pass cost more
            # than the syncfs); an explicit sync() always moves it.
            if target > self._synced and (not fs_synced or time.monotonic()
                                          - self._last_checkpoint >= CHECKPOINT_INTERVAL):
                self._write_checkpoint(target)
                self._last_checkpoint = time.monotonic()
        except OSError as e:
            with self._lock:
                self._dirty.update(s for s in segs if not s.closed)
                self._dir_dirty |= dir_dirty
            raise log_error("fsync", self.path, e) from e
        finally:
            for fd in fds:
                os.close(fd)
        self._last_sync = time.monotonic()
        with self._lock:
            if target > self._synced:
                self._synced = target

    def _fsync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_checkpoint(self, offset: int) -> None:
        """Move the recovery point (written after the data it covers was fsynced).

        Not fsynced itself: it is only a hint of how much recovery may skip verifying. A
        lost or torn checkpoint reads as 0 (crc) and recovery verifies everything, so an
        fsync here would buy nothing but cost one per sync (measured: ~25% of the sync
        thread's time with 1,000 active topics).
        """
        raw = struct.pack(">Q", offset)
        tmp = self.path / f"{CHECKPOINT}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, raw + struct.pack(">I", crc32(raw)))
        finally:
            os.close(fd)
        os.replace(tmp, self.path / CHECKPOINT)

    # -- truncation / retention ----------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        """Drop records >= offset (replication divergence); pending batches above go too."""
        offset = max(offset, 0)
        if self.imported is not None and offset < self.imported.hi:
            self.imported.cut(offset)  # offsets above may get frames with nsqx's ids now
            try:
                self.imported.save(self.path)
            except OSError as e:
                raise log_error("truncating", self.path, e) from e
        self._pending = [p for p in self._pending if p.base + p.count <= offset]
        if offset < self._flushed and any(p.base >= offset for p in self._pending):
            self._pending = []
        try:
            if offset <= self.start_offset:
                for s in self._segments:
                    s.delete()
                self._segments = [self._new_segment(offset)]
            else:
                while len(self._segments) > 1 and self._segments[-1].base >= offset:
                    self._segments.pop().delete()
                self._segments[-1].truncate_to(offset)
            self._seg_bases = [s.base for s in self._segments]
            self._write_checkpoint(min(self._read_checkpoint(), offset))
        except OSError as e:
            raise log_error("truncating", self.path, e) from e
        self._drop_caches()
        self._flushed = min(self._flushed, offset)
        self._synced = min(self._synced, offset)
        self.next_offset = max(self._flushed, max((p.base + p.count for p in self._pending),
                                                  default=self._flushed))
        self._commit_id = max(s.last_commit_id for s in self._segments) + 1
        self._dirty.add(self._segments[-1])

    def apply_retention(self, floor_offset: int, now: float | None = None) -> int:
        """Delete old segments; returns the new start_offset (see LogConfig for the policy)."""
        cfg = self.config
        now = time.time() if now is None else now
        total = self.size_bytes()
        may_delete = self.may_delete
        while len(self._segments) > 1:
            seg, nxt = self._segments[0], self._segments[1]
            if may_delete is not None and not may_delete(nxt.base):
                break  # not archived yet: kept (even past the hard cap), nothing is lost
            hard = cfg.hard_size_cap is not None and total > cfg.hard_size_cap
            if not hard:
                if nxt.base > floor_offset:
                    break
                if cfg.retention_seconds is not None or cfg.retention_bytes is not None:
                    old = (cfg.retention_seconds is not None
                           and seg.max_ts <= (now - cfg.retention_seconds) * 1e9)
                    big = cfg.retention_bytes is not None and total > cfg.retention_bytes
                    if not (old or big):
                        break
            total -= seg.size
            self._segments.pop(0)
            self._dirty.discard(seg)
            seg.delete()
        self._seg_bases = [s.base for s in self._segments]
        start = self.start_offset
        self._disk_chunks = [c for c in self._disk_chunks if c.base >= start]
        while self._tail_head < len(self._tail) and self._tail[self._tail_head].end <= start:
            self._tail_bytes -= len(self._tail[self._tail_head].data)
            self._tail_head += 1
        return start

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
            self.write_waiting_meta()
            self.sync()
        finally:
            self._closed = True
            for s in self._segments:
                s.close()
            self._drop_caches()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PartitionLog({str(self.path)!r}, partition={self.partition}, "
                f"start={self.start_offset}, next={self.next_offset})")

