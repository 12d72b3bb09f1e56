import os
import struct

import pytest

from nsqx.storage.log import LogConfig, MemoryLog, PartitionLog
from nsqx.storage.message_id import ids_for_range, make_id
from nsqx.storage.records import build_frames, build_frames_general, build_frames_mixed


def frame(body: bytes, off: int, ts: int, partition: int = 0, attempts: int = 1) -> bytes:
    return (struct.pack(">IIqH", 30 + len(body), 2, ts, attempts) + make_id(partition, off)
            + body)


def small_cfg(**kw) -> LogConfig:
    base = dict(segment_bytes=4096, index_interval_bytes=256, mem_tail_bytes=2048)
    base.update(kw)
    return LogConfig(**base)


def read_all(lg, start=0, max_bytes=1 << 30):
    out = []
    off = start
    while True:
        r = lg.read(off, max_bytes)
        if not r.count:
            return b"".join(out), off
        out.append(bytes(r.data))
        off = r.next_offset


@pytest.fixture(params=["file", "memory"])
def anylog(request, tmp_path):
    if request.param == "file":
        lg = PartitionLog(tmp_path / "p", 2, small_cfg())
    else:
        lg = MemoryLog(2, mem_queue_size=10**9)
    yield lg
    lg.close()


def test_frames_are_nsq_wire_format(anylog):
    base = anylog.append([b"hello", b""], 1234)
    assert base == 0 and anylog.next_offset == 2
    assert anylog.flushed_offset == 0
    assert anylog.read(0, 100).count == 0  # not readable before flush
    assert anylog.flush() == 2
    assert anylog.read_frame(0) == frame(b"hello", 0, 1234, 2)
    assert anylog.read_frame(1) == frame(b"", 1, 1234, 2)
    with pytest.raises(KeyError):
        anylog.read_frame(2)


def test_fast_and_general_paths_identical():
    for bodies in ([b"a" * 10] * 50, [b"", b""], [b"x" * 5, b"y" * 6], [os.urandom(100)] * 3,
                   [b"q" * 7], [bytes([i % 250]) * (i % 300) for i in range(5000)]):
        n = len(bodies)
        ids = ids_for_range(1, 77, n)
        fast, flen = build_frames(bodies, ids, 99)
        assert fast == build_frames_general(bodies, ids, 99) == build_frames_mixed(bodies, ids, 99)
        assert fast == b"".join(frame(b, 77 + i, 99, 1) for i, b in enumerate(bodies))
        assert bool(flen) == (len({len(b) for b in bodies}) == 1)


def test_read_limits(anylog):
    bodies = [bytes([i]) * (i % 13) for i in range(200)]
    for i in range(0, 200, 10):
        anylog.append(bodies[i : i + 10], 5000 + i)
    anylog.flush()
    expect = [frame(b, i, 5000 + i - i % 10, 2) for i, b in enumerate(bodies)]
    r = anylog.read(3, 1 << 20, max_count=7)
    assert (r.start, r.count, r.next_offset) == (3, 7, 10)
    assert bytes(r.data) == b"".join(expect[3:10])
    # max_bytes cuts at a frame boundary; at least one frame even if bigger than max_bytes
    r = anylog.read(0, 1)
    assert r.count == 1 and bytes(r.data) == expect[0]
    r = anylog.read(0, len(expect[0]) + len(expect[1]) + 5)
    assert r.count == 2
    # crossing batches
    r = anylog.read(5, sum(map(len, expect[5:37])))
    assert r.count == 32 and bytes(r.data) == b"".join(expect[5:37])
    assert anylog.read(200, 100).count == 0
    assert anylog.read(0, 1 << 20, max_count=0).count == 0
    data, end = read_all(anylog, 0, 300)
    assert data == b"".join(expect) and end == 200


def test_offset_for_time_and_batches(anylog):
    anylog.append([b"a"] * 3, 100)
    anylog.append([b"b"] * 2, 200, epoch=4)
    anylog.flush()
    anylog.append([b"c"], 300)
    anylog.flush()
    assert anylog.offset_for_time(0) == 0
    assert anylog.offset_for_time(100) == 0
    assert anylog.offset_for_time(101) == 3
    assert anylog.offset_for_time(300) == 5
    assert anylog.offset_for_time(301) == 6
    infos = list(anylog.batches())
    assert sum(b.count for b in infos) == 6
    assert infos[0].base_offset == 0
    assert {b.epoch for b in infos} == {0, 4}
    assert [b.commit_id for b in infos] == sorted({b.commit_id for b in infos})
    assert list(anylog.batches(5))[0].base_offset <= 5


def test_headers(anylog):
    anylog.append([b"1", b"2", b"3"], 1, headers=[{"trace": b"t1"}, None, {"k": b"", "tag": b"x"}])
    anylog.append([b"4"], 2)
    anylog.flush()
    assert anylog.headers(0) == {"trace": b"t1"}
    assert anylog.headers(1) is None
    assert anylog.headers(2) == {"k": b"", "tag": b"x"}
    assert anylog.headers(3) is None
    assert anylog.headers(99) is None


def test_truncate_to(anylog):
    for i in range(20):
        anylog.append([b"m%d" % j for j in range(i % 4 + 1)], 10 + i)
    anylog.flush()
    full, end = read_all(anylog)
    frames_before = bytes(anylog.read(0, 1 << 30, max_count=23).data)
    anylog.truncate_to(23)
    assert anylog.next_offset == anylog.flushed_offset == 23
    assert read_all(anylog)[0] == frames_before
    anylog.append([b"new"], 999)
    anylog.flush()
    assert anylog.read_frame(23) == frame(b"new", 23, 999, 2)
    anylog.truncate_to(0)
    assert anylog.next_offset == 0 and anylog.read(0, 100).count == 0


def test_truncate_drops_pending(anylog):
    anylog.append([b"a", b"b"], 1)
    anylog.flush()
    anylog.append([b"c"], 2)
    anylog.truncate_to(1)
    assert anylog.next_offset == 1
    anylog.flush()
    assert read_all(anylog)[1] == 1


def test_file_log_segments_reopen_and_locate(tmp_path):
    cfg = small_cfg()
    lg = PartitionLog(tmp_path, 1, cfg)
    expect = []
    for i in range(300):
        bodies = [os.urandom((i * 7 + j) % 90) for j in range(i % 5 + 1)]
        base = lg.append(bodies, 1000 + i)
        expect += [frame(b, base + j, 1000 + i, 1) for j, b in enumerate(bodies)]
        if i % 3 == 0:
            lg.flush()
    lg.flush()
    assert len(lg._segments) > 5
    assert read_all(lg)[0] == b"".join(expect)
    lg.close()
    files = sorted(os.listdir(tmp_path))
    assert "00000000000000000000.log" in files and "00000000000000000000.index" in files
    lg = PartitionLog(tmp_path, 1, cfg)
    assert lg.next_offset == len(expect) == lg.flushed_offset == lg.synced_offset
    for off in (0, 1, 17, 400, len(expect) - 1):
        assert lg.read_frame(off) == expect[off]
        fd, pos, nbytes, count = lg.locate(off, 300, 4)
        assert 1 <= count <= 4
        assert os.pread(fd, nbytes, pos) == b"".join(expect[off : off + count])
    assert lg.locate(len(expect), 100)[3] == 0
    # cold reads from every segment (no tail)
    lg._drop_caches()
    assert read_all(lg, 0, 1000)[0] == b"".join(expect)
    lg.close()


def test_retention(tmp_path):
    lg = PartitionLog(tmp_path, 0, small_cfg())
    for i in range(100):
        lg.append([b"x" * 100] * 3, i * 10**9)
        lg.flush()
    nseg = len(lg._segments)
    assert lg.apply_retention(0) == 0
    start = lg.apply_retention(150)
    assert 0 < start <= 150 and len(lg._segments) < nseg
    assert lg.read(0, 1 << 20).start == start
    lg.close()

    cfg = small_cfg(retention_seconds=50)
    lg = PartitionLog(tmp_path, 0, cfg)
    before = lg.start_offset
    assert lg.apply_retention(300, now=0) == before  # nothing is old yet
    start = lg.apply_retention(300, now=200)  # every record older than 50 s
    assert start > before
    lg.config.hard_size_cap = 5000
    start = lg.apply_retention(0)
    assert lg.size_bytes() <= 5000 or len(lg._segments) == 1
    assert lg.read(0, 1 << 20).start == start == lg.start_offset
    lg.close()


def test_memory_log_drops_oldest():
    lg = MemoryLog(0, mem_queue_size=10)
    for i in range(5):
        lg.append([b"%d" % (i * 4 + j) for j in range(4)], i)
        lg.flush()
    assert lg.start_offset == 10 and lg.next_offset == 20
    r = lg.read(0, 1 << 20)
    assert r.start == 10 and r.count == 10
    assert lg.read_frame(10) == frame(b"10", 10, 2)
    with pytest.raises(KeyError):
        lg.read_frame(9)
    assert lg.dropped == 10


def test_idle_log_releases_its_files_and_reopens_them(tmp_path):
    """A log holds no descriptors after recovery or release_files(); every operation
    reopens what it needs and appends continue at the files' ends."""
    cfg = small_cfg()
    lg = PartitionLog(tmp_path, 0, cfg)
    assert lg.open_files == 0  # a new, empty log opens nothing until used
    expect = []
    for i in range(40):
        bodies = [os.urandom(i % 70 + 40) for _ in range(3)]
        base = lg.append(bodies, 1000 + i)
        expect += [frame(b, base + j, 1000 + i) for j, b in enumerate(bodies)]
        lg.flush()
        if i % 7 == 0:
            assert not lg.release_files()  # written but not synced: kept open
            lg.sync()
            assert lg.release_files() and lg.open_files == 0
    assert len(lg._segments) > 2
    lg.sync()
    assert lg.release_files() and lg.open_files == 0
    lg._drop_caches()
    assert read_all(lg)[0] == b"".join(expect)  # cold reads reopen the segments
    assert lg.open_files > 0
    lg.sync()
    lg.release_files()
    lg.truncate_to(len(expect) - 5)
    expect = expect[:-5]
    lg.release_files()
    base = lg.append([b"after"], 5000)
    lg.flush()
    expect.append(frame(b"after", base, 5000))
    lg.sync()
    lg.close()
    lg = PartitionLog(tmp_path, 0, cfg)
    assert lg.open_files == 0  # recovery closes what it verified
    assert lg.next_offset == len(expect)
    assert read_all(lg)[0] == b"".join(expect)
    lg.close()
