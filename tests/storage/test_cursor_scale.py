"""Long random runs at scale against the model: reach the compaction paths (dead runs, timer
heap, skip array) that the small hypothesis examples never get to."""

from __future__ import annotations

import random

import pytest

from nsqx.storage.cursor import ChannelCursor

from .test_cursor_model import CursorMachine


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_large_random_run_matches_model(seed: int) -> None:
    rnd = random.Random(seed)
    mach = CursorMachine()
    try:
        for step in range(2_500):
            m = mach.m
            r = rnd.random()
            if r < 0.08:
                mach.publish(rnd.randint(1, 600))
            elif r < 0.16:
                mach.tick(rnd.randint(0, 2_000))
            elif r < 0.32:
                mach.take(rnd.randint(1, 3), rnd.randint(0, 700), rnd.randint(1_000, 6_000))
            elif r < 0.58 and m.inflight:
                keys = sorted(m.inflight)
                if rnd.random() < 0.5:
                    k = rnd.randint(1, min(200, len(keys)))
                    for o in keys[:k]:  # in order, lowest first
                        mach._finish(m.inflight[o][0], o)
                else:
                    for o in rnd.sample(keys, min(len(keys), rnd.randint(1, 200))):
                        mach._finish(m.inflight[o][0], o)
            elif r < 0.64:
                mach.finish_many(rnd.randint(1, 3), [], rnd.random() < 0.3)
            elif r < 0.70 and m.inflight:
                keys = sorted(m.inflight)
                for o in rnd.sample(keys, min(len(keys), rnd.randint(1, 20))):
                    mach._requeue(m.inflight[o][0], o, rnd.choice([0, 0, 300, 2_500]))
            elif r < 0.74 and m.inflight:
                keys = sorted(m.inflight)
                for o in rnd.sample(keys, min(len(keys), rnd.randint(1, 20))):
                    mach._touch(m.inflight[o][0], o, rnd.randint(1, 5_000), None)
            elif r < 0.80:
                mach.expire()
            elif r < 0.88:
                base = mach.cursor.next_read
                for o in range(base, base + rnd.randint(1, 300)):
                    mach.defer(o, rnd.randint(1, 4_000))
            elif r < 0.90:
                mach.persist()
            elif r < 0.91:
                mach.crash()
            elif r < 0.92:
                mach.clean_restart()
            elif r < 0.925:
                mach.skip_to(mach.m.confirmed + rnd.randint(0, 500))
            elif r < 0.928:
                mach.empty()
            elif r < 0.93:
                mach.reset(max(0, mach.m.confirmed - rnd.randint(0, 1_000)))
            if step % 25 == 0:
                mach.agrees()
        mach.agrees()
    finally:
        mach.teardown()


def test_dead_run_compaction_keeps_lookup_right() -> None:
    c = ChannelCursor(0)
    for i in range(5_000):
        c.take(1 + i % 2, 1, 10**9, 0, 60_000)
    for o in range(1, 5_000):
        c.finish(1 + o % 2, o)
    assert c.confirmed == 0 and len(c._runs) < 2_000  # dead runs were compacted away
    c.finish(1, 0)
    assert c.confirmed == 5_000 and c.in_flight_count == 0


def test_skip_array_compaction() -> None:
    c = ChannelCursor(0)
    for o in range(0, 40_000, 2):
        c.defer(o, 1_000, now_ms=0)
    got = 0
    while got < 20_000:
        ds = c.take(1, 100, 40_000, 0, 60_000)
        got += sum(d.count for d in ds)
    assert c.next_read == 40_000 and len(c._skip) == 0
    assert c.depth(40_000) == 0 and c.deferred_count == 20_000


def test_head_and_timer_compaction_with_live_messages() -> None:
    c = ChannelCursor(0)
    for i in range(3_000):
        c.take(1, 1, 10**9, i, 60_000)
    for o in range(2_000):  # head index moves past 1024: the run list is trimmed
        c.finish(1, o)
    assert len(c._runs) - c._rh == 1_000 and len(c._runs) < 3_000
    for o in range(2_000, 2_990):
        c.touch(1, o, 0, 70_000)  # per-offset entries, each with its own timer
        c.touch(1, o, 1, 70_000)
        c.touch(1, o, 2, 70_000)
    assert len(c._timers) < 4 * 1_000 + 4_097
    assert c.next_deadline_ms() == 2_990 + 60_000
    assert c.expire(2_999 + 60_000) == 10
    assert c.expire(70_002) == 990
    assert c.in_flight_count == 0 and c.ready_count == 1_000


def test_ready_heap_compaction() -> None:
    c = ChannelCursor(0)
    c.take(1, 3_000, 3_000, 0, 60_000)
    for o in range(3_000):
        c.requeue(1, o, 0, 0)
    for o in range(2_990):
        c.defer(o, 10_000, now_ms=0)  # ready -> deferred: heap items go stale
    got = c.take(1, 5, 3_000, 0, 60_000)
    assert [(d.offset, d.attempts) for d in got] == [(o, 2) for o in range(2_990, 2_995)]
    assert len(c._ready) < 1_100
    # FIFO: the five still ready first, then the deferred ones as they come due
    assert [(d.offset, d.attempts) for d in c.take(1, 10, 3_000, 10_000, 60_000)] == [
        (o, 2) for o in [*range(2_995, 3_000), *range(5)]
    ]
