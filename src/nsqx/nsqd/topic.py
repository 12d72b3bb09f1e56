"""A topic: its partition log (one partition on a single node) and its channels.

A published batch is appended to the log through the group committer; channels
are cursors over the same log and are woken when a write lands.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nsqx.nsqd.channel import Channel, now_ms
from nsqx.nsqd.datapath import (
    channels_dir,
    cursor_path,
    partition_dir,
    publish_keys_path,
    topic_dir,
)
from nsqx.protocol.names import is_ephemeral
from nsqx.storage.commit import GroupCommitter
from nsqx.storage.cursor import ChannelCursor
from nsqx.storage.log import LogConfig, MemoryLog, PartitionLog
from nsqx.storage.publish_keys import forget_marks_from

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeContext, TopicRouting, Tracer, WriteGate

log = logging.getLogger("nsqx.nsqd.topic")


class Topic:
    """One topic of a node; owns its log, committer and channels."""

    def __init__(self, nsqd: NodeContext, name: str, *, partition: int = 0, paused: bool = False,
                 pending_from: int | None = None,
                 pending_deferred: list[list[int]] | None = None) -> None:
        self.nsqd = nsqd
        self.name = name
        # Partition number of this object; message ids carry it. A topic of P partitions is
        # P Topic objects (as Youzan's nsqd): `partitions` lists them in order, partition 0
        # being the object nsqd.topics[name] holds.
        self.partition = partition
        self.partitions: list[Topic] = [self]
        self.ordered = False  # SUB_ORDERED only; PUBs name their partition
        # route-managed ordered topics (nsqx.nsqd.routing): one object shared by every
        # partition; physical partition k of the route history is partitions[k]
        self.routes: TopicRouting | None = None
        self._rr = 0  # round-robin over partitions for PUBs that name none
        # Cluster mode (set by nsqx.cluster, None standalone): who may publish here and when
        # an append counts as acknowledged; `epoch` is the leader epoch stamped on commits.
        self.gate: WriteGate | None = None
        self.epoch = 0
        # Channels deliver fresh messages below `readable_end`: the flushed log end, or in
        # cluster mode (`hold_reads`) the ISR-acknowledged end the gate passes to
        # advance_readable(), so a leader never hands out what it may have to truncate.
        self.hold_reads = False
        # messages older than this are skipped at delivery (0: kept); per topic, default
        # the --msg-ttl flag
        self.msg_ttl_ns = int(nsqd.opts.msg_ttl * 1e9)
        self.msg_ttl_set = False  # set on this topic (persisted), not the default
        # fsync after this many messages, set on this topic (0: the node's --sync-every);
        # 1 makes every publish wait for its fsync
        self.sync_every = 0
        self.ephemeral = is_ephemeral(name)
        # Youzan's ext flag: a topic created with extend=false refuses custom headers
        # (E_EXT_NOT_SUPPORT); nsqx topics take them by default
        self.ext = True
        # the node's TraceRecorder while this topic is traced, else None (the hooks'
        # only cost when tracing is off is this None check)
        self.tracer: Tracer | None = None
        self.paused = paused
        self.channels: dict[str, Channel] = {}
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        opts = nsqd.opts
        self.dir = topic_dir(nsqd.data_path, name)
        if self.ephemeral:
            self.log: PartitionLog | MemoryLog = MemoryLog(partition,
                                                            mem_queue_size=max(opts.mem_queue_size, 1))
        else:
            config = LogConfig(
                segment_bytes=opts.max_bytes_per_file,
                sync_every=max(opts.sync_every, 1),
                sync_interval=opts.sync_timeout,
                retention_seconds=opts.retention_time or None,
                retention_bytes=opts.retention_bytes or None,
                hard_size_cap=opts.max_log_bytes or None,
                reclaim_files=nsqd.reclaim_files,  # EMFILE: idle logs let go, one retry
                # a cluster replica cuts at damage found at start and fetches the rest again;
                # a lone nsqd keeps its log and refuses the damaged commit when it is read
                cut_damaged_synced=bool(opts.cluster_leadership_addresses),
            )
            self.log = PartitionLog(partition_dir(self.dir, partition), partition, config)
        self._idle_end = -1  # log end seen by the last release_idle_files()
        self.dedupe: Any = None  # idempotent publishes' index (nsqd.idempotence), on first use
        self.committer = GroupCommitter(self.log, nsqd.loop, syncer=nsqd.fs_syncer,
                                        scheduler=nsqd.commit_scheduler)
        self.committer.on_flushed.append(self._on_flushed)
        self.readable_end = self.log.flushed_offset
        # Where messages published while the topic has no channel start: the first
        # channel created receives them (upstream buffers them in the topic).
        self.pending_from = self.log.start_offset if pending_from is None else pending_from
        # Deferred messages published while the topic had no channel: the first channel
        # inherits their delays (upstream's topic pump does PutMessageDeferred).
        self.pending_deferred: list[tuple[int, int]] = [tuple(x) for x in pending_deferred or ()]

    def __repr__(self) -> str:
        return f"<Topic {self.name}>" if len(self.partitions) == 1 else \
            f"<Topic {self.name} partition {self.partition}>"

    def route(self, partition: int | None) -> Topic:
        """The partition a publish goes to: the one named, else the next in turn.

        Raises BadPartition (upstream-style ``E_BAD_PARTITION``) for a number out of range
        or for an ordered topic's publish that names none (order needs a chosen partition).
        """
        parts = self.partitions
        routes = self.routes
        if routes is not None:  # route-managed: only the open partitions take publishes
            if partition is None:
                partition = routes.pick_open()
            elif not 0 <= partition < len(parts):
                raise BadPartition(f"partition {partition} of topic {self.name} does not "
                                   f"exist")
            routes.check_publish(partition)
            return parts[partition]
        if partition is None:
            if len(parts) == 1:
                return parts[0]
            if self.ordered:
                raise PartitionRequired(self.name, len(parts))
            first = parts[0]
            first._rr += 1
            if first.gate is not None:  # cluster mode: spread over the partitions led here
                open_ = [p for p in parts if p.gate is None or p.gate.refuse(p, 1) is None]
                if open_:
                    return open_[first._rr % len(open_)]
            return parts[first._rr % len(parts)]
        if not 0 <= partition < len(parts):
            raise BadPartition(f"partition {partition} of topic {self.name} does not exist "
                               f"({len(parts)} partitions)")
        return parts[partition]

    def set_sync_every(self, n: int) -> None:
        """This partition's fsync policy: every ``n`` messages (1: each publish waits for its
        fsync), 0 for the node's ``--sync-every``. Takes effect with the next commit."""
        self.sync_every = n
        if not self.log.durable:
            return
        config = self.log.config
        config.sync_every = n if n > 0 else max(self.nsqd.opts.sync_every, 1)
        self.committer.sync_always = config.sync_every == 1

    def restore_deferred(self) -> int:
        """Cluster mode, on becoming this partition's leader: defer again the DPUBs whose due
        time (``##deliver_at_ms``, stamped by the leader that took them) is still ahead, on
        every channel (or for the first channel to come). A follower mirrors only the
        channels' confirmed offsets, so without this a failover delivered them at once.
        Returns how many offsets were deferred."""
        if not self.log.durable:
            return 0
        chans = list(self.channels.values())
        lo = min((ch.confirmed for ch in chans), default=self.pending_from)
        now, n = now_ms(), 0
        for off, h in self.log.headers_range(lo, self.log.flushed_offset).items():
            raw = h.get(DELIVER_AT_KEY)
            if raw is None or not raw.isdigit() or int(raw) <= now:
                continue
            n += 1
            for ch in chans:
                ch.defer((off,), int(raw))
            if not chans and off >= self.pending_from:
                self.pending_deferred.append((off, int(raw)))
        if n:
            log.info("TOPIC(%s) PARTITION(%d): %d deferred messages deferred again until "
                     "their due time", self.name, self.partition, n)
        return n

    # -- publishing ------------------------------------------------------------------------
    def publish(self, bodies: list[bytes], defer_ms: int = 0,
                done: Callable[[int, Exception | None], None] | None = None, *,
                headers: list[dict[str, bytes] | None] | None = None,
                producer: str = "", trace: bool = True,
                on_replayed: Callable[[], None] | None = None) -> asyncio.Future[int] | None:
        """Append a batch, durable per policy: returns a future, or calls `done` (no future).

        `headers` (one dict or None per body) go to the log's header sidecar, never into
        the frames stock clients receive. `producer` (remote address) names the publisher
        in trace events. `trace=False`: `done` records the trace events already (a
        forwarded publish this node appends itself once it leads, cluster.forwarding).
        ``on_replayed``: a follower forwarding a marked batch asks the leader whether it
        was a repeat, and calls this before ``done`` when it was (HTTP's replay header).
        """
        base = self.log.next_offset
        kw: dict = {} if headers is None else {"headers": headers}
        outer: asyncio.Future[int] | None = None
        if self.tracer is not None and trace:  # pub events once the batch is durable
            if done is None:
                outer = self.nsqd.loop.create_future()
                done = settle(outer)
            done = self.tracer.wrap_publish(self, headers, len(bodies), producer, done)
        if self.routes is not None and self.partition not in self.routes.open:
            try:  # a sealed partition: nothing may land behind its command message
                self.routes.check_publish(self.partition)
            except BadPartition as exc:
                return _refuse(self.nsqd.loop, done, exc)
        if self.gate is not None:  # cluster mode: leader only, acked once the ISR has it
            refusal = self.gate.refuse(self, len(bodies))
            if refusal is not None:
                if self.gate.forwards:
                    if done is None:
                        outer = self.nsqd.loop.create_future()
                        done = settle(outer)
                    if self.gate.forward(self, bodies, defer_ms, done, headers, on_replayed):
                        return outer  # the leader acks it (after its ISR)
                failed = _refuse(self.nsqd.loop, done, PublishRefused(refusal))
                return outer if outer is not None else failed
            if done is None:
                outer = self.nsqd.loop.create_future()
                done = settle(outer)
            done = self.gate.wrap(self, base + len(bodies), done)
            kw["epoch"] = self.epoch
            if defer_ms > 0:  # the due time rides in the log: a new leader defers it again
                due = b"%d" % (now_ms() + defer_ms)
                kw["headers"] = [{**(h or {}), DELIVER_AT_KEY: due}
                                 for h in (headers or [None] * len(bodies))]
        if done is None:
            fut: asyncio.Future[int] | None = self.committer.append(bodies, **kw)
        else:
            fut = outer
            self.committer.append_cb(bodies, done, **kw)
        self.message_count += len(bodies)
        self.message_bytes += sum(map(len, bodies))
        if defer_ms > 0:
            ready_at = now_ms() + defer_ms
            offsets = range(base, base + len(bodies))
            for ch in self.channels.values():
                ch.defer(offsets, ready_at)
            if not self.channels:
                self.pending_deferred.extend((off, ready_at) for off in offsets)
                self.nsqd.metadata_changed()
        return fut

    def _on_flushed(self, offset: int) -> None:
        if self.hold_reads:
            return  # cluster mode: advance_readable() once the ISR has it
        self.readable_end = offset
        for ch in self.channels.values():
            ch.note_readable(offset)

    def advance_readable(self, end: int) -> None:
        """Cluster mode: channels may now read below ``end`` (the high watermark).

        Called by the write gate before it acknowledges the publishes below ``end``, so the
        cursors' delay stores write their deferrals before the acks, as after a flush."""
        end = min(end, self.log.flushed_offset)
        if end <= self.readable_end:
            return
        self.readable_end = end
        for ch in self.channels.values():
            ch.note_readable(end)

    # -- the replica API (cluster mode drives a partition through these) --------------------
    def attach_gate(self, gate: WriteGate, epoch: int | None = None) -> None:
        """Put cluster mode's ``gate`` in front of the appends and, when given, stamp
        ``epoch`` (the leader epoch) on commits from now on; reads are held below the high
        watermark (``hold_reads_from_start``)."""
        if epoch is not None:
            self.epoch = epoch
        self.gate = gate
        self.hold_reads_from_start()

    def hold_reads_from_start(self) -> None:
        """Channels of a cluster partition read below the high watermark only (never what
        the partition may truncate); a partition not yet held starts at its log start, as
        its acknowledged end is not known (a restart), and the gate or the fetches raise it
        (``advance_readable``)."""
        if not self.hold_reads:
            self.hold_reads = True
            self.readable_end = self.log.start_offset

    def truncate_to(self, offset: int) -> None:
        """A follower's diverged tail: drop the log from ``offset`` on, and what the
        channels could read of it."""
        self.log.truncate_to(offset)
        self.readable_end = min(self.readable_end, offset)
        # the idempotence marks of the records cut must not answer a retry as stored; a
        # follower opens no index but may keep one from a term it led
        if self.dedupe is not None:
            self.dedupe.truncated(offset)
        elif not self.ephemeral:
            forget_marks_from(publish_keys_path(self.dir, self.partition), offset)

    # -- channels --------------------------------------------------------------------------
    def get_channel(self, name: str, create: bool = True) -> Channel | None:
        """This partition's channel; a new channel is made in every partition at once."""
        ch = self.channels.get(name)
        if ch is not None or not create:
            return ch
        first = not any(p.channels for p in self.partitions)
        for part in self.partitions:
            if part is not self:
                part.get_channel_here(name)
        ch = self.get_channel_here(name)
        if self.routes is not None and ch is not None:
            self.routes.channel_created(name, first=first)
        return ch

    def get_channel_here(self, name: str) -> Channel | None:
        """This partition's channel, made here only (``get_channel`` makes it in every
        partition; a partition added later makes the channels its siblings have)."""
        ch = self.channels.get(name)
        if ch is not None:
            return ch
        ephemeral = is_ephemeral(name)
        if not self.channels:
            start = max(self.pending_from, self.log.start_offset)
        else:
            start = self.log.next_offset
        state_path = None
        if not ephemeral and not self.ephemeral:
            channels_dir(self.dir).mkdir(parents=True, exist_ok=True)
            state_path = cursor_path(self.dir, name, self.partition)
        cursor = ChannelCursor(start, state_path=state_path)
        was = cursor.fit_log(self.log.next_offset)
        if was is not None:
            log.warning("TOPIC(%s) CHANNEL(%s): cursor at offset %d is past the log end %d "
                        "(the log lost its unsynced tail: power loss?); resuming at the end",
                        self.name, name, was, self.log.next_offset)
        # upstream's memory queue: a redelivery waits behind at most this many queued ones
        cursor.redelivery_window = self.nsqd.opts.mem_queue_size
        cursor.note_end(self.readable_end)
        if not self.channels and self.pending_deferred:
            t = now_ms()
            for off, ready_at in self.pending_deferred:
                if off >= cursor.next_read and ready_at > t:
                    cursor.defer(off, ready_at)
            self.pending_deferred = []
        if state_path is not None and not state_path.exists():
            cursor.persist()  # its start offset must survive a SIGKILL before any consumer
        ch = Channel(self, name, cursor, ephemeral=ephemeral)
        self.channels[name] = ch
        log.info("TOPIC(%s): new channel(%s) at offset %d", self.name, name, cursor.next_read)
        self.nsqd.metadata_changed()
        self.nsqd.lookup_register(self.name, name)
        return ch

    async def delete_channel(self, name: str) -> None:
        """Delete the channel in every partition (KeyError when this one has none)."""
        if name not in self.channels:
            raise KeyError(name)
        for part in self.partitions:
            if part is not self and name in part.channels:
                await part._delete_channel_here(name)
        if self.routes is not None:
            self.routes.channel_deleted(name)
        await self._delete_channel_here(name)

    async def delete_unused_ephemeral(self, name: str) -> None:
        """Delete ephemeral channel ``name`` once no partition's copy has a client: each
        partition's copy asks when its last client leaves, so the first ask that finds the
        channel unused deletes it everywhere and the others find nothing to do."""
        copies = [p.channels[name] for p in self.partitions if name in p.channels]
        if not copies or any(ch.clients or ch.exiting for ch in copies):
            return
        owner = next(p for p in self.partitions if name in p.channels)
        await owner.delete_channel(name)

    async def _delete_channel_here(self, name: str) -> None:
        ch = self.channels.pop(name, None)
        if ch is None:
            raise KeyError(name)
        log.info("TOPIC(%s): deleting channel(%s)", self.name, name)
        ch.exiting = True
        for client in list(ch.clients.values()):
            client.close()
        ch.discard()
        if not self.channels:
            self.pending_from = self.log.next_offset
        self.nsqd.metadata_changed()
        self.nsqd.lookup_unregister(self.name, name)
        if self.ephemeral and not self.channels and not self.exiting:
            await self.nsqd.delete_topic(self.name)

    # -- state -----------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Messages waiting in the topic itself (only while it has no channel)."""
        if self.channels:
            return 0
        return max(0, self.log.next_offset - max(self.pending_from, self.log.start_offset))

    def is_read(self) -> bool:
        """Whether a memory tail helps this partition: consumers are subscribed, or cluster
        mode replicates it (followers fetch the newest frames)."""
        return self.gate is not None or any(ch.clients for ch in self.channels.values())

    def pause(self) -> None:
        for part in self.partitions:
            part.paused = True
        self.nsqd.metadata_changed()

    def unpause(self) -> None:
        for part in self.partitions:
            part.paused = False
            for ch in part.channels.values():
                ch.wake()
        self.nsqd.metadata_changed()

    def empty(self) -> None:
        """Drop what waits in the topic (not what its channels hold), as upstream."""
        for part in self.partitions:
            part.pending_from = part.log.next_offset
            part.pending_deferred = []
        self.nsqd.metadata_changed()

    def tick(self, t_ms: int) -> None:
        for ch in self.channels.values():
            ch.tick(t_ms)

    def persist_cursors(self) -> None:
        for ch in self.channels.values():
            ch.persist_if_dirty()

    def release_idle_files(self) -> None:
        """Close the log's files if nothing was written since the last call and nobody
        consumes (they reopen on use): a node keeps no descriptors for idle topics."""
        end = self.log.next_offset
        if end == self._idle_end and not any(ch.clients for ch in self.channels.values()):
            self.log.release_files()
        self._idle_end = end

    def apply_retention(self) -> None:
        """Let the log drop segments every durable channel has passed."""
        if self.ephemeral:
            return
        floors = [ch.confirmed for ch in self.channels.values() if not ch.ephemeral]
        floor = min(floors) if floors else max(self.pending_from, self.log.start_offset)
        self.log.apply_retention(floor, time.time())
        start = self.log.earliest_offset  # (with an archive: what it still serves)
        for ch in self.channels.values():
            if ch.confirmed < start:
                skipped = ch.skip_to(start)
                log.warning("TOPIC(%s) CHANNEL(%s): retention skipped %d unconsumed messages",
                            self.name, ch.name, skipped)

    def metadata(self) -> dict:
        return {
            "name": self.name,
            "paused": self.paused,
            "channels": [
                {"name": c.name, "paused": c.paused,
                 **({"max_attempts": c.max_attempts} if c.max_attempts_set else {})}
                for c in self.channels.values() if not c.ephemeral
            ],
            **({"msg_ttl_ms": self.msg_ttl_ns // 1_000_000} if self.msg_ttl_set else {}),
            **({"sync_every": self.sync_every} if self.sync_every else {}),
            **({"trace": True} if self.tracer is not None else {}),
            **({"ext": False} if not self.ext else {}),
            "pending_from": self.pending_from,
            "pending_deferred": [list(x) for x in self.pending_deferred],
            **({"partitions": len(self.partitions), "ordered": self.ordered,
                "partition_state": [
                    {"pending_from": p.pending_from,
                     "pending_deferred": [list(x) for x in p.pending_deferred]}
                    for p in self.partitions[1:]]}
               if len(self.partitions) > 1 or self.ordered else {}),
        }

    async def close(self, *, delete: bool = False) -> None:
        """Flush and fsync the log, persist cursors; with delete, remove the files.

        Partition 0 closes the topic's other partitions first (their files are under the
        same topic directory)."""
        if self.partition == 0:
            for part in self.partitions[1:]:
                try:
                    await part.close()
                except Exception as exc:  # keep closing
                    log.error("TOPIC(%s) PARTITION(%d): close failed: %s", self.name,
                              part.partition, exc)
        self.exiting = True
        for ch in list(self.channels.values()):
            ch.exiting = True
            for client in list(ch.clients.values()):
                client.close()
        try:
            await self.committer.close()
        finally:
            for ch in self.channels.values():
                ch.close(persist=not delete)
            if self.dedupe is not None:
                self.dedupe.close()
                self.dedupe = None
            self.log.close()
        if delete and not self.ephemeral:
            shutil.rmtree(self.dir, ignore_errors=True)


DELIVER_AT_KEY = "##deliver_at_ms"  # cluster mode: a DPUB's due time (ms), kept in the log


class BadPartition(ValueError):
    """A partition that does not exist, or a partitionless PUB to an ordered topic."""


class PartitionRequired(BadPartition):
    """A publish to an ordered topic that names no partition: order holds per partition,
    so the producer must choose one (or a key that hashes to one). The text says so, for
    HTTP publishers too, behind the upstream-style code ``E_BAD_PARTITION``."""

    def __init__(self, topic: str, partitions: int) -> None:
        super().__init__(f"topic {topic} is ordered: name a partition (0..{partitions - 1}: "
                         f"PUB {topic} N, /pub?partition=N) or publish with a key "
                         f"(nsqx.client: key=...), whose messages keep their order")


class SealedPartition(BadPartition):
    """A publish to a partition the route no longer (or not yet) sends keys to: the producer
    refreshes its route to at least ``version`` and retries (``E_BAD_PARTITION route version
    N``). Raised by ``routing.TopicRoutes``; defined here so that the publish paths catch it
    without loading the routing code a node without routed topics never needs."""

    def __init__(self, stale: Any, topic: str) -> None:  # the barrier's StaleRoute
        self.partition = stale.partition
        self.version = stale.version
        super().__init__(f"route version {stale.version} (partition {stale.partition} of "
                         f"topic {topic} takes no publishes)")


class PublishRefused(Exception):
    """A publish this node may not take now (not the leader, too few in-sync replicas)."""


def settle(fut: asyncio.Future[int]) -> Callable[[int, Exception | None], None]:
    def done(base: int, exc: Exception | None) -> None:
        if fut.done():
            return
        if exc is None:
            fut.set_result(base)
        else:
            fut.set_exception(exc)
    return done


def _refuse(loop: asyncio.AbstractEventLoop, done: Callable[[int, Exception | None], None] | None,
            exc: Exception) -> asyncio.Future[int] | None:
    if done is not None:
        loop.call_soon(done, -1, exc)  # as a failed commit would: after this call returns
        return None
    fut: asyncio.Future[int] = loop.create_future()
    fut.set_exception(exc)
    return fut


