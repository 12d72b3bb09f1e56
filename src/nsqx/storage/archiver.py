"""The background archiver: every closed, fsynced segment of the logs it is given becomes one
Parquet file in the archive (nsqx.storage.archive), oldest first, one segment at a time.

It runs in one worker thread. The log's state is touched only through ``call`` (nsqd passes
a function that runs it on the event loop and waits), a few times per segment: which file
and positions hold the frames and their epochs, afterwards whether the segment is still
there (and its extension headers per row group, only if it has any). The bytes of a
closed segment never change, so the thread preads them through its own descriptor, splits
them into columns in C without the GIL (``split_frames``), and Parquet encodes, compresses
and writes without it too: the work runs on another core beside the event loop. Memory is
bounded by one read block (``BLOCK_BYTES``) plus one row group and the Parquet writer's
buffer (on S3 the whole compressed file: one upload, see ``Archive.write``). Between row groups
the thread asks ``pause`` (nsqd: wait while the event loop is late) and honours an optional
byte-rate cap.

Retention asks ``may_delete`` (installed on the log by ``add``): a segment goes only once its
offsets are archived, so with the archive unreachable local deletion waits and ``lag``
grows; nothing is lost.

Cluster mode passes a ``fence`` (:class:`ArchiveFence`, kept in etcd by the cluster layer): a
written file counts only once the fence records it, which it does only for the partition's
current leader and only when the file starts where the record ends; a writer that loses
deletes its file. Followers (and a new leader) adopt the recorded files, never the listing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from nsqx.storage.archive import (
    ROW_GROUP_ROWS,
    Archive,
    ArchiveCorrupt,
    ArchivedFile,
    ArchiveError,
    ArchiveTier,
    split_frames,
    split_to_batch,
)
from nsqx.storage.log import PartitionLog
from nsqx.storage.records import LogError

log = logging.getLogger("nsqx.storage.archiver")
T = TypeVar("T")
PIECE_BYTES = 4 << 20  # at most per row group (after its first frame)
BLOCK_BYTES = 16 << 20  # one pread of a segment file
THREAD_NAME = "nsqx-archiver"
BUSY_POLL = 0.1  # seconds to the next pass after one that archived something


class ArchiveFence(Protocol):
    """Where the cluster records each partition's archived files (its methods block; the
    archiver's thread calls them; they raise ArchiveError when the record is unreachable)."""

    def name(self, topic: str, partition: int, key: str) -> str:
        """The key this node writes a file to: unique per writer (two writers never replace
        each other's file, whatever their segment boundaries)."""
        ...

    def adopt(self, tier: ArchiveTier, *, leading: bool) -> list[ArchivedFile]:
        """The recorded files from ``tier.end`` on. ``leading``: this node starts archiving
        the partition: raises ArchiveError unless the record says it leads, and removes the
        partition's files that are not recorded (orphans of a deposed or crashed writer)."""
        ...

    def commit(self, tier: ArchiveTier, f: ArchivedFile) -> bool:
        """Record a written file: True only if this node still leads the partition at the
        epoch it wrote the file in and the record ends at ``f.base``."""
        ...


class Stopped(Exception):
    """The archiver was closed while it waited for the log's owner."""


class _Changed(Exception):
    """The segment being archived went away under the archiver (its log closed): not an
    archive failure (an OSError out of the batches would read as one)."""


@dataclass
class _Entry:
    topic: str
    partition: int
    log: PartitionLog
    tier: ArchiveTier
    archived_segments: int = 0
    backlog: int = 0  # bytes of closed segments not archived when its segment began
    last_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def direct_call(fn: Callable[[], T]) -> T:
    """``call`` for a log no event loop owns (tests, tools)."""
    return fn()


class Archiver:
    """Archives closed segments of registered partition logs (see module doc)."""

    def __init__(self, archive: Archive, *, call: Callable[[Callable[[], Any]], Any] = direct_call,
                 throttle_bytes_per_sec: float = 0, retry_interval: float = 5.0,
                 poll_interval: float = 1.0,
                 pause: Callable[[int], float] | None = None,
                 on_archived: Callable[[PartitionLog], object] | None = None,
                 limit: Callable[[PartitionLog], int | None] | None = None,
                 refresh_interval: float = 0.0, fence: ArchiveFence | None = None) -> None:
        self.archive = archive
        self._call = call
        # an explicit cap in bytes of log per second (0: none)
        self.throttle = throttle_bytes_per_sec
        # asked between row groups (in the thread) with the bytes of the partition still to
        # archive: seconds to wait first (nsqd.archiving: while its event loop runs late
        # and the backlog is small)
        self.pause = pause
        self.retry_interval = retry_interval
        self.poll_interval = poll_interval
        # run through ``call`` after a log's segment is recorded: the owner may apply
        # retention now instead of at its next pass
        self.on_archived = on_archived
        # through ``call``: the offset below which a log may be archived (cluster mode: the
        # high watermark), None where it must not be (a follower); default: what is flushed
        self.limit = limit or (lambda plog: plog.flushed_offset)
        # cluster mode (> 0): how often a log that is not archived here adopts the files its
        # leader archived (from the fence's record; without a fence from the listing,
        # ArchiveTier.refresh); a log becoming archivable here does at once
        self.refresh_interval = refresh_interval
        self.fence = fence  # cluster mode: files count once recorded there (module doc)
        self._entries: dict[int, _Entry] = {}  # id(log) -> entry (swapped whole)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error = ""  # the newest failure to reach the archive ("" after a success)
        self.archived_files = 0
        self.archived_log_bytes = 0

    # -- registration (on the log owner's thread) -----------------------------------------
    def add(self, topic: str, partition: int, plog: PartitionLog) -> ArchiveTier:
        """Archive this log from now on: reads below its local start go to the archive, and
        retention deletes only archived segments."""
        old = self._entries.get(id(plog))
        if old is not None and old.log is plog:
            return old.tier
        tier = ArchiveTier(self.archive, plog.path, topic, partition)
        plog.lower = tier
        plog.may_delete = lambda end, t=tier: end <= t.end
        self._entries = {**self._entries, id(plog): _Entry(topic, partition, plog, tier)}
        self._wake.set()
        return tier

    def remove(self, plog: PartitionLog) -> None:
        e = self._entries.get(id(plog))
        if e is None:
            return
        self._entries = {k: v for k, v in self._entries.items() if k != id(plog)}
        plog.lower = None
        plog.may_delete = None
        e.tier.close()

    def lag(self, plog: PartitionLog) -> tuple[int, int]:
        """(bytes, segments) of closed local segments not archived yet."""
        e = self._entries.get(id(plog))
        if e is None:
            return 0, 0
        end = e.tier.end
        pend = [s for s in plog.closed_segments(synced_only=False) if s[1] > end]
        return sum(s[2] for s in pend), len(pend)

    def stats(self, plog: PartitionLog) -> dict[str, Any]:
        """/stats fields of one partition (empty when it is not archived)."""
        e = self._entries.get(id(plog))
        if e is None:
            return {}
        lag_bytes, lag_segments = self.lag(plog)
        return {"archive_start": plog.earliest_offset, "log_start": plog.start_offset,
                "archive_end": e.tier.end, "archived_bytes": e.tier.archived_bytes(),
                "archived_files": len(e.tier.files), "archive_lag_bytes": lag_bytes,
                "archive_lag_segments": lag_segments, "archive_error": e.last_error}

    # -- the worker ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """Whether stop() was called (a ``call`` waiting for the owner gives up then)."""
        return self._stop.is_set()

    def stop(self) -> None:
        """Ask the worker to stop (it finishes or abandons the file it writes: an
        unrecorded file is written again, to the same key, next time)."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
        for e in list(self._entries.values()):
            e.tier.close()

    def _run(self) -> None:
        # the OS thread name, so top -H and /proc/PID/task show the archiver's CPU (Linux)
        with contextlib.suppress(OSError), open(
                f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(THREAD_NAME)
        while not self._stop.is_set():
            self._wake.clear()
            try:
                # more closed segments are likely soon after a pass that found some: look
                # again shortly rather than after a whole poll_interval
                delay = min(self.poll_interval, BUSY_POLL) if self.run_once() else \
                    self.poll_interval
            except Stopped:
                return
            except ArchiveError as exc:
                self.last_error = str(exc)
                log.warning("archive unreachable, local deletion waits: %s", exc)
                delay = self.retry_interval
            except Exception:  # keep archiving: a bug here must not end the worker
                log.exception("archiver pass failed")
                delay = self.retry_interval
            self._wake.wait(delay)

    def _on_owner(self, fn: Callable[[], T]) -> T:
        if self._stop.is_set():
            raise Stopped
        return self._call(fn)

    def run_once(self) -> int:
        """Archive every pending closed segment of every log; how many were archived.
        Raises ArchiveError when the archive cannot be written (the caller retries)."""
        done = 0
        for e in list(self._entries.values()):
            while not self._stop.is_set():
                try:
                    lim, todo = self._on_owner(lambda e=e: self._pending(e))
                except LogError:
                    break  # the log was closed (topic deleted)
                try:
                    if (self.refresh_interval or self.fence is not None) and self._refresh(
                            e, archiving=lim is not None):
                        continue  # adopted what another node archived: look again
                except ArchiveCorrupt as exc:  # a bad file of this partition: the others
                    e.last_error = str(exc)  # go on; this one waits for an operator
                    log.error("archive of %s partition %d: %s", e.topic, e.partition, exc)
                    break
                if not todo:
                    break
                e.backlog = sum(t[2] for t in todo)  # what ``pause`` weighs
                base, end, _ = todo[0]
                if e.extra.get("bad_segment") == (base, end):
                    break  # its frames are not messages: it waits for an operator (restart)
                try:
                    f = self.archive_segment(e, max(base, e.tier.end), end)
                except ArchiveError as exc:
                    e.last_error = str(exc)
                    raise
                except ValueError as exc:  # a damaged segment file: the other partitions
                    e.last_error = str(exc)  # go on, this one is not read again each pass
                    e.extra["bad_segment"] = (base, end)
                    log.error("archive of %s partition %d: segment %d..%d not archived: %s",
                              e.topic, e.partition, base, end - 1, exc, exc_info=True)
                    break
                if f is None:
                    break
                if self.fence is not None and not self._commit(e, f):
                    break  # another writer's range stands: adopt it, then look again
                e.tier.record(f)
                e.last_error = ""
                self.last_error = ""
                e.archived_segments += 1
                self.archived_files += 1
                done += 1
                if self.on_archived is not None:
                    self._on_owner(lambda e=e: self.on_archived(e.log))
        return done

    def _pending(self, e: _Entry) -> tuple[int | None, list[tuple[int, int, int]]]:
        """On the owner's thread: (limit, closed segments below it not archived yet)."""
        lim = self.limit(e.log)
        if lim is None:
            return None, []
        end = e.tier.end
        return lim, [s for s in e.log.closed_segments() if end < s[1] <= lim]

    def _refresh(self, e: _Entry, *, archiving: bool) -> int:
        """Cluster mode: adopt files archived elsewhere - every refresh_interval while this
        node does not archive the log, and once when it starts to (a new leader continues
        where the old one stopped, to the same keys). How many were adopted."""
        now = time.monotonic()
        was = e.extra.get("archiving", False)
        e.extra["archiving"] = archiving
        if (archiving and was) or (not archiving and now - e.extra.get("refreshed", -1e9)
                                   < self.refresh_interval):
            return 0
        e.extra["refreshed"] = now
        if self.fence is None:
            n = e.tier.refresh()
        else:
            e.extra["archiving"] = False  # adopted only once it worked (a leader must)
            before = {f.key for f in e.tier.files}
            self._adopt(e, self.fence.adopt(e.tier, leading=archiving))
            keys = {f.key for f in e.tier.files}
            n = len(keys - before)
            e.extra["archiving"] = archiving
            unsettled = e.extra.get("unsettled")
            if unsettled is not None:  # written, its commit unanswered or its loss not acted on
                if unsettled.key not in keys:
                    self._lost(e, unsettled)
                del e.extra["unsettled"]
        if n and self.on_archived is not None:
            self._on_owner(lambda: self.on_archived(e.log))  # retention may delete now
        return n

    def _adopt(self, e: _Entry, files: list[ArchivedFile]) -> int:
        """Record the fence's files the manifest lacks; how many."""
        known = {f.key for f in e.tier.files}
        new = [f for f in files if f.key not in known]
        if new:
            e.tier.record(*new)
        return len(new)

    def _commit(self, e: _Entry, f: ArchivedFile) -> bool:
        """Cluster mode: have the fence record f. A loser (deposed, or another leader's file
        already covers f.base) deletes f unless the record holds that very key, adopts the
        record and looks again; nothing it wrote is ever read."""
        assert self.fence is not None
        e.extra["archiving"] = False  # whatever happens: adopt the record before going on
        e.extra["unsettled"] = f  # until settled here (an error leaves it to the next adoption)
        if self.fence.commit(e.tier, f):
            del e.extra["unsettled"]
            e.extra["archiving"] = True
            return True
        recorded = self.fence.adopt(e.tier, leading=False)
        if f.key not in {x.key for x in recorded}:
            self._lost(e, f)
        del e.extra["unsettled"]
        self._adopt(e, recorded)
        return False

    def _lost(self, e: _Entry, f: ArchivedFile) -> None:
        log.warning("archive of %s partition %d: offsets %d..%d lost the fence (not this "
                    "node's to record); deleting %s", e.topic, e.partition, f.base, f.end - 1,
                    self.archive.describe(f.key))
        self.archive.delete(f.key)

    def archive_segment(self, e: _Entry, lo: int, hi: int) -> ArchivedFile | None:
        """Write offsets [lo, hi) of a closed segment as one file (not yet recorded); None
        when the log changed under it (truncated, closed).

        The owner only says where the frames are (file, positions) and their epochs (and,
        a row group at a time, their extension headers if the segment has any); the thread
        reads the bytes through its own descriptor and splits them without the GIL
        (split_frames), so the loop does nothing per byte."""
        plog = e.log
        plan = self._on_owner(lambda: _plan(plog, lo, hi))
        if plan is None:
            return None
        span, epochs = plan
        try:
            fd = os.open(span[0], os.O_RDONLY)
        except FileNotFoundError:
            return None  # deleted with its topic meanwhile
        try:
            head = os.pread(fd, 16, span[1])
            if len(head) != 16:
                return None
            first_ts = int.from_bytes(head[8:16], "big")
            key = self.archive.key_for(e.topic, e.partition, lo, first_ts)
            if self.fence is not None:  # cluster mode: each writer its own name
                key = self.fence.name(e.topic, e.partition, key)
            bounds = {"min": first_ts, "max": first_ts, "bytes": 0}
            try:
                size = self.archive.write(key, self._pieces(e, fd, span, lo, hi, epochs,
                                                            bounds))
            except _Changed:
                return None  # the write left nothing at key
        finally:
            os.close(fd)
        if self._on_owner(lambda: plog.closed_span(lo, hi)) != span:
            # truncated or closed meanwhile: the file is never recorded, so it goes (else
            # Spark, reading the directory, sees rows the log no longer holds)
            self._discard(e, key, lo, hi)
            return None
        self.archived_log_bytes += bounds["bytes"]
        return ArchivedFile(lo, hi, key, size, bounds["min"], bounds["max"])

    def _discard(self, e: _Entry, key: str, lo: int, hi: int) -> None:
        """Delete a written file that will not be recorded; a failure is only logged (an
        unrecorded file is never read by nsqx)."""
        log.warning("archive of %s partition %d: offsets %d..%d changed while written; "
                    "deleting %s", e.topic, e.partition, lo, hi - 1, self.archive.describe(key))
        try:
            self.archive.delete(key)
        except ArchiveError as exc:
            log.warning("archive of %s partition %d: %s", e.topic, e.partition, exc)

    def _pieces(self, e: _Entry, fd: int, span: tuple[Any, int, int, bool], lo: int,
                hi: int, epochs: list[tuple[int, int]], bounds: dict[str, int]
                ) -> Iterator[Any]:
        """Record batches of one row group each (at most ROW_GROUP_ROWS frames, and
        PIECE_BYTES after the first), read in blocks of BLOCK_BYTES: memory stays bounded
        by a block plus one row group. Headers come from the owner per row group (a whole
        segment's could hold the loop for long), only where the segment has any."""
        _, at, end, has_headers = span
        plog = e.log
        cur = lo
        block, boff = b"", 0
        t0 = time.monotonic()
        while cur < hi:
            if len(block) - boff < PIECE_BYTES and at + len(block) - boff < end:
                block, boff = os.pread(fd, min(BLOCK_BYTES, end - at), at), 0
            rows = min(ROW_GROUP_ROWS, hi - cur)
            try:
                split = split_frames(memoryview(block)[boff:], rows, PIECE_BYTES)
                if split[0] == 0 and len(block) - boff >= 4:  # one frame over a block
                    need = 4 + int.from_bytes(block[boff:boff + 4], "big")
                    block, boff = os.pread(fd, min(need, end - at), at), 0
                    split = split_frames(block, 1, need)
            except ValueError as exc:
                raise ValueError(f"{span[0]}: frames from offset {cur}: {exc}") from None
            n, used = split[0], split[1]
            if n == 0:
                raise ValueError(f"{span[0]}: truncated frame at offset {cur}")
            bounds["min"] = min(bounds["min"], split[7])
            bounds["max"] = max(bounds["max"], split[8])
            bounds["bytes"] += used
            try:
                headers = self._on_owner(
                    lambda c=cur, k=n: plog.headers_range(c, c + k)) if has_headers else {}
            except (OSError, LogError) as exc:  # closed meanwhile (topic deleted)
                raise _Changed from exc
            yield split_to_batch(split, cur, headers, epochs)
            cur += n
            at += used
            boff += used
            self._throttle(t0, bounds["bytes"], e.backlog - bounds["bytes"])
        if at != end:
            raise ValueError(f"{span[0]}: frames end at {at}, its commits at {end}")

    def _throttle(self, t0: float, done: int, backlog: int) -> None:
        """Between row groups: the explicit cap (``throttle``, bytes of log per second),
        then whatever ``pause`` asks for given the bytes still to archive (the node: a
        short wait while its event loop runs late and the backlog is small)."""
        wait = done / self.throttle - (time.monotonic() - t0) if self.throttle else 0.0
        if self.pause is not None:
            wait = max(wait, self.pause(backlog))
        if wait > 0 and self._stop.wait(wait):
            raise Stopped


def _plan(plog: PartitionLog, lo: int, hi: int
          ) -> tuple[tuple[Any, int, int, bool], list[tuple[int, int]]] | None:
    """On the log owner's thread: where [lo, hi) is (closed_span) and (first offset, epoch)
    where the epoch changes; None when it is not one closed segment any more. Python per
    commit, nothing per message or byte."""
    span = plog.closed_span(lo, hi)
    if span is None:
        return None
    epochs: list[tuple[int, int]] = []
    for b in plog.batches(lo):
        if b.base_offset >= hi:
            break
        if not epochs or epochs[-1][1] != b.epoch:
            epochs.append((max(b.base_offset, lo), b.epoch))
    return span, epochs
