"""A commit with headers written lazily: its headers record, then its frames, its entry later.

Segment.write_single writes a marked batch (an idempotent producer's, the mark on its first
message) like a plain one: frames, the entry waiting in memory, with one more write before
them, the headers record (a head naming the commit's base, count and frames' length, then
the blob). Recovery after a kill -9 must give adopted frames their headers back, never adopt
frames whose headers are not there, cut a record whose frames are not, and still read the
bare blobs of data directories written before the records existed.
"""

import os
import random
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from nsqx.storage.log import LogConfig, PartitionLog
from nsqx.storage.segment import ENTRY_SIZE, HDR_HEAD_SIZE

CFG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128, sync_every=10**9)
DATA = Path(__file__).parent / "data" / "headers_v0"


def crash(lg: PartitionLog) -> None:
    """Abandon a log as a killed process would: nothing more written, fds closed."""
    for s in lg._segments:
        s.close()
    lg._closed = True


def frames(lg):
    return [lg.read_frame(i) for i in range(lg.start_offset, lg.flushed_offset)]


def all_headers(lg):
    return {o: h for o in range(lg.start_offset, lg.flushed_offset)
            if (h := lg.headers(o)) is not None}


def seg_file(path, suffix, base=0):
    return path / f"{base:020d}{suffix}"


def mark(i: int) -> dict:
    return {"##nsqx_producer": b"p:0:%d" % i}


def publish(lg, n, start=0, every=1):
    """n commits of 1-3 messages, one flush each (the fast path); commit i is marked when
    i % every == 0. Returns the expected headers by offset."""
    want = {}
    for i in range(start, start + n):
        k = 1 + i % 3
        marked = i % every == 0
        base = lg.append([b"m%d-%d" % (i, j) for j in range(k)], 1000 + i,
                         headers=[mark(i)] + [None] * (k - 1) if marked else None)
        lg.flush()
        if marked:
            want[base] = mark(i)
    return want


def test_marked_fast_commit_is_two_writes_and_its_entry_waits(tmp_path, monkeypatch):
    lg = PartitionLog(tmp_path, 0, CFG)
    want = publish(lg, 1)  # the first commit of a segment writes its entry
    seg = lg._segments[0]
    writes = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, b: writes.append(fd) or real(fd, b))
    want |= publish(lg, 5, start=1)
    monkeypatch.undo()
    # per commit: the headers record, then the frames; no entry, no index entry
    assert writes == [seg.hdr_fd, seg.log_fd] * 5
    assert os.fstat(seg.meta_fd).st_size == ENTRY_SIZE and len(seg.lazy) == 5
    assert all_headers(lg) == want
    lg.close()
    lg = PartitionLog(tmp_path, 0, CFG)
    assert all_headers(lg) == want
    lg.close()


def test_crash_keeps_lazy_marked_commits_with_their_headers(tmp_path):
    lg = PartitionLog(tmp_path, 0, CFG)
    want = publish(lg, 30, every=2)  # marked and plain commits interleaved
    lg.sync()
    want |= publish(lg, 25, start=30, every=2)  # not fsynced, entries waiting
    before = frames(lg)
    assert all_headers(lg) == want
    crash(lg)
    assert seg_file(tmp_path, ".batches").stat().st_size < 55 * ENTRY_SIZE
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before
    assert all_headers(lg) == want
    # appending goes on after the adopted commits, and the next restart is clean
    want |= publish(lg, 3, start=55, every=1)
    after = frames(lg)
    lg.close()
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == after and all_headers(lg) == want
    lg.close()


def test_crash_with_only_marked_commits_waiting(tmp_path):
    """An idempotent producer's log: every commit marked, all entries but the first wait."""
    lg = PartitionLog(tmp_path, 0, CFG)
    want = publish(lg, 40)
    before = frames(lg)
    crash(lg)
    assert seg_file(tmp_path, ".batches").stat().st_size == ENTRY_SIZE
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before and all_headers(lg) == want
    assert len(list(lg.batches())) == 40  # one entry per marked commit
    lg.close()


def test_headers_written_frames_not(tmp_path):
    """A kill -9 between a marked commit's headers record and its frames: the record is
    cut (nothing was acknowledged), the commits before it stay whole."""
    lg = PartitionLog(tmp_path, 0, CFG)
    want = publish(lg, 10, every=2)
    before = frames(lg)
    hdr_size = seg_file(tmp_path, ".headers").stat().st_size
    crash(lg)
    # the record of a next marked commit (at offset len(before)) written, its frames not:
    # made by a log whose only commit without headers ends at that offset
    probe = PartitionLog(tmp_path / "probe", 0, CFG)
    probe.append([b"x"] * len(before), 1)
    probe.flush()
    probe.append([b"n"], 2000, headers=[mark(99)])
    probe.flush()
    tail = seg_file(tmp_path / "probe", ".headers").read_bytes()
    probe.close()
    assert len(tail) > HDR_HEAD_SIZE
    with open(seg_file(tmp_path, ".headers"), "ab") as f:
        f.write(tail)
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before and all_headers(lg) == want
    assert seg_file(tmp_path, ".headers").stat().st_size == hdr_size  # the orphan is cut
    # the next commit takes that offset, with its own headers
    want |= publish(lg, 2, start=10, every=1)
    after = frames(lg)
    lg.close()
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == after and all_headers(lg) == want
    lg.close()


def test_frames_written_headers_torn_are_not_adopted(tmp_path):
    """Frames whose headers record is torn (its head whole, its blob not: the kernel wrote
    part of it) are never adopted as a plain commit's: the adoption stops before them (a
    retry of the batch would otherwise be stored twice, its mark lost). The plain commit
    written before that record is kept.

    (A record missing entirely with its frames present cannot be told from plain frames;
    it cannot happen either: the record is written before its frames, as an eager
    commit's entry is.)"""
    lg = PartitionLog(tmp_path, 0, CFG)
    want = publish(lg, 8, every=2)  # commits 0..7; 0, 2, 4, 6 marked, 7 plain
    before = frames(lg)
    base6 = sum(1 + i % 3 for i in range(6))
    crash(lg)
    hp = seg_file(tmp_path, ".headers")
    raw = hp.read_bytes()
    # commit 6's record is the last one: tear its blob (its last byte flipped)
    hp.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before[:base6]
    assert all_headers(lg) == {o: h for o, h in want.items() if o < base6}
    assert hp.stat().st_size == raw.rfind(b"NQH1")  # the torn record is cut
    lg.close()
    # blob cut short (a partial write): the same
    d = tmp_path / "again"
    lg = PartitionLog(d, 0, CFG)
    publish(lg, 8, every=2)
    crash(lg)
    hp = seg_file(d, ".headers")
    hp.write_bytes(raw[:-3])
    lg = PartitionLog(d, 0, CFG)
    assert frames(lg) == before[:base6]
    lg.close()


def test_torn_frames_of_a_marked_commit_are_cut_with_its_record(tmp_path):
    lg = PartitionLog(tmp_path, 0, CFG)
    want = publish(lg, 7, every=2)  # the last commit (6) marked
    before = frames(lg)
    base6 = sum(1 + i % 3 for i in range(6))
    crash(lg)
    p = seg_file(tmp_path, ".log")
    os.truncate(p, p.stat().st_size - 3)
    lg = PartitionLog(tmp_path, 0, CFG)
    assert frames(lg) == before[:base6]
    assert all_headers(lg) == {o: h for o, h in want.items() if o < base6}
    want = {o: h for o, h in want.items() if o < base6} | publish(lg, 1, start=20, every=1)
    lg.close()
    lg = PartitionLog(tmp_path, 0, CFG)
    assert all_headers(lg) == want
    lg.close()


def test_old_data_directory_opens(tmp_path):
    """A log written before the records (bare blobs in .headers; every commit with headers
    eager), closed cleanly: read, appended to, reopened."""
    d = tmp_path / "log"
    shutil.copytree(DATA / "closed", d)
    lg = PartitionLog(d, 0, CFG)
    old = {o: {"##nsqx_producer": b"p:0:%d" % i}
           for o, i in ((0, 0), (3, 2), (7, 4), (12, 6), (15, 8), (19, 10))}
    assert lg.next_offset == 24 and all_headers(lg) == old
    assert lg.read_frame(0).endswith(b"old0-0")
    want = old | publish(lg, 4, start=100, every=1)
    after = frames(lg)
    lg.close()
    lg = PartitionLog(d, 0, CFG)
    assert frames(lg) == after and all_headers(lg) == want
    lg.close()


def test_old_data_directory_crashed(tmp_path):
    """A log of the old format left by a kill -9: its waiting plain commits are adopted;
    with the last entry torn as well, the bare blob past it is not taken for a record."""
    d = tmp_path / "log"
    shutil.copytree(DATA / "crashed", d)
    old = {o: {"##nsqx_producer": b"p:0:%d" % i} for o, i in ((0, 0), (6, 3), (12, 6), (18, 9))}
    lg = PartitionLog(d, 0, CFG)
    assert lg.next_offset == 24 and all_headers(lg) == old
    assert lg.read_frame(23).endswith(b"old11-2")
    lg.close()
    shutil.rmtree(d)
    shutil.copytree(DATA / "crashed", d)
    # entry of commit 9 (offset 18, with headers) torn: the old writer had not written its
    # frames yet either, so they are gone too (here: cut from the .log by hand)
    b = d / f"{0:020d}.batches"
    os.truncate(b, 9 * ENTRY_SIZE + 10)
    lg0 = seg_file(d, ".log")
    data = lg0.read_bytes()
    os.truncate(lg0, data.index(b"old9-0") - 34)
    lg = PartitionLog(d, 0, CFG)
    assert lg.next_offset == 18
    assert all_headers(lg) == {o: h for o, h in old.items() if o < 18}
    want = {o: h for o, h in old.items() if o < 18} | publish(lg, 2, start=50, every=1)
    lg.close()
    lg = PartitionLog(d, 0, CFG)
    assert all_headers(lg) == want
    lg.close()


WRITER = textwrap.dedent("""
    import asyncio, random, sys
    from nsqx.storage.commit import GroupCommitter
    from nsqx.storage.log import LogConfig, PartitionLog

    async def producer(lg, gc, rnd):
        while True:
            n = rnd.choice([1, 1, 2, 5, 30])
            base = lg.next_offset
            hdrs = [{"m": b"%d:%d" % (base, n)}] + [None] * (n - 1)
            fut = gc.append([b"b%d" % (base + j) for j in range(n)], base * 1000,
                            headers=hdrs)
            got = await fut
            assert got == base
            sys.stdout.write(f"{base} {n}\\n")
            sys.stdout.flush()

    async def main():
        # no fsync: acknowledged once written (the page cache survives a kill -9), so
        # lazily written commits are what a kill leaves
        lg = PartitionLog(sys.argv[1], 3, LogConfig(segment_bytes=256 * 1024,
                                                    sync_every=10**9, sync_interval=3600,
                                                    index_interval_bytes=1024))
        gc = GroupCommitter(lg)
        sys.stdout.write(f"ready {lg.next_offset}\\n")
        sys.stdout.flush()
        rnd = random.Random(int(sys.argv[2]))
        lanes = int(sys.argv[3])
        await asyncio.gather(*(producer(lg, gc, rnd) for _ in range(lanes)))

    asyncio.run(main())
""")


def test_kill_9_every_adopted_frame_keeps_its_batch_headers(tmp_path):
    """SIGKILL a writer whose every batch carries a header on its first message (one lane:
    one batch per flush, the lazy path; four: several per flush, the general path). After
    each kill every acknowledged batch is there, and the log is made of whole batches each
    with its header: no frame was adopted without its batch's headers."""
    rnd = random.Random(33)
    path = tmp_path / "log"
    acked_end = 0
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for cycle in range(6):
        lanes = 1 if cycle % 3 else 4
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(cycle),
                                 str(lanes)], stdout=subprocess.PIPE, env=env)
        try:
            line = proc.stdout.readline().split()
            assert line and line[0] == b"ready", line
            assert int(line[1]) >= acked_end
            deadline = time.monotonic() + rnd.uniform(0.05, 0.4)
            buf = b""
            fd = proc.stdout.fileno()
            while time.monotonic() < deadline:
                r, _, _ = select.select([fd], [], [], 0.01)
                if r:
                    buf += os.read(fd, 65536)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            buf += proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        for ln in buf.split(b"\n"):
            parts = ln.split()
            if len(parts) == 2:
                acked_end = max(acked_end, int(parts[0]) + int(parts[1]))
        lg = PartitionLog(path, 3, LogConfig(segment_bytes=256 * 1024,
                                             index_interval_bytes=1024))
        try:
            end = lg.next_offset
            assert end >= acked_end, f"cycle {cycle}: lost acknowledged records"
            hdrs = lg.headers_range(0, end)
            o = 0
            while o < end:  # whole batches, each with its header, back to back
                h = hdrs.get(o)
                assert h is not None, f"cycle {cycle}: offset {o} adopted without headers"
                b, n = map(int, h["m"].split(b":"))
                assert b == o and o + n <= end
                assert all(o + j not in hdrs for j in range(1, n))
                assert lg.read_frame(o + n - 1).endswith(b"b%d" % (o + n - 1))
                o += n
        finally:
            lg.close()
    assert acked_end > 0
