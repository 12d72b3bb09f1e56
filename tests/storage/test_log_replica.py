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


def copy_commits(src: PartitionLog, dst: PartitionLog) -> int:
    """A replica's fetch loop: the leader's commits as they are (no frame walk)."""
    off, calls = dst.next_offset, 0
    while off < src.flushed_offset:
        r = src.read(off, 1 << 20, src.flushed_offset - off)
        commits = src.commits_range(off, off + r.count)
        assert commits is not None
        pos, data = 0, bytes(r.data)
        for base, count, ts, max_ts, epoch, flen, lengths in commits:
            size = count * flen if flen else sum(lengths)
            assert dst.append_frames(data[pos:pos + size], count, ts, epoch=epoch, flen=flen,
                                     lengths=lengths, max_ts=max_ts) == base
            pos += size
            calls += 1
        assert pos == len(data)
        off += r.count
        dst.flush()
    return calls


@pytest.mark.parametrize("fast", [True, False])
def test_commits_copied_as_listed_keep_bytes_times_and_epochs(tmp_path: Path, fast: bool,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(PartitionLog, "_fast_commit", fast)
    cfg = LogConfig(segment_bytes=8 << 10)
    with PartitionLog(tmp_path / "leader", 1, cfg) as leader, \
            PartitionLog(tmp_path / "replica", 1, cfg) as replica:
        t = 1_000_000
        for i in range(40):  # uniform and mixed commits, several batches (times) per commit
            for j in range(1 + i % 3):
                sizes = [50] * 5 if i % 2 else [10 + 7 * k for k in range(5)]
                leader.append([b"m" * n for n in sizes], t, epoch=1 + i // 20)
                t += 1000 + j
            leader.flush()
        assert leader.commits_range(1, 10) is None  # starts inside a commit
        assert copy_commits(leader, replica) < leader.flushed_offset // 5  # per commit
        n = leader.flushed_offset
        assert replica.flushed_offset == n
        assert bytes(replica.read(0, 1 << 30, n).data) == bytes(leader.read(0, 1 << 30, n).data)
        assert [(b.epoch, b.base_offset) for b in replica.batches() if b.base_offset == 0 or
                b.epoch == 2][:1] == [(1, 0)]
        assert {b.epoch for b in replica.batches()} == {1, 2}
        for ts in (0, 1_000_000, 1_050_000, t - 500, t + 1):
            assert replica.offset_for_time(ts) == leader.offset_for_time(ts)
    with PartitionLog(tmp_path / "replica", 1, cfg) as again:  # recovery accepts it
        assert again.flushed_offset == n


def test_listed_frame_length_is_checked(tmp_path: Path) -> None:
    with PartitionLog(tmp_path / "a", 0) as a, PartitionLog(tmp_path / "b", 0) as b:
        a.append([b"x" * 10, b"y" * 10])
        a.flush()
        data = bytes(a.read(0, 1 << 20, 2).data)
        for flen in (43, 45, 10):
            with pytest.raises(ValueError):
                b.append_frames(data, 2, 1, flen=flen)
        with pytest.raises(ValueError, match="not a message frame"):
            b.append_frames(data[:47] + b"\x99" + data[48:], 2, 1, flen=44)
        assert b.append_frames(data, 2, 1, flen=44) == 0
