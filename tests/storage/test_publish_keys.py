"""The idempotence index: marks recovered from the log, bounded by window and count."""

from __future__ import annotations

import time
from pathlib import Path

from nsqx.storage.log import LogConfig, PartitionLog
from nsqx.storage.publish_keys import (
    PRODUCER_HEADER,
    PUB_KEY_HEADER,
    PublishKeys,
    parse_key,
    parse_producer,
)


def _log(path: Path) -> PartitionLog:
    return PartitionLog(path / "p0", 0, LogConfig(segment_bytes=1 << 20))


def _append(lg: PartitionLog, n: int, mark: dict[str, bytes] | None) -> int:
    base = lg.append([b"m%d" % i for i in range(n)], headers=[mark] + [None] * (n - 1))
    lg.flush()
    return base


def test_marks_written_after_the_watermark_are_recovered_from_the_log(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    db = tmp_path / "keys.sqlite"
    keys = PublishKeys(db, lg)
    keys.close()  # watermark 0, nothing indexed: then a "crash" after these appends
    b1 = _append(lg, 3, {PUB_KEY_HEADER: b"h/a#3#fp1"})
    _append(lg, 2, None)
    b3 = _append(lg, 1, {PRODUCER_HEADER: b"p1:0:7"})
    keys = PublishKeys(db, lg)
    assert keys.get("h/a") == (b1, 3, "fp1")
    st = keys.producer("p1")
    assert st is not None and (st.epoch, st.seq, st.base) == (0, 7, b3)
    assert keys.covered == lg.flushed_offset
    keys.close()
    # the checkpoint keeps the producers: the next open reads nothing from the log
    keys = PublishKeys(db, lg)
    assert keys.producer("p1") is not None and keys.covered == lg.flushed_offset
    keys.close()
    lg.close()


def test_catch_up_takes_in_records_appended_elsewhere(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    keys = PublishKeys(None, lg)
    base = _append(lg, 1, {PRODUCER_HEADER: b"p:2:0"})  # e.g. replicated from a leader
    assert keys.producer("p") is None
    keys.catch_up(lg.flushed_offset)
    st = keys.producer("p")
    assert st is not None and (st.epoch, st.seq, st.base) == (2, 0, base)
    lg.close()


def test_window_and_count_bound_what_is_remembered(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    keys = PublishKeys(tmp_path / "k.sqlite", lg, window=60, max_keys=2, max_producers=2)
    old = time.time() - 120
    keys.put("h/old", 0, 1, "", old)
    keys.put("w:1:2", 0, 1, "", old)  # the Spark sink's: kept 7 days whatever the window
    assert keys.get("h/old") is None  # outside the window
    assert keys.get("w:1:2") == (0, 1, "")
    keys.expire()
    assert keys.get("w:1:2") == (0, 1, "")
    for i in range(4):
        keys.put(f"h/k{i}", i, 1, "")
        keys.put_producer(f"p{i}", 0, 0, i, 1)
    keys.expire()
    assert keys.get("h/k0") is None and keys.get("h/k1") is None
    assert keys.get("h/k3") == (3, 1, "")
    assert list(keys.producers) == ["p2", "p3"]
    n = keys.db.execute("SELECT count(*) FROM keys").fetchone()[0]  # type: ignore[union-attr]
    assert n == 2
    keys.close()
    lg.close()


def test_mark_parsers_refuse_malformed_values() -> None:
    assert parse_key(b"w:b:k#3") == ("w:b:k", 3, "")
    assert parse_key(b"h/x#1#ab") == ("h/x", 1, "ab")
    for bad in (b"", b"#1", b"k#", b"k#x", b"a#1#2#3", b"\xff#1"):
        assert parse_key(bad) is None
    assert parse_producer(b"id:1:2") == ("id", 1, 2)
    for bad in (b"", b"id:1", b"id:-1:2", b":1:2", b"id:1:2:3", b"id:x:2", b"\xff:1:2"):
        assert parse_producer(bad) is None


def test_keys_since_gives_the_newest_keys_of_a_prefix(tmp_path: Path) -> None:
    """What a node's start reads to know each HTTP key's topic: the newest ``limit`` keys
    with the prefix, none older than ``since``; a key written again counts as new."""
    lg = _log(tmp_path)
    keys = PublishKeys(tmp_path / "keys.sqlite", lg)
    now = time.time()
    keys.put("h/old", 0, 1, "f", now - 100)
    for i in range(5):
        keys.put(f"h/k{i}", i + 1, 1, "f", now)
    keys.put("spark:1:2", 9, 1, "", now)  # another kind of key
    keys.put("h/k0", 10, 1, "f", now)  # written again: the newest
    got = keys.keys_since("h/", now - 10, 3)
    assert sorted(k for k, _ in got) == ["h/k0", "h/k3", "h/k4"]
    assert sorted(k for k, _ in keys.keys_since("h/", now - 10, 100)) == [
        f"h/k{i}" for i in range(5)]
    assert len(keys.keys_since("h/", now - 1000, 100)) == 6
    keys.close()
    mem = PublishKeys(None, lg)  # an ephemeral topic's index
    for i in range(4):
        mem.put(f"h/m{i}", i, 1, "f", now)
    assert [k for k, _ in mem.keys_since("h/", now - 10, 2)] == ["h/m2", "h/m3"]
    lg.close()
