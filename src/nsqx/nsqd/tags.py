"""Tag dispatch (Youzan's ``##client_dispatch_tag`` / IDENTIFY ``desired_tag``).

Rules, as Youzan's channel applies them:

- a message whose ``##client_dispatch_tag`` header is T goes to the consumers that
  IDENTIFYed ``desired_tag: T`` while at least one of them is connected;
- any other message (no tag, or a tag nobody connected asked for) goes to the consumers
  without a tag;
- a tagged consumer gets only its tag's messages;
- a message whose consumers are all at their RDY limit, or (untagged case) that has no
  untagged consumer connected, waits. It waits *held*: taken from the cursor on the
  channel's behalf (in flight, owner ``DISPATCH``) and handed over as soon as a client of
  its group has room, so other groups keep going. At most ``HOLD_MAX`` messages are held
  per channel; then the channel waits (Youzan blocks at the first such message), so keep
  an untagged consumer connected when untagged traffic flows. A held message not handed
  over within ``HOLD_MS`` times out as any in-flight one (attempts + 1).

Cost: a channel runs this only while a tagged consumer is connected or messages are
held (``Channel.tags`` is None otherwise, the stock pump is untouched). Then each message
costs a header read (one per commit) and a per-offset hand-over in the cursor.
Ordered channels ignore tags (one message in flight already).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from nsqx.nsqd.headers import headers_of
from nsqx.protocol.v2 import DISPATCH_TAG_KEY
from nsqx.storage.cursor import Delivery, NotInFlight, NotOwner

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import ChannelView, Session

__all__ = ["DISPATCH", "HOLD_MAX", "TagDispatch"]

DISPATCH = -1  # the cursor owner of held messages (client ids start at 1)
HOLD_MAX = 1024
HOLD_MS = 3_600_000


class TagDispatch:
    """A channel's held messages: (offset, attempts, why, tag), in the order taken."""

    __slots__ = ("held", "_rr")

    def __init__(self) -> None:
        self.held: deque[tuple[int, int, str, str]] = deque()
        self._rr = 0

    def pump(self, ch: ChannelView, now: int, max_batch: int, end: int | None = None) -> bool:
        """One turn: take what the open RDY windows allow (fresh ones below ``end``, default
        the channel's end), hand messages to their group. Returns True when another turn
        should follow at once."""
        clients = list(ch.clients.values())
        groups: dict[str, list[Session]] = {}
        room: dict[int, int] = {}
        for c in clients:
            groups.setdefault(c.desired_tag, []).append(c)
            room[c.id] = max(0, c.ready_room())
        held = self.held
        want = min(sum(room.values()), max_batch, HOLD_MAX - len(held))
        took = 0
        if want > 0:
            deliveries = ch.take_held(DISPATCH, want, ch.end_offset() if end is None else end,
                                      now, HOLD_MS)
            if deliveries:
                hdrs = headers_of(ch.topic.log, deliveries)
                for d in deliveries:
                    for off in range(d.offset, d.offset + d.count):
                        h = hdrs.get(off)
                        tag = h.get(DISPATCH_TAG_KEY) if h else None
                        held.append((off, d.attempts, d.why, tag.decode() if tag else ""))
                        took += 1
        out: dict[int, list[Delivery]] = {}
        keep: deque[tuple[int, int, str, str]] = deque()
        self._rr += 1
        for item in held:
            off, attempts, why, tag = item
            group = groups.get(tag) if tag else None
            if group is None:
                group = groups.get("")
            target = None
            if group:
                n = len(group)
                for i in range(n):
                    c = group[(self._rr + i) % n]
                    if room[c.id] > 0:
                        target = c
                        break
            if target is None:
                keep.append(item)
                continue
            try:
                ch.hand_over(off, DISPATCH, target, now)
            except (NotInFlight, NotOwner):
                continue  # timed out, reset or emptied meanwhile
            room[target.id] -= 1
            out.setdefault(target.id, []).append(Delivery(off, 1, attempts, why))
        self.held = keep
        for cid, ds in out.items():
            ch.send(ch.clients[cid], ds)
        # room left and messages taken: take more next turn (what was taken may all have
        # gone to the held queue, and nothing else would wake the channel)
        return took > 0 and len(self.held) < HOLD_MAX and any(room.values())


def retag(ch: ChannelView) -> None:
    """After a client came or went: tag dispatch on while a tagged consumer is connected
    or messages are held (and never for ordered channels)."""
    tagged = not ch.ordered and any(c.desired_tag for c in ch.clients.values())
    if tagged and ch.tags is None:
        ch.tags = TagDispatch()
    elif not tagged and ch.tags is not None and not ch.tags.held:
        ch.tags = None
