"""Message tracing: a traced topic's message lifecycle, recorded in the durable topic ``__trace``.

A topic is traced when its switch is on (``POST /topic/trace?topic=&enable=true``, kept in
``nsqd.dat``); then ``Topic.tracer`` is this node's :class:`TraceRecorder`, else None, so
the publish, delivery, FIN/REQ, timeout and dead-letter paths pay one None check when the
topic is not traced.

Each event is one message of ``__trace``: a JSON object (the format Spark's trace report
and ``/trace/search`` read, see docs/design-notes.md)::

    {"ts": <ns>, "event": "pub"|"deliver"|"fin"|"req"|"timeout"|"dlq", "topic": "...",
     "partition": <n>, "offset": <n>, "id": "<16 hex>", "node": "<host:http port>",
     "trace_id": <n>,                 pub only, when the message has a ##trace_id
     "producer": "<remote addr>",     pub only
     "channel": "...",                all but pub
     "client": {"id": <n>, "addr": "<remote addr>"},   deliver, fin, req, dlq
     "attempts": <n>,                 deliver (this attempt), timeout and dlq (attempts made)
     "delay_ms": <n>}                 req only

Events are built as bytes from a per-call prefix (one ``%`` format per message, no dict or
JSON encoder per message) and appended to a buffer; the buffer is published to ``__trace``
once per loop turn (``call_soon``), one commit for everything that turn traced, never an
await per message. The ``__trace`` topic itself is never traced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from nsqx.httpbase import TRACE_SCAN_DEFAULT, TRACE_SCAN_MAX
from nsqx.protocol.v2 import TRACE_ID_KEY, TRACE_TOPIC
from nsqx.storage.imported_ids import locate_all as locate_imported

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import ChannelView, NodeContext, TopicView
    from nsqx.storage.cursor import Delivery

log = logging.getLogger("nsqx.nsqd.trace")

__all__ = ["TRACE_TOPIC", "TraceRecorder", "search_trace"]

DEFAULT_SCAN = TRACE_SCAN_DEFAULT  # events /trace/search reads (the newest), unless told
MAX_SCAN = TRACE_SCAN_MAX
MAX_MESSAGES = 100  # messages a header search collects
_READ_BYTES = 4 << 20

Done = Callable[[int, Exception | None], None]


def _q(s: str) -> bytes:
    return orjson.dumps(s)


def runs(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted offsets -> (first, count) of each run of consecutive ones."""
    n = len(offsets)
    if not n:
        return []
    a = offsets[0]
    if offsets[-1] - a == n - 1 and (n < 3 or offsets == list(range(a, a + n))):
        return [(a, n)]  # the usual case, checked in C
    out: list[tuple[int, int]] = []
    start = prev = a
    for o in offsets[1:]:
        if o != prev + 1:
            out.append((start, prev - start + 1))
            start = o
        prev = o
    out.append((start, prev - start + 1))
    return out


class TraceRecorder:
    """The node's trace buffer: events in, one ``__trace`` publish per loop turn out."""

    def __init__(self, nsqd: NodeContext) -> None:
        self.nsqd = nsqd
        self._buf: list[bytes] = []
        # FINs of this turn per (channel, client): merged into runs when flushed
        self._fins: dict[tuple[int, int], tuple[ChannelView, Any, list[int]]] = {}
        self._scheduled = False
        self._node = b""
        self.recorded = 0  # events handed to __trace
        self.failed = 0  # events whose publish failed (disk error, exiting)

    # -- switch --------------------------------------------------------------------------
    def set_traced(self, topic: TopicView, on: bool) -> None:
        """Trace every partition of ``topic`` (or stop); the caller persists nsqd.dat."""
        if topic.name == TRACE_TOPIC:
            raise ValueError("the trace topic itself cannot be traced")
        for part in topic.partitions:
            part.tracer = self if on else None
        log.info("TOPIC(%s): tracing %s", topic.name, "on" if on else "off")

    @property
    def node(self) -> bytes:
        """This node as events name it (JSON string bytes), broadcast address + HTTP port."""
        if not self._node:
            o = self.nsqd.opts
            self._node = _q(f"{o.broadcast_address}:{self.nsqd.http_port}")
        return self._node

    # -- buffer --------------------------------------------------------------------------
    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.nsqd.loop.call_soon(self.flush)

    def _add(self, events: list[bytes]) -> None:
        self._buf += events
        self._schedule()

    def flush(self) -> None:
        """Publish what this loop turn recorded as one batch of ``__trace``."""
        self._scheduled = False
        if self._fins:
            fins, self._fins = self._fins, {}
            for channel, client, offsets in fins.values():
                offsets.sort()
                self._ranges(b"fin", channel, client, runs(offsets))
        events, self._buf = self._buf, []
        if not events:
            return
        topic = self.nsqd.get_topic(TRACE_TOPIC)
        if topic is None:  # exiting
            self.failed += len(events)
            return
        n = len(events)

        def done(_base: int, exc: Exception | None) -> None:
            if exc is None:
                self.recorded += n
            else:
                self.failed += n
                log.error("TOPIC(%s): %d trace events lost: %s", TRACE_TOPIC, n, exc)

        topic.publish(events, 0, done)

    # -- events --------------------------------------------------------------------------
    def _head(self, event: bytes, topic: TopicView, extra: bytes = b"") -> bytes:
        """The fields every event of one call shares, as a JSON object's first part."""
        return b'{"ts":%d,"event":"%s","topic":%s,"partition":%d,"node":%s%s' % (
            time.time_ns(), event, _q(topic.name), topic.partition, self.node, extra)

    @staticmethod
    def _client(client: Any) -> bytes:
        return b',"client":{"id":%d,"addr":%s}' % (client.id, _q(client.remote_address))

    @staticmethod
    def _event(head: bytes, hi: int, off: int, count: int, tail: bytes = b"") -> bytes:
        if count == 1:
            return b'%s,"offset":%d,"id":"%016x"%s}' % (head, off, hi | off, tail)
        return b'%s,"offset":%d,"count":%d,"id":"%016x"%s}' % (head, off, count, hi | off, tail)

    def _ranges(self, event: bytes, channel: ChannelView, client: Any,
                ranges: Iterable[tuple[int, int]], extra: bytes = b"") -> None:
        topic = channel.topic
        who = self._client(client) if client is not None else b""
        head = self._head(event, topic, b',"channel":%s%s%s' % (_q(channel.name), who, extra))
        hi, ev = topic.partition << 48, self._event
        self._add([ev(head, hi, off, n) for off, n in ranges])

    def wrap_publish(self, topic: TopicView, headers: Sequence[dict[str, bytes] | None] | None,
                     count: int, producer: str, done: Done) -> Done:
        """A publish completion that records the ``pub`` event(s) once the batch is durable."""
        def traced(base: int, exc: Exception | None) -> None:
            if exc is None:
                self.published(topic, base, count, headers, producer)
            done(base, exc)
        return traced

    def published(self, topic: TopicView, base: int, count: int,
                  headers: Sequence[dict[str, bytes] | None] | None, producer: str) -> None:
        """One event for the batch; a message with a trace id gets its own (with it)."""
        head = self._head(b"pub", topic, b',"producer":%s' % _q(producer))
        hi, ev = topic.partition << 48, self._event
        if headers is None:
            self._add([ev(head, hi, base, count)])
            return
        out = []
        start = base
        for i, h in enumerate(headers):
            tid = h.get(TRACE_ID_KEY) if h else None
            if tid:
                off = base + i
                if start < off:
                    out.append(ev(head, hi, start, off - start))
                out.append(ev(head, hi, off, 1, b',"trace_id":%s' % tid))
                start = off + 1
        if start < base + count:
            out.append(ev(head, hi, start, base + count - start))
        self._add(out)

    def delivered(self, channel: ChannelView, client: Any, deliveries: Iterable[Delivery]) -> None:
        """One event per delivered run (a fresh run of many, or one redelivery)."""
        topic = channel.topic
        head = self._head(b"deliver", topic,
                          b',"channel":%s%s' % (_q(channel.name), self._client(client)))
        hi, ev = topic.partition << 48, self._event
        self._add([ev(head, hi, d.offset, d.count, b',"attempts":%d' % d.attempts)
                   for d in deliveries])

    def finished(self, channel: ChannelView, client: Any, offsets: Iterable[int]) -> None:
        """FINs are gathered per channel and client and merged into runs at the flush."""
        key = (id(channel), client.id)
        entry = self._fins.get(key)
        if entry is None:
            self._fins[key] = (channel, client, list(offsets))
            self._schedule()
        else:
            entry[2].extend(offsets)

    def requeued(self, channel: ChannelView, client: Any, offset: int, delay_ms: int) -> None:
        self._ranges(b"req", channel, client, ((offset, 1),), b',"delay_ms":%d' % delay_ms)

    def timed_out(self, channel: ChannelView, expired: Iterable[tuple[int, int, int]]) -> None:
        """``expired``: the cursor's (deadline, offset, attempts) of what timed out."""
        topic = channel.topic
        head = self._head(b"timeout", topic, b',"channel":%s' % _q(channel.name))
        hi, ev = topic.partition << 48, self._event
        by_attempts: dict[int, list[int]] = {}
        for _d, off, a in expired:
            by_attempts.setdefault(a, []).append(off)
        out = []
        for a, offs in by_attempts.items():
            offs.sort()
            out += [ev(head, hi, off, n, b',"attempts":%d' % a) for off, n in runs(offs)]
        self._add(out)

    def dead_lettered(self, channel: ChannelView, client_id: int,
                      dead: Iterable[tuple[int, int]]) -> None:
        """``dead``: (offset, attempts made) of messages moved to the dead-letter topic."""
        topic = channel.topic
        head = self._head(b"dlq", topic, b',"channel":%s' % _q(channel.name))
        hi, ev = topic.partition << 48, self._event
        self._add([ev(head, hi, off, 1, b',"attempts":%d,"client":{"id":%d}' % (a, client_id))
                   for off, a in dead])


# ------------------------------------------------------------------------------ search


def _frames(data: bytes | memoryview) -> Iterable[memoryview]:
    """Bodies of a run of stored frames."""
    view = memoryview(data)
    pos, n = 0, len(view)
    while pos + 4 <= n:
        size = int.from_bytes(view[pos:pos + 4], "big")
        yield view[pos + 34:pos + 4 + size]
        pos += 4 + size


def _scan(log_: Any, lo: int, hi: int) -> Iterable[memoryview]:
    off = lo
    while off < hi:
        r = log_.read(off, _READ_BYTES, hi - off)
        if not r.count:
            break
        yield from _frames(r.data)
        off = r.start + r.count


def _header_matches(topic: Any, key: str, value: bytes, limit: int) -> set[tuple[int, int]]:
    """(partition, offset) of the newest messages of ``topic`` whose header ``key`` is
    ``value``: the header sidecar of the last ``limit`` messages of each partition."""
    found: set[tuple[int, int]] = set()
    for part in topic.partitions:
        lg = part.log
        hi = lg.flushed_offset
        lo = max(lg.start_offset, hi - limit)
        for off, h in lg.headers_range(lo, hi).items():
            if h.get(key) == value:
                found.add((part.partition, off))
    if len(found) > MAX_MESSAGES:
        found = set(sorted(found, key=lambda k: k[1])[-MAX_MESSAGES:])
    return found


def search_trace(nsqd: NodeContext, topic_name: str, *, msg_id: tuple[int, int] | None = None,
                 trace_id: int | None = None, header: tuple[str, bytes] | None = None,
                 limit: int = DEFAULT_SCAN) -> dict[str, Any]:
    """The timelines of one topic's messages picked by id, trace id or a header value.

    A bounded scan, not an index: the newest ``limit`` events of ``__trace`` are read
    (``truncated`` says older ones exist), filtered by a byte test before any JSON is
    parsed. A header search reads the topic's header sidecar over its newest ``limit``
    messages per partition first. Messages are returned oldest first, each with its
    events in time order and, while the log still holds it, its headers and timestamp.
    """
    trace = nsqd.topics.get(TRACE_TOPIC)
    topic = nsqd.topics.get(topic_name)
    tq = b'"topic":' + _q(topic_name)
    keys: set[tuple[int, int]] | None = None
    if msg_id is not None:
        keys = {msg_id}
        if topic is not None and msg_id[0] >= len(topic.partitions):  # a Go id (nsqx import)
            # every copy (Go stored one per channel, all with this id)
            keys = set(locate_imported(((t.partition, t.log.imported) for t in topic.partitions),
                                       msg_id[0] << 48 | msg_id[1]))
    elif header is not None:
        keys = _header_matches(topic, header[0], header[1], limit) if topic is not None else set()
    events: dict[tuple[int, int], list[dict[str, Any]]] = {}
    scanned = 0
    lo = hi = 0
    if trace is not None and (keys is None or keys):
        lg = trace.log
        hi = lg.flushed_offset
        lo = max(lg.start_offset, hi - limit)
        if keys is None:  # by trace id: its pub events name the messages
            assert trace_id is not None
            keys = set()
            needle = b'"trace_id":%d}' % trace_id
            for body in _scan(lg, lo, hi):
                scanned += 1
                b = bytes(body)
                if needle in b and tq in b:
                    ev = orjson.loads(b)
                    if ev.get("topic") == topic_name and ev.get("trace_id") == trace_id:
                        keys.add((ev["partition"], ev["offset"]))
                        if len(keys) >= MAX_MESSAGES:
                            break
            scanned = 0
        # an event covers `count` offsets from `offset`: match by partition, then range
        wanted: dict[int, list[int]] = {}
        for p, o in keys:
            wanted.setdefault(p, []).append(o)
        parts = [(b'"partition":%d,' % p, p) for p in wanted]
        for body in _scan(lg, lo, hi):
            scanned += 1
            b = bytes(body)
            if tq not in b:
                continue
            p = next((q for needle, q in parts if needle in b), None)
            if p is None:
                continue
            ev = orjson.loads(b)
            if ev.get("topic") != topic_name or ev.get("partition") != p:
                continue
            first = ev.get("offset", -1)
            last = first + ev.get("count", 1)
            for o in wanted[p]:
                if first <= o < last:
                    events.setdefault((p, o), []).append(ev)
    messages = []
    for p, o in sorted(keys or (), key=lambda k: (k[1], k[0])):
        m: dict[str, Any] = {"partition": p, "offset": o, "id": "%016x" % ((p << 48) | o)}
        evs = sorted(events.get((p, o), ()), key=lambda e: e.get("ts", 0))
        part = topic.partitions[p] if topic is not None and p < len(topic.partitions) else None
        if part is not None and part.log.start_offset <= o < part.log.flushed_offset:
            frame = part.log.read_frame(o)
            m["timestamp"] = int.from_bytes(frame[8:16], "big")
            m["id"] = bytes(frame[18:34]).decode("ascii", "replace")  # Go's, if imported
            h = part.log.headers(o) or {}
            m["headers"] = {k: v.decode("utf-8", "replace") for k, v in h.items()}
            tid = h.get(TRACE_ID_KEY)
            if tid:
                m["trace_id"] = int(tid)
        if "trace_id" not in m:
            tids = [e["trace_id"] for e in evs if "trace_id" in e]
            if tids:
                m["trace_id"] = tids[0]
        m["events"] = evs
        messages.append(m)
    return {"topic": topic_name, "traced": bool(topic is not None and topic.tracer is not None),
            "scanned": scanned, "scan_from": lo, "scan_to": hi,
            "truncated": trace is not None and lo > trace.log.start_offset,
            "messages": messages}

