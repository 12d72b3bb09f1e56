"""Group commit: every append of one event-loop turn becomes one write, acked after it.

append() assigns offsets at once and schedules a single flush for the turn (loop.call_soon);
the futures of that turn resolve together after the write, or after the fsync when the policy
asks for it (sync_every=1 or sync_always). fsync always runs in the default thread executor, so
the loop keeps serving while the disk works; appends arriving during an fsync share the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from nsqx.storage.records import LogError

__all__ = ["GroupCommitter"]

log = logging.getLogger("nsqx.storage.commit")


class GroupCommitter:
    """Batches appends per loop turn for one PartitionLog (or MemoryLog)."""

    def __init__(self, log: Any, loop: asyncio.AbstractEventLoop | None = None, *,
                 sync_always: bool = False) -> None:
        self.log = log
        self.loop = loop or asyncio.get_running_loop()
        self.sync_always = sync_always or getattr(log.config, "sync_every", 0) == 1
        self.on_flushed: list[Callable[[int], None]] = []
        self._turn: list[tuple[asyncio.Future[int], int, int]] = []  # (future, base, end)
        self._scheduled = False
        self._waiting_sync: list[tuple[asyncio.Future[int], int, int]] = []
        self._sync_task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
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
        self._turn.append((done, base, self.log.next_offset))
        if not self._scheduled:
            self._scheduled = True
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
        if self.log.needs_sync():
            self._kick_sync()
        elif self.log.flushed_offset > self.log.synced_offset:
            self._arm_timer()

    def _arm_timer(self) -> None:
        iv = getattr(self.log.config, "sync_interval", 0)
        if iv and iv > 0 and self._timer is None:
            self._timer = self.loop.call_later(iv, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.log.flushed_offset > self.log.synced_offset:
            self._kick_sync()

    def _kick_sync(self) -> None:
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = self.loop.create_task(self._sync_loop())

    async def _sync_loop(self) -> None:
        """fsync in a thread until nothing is waiting; resolve waiters covered by each fsync."""
        while True:
            waiters, self._waiting_sync = self._waiting_sync, []
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._sync_task is not None and not self._sync_task.done():
            await self._sync_task
        if self.log.flushed_offset > self.log.synced_offset:
            await self.loop.run_in_executor(None, self.log.sync)


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
