"""ChannelCursor against a plain dict/set model under random operation sequences."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsqx.storage.cursor import ChannelCursor, DelayStore, NotInFlight, NotOwner

LONG = 2_000
MAX_MEM = 4
CLIENTS = st.sampled_from([1, 2, 3])


class Model:
    """Every offset explicitly: finished set, in flight, ready, deferred (+ tier)."""

    def __init__(self, start: int) -> None:
        self.floor = start  # everything below is finished
        self.fin: set[int] = set()  # finished offsets >= floor
        self.inflight: dict[int, list[int]] = {}  # off -> [owner, deadline, attempts, sent_at]
        self.ready: dict[int, int] = {}  # off -> attempts so far
        # upstream's FIFO: (gate, off) in the order they came back; gate = log end then
        self.order: list[tuple[int, int]] = []
        self.delayed: dict[int, list] = {}  # off -> [ready_at, attempts, tier]

    @property
    def confirmed(self) -> int:
        c = self.floor
        while c in self.fin:
            c += 1
        return c

    def fin_above(self) -> set[int]:
        c = self.confirmed
        return {o for o in self.fin if o > c}

    def finished(self, o: int) -> bool:
        return o < self.floor or o in self.fin

    def is_new(self, o: int) -> bool:
        return not (self.finished(o) or o in self.inflight or o in self.ready or o in self.delayed)

    def mem_count(self) -> int:
        return sum(1 for v in self.delayed.values() if v[2] == "mem")

    def add_delay(self, o: int, ready_at: int, attempts: int, now: int) -> None:
        tier = "disk" if (ready_at - now >= LONG or self.mem_count() >= MAX_MEM) else "mem"
        self.delayed[o] = [ready_at, attempts, tier]

    def push_ready(self, o: int, attempts: int, gate: int) -> None:
        self.ready[o] = attempts
        self.order.append((gate, o))

    def drop_ready(self, o: int) -> int:
        self.order = [x for x in self.order if x[1] != o]
        return self.ready.pop(o)

    def prune_order(self) -> None:
        self.order = [x for x in self.order if x[1] in self.ready]

    def check_owned(self, client: int, o: int) -> list[int]:
        e = self.inflight.get(o)
        if e is None:
            raise NotInFlight
        if e[0] != client:
            raise NotOwner
        return e


def expand(ranges: list[tuple[int, int]]) -> set[int]:
    return {o for a, b in ranges for o in range(a, b)}


class CursorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="nsqx-cursor-"))
        self.state = self.dir / "c.cursor"
        self.cursor = self._open()
        self.m = Model(0)
        self.end = 0
        self.now = 1_000
        self.snap = self._snapshot()

    def _open(self) -> ChannelCursor:
        store = DelayStore(self.dir / "c.delays", long_delay_ms=LONG, max_memory=MAX_MEM)
        c = ChannelCursor(0, state_path=self.state, delay_store=store)
        c.armed = c.has_timers()  # as Channel does with a recovered cursor
        return c

    @rule()
    def scan(self) -> None:
        """The node's scanner: expire, then drop the channel from its set when idle."""
        self.expire()
        if not self.cursor.has_timers():
            self.cursor.armed = False

    def _snapshot(self) -> tuple:
        m = self.m
        mem = {o: (v[0], v[1]) for o, v in m.delayed.items() if v[2] == "mem"}
        return (m.confirmed, set(m.fin_above()), mem)

    def teardown(self) -> None:
        self.cursor.delay_store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---------------------------------------------------------------- time / log
    @rule(k=st.integers(1, 6))
    def publish(self, k: int) -> None:
        self.end += k
        self.cursor.note_end(self.end)  # what Topic does after each flush

    @rule(dt=st.integers(0, 3_000))
    def tick(self, dt: int) -> None:
        self.now += dt

    # ---------------------------------------------------------------- delivery
    @rule(client=CLIENTS, n=st.integers(0, 7), timeout=st.integers(1, 4_000))
    def take(self, client: int, n: int, timeout: int) -> None:
        nr = self.cursor.next_read
        got = self.cursor.take(client, n, self.end, self.now, timeout)
        flat = [(d.offset + i, d.attempts) for d in got for i in range(d.count)]
        for d in got:
            assert d.count >= 1
            assert d.count == 1 or d.attempts == 1
        m = self.m
        want: list[tuple[int, int]] = []
        if n > 0:
            due = [(v[2] == "disk", v[0], o) for o, v in m.delayed.items() if v[0] <= self.now]
            for _, _, o in sorted(due):  # the delay store's order: memory tier, then disk
                m.push_ready(o, m.delayed.pop(o)[1], self.end)
            window = self.cursor.redelivery_window
            cnt = n
            while cnt > 0:
                m.prune_order()
                front = m.order[0] if m.order else None
                if front and (front[0] <= nr or self.end <= nr or front[0] - nr > window):
                    o = m.order.pop(0)[1]
                    want.append((o, m.ready.pop(o) + 1))
                    m.inflight[o] = [client, self.now + timeout, want[-1][1], self.now]
                    cnt -= 1
                    continue
                # fresh messages written before the front came back go first
                limit = self.end if front is None else min(self.end, front[0])
                o, took = nr, 0
                while cnt and o < limit:
                    if m.is_new(o):
                        want.append((o, 1))
                        m.inflight[o] = [client, self.now + timeout, 1, self.now]
                        cnt -= 1
                        took += 1
                    o += 1
                nr = max(nr, o)
                if front is None or (not took and nr < limit):
                    break
        assert flat == want

    def _expect(self, fn, model_fn) -> None:
        try:
            model_fn()
        except (NotInFlight, NotOwner) as exc:
            try:
                fn()
            except type(exc):
                return
            raise AssertionError(f"expected {type(exc).__name__}") from None
        fn()

    def _finish(self, client: int, o: int) -> None:
        m = self.m

        def model() -> None:
            m.check_owned(client, o)
            del m.inflight[o]
            m.fin.add(o)

        self._expect(lambda: self.cursor.finish(client, o), model)

    @rule(client=CLIENTS, o=st.integers(0, 60))
    def finish_any(self, client: int, o: int) -> None:
        self._finish(client, o)

    @precondition(lambda self: self.m.inflight)
    @rule(data=st.data())
    def finish_inflight(self, data: st.DataObject) -> None:
        o = data.draw(st.sampled_from(sorted(self.m.inflight)))
        self._finish(self.m.inflight[o][0], o)

    @precondition(lambda self: self.m.inflight)
    @rule()
    def finish_lowest(self) -> None:
        o = min(self.m.inflight)
        self._finish(self.m.inflight[o][0], o)

    @rule(client=CLIENTS, extra=st.lists(st.integers(0, 60), max_size=3), shuffle=st.booleans())
    def finish_many(self, client: int, extra: list[int], shuffle: bool) -> None:
        mine = sorted(o for o, v in self.m.inflight.items() if v[0] == client)
        offsets = mine + extra if not shuffle else extra + mine[::-1]
        got = [(o, type(e)) for o, e in self.cursor.finish_many(client, offsets)]
        want = []
        for o in offsets:
            try:
                self.m.check_owned(client, o)
            except (NotInFlight, NotOwner) as exc:
                want.append((o, type(exc)))
                continue
            del self.m.inflight[o]
            self.m.fin.add(o)
        assert got == want

    def _requeue(self, client: int, o: int, delay: int) -> None:
        m = self.m

        def model() -> None:
            e = m.check_owned(client, o)
            del m.inflight[o]
            if delay <= 0:
                m.push_ready(o, e[2], self.end)
            else:
                m.add_delay(o, self.now + delay, e[2], self.now)

        self._expect(lambda: self.cursor.requeue(client, o, delay, self.now), model)

    @rule(client=CLIENTS, o=st.integers(0, 60), delay=st.integers(0, 3_000))
    def requeue_any(self, client: int, o: int, delay: int) -> None:
        self._requeue(client, o, delay)

    @precondition(lambda self: self.m.inflight)
    @rule(data=st.data(), delay=st.sampled_from([0, 0, 1, 500, 2_500, 100_000]))
    def requeue_inflight(self, data: st.DataObject, delay: int) -> None:
        o = data.draw(st.sampled_from(sorted(self.m.inflight)))
        self._requeue(self.m.inflight[o][0], o, delay)

    def _touch(self, client: int, o: int, timeout: int, cap: int | None) -> None:
        m = self.m

        def model() -> None:
            e = m.check_owned(client, o)
            d = self.now + timeout
            if cap is not None:
                d = min(d, cap)
            e[1] = d

        self._expect(lambda: self.cursor.touch(client, o, self.now, timeout, cap), model)

    @precondition(lambda self: self.m.inflight)
    @rule(
        data=st.data(),
        timeout=st.integers(1, 4_000),
        cap=st.none() | st.integers(0, 3_000),
        wrong=st.booleans(),
    )
    def touch_inflight(self, data: st.DataObject, timeout: int, cap, wrong: bool) -> None:
        o = data.draw(st.sampled_from(sorted(self.m.inflight)))
        client = self.m.inflight[o][0]
        if wrong:
            client = client % 3 + 1
        self._touch(client, o, timeout, None if cap is None else self.now + cap)

    @rule(client=CLIENTS, o=st.integers(0, 60))
    def touch_any(self, client: int, o: int) -> None:
        self._touch(client, o, 1_000, None)

    @rule(client=CLIENTS)
    def drop_client(self, client: int) -> None:
        n = self.cursor.drop_client(client)  # ownership kept: nothing changes in the model
        assert n == sum(1 for v in self.m.inflight.values() if v[0] == client)

    @rule()
    def expire(self) -> None:
        n = self.cursor.expire(self.now)
        m = self.m
        due = [o for o, e in m.inflight.items() if e[1] <= self.now]
        for o in sorted(due, key=lambda o: (m.inflight[o][1], o)):
            m.push_ready(o, m.inflight.pop(o)[2], self.end)
        assert n == len(due)

    @rule(o=st.integers(0, 70), delay=st.integers(1, 5_000))
    def defer(self, o: int, delay: int) -> None:
        m = self.m
        self.cursor.defer(o, self.now + delay, self.now)
        if m.finished(o) or o in m.inflight:
            return
        if o in m.ready:
            m.add_delay(o, self.now + delay, m.drop_ready(o), self.now)
        elif o in m.delayed:
            a = m.delayed.pop(o)[1]
            m.add_delay(o, self.now + delay, a, self.now)
        else:
            m.add_delay(o, self.now + delay, 0, self.now)

    # ---------------------------------------------------------------- admin
    @rule(o=st.integers(0, 60))
    def reset(self, o: int) -> None:
        self.cursor.reset(o)
        m = self.m
        m.floor = o
        m.fin = set()
        m.inflight = {}
        m.ready = {}
        m.delayed = {k: v for k, v in m.delayed.items() if k >= o}
        self.snap = self._snapshot()

    @rule()
    def empty(self) -> None:
        self.cursor.empty(self.end)
        m = self.m
        end = max(self.end, m.confirmed)
        m.fin = {o for o in m.fin if o >= end}
        m.floor = end
        m.inflight = {}
        m.ready = {}
        m.delayed = {k: v for k, v in m.delayed.items() if k >= end}
        self.snap = self._snapshot()

    @rule(o=st.integers(0, 60))
    def skip_to(self, o: int) -> None:
        n = self.cursor.skip_to(o)
        m = self.m
        c = m.confirmed
        if o <= c:
            assert n == 0
            return
        assert n == sum(1 for x in range(c, o) if x not in m.fin)
        m.fin = {x for x in m.fin if x >= o}
        m.floor = o
        m.inflight = {k: v for k, v in m.inflight.items() if k >= o}
        m.ready = {k: v for k, v in m.ready.items() if k >= o}
        m.delayed = {k: v for k, v in m.delayed.items() if k >= o}
        self.snap = self._snapshot()

    @rule()
    def persist(self) -> None:
        self.cursor.persist()
        self.snap = self._snapshot()

    def _reopen_from_snapshot(self) -> None:
        pre_fin = {o for o in range(0, self.end + 80) if self.m.finished(o)}
        confirmed, fin_above, mem = self.snap
        m = self.m
        disk = {o: v for o, v in m.delayed.items() if v[2] == "disk"}
        new = Model(confirmed)
        new.fin = set(fin_above)
        for o, v in disk.items():
            if not new.finished(o):
                new.delayed[o] = v
        for o, (r, a) in mem.items():
            if o not in new.delayed and not new.finished(o):
                new.delayed[o] = [r, a, "mem"]
        self.m = new
        self.cursor = self._open()
        self.cursor.note_end(self.end)
        post_fin = {o for o in range(0, self.end + 80) if self.cursor._is_finished(o)}
        # at-least-once: nothing unfinished became finished; and persisted finishes stay
        assert post_fin <= pre_fin
        assert post_fin == {o for o in range(0, self.end + 80) if new.finished(o)}

    @rule()
    def clean_restart(self) -> None:
        self.cursor.close()
        self.snap = self._snapshot()
        self._reopen_from_snapshot()

    @rule()
    def crash(self) -> None:
        self.cursor.delay_store.close()  # no persist: state is whatever was last written
        self._reopen_from_snapshot()

    # ---------------------------------------------------------------- invariants
    @invariant()
    def agrees(self) -> None:
        c, m = self.cursor, self.m
        assert c.confirmed == m.confirmed
        assert expand(c.finished_ranges()) == m.fin_above()
        assert c.in_flight_count == len(m.inflight)
        for client in (1, 2, 3):
            assert c.in_flight_of(client) == sum(1 for v in m.inflight.values() if v[0] == client)
        assert c.deferred_count == len(m.delayed)
        assert c.delay_store.disk_count == sum(1 for v in m.delayed.values() if v[2] == "disk")
        assert c.ready_count == len(m.ready)
        new = sum(1 for o in range(m.confirmed, self.end) if m.is_new(o))
        assert c.depth(self.end) == new + len(m.ready)
        live = [e[1] for e in m.inflight.values()]
        due = [v[0] for v in m.delayed.values()]
        nd = c.next_deadline_ms()
        assert nd == (min(live + due) if live + due else None)
        assert c.pending_redeliveries(self.now) == bool(m.ready or any(r <= self.now for r in due))
        # the scanner visits every channel with something due: a timer is never unarmed
        if c.has_timers():
            assert c.armed


CursorMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("CURSOR_MODEL_EXAMPLES", "300")),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCursorModel = CursorMachine.TestCase
