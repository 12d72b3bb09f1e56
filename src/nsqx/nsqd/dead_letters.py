"""Server-side give-up and expiry, applied where a channel hands messages to a client.

- **Max attempts** (``--max-attempts``, per channel ``/channel/config?max_attempts=``): a
  message about to be delivered for the (N+1)-th time is not sent; it is published to the
  dead-letter topic ``<topic>.dlq`` with headers naming where it came from (its own headers,
  if any, are kept) and how its last attempt ended (``dlq_reason``: ``timeout`` or ``req``,
  from the cursor), and finished on its channel only once that publish is durable (if it fails, the message stays in flight,
  times out and is tried again: nothing is lost).
- **TTL** (``--msg-ttl``, per topic ``/topic/config?ttl=``): a message published longer ago
  than the TTL is finished unseen and counted as expired.

Cost when neither is set: nothing (the channel does not call in). With a TTL: one frame
read per fresh run (timestamps grow with offsets, so a run whose first message is young is
young throughout); only expired runs are searched, by bisection, not walked.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from nsqx.protocol.names import EPHEMERAL_SUFFIX, valid_topic_name
from nsqx.storage.cursor import Delivery

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import ChannelView

log = logging.getLogger("nsqx.nsqd.channel")

__all__ = ["dlq_topic_name", "screen"]

DLQ_SUFFIX = ".dlq"


def dlq_topic_name(topic: str) -> str | None:
    """``<topic>.dlq`` when that is a valid NSQ topic name (64 characters at most)."""
    base = topic.removesuffix(EPHEMERAL_SUFFIX)
    name = base + DLQ_SUFFIX
    return name if valid_topic_name(name) else None


def _ts(frame: bytes) -> int:
    return int.from_bytes(frame[8:16], "big")


def screen(channel: ChannelView, client: Any, deliveries: list[Delivery]) -> list[Delivery]:
    """The deliveries to send; the rest are dead-lettered or expired here."""
    topic = channel.topic
    log_ = topic.log
    ttl_ns = topic.msg_ttl_ns
    max_att = channel.max_attempts
    cutoff = time.time_ns() - ttl_ns if ttl_ns else 0
    keep: list[Delivery] = []
    expired: list[int] = []
    dead: list[tuple[int, int, str, bytes]] = []  # (offset, attempts so far, why, frame)
    for d in deliveries:
        if d.attempts > 1 or d.count == 1:
            frame = None
            if max_att and d.attempts > max_att:
                frame = log_.read_frame(d.offset)
                dead.append((d.offset, d.attempts - 1, d.why, frame))
                continue
            if cutoff:
                frame = log_.read_frame(d.offset)
                if _ts(frame) < cutoff:
                    expired.append(d.offset)
                    continue
            keep.append(d)
            continue
        if not cutoff or _ts(log_.read_frame(d.offset)) >= cutoff:
            keep.append(d)
            continue
        lo, hi = d.offset, d.offset + d.count  # first young offset in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if _ts(log_.read_frame(mid)) < cutoff:
                lo = mid + 1
            else:
                hi = mid
        expired.extend(range(d.offset, lo))
        if lo < d.offset + d.count:
            keep.append(Delivery(lo, d.offset + d.count - lo, 1))
    if expired:
        channel.finish_held(client.id, expired)
        channel.expired_count += len(expired)
        log.info("TOPIC(%s) CHANNEL(%s): %d messages older than the TTL skipped (client %s)",
                 topic.name, channel.name, len(expired), client)
    if dead:
        _dead_letter(channel, client.id, dead)
    return keep


def _dead_letter(channel: ChannelView, client_id: int,
                 dead: list[tuple[int, int, str, bytes]]) -> None:
    topic = channel.topic
    name = dlq_topic_name(topic.name)
    nsqd = topic.nsqd
    dlq = nsqd.get_topic(name) if name is not None else None
    if dlq is None:
        log.error("TOPIC(%s) CHANNEL(%s): no dead-letter topic possible (name too long or "
                  "exiting): %d messages over max attempts stay in flight", topic.name,
                  channel.name, len(dead))
        return
    log_ = topic.log
    bodies = [frame[34:] for *_, frame in dead]
    headers: list[dict[str, bytes] | None] = [
        {**(log_.headers(off) or {}),
         "dlq_topic": topic.name.encode(), "dlq_channel": channel.name.encode(),
         "dlq_partition": b"%d" % topic.partition,
         # the id consumers saw: nsqx's, or Go's for a message nsqx import moved
         "dlq_id": bytes(frame[18:34]), "dlq_attempts": b"%d" % attempts,
         "dlq_reason": (why or "unknown").encode()}
        for off, attempts, why, frame in dead]
    offsets = [off for off, *_ in dead]

    def done(_base: int, exc: Exception | None) -> None:
        if exc is not None:
            log.error("TOPIC(%s) CHANNEL(%s): dead-lettering %d messages to %s failed (%s); "
                      "they time out and are tried again", topic.name, channel.name,
                      len(offsets), name, exc)
            return
        channel.finish_held(client_id, offsets)
        if topic.tracer is not None:
            topic.tracer.dead_lettered(channel, client_id, [(off, att) for off, att, *_ in dead])
        channel.dlq_count += len(offsets)
        channel.wake()
        log.warning("TOPIC(%s) CHANNEL(%s): %d messages over %d attempts moved to %s",
                    topic.name, channel.name, len(offsets), channel.max_attempts, name)

    dlq.publish(bodies, 0, done, headers=headers)
