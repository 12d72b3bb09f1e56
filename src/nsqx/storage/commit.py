"""Group commit: every append of one event-loop turn becomes one write, acked after it.

append() assigns offsets at once and schedules a single flush for the turn (loop.call_soon);
the futures of that turn resolve together after the write, or after the fsync when the policy
asks for it (sync_every=1 or sync_always). fsync always runs in the default thread executor, so
the loop keeps serving while the disk works; appends arriving during an fsync share the next one.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nsqx.storage.records import LogConfig, LogError

__all__ = ["CommitLog", "CommitScheduler", "FileSystemSyncer", "GroupCommitter"]

log = logging.getLogger("nsqx.storage.commit")


class CommitLog(Protocol):
    """What a GroupCommitter (and a FileSystemSyncer) use of a log: ``log.PartitionLog`` or
    ``memlog.MemoryLog``. ``durable`` says whether appends reach files (fsync policy,
    syncfs tickets); a memory log's sync calls do nothing."""

    durable: bool
    config: LogConfig
    next_offset: int

    @property
    def flushed_offset(self) -> int: ...
    @property
    def synced_offset(self) -> int: ...
    def append(self, bodies: Sequence[bytes], timestamp_ns: int | None = None,
               **kw: Any) -> int: ...
    def append_frames(self, data: bytes, count: int, timestamp_ns: int, **kw: Any) -> int: ...
    def flush(self) -> int: ...
    def needs_sync(self) -> bool: ...
    def sync(self) -> None: ...
    def write_waiting_meta(self) -> None: ...
    def begin_sync(self) -> tuple: ...
    def end_sync(self, ticket: tuple, *, fs_synced: bool = False) -> None: ...


class CommitScheduler:
    """One flush pass per loop turn for every committer with appends (a node's topics).

    With 1,000 topics published round-robin, a call_soon per committer per turn and a
    socket write per acknowledged batch dominated: one scheduled pass flushes every dirty
    committer in order, then runs the ``after_pass`` callbacks the pass's completions asked
    for (a connection answers all its batches of the pass with one write).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self._dirty: list[GroupCommitter] = []
        self._after: list[Callable[[], None]] = []
        self.in_pass = False

    def schedule(self, committer: GroupCommitter) -> None:
        if not self._dirty:  # appends made by a pass's completions go to the next turn
            self.loop.call_soon(self._run)
        self._dirty.append(committer)

    def after_pass(self, cb: Callable[[], None]) -> None:
        """Run ``cb`` once the current pass has flushed every committer (only in a pass)."""
        self._after.append(cb)

    def _run(self) -> None:
        self.in_pass = True
        dirty, self._dirty = self._dirty, []
        try:
            for c in dirty:
                if c._scheduled:  # not flushed since (flush_now)
                    try:
                        c._flush()
                    except Exception:  # a bug in one log's flush must not strand the rest
                        c._scheduled = False
                        log.exception("commit pass: flushing %r failed", c.log)
        finally:
            self.in_pass = False
            after, self._after = self._after, []
            for cb in after:
                try:
                    cb()
                except Exception:  # one listener must not keep the others from running
                    log.exception("after-pass callback failed")


class GroupCommitter:
    """Batches appends per loop turn for one PartitionLog (or MemoryLog)."""

    def __init__(self, log: CommitLog, loop: asyncio.AbstractEventLoop | None = None, *,
                 sync_always: bool = False, syncer: FileSystemSyncer | None = None,
                 scheduler: CommitScheduler | None = None) -> None:
        self.log = log
        self.loop = loop or asyncio.get_running_loop()
        # the node's shared flush pass (one call_soon per turn for all its logs), if any
        self.scheduler = scheduler
        # interval fsyncs of many logs share one syncfs() when a syncer is given
        self.syncer = syncer if log.durable else None
        self._ext_busy = False  # the syncer holds a ticket of this log
        self._kick_after_ext = False
        self.sync_always = sync_always or log.config.sync_every == 1
        self.on_flushed: list[Callable[[int], None]] = []
        self._turn: list[tuple[asyncio.Future[int], int, int]] = []  # (future, base, end)
        self._scheduled = False
        self._waiting_sync: list[tuple[asyncio.Future[int], int, int]] = []
        self._sync_task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | _SharedTimer | None = None
        self._closed = False

    def append(self, bodies: Sequence[bytes], timestamp_ns: int | None = None,
               **kw: Any) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self.loop.create_future()
        self.append_cb(bodies, fut, timestamp_ns, **kw)
        return fut

    def append_cb(self, bodies: Sequence[bytes], done: Any,
                  timestamp_ns: int | None = None, **kw: Any) -> None:
        """Like append(), but `done` is a future or a `Callable[[int, Exception | None], None]`.

        A callback runs synchronously when the batch is durable, saving the extra loop
        turn a future's done-callback costs (it matters for one-at-a-time PUB latency).
        """
        if self._closed:
            _resolve(done, -1, LogError("group committer is closed"))
            return
        try:
            base = self.log.append(bodies, timestamp_ns, **kw)
        except LogError as e:
            _resolve(done, -1, e)
            return
        self._queued(done, base)

    def append_frames_cb(self, data: bytes, count: int, done: Any, timestamp_ns: int,
                         **kw: Any) -> None:
        """append_cb() of ready-made frames (``PartitionLog.append_frames``: replication)."""
        if self._closed:
            _resolve(done, -1, LogError("group committer is closed"))
            return
        try:
            base = self.log.append_frames(data, count, timestamp_ns, **kw)
        except (LogError, ValueError) as e:
            _resolve(done, -1, e)
            return
        self._queued(done, base)

    def _queued(self, done: Any, base: int) -> None:
        self._turn.append((done, base, self.log.next_offset))
        if not self._scheduled:
            self._scheduled = True
            if self.scheduler is not None:
                self.scheduler.schedule(self)
            else:
                self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        turn, self._turn = self._turn, []
        try:
            self.log.flush()
        except LogError as e:
            for fut, base, _ in turn:
                _resolve(fut, base, e)
            return
        flushed = self.log.flushed_offset
        for cb in self.on_flushed:
            try:
                cb(flushed)
            except Exception:  # a listener must not break the commit path
                log.exception("on_flushed callback failed")
        if self.sync_always:
            self._waiting_sync.extend(turn)
            self._kick_sync()
            return
        for fut, base, _ in turn:
            _resolve(fut, base, None)
        if self.syncer is not None:
            # count-triggered fsyncs stay per log; interval ones go to the shared syncer
            behind = self.log.flushed_offset - self.log.synced_offset
            if behind >= self.log.config.sync_every:
                self._kick_sync()
            elif behind > 0:
                self._arm_timer()
            return
        if self.log.needs_sync():
            self._kick_sync()
        elif self.log.flushed_offset > self.log.synced_offset:
            self._arm_timer()

    def _arm_timer(self) -> None:
        iv = self.log.config.sync_interval
        if iv and iv > 0 and self._timer is None:
            if self.syncer is not None:  # one timer for all the syncer's logs
                self._timer = self.syncer.later(self, iv)
            else:
                self._timer = self.loop.call_later(iv, self._on_timer)

    def _write_meta(self) -> None:
        """The log's waiting metadata entries, before an fsync (on the loop: the commit
        path appends to them there)."""
        try:
            self.log.write_waiting_meta()
        except LogError as e:  # the next try comes with the next commit or sync
            log.error("%s", e)

    def _on_timer(self) -> None:
        self._timer = None
        if self.log.flushed_offset > self.log.synced_offset:
            if self.syncer is not None and not self._waiting_sync and (
                    self._sync_task is None or self._sync_task.done()):
                self.syncer.request(self)
            else:
                self._kick_sync()

    def _kick_sync(self) -> None:
        if self._ext_busy:  # one sync at a time per log: run after the syncer's pass
            self._kick_after_ext = True
            return
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = self.loop.create_task(self._sync_loop())

    def _external_sync_done(self) -> None:
        self._ext_busy = False
        if self._kick_after_ext or self._waiting_sync:
            self._kick_after_ext = False
            self._kick_sync()
        elif self.log.flushed_offset > self.log.synced_offset:
            self._arm_timer()

    async def _sync_loop(self) -> None:
        """fsync in a thread until nothing is waiting; resolve waiters covered by each fsync."""
        while True:
            waiters, self._waiting_sync = self._waiting_sync, []
            self._write_meta()
            try:
                await self.loop.run_in_executor(None, self.log.sync)
            except LogError as e:
                for fut, base, _ in waiters:
                    _resolve(fut, base, e)
                log.error("%s", e)
                if not self._waiting_sync:
                    return
                continue
            synced = self.log.synced_offset
            still = []
            for w in waiters:
                fut, base, end = w
                if end <= synced:
                    _resolve(fut, base, None)
                else:
                    still.append(w)
            self._waiting_sync = still + self._waiting_sync
            if not self._waiting_sync:
                if self.log.flushed_offset > self.log.synced_offset:
                    self._arm_timer()
                return

    async def flush_now(self) -> None:
        """Write whatever this turn buffered (used by close)."""
        if self._turn:
            self._flush()

    async def close(self) -> None:
        """Write and fsync everything appended so far; later appends fail. The log stays open."""
        self._closed = True
        await self.flush_now()
        while self._ext_busy:  # the file-system syncer still holds a ticket of this log
            await asyncio.sleep(0.005)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._sync_task is not None and not self._sync_task.done():
            await self._sync_task
        self._write_meta()
        if self.log.flushed_offset > self.log.synced_offset:
            await self.loop.run_in_executor(None, self.log.sync)


class FileSystemSyncer:
    """Interval fsyncs of many logs on one file system as ONE syncfs() per pass.

    With 1,000 active topics, per-log interval fsyncs cost ~3 fdatasyncs per topic every
    --sync-timeout and dominated the node's time; one syncfs covers them all. Each log's
    ticket is taken (begin_sync) before the syncfs, so what it marks durable was written
    before the file system was synced. Falls back to per-file fsync where syncfs is missing.
    """

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.path = path
        self.loop = loop or asyncio.get_running_loop()
        self._waiting: dict[int, GroupCommitter] = {}
        self._task: asyncio.Task | None = None
        self._syncfs = _load_syncfs()
        self._later: dict[int, GroupCommitter] = {}  # interval timers of the logs, shared
        self._later_timer: asyncio.TimerHandle | None = None

    def later(self, committer: GroupCommitter, interval: float) -> _SharedTimer:
        """The committer's interval timer, shared: ONE loop timer for every log waiting.

        A TimerHandle per written log made every flush of 1,000 topics arm (and every
        --sync-timeout fire) 1,000 timers; a log joining a running timer is synced at
        its deadline, within ``interval`` of its flush as before, never later.
        """
        self._later[id(committer)] = committer
        if self._later_timer is None:
            self._later_timer = self.loop.call_later(interval, self._fire_later)
        return _SharedTimer(self, committer)

    def _fire_later(self) -> None:
        self._later_timer = None
        due, self._later = list(self._later.values()), {}
        for c in due:
            c._timer = None
            c._on_timer()

    def request(self, committer: GroupCommitter) -> None:
        self._waiting[id(committer)] = committer
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._run())

    async def _run(self) -> None:
        while self._waiting:
            batch = [c for c in self._waiting.values() if not c._closed]
            self._waiting.clear()
            tickets = []
            for c in batch:
                c._ext_busy = True
                c._write_meta()
                tickets.append((c, c.log.begin_sync()))
            try:
                await self.loop.run_in_executor(None, self._sync_all, tickets)
            except Exception:  # a failing log is logged; the others still count as synced
                log.exception("file system sync failed")
            finally:
                for c, _ in tickets:
                    c._external_sync_done()

    def _sync_all(self, tickets: list) -> None:
        fs_synced = False
        if self._syncfs is not None:
            try:
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    fs_synced = self._syncfs(fd) == 0
                finally:
                    os.close(fd)
            except OSError as e:  # then every log fsyncs its own files below
                log.warning("syncfs(%s) failed, fsyncing file by file: %s", self.path, e)
        for c, ticket in tickets:
            try:
                c.log.end_sync(ticket, fs_synced=fs_synced)
            except LogError as e:
                log.error("%s", e)


class _SharedTimer:
    """What GroupCommitter._timer holds for a FileSystemSyncer.later() wait (cancel())."""

    __slots__ = ("committer", "syncer")

    def __init__(self, syncer: FileSystemSyncer, committer: GroupCommitter) -> None:
        self.syncer = syncer
        self.committer = committer

    def cancel(self) -> None:
        self.syncer._later.pop(id(self.committer), None)


def _load_syncfs() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):  # (AttributeError: a libc without syncfs)
        return None


def _resolve(done: Any, base: int, exc: Exception | None) -> None:
    if isinstance(done, asyncio.Future):
        if not done.done():
            if exc is None:
                done.set_result(base)
            else:
                done.set_exception(exc)
        return
    try:
        done(base, exc)
    except Exception:  # a waiter must not break the commit path
        log.exception("commit callback failed")
