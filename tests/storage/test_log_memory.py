"""MemoryLog edge cases and tail/locate behaviour of the file log."""

import os

import pytest

from nsqx.storage.log import LogConfig, MemoryLog, PartitionLog


def all_frames(lg):
    return bytes(lg.read(lg.start_offset, 1 << 30).data)


@pytest.mark.parametrize("cut", [0, 1, 3, 4, 5, 9, 10, 12])
def test_memory_truncate_everywhere(cut):
    lg = MemoryLog(1, 100)
    lg.append([b"a", b"bb", b"c"], 1)
    lg.append([b"dddd"], 2)
    lg.append([b"e"] * 6, 3)
    lg.flush()
    frames = [lg.read_frame(i) for i in range(10)]
    lg.truncate_to(cut)
    assert lg.next_offset == lg.flushed_offset == min(cut, 10)
    assert all_frames(lg) == b"".join(frames[:cut])
    base = lg.append([b"z"], 9)
    lg.flush()
    assert base == min(cut, 10) and lg.read_frame(base).endswith(b"z")


def test_memory_truncate_below_start():
    lg = MemoryLog(0, 3)
    for i in range(4):
        lg.append([b"%d" % i] * 2, i)
        lg.flush()
    assert lg.start_offset == 5
    lg.truncate_to(2)
    assert lg.start_offset == lg.next_offset == 2
    assert lg.read(0, 100).count == 0
    lg.append([b"x"], 1)
    lg.flush()
    assert lg.read(0, 100).count == 1


def test_memory_headers_and_batches():
    lg = MemoryLog(0, 100)
    lg.append([b"a", b"b"], 5, headers=[None, {"k": b"v"}], epoch=2)
    lg.flush()
    assert lg.headers(1) == {"k": b"v"} and lg.headers(0) is None
    (info,) = list(lg.batches())
    assert (info.base_offset, info.count, info.epoch, info.timestamp_ns) == (0, 2, 2, 5)
    assert lg.size_bytes() == 2 * 35
    assert lg.apply_retention(10) == 0


def test_file_locate_from_tail_and_disk(tmp_path):
    lg = PartitionLog(tmp_path, 0, LogConfig(mem_tail_bytes=1 << 20))
    lg.append([b"u" * 10] * 20, 1)  # uniform
    lg.append([os.urandom(i) for i in range(20)], 2)  # mixed
    lg.flush()
    for off in (0, 5, 19, 20, 33):
        fd, pos, nbytes, count = lg.locate(off, 100, 3)
        assert count >= 1
        assert os.pread(fd, nbytes, pos) == bytes(lg.read(off, 100, 3).data)
    lg._drop_caches()
    for off in (0, 5, 19, 20, 33):
        fd, pos, nbytes, count = lg.locate(off, 100, 3)
        assert os.pread(fd, nbytes, pos) == bytes(lg.read(off, 100, 3).data)
    assert lg.locate(40, 100)[2:] == (0, 0)
    lg.close()


def test_tail_is_bounded(tmp_path):
    lg = PartitionLog(tmp_path, 0, LogConfig(mem_tail_bytes=1000))
    for i in range(50):
        lg.append([b"%03d" % i * 10], i)
        lg.flush()
    assert lg._tail_bytes <= 1000 + 64
    assert lg.read(0, 1 << 20).count == 50  # old ones from disk
    lg.close()


def test_closed_log_rejects_append(tmp_path):
    from nsqx.storage.log import LogError

    lg = PartitionLog(tmp_path, 0)
    lg.close()
    with pytest.raises(LogError):
        lg.append([b"x"])
