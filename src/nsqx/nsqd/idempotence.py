"""Publish at most once: the check every idempotent publish passes on its partition's leader.

One mechanism for every way of publishing once (design-notes, "issue 33"): the batch's first
message carries a mark as an extension header, the mark is stored and replicated with the
batch, and :class:`~nsqx.storage.publish_keys.PublishKeys` indexes the marks of the log.

* ``nsqx-pub: <key>#<count>[#<fingerprint>]``: a key is appended once; a repeat answers
  the first append's offsets (the Spark sink's ``/nsqx/pub``, HTTP ``Idempotency-Key``, any
  ``PUB_EXT`` client). The same key with another fingerprint is refused (HTTP 422).
* ``##nsqx_producer: <id>:<epoch>:<seq>``: an idempotent producer (``nsqx.client``); per
  producer id the sequences on a partition follow each other: a sequence already stored is
  answered as stored, one still being written waits for it, a gap or an older epoch is
  refused with a clear error.

Only the node that appends checks (standalone, or the partition's leader); a follower
forwards the batch with its headers, so the leader checks it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from nsqx.nsqd.datapath import publish_keys_path
from nsqx.protocol.routes import key_partition
from nsqx.storage.publish_keys import (
    PRODUCER_HEADER,
    PUB_KEY_HEADER,
    PublishKeys,
    parse_key,
    parse_producer,
)

if TYPE_CHECKING:
    from nsqx.nsqd.topic import Topic

__all__ = ["Deduper", "IdempotenceError", "deduper_for", "fingerprint", "has_mark",
           "leads", "sticky_partition"]

log = logging.getLogger("nsqx.nsqd.idempotence")

CHECKPOINT_INTERVAL = 1.0

Done = Callable[[int, Exception | None], None]  # (base offset, error): Topic.publish's


class IdempotenceError(Exception):
    """A mark that cannot be admitted: ``code`` is the TCP error code, ``status`` the HTTP one."""

    def __init__(self, code: str, text: str, status: int) -> None:
        super().__init__(f"{code} {text}")
        self.code, self.text, self.status = code, text, status


def has_mark(headers: list[dict[str, bytes] | None] | None) -> bool:
    h = headers[0] if headers else None
    return bool(h) and (PUB_KEY_HEADER in h or PRODUCER_HEADER in h)  # type: ignore[operator]


def fingerprint(*parts: bytes) -> str:
    """What a keyed request is, for telling a retry from a different request reusing a key."""
    h = hashlib.blake2b(digest_size=12)
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.hexdigest()


def sticky_partition(topic: Any, headers: list[dict[str, bytes] | None]) -> int | None:
    """Where a producer's batch that names no partition goes on a topic of several: the
    partition its producer id hashes to, so one producer's sequences stay on one partition."""
    h = headers[0]
    raw = h.get(PRODUCER_HEADER) if h else None
    parts = topic.partitions
    if raw is None or len(parts) < 2 or topic.ordered:
        return None
    pid = bytes(raw).split(b":")[0]
    if topic.routes is not None:  # route-managed: one of the open partitions
        open_ = sorted(topic.routes.open)
        return open_[key_partition(pid, len(open_))] if open_ else None
    return key_partition(pid, len(parts))


def leads(part: Topic) -> bool:
    """This node appends to ``part`` itself (standalone or its leader): it checks marks.
    A follower forwards, marks and all, to the leader that checks them."""
    gate = part.gate
    return gate is None or not gate.forwards


def _committed(part: Any, end: int, base: int, done: Done) -> None:
    """Answer a repeat stored at [base, end) once it is acknowledged: at once standalone or
    below the high watermark; else when the leader's gate acks ``end`` (a failover's new
    leader holds its predecessor's unacknowledged tail; a repeat of a batch still waiting
    for the ISR is answered with it), or refused if leadership is lost first."""
    gate = part.gate
    if gate is None or not part.hold_reads or end <= part.readable_end:
        done(base, None)
        return
    gate.wrap(part, end, done)(base, None)


class _Pending:
    __slots__ = ("fp", "waiters")

    def __init__(self, fp: str, waiters: list[Done] | None = None) -> None:
        self.fp = fp
        # repeats that arrived while it was being written
        self.waiters: list[Done] = [] if waiters is None else waiters


class Deduper:
    """The idempotence check of one partition (see the module's docstring)."""

    def __init__(self, part: Any, keys: PublishKeys) -> None:
        self.part = part
        self.keys = keys
        self._keys_pending: dict[str, _Pending] = {}
        self._seq_pending: dict[tuple[str, int, int], _Pending] = {}
        self._accepted: dict[str, tuple[int, int]] = {}  # producer -> newest (epoch, seq) taken
        self._checkpoint: asyncio.TimerHandle | None = None
        self.replayed = 0  # publishes answered from the index instead of appended

    # -- admission -----------------------------------------------------------------------
    def publish(self, bodies: list[bytes], defer_ms: int,
                headers: list[dict[str, bytes] | None], done: Done, producer: str = "",
                repeat: Done | None = None) -> bool:
        """Append the batch unless its mark says it is stored; ``done(base, exc)`` once it
        is. Returns whether this is a repeat (answered from the index, nothing appended);
        a repeat is answered through ``repeat`` instead of ``done`` when one is given (so
        an answer made before this returns can still say it: a forwarder asked).

        Raises :class:`IdempotenceError` (nothing appended, ``done`` not called) for a
        malformed mark, a key reused for another request, a sequence gap, a fenced epoch."""
        h0 = headers[0] or {}
        # the whole local log: a new leader's tail above the high watermark came from its
        # predecessor and may hold the first copy of a retry (a hit there waits for its ack)
        keys = self.keys
        end = self.part.log.flushed_offset
        if end > keys.covered:  # (catch_up's own test, without its call when all is indexed)
            keys.catch_up(end)
        raw = h0.get(PRODUCER_HEADER)
        if raw is not None:
            return self._sequenced(raw, bodies, defer_ms, headers, done, producer, repeat)
        raw = h0.get(PUB_KEY_HEADER)
        assert raw is not None
        return self._keyed(raw, bodies, defer_ms, headers, done, producer, repeat)

    def _keyed(self, raw: bytes, bodies: list[bytes], defer_ms: int,
               headers: list[dict[str, bytes] | None], done: Done, producer: str,
               repeat: Done | None) -> bool:
        parsed = parse_key(raw)
        if parsed is None or parsed[1] != len(bodies):
            raise IdempotenceError("E_BAD_IDEMPOTENCY_KEY",
                                   f"{PUB_KEY_HEADER} must be <key>#<message count>[#<fingerprint>]",
                                   400)
        key, count, fp = parsed
        hit = self.keys.get(key)
        if hit is not None:
            _same_request(fp, hit[2], count, hit[1])
            self.replayed += 1
            _committed(self.part, hit[0] + hit[1], hit[0], repeat or done)
            return True
        pending = self._keys_pending.get(key)
        if pending is not None:
            _same_request(fp, pending.fp, count, count)
            pending.waiters.append(repeat or done)
            self.replayed += 1
            return True
        pending = self._keys_pending[key] = _Pending(fp)
        h0 = headers[0]

        def finished(base: int, exc: Exception | None) -> None:
            self._keys_pending.pop(key, None)
            if exc is None:
                self.keys.acked(base, len(bodies), h0)
                self._dirty()
            done(base, exc)
            for w in pending.waiters:
                w(base, exc)
        self._append(bodies, defer_ms, headers, finished, producer)
        return False

    def _sequenced(self, raw: bytes, bodies: list[bytes], defer_ms: int,
                   headers: list[dict[str, bytes] | None], done: Done, producer: str,
                   repeat: Done | None) -> bool:
        parsed = parse_producer(raw)
        if parsed is None:
            raise IdempotenceError("E_BAD_PRODUCER",
                                   f"{PRODUCER_HEADER} must be <id>:<epoch>:<sequence>", 400)
        pid, epoch, seq = parsed
        keys = self.keys
        st = keys.producer(pid)
        stored = (st.epoch, st.seq) if st is not None else None
        taken = self._accepted.get(pid)
        newest = stored if taken is None or (stored is not None and stored > taken) else taken
        if newest is None:
            if seq != 0:  # a retry may overtake the first batch: only 0 starts a producer
                raise IdempotenceError(
                    "E_OUT_OF_ORDER_SEQUENCE",
                    f"producer {pid} epoch {epoch}: expected sequence 0, got {seq} on "
                    f"partition {self.part.partition} (a producer this partition does not "
                    "know, or forgot after --idempotency-window, starts at 0)", 409)
        else:
            if epoch < newest[0]:
                raise IdempotenceError(
                    "E_PRODUCER_FENCED",
                    f"producer {pid} epoch {epoch} is fenced by epoch {newest[0]}", 409)
            if stored is not None and (epoch, seq) <= stored:
                assert st is not None
                self.replayed += 1
                _committed(self.part, st.base + st.count, st.base if seq == st.seq else -1,
                           repeat or done)
                return True
            pending = self._seq_pending.get((pid, epoch, seq))
            if pending is not None:
                self.replayed += 1
                pending.waiters.append(repeat or done)
                return True
            expected = newest[1] + 1 if epoch == newest[0] else 0
            if seq != expected:
                raise IdempotenceError(
                    "E_OUT_OF_ORDER_SEQUENCE",
                    f"producer {pid} epoch {epoch}: expected sequence {expected}, got {seq} "
                    f"on partition {self.part.partition}", 409)
        key = (pid, epoch, seq)
        waiters: list[Done] = []  # repeats that arrive while it is being written
        self._seq_pending[key] = _Pending("", waiters)
        self._accepted[pid] = (epoch, seq)
        # a partial, not a closure: no cells in this (per batch) function
        finished = partial(self._sequence_done, key, len(bodies), waiters, done)
        try:  # (_append)
            self.part.publish(bodies, defer_ms, finished, headers=headers, producer=producer)
        except Exception as exc:  # refused before anything was written
            finished(-1, exc)
        return False

    def _sequence_done(self, key: tuple[str, int, int], count: int, waiters: list[Done],
                       done: Done, base: int, exc: Exception | None) -> None:
        """The append of the batch ``key`` (producer, epoch, sequence) finished."""
        self._seq_pending.pop(key, None)
        pid, epoch, seq = key
        if exc is None:
            keys = self.keys
            keys.put_producer(pid, epoch, seq, base, count)
            if keys.covered == base:  # (keys.advance)
                keys.covered = base + count
            if self._checkpoint is None:
                self._dirty()
        elif self._accepted.get(pid, (-1, -1)) >= (epoch, seq):
            # not stored: the producer sends it again, with the same sequence
            self._accepted[pid] = (epoch, seq - 1)
        done(base, exc)
        for w in waiters:
            w(base, exc)

    def _append(self, bodies: list[bytes], defer_ms: int, headers: list[dict[str, bytes] | None],
                finished: Callable[[int, Exception | None], None], producer: str) -> None:
        try:
            self.part.publish(bodies, defer_ms, finished, headers=headers, producer=producer)
        except Exception as exc:  # refused before anything was written
            finished(-1, exc)

    # -- async use (HTTP) ----------------------------------------------------------------
    async def publish_async(self, bodies: list[bytes], defer_ms: int,
                            headers: list[dict[str, bytes] | None],
                            producer: str = "") -> tuple[int, bool]:
        """(base offset, replayed) once durable; the append's exception otherwise."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def done(base: int, exc: Exception | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(base)
        replayed = self.publish(bodies, defer_ms, headers, done, producer)
        return await fut, replayed

    # -- persistence ---------------------------------------------------------------------
    def _dirty(self) -> None:
        if self._checkpoint is None and self.keys.db is not None:
            loop = asyncio.get_running_loop()
            self._checkpoint = loop.call_later(CHECKPOINT_INTERVAL, self._write_checkpoint)

    def _write_checkpoint(self) -> None:
        self._checkpoint = None
        try:
            self.keys.checkpoint()
        except Exception as exc:  # the log stays the truth: recovery reads further back
            log.error("TOPIC(%s) PARTITION(%d): idempotence checkpoint failed: %s",
                      self.part.name, self.part.partition, exc)

    def truncated(self, offset: int) -> None:
        """The log was cut at ``offset`` (a follower's diverged tail): forget its marks."""
        self.keys.forget_from(offset)
        self._accepted.clear()  # only a leader takes sequences; the index is the truth again

    def close(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint.cancel()
            self._checkpoint = None
        self.keys.close()


def _same_request(fp: str, stored_fp: str, count: int, stored_count: int) -> None:
    if (fp and stored_fp and fp != stored_fp) or count != stored_count:
        raise IdempotenceError(
            "E_IDEMPOTENCY_KEY_REUSED",
            "this idempotency key was already used for a different request (another body, "
            "topic or parameters) within the window; use a new key", 422)


def deduper_for(part: Topic) -> Deduper:
    """The partition's :class:`Deduper`, opened (and recovered from the log) on first use."""
    d: Deduper | None = part.dedupe
    if d is not None and d.keys.log is part.log:
        return d
    if d is not None:
        d.close()
    opts = part.nsqd.opts
    path = None
    if not part.ephemeral:
        path = publish_keys_path(part.dir, part.partition)
    keys = PublishKeys(path, part.log, window=float(opts.idempotency_window),
                       max_keys=int(opts.idempotency_max_keys),
                       max_producers=int(opts.idempotency_max_producers))
    d = Deduper(part, keys)
    part.dedupe = d
    return d

