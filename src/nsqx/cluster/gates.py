"""The write gates a cluster member attaches to its local partitions (nsqd's ``Topic.gate``).

nsqd asks a topic's gate whether a publish or a consumer is admitted and wraps the
publish's completion with it; the cluster decides: the leader's gate admits publishes and
acks them once every ISR member has them, a follower's forwards them to the leader, and a
topic the cluster never created refuses them with how to create it.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from operator import itemgetter
from typing import Any, Protocol

from nsqx.cluster.forward import forward_command
from nsqx.cluster.model import PartitionMeta
from nsqx.cluster.replication import LeaderProgress, epoch_spans
from nsqx.nsqd.topic import PublishRefused

__all__ = ["FollowerGate", "GateOwner", "LeaderGate", "PublishForwarder", "UnknownTopicGate",
           "refused"]


class PublishForwarder(Protocol):
    """What a follower's gate hands a client publish to (the member's forwarding)."""

    def forward(self, topic: Any, bodies: list[bytes], defer_ms: int,
                headers: list[dict[str, bytes] | None] | None, command: bytes,
                done: Callable, on_replayed: Callable[[], None] | None = None) -> bool: ...


class GateOwner(Protocol):
    """What a leader's gate reads of its member."""

    node_id: str
    lag_timeout: float


_END = itemgetter(0)  # a waiter's end offset: LeaderGate.waiters is kept sorted by it


def refused(topic: Any, why: str) -> Exception:
    return PublishRefused(f"TOPIC({topic.name}) PARTITION({topic.partition}): {why}")


class FollowerGate:
    """Client publishes go to the leader; this replica only copies it.

    A publish that reaches a follower is forwarded to the leader over NSQ's own protocol
    and acknowledged when the leader acknowledges it (after the leader's ISR), so a stock
    producer pointed at any node of the cluster works. A partitioned topic's publish goes
    to the leader of the partition this node picked (``PUB <topic> <partition>``), headers
    and trace ids included (``PUB_EXT``/``MPUB_EXT``/``MPUB_TRACE``); a deferred one (DPUB
    names no partition) to the leader, which spreads it over the partitions it leads.
    """

    forwards = True

    def __init__(self, leader: str | None, member: PublishForwarder | None = None) -> None:
        self.leader = leader
        self.member = member

    def forward(self, topic: Any, bodies: list[bytes], defer_ms: int, done: Callable,
                headers: list[dict[str, bytes] | None] | None = None,
                on_replayed: Callable[[], None] | None = None) -> bool:
        if self.member is None:  # a leader may exist by the time the forward retries
            return False
        # (a deferred batch with headers, an idempotent one's mark, goes as PUB_EXT with
        # its delay as a header and its partition: DPUB carries neither)
        partition = topic.partition if len(topic.partitions) > 1 or topic.ordered else None
        command = forward_command(topic.name, partition, bodies, defer_ms, headers,
                                  ask_replayed=on_replayed is not None)
        return self.member.forward(topic, bodies, defer_ms, headers, command, done,
                                   on_replayed)

    def refuse(self, topic: Any, count: int) -> str | None:
        return (f"TOPIC({topic.name}) PARTITION({topic.partition}): this node is not the "
                f"leader (leader: {self.leader or 'none'})")

    def wrap(self, topic: Any, end_offset: int, done: Callable) -> Callable:
        return done

    def refuse_consumers(self, topic: Any) -> str | None:
        return self.refuse(topic, 0)


class UnknownTopicGate:
    """A topic the cluster has not created: refused, with how to create it."""

    forwards = False

    def __init__(self, root: str) -> None:
        self.root = root

    def forward(self, *_args: Any) -> bool:
        return False  # refused: the topic must be created first

    def refuse(self, topic: Any, count: int) -> str | None:
        return (f"TOPIC({topic.name}): not created in the cluster ({self.root}); create it "
                f"with `nsqx topic create` or nsqlookupd's /topic/create")

    def wrap(self, topic: Any, end_offset: int, done: Callable) -> Callable:
        return done

    def refuse_consumers(self, topic: Any) -> str | None:
        return None  # consumers may come first; a role change later moves them


class LeaderGate:
    """Admits publishes while this node leads with enough in-sync replicas; acks after ISR."""

    def __init__(self, member: GateOwner, topic: Any, meta: PartitionMeta, min_isr: int) -> None:
        self.member = member
        self.topic = topic
        self.meta = meta
        self.min_isr = min_isr
        self.progress = LeaderProgress(set(meta.isr), lag_timeout=member.lag_timeout)
        # (end offset, base, done), sorted by end: release() stops at the first not acked
        self.waiters: list[tuple[int, int, Callable]] = []
        self.active = True
        self.new_data = asyncio.Event()
        self.last_cursor_sent: dict[str, float] = {}
        self._last_read: tuple | None = None  # (offset, end, max_bytes, data, count)
        # the log's epoch history, read once; this epoch starts at the current end
        self.spans = epoch_spans(topic.log)
        if not self.spans or self.spans[-1][0] != meta.epoch:
            self.spans.append((meta.epoch, topic.log.next_offset))

    def refuse(self, topic: Any, count: int) -> str | None:
        if not self.active:
            return f"TOPIC({topic.name}) PARTITION({topic.partition}): leadership lost"
        if len(self.meta.isr) < self.min_isr:
            return (f"TOPIC({topic.name}) PARTITION({topic.partition}): only "
                    f"{len(self.meta.isr)} in-sync replicas, {self.min_isr} needed")
        return None

    def wrap(self, topic: Any, end_offset: int, done: Callable) -> Callable:
        def committed(base: int, exc: Exception | None) -> None:
            if exc is not None:
                done(base, exc)
                return
            if not self.active:
                done(base, refused(topic, "leadership lost before replication"))
                return
            w = self.waiters
            if w and end_offset < w[-1][0]:  # a repeat of an earlier batch (idempotence)
                bisect.insort(w, (end_offset, base, done), key=_END)
            else:  # appends arrive in log order: the list stays sorted by end
                w.append((end_offset, base, done))
            self.new_data.set()
            self.release()
        return committed

    def refuse_consumers(self, topic: Any) -> str | None:
        return None if self.active else self.refuse(topic, 0)

    forwards = False

    def forward(self, *_args: Any) -> bool:
        return False  # this node leads: a refusal stands

    def read(self, offset: int, max_bytes: int) -> tuple[Any, int]:
        """Frames from offset to the flushed end (up to max_bytes) and their count; the
        followers usually ask for the same range, so the last read is shared (reading
        several chunks joins them: one copy of the frames, not one per follower)."""
        plog = self.topic.log
        end = plog.flushed_offset
        last = self._last_read
        if last is not None and last[0] == offset and last[1] == end and last[2] == max_bytes:
            return last[3], last[4]
        r = plog.read(offset, max_bytes, end - offset)
        self._last_read = (offset, end, max_bytes, r.data, r.count)
        return r.data, r.count

    def acked_end(self) -> int:
        return self.progress.acked_end(self.topic.log.flushed_offset, self.member.node_id)

    def release(self) -> None:
        """Acknowledge what every ISR member has; first let channels read up to it."""
        hw = self.acked_end()
        if hw > self.topic.readable_end and self.active:
            self.topic.advance_readable(hw)  # the high watermark: consumers see acked only
        if not self.waiters:
            return
        if len(self.meta.isr) < self.min_isr:
            # the ISR shrank under the waiting appends: acking them now would be unsafe
            waiters, self.waiters = self.waiters, []
            why = f"only {len(self.meta.isr)} in-sync replicas, {self.min_isr} needed"
            for _end, base, done in waiters:
                done(base, refused(self.topic, why))
            return
        if self.waiters[0][0] > hw:
            return
        keep = []
        for end, base, done in self.waiters:
            if end <= hw:
                done(base, None)
            else:
                keep.append((end, base, done))
        self.waiters = keep

    def refuse_waiting(self, why: str) -> None:
        """Fail the publishes waiting for replication (they may still be in the log)."""
        waiters, self.waiters = self.waiters, []
        for _end, base, done in waiters:
            done(base, refused(self.topic, why))

    def on_meta(self, meta: PartitionMeta) -> None:
        self.meta = meta
        self.progress.isr = set(meta.isr)
        self.release()

    def deposed(self, why: str) -> None:
        self.active = False
        waiters, self.waiters = self.waiters, []
        for _end, base, done in waiters:
            done(base, refused(self.topic, why))
        self.new_data.set()
