"""nsqd's side of tiered storage (``--archive-url``): one Archiver for the node, given every
durable topic partition's log (docs/archive.md).

A node plugin (start/stop like cluster mode's member) plus a topic hook: each partition log
gets the archive as its lower tier, so channels reset below the local start read from it,
and retention deletes only archived segments. The archiver's worker thread reads the logs
only through ``call_on_loop``. In cluster mode a partition is archived by its leader only
(the write gate admits publishes here), up to the high watermark, so nothing a failover may
truncate is archived; the member installs a fence (nsqx.cluster.archive_fence) through
which files count only once recorded in etcd by the current leader, and followers and a
new leader adopt the recorded files (no gap, no second file).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from nsqx.storage.archive import Archive
from nsqx.storage.archiver import Archiver, Stopped
from nsqx.storage.log import PartitionLog

log = logging.getLogger("nsqx.nsqd.archiving")
T = TypeVar("T")
REFRESH_INTERVAL = 5.0  # cluster mode: seconds between a follower's looks at the archive
TICK = 0.02  # seconds between the loop probe's ticks
LATE = 0.005  # a tick this late: the loop is short of CPU (publishes wait)
YIELD_BELOW = 256 << 20  # the archiver yields to a late loop only while less is pending
MAX_PAUSE = 0.05  # seconds of one yield
DECAY = 0.8  # per tick: a late tick counts for a while (the thread samples between groups)


class LoopProbe:
    """How late the event loop runs a callback (a tick every TICK seconds), held as a
    decaying peak: the archiver's thread reads ``late`` to see whether the loop is short of
    CPU now or was a moment ago."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.late = 0.0  # seconds: the latest ticks' lateness, decaying peak
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """On the loop."""
        self._due = self.loop.time() + TICK
        self._handle = self.loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self.loop.time()
        self.late = max(now - self._due, self.late * DECAY)
        self._due = now + TICK
        self._handle = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class NodeArchiver:
    """The node's archiver (see module doc); ``stats(log)`` feeds /stats and /metrics.

    No fixed rate cap: the archiver's heavy work runs without the GIL on another core, and
    it yields while the loop runs late and its backlog is small (``pause``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str, s3_endpoint: str = "",
                 *, cluster: bool = False, compression: str = "zstd") -> None:
        self.loop = loop
        self.archive = Archive(url, s3_endpoint=s3_endpoint or None, compression=compression)
        # cluster mode: only a partition's leader archives, up to its high watermark; the
        # followers (and a new leader) adopt the files the fence recorded (use_fence)
        self.probe = LoopProbe(loop)
        self.archiver = Archiver(self.archive, call=self.call_on_loop,
                                 on_archived=self._archived, limit=self._limit,
                                 refresh_interval=REFRESH_INTERVAL if cluster else 0.0,
                                 pause=self.pause)
        self._topics: dict[int, Any] = {}  # id(log) -> its Topic partition
        self._started = False

    def call_on_loop(self, fn: Callable[[], T]) -> T:
        """Run fn on the event loop and wait for it (from the worker thread)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the worker
                fut.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the node is gone
            raise Stopped from None
        while True:
            try:
                return fut.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                if self.archiver.stopping:
                    raise Stopped from None

    def use_fence(self, fence: Any) -> None:
        """Cluster mode: record files through ``fence`` (an ArchiveFence of the cluster
        layer, installed by the member before anything starts) instead of the listing."""
        self.archiver.fence = fence

    def topic_added(self, topic: Any) -> None:
        """Topic hook: archive a new durable partition's log (a Topic; not imported, so
        this module stays out of nsqd's import circle)."""
        if isinstance(topic.log, PartitionLog):
            self._topics[id(topic.log)] = topic
            self.archiver.add(topic.name, topic.partition, topic.log)

    def _limit(self, plog: PartitionLog) -> int | None:
        """On the loop: archive below the readable end (cluster mode: what the ISR has)
        where this node may write (the leader; standalone: always), else None."""
        topic = self._topics.get(id(plog))
        if topic is None or topic.log is not plog or topic.exiting:
            return None
        gate = topic.gate
        if gate is not None and gate.refuse(topic, 0) is not None:
            return None  # a follower, or a leader without enough in-sync replicas now
        return topic.readable_end

    def _archived(self, plog: PartitionLog) -> None:
        """On the loop, after a segment is archived: retention may delete it now."""
        topic = self._topics.get(id(plog))
        if topic is not None and topic.log is plog and not topic.exiting:
            topic.apply_retention()

    def pause(self, backlog: int) -> float:
        """In the archiver's thread, between row groups: seconds to leave the CPU to the
        event loop. Its work is GIL-free, so it slows publishes only by taking a core the
        loop (or its clients) need: while the loop runs late, yield, as long as less than
        YIELD_BELOW is pending; beyond that run flat out, so the lag stays bounded (on a
        machine short of CPU, publishes then slow to what the archiver keeps up with)."""
        late = self.probe.late
        if late < LATE or backlog >= YIELD_BELOW:
            return 0.0
        return min(late, MAX_PAUSE)

    def stats(self, plog: Any) -> dict[str, Any]:
        return self.archiver.stats(plog) if isinstance(plog, PartitionLog) else {}

    async def start(self) -> None:
        self.probe.start()
        self.archiver.start()
        self._started = True
        log.info("ARCHIVE: closed segments go to %s", self.archive.url)

    async def stop(self) -> None:
        self.probe.stop()
        self.archiver.stop()
        if self._started:
            await asyncio.to_thread(self.archiver.join, 60)
