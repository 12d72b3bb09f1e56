"""A replica's log: frames copied from a leader's log give the same bytes at the same offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqx.storage.log import LogConfig, PartitionLog, frame_lengths


def copy_all(src: PartitionLog, dst: PartitionLog, epoch: int = 3) -> None:
    off = dst.next_offset
    while off < src.flushed_offset:
        r = src.read(off, 1 << 20, src.flushed_offset - off)
        ts = int.from_bytes(bytes(r.data[8:16]), "big")
        dst.append_frames(bytes(r.data), r.count, ts, epoch=epoch)
        off += r.count
    dst.flush()


@pytest.mark.parametrize("sizes", [[100] * 50, [1, 500, 20, 3000, 7] * 10])
def test_copied_frames_are_the_same_bytes(tmp_path: Path, sizes: list[int]) -> None:
    cfg = LogConfig(segment_bytes=8 << 10)  # several segments
    with PartitionLog(tmp_path / "leader", 2, cfg) as leader, \
            PartitionLog(tmp_path / "replica", 2, cfg) as replica:
        for i in range(0, len(sizes), 7):
            leader.append([bytes([65 + j % 26]) * n for j, n in enumerate(sizes[i:i + 7])],
                          headers=[{"k": b"%d" % i}] + [None] * (len(sizes[i:i + 7]) - 1))
            leader.flush()
        copy_all(leader, replica)
        assert replica.flushed_offset == leader.flushed_offset == len(sizes)
        for off in range(len(sizes)):
            assert replica.read_frame(off) == leader.read_frame(off)
        assert {b.epoch for b in replica.batches()} == {3}
        want = {off: leader.headers(off) for off in range(len(sizes)) if leader.headers(off)}
        assert leader.headers_range(0, len(sizes)) == want
        assert leader.headers_range(7, 8) == {7: {"k": b"7"}}
        assert leader.headers_range(8, 14) == {}
    with PartitionLog(tmp_path / "replica", 2, cfg) as again:  # recovery accepts it
        assert again.flushed_offset == len(sizes)


def test_foreign_or_malformed_frames_are_refused(tmp_path: Path) -> None:
    with PartitionLog(tmp_path / "a", 0) as a, PartitionLog(tmp_path / "b", 1) as b, \
            PartitionLog(tmp_path / "c", 0) as c:
        a.append([b"x" * 10, b"y" * 10])
        a.flush()
        data = bytes(a.read(0, 1 << 20, 2).data)
        with pytest.raises(ValueError, match="carries id"):
            b.append_frames(data, 2, 1)  # another partition's ids
        c.append([b"first"])
        c.flush()
        with pytest.raises(ValueError, match="carries id"):
            c.append_frames(data, 2, 1)  # offsets 0-1, but c's next is 1
        for bad, n in ((data[:-3], 2), (data + b"zz", 2), (data, 3), (b"\0" * 40, 1)):
            with pytest.raises(ValueError):
                frame_lengths(bad, n)
        with pytest.raises(ValueError, match="lengths do not match"):
            c.append_frames(data, 2, 1, lengths=[10, 10])
        assert c.next_offset == 1  # nothing was buffered by a refused call
