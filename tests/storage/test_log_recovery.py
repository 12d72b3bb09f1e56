"""Recovery on open: torn/corrupt tails, damaged metadata and indexes."""

import dataclasses
import logging
import os

import pytest

from nsqx.storage.log import LogConfig, PartitionLog
from nsqx.storage.records import SegmentCorrupt

CFG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128, sync_every=10**9)
REPLICA = dataclasses.replace(CFG, cut_damaged_synced=True)  # a cluster replica


def crash(lg: PartitionLog) -> None:
    """Abandon a log like a killed process would: no flush, no fsync, fds closed."""
    for s in lg._segments:
        s.close()
    lg._closed = True


def frames(lg, start=0, end=None):
    end = lg.flushed_offset if end is None else end
    return [lg.read_frame(i) for i in range(start, end)]


def make(path, nbatches=10, sync_upto=5, mixed=True, cfg=CFG):
    lg = PartitionLog(path, 0, cfg)
    for i in range(nbatches):
        bodies = [b"%d-%d" % (i, j) * ((j % 3) + 1 if mixed else 1) for j in range(5)]
        lg.append(bodies, 1000 + i, headers=[{"i": b"%d" % i}] + [None] * 4)
        lg.flush()  # one commit per batch
        if i + 1 == sync_upto:
            lg.sync()
    return lg


def seg_file(path, suffix, base=0):
    return path / f"{base:020d}{suffix}"


def test_clean_reopen_keeps_everything(tmp_path):
    lg = make(tmp_path)
    before = frames(lg)
    crash(lg)
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before and lg.headers(45) == {"i": b"9"}
    lg.close()


@pytest.mark.parametrize("cut", [1, 10, 33])
def test_torn_log_tail_truncated(tmp_path, caplog, cut):
    lg = make(tmp_path)
    before = frames(lg)
    crash(lg)
    p = seg_file(tmp_path, ".log")
    os.truncate(p, p.stat().st_size - cut)
    with caplog.at_level(logging.WARNING):
        lg = PartitionLog(tmp_path, 0, CFG)
    assert lg.next_offset == 45  # last commit (5 records) dropped, earlier intact
    assert frames(lg) == before[:45]
    assert any("00000000000000000000.log" in r.getMessage() for r in caplog.records)
    # appending continues at the cut with the right ids
    lg.append([b"again"], 5)
    lg.flush()
    assert lg.read_frame(45).endswith(b"000000000000002dagain")
    lg.close()
    lg = PartitionLog(tmp_path, 0, CFG)
    assert lg.next_offset == 46 and frames(lg)[:45] == before[:45]
    lg.close()


def test_flipped_byte_in_tail_commit(tmp_path, caplog):
    lg = make(tmp_path)
    before = frames(lg)
    pos = lg._segments[0].poss[7]
    crash(lg)
    p = seg_file(tmp_path, ".log")
    with open(p, "r+b") as f:
        f.seek(pos + 40)
        b = f.read(1)
        f.seek(pos + 40)
        f.write(bytes([b[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING):
        lg = PartitionLog(tmp_path, 0, CFG)
    assert lg.next_offset == 35 and frames(lg) == before[:35]
    assert any(f"byte {pos}" in r.getMessage() for r in caplog.records)
    lg.close()


def test_garbage_after_last_commit(tmp_path):
    lg = make(tmp_path)
    before = frames(lg)
    crash(lg)
    with open(seg_file(tmp_path, ".log"), "ab") as f:
        f.write(b"\0\0\0\x30\0\0\0\2garbage")
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before
    lg.append([b"x"], 1)
    lg.flush()
    assert lg.next_offset == 51
    lg.close()


def test_torn_batches_entry(tmp_path):
    """A commit with headers writes its entry before its frames: a torn entry means the
    frames were never written (a valid frame tail after a torn entry is a lazy commit's,
    adopted: tests/storage/test_log_lazy_meta.py)."""
    lg = make(tmp_path)
    before = frames(lg)
    end_of_8 = lg._segments[0].poss[9]
    crash(lg)
    p = seg_file(tmp_path, ".batches")
    os.truncate(p, p.stat().st_size - 7)
    os.truncate(seg_file(tmp_path, ".log"), end_of_8)
    lg = PartitionLog(tmp_path, 0, CFG)
    assert lg.next_offset == 45 and frames(lg) == before[:45]
    lg.close()


def test_missing_batches_rebuilt_from_frames(tmp_path, caplog):
    lg = make(tmp_path)
    before = frames(lg)
    crash(lg)
    seg_file(tmp_path, ".batches").unlink()
    with caplog.at_level(logging.WARNING):
        lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before
    assert all(b.epoch == 0 for b in lg.batches())
    assert sum(b.count for b in lg.batches()) == 50
    assert any("rebuilding" in r.getMessage() for r in caplog.records)
    assert lg.offset_for_time(1005) == 25
    lg.close()


def test_corrupt_batches_middle_rebuilt(tmp_path):
    lg = make(tmp_path)
    before = frames(lg)
    crash(lg)
    with open(seg_file(tmp_path, ".batches"), "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before
    lg.close()


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", ["missing", "flip", "truncate"])
def test_indexes_rebuilt(tmp_path, suffix, damage):
    lg = make(tmp_path, nbatches=40, sync_upto=40)
    before = frames(lg)
    lg.close()
    p = seg_file(tmp_path, suffix)
    original = p.read_bytes()
    assert original
    if damage == "missing":
        p.unlink()
    elif damage == "flip":
        data = bytearray(original)
        data[len(data) // 2] ^= 0x55
        p.write_bytes(bytes(data))
    else:
        p.write_bytes(original[:-5])
    lg = PartitionLog(tmp_path, 0, CFG)
    assert p.read_bytes() == original  # rebuilt deterministically
    lg._drop_caches()
    assert frames(lg) == before
    assert lg.offset_for_time(1020) == 100
    lg.close()


def test_index_tail_missing_after_crash(tmp_path):
    lg = make(tmp_path, nbatches=40, sync_upto=40)
    crash(lg)
    p = seg_file(tmp_path, ".index")
    original = p.read_bytes()
    p.write_bytes(original[: len(original) // 2 // 20 * 20])
    lg = PartitionLog(tmp_path, 0, CFG)
    assert p.read_bytes() == original
    lg.close()


def test_torn_tail_in_earlier_segment_drops_later(tmp_path):
    cfg = LogConfig(segment_bytes=300, index_interval_bytes=64, sync_every=10**9)
    lg = make(tmp_path, nbatches=10, sync_upto=1, cfg=cfg)
    before = frames(lg)
    bases = [s.base for s in lg._segments]
    assert len(bases) >= 3
    crash(lg)
    p = seg_file(tmp_path, ".log", bases[1])
    os.truncate(p, p.stat().st_size - 3)
    lg = PartitionLog(tmp_path, 0, cfg)
    assert [s.base for s in lg._segments] == bases[:2]
    n = lg.next_offset
    assert bases[1] <= n < bases[2]
    assert frames(lg) == before[:n]
    assert not seg_file(tmp_path, ".log", bases[2]).exists()
    lg.close()


def test_empty_directory_and_missing_checkpoint(tmp_path):
    lg = make(tmp_path)
    before = frames(lg)
    lg.close()
    (tmp_path / "recovery-point").unlink()
    lg = PartitionLog(tmp_path, 0, CFG)  # verifies everything, keeps everything
    assert frames(lg) == before
    lg.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_truncation_points_keep_a_prefix(tmp_path, seed):
    import random
    import shutil

    rnd = random.Random(seed)
    src = tmp_path / "src"
    lg = make(src, nbatches=12, sync_upto=0)
    before = frames(lg)
    crash(lg)
    (src / "recovery-point").unlink(missing_ok=True)
    for k in range(8):
        d = tmp_path / f"c{k}"
        shutil.copytree(src, d)
        victim = d / f"{0:020d}{rnd.choice(['.log', '.batches', '.headers', '.index'])}"
        size = victim.stat().st_size
        os.truncate(victim, rnd.randrange(size + 1))
        lg = PartitionLog(d, 0, CFG)
        got = frames(lg)
        assert got == before[: len(got)]
        lg.append([b"after"], 7)
        lg.flush()
        assert lg.read_frame(len(got)).endswith(b"after")
        lg.close()


def test_missing_metadata_and_damaged_frame(tmp_path, caplog):
    lg = make(tmp_path)
    before = frames(lg)
    pos = lg._segments[0].poss[6]
    crash(lg)
    seg_file(tmp_path, ".batches").unlink()
    with open(seg_file(tmp_path, ".log"), "r+b") as f:
        f.seek(pos + 7)
        f.write(b"\x09")  # frame type 2 -> 9
    with caplog.at_level(logging.WARNING):
        lg = PartitionLog(tmp_path, 0, CFG)
    assert lg.next_offset == 30 and frames(lg) == before[:30]
    assert any(f"byte {pos}" in r.getMessage() for r in caplog.records)
    lg.close()


@pytest.mark.parametrize("damage", ["missing", "flip", "truncate"])
def test_frame_sizes_sidecar_is_optional(tmp_path, damage):
    lg = make(tmp_path, nbatches=20, sync_upto=20)
    before = frames(lg)
    lg.close()
    p = seg_file(tmp_path, ".sizes")
    data = p.read_bytes()
    assert len(data) == 4 * 100  # every commit is mixed-size here
    if damage == "missing":
        p.unlink()
    elif damage == "flip":
        p.write_bytes(data[:50] + bytes([data[50] ^ 1]) + data[51:])
    else:
        p.write_bytes(data[:123])
    lg = PartitionLog(tmp_path, 0, CFG)
    lg._drop_caches()
    assert frames(lg) == before  # cold reads fall back to walking the frames
    assert bytes(lg.read(3, 1 << 20).data) == b"".join(before[3:])
    lg.close()


def flip_byte(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x40]))


def test_flipped_bit_below_recovery_point_is_cut(tmp_path, caplog):
    """Issue 28: bit rot in fsynced data (below the recovery point) is found at start by the
    crc scrub, logged as an ERROR naming segment and offset, and never served: the log is
    cut at the last good batch (a replica fetches the rest again)."""
    lg = make(tmp_path, sync_upto=10)
    before = frames(lg)
    pos = lg._segments[0].poss[3]
    lg.close()
    assert lg._read_checkpoint() == 50
    flip_byte(seg_file(tmp_path, ".log"), pos + 40)
    with caplog.at_level(logging.ERROR):
        lg = PartitionLog(tmp_path, 0, REPLICA)
    assert lg.next_offset == 15 and frames(lg) == before[:15]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("00000000000000000000.log" in m and "offset 15" in m for m in errors)
    lg.close()


def test_flipped_bit_in_an_earlier_synced_segment_drops_later(tmp_path):
    cfg = LogConfig(segment_bytes=300, index_interval_bytes=64, sync_every=10**9,
                    cut_damaged_synced=True)
    lg = make(tmp_path, nbatches=10, sync_upto=10, cfg=cfg)
    before = frames(lg)
    bases = [s.base for s in lg._segments]
    assert len(bases) >= 3
    seg = lg._segments[1]
    pos, off = seg.poss[-1], seg.bases[-1]
    lg.close()
    flip_byte(seg_file(tmp_path, ".log", bases[1]), pos + 40)
    lg = PartitionLog(tmp_path, 0, cfg)
    assert lg.next_offset == off and frames(lg) == before[:off]
    assert not seg_file(tmp_path, ".log", bases[2]).exists()
    lg.close()


def test_a_lone_copy_keeps_its_log_and_refuses_the_damaged_batch(tmp_path, caplog):
    """Without a replica to fetch from (``cut_damaged_synced`` off, a standalone nsqd), the
    damage found in fsynced data does not cut the log (that would drop every later record):
    the log opens whole, the damaged batch is refused when read, the others are served."""
    lg = make(tmp_path, sync_upto=10)
    before = frames(lg)
    pos = lg._segments[0].poss[3]
    lg.close()
    flip_byte(seg_file(tmp_path, ".log"), pos + 40)
    lg = PartitionLog(tmp_path, 0, CFG)
    assert lg.next_offset == len(before)
    with caplog.at_level(logging.ERROR), pytest.raises(SegmentCorrupt):
        lg.read(0, 1 << 20)
    lg._read_ahead = 1
    assert [lg.read_frame(i) for i in range(15)] == before[:15]
    assert frames(lg, 20) == before[20:]
    lg.close()


def test_flipped_bit_is_refused_on_the_disk_read_path(tmp_path, caplog):
    """Damage after the start (or in a log read without a restart): a disk read checks each
    commit's crc and refuses the damaged batch (SegmentCorrupt, E_SEGMENT_CORRUPT) instead of
    serving it; the batches before it are still served, through read and locate alike."""
    lg = make(tmp_path, sync_upto=10)
    before = frames(lg)
    pos = lg._segments[0].poss[3]
    lg._drop_caches()
    flip_byte(seg_file(tmp_path, ".log"), pos + 40)
    with caplog.at_level(logging.ERROR), pytest.raises(SegmentCorrupt) as err:
        lg.read(0, 1 << 20)
    assert err.value.code == "E_SEGMENT_CORRUPT" and "offset 15" in str(err.value)
    assert any("offset 15" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    with pytest.raises(SegmentCorrupt):
        lg.locate(17, 1 << 20)
    lg._read_ahead = 1  # a read-ahead that ends before the damaged commit serves what is good
    assert [lg.read_frame(i) for i in range(15)] == before[:15]
    assert frames(lg, 20) == before[20:]
    lg.close()
