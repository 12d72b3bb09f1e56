"""One write per commit: lazy metadata entries, and recovery adopting the frames after them.

Segment.write_single writes only the frames of a commit in the same epoch as the
previous one; the entries wait in memory (LAZY_MAX at most). A kill -9 then leaves
frames after the last entry; recovery must keep every one of them (they were acked)
and cut whatever is torn or invalid.
"""

import os

import pytest

from nsqx.storage.log import LogConfig, PartitionLog
from nsqx.storage.segment import ENTRY_SIZE, LAZY_MAX

CFG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128, sync_every=10**9)


def crash(lg: PartitionLog) -> None:
    """Abandon a log as a killed process would: nothing more written, fds closed."""
    for s in lg._segments:
        s.close()
    lg._closed = True


def frames(lg):
    return [lg.read_frame(i) for i in range(lg.start_offset, lg.flushed_offset)]


def seg_file(path, suffix, base=0):
    return path / f"{base:020d}{suffix}"


def publish(lg, n, start=0, epoch=0, mixed=False):
    """n commits of one or three messages, one flush each (the fast path)."""
    for i in range(start, start + n):
        if mixed:
            lg.append([b"m%d" % i, b"x" * (i % 7), b"yy"], 1000 + i, epoch=epoch)
        else:
            lg.append([b"p%05d" % i], 1000 + i, epoch=epoch)
        lg.flush()


def test_fast_commit_is_one_write(tmp_path, monkeypatch):
    lg = PartitionLog(tmp_path, 0, CFG)
    publish(lg, 1)  # the first commit of a segment writes its entry
    writes = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, b: writes.append(fd) or real(fd, b))
    publish(lg, 5, start=1)
    assert len(writes) == 5 and set(writes) == {lg._segments[0].log_fd}
    monkeypatch.undo()
    seg = lg._segments[0]
    assert os.fstat(seg.meta_fd).st_size == ENTRY_SIZE and len(seg.lazy) == 5
    # readers of the metadata see the waiting entries
    assert [b.base_offset for b in lg.batches()] == list(range(6))
    lg.close()
    assert seg_file(tmp_path, ".batches").stat().st_size == 6 * ENTRY_SIZE


def test_lazy_entries_written_in_groups(tmp_path):
    lg = PartitionLog(tmp_path, 0, CFG)
    publish(lg, 1 + LAZY_MAX + 3)
    seg = lg._segments[0]
    # the commit after LAZY_MAX waiting ones wrote them first
    assert os.fstat(seg.meta_fd).st_size == (1 + LAZY_MAX) * ENTRY_SIZE
    assert len(seg.lazy) == 3
    lg.close()


@pytest.mark.parametrize("mixed", [False, True])
def test_crash_keeps_lazy_commits(tmp_path, mixed):
    lg = PartitionLog(tmp_path, 0, CFG)
    lg.append([b"h1", b"h2"], 999, headers=[{"k": b"v"}, None])  # general path, entry first
    lg.flush()
    publish(lg, 40, mixed=mixed)
    lg.sync()
    publish(lg, 30, start=40, mixed=mixed)  # not fsynced: in the page cache only
    before = frames(lg)
    crash(lg)
    assert seg_file(tmp_path, ".batches").stat().st_size < 71 * ENTRY_SIZE
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before
    assert lg.headers(0) == {"k": b"v"}
    assert lg.offset_for_time(1000 + 50) <= (50 * 3 if mixed else 50) + 2
    # appending goes on after the adopted frames, and the next restart is clean
    publish(lg, 2, start=70, mixed=mixed)
    after = frames(lg)
    lg.close()
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == after
    lg.close()


def test_adopted_commits_take_the_last_epoch_and_torn_frame_is_cut(tmp_path):
    lg = PartitionLog(tmp_path, 0, CFG)
    publish(lg, 5, epoch=3)
    publish(lg, 5, start=5, epoch=4)  # the first commit of epoch 4 writes its entry first
    seg = lg._segments[0]
    # commit 0, the four waiting ones (written before it), commit 5; 6-9 wait
    assert os.fstat(seg.meta_fd).st_size == 6 * ENTRY_SIZE and len(seg.lazy) == 4
    before = frames(lg)
    crash(lg)
    p = seg_file(tmp_path, ".log")
    os.truncate(p, p.stat().st_size - 3)  # the last frame torn
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before[:9]
    assert [b.epoch for b in lg.batches()][-1] == 4
    assert {b.epoch for b in lg.batches() if b.base_offset >= 5} == {4}
    assert {b.epoch for b in lg.batches() if b.base_offset < 5} == {3}
    lg.close()


def test_torn_lazy_entries_write_keeps_frames(tmp_path):
    """A kill -9 inside the write of the waiting entries (a page boundary) leaves a
    partial entry: it is dropped and the frames after the whole ones are adopted."""
    lg = PartitionLog(tmp_path, 0, CFG)
    publish(lg, 1 + LAZY_MAX + 1)  # commit 1 + LAZY_MAX wrote the 64 waiting entries
    before = frames(lg)
    crash(lg)
    p = seg_file(tmp_path, ".batches")
    os.truncate(p, 20 * ENTRY_SIZE + 50)
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before
    lg.close()


def test_garbage_after_lazy_commits_is_cut(tmp_path):
    lg = PartitionLog(tmp_path, 0, CFG)
    publish(lg, 10)
    before = frames(lg)
    crash(lg)
    with open(seg_file(tmp_path, ".log"), "ab") as f:
        # a whole frame of the right type, but not the id of offset 10
        f.write(b"\0\0\0\x24\0\0\0\2" + b"\0" * 10 + b"%016x" % 99 + b"zz")
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before
    publish(lg, 1, start=10)
    assert lg.read_frame(10).endswith(b"000000000000000ap00010")
    lg.close()


def test_truncate_to_with_waiting_entries(tmp_path):
    lg = PartitionLog(tmp_path, 0, CFG)
    publish(lg, 20)
    before = frames(lg)
    lg.truncate_to(12)
    assert frames(lg) == before[:12] and not lg._segments[0].lazy
    publish(lg, 3, start=12)
    after = frames(lg)
    crash(lg)
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == after
    lg.close()


def test_segment_roll_writes_waiting_entries(tmp_path):
    cfg = LogConfig(segment_bytes=1000, index_interval_bytes=128, sync_every=10**9)
    lg = PartitionLog(tmp_path, 0, cfg)
    publish(lg, 100)
    assert len(lg._segments) > 2
    assert all(not s.lazy for s in lg._segments[:-1])
    before = frames(lg)
    crash(lg)
    lg = PartitionLog(tmp_path, 0, cfg)
    assert frames(lg) == before
    lg.close()


def test_each_sync_writes_the_waiting_entries_first(tmp_path):
    """The committer writes the waiting entries on the loop before every fsync (interval,
    count and close), so they are at most one sync interval's commits."""
    import asyncio

    from nsqx.storage.commit import GroupCommitter

    async def main():
        lg = PartitionLog(tmp_path, 0, LogConfig(segment_bytes=1 << 20, sync_every=10**9,
                                                 sync_interval=0.05))
        gc = GroupCommitter(lg)
        for i in range(10):
            await gc.append([b"m%d" % i], 1000 + i)
        seg = lg._segments[0]
        assert len(seg.lazy) == 9
        for _ in range(200):  # the interval fsync
            if lg.synced_offset == 10:
                break
            await asyncio.sleep(0.01)
        assert lg.synced_offset == 10 and not seg.lazy
        assert os.fstat(seg.meta_fd).st_size == 10 * ENTRY_SIZE
        await gc.append([b"last"], 2000)
        assert len(seg.lazy) == 1
        await gc.close()
        assert not seg.lazy and os.fstat(seg.meta_fd).st_size == 11 * ENTRY_SIZE
        lg.close()

    asyncio.run(main())
