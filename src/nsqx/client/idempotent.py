"""Idempotent publishing for nsqx.client: producer ids, epochs, sequences and the messages.

An idempotent producer marks the first message of every batch with the extension header
``##nsqx_producer: <id>:<epoch>:<sequence>``; the partition's leader stores the batch once
per sequence (``nsqx.nsqd.idempotence``). A *stream* is what one sequence counts: one
(nsqd address, topic, partition) for :class:`~nsqx.client.producer.Producer`, one (topic,
partition) for :class:`~nsqx.client.cluster.ClusterProducer` (the partition's state is
replicated, so a new leader continues it). Each stream has its own id, so streams never
share a counter. When a publish is given up (its outcome unknown), the stream starts a new
epoch at sequence 0: the leader then accepts the next sequence without a gap, and refuses
the old epoch's stragglers (``E_PRODUCER_FENCED``).
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Hashable, Iterable, Mapping

from nsqx.protocol import v2
from nsqx.storage.publish_keys import PRODUCER_HEADER

__all__ = ["PRODUCER_HEADER", "RETRY_CODES", "Sequences", "ext_headers", "mark_command"]

# answers after which an idempotent publish is sent again with the same sequence
RETRY_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_FAILED_ON_NOT_LEADER",
                         "E_OUT_OF_ORDER_SEQUENCE"})


class Sequences:
    """The (id, epoch, next sequence) of each stream of one producer."""

    def __init__(self) -> None:
        self._base = secrets.token_hex(8)
        self._streams: dict[Hashable, list] = {}  # key -> [id, epoch, next]

    def next(self, stream: Hashable) -> bytes:
        """The mark of the stream's next batch (``id:epoch:seq``), counted now."""
        s = self._streams.get(stream)
        if s is None:
            s = self._streams[stream] = [f"{self._base}.{len(self._streams)}", 0, 0]
        seq = s[2]
        s[2] += 1
        return f"{s[0]}:{s[1]}:{seq}".encode()

    def give_up(self, stream: Hashable, mark: bytes) -> None:
        """A batch whose outcome is unknown: the stream continues in a new epoch (once)."""
        s = self._streams.get(stream)
        if s is not None and mark.split(b":")[1] == b"%d" % s[1]:
            s[1] += 1
            s[2] = 0


def ext_headers(headers: Mapping[str, bytes | str] | None, tag: str | None,
                trace_id: int | None) -> dict[str, bytes | str] | None:
    """User headers plus the reserved ones for a tag and a trace id (checked here, so a bad
    value fails before it is sent)."""
    out: dict[str, bytes | str] = dict(headers) if headers else {}
    for k in out:
        if not isinstance(k, str) or not k or k in _RESERVED:
            raise ValueError(f"invalid header name {k!r}")
    if tag is not None:
        if not v2.valid_tag(tag):
            raise ValueError(f"invalid tag {tag!r}: 1..100 of [a-zA-Z0-9_-]")
        out[v2.DISPATCH_TAG_KEY] = tag
    if trace_id is not None:
        if not 0 <= trace_id < 1 << 64:
            raise ValueError("trace_id must be a uint64")
        out[v2.TRACE_ID_KEY] = str(trace_id)
    return out or None


def mark_command(topic: str, bodies: list[bytes], partition: int | None,
                 headers: Mapping[str, bytes | str] | None, mark: bytes | None,
                 multi: bool, route_version: int | None = None) -> bytes:
    """PUB_EXT / MPUB_EXT with the headers on every message and the mark on the first;
    plain PUB / MPUB when there is neither. ``route_version``: a route-managed topic's
    (after the partition, as v2.pub's)."""
    if mark is None and not headers:
        return (v2.mpub(topic, bodies, partition, route_version) if multi
                else v2.pub(topic, bodies[0], partition, route_version))
    first: Mapping[str, bytes | str] | bytes
    if headers:
        first = {**headers, PRODUCER_HEADER: mark} if mark is not None else headers
    else:
        first = b'{"%s":"%s"}' % (PRODUCER_HEADER.encode(), mark)
    if route_version is not None:  # a routed publish: the general builders
        if not multi:
            return v2.pub_ext(topic, bodies[0], first, partition, route_version)
        return v2.mpub_ext(topic, [(first, bodies[0]), *((headers, b) for b in bodies[1:])],
                           partition, route_version)
    if not multi:
        if not headers and partition is None:  # the idempotent one-at-a-time PUB
            body = bodies[0]
            return b"".join((b"PUB_EXT ", topic.encode(), b"\n",
                             _SIZE_NOHDR.pack(len(body) + 2 + len(first), len(first)),
                             first, body))  # type: ignore[arg-type]
        return v2.pub_ext(topic, bodies[0], first, partition)
    if not headers:  # the common batch: only the mark, on the first message
        return _mpub_ext_marked(topic, bodies, partition, first)  # type: ignore[arg-type]
    rest: Iterable[tuple[Mapping[str, bytes | str] | bytes | None, bytes]] = (
        (headers, b) for b in bodies[1:])
    return v2.mpub_ext(topic, [(first, bodies[0]), *rest], partition)


_SIZE_NOHDR = struct.Struct(">IH")
# headers a caller may not set: the client sets them (nsqd takes the last two off)
_RESERVED = frozenset({PRODUCER_HEADER, v2.DEFER_KEY, v2.ASK_REPLAYED_KEY})


def _mpub_ext_marked(topic: str, bodies: list[bytes], partition: int | None,
                     mark_json: bytes) -> bytes:
    """``MPUB_EXT`` whose only header is the first message's (what v2.mpub_ext builds, with
    one pack per message instead of a header encoding: batched ingest's hot path).

    Bodies of one length (the common batch) are written with one separator join whose
    first element is everything up to the first body's end: one copy of the batch."""
    head = (b"MPUB_EXT %s\n" % topic.encode() if partition is None
            else b"MPUB_EXT %s %d\n" % (topic.encode(), partition))
    n = len(bodies)
    first_len = 2 + len(mark_json) + len(bodies[0])
    rest = bodies[1:]
    if rest and len(set(map(len, rest))) == 1:  # one separator (mpub_body's way)
        size = len(rest[0])
        sep = _SIZE_NOHDR.pack(size + 2, 0)
        total = 8 + first_len + (n - 1) * (6 + size)
        return sep.join([head + _HEAD3.pack(total, n, first_len, len(mark_json)) + mark_json
                         + bodies[0], *rest])
    first = struct.pack(">H", len(mark_json)) + mark_json + bodies[0]
    parts = [struct.pack(">II", 0, n), struct.pack(">I", len(first)), first]
    pack = _SIZE_NOHDR.pack
    for b in rest:
        parts.append(pack(len(b) + 2, 0))
        parts.append(b)
    body = b"".join(parts)
    return head + struct.pack(">I", len(body) - 4) + body[4:]


_HEAD3 = struct.Struct(">IIIH")  # MPUB_EXT's size, count, first message's size, JSON length
