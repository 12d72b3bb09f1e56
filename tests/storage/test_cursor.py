"""Unit tests of ChannelCursor (a channel = a cursor over its partition log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqx.storage.cursor import (
    REQ,
    TIMEOUT,
    ChannelCursor,
    DelayStore,
    Delivery,
    NotInFlight,
    NotOwner,
)

T = 60_000  # msg timeout


def flat(ds: list[Delivery]) -> list[tuple[int, int]]:
    return [(d.offset + i, d.attempts) for d in ds for i in range(d.count)]


def test_fresh_runs_and_in_order_finish() -> None:
    c = ChannelCursor(10)
    assert c.take(1, 4, 100, 0, T) == [Delivery(10, 4, 1)]
    assert c.take(2, 3, 100, 0, T) == [Delivery(14, 3, 1)]
    assert c.in_flight_count == 7 and c.in_flight_of(1) == 4 and c.in_flight_of(2) == 3
    for o in range(10, 14):
        c.finish(1, o)
    assert c.confirmed == 14 and c.in_flight_of(1) == 0
    assert c.finish_count == 4 and c.delivered_count == 7 == c.message_count
    assert c.depth(100) == 100 - 17


def test_take_respects_end_offset_and_max_count() -> None:
    c = ChannelCursor(0)
    assert c.take(1, 10, 3, 0, T) == [Delivery(0, 3, 1)]
    assert c.take(1, 10, 3, 0, T) == []
    assert c.take(1, 0, 10, 0, T) == []
    assert c.next_read == 3


def test_out_of_order_finish_merges_ranges() -> None:
    c = ChannelCursor(0)
    c.take(1, 10, 10, 0, T)
    for o in (3, 4, 7, 5, 9):
        c.finish(1, o)
    assert c.confirmed == 0
    assert c.finished_ranges() == [(3, 6), (7, 8), (9, 10)]
    for o in (0, 1, 2):
        c.finish(1, o)
    assert c.confirmed == 6
    c.finish(1, 6)
    c.finish(1, 8)
    assert c.confirmed == 10 and c.finished_ranges() == [] and c.in_flight_count == 0


def test_errors_use_upstream_wording() -> None:
    c = ChannelCursor(0)
    c.take(1, 2, 10, 0, T)
    with pytest.raises(NotInFlight, match="ID not in flight"):
        c.finish(1, 5)
    with pytest.raises(NotOwner, match="client does not own message"):
        c.finish(2, 0)
    with pytest.raises(NotOwner):
        c.requeue(2, 1, 0, 0)
    with pytest.raises(NotOwner):
        c.touch(2, 1, 0, T)
    c.finish(1, 0)
    with pytest.raises(NotInFlight):
        c.finish(1, 0)
    with pytest.raises(NotInFlight):
        c.requeue(1, 0, 0, 0)
    with pytest.raises(NotInFlight):
        c.touch(1, 0, 0, T)


def test_requeue_goes_behind_what_was_queued() -> None:
    """Upstream's FIFO: a REQ 0 comes back after the messages written before it came back."""
    c = ChannelCursor(0)
    c.take(1, 3, 10, 0, T)  # 0, 1, 2 out; 3..9 queued
    c.requeue(1, 1, 0, 5)
    assert c.requeue_count == 1 and c.depth(10) == 8
    assert flat(c.take(2, 3, 10, 5, T)) == [(3, 1), (4, 1), (5, 1)]
    got = c.take(2, 5, 12, 5, T)  # 10 and 11 were written after the REQ: behind it
    assert flat(got) == [(6, 1), (7, 1), (8, 1), (9, 1), (1, 2)]
    assert got[-1] == Delivery(1, 1, 2, REQ)
    assert flat(c.take(2, 5, 12, 5, T)) == [(10, 1), (11, 1)]
    c.requeue(2, 1, 0, 6)  # nothing queued now: straight back
    assert flat(c.take(1, 1, 12, 6, T)) == [(1, 3)]


def test_redeliveries_keep_their_order_and_skip_a_far_backlog() -> None:
    c = ChannelCursor(0)
    c.redelivery_window = 100
    c.take(1, 3, 3, 0, T)
    for off in (2, 0, 1):  # back in this order, nothing else queued
        c.requeue(1, off, 0, 1)
    assert flat(c.take(1, 3, 3, 1, T)) == [(2, 2), (0, 2), (1, 2)]
    c.requeue(1, 0, 0, 2)
    # a backlog of 10,000 written meanwhile is more than the window (upstream keeps at most
    # --mem-queue-size in memory and does not wait for its disk queue): no waiting behind it
    c.note_end(10_003)
    c.requeue(1, 1, 0, 2)
    assert flat(c.take(1, 2, 10_003, 2, T)) == [(0, 3), (1, 3)]


def test_redelivery_says_how_the_last_attempt_ended() -> None:
    """Dead letters report timeout or req: the cursor keeps the last reason per offset."""
    c = ChannelCursor(0)
    assert [d.why for d in c.take(1, 3, 3, 0, 1_000)] == [""]  # fresh
    c.requeue(1, 0, 0, 10)  # REQ 0
    c.requeue(1, 1, 500, 10)  # delayed REQ: deferred, then ready
    assert c.expire(1_000) == 1  # 2 times out
    got = c.take(2, 5, 3, 1_000, 1_000)
    assert sorted((d.offset, d.attempts, d.why) for d in got) == [
        (0, 2, REQ), (1, 2, REQ), (2, 2, TIMEOUT)]
    c.requeue(2, 2, 0, 1_100)  # timed out once, then REQ'd: the last one counts
    c.expire(2_000)  # 0 and 1 time out
    got = c.take(2, 5, 3, 2_000, 1_000)
    assert sorted((d.offset, d.attempts, d.why) for d in got) == [
        (0, 3, TIMEOUT), (1, 3, TIMEOUT), (2, 3, REQ)]
    assert not c._why  # taken with the delivery: nothing kept per message in flight
    c.requeue(2, 0, 0, 2_100)
    c.reset(0)  # dropped with the ready queue
    assert not c._why and [d.why for d in c.take(1, 3, 3, 2_100, T)] == [""]


def test_redelivery_is_not_stuck_when_nothing_fresh_can_go() -> None:
    """A paused topic delivers no fresh message (end = next_read): redeliveries still go."""
    c = ChannelCursor(0)
    c.take(1, 2, 10, 0, T)
    c.requeue(1, 0, 0, 1)
    assert flat(c.take(1, 5, 2, 1, T)) == [(0, 2)]


def test_requeue_with_delay_waits() -> None:
    c = ChannelCursor(0)
    c.take(1, 2, 2, 0, T)
    c.requeue(1, 0, 1_000, 0)
    assert c.deferred_count == 1 and c.depth(2) == 0
    assert not c.pending_redeliveries(999)
    assert c.take(1, 5, 2, 999, T) == []
    assert c.next_deadline_ms() == 1_000
    assert c.pending_redeliveries(1_000)
    assert flat(c.take(1, 5, 2, 1_000, T)) == [(0, 2)]
    assert c.deferred_count == 0


def test_timeouts_are_per_chunk_and_redelivered() -> None:
    c = ChannelCursor(0)
    c.take(1, 5, 100, 0, 1_000)
    c.take(2, 5, 100, 500, 1_000)
    c.finish(1, 2)
    assert c.next_deadline_ms() == 1_000
    assert c.expire(999) == 0
    assert c.expire(1_000) == 4
    assert c.timeout_count == 4 and c.in_flight_of(1) == 0
    assert c.next_deadline_ms() == 1_500
    with pytest.raises(NotInFlight):
        c.finish(1, 0)
    assert flat(c.take(3, 10, 10, 1_000, 1_000)) == [(0, 2), (1, 2), (3, 2), (4, 2)]
    assert c.expire(1_500) == 5
    assert flat(c.take(3, 2, 10, 1_600, 1_000)) == [(5, 2), (6, 2)]


def test_touch_extends_and_caps() -> None:
    c = ChannelCursor(0)
    c.take(1, 3, 10, 0, 1_000)
    c.touch(1, 1, 900, 1_000)
    assert c.expire(1_000) == 2  # 0 and 2 time out, 1 was touched
    assert c.next_deadline_ms() == 1_900 and c.pending_redeliveries(1_000)
    c.take(1, 2, 3, 1_000, 1_000)  # redeliver 0 and 2
    assert c.expire(1_899) == 0
    assert c.expire(1_900) == 1
    c2 = ChannelCursor(0)
    c2.take(1, 1, 10, 0, 1_000)
    c2.touch(1, 0, 500, 1_000, 1_200)
    assert c2.next_deadline_ms() == 1_200
    c2.touch(1, 0, 600, 5_000, max_msg_timeout_ms=2_000)  # upstream: delivery + max_msg_timeout
    assert c2.next_deadline_ms() == 2_000


def test_defer_skips_fresh_reads_per_chunk() -> None:
    c = ChannelCursor(0)
    for o in range(10, 10_010):
        c.defer(o, 5_000, now_ms=0)
    c.defer(20_000, 5_000, now_ms=0)
    assert c.deferred_count == 10_001
    got = c.take(1, 20_000, 30_000, 0, T)
    # two chunks around the deferred block, one more around the single one
    assert got == [Delivery(0, 10, 1), Delivery(10_010, 9_990, 1), Delivery(20_001, 9_999, 1)]
    assert c.depth(30_000) == 0 and c.depth(30_002) == 2
    got = c.take(1, 3, 30_000, 5_000, T)
    assert got == [Delivery(10, 1, 1), Delivery(11, 1, 1), Delivery(12, 1, 1)]


def test_defer_of_delivered_offsets() -> None:
    c = ChannelCursor(0)
    c.redelivery_window = 0  # redeliveries wait for nothing: this is about deferring
    c.take(1, 2, 10, 0, T)
    c.defer(0, 100)  # in flight: ignored
    c.finish(1, 1)
    c.defer(1, 100)  # finished: ignored
    assert c.deferred_count == 0
    c.requeue(1, 0, 0, 0)
    c.defer(0, 100, now_ms=0)  # ready -> deferred, attempts kept
    assert c.deferred_count == 1 and c.ready_count == 0
    assert flat(c.take(1, 1, 10, 100, T)) == [(0, 2)]


def test_dpub_finished_before_reader_gets_there() -> None:
    c = ChannelCursor(0)
    c.redelivery_window = 0  # the due DPUB goes first, ahead of the reader
    c.defer(5, 10, now_ms=0)
    assert flat(c.take(1, 1, 10, 10, T)) == [(5, 1)]
    c.finish(1, 5)
    assert c.finished_ranges() == [(5, 6)]
    assert flat(c.take(1, 10, 10, 10, T)) == [(o, 1) for o in (0, 1, 2, 3, 4, 6, 7, 8, 9)]
    for o in (0, 1, 2, 3, 4, 6, 7, 8, 9):
        c.finish(1, o)
    assert c.confirmed == 10


def test_pause() -> None:
    c = ChannelCursor(0)
    c.paused = True
    assert c.take(1, 5, 10, 0, T) == []
    c.paused = False
    assert c.take(1, 5, 10, 0, T) == [Delivery(0, 5, 1)]


def test_drop_client_keeps_ownership_until_timeout() -> None:
    c = ChannelCursor(0)
    c.take(1, 2, 10, 0, 1_000)
    c.drop_client(1)
    with pytest.raises(NotOwner):
        c.finish(2, 0)
    assert c.expire(1_000) == 2
    assert flat(c.take(2, 5, 2, 1_000, 1_000)) == [(0, 2), (1, 2)]


def test_finish_many_fast_and_slow() -> None:
    c = ChannelCursor(0)
    c.take(1, 100, 1_000, 0, T)
    c.take(1, 100, 1_000, 0, T)
    assert c.finish_many(1, list(range(0, 150))) == []
    assert c.confirmed == 150
    errs = c.finish_many(1, [199, 150, 150, 500])
    assert [(o, type(e)) for o, e in errs] == [(150, NotInFlight), (500, NotInFlight)]
    c.take(2, 10, 1_000, 0, T)
    errs = c.finish_many(1, [200, 201])
    assert [type(e) for _, e in errs] == [NotOwner, NotOwner]
    assert c.finish_many(1, list(range(151, 199))) == []
    assert c.confirmed == 200


def test_timer_heap_stays_bounded() -> None:
    c = ChannelCursor(0)
    for i in range(20_000):
        c.take(1, 10, 10**9, i, T)
        c.finish_many(1, list(range(i * 10, i * 10 + 10)))
    assert c.confirmed == 200_000
    assert len(c._timers) < 10_000
    assert len(c._runs) < 10


def test_depth_counts_ready_not_inflight_or_deferred() -> None:
    c = ChannelCursor(0)
    c.take(1, 4, 10, 0, T)
    c.requeue(1, 0, 0, 0)
    c.requeue(1, 1, 10_000, 0)
    c.finish(1, 2)
    assert c.depth(10) == 6 + 1  # unread 4..9 plus ready 0


def test_empty_reset_skip_to() -> None:
    c = ChannelCursor(0)
    c.take(1, 5, 10, 0, T)
    c.requeue(1, 1, 5_000, 0)
    c.empty(10)
    assert c.confirmed == 10 and c.in_flight_count == 0 and c.deferred_count == 0
    assert c.depth(10) == 0
    with pytest.raises(NotInFlight):
        c.finish(1, 0)
    c.reset(3)
    assert c.confirmed == 3 and c.depth(10) == 7
    assert c.take(1, 3, 10, 0, T) == [Delivery(3, 3, 1)]
    c.finish(1, 4)
    assert c.skip_to(8) == 4  # 3, 5 (in flight), 6, 7
    assert c.confirmed == 8 and c.in_flight_count == 0
    assert c.skip_to(2) == 0
    assert c.take(1, 5, 10, 0, T) == [Delivery(8, 2, 1)]


def test_an_older_snapshot_never_replaces_a_newer_one(tmp_path: Path) -> None:
    """nsqd writes snapshots in a worker thread; a reset persisted at once meanwhile must
    not be overwritten by the older snapshot when the worker gets to it."""
    path = tmp_path / "c.cursor"
    c = ChannelCursor(0, state_path=path)
    c.take(1, 10, 20, 0, T)
    for o in range(5):
        c.finish(1, o)
    old = c.snapshot()
    assert old is not None
    c.reset(2)  # e.g. /channel/setoffset back to 2, persisted at once
    c.persist()
    assert c.write_snapshot(*old) is False  # dropped: confirmed 5 would skip 2..4
    assert ChannelCursor(0, state_path=path).confirmed == 2
    newer = c.snapshot()
    assert newer is not None and c.write_snapshot(*newer) is True
    c.close()


def test_persist_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "c.cursor"
    c = ChannelCursor(0, state_path=path)
    c.take(1, 10, 20, 0, T)
    for o in (0, 1, 2, 5, 6, 9):
        c.finish(1, o)
    c.defer(15, 10_000, now_ms=0)
    c.paused = True
    c.persist()
    c.finish(1, 3)  # after the persist: lost by the crash below, redelivered
    c.delay_store.close()  # crash: no persist
    c2 = ChannelCursor(0, state_path=path)
    assert c2.confirmed == 3 and c2.finished_ranges() == [(5, 7), (9, 10)]
    assert c2.paused and c2.deferred_count == 1
    c2.paused = False
    got = flat(c2.take(1, 100, 20, 0, T))
    assert got == [(o, 1) for o in (3, 4, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 19)]
    assert flat(c2.take(1, 100, 20, 10_000, T)) == [(15, 1)]
    c2.close()
    assert ChannelCursor(0, state_path=path).confirmed == 3


def test_state_file_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.cursor"
    c = ChannelCursor(7, state_path=path)
    c.close()
    assert ChannelCursor(0, state_path=path).confirmed == 7
    data = bytearray(path.read_bytes())
    data[9] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        ChannelCursor(0, state_path=path)
    assert not path.with_name(path.name + ".tmp").exists()


def test_long_delays_go_to_sqlite_and_come_back(tmp_path: Path) -> None:
    path = tmp_path / "c.cursor"
    c = ChannelCursor(0, state_path=path)
    c.take(1, 3, 10, 0, T)
    c.requeue(1, 0, 3 * 86_400_000, 0)  # three days
    c.requeue(1, 1, 5_000, 0)  # short: memory
    st = c.delay_store
    assert st.disk_count == 1 and st.memory_count == 1
    assert Path(f"{path}.delays").exists()
    c.delay_store.close()  # crash without persist: the sqlite entry survives by itself
    c2 = ChannelCursor(0, state_path=path)
    assert c2.delay_store.disk_count == 1 and c2.deferred_count == 1
    got = flat(c2.take(1, 10, 10, 10_000, T))
    assert got == [(o, 1) for o in range(1, 10)]  # 0 stays deferred; 1 redelivered fresh
    assert c2.next_deadline_ms() == 10_000 + T
    assert flat(c2.take(2, 10, 10, 3 * 86_400_000, T)) == [(0, 2)]
    assert c2.delay_store.disk_count == 0


def test_many_delays_spill_to_disk(tmp_path: Path) -> None:
    store = DelayStore(tmp_path / "d.sqlite", max_memory=100)
    c = ChannelCursor(0, state_path=tmp_path / "c.cursor", delay_store=store)
    c.take(1, 1_000, 1_000, 0, T)
    for o in range(1_000):
        c.requeue(1, o, 1_000, 0)
    assert store.memory_count == 100 and store.disk_count == 900
    assert c.take(1, 5_000, 1_000, 999, T) == []
    got = flat(c.take(1, 5_000, 1_000, 1_000, T))
    assert got == [(o, 2) for o in range(1_000)]
    assert len(store) == 0
    c.close()


def test_reload_never_resurrects_finished_or_loses_unfinished(tmp_path: Path) -> None:
    import random

    rnd = random.Random(7)
    path = tmp_path / "c.cursor"
    c = ChannelCursor(0, state_path=path)
    finished: set[int] = set()
    persisted: set[int] = set()
    end = 0
    now = 0
    for _round in range(30):
        end += rnd.randint(0, 50)
        now += 100
        cid = rnd.randint(1, 3)
        for d in c.take(cid, rnd.randint(1, 40), end, now, 1_000):
            offs = list(range(d.offset, d.offset + d.count))
            rnd.shuffle(offs)
            for o in offs[: rnd.randint(0, len(offs))]:
                c.finish(cid, o)
                finished.add(o)
        c.expire(now)
        if rnd.random() < 0.3:
            c.persist()
            persisted = set(finished)
        if rnd.random() < 0.2:
            c.delay_store.close()
            c = ChannelCursor(0, state_path=path)
            now_fin = {o for o in range(end + 10) if c._is_finished(o)}
            assert persisted == now_fin
            assert now_fin <= finished
            finished = now_fin


def test_dropped_client_counters_are_forgotten() -> None:
    c = ChannelCursor(0)
    c.take(1, 2, 10, 0, 1_000)
    c.drop_client(2)
    assert 2 not in c._cif
    assert c.drop_client(1) == 2
    c.expire(1_000)
    assert 1 not in c._cif and c.in_flight_of(1) == 0


def test_many_long_dpub_deferrals_keep_memory_bounded(tmp_path: Path) -> None:
    """100k DPUBs deferred for hours: the entries live in SQLite (written once per group
    commit, at note_end), the cursor keeps 8 bytes per offset (its skip array), and no
    Python object per message stays in memory; a crash after the commit keeps them."""
    import tracemalloc

    from nsqx.storage.delaystore import MAX_PENDING

    path = tmp_path / "c.cursor"
    c = ChannelCursor(0, state_path=path)
    n, turn = 100_000, 1_000
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for base in range(0, n, turn):
            for off in range(base, base + turn):
                c.defer(off, 3_600_000 + off, now_ms=0)
            assert c.delay_store.disk_count == base + turn
            assert len(c.delay_store._pending) <= MAX_PENDING
            c.note_end(base + turn)  # the group commit of this turn
            assert not c.delay_store._pending
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown < n * 24, grown  # a tuple per message alone would be > 64 bytes each
    assert c.delay_store.memory_count == 0 and c.deferred_count == n
    c.delay_store.close()  # SIGKILL: no persist; the SQLite rows survive by themselves
    c2 = ChannelCursor(0, state_path=path)
    assert c2.deferred_count == n
    assert flat(c2.take(1, 10, 10, 3_600_000 + 4, T)) == [(o, 1) for o in range(5)]


def test_due_delays_finished_one_by_one_do_not_keep_their_timers() -> None:
    """Due delayed messages come back as per-offset entries; finishing them must not leave
    their timer tuples in the heap until the deadline (it grew with the delivery rate)."""
    c = ChannelCursor(0)
    n = 20_000
    for off in range(n):
        c.defer(off, 1_000, now_ms=0)
    c.note_end(n)
    done = 0
    while done < n:
        for d in c.take(1, 100, n, 2_000, T):
            for o in range(d.offset, d.offset + d.count):
                c.finish(1, o)
                done += 1
        assert len(c._timers) <= 4 * 100 + 4096 + 1
    assert c.deferred_count == 0 and not c._entries


def test_mark_finished_range_skips_blocks_and_survives_a_reload(tmp_path: Path) -> None:
    path = tmp_path / "c.cursor"
    c = ChannelCursor(0, state_path=path)
    c.mark_finished_range(0, 3)  # a leading block: confirmed moves over it
    c.mark_finished_range(5, 8)
    c.mark_finished_range(8, 8)  # empty: nothing
    assert c.confirmed == 3 and c.depth(10) == 4
    with pytest.raises(ValueError):
        c.mark_finished_range(1, 2)  # already read past
    c.close()
    c = ChannelCursor(0, state_path=path)
    got = [(d.offset, d.count) for d in c.take(1, 100, 10, 0, 1000)]
    assert sum(n for _, n in got) == 4
    assert {o for off, n in got for o in range(off, off + n)} == {3, 4, 8, 9}
    c.close()


def test_a_cursor_past_a_shorter_log_resumes_at_its_end(tmp_path: Path) -> None:
    """Issue 28: after a power loss the log can end below a durable cursor (cursors are
    fsynced every pass, the log every --sync-timeout); new messages at those offsets must
    be delivered, not skipped, and deferred entries past the end are gone with their
    messages."""
    path = tmp_path / "c.cursor"
    c = ChannelCursor(0, state_path=path)
    c.take(1, 100, 100, 0, T)
    for o in range(100):
        c.finish(1, o)
    c.defer(150, 10**12, 0)
    c.persist()
    c.close()
    c = ChannelCursor(0, state_path=path)
    assert c.confirmed == 100
    assert c.fit_log(120) is None  # fits: untouched
    assert c.fit_log(40) == 100
    assert c.confirmed == 40 and c.deferred_count == 0
    assert flat(c.take(1, 10, 45, 0, T)) == [(o, 1) for o in range(40, 45)]
    assert ChannelCursor(0, state_path=path).confirmed == 40  # persisted
    c.close()
