"""The archive's write side: the frame split (C and its numpy twin agree on any input), the
archiver reading closed segments itself in blocks, its pause hook, and a segment that
changes while its file is written."""

from __future__ import annotations

import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from nsqx import speedups  # noqa: E402
from nsqx.storage import archiver as archiver_mod  # noqa: E402
from nsqx.storage.archive import (  # noqa: E402
    CODECS,
    ROW_GROUP_ROWS,
    Archive,
    _split_frames_np,
    frames_to_batch,
    split_frames,
    table_to_chunk,
)
from nsqx.storage.archiver import Archiver, Stopped  # noqa: E402
from nsqx.storage.log import LogConfig, PartitionLog  # noqa: E402
from nsqx.storage.message_id import make_id  # noqa: E402

T0 = 1_700_000_000_000_000_000


def frame(body: bytes, off: int, ts: int, attempts: int = 1) -> bytes:
    return struct.pack(">IIqH", 30 + len(body), 2, ts, attempts) + make_id(0, off) + body


frames_st = st.lists(st.tuples(st.binary(max_size=300), st.integers(-(1 << 63), (1 << 63) - 1),
                               st.integers(0, 0xFFFF)), min_size=0, max_size=40)


@pytest.mark.skipif(speedups.native is None, reason="nsqx._speedups was not built")
@settings(max_examples=300, deadline=None)
@given(frames_st, st.integers(0, 45), st.integers(0, 6000), st.integers(0, 40),
       st.integers(-1, 40))
def test_split_frames_c_and_numpy_twin_agree(items, max_count, max_bytes, cut, bad):
    fr = [frame(b, i, ts, a) for i, (b, ts, a) in enumerate(items)]
    if 0 <= bad < len(fr):  # one frame not a message: both refuse it, or stop before it
        fr[bad] = fr[bad][:7] + b"\x01" + fr[bad][8:]
    data = b"".join(fr)
    data = data[:max(0, len(data) - cut)]  # a partial frame at the end is left

    def run(fn):
        try:
            return fn(data, max_count, max_bytes)
        except ValueError as e:
            return str(e)

    got = run(speedups.native.split_frames)
    assert got == run(_split_frames_np)
    if isinstance(got, str):
        assert got == f"malformed frame {bad}"
        return
    count, used = got[:2]
    assert count <= max_count and (count <= 1 or used <= max_bytes)
    if count:
        ts = struct.unpack(f"={count}q", got[4])
        assert (got[7], got[8]) == (min(ts), max(ts))
        assert got[6] == b"".join(make_id(0, i) for i in range(count))


@pytest.mark.parametrize("native", [True, False])
def test_split_frames_refuses_malformed_frames_at_their_index(monkeypatch, native):
    if native and speedups.native is None:
        pytest.skip("nsqx._speedups was not built")
    if not native:
        monkeypatch.setattr(speedups, "native", None)
    good = b"".join(frame(b"x" * i, i, T0) for i in range(3))
    short = good + struct.pack(">II", 20, 2) + b"\0" * 26  # under 34 bytes
    typ = good + struct.pack(">II", 30, 1) + b"\0" * 26  # a response, not a message
    for bad in (short, typ):
        with pytest.raises(ValueError, match="malformed frame 3"):
            split_frames(bad, 100, 1 << 20)
        with pytest.raises(ValueError, match="malformed frame at offset 13"):
            frames_to_batch(bad, 10, {}, [])
    with pytest.raises(ValueError, match="truncated frame at offset 12"):
        frames_to_batch(good[:-1], 10, {}, [])
    # mixed sizes round trip, with their ids, timestamps and attempts
    data = b"".join(frame(b"b" * (i * 7 % 50), 10 + i, T0 + i, i) for i in range(20))
    chunk, _ = table_to_chunk(pa.Table.from_batches([frames_to_batch(data, 10, {}, [])]),
                              10, "x")
    assert bytes(chunk.data) == data


@pytest.mark.parametrize("native", [True, False])
def test_archiver_reads_segments_in_blocks_with_frames_over_a_block(tmp_path, monkeypatch,
                                                                    native):
    if native and speedups.native is None:
        pytest.skip("nsqx._speedups was not built")
    if not native:
        monkeypatch.setattr(speedups, "native", None)
    monkeypatch.setattr(archiver_mod, "PIECE_BYTES", 1000)
    monkeypatch.setattr(archiver_mod, "BLOCK_BYTES", 2500)
    lg = PartitionLog(tmp_path / "log", 0, LogConfig(segment_bytes=20_000))
    sizes = [0, 5, 3000, 17, 200, 6000, 1, 90] * 6  # frames over a piece and over a block
    for k in range(0, len(sizes), 4):
        lg.append([bytes([65 + k % 26]) * s for s in sizes[k:k + 4]], T0 + k,
                  epoch=1 + k // 20, headers=[{"h": b"%d" % k}, None, None, None])
        lg.flush()
    lg.append([b"tail"])
    lg.flush()
    lg.sync()
    closed = lg.closed_segments()
    assert len(closed) >= 2
    archive = Archive(str(tmp_path / "arch"))
    arch = Archiver(archive)
    arch.add("t", 0, lg)
    assert arch.run_once() == len(closed)
    for (base, end, _), key in zip(closed, archive.list("t"), strict=True):
        pf = pq.ParquetFile(archive.path(key))
        off = base
        for g in range(pf.num_row_groups):
            tbl = pf.read_row_group(g)
            chunk, hdrs = table_to_chunk(tbl, off, key)
            frames = bytes(chunk.data)
            assert frames == bytes(lg.read(off, len(frames), tbl.num_rows).data)
            assert hdrs == {o: h for o in range(off, off + tbl.num_rows)
                            if (h := lg.headers(o))}
            assert tbl.num_rows <= ROW_GROUP_ROWS
            # a row group is one piece: at most PIECE_BYTES after its first frame
            assert tbl.num_rows == 1 or len(frames) <= 1000
            assert tbl.column("epoch").to_pylist() == [
                1 + (o - o % 4) // 20 for o in range(off, off + tbl.num_rows)]
            off += tbl.num_rows
        assert off == end
    lg.close()


def make_full_log(path, segments: int = 2) -> PartitionLog:
    lg = PartitionLog(path, 0, LogConfig(segment_bytes=4000))
    k = 0
    while len(lg.closed_segments(synced_only=False)) < segments:
        lg.append([b"m%d" % (k + i) * 10 for i in range(5)], T0 + k)
        lg.flush()
        k += 5
    lg.sync()
    return lg


def test_pause_is_asked_with_the_backlog_and_stop_ends_a_pause(tmp_path, monkeypatch):
    monkeypatch.setattr(archiver_mod, "PIECE_BYTES", 500)
    lg = make_full_log(tmp_path / "log")
    pending = sum(s[2] for s in lg.closed_segments())
    asked: list[int] = []
    arch = Archiver(Archive(str(tmp_path / "arch")), pause=lambda b: asked.append(b) or 0.0)
    arch.add("t", 0, lg)
    assert arch.run_once() == 2
    # between row groups: what is still to archive, down to nothing after the last one
    assert asked[0] < pending and asked[-1] == 0
    assert asked == sorted(asked, reverse=True) and len(asked) > 4
    lg.close()

    lg = make_full_log(tmp_path / "log2")
    arch = Archiver(Archive(str(tmp_path / "arch2")))
    arch.pause = lambda b: (threading.Timer(0.05, arch.stop).start(), 300.0)[1]
    arch.add("t", 0, lg)
    assert not arch.stopping
    with pytest.raises(Stopped):  # the long pause ends at stop(), nothing is recorded
        arch.run_once()
    assert arch.stopping and arch.archive.list("t") == [] and lg.earliest_offset == 0
    lg.close()


def test_explicit_cap_paces_the_bytes(tmp_path, monkeypatch):
    waits: list[float] = []
    lg = make_full_log(tmp_path / "log", segments=1)
    arch = Archiver(Archive(str(tmp_path / "arch")), throttle_bytes_per_sec=1000)
    monkeypatch.setattr(arch._stop, "wait", lambda t: waits.append(t) or False)
    arch.add("t", 0, lg)
    assert arch.run_once() == 1
    # 4000 bytes at 1000 B/s: the thread is told to wait about 4 s in all
    assert 3 < sum(waits) <= 4 + 1e-6
    lg.close()


def test_a_segment_truncated_while_written_is_not_recorded(tmp_path):
    lg = make_full_log(tmp_path / "log", segments=1)
    lo, hi, _ = lg.closed_segments()[0]
    calls = 0

    def call(fn):
        nonlocal calls
        calls += 1
        if calls == 3:  # (pending, plan,) then the check after the file is written
            lg.truncate_to(lo + 1)
        return fn()

    arch = Archiver(Archive(str(tmp_path / "arch")), call=call)
    tier = arch.add("t", 0, lg)
    assert arch.run_once() == 0
    assert tier.end == 0 and tier.files == []
    assert arch.archive.list("t") == []  # the written file is gone too (Spark reads the dir)
    lg.close()


def test_a_log_closed_while_its_headers_are_read_is_no_archive_error(tmp_path):
    lg = PartitionLog(tmp_path / "log", 0, LogConfig(segment_bytes=4000))
    while not lg.closed_segments(synced_only=False):
        lg.append([b"m" * 50] * 5, T0, headers=[{"h": b"1"}] * 5)
        lg.flush()
    lg.sync()
    calls = 0

    def call(fn):
        nonlocal calls
        calls += 1
        if calls == 3:  # (pending, plan,) then the first row group's headers: topic deleted
            lg.close()
        return fn()

    arch = Archiver(Archive(str(tmp_path / "arch")), call=call)
    tier = arch.add("t", 0, lg)
    assert arch.run_once() == 0  # not ArchiveError ("archive unreachable")
    assert arch.last_error == "" and arch.stats(lg)["archive_error"] == ""
    assert tier.files == [] and arch.archive.list("t") == []


def test_a_damaged_segment_stops_its_partition_only(tmp_path):
    bad = make_full_log(tmp_path / "bad", segments=1)
    good = make_full_log(tmp_path / "good", segments=1)
    lo, hi, _ = bad.closed_segments()[0]
    path, at, _, _ = bad.closed_span(lo, hi)
    with open(path, "r+b") as f:  # the second frame's type: not a message
        f.seek(at + 4 + int.from_bytes(bad.read_one(lo)[:4], "big") + 4)
        f.write(struct.pack(">I", 7))
    arch = Archiver(Archive(str(tmp_path / "arch")))
    arch.add("bad", 0, bad)
    arch.add("good", 0, good)
    assert arch.run_once() == 1  # the partition after the damaged one is archived
    assert "malformed frame" in arch.stats(bad)["archive_error"]
    assert arch.archive.list("bad") == [] and len(arch.archive.list("good")) == 1
    assert arch.run_once() == 0  # not read again each pass
    bad.close()
    good.close()


# what pyarrow reports for each --archive-compression (its "LZ4" is Parquet's LZ4_RAW; the
# Spark test reads the codec from the footer with parquet-mr)
REPORTED = {"zstd": "ZSTD", "lz4": "LZ4", "snappy": "SNAPPY", "gzip": "GZIP",
            "none": "UNCOMPRESSED"}


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_is_written_and_replays_the_same_frames(tmp_path, codec):
    lg = make_full_log(tmp_path / "log", segments=3)
    end = lg.closed_segments()[-1][1]
    before = bytes(lg.read(0, 1 << 20, end).data)
    arch = Archiver(Archive(str(tmp_path / "arch"), compression=codec))
    arch.add("t", 0, lg)
    assert arch.run_once() == 3
    for key in arch.archive.list("t"):
        md = pq.ParquetFile(arch.archive.path(key)).metadata
        assert {md.row_group(g).column(c).compression for g in range(md.num_row_groups)
                for c in range(md.num_columns)} == {REPORTED[codec]}
    lg.apply_retention(lg.flushed_offset)
    assert lg.start_offset == end and lg.earliest_offset == 0  # the local copy is gone
    got, off = b"", 0
    while off < end:  # replay: frames rebuilt from the archive's rows
        r = lg.read(off, 1 << 20, end - off)
        got += bytes(r.data)
        off = r.next_offset
    assert got == before
    arch.join()
    lg.close()


def test_an_unknown_codec_is_refused(tmp_path):
    with pytest.raises(ValueError, match="one of zstd, lz4, snappy, gzip, none: 'brotli'"):
        Archive(str(tmp_path), compression="brotli")
