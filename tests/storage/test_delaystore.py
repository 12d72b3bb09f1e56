"""DelayStore: memory heap for short/few delays, SQLite (WAL) for long/many."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nsqx.storage.delaystore import DelayStore

DAY = 86_400_000


def test_memory_only_store_keeps_everything_in_memory() -> None:
    s = DelayStore(None, max_memory=2)
    for o in range(5):
        s.add(o, 10 * DAY, 1, now_ms=0)
    assert s.memory_count == 5 and s.disk_count == 0 and len(s) == 5


def test_tiers_by_delay_and_count(tmp_path: Path) -> None:
    path = tmp_path / "d.sqlite"
    s = DelayStore(path, long_delay_ms=60_000, max_memory=3)
    assert not path.exists()  # created lazily
    s.add(1, 59_999, 0, now_ms=0)
    s.add(2, 60_000, 2, now_ms=0)
    assert s.memory_count == 1 and s.disk_count == 1 and not path.exists()  # buffered
    s.flush()
    assert s.disk_count == 1 and path.exists()
    for o in range(10, 15):
        s.add(o, 1_000, 1, now_ms=0)
    assert s.memory_count == 3 and s.disk_count == 4
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_pop_due_merges_tiers_in_time_order(tmp_path: Path) -> None:
    s = DelayStore(tmp_path / "d.sqlite", long_delay_ms=100)
    s.add(5, 50, 1, now_ms=0)
    s.add(6, 500, 2, now_ms=0)
    s.add(7, 30, 3, now_ms=0)
    s.add(8, 3 * DAY, 4, now_ms=0)
    assert s.next_ready_ms() == 30
    assert s.pop_due(29) == []
    assert s.pop_due(60) == [(7, 3), (5, 1)]
    assert s.next_ready_ms() == 500
    assert s.pop_due(3 * DAY) == [(6, 2), (8, 4)]
    assert s.next_ready_ms() is None and len(s) == 0


def test_pop_due_limit(tmp_path: Path) -> None:
    s = DelayStore(tmp_path / "d.sqlite", long_delay_ms=10, max_memory=5)
    for o in range(20):
        s.add(o, 100 + o, 0, now_ms=0)
    got = s.pop_due(1_000, limit=7)
    assert len(got) == 7
    got += s.pop_due(1_000, limit=100)
    assert sorted(o for o, _ in got) == list(range(20))


def test_remove_get_discard(tmp_path: Path) -> None:
    s = DelayStore(tmp_path / "d.sqlite", long_delay_ms=1_000, max_memory=100)
    s.add(1, 10, 0, now_ms=0)
    s.add(2, 5_000, 3, now_ms=0)
    s.add(3, 20, 0, now_ms=0)
    s.add(9, 9_000, 0, now_ms=0)
    assert s.get(2) == (5_000, 3) and 2 in s and 4 not in s
    assert s.remove(1) == (10, 0) and s.remove(1) is None
    assert s.remove(2) == (5_000, 3) and s.disk_count == 1
    assert s.next_ready_ms() == 20
    assert s.offsets() == [3, 9] and s.offsets(4) == [9]
    assert s.discard_range(0, 5) == 1
    assert s.discard_range(5, 10) == 1 and len(s) == 0
    s.add(1, 5, 0, now_ms=0)
    s.clear()
    assert len(s) == 0 and s.next_ready_ms() is None


def test_disk_entries_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "d.sqlite"
    s = DelayStore(path)
    s.add(42, 2 * DAY, 7, now_ms=0)
    s.add(43, 10, 1, now_ms=0)  # memory: the cursor persists those itself
    assert s.memory_items() == [(43, 10, 1)]
    s.close()
    s2 = DelayStore(path)
    assert s2.disk_count == 1 and s2.memory_count == 0
    assert s2.next_ready_ms() == 2 * DAY
    assert s2.pop_due(2 * DAY) == [(42, 7)]
    s2.close()
    assert DelayStore(path).disk_count == 0


def test_readd_same_offset_on_disk_updates(tmp_path: Path) -> None:
    s = DelayStore(tmp_path / "d.sqlite", long_delay_ms=1)
    s.add(1, 100, 0, now_ms=0)
    s.add(1, 200, 5, now_ms=0)
    assert s.disk_count == 1 and s.get(1) == (200, 5)


def test_many_memory_removals_compact_heap() -> None:
    s = DelayStore(None)
    for o in range(5_000):
        s.add(o, o, 0, now_ms=0)
    for o in range(4_990):
        s.remove(o)
    assert len(s._heap) < 2_100
    assert s.pop_due(10**9) == [(o, 0) for o in range(4_990, 5_000)]
