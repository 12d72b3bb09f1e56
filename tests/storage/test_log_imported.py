"""A log holding an imported range (``nsqx import``): frames with Go's ids, ``imported-ids``.

Recovery checks every frame's id against its offset when it verifies a commit (no recovery
point), rebuilds lost metadata or adopts frames written after the last entry; inside the
recorded range it must take the recorded ids, outside and for unrecorded foreign ids it
must not.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

from nsqx.storage.imported_ids import FILE_NAME, FOREIGN_MIN_PARTITION
from nsqx.storage.log import CHECKPOINT, LogConfig, LogError, PartitionLog

CFG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128, sync_every=10**9)
GO = 0x18AA034205269000  # a Go id of 2026 (top 16 bits 0x18aa = 6314)


def go_frames(ids: list[int], ts: int = 1000) -> tuple[bytes, list[int]]:
    parts, lengths = [], []
    for i, v in enumerate(ids):
        body = b"go-%d" % i
        parts.append(struct.pack(">IIqH", 30 + len(body), 2, ts + i, 2) + b"%016x" % v + body)
        lengths.append(34 + len(body))
    return b"".join(parts), lengths


def make(path: Path, *, imported: int = 12, own: int = 6) -> tuple[list[int], list[bytes]]:
    """``imported`` Go messages (3 commits; one id twice, as Go's copies in two channels),
    then ``own`` published ones; synced. Returns the Go ids and every frame."""
    lg = PartitionLog(path, 0, CFG)
    ids = [GO + i for i in range(imported)]
    ids[-1] = ids[0]
    step = imported // 3
    for a in range(0, imported, step):
        data, lengths = go_frames(ids[a:a + step], 1000 + a)
        lg.record_imported(ids[a:a + step])
        lg.append_frames(data, len(lengths), 1000 + a, lengths=lengths)
        lg.flush()
    for i in range(own):
        lg.append([b"own-%d" % i], 5000 + i)
        lg.flush()
    lg.sync()
    out = [bytes(lg.read_frame(o)) for o in range(lg.next_offset)]
    lg.close()
    return ids, out


def reopen(path: Path) -> tuple[PartitionLog, list[bytes]]:
    lg = PartitionLog(path, 0, CFG)
    return lg, [bytes(lg.read_frame(o)) for o in range(lg.next_offset)]


def test_frames_keep_go_ids_and_the_index_finds_them(tmp_path: Path) -> None:
    ids, frames = make(tmp_path)
    assert [f[18:34] for f in frames[:12]] == [b"%016x" % v for v in ids]
    assert frames[12][18:34] == b"%016x" % 12  # nsqx's own ids after the range
    lg, _ = reopen(tmp_path)
    assert lg.imported is not None and (lg.imported.lo, lg.imported.hi) == (0, 12)
    assert lg.imported.offsets_of(ids[0]) == [0, 11]
    assert lg.imported.offsets_of(ids[5]) == [5]
    assert lg.imported.offsets_of(GO + 100) == [] and lg.imported.offsets_of(12) == []
    lg.close()


@pytest.mark.parametrize("damage", ["no-recovery-point", "no-metadata", "lazy-entries"])
def test_recovery_keeps_the_imported_range(tmp_path: Path, damage: str) -> None:
    """Every commit verified (no recovery point), metadata rebuilt from the frames, or the
    frames adopted after the last entry: the imported frames pass the id checks."""
    _, before = make(tmp_path)
    seg = tmp_path / f"{0:020d}"
    (tmp_path / CHECKPOINT).unlink()
    if damage == "no-metadata":
        os.unlink(f"{seg}.batches")
    elif damage == "lazy-entries":  # the entries of the last commits never written
        batches = Path(f"{seg}.batches")
        os.truncate(batches, batches.stat().st_size // 3)
    lg, after = reopen(tmp_path)
    assert after == before
    lg.append([b"later"])
    lg.close()


def test_a_torn_tail_inside_the_range_shortens_it(tmp_path: Path, caplog) -> None:
    """Frames cut by a crash are gone, so is their record: nsqx's ids written there later
    pass recovery's checks."""
    _, before = make(tmp_path, own=0)
    (tmp_path / CHECKPOINT).unlink()
    log_file = tmp_path / f"{0:020d}.log"
    os.truncate(log_file, log_file.stat().st_size - 3)  # into the last imported commit
    with caplog.at_level(logging.WARNING):
        lg, after = reopen(tmp_path)
    assert after == before[:8] and lg.imported is not None and lg.imported.hi == 8
    assert any("torn tail" in r.getMessage() for r in caplog.records), caplog.text
    lg.append([b"own-%d" % i for i in range(4)])
    lg.close()
    (tmp_path / CHECKPOINT).unlink()
    lg, again = reopen(tmp_path)
    assert again[:8] == before[:8] and [f[18:34] for f in again[8:]] == [
        b"%016x" % o for o in range(8, 12)]
    lg.close()


def test_a_foreign_id_that_was_not_recorded_is_cut(tmp_path: Path) -> None:
    _, before = make(tmp_path)
    (tmp_path / CHECKPOINT).unlink()
    log_file = tmp_path / f"{0:020d}.log"
    data = bytearray(log_file.read_bytes())
    pos = sum(len(f) for f in before[:13])  # the second of nsqx's own frames
    data[pos + 18:pos + 34] = b"%016x" % (GO + 999)
    log_file.write_bytes(bytes(data))
    os.unlink(f"{log_file.with_suffix('')}.batches")  # rebuilt: frames checked one by one
    lg, after = reopen(tmp_path)
    assert after == before[:13]
    lg.close()


def test_truncate_into_the_range_cuts_the_record(tmp_path: Path) -> None:
    make(tmp_path)
    lg = PartitionLog(tmp_path, 0, CFG)
    lg.truncate_to(5)
    lg.append([b"new-%d" % i for i in range(3)])
    lg.close()
    (tmp_path / CHECKPOINT).unlink()
    lg, after = reopen(tmp_path)
    assert lg.imported is not None and lg.imported.hi == 5
    assert [f[18:34] for f in after[5:]] == [b"%016x" % o for o in range(5, 8)]
    lg.close()


def test_append_frames_takes_foreign_ids_inside_the_recorded_range_only(tmp_path: Path) -> None:
    lg = PartitionLog(tmp_path, 0, CFG)
    data, lengths = go_frames([GO, GO + 1])
    with pytest.raises(ValueError, match="carries id"):
        lg.append_frames(data, 2, 1000, lengths=lengths)  # nothing recorded
    lg.record_imported([GO + 7, GO + 1])
    with pytest.raises(ValueError, match="carries id"):
        lg.append_frames(data, 2, 1000, lengths=lengths)  # not the recorded ids
    lg.close()
    lg = PartitionLog(tmp_path / "b", 0, CFG)
    with pytest.raises(ValueError, match="could be read as an nsqx id"):
        lg.record_imported([(FOREIGN_MIN_PARTITION - 1) << 48])  # another partition's
    lg.record_imported([0, GO])  # nsqx's own id for offset 0 may be recorded
    lg.append([b"own"])
    with pytest.raises(ValueError, match="imported range ends at 2"):
        lg.record_imported([GO + 1])  # the log moved on: it ends at 1
    lg.close()


def test_a_damaged_record_refuses_to_open(tmp_path: Path) -> None:
    """Without its record recovery would cut every imported frame: refuse instead."""
    make(tmp_path)
    path = tmp_path / FILE_NAME
    raw = bytearray(path.read_bytes())
    raw[30] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(LogError, match="imported-ids: damaged"):
        PartitionLog(tmp_path, 0, CFG)


def test_retention_past_the_range_drops_the_record(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=200, index_interval_bytes=128, sync_every=10**9)
    lg = PartitionLog(tmp_path, 0, cfg)
    data, lengths = go_frames([GO, GO + 1])
    lg.record_imported([GO, GO + 1])
    lg.append_frames(data, 2, 1000, lengths=lengths)
    lg.flush()
    for i in range(20):
        lg.append([b"own-%d" % i * 10], 5000 + i)
        lg.flush()
    lg.sync()
    lg.apply_retention(lg.next_offset)
    assert lg.start_offset > 2
    lg.close()
    lg = PartitionLog(tmp_path, 0, cfg)
    assert lg.imported is None and not (tmp_path / FILE_NAME).exists()
    lg.close()
