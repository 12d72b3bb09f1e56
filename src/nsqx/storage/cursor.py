"""A channel is a cursor over its topic partition's log: integer offsets only, no copies.

State (everything below ``confirmed`` is finished)::

    confirmed <= ... finished / in flight / ready / deferred ... < next_read <= unread ...

* In flight, fresh: one ``_Run`` per delivered contiguous chunk (start, end, owner, deadline).
  In-order FIN pops the lowest offset of the head run in O(1) with no per-message dict.
  Out-of-order FIN only adds the offset to ``_fin`` (the set of finished offsets above
  ``confirmed``); REQ/TOUCH of a run member moves it to ``run.moved`` (and TOUCH re-adds it
  as a per-offset ``_Entry``).  A run member is in flight iff it is >= ``run.lo``,
  >= ``confirmed``, not in ``_fin`` and not in ``run.moved``.
* In flight, redelivered (or touched): per-offset ``_Entry`` in ``_entries``.
* Timeouts: one heap item per run / entry (coarse: one deadline per delivered chunk),
  stale items skipped lazily, heap rebuilt when mostly stale.
* Ready (requeued with delay 0, timed out, deferred whose time came): heap of offsets,
  served lowest offset first and before any fresh offset.
* Deferred: ``DelayStore`` (memory heap, SQLite for long/many).  DPUB offsets not read yet
  are also kept in ``_skip`` (a sorted int64 array) so fresh reads jump over them per chunk.
* Finished ranges above ``next_read`` (after a reload, or a DPUB finished before the reader
  got there) live in sorted parallel lists ``_rs``/``_re``; fresh reads jump over them too.
"""

from __future__ import annotations

import heapq
import struct
import sys
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nsqx.storage.checksum import crc32
from nsqx.storage.delaystore import DelayStore
from nsqx.storage.fileio import write_durably

__all__ = ["REQ", "TIMEOUT", "ChannelCursor", "Delivery", "NotInFlight", "NotOwner", "DelayStore"]

_MAGIC = b"NSQXCUR1"
_HEAD = struct.Struct("<8sqIII")  # magic, confirmed, flags, n_ranges, n_deferred
_CRC = struct.Struct("<I")
_FLAG_PAUSED = 1
_PROMOTE_LIMIT = 10_000


class NotInFlight(Exception):
    """FIN/REQ/TOUCH of an offset that is not in flight (upstream: "ID not in flight")."""

    def __init__(self, msg: str = "ID not in flight") -> None:
        super().__init__(msg)


class NotOwner(Exception):
    """FIN/REQ/TOUCH by a client that does not hold the message (upstream wording)."""

    def __init__(self, msg: str = "client does not own message") -> None:
        super().__init__(msg)


TIMEOUT = "timeout"
REQ = "req"


@dataclass(slots=True)
class Delivery:
    """``count`` offsets from ``offset``; count > 1 only for fresh runs (attempts 1).

    ``why`` is how a redelivery's previous attempt ended (``TIMEOUT`` or ``REQ``; "" for
    fresh messages or when not known, e.g. after a restart): dead letters report it.
    """

    offset: int
    count: int
    attempts: int
    why: str = ""


class _Run:
    """A fresh chunk delivered to one client; members share the deadline."""

    __slots__ = ("start", "lo", "end", "live", "owner", "deadline", "sent_at", "moved")

    def __init__(self, start: int, end: int, owner: int, deadline: int, sent_at: int) -> None:
        self.start = start
        self.lo = start  # lowest member that may still be in flight (normalised)
        self.end = end
        self.live = end - start
        self.owner = owner
        self.deadline = deadline
        self.sent_at = sent_at
        self.moved: set[int] | None = None  # members requeued / touched out of the run


class _Entry:
    """One redelivered (or touched) in-flight offset."""

    __slots__ = ("owner", "deadline", "attempts", "sent_at")

    def __init__(self, owner: int, deadline: int, attempts: int, sent_at: int) -> None:
        self.owner = owner
        self.deadline = deadline
        self.attempts = attempts
        self.sent_at = sent_at


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ChannelCursor:
    """Delivery state of one channel over one partition log (see module docstring)."""

    def __init__(
        self,
        start_offset: int,
        *,
        state_path: str | Path | None = None,
        delay_store: DelayStore | None = None,
    ) -> None:
        self.state_path = Path(state_path) if state_path is not None else None
        # snapshots are numbered; one written off the event loop (nsqd's persist pass) must
        # never replace a newer one written meanwhile (a reset persists at once)
        self._persist_lock = threading.Lock()
        self._snap_gen = 0
        self._written_gen = 0
        if delay_store is None:
            dpath = None if self.state_path is None else Path(f"{self.state_path}.delays")
            delay_store = DelayStore(dpath)
        self._store = delay_store
        self.paused = False
        self.confirmed = start_offset
        self.next_read = start_offset
        self._fin: set[int] = set()
        self._rs: list[int] = []
        self._re: list[int] = []
        self._runs: list[_Run] = []
        self._rstarts: list[int] = []
        self._rh = 0  # index of the head (lowest live) run
        self._dead = 0  # dead runs above the head
        self._entries: dict[int, _Entry] = {}
        self._timers: list[tuple[int, int, int, object]] = []  # (deadline, seq, offset|-1, obj)
        self._seq = 0
        # Redeliveries in the order they came back (upstream's FIFO memory queue): each
        # waits behind the fresh messages already written when it came back (its gate,
        # the log end then), unless those are more than redelivery_window away (a backlog
        # upstream would have read from disk, which it does not wait for).
        self._ready: deque[tuple[int, int, int]] = deque()  # (gate, offset, token)
        self._ready_att: dict[int, int] = {}  # offset -> attempts so far
        self._ready_tok: dict[int, int] = {}  # offset -> token of its live queue entry
        # how the last attempt of a ready/deferred offset ended (TIMEOUT / REQ), for
        # dead letters; set when it leaves flight, taken when it is delivered again
        self._why: dict[int, str] = {}
        self._rtok = 0
        self._end = start_offset  # newest log end seen (take / note_end)
        self.redelivery_window = 10_000  # nsqd sets --mem-queue-size
        # ordered channels: a deferred (delayed-REQ) message holds back everything after it
        self.strict = False
        self._skip = array("q")
        self._sk_h = 0
        self._cif: dict[int, int] = {}  # client id -> in-flight count
        self._gone_clients: set[int] = set()  # dropped clients still owning messages
        self._dropped = 0  # left flight without FIN/REQ/timeout (empty, reset, skip_to)
        self._head: _Run | None = None  # == _runs[_rh] (cached for the FIN fast path)
        self.requeue_count = 0
        self.timeout_count = 0
        self.delivered_count = 0
        self.finish_count = 0
        self._now = 0  # last clock value seen (for defer() without now_ms)
        # when a list, expire() appends its (deadline, offset, attempts) (message tracing)
        self.expired_log: list[tuple[int, int, int]] | None = None
        self._closed = False
        # Called once when the cursor gets a timer (an in-flight deadline, a deferral, a
        # redelivery) while not armed, so the node's scanner visits only channels with
        # something due instead of every channel every tick; the scanner disarms it.
        self.on_armed: Callable[[], None] | None = None
        self.armed = False
        if self.state_path is not None and self.state_path.exists():
            self._load(self.state_path)
        else:
            self._reconcile_store()

    # ------------------------------------------------------------------ counters
    @property
    def in_flight_count(self) -> int:
        return (
            self.delivered_count
            - self.finish_count
            - self.requeue_count
            - self.timeout_count
            - self._dropped
        )

    @property
    def message_count(self) -> int:
        return self.delivered_count

    @property
    def deferred_count(self) -> int:
        return len(self._store)

    @property
    def ready_count(self) -> int:
        return len(self._ready_att)

    @property
    def delay_store(self) -> DelayStore:
        return self._store

    def in_flight_of(self, client_id: int) -> int:
        return self._cif.get(client_id, 0)

    def owner_of(self, offset: int) -> int | None:
        """The client holding ``offset`` in flight, None when it is not in flight."""
        e = self._entries.get(offset)
        if e is not None:
            return e.owner
        run = self._find_run(offset)
        return None if run is None else run.owner

    def drop_client(self, client_id: int) -> int:
        """Upstream: a gone client's messages stay in flight (owned, so a FIN from another
        client still gets NotOwner) until they time out; its counter is forgotten then."""
        n = self._cif.get(client_id, 0)
        if n:
            self._gone_clients.add(client_id)
        else:
            self._cif.pop(client_id, None)
        return n

    # ------------------------------------------------------------------ delivery
    def take(
        self, client_id: int, max_count: int, end_offset: int, now_ms: int, timeout_ms: int
    ) -> list[Delivery]:
        """Up to max_count messages in upstream's order: fresh offsets < end_offset and
        redeliveries, each redelivery behind the fresh messages written before it came back."""
        if self.paused or max_count <= 0:
            return []
        self._now = now_ms
        if end_offset > self._end:
            self._end = end_offset
        deadline = now_ms + timeout_ms
        out: list[Delivery] = []
        n = max_count
        st = self._store
        if len(st) and (st.next_ready_ms() or 0) <= now_ms:
            self._promote(now_ms)
        if self.strict and len(st) and not self._ready_att:
            return out  # ordered: nothing passes a message waiting out its REQ delay
        if not self._ready_att:
            self._take_fresh(client_id, n, end_offset, now_ms, deadline, out)
            return out
        while n > 0:
            gate = self._front_gate()
            if gate is not None and (gate <= self.next_read or end_offset <= self.next_read
                                     or gate - self.next_read > self.redelivery_window):
                n = self._take_ready(client_id, n, now_ms, deadline, out, end_offset)
                continue
            limit = end_offset if gate is None else min(end_offset, gate)
            got = self._take_fresh(client_id, n, limit, now_ms, deadline, out)
            n -= got
            if gate is None or (not got and self.next_read < limit):
                break
        return out

    def take_one(self, client_id: int, end_offset: int, now_ms: int, timeout_ms: int,
                 floor: int) -> int:
        """``take(client_id, 1, ...)`` when the next message is fresh and nothing else can
        come first (no redelivery, deferral, skip or finished range ahead, next_read at or
        above ``floor``, the log's start): returns the offset taken, or -2 when there is
        nothing to take (take would return []). -1: not that case, nothing changed (call
        take)."""
        pos = self.next_read
        if (self.paused or self._ready_att or len(self._store) or pos < floor
                or self._sk_h < len(self._skip) or (self._re and self._re[-1] > pos)):
            return -1
        self._now = now_ms
        if end_offset > self._end:
            self._end = end_offset
        if pos >= end_offset:
            return -2
        self._add_run(client_id, pos, pos + 1, now_ms + timeout_ms, now_ms)
        self.next_read = pos + 1
        cif = self._cif
        cif[client_id] = cif.get(client_id, 0) + 1
        self.delivered_count += 1
        return pos

    def _take_fresh(self, client_id: int, n: int, end_offset: int, now_ms: int, deadline: int,
                    out: list[Delivery]) -> int:
        pos = self.next_read
        if not n or pos >= end_offset:
            return 0
        if self._sk_h >= len(self._skip) and (not self._re or self._re[-1] <= pos):
            stop = min(end_offset, pos + n)
            self._add_run(client_id, pos, stop, deadline, now_ms)
            out.append(Delivery(pos, stop - pos, 1))
            got = stop - pos
            self.next_read = stop
        else:
            got = self._take_fresh_slow(client_id, n, end_offset, now_ms, deadline, out)
        if got:
            self._cif[client_id] = self._cif.get(client_id, 0) + got
            self.delivered_count += got
        return got

    def note_end(self, end_offset: int) -> None:
        """The log grew to end_offset: a redelivery from now on waits behind it.

        Called once per group commit before the publishes are acknowledged, so the delay
        store writes this turn's DPUB deferrals here, in one transaction."""
        if end_offset > self._end:
            self._end = end_offset
        self._store.flush()

    def next_redelivery(self) -> int | None:
        """The offset of the ready redelivery ``take`` hands out first (None: none ready)."""
        if not self._ready_att or self._front_gate() is None:
            return None
        return self._ready[0][1]

    def _front_gate(self) -> int | None:
        ready, att, tok = self._ready, self._ready_att, self._ready_tok
        while ready:
            gate, off, t = ready[0]
            if off in att and tok.get(off) == t:
                return gate
            ready.popleft()  # stale: deferred, reset or skipped meanwhile
        return None

    def _add_run(self, owner: int, start: int, stop: int, deadline: int, now_ms: int) -> None:
        run = _Run(start, stop, owner, deadline, now_ms)
        self._runs.append(run)
        self._rstarts.append(start)
        if self._head is None:
            self._head = run
        self._seq += 1
        heapq.heappush(self._timers, (deadline, self._seq, -1, run))
        if not self.armed:
            self._arm()

    def _take_fresh_slow(
        self, owner: int, n: int, end: int, now_ms: int, deadline: int, out: list[Delivery]
    ) -> int:
        skip, rs, re_ = self._skip, self._rs, self._re
        pos = self.next_read
        sh = bisect_left(skip, pos, self._sk_h)
        ri = bisect_right(re_, pos)  # first range ending after pos
        got = 0
        while n and pos < end:
            if ri < len(rs) and rs[ri] <= pos:
                pos = re_[ri]
                ri += 1
                continue
            if sh < len(skip) and skip[sh] == pos:
                # jump over a block of consecutive deferred offsets in O(log n)
                base = skip[sh] - sh
                lo, hi = sh, len(skip) - 1
                while lo < hi:
                    mid = (lo + hi + 1) >> 1
                    if skip[mid] - mid == base:
                        lo = mid
                    else:
                        hi = mid - 1
                pos = skip[lo] + 1
                sh = lo + 1
                continue
            stop = min(end, pos + n)
            if ri < len(rs) and rs[ri] < stop:
                stop = rs[ri]
            if sh < len(skip) and skip[sh] < stop:
                stop = skip[sh]
            self._add_run(owner, pos, stop, deadline, now_ms)
            out.append(Delivery(pos, stop - pos, 1))
            n -= stop - pos
            got += stop - pos
            pos = stop
        self.next_read = max(self.next_read, pos)
        self._trim_skip()
        return got

    def _trim_skip(self) -> None:
        skip = self._skip
        sh = bisect_left(skip, self.next_read, self._sk_h)
        if sh > 4096 and sh * 2 > len(skip):
            del skip[:sh]
            sh = 0
        elif sh == len(skip) and sh:
            del skip[:]
            sh = 0
        self._sk_h = sh

    def _take_ready(
        self, owner: int, n: int, now_ms: int, deadline: int, out: list[Delivery],
        end_offset: int,
    ) -> int:
        """Redeliveries from the front while their gate allows; returns what n is left."""
        ready, att, tok = self._ready, self._ready_att, self._ready_tok
        why = self._why
        entries = self._entries
        timers = self._timers
        nr, window = self.next_read, self.redelivery_window
        got = 0
        while n and ready:
            gate, off, t = ready[0]
            a = att.get(off)
            if a is None or tok.get(off) != t:
                ready.popleft()  # stale item
                continue
            if gate > nr and end_offset > nr and gate - nr <= window:
                break  # fresh messages written before it came back go first
            ready.popleft()
            del att[off]
            del tok[off]
            a += 1
            e = _Entry(owner, deadline, a, now_ms)
            entries[off] = e
            self._seq += 1
            heapq.heappush(timers, (deadline, self._seq, off, e))
            out.append(Delivery(off, 1, a, why.pop(off, "")))
            n -= 1
            got += 1
        if got:
            self._cif[owner] = self._cif.get(owner, 0) + got
            self.delivered_count += got
            if not self.armed:
                self._arm()
        if len(ready) > 2 * len(att) + 1024:
            self._ready = deque(i for i in ready if i[1] in att and tok.get(i[1]) == i[2])
            self._ready_tok = {i[1]: i[2] for i in self._ready}
        if len(why) > 2 * (len(att) + len(self._store)) + 1024:
            st = self._store  # drop reasons of offsets dropped meanwhile (reset, retention)
            self._why = {o: w for o, w in why.items() if o in att or o in st}
        return n

    def _promote(self, now_ms: int) -> None:
        st = self._store
        if not len(st):
            return
        nr = st.next_ready_ms()
        if nr is None or nr > now_ms:
            return
        for off, a in st.pop_due(now_ms, _PROMOTE_LIMIT):
            self._push_ready(off, a)

    def _push_ready(self, off: int, attempts: int) -> None:
        if not self.armed:
            self._arm()
        self._ready_att[off] = attempts
        self._rtok += 1
        self._ready_tok[off] = self._rtok
        self._ready.append((self._end, off, self._rtok))

    # ------------------------------------------------------------------ FIN
    def finish(self, client_id: int, offset: int) -> None:
        """FIN: the offset is done for this channel.  Raises NotInFlight / NotOwner."""
        if not self.finish_head(client_id, offset):
            self._finish_slow(client_id, offset)

    def finish_head(self, client_id: int, offset: int) -> bool:
        """``finish`` for the in-order case only (the lowest live member of the head run,
        owned by client_id): True when done; False, with nothing changed, for every other
        case (``_finish_slow`` does those, or raises)."""
        run = self._head
        if run is None or offset != run.lo or run.owner != client_id:
            return False
        # in-order fast path: the lowest live member of the head run
        run.live -= 1
        self._cif[client_id] -= 1
        self.finish_count += 1
        if offset == self.confirmed:
            self.confirmed = c = offset + 1
            if (self._fin and c in self._fin) or (self._rs and self._rs[0] == c):
                self._advance()
        else:
            self._fin.add(offset)
        if run.live:
            run.lo = offset + 1
            if self._fin or run.moved:
                self._norm(run)
        else:
            timers = self._timers
            if timers and timers[0][3] is run:  # its timer is stale now: drop it in C
                heapq.heappop(timers)  # (one in flight: no Python pass over it later)
            self._pop_heads()
        return True

    def _finish_slow(self, client_id: int, offset: int) -> None:
        e = self._entries.get(offset)
        if e is not None:
            if e.owner != client_id:
                raise NotOwner
            del self._entries[offset]
            self._left_flight(client_id)
            self.finish_count += 1
            self._mark_finished(offset)
            # redeliveries of due delays are finished one by one: without this their timers
            # stayed until the deadline (~180 B each, 30 MiB at 16k msgs/s for 10 s)
            self._maybe_compact_timers()
            return
        run = self._find_run(offset)
        if run is None:
            raise NotInFlight
        if run.owner != client_id:
            raise NotOwner
        self._left_flight(client_id)
        self.finish_count += 1
        self._mark_finished(offset)
        self._run_lost(run, offset, finished=True)

    def finish_many(self, client_id: int, offsets: list[int]) -> list[tuple[int, Exception]]:
        """FIN a batch; contiguous in-order stretches cost O(1) Python work per run.

        Returns the (offset, error) pairs that failed (empty when all succeeded).
        """
        errors: list[tuple[int, Exception]] = []
        i, n = 0, len(offsets)
        runs = self._runs
        while i < n:
            h = self._rh
            if h < len(runs):
                run = runs[h]
                lo = run.lo
                if offsets[i] == lo and run.owner == client_id and not run.moved and not self._fin:
                    # the head run's members from lo are all live: take the contiguous stretch
                    k = min(n - i, run.end - lo)
                    if (
                        k > 1
                        and offsets[i + k - 1] == lo + k - 1
                        and (offsets[i : i + k] == list(range(lo, lo + k)))
                    ):
                        self._finish_block(run, client_id, lo, k)
                        i += k
                        continue
            try:
                self.finish(client_id, offsets[i])
            except (NotInFlight, NotOwner) as exc:
                errors.append((offsets[i], exc))
            i += 1
        return errors

    def _finish_block(self, run: _Run, client_id: int, lo: int, k: int) -> None:
        run.live -= k
        self._cif[client_id] -= k
        self.finish_count += k
        if lo == self.confirmed:
            self.confirmed = c = lo + k
            if self._rs and self._rs[0] == c:
                self._advance()
        else:
            self._fin.update(range(lo, lo + k))
        if run.live:
            run.lo = lo + k
        else:
            self._pop_heads()

    # ------------------------------------------------------------------ REQ / TOUCH
    def requeue(self, client_id: int, offset: int, delay_ms: int, now_ms: int) -> None:
        """REQ: back to the ready queue (delay 0) or deferred until now+delay."""
        self._now = now_ms
        attempts = self._take_out(client_id, offset)
        self.requeue_count += 1
        self._why[offset] = REQ
        if delay_ms <= 0:
            self._push_ready(offset, attempts)
        else:
            self._store.add(offset, now_ms + delay_ms, attempts, now_ms=now_ms)
            self._store.flush()  # no group commit follows a REQ: write it now
            self._arm()

    def touch(
        self,
        client_id: int,
        offset: int,
        now_ms: int,
        timeout_ms: int,
        max_deadline_ms: int | None = None,
        *,
        max_msg_timeout_ms: int | None = None,
    ) -> None:
        """TOUCH: deadline = now+timeout, capped at max_deadline_ms (absolute) and at
        delivery time + max_msg_timeout_ms (upstream's cap; the cursor knows delivery time)."""
        self._now = now_ms
        deadline = now_ms + timeout_ms
        if max_deadline_ms is not None:
            deadline = min(deadline, max_deadline_ms)
        e, created = self._owned_entry(offset, client_id)
        if max_msg_timeout_ms is not None:
            deadline = min(deadline, e.sent_at + max_msg_timeout_ms)
        if deadline != e.deadline or created:
            e.deadline = deadline
            self._schedule(offset, e)

    def reassign(self, offset: int, owner: int, to: int, deadline: int, now_ms: int) -> None:
        """Hand ``owner``'s in-flight offset to client ``to`` with a new deadline (tag
        dispatch takes messages on the channel's behalf, then picks the client). Attempts
        are unchanged; raises NotInFlight / NotOwner."""
        self._now = now_ms
        e, _ = self._owned_entry(offset, owner)
        e.owner, e.deadline, e.sent_at = to, deadline, now_ms
        self._cif[owner] -= 1
        self._cif[to] = self._cif.get(to, 0) + 1
        self._schedule(offset, e)

    def _owned_entry(self, offset: int, owner: int) -> tuple[_Entry, bool]:
        """(the entry of in-flight ``offset`` held by ``owner``, whether it was created now):
        an offset inside a run gets an entry of its own, split out of the run (attempts 1,
        the run's deadline and delivery time). Raises NotInFlight / NotOwner."""
        e = self._entries.get(offset)
        if e is not None:
            if e.owner != owner:
                raise NotOwner
            return e, False
        run = self._find_run(offset)
        if run is None:
            raise NotInFlight
        if run.owner != owner:
            raise NotOwner
        e = _Entry(owner, run.deadline, 1, run.sent_at)
        self._entries[offset] = e
        self._run_lost(run, offset)
        return e, True

    def _schedule(self, offset: int, e: _Entry) -> None:
        """A timer at ``e.deadline``; one pushed before for another deadline is stale then."""
        self._seq += 1
        heapq.heappush(self._timers, (e.deadline, self._seq, offset, e))
        self._maybe_compact_timers()
        self._arm()

    def _take_out(self, client_id: int, offset: int) -> int:
        """Remove an in-flight offset owned by client_id; returns its attempts so far."""
        e = self._entries.get(offset)
        if e is not None:
            if e.owner != client_id:
                raise NotOwner
            del self._entries[offset]
            self._left_flight(client_id)
            return e.attempts
        run = self._find_run(offset)
        if run is None:
            raise NotInFlight
        if run.owner != client_id:
            raise NotOwner
        self._left_flight(client_id)
        self._run_lost(run, offset)
        return 1

    # ------------------------------------------------------------------ DPUB
    def defer(self, offset: int, ready_at_ms: int, now_ms: int | None = None) -> None:
        """DPUB: the offset is not delivered before ready_at_ms.

        For an offset already delivered: in flight -> ignored; ready or deferred -> (re)deferred
        keeping its attempts; finished -> ignored.  ``now_ms`` (default: the last clock value
        the cursor saw, else wall clock) only picks the memory or disk tier.
        """
        now = now_ms if now_ms is not None else (self._now or _wall_ms())
        if offset < self.confirmed or self._is_finished(offset):
            return
        if offset in self._entries or self._find_run(offset) is not None:
            return
        if not self.armed:
            self._arm()
        st = self._store
        a = self._ready_att.pop(offset, None)
        if a is not None:
            st.add(offset, ready_at_ms, a, now_ms=now)
            return
        if offset >= self.next_read:
            skip = self._skip
            i = bisect_left(skip, offset, self._sk_h)
            if i == len(skip) or skip[i] != offset:
                skip.insert(i, offset)
                st.add(offset, ready_at_ms, 0, now_ms=now)
                return
        old = st.remove(offset)
        if old is not None:
            st.add(offset, ready_at_ms, old[1], now_ms=now)

    # ------------------------------------------------------------------ timeouts
    def expire(self, now_ms: int) -> int:
        """In-flight past their deadline -> ready queue; returns how many timed out.

        Those timing out together go back ordered by (deadline, offset), as upstream's
        in-flight priority queue hands them back.
        """
        self._now = now_ms
        timers = self._timers
        back: list[tuple[int, int, int]] = []  # (deadline, offset, attempts)
        while timers and timers[0][0] <= now_ms:
            d, _s, off, obj = heapq.heappop(timers)
            if off < 0:
                run = obj
                assert isinstance(run, _Run)
                if run.live:
                    back.extend((d, o, 1) for o in self._expire_run(run))
            else:
                e = self._entries.get(off)
                if e is obj and e.deadline == d:
                    del self._entries[off]
                    self._left_flight(e.owner)
                    back.append((d, off, e.attempts))
        back.sort()
        if self.expired_log is not None:
            self.expired_log += back
        why = self._why
        for _d, off, attempts in back:
            self._push_ready(off, attempts)
            why[off] = TIMEOUT
        n = len(back)
        self.timeout_count += n
        if self._gone_clients:
            for cid in [c for c in self._gone_clients if not self._cif.get(c)]:
                self._gone_clients.discard(cid)
                self._cif.pop(cid, None)
        return n

    def _expire_run(self, run: _Run) -> list[int]:
        fin, moved, c = self._fin, run.moved, self.confirmed
        live = [
            o for o in range(max(run.lo, c), run.end) if o not in fin and not (moved and o in moved)
        ]
        run.live = 0
        run.moved = None
        self._cif[run.owner] -= len(live)
        self._run_died(run)
        return live

    def next_deadline_ms(self) -> int | None:
        """Earliest time something is due: an in-flight deadline or a deferred ready time."""
        timers = self._timers
        entries = self._entries
        while timers:
            d, _s, off, obj = timers[0]
            if off < 0:
                if obj.live:  # type: ignore[attr-defined]
                    break
            else:
                e = entries.get(off)
                if e is obj and e.deadline == d:
                    break
            heapq.heappop(timers)
        best = timers[0][0] if timers else None
        nr = self._store.next_ready_ms() if len(self._store) else None
        if nr is not None and (best is None or nr < best):
            best = nr
        return best

    def _arm(self) -> None:
        if not self.armed:
            self.armed = True
            if self.on_armed is not None:
                self.on_armed()

    def has_timers(self) -> bool:
        """Anything that a scanner must come back for: in flight, deferred or ready."""
        return bool(self._ready_att) or self.next_deadline_ms() is not None

    def pending_redeliveries(self, now_ms: int) -> bool:
        """Something is ready for redelivery now (requeued, timed out, or deferred and due)."""
        if self._ready_att:
            return True
        if not len(self._store):
            return False
        nr = self._store.next_ready_ms()
        return nr is not None and nr <= now_ms

    # ------------------------------------------------------------------ bookkeeping helpers
    def _left_flight(self, owner: int) -> None:
        self._cif[owner] -= 1

    def _find_run(self, offset: int) -> _Run | None:
        """The run holding ``offset`` if the offset is in flight in it."""
        if offset < self.confirmed:
            return None
        i = bisect_right(self._rstarts, offset, self._rh) - 1
        if i < self._rh:
            return None
        run = self._runs[i]
        if (
            run.live
            and run.lo <= offset < run.end
            and offset not in self._fin
            and not (run.moved and offset in run.moved)
        ):
            return run
        return None

    def _run_lost(self, run: _Run, offset: int, finished: bool = False) -> None:
        """A member left the run (finished out of order, requeued, touched).

        Finished members are recognised through ``_fin``/``confirmed``; only requeued or
        touched ones need recording in ``run.moved``.
        """
        run.live -= 1
        if not run.live:
            run.moved = None
            self._run_died(run)
            return
        if offset != run.lo:
            if not finished:
                if run.moved is None:
                    run.moved = set()
                run.moved.add(offset)
        else:
            run.lo = offset + 1
            self._norm(run)

    def _norm(self, run: _Run) -> None:
        lo, end, fin, mv, c = run.lo, run.end, self._fin, run.moved, self.confirmed
        while lo < end and (lo < c or lo in fin or (mv is not None and lo in mv)):
            if mv is not None:
                mv.discard(lo)
            lo += 1
        run.lo = lo

    def _run_died(self, run: _Run) -> None:
        if self._rh < len(self._runs) and self._runs[self._rh] is run:
            self._pop_heads()
        else:
            self._dead += 1
            if self._dead > 1024 and self._dead * 2 > len(self._runs) - self._rh:
                live = [r for r in self._runs[self._rh :] if r.live]
                self._runs = live
                self._rstarts = [r.start for r in live]
                self._rh = 0
                self._dead = 0

    def _pop_heads(self) -> None:
        runs = self._runs
        h = self._rh + 1
        while h < len(runs) and not runs[h].live:
            h += 1
            self._dead -= 1
        if h == len(runs):
            runs.clear()
            self._rstarts.clear()
            h = 0
        elif h > 1024 and h * 2 > len(runs):
            del runs[:h]
            del self._rstarts[:h]
            h = 0
        self._rh = h
        self._head = runs[h] if h < len(runs) else None
        self._maybe_compact_timers()

    def _maybe_compact_timers(self) -> None:
        timers = self._timers
        if len(timers) > 4096 and len(timers) > 4 * (
            len(self._runs) - self._rh + len(self._entries)
        ):
            fresh: list[tuple[int, int, int, object]] = []
            for r in self._runs[self._rh :]:
                if r.live:
                    self._seq += 1
                    fresh.append((r.deadline, self._seq, -1, r))
            for off, e in self._entries.items():
                self._seq += 1
                fresh.append((e.deadline, self._seq, off, e))
            heapq.heapify(fresh)
            self._timers = fresh

    # ------------------------------------------------------------------ finished set
    def _mark_finished(self, offset: int) -> None:
        if offset == self.confirmed:
            self.confirmed = offset + 1
            self._advance()
        elif offset >= self.next_read:
            # a DPUB offset finished before the reader got there: keep it as a range
            self._add_range(offset, offset + 1)
            self._drop_skip(offset)
        else:
            self._fin.add(offset)

    def _advance(self) -> None:
        """Move confirmed over finished offsets/ranges that now touch it."""
        c = self.confirmed
        fin, rs, re_ = self._fin, self._rs, self._re
        while True:
            if fin and c in fin:
                fin.discard(c)
                c += 1
            elif rs and rs[0] <= c:
                c = max(c, re_[0])
                del rs[0]
                del re_[0]
            else:
                break
        self.confirmed = c
        if c > self.next_read:
            self.next_read = c
            self._trim_skip()

    def _add_range(self, a: int, b: int) -> None:
        rs, re_ = self._rs, self._re
        i = bisect_left(re_, a)  # first range ending at/after a (touching)
        j = bisect_right(rs, b)  # ranges starting at/before b touch too
        if i < j:
            a = min(a, rs[i])
            b = max(b, re_[j - 1])
        rs[i:j] = [a]
        re_[i:j] = [b]

    def _drop_skip(self, offset: int) -> None:
        skip = self._skip
        i = bisect_left(skip, offset, self._sk_h)
        if i < len(skip) and skip[i] == offset:
            del skip[i]

    def mark_finished_range(self, start: int, end: int) -> None:
        """Count the unread offsets [start, end) as finished, so this channel never gets them.

        For an offline writer (``nsqx import``: one log holds every channel's own backlog,
        each channel skips the others'); persisted like any finished range.
        """
        if start < self.next_read or end < start:
            raise ValueError(f"range [{start}, {end}) is not above next_read {self.next_read}")
        if end > start:
            self._add_range(start, end)
            self._advance()

    def _is_finished(self, offset: int) -> bool:
        if offset < self.confirmed or offset in self._fin:
            return True
        i = bisect_right(self._rs, offset) - 1
        return i >= 0 and offset < self._re[i]

    def finished_ranges(self) -> list[tuple[int, int]]:
        """Finished [start, end) ranges above confirmed, merged and sorted."""
        pairs: list[tuple[int, int]] = []
        if self._fin:
            it = iter(sorted(self._fin))
            a = b = next(it)
            for o in it:
                if o == b + 1:
                    b = o
                else:
                    pairs.append((a, b + 1))
                    a = b = o
            pairs.append((a, b + 1))
        if self._rs:
            pairs.extend(zip(self._rs, self._re, strict=True))
            pairs.sort()
        merged: list[tuple[int, int]] = []
        for a, b in pairs:
            if merged and a <= merged[-1][1]:
                if b > merged[-1][1]:
                    merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return merged

    # ------------------------------------------------------------------ stats / admin
    def depth(self, end_offset: int) -> int:
        """Messages neither finished nor in flight nor deferred (upstream's depth)."""
        unread = 0
        pos = self.next_read
        if end_offset > pos:
            unread = end_offset - pos
            rs, re_ = self._rs, self._re
            for i in range(bisect_right(re_, pos), len(rs)):
                if rs[i] >= end_offset:
                    break
                unread -= min(re_[i], end_offset) - max(rs[i], pos)
            skip = self._skip
            unread -= bisect_left(skip, end_offset, self._sk_h) - bisect_left(skip, pos, self._sk_h)
        return max(0, unread) + len(self._ready_att)

    def _clear_flight(self) -> None:
        self._dropped += self.in_flight_count
        self._head = None
        self._runs = []
        self._rstarts = []
        self._rh = 0
        self._dead = 0
        self._entries = {}
        self._timers = []
        self._ready = deque()
        self._ready_att = {}
        self._ready_tok = {}
        self._why = {}
        self._cif = {}
        self._gone_clients = set()

    def empty(self, end_offset: int) -> None:
        """Everything < end_offset finished; in-flight, ready and deferred below it dropped."""
        end = max(end_offset, self.confirmed)
        above = sorted(o for o in self._fin if o >= end)
        self._clear_flight()
        self._store.discard_range(0, end)
        self._fin = set()
        self._cut_ranges(end)
        for o in above:
            self._add_range(o, o + 1)
        # the reader restarts at end: anything above it that was in flight is read again
        self.confirmed = self.next_read = end
        self._advance()
        self._rebuild_skip()
        self._persist_if_durable()

    def reset(self, offset: int) -> None:
        """Replay from offset: everything >= offset is delivered again (unless still deferred).

        In flight and ready messages are dropped (a late FIN gets NotInFlight), finished
        ranges forgotten, deferred ones below offset dropped.
        """
        self._clear_flight()
        self._store.discard_range(0, offset)
        self._fin = set()
        self._rs = []
        self._re = []
        self.confirmed = self.next_read = offset
        self._rebuild_skip()
        self._persist_if_durable()

    def fit_log(self, end: int) -> int | None:
        """Resume at ``end`` when the cursor is past it; returns where it was (None: fits).

        Cursor snapshots are fsynced every persist pass, the log only every --sync-timeout:
        after a power loss the log can end below what the cursor says was consumed, and new
        messages written at those offsets would be skipped. Deferred entries past ``end``
        went with their messages.
        """
        if self.confirmed <= end:
            return None
        was = self.confirmed
        self._store.discard_range(end, 1 << 62)
        self.reset(end)
        return was

    def skip_to(self, offset: int) -> int:
        """Retention moved the log start to offset: everything below counts as gone.

        Returns how many unfinished messages were skipped.
        """
        if offset <= self.confirmed:
            return 0
        skipped = offset - self.confirmed
        skipped -= sum(1 for o in self._fin if o < offset)
        for a, b in zip(self._rs, self._re, strict=True):
            if a >= offset:
                break
            skipped -= min(b, offset) - a
        # drop in-flight / ready below offset
        for off in [o for o in self._entries if o < offset]:
            e = self._entries.pop(off)
            self._left_flight(e.owner)
            self._dropped += 1
        for run in self._runs[self._rh :]:
            if not run.live or run.start >= offset:
                continue
            for o in range(max(run.lo, self.confirmed), min(run.end, offset)):
                if o not in self._fin and not (run.moved and o in run.moved):
                    run.live -= 1
                    self._left_flight(run.owner)
                    self._dropped += 1
            run.lo = max(run.lo, offset)
            if not run.live:
                run.moved = None
                self._dead += 1
        self._pop_heads_from_scratch()
        for off in [o for o in self._ready_att if o < offset]:
            del self._ready_att[off]
        self._store.discard_range(0, offset)
        self._fin = {o for o in self._fin if o >= offset}
        self._cut_ranges(offset)
        self.confirmed = offset
        self.next_read = max(self.next_read, offset)
        self._advance()
        for run in self._runs[self._rh :]:
            if run.live:
                self._norm(run)
        self._trim_skip()
        self._persist_if_durable()
        return max(0, skipped)

    def _pop_heads_from_scratch(self) -> None:
        live = [r for r in self._runs[self._rh :] if r.live]
        self._runs = live
        self._rstarts = [r.start for r in live]
        self._rh = 0
        self._dead = 0
        self._head = live[0] if live else None

    def _cut_ranges(self, end: int) -> None:
        """Drop finished ranges below end (clipping one that straddles it)."""
        rs, re_ = self._rs, self._re
        i = bisect_right(re_, end)
        del rs[:i]
        del re_[:i]
        if rs and rs[0] < end:
            rs[0] = end

    def _rebuild_skip(self) -> None:
        self._skip = array("q", self._store.offsets(self.next_read))
        self._sk_h = 0

    def _reconcile_store(self) -> None:
        """Align a (possibly pre-existing) delay store with confirmed / finished state."""
        st = self._store
        if len(st):
            st.discard_range(0, self.confirmed)
            for a, b in zip(self._rs, self._re, strict=True):
                st.discard_range(a, b)
        self._rebuild_skip()

    # ------------------------------------------------------------------ persistence
    def persist(self) -> None:
        """Atomically write confirmed, finished ranges and in-memory deferred (tmp+fsync+rename)."""
        snap = self.snapshot()
        if snap is not None:
            self.write_snapshot(*snap)

    def snapshot(self) -> tuple[int, bytes] | None:
        """The state to persist, as bytes, numbered (event loop thread: it flushes the delay
        store); :meth:`write_snapshot` may then run in another thread."""
        if self.state_path is None:
            return None
        self._store.flush()  # the disk tier is its own store: written with the cursor state
        ranges = self.finished_ranges()
        deferred = self._store.memory_items()
        ra = array("q", [x for r in ranges for x in r])
        da = array("q", [x for d in deferred for x in d])
        if sys.byteorder != "little":
            ra.byteswap()
            da.byteswap()
        body = b"".join(
            (
                _HEAD.pack(
                    _MAGIC,
                    self.confirmed,
                    _FLAG_PAUSED if self.paused else 0,
                    len(ranges),
                    len(deferred),
                ),
                ra.tobytes(),
                da.tobytes(),
            )
        )
        data = body + _CRC.pack(crc32(body))
        self._snap_gen += 1
        return self._snap_gen, data

    def write_snapshot(self, gen: int, data: bytes) -> bool:
        """Write snapshot ``gen`` (tmp + fsync + rename + directory fsync), from any thread;
        False, and nothing written, if a newer one is already on disk."""
        path = self.state_path
        assert path is not None
        with self._persist_lock:
            if gen <= self._written_gen:
                return False
            write_durably(path, data)
            self._written_gen = gen
            return True

    def _persist_if_durable(self) -> None:
        if self.state_path is not None:
            self.persist()

    def _load(self, path: Path) -> None:
        data = path.read_bytes()
        if len(data) < _HEAD.size + _CRC.size:
            raise ValueError(f"cursor state {path}: truncated")
        body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
        if crc32(body) != crc:
            raise ValueError(f"cursor state {path}: checksum mismatch")
        magic, confirmed, flags, nr, nd = _HEAD.unpack_from(body)
        if magic != _MAGIC:
            raise ValueError(f"cursor state {path}: bad magic {magic!r}")
        pos = _HEAD.size
        ra = array("q")
        ra.frombytes(body[pos : pos + 16 * nr])
        pos += 16 * nr
        da = array("q")
        da.frombytes(body[pos : pos + 24 * nd])
        if sys.byteorder != "little":
            ra.byteswap()
            da.byteswap()
        self.confirmed = self.next_read = confirmed
        self.paused = bool(flags & _FLAG_PAUSED)
        for i in range(0, len(ra), 2):
            if ra[i + 1] > confirmed:
                self._add_range(max(ra[i], confirmed), ra[i + 1])
        self._advance()
        st = self._store
        items = []
        for i in range(0, len(da), 3):
            off = da[i]
            if off >= self.confirmed and not self._is_finished(off) and off not in st:
                items.append((off, da[i + 1], da[i + 2]))
        st.restore(items)
        self._reconcile_store()

    def close(self) -> None:
        """Persist (durable cursors) and close the delay store; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._persist_if_durable()
        self._store.close()
