"""A channel: a cursor over its topic's log plus the clients subscribed to it.

Nothing is copied per channel. Delivery reads ready-to-send frames from the
topic's log (a byte range for fresh runs, a patched frame for redeliveries)
and hands them to clients whose RDY window is open, once per loop turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsqx.nsqd.dead_letters import screen
from nsqx.nsqd.e2e import LatencyWindow
from nsqx.nsqd.headers import ext_frames
from nsqx.nsqd.tags import TagDispatch, retag
from nsqx.protocol.v2 import StartKind, StartPosition
from nsqx.storage.cursor import ChannelCursor, Delivery, NotInFlight, NotOwner
from nsqx.storage.message_id import parse_id
from nsqx.storage.records import LogError

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import Session, TopicView

log = logging.getLogger("nsqx.nsqd.channel")

# Upper bound of messages handed to one client per pump turn, so that one busy
# client cannot starve the loop (and the others) for long.
MAX_BATCH_PER_TURN = 512
# Bytes read per fresh run at most, bounding memory per turn.
MAX_READ_BYTES = 4 << 20


class SeekError(ValueError):
    """A position the channel cannot move to (an offset beyond the end of the log)."""


class NotLeader(SeekError):
    """Cluster mode: only the partition's leader moves a channel (followers mirror it)."""


@dataclass(frozen=True, slots=True)
class SeekResult:
    """Where a reset put the channel, and the log's bounds at that moment."""

    offset: int
    earliest: int
    latest: int
    clamped: bool  # the position was before the oldest kept message: moved up to it
    persisted: bool  # the cursor was written (tmp+fsync+rename) before the answer


def resolve_position(topic: TopicView, pos: StartPosition) -> tuple[int, bool]:
    """The offset of ``topic``'s log (one partition) a position names, and whether it was
    clamped up to the oldest kept message; raises SeekError / NotLeader.

    A time is a seek in the log's time index, never a scan. An offset past the log end
    raises SeekError: a typo (or another partition's offset) would otherwise make the
    channel silently skip everything published until the log got there. In cluster mode
    only the leader moves channels (NotLeader where the write gate refuses).
    """
    gate = topic.gate
    refusal = gate.refuse(topic, 0) if gate is not None else None
    if refusal is not None:
        raise NotLeader(refusal)
    log_ = topic.log
    earliest, latest = log_.earliest_offset, log_.next_offset  # (the archive's start)
    if pos.kind == StartKind.EARLIEST:
        off, clamped = earliest, False
    elif pos.kind == StartKind.LATEST:
        return latest, False
    elif pos.kind == StartKind.TIMESTAMP:
        off, clamped = min(max(log_.offset_for_time(pos.value * 1_000_000_000), earliest),
                           latest), False
    elif pos.value > latest:
        raise SeekError(f"offset {pos.value} is beyond the end of the log ({latest})")
    else:
        off, clamped = max(pos.value, earliest), pos.value < earliest
    if off < log_.start_offset:
        log_.read(off, 0, 1)  # an unreadable archive file is refused now (LogError)
    return off, clamped


async def load_archived(log_: Any, offset: int) -> None:
    """Before a read on the loop of an archived ``offset`` (below the local log start): read
    its row group in a thread, so that the read finds it decoded and the loop never waits
    for a slow store (an S3 round trip). Its errors (LogError: E_ARCHIVE_CORRUPT <file>, the
    store unreachable) are raised here, as the read would."""
    lower = log_.lower
    if lower is not None and log_.earliest_offset <= offset < log_.start_offset:
        await asyncio.to_thread(lower.chunk, offset)


async def load_time(log_: Any, ts_ns: int) -> int | None:
    """The archive's answer to a time seek, looked up in a thread (the tier keeps it, so
    ``offset_for_time`` on the loop then reads nothing); None: not in the archive."""
    lower = log_.lower
    if lower is None or log_.earliest_offset >= log_.start_offset:
        return None
    return await asyncio.to_thread(lower.offset_for_time, ts_ns)


async def load_position(topic: TopicView, pos: StartPosition) -> None:
    """``load_archived`` for the offset a position names (a time: its archive lookup too,
    whose answer the tier keeps), before ``resolve_position`` runs on the loop."""
    log_ = topic.log
    lower = log_.lower
    if lower is None or log_.earliest_offset >= log_.start_offset:
        return
    if pos.kind == StartKind.TIMESTAMP:
        off = await load_time(log_, pos.value * 1_000_000_000)
        if off is None:
            return
    elif pos.kind == StartKind.LATEST:
        return
    else:  # earliest, an offset (clamped up to the archive start)
        off = 0 if pos.kind == StartKind.EARLIEST else pos.value
    await load_archived(log_, max(off, log_.earliest_offset))


def now_ms() -> int:
    """Wall-clock ms: deadlines and delays are persisted, so they must survive a restart."""
    return time.time_ns() // 1_000_000


class Channel:
    """Delivery state of one channel; owned by its Topic."""

    def __init__(self, topic: TopicView, name: str, cursor: ChannelCursor, *, ephemeral: bool) -> None:
        self.topic = topic
        self.name = name
        self.ephemeral = ephemeral
        self.cursor = cursor
        self.clients: dict[int, Session] = {}
        self.exiting = False
        self._pump_scheduled = False
        self._rr = 0
        self._dirty = False  # cursor changed since it was last persisted (see .dirty)
        # server-side give-up (0: never, upstream's behaviour); per channel, default the flag
        self.max_attempts: int = topic.nsqd.opts.max_attempts
        self.max_attempts_set = False  # set on this channel (persisted), not the default
        self.ordered = False  # one message in flight at a time, log order (SUB_ORDERED)
        self.tags: TagDispatch | None = None  # while tagged consumers are connected (tags.py)
        if topic.ordered:
            self.set_ordered()
        self.dlq_count = 0  # moved to the dead-letter topic
        self.expired_count = 0  # skipped by the topic's TTL
        opts = topic.nsqd.opts
        self.e2e: LatencyWindow | None = None
        if opts.e2e_processing_latency_percentiles:
            self.e2e = LatencyWindow(opts.e2e_processing_latency_window_time,
                                     list(opts.e2e_processing_latency_percentiles))
        # the node's scanner visits this channel only while its cursor has timers
        cursor.on_armed = self._on_armed
        cursor.armed = False
        if cursor.has_timers():  # deferrals or redeliveries recovered from disk
            cursor.armed = True
            self._on_armed()

    @property
    def dirty(self) -> bool:
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        """A dirty channel joins the node's set, so the persist pass visits only those."""
        if value and not self._dirty:
            self.topic.nsqd.dirty_channels.add(self)
        self._dirty = value

    @property
    def armed(self) -> bool:
        """The node's scanner visits this channel (its cursor has timers)."""
        return self.cursor.armed

    @armed.setter
    def armed(self, value: bool) -> None:
        self.cursor.armed = value

    def has_timers(self) -> bool:
        return self.cursor.has_timers()

    def _on_armed(self) -> None:
        self.topic.nsqd.timed_channels.add(self)

    # -- state exposed to stats / http -------------------------------------------------
    @property
    def paused(self) -> bool:
        return self.cursor.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        """As loaded from the metadata (``pause``/``unpause`` are the operations)."""
        self.cursor.paused = value

    @property
    def confirmed(self) -> int:
        """Everything below this offset is finished (what a restart resumes from)."""
        return self.cursor.confirmed

    @property
    def next_read(self) -> int:
        """The first offset never delivered."""
        return self.cursor.next_read

    @property
    def in_flight_count(self) -> int:
        return self.cursor.in_flight_count

    @property
    def deferred_count(self) -> int:
        return self.cursor.deferred_count

    @property
    def depth(self) -> int:
        """Pending messages up to what is readable, paused or not: Go's depth counts a
        paused topic's backlog (a pause stops delivery, not the count)."""
        return self.cursor.depth(self.topic.readable_end)

    @property
    def message_count(self) -> int:
        return self.cursor.delivered_count

    @property
    def requeue_count(self) -> int:
        return self.cursor.requeue_count

    @property
    def timeout_count(self) -> int:
        return self.cursor.timeout_count

    def __repr__(self) -> str:
        return f"<Channel {self.topic.name}:{self.name}>"

    # -- operations ----------------------------------------------------------------------
    def siblings(self) -> list[Channel]:
        """This channel in every partition of its topic (itself when there is one)."""
        parts = self.topic.partitions
        if len(parts) == 1:
            return [self]
        return [c for p in parts if (c := p.channels.get(self.name)) is not None]

    def set_ordered(self) -> None:
        """Strict log order: one message in flight, redeliveries first, and a delayed REQ
        holds back everything behind it (nothing passes a message that is not finished)."""
        self.ordered = True
        self.cursor.strict = True
        self.cursor.redelivery_window = 0

    def pause(self) -> None:
        for ch in self.siblings():
            ch.cursor.paused = True
            ch._changed()

    def unpause(self) -> None:
        for ch in self.siblings():
            ch.cursor.paused = False
            ch._changed()
            ch.wake()

    def empty(self) -> None:
        for ch in self.siblings():
            ch.cursor.empty(ch.topic.log.next_offset)
            ch._changed()

    def resolve(self, pos: StartPosition) -> tuple[int, bool]:
        """The log offset a position names, and whether it was clamped (resolve_position)."""
        return resolve_position(self.topic, pos)

    def seek(self, pos: StartPosition, who: str = "") -> SeekResult:
        """Reset the channel to a position (replay or skip ahead); see ChannelCursor.reset.

        In-flight and ready messages are forgotten (a late FIN/REQ/TOUCH of one gets the
        usual "not in flight" error unless the message was delivered again meanwhile),
        deferred ones before the position are dropped, those at or after it keep their
        delay. A paused channel stays paused. A durable cursor is persisted before this
        returns, so a crash right after cannot bring the old position back. In cluster mode
        only the leader may (NotLeader elsewhere); followers mirror its cursor.
        """
        offset, clamped = resolve_position(self.topic, pos)
        self.reset_to(offset)
        log.info("TOPIC(%s) CHANNEL(%s): reset to offset %d (%s%s)%s", self.topic.name,
                 self.name, offset, pos.kind,
                 f" {pos.value}" if pos.kind in (StartKind.OFFSET, StartKind.TIMESTAMP) else "",
                 f" by {who}" if who else "")
        self.wake()
        return SeekResult(offset, self.topic.log.earliest_offset, self.topic.log.next_offset,
                          clamped, self.cursor.state_path is not None)

    def reset_to(self, offset: int) -> None:
        """Move the cursor to ``offset`` (ChannelCursor.reset, which persists it)."""
        self.cursor.reset(offset)
        self.dirty = False

    def mirror_confirmed(self, confirmed: int) -> None:
        """Cluster follower: follow the leader's confirmed offset, so that a failover
        resumes where the leader was. Behind ours: a replay (/channel/setoffset,
        SUB_ADVANCED) or a new leader with an older cursor (or a channel created here at
        our log end): reset to it. Ahead: skip to it, up to what this replica has."""
        cursor = self.cursor
        back = max(confirmed, self.topic.log.start_offset)
        if back < cursor.confirmed:
            self.reset_to(back)
            return
        if cursor.confirmed >= confirmed:
            return
        target = min(confirmed, self.topic.log.flushed_offset)
        if target > cursor.confirmed:
            cursor.skip_to(target)
            self.dirty = True

    def skip_to(self, offset: int) -> int:
        """Treat everything below ``offset`` as finished (retention dropped it); how many
        unconsumed messages that skipped."""
        return self.cursor.skip_to(offset)

    def defer(self, offsets: Iterable[int], ready_at_ms: int) -> None:
        """Hold these offsets back until ``ready_at_ms`` (a DPUB, or a due time restored)."""
        cursor = self.cursor
        for off in offsets:
            cursor.defer(off, ready_at_ms)

    def note_readable(self, end: int) -> None:
        """The topic's readable end moved to ``end``: deliver up to it (a redelivery from
        now on waits behind these, as behind upstream's memory queue)."""
        self.cursor.note_end(end)
        self.wake()

    # -- persistence ---------------------------------------------------------------------
    def persist_if_dirty(self) -> None:
        """Write a durable channel's changed cursor now (on the loop)."""
        if self._dirty and not self.ephemeral:
            self.dirty = False
            self.cursor.persist()

    def snapshot(self) -> tuple[int, bytes] | None:
        """The cursor's state to write off the loop (``write_snapshot``); None: nothing to
        write. The channel is clean from now on (a change marks it dirty again); an OSError
        leaves it dirty."""
        snap = self.cursor.snapshot()
        self.dirty = False
        return snap

    def snapshot_failed(self) -> None:
        """Writing the ``snapshot`` failed: dirty again, for the next persist pass."""
        self.dirty = True

    def write_snapshot(self, gen: int, data: bytes) -> None:
        """Worker thread: write a ``snapshot`` (tmp + fsync + rename)."""
        self.cursor.write_snapshot(gen, data)

    def _changed(self) -> None:
        self.dirty = True
        self.topic.nsqd.metadata_changed()

    def add_client(self, client: Session) -> None:
        self.clients[client.id] = client
        if len(self.clients) == 1:
            self.topic.nsqd.readers_changed()  # the topic may now deserve a memory tail
        if client.desired_tag or self.tags is not None:
            retag(self)

    def remove_client(self, client: Session) -> None:
        """Forget a client; its in-flight messages time out and go to others (upstream)."""
        if self.clients.pop(client.id, None) is None:
            return
        self.cursor.drop_client(client.id)
        if not self.clients:
            self.topic.nsqd.readers_changed()
        if self.tags is not None:
            retag(self)
        if self.ephemeral and not self.clients and not self.exiting:
            self.topic.nsqd.loop.create_task(self.topic.delete_unused_ephemeral(self.name))

    # -- what its consumers do (the TCP session calls these, never the cursor) ------------
    def in_flight_of(self, client_id: int) -> int:
        return self.cursor.in_flight_of(client_id)

    def finish(self, client: Session, offset: int) -> None:
        """FIN of one message ``client`` holds; NotInFlight / NotOwner when it holds none."""
        self.cursor.finish(client.id, offset)
        self._finished(client, (offset,), offset, 1)

    def finish_head(self, client: Session, offset: int) -> bool:
        """FIN of the oldest unfinished message (the one-in-flight fast path); False, with
        nothing changed, unless ``client`` holds exactly that one."""
        if not self.cursor.finish_head(client.id, offset):
            return False
        if self.topic.tracer is None and self.e2e is None:
            self.dirty = True  # (_finished's only work then, without its call: per message)
        else:
            self._finished(client, (offset,), offset, 1)
        return True

    def finish_many(self, client: Session, offsets: list[int]) -> list[tuple[int, Exception]]:
        """FINs of one read (in-order runs finished at once); the (offset, error) of each
        that failed, the rest finished."""
        if not offsets:
            return []
        errors = self.cursor.finish_many(client.id, offsets)
        done = offsets
        if errors and self.topic.tracer is not None:
            bad = {off for off, _ in errors}
            done = [o for o in offsets if o not in bad]
        self._finished(client, done, offsets[-1], len(offsets) - len(errors))
        return errors

    def _finished(self, client: Session, offsets: Sequence[int], last: int, count: int) -> None:
        """The bookkeeping of FINs the cursor took, once per batch: trace events, one e2e
        latency sample (at ``last``) standing for ``count`` FINs, the cursor to persist."""
        tracer = self.topic.tracer
        if tracer is not None:
            tracer.finished(self, client, offsets)
        if count and self.e2e is not None:
            self.record_finished(last, count)
        self.dirty = True

    def requeue(self, client: Session, offset: int, delay_ms: int) -> None:
        """REQ: redeliver after ``delay_ms``; NotInFlight / NotOwner as ``finish``."""
        self.cursor.requeue(client.id, offset, delay_ms, now_ms())
        if self.topic.tracer is not None:
            self.topic.tracer.requeued(self, client, offset, delay_ms)
        self.dirty = True

    def touch(self, client: Session, offset: int, max_msg_timeout_ms: int) -> None:
        """TOUCH: restart the message's timeout (the client's, capped by the node's)."""
        self.cursor.touch(client.id, offset, now_ms(), client.msg_timeout_ms,
                          max_msg_timeout_ms=max_msg_timeout_ms)

    # -- what the channel's services do (dead letters, tag dispatch) ----------------------
    def finish_held(self, holder: int, offsets: Iterable[int]) -> None:
        """Finish ``offsets`` that ``holder`` has in flight (dead-lettered, expired, or
        skipped unseen), skipping any it no longer holds (reset or emptied meanwhile)."""
        cursor = self.cursor
        for off in offsets:
            try:
                cursor.finish(holder, off)
            except (NotInFlight, NotOwner):
                pass
        self.dirty = True

    def take_held(self, holder: int, want: int, end: int, now: int, hold_ms: int) -> list[Delivery]:
        """Up to ``want`` messages below ``end`` taken in flight for ``holder`` (not a
        client: tag dispatch's queue) for ``hold_ms``, until handed over (``hand_over``)."""
        deliveries = self.cursor.take(holder, want, end, now, hold_ms)
        if deliveries:
            self.dirty = True
        return deliveries

    def hand_over(self, offset: int, holder: int, client: Session, now: int) -> None:
        """Give ``client`` the message ``holder`` has in flight, with the client's timeout;
        NotInFlight / NotOwner when ``holder`` no longer has it."""
        self.cursor.reassign(offset, holder, client.id, now + client.msg_timeout_ms, now)

    # -- delivery ------------------------------------------------------------------------
    def end_offset(self) -> int:
        """Fresh messages are delivered up to what is written (in cluster mode: what the
        ISR has); a paused topic delivers none."""
        if self.topic.paused:
            return min(self.cursor.next_read, self.topic.readable_end)
        return self.topic.readable_end

    def wake(self) -> None:
        """Schedule one pump for this loop turn (coalesces many wake-ups)."""
        if not self._pump_scheduled and self.clients and not self.exiting:
            self._pump_scheduled = True
            self.topic.nsqd.loop.call_soon(self._pump)

    def pump_now(self, client: Session) -> None:
        """After ``client``'s FIN: deliver now, in this callback, when it alone reads the
        channel and no pump is scheduled; else schedule one as ``wake`` does.

        Speed: the one-in-flight round trip (ordered partitions, RDY 1). When exactly one
        message may go and the next one is fresh (no redelivery, deferral, skip range),
        ``ChannelCursor.take_one`` takes it and the log's ``read_one`` gives its frame: the
        same state and bytes as ``_pump`` -> ``take`` -> ``_send`` -> ``read``, which every
        other case (features that screen or rewrite deliveries, room > 1) goes through.
        """
        if self._pump_scheduled or len(self.clients) != 1 or self.exiting:
            self.wake()
            return
        topic = self.topic
        if (topic.routes is not None or self.tags is not None or topic.paused
                or self.max_attempts or topic.msg_ttl_ns or topic.tracer is not None
                or client.sample_rate or client.extend_support or client.id not in self.clients):
            self._pump()
            return
        cursor = self.cursor
        room = client.ready_room()
        if self.ordered:
            room = min(room, 1 - cursor.in_flight_count)
        if room != 1:
            self._pump()
            return
        log_ = topic.log
        off = cursor.take_one(client.id, topic.readable_end, now_ms(), client.msg_timeout_ms,
                              log_.start_offset)
        if off >= 0:  # (dirty: the FIN that called us has just set it)
            client.send_messages([log_.read_one(off)], 1)
        elif off == -1:
            self._pump()

    def _pump(self) -> None:
        self._pump_scheduled = False
        if self.cursor.paused or self.exiting or not self.clients:
            return
        end = self.end_offset()
        routes = self.topic.routes
        if routes is not None:  # route-managed: the barrier, and never the command message
            end = routes.gate(self, end)
            if end < 0:
                return
        log_ = self.topic.log
        limited = False
        if log_.lower is not None:  # tiered storage: never wait for it here
            lim = self._archive_limit(log_)
            if lim < 0:
                return  # _archive_ready wakes us
            # a decoded run that stops before the end: the next turn goes on past it (a
            # run not decoded yet, lim == next_read: _archive_ready wakes the channel)
            limited = self.cursor.next_read < lim < end
            end = min(end, lim)
        if self.tags is not None:  # tag dispatch (tags.py): only while tagged consumers are here
            more = self.tags.pump(self, now_ms(), MAX_BATCH_PER_TURN, end)
            if not self.tags.held:
                retag(self)
            if more or (limited and self.cursor.next_read >= end):
                self.wake()
            return
        clients = list(self.clients.values())
        n = len(clients)
        start = self._rr % n
        self._rr += 1
        t = now_ms()
        more = False
        took = False
        for i in range(n):
            client = clients[(start + i) % n]
            room = client.ready_room()
            if self.ordered:
                room = min(room, 1 - self.cursor.in_flight_count)
            if room <= 0:
                continue
            want = min(room, MAX_BATCH_PER_TURN)
            deliveries = self.cursor.take(client.id, want, end, t, client.msg_timeout_ms)
            if not deliveries:
                break  # nothing left for anyone this turn
            self.dirty = True
            took = True
            self.send(client, deliveries)
            if want == MAX_BATCH_PER_TURN and client.ready_room() > 0:
                more = True  # a busy client: continue next turn, after other work
        if more or (limited and took and self.cursor.next_read >= end):
            self.wake()  # (archived: the next row group, or a wait for the reader thread)

    def _archive_limit(self, log_: Any) -> int:
        """Where fresh delivery must stop so that no read waits for the archive (a channel
        reset below the local log start): the end of the row groups decoded now; -1 when
        the first ready redelivery's group is not. What is missing is read in the archive's
        reader thread, and ``_archive_ready`` wakes the channel when it is there."""
        cursor = self.cursor
        front = cursor.next_redelivery()
        if front is not None and log_.ready_end(front, self._archive_ready) <= front:
            return -1
        return log_.ready_end(cursor.next_read, self._archive_ready)

    def _archive_ready(self) -> None:
        """From the archive's reader thread: what delivery waited for is decoded."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
            self.topic.nsqd.loop.call_soon_threadsafe(self.wake)

    def _archive_pending(self, log_: Any, deliveries: list[Delivery]) -> list[Delivery]:
        """Redeliveries whose archived row group is not decoded now (one deferred message
        that came due during ``take``, or a group dropped from the cache) stay in flight
        unsent, while their group is read in a thread: they time out and come back."""
        start = log_.start_offset
        return [d for d in deliveries if d.offset >= start or d.attempts == 1
                or log_.ready_end(d.offset, self._archive_ready) > d.offset]

    def send(self, client: Session, deliveries: list[Delivery]) -> None:
        """Write ``deliveries`` (taken for ``client``) as message frames: fresh runs as byte
        ranges of the log, redeliveries patched; screened, sampled and traced first."""
        log_ = self.topic.log
        if log_.lower is not None:
            deliveries = self._archive_pending(log_, deliveries)
            if not deliveries:
                return
        if self.max_attempts or self.topic.msg_ttl_ns:
            deliveries = screen(self, client, deliveries)
            if not deliveries:
                return
        chunks: list[bytes] = []
        total = 0
        try:
            for d in deliveries:
                if d.attempts == 1 and d.count >= 1:
                    offset, left = d.offset, d.count
                    while left:
                        r = log_.read(offset, MAX_READ_BYTES, left)
                        if not r.count:
                            break
                        chunks.append(r.data)
                        offset += r.count
                        left -= r.count
                        total += r.count
                else:
                    frame = log_.read_frame(d.offset)
                    chunks.append(patch_attempts(frame, d.attempts))
                    total += 1
        except LogError as exc:
            # e.g. an archived file turned unreadable (E_ARCHIVE_CORRUPT <file>): nothing is
            # sent, never garbage; the taken messages time out and are tried again
            log.error("TOPIC(%s) CHANNEL(%s): cannot deliver from offset %d - %s",
                      self.topic.name, self.name, deliveries[0].offset, exc)
            return
        if client.sample_rate:
            chunks = self._sample(client, chunks)
        if self.topic.tracer is not None:
            self.topic.tracer.delivered(self, client, deliveries)
        if client.extend_support:  # Youzan's ext layout: per-message frames, these clients only
            chunks = ext_frames(log_, deliveries, chunks)
        client.send_messages(chunks, total)

    def _sample(self, client: Session, chunks: list[bytes]) -> list[bytes]:
        """Drop (consume) the messages the client's sample_rate skips, as upstream does."""
        kept: list[bytes] = []
        for frame in split_frames(b"".join(chunks)):
            if random.randint(0, 99) > client.sample_rate:
                p, off = parse_id(frame[18:34])
                if p != self.topic.partition:  # an imported message's original id
                    off = self.imported_offset(client.id, p << 48 | off)
                if off >= 0:
                    self.cursor.finish(client.id, off)
            else:
                kept.append(frame)
        return kept

    def imported_offset(self, client_id: int, value: int) -> int:
        """The offset of an imported message by its original id (``nsqx import`` keeps Go's
        ids, see ``nsqx.storage.imported_ids``); -1 when ``value`` is not one.

        Looked up only for an id whose top 16 bits name no partition of the topic (the
        import records only such foreign ids), so nsqx's own ids never get here; a topic
        without an import answers with one attribute test. Go stores a message once per
        channel that owes it, with the same id: the offset this client holds in flight here
        is taken, else one in flight at all (the cursor says "not owner"), else the first."""
        imported = self.topic.log.imported
        if imported is None or value >> 48 < len(self.topic.partitions):
            return -1
        offsets = imported.offsets_of(value)
        if len(offsets) > 1:
            owners = [self.cursor.owner_of(o) for o in offsets]
            for want in (client_id, None):
                for o, owner in zip(offsets, owners, strict=True):
                    if owner == want or (want is None and owner is not None):
                        return o
        return offsets[0] if offsets else -1

    def record_finished(self, offset: int, count: int = 1) -> None:
        """e2e latency of a FIN (one sample stands for a batch of in-order FINs)."""
        if self.e2e is None:
            return
        log_ = self.topic.log
        if (log_.lower is not None
                and log_.ready_end(offset, self._archive_ready) <= offset):
            return  # archived and not decoded now: no sample rather than a wait
        try:
            frame = self.topic.log.read_frame(offset)
        except (KeyError, ValueError):
            return
        published = int.from_bytes(frame[8:16], "big")
        self.e2e.add(max(0, time.time_ns() - published), count)

    # -- timers --------------------------------------------------------------------------
    def tick(self, t_ms: int) -> None:
        """Called by the node's scanner: time out in-flight, release due deferred."""
        tracer = self.topic.tracer
        self.cursor.expired_log = [] if tracer is not None else None
        if self.cursor.expire(t_ms):
            if tracer is not None:
                tracer.timed_out(self, self.cursor.expired_log or ())
            self.dirty = True
            if len(self.topic.partitions) > 1:
                for ch in self.siblings():  # RDY room opened for clients of every partition
                    ch.wake()
        if self.cursor.pending_redeliveries(t_ms):
            self.wake()

    def close(self, *, persist: bool = True) -> None:
        """Shutting down: write the changed cursor (unless its files go too) and close it."""
        self.exiting = True
        if persist and self.dirty:
            self.cursor.persist()
        self.cursor.close()

    def discard(self) -> None:
        """Deleted: close the cursor and remove its files (nothing is written)."""
        self.cursor.close()
        if self.cursor.state_path is not None:
            delete_cursor_files(Path(self.cursor.state_path))


def delete_cursor_files(path: Path) -> None:
    """Remove a cursor's file and its temporaries (``<name>*``)."""
    for p in path.parent.glob(path.name + "*"):
        try:
            p.unlink()
        except OSError:
            pass


def patch_attempts(frame: bytes, attempts: int) -> bytes:
    """Rebuild a stored frame for its redelivery number ``attempts``. Stored frames hold
    attempts 1, except those nsqx import moved from Go nsqd: they hold Go's count + 1, and
    redeliveries go on from it."""
    if frame[16:18] != b"\0\x01":
        attempts += int.from_bytes(frame[16:18], "big") - 1
    return b"".join((frame[:16], min(attempts, 0xFFFF).to_bytes(2, "big"), frame[18:]))


def split_frames(data: bytes) -> list[bytes]:
    """Cut a run of message frames apart (only for the rare sampled path)."""
    out = []
    pos, n = 0, len(data)
    while pos < n:
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(data[pos : pos + 4 + size])
        pos += 4 + size
    return out
