"""Tiered storage on the directory backend: segments archived as Parquet, retention gated by
the archive, reads below the local start served from the archive (frames byte-identical)."""

from __future__ import annotations

import json
import os

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from nsqx.storage.archive import (  # noqa: E402
    MANIFEST,
    Archive,
    ArchiveCorrupt,
    ArchiveError,
    ArchiveTier,
)
from nsqx.storage.archiver import Archiver  # noqa: E402
from nsqx.storage.log import LogConfig, PartitionLog  # noqa: E402

T0 = 1_700_000_000_000_000_000  # ns


def make_log(path, **kw) -> PartitionLog:
    cfg = dict(segment_bytes=2048, index_interval_bytes=512, mem_tail_bytes=4096)
    cfg.update(kw)
    return PartitionLog(path, 3, LogConfig(**cfg))


def fill(lg: PartitionLog, batches: int = 40, per: int = 7) -> None:
    for b in range(batches):
        bodies = [f"msg-{b}-{i}-".encode() * (1 + (i % 3)) for i in range(per)]
        hdrs = [{"k": f"v{b}".encode()} if i == 2 else None for i in range(per)]
        lg.append(bodies, T0 + b * 1_000_000_000, epoch=1 + b // 20, headers=hdrs)
        lg.flush()
    lg.sync()


def frames_of(lg: PartitionLog, lo: int, hi: int) -> list[bytes]:
    out = []
    for off in range(lo, hi):
        out.append(bytes(lg.read_frame(off)))
    return out


def read_all(lg: PartitionLog, lo: int) -> tuple[bytes, int]:
    parts, off = [], lo
    while True:
        r = lg.read(off, 3000, 50)
        if not r.count:
            return b"".join(bytes(r.data) for r in []) + b"".join(parts), off
        assert r.start == off
        parts.append(bytes(r.data))
        off = r.next_offset


@pytest.fixture
def archive(tmp_path):
    return Archive(f"file://{tmp_path / 'arch'}")


def test_url_parsing_refuses_bad_input(tmp_path):
    with pytest.raises(ValueError, match="absolute"):
        Archive("relative/dir")
    with pytest.raises(ValueError, match="s3://bucket"):
        Archive("ftp://x/y")
    with pytest.raises(ValueError, match="bucket"):
        Archive("s3:///nobucket")
    assert Archive(str(tmp_path / "a")).local


def test_archive_then_retention_then_transparent_reads(tmp_path, archive):
    lg = make_log(tmp_path / "log")
    fill(lg)
    end = lg.flushed_offset
    before = frames_of(lg, 0, end)
    hdr_before = {o: lg.headers(o) for o in range(end)}
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    tier = arch.add("orders", 3, lg)
    closed = lg.closed_segments()
    assert len(closed) >= 3
    # retention waits for the archive: nothing archived yet, nothing deleted
    assert lg.apply_retention(end, now=T0 / 1e9 + 10**6) == 0
    assert arch.lag(lg) == (sum(s[2] for s in closed), len(closed))
    assert arch.run_once() == len(closed)
    assert arch.run_once() == 0  # idempotent: nothing left
    assert arch.lag(lg) == (0, 0)
    keys = archive.list("orders")
    assert len(keys) == len(closed)
    assert keys[0] == "topic=orders/date=2023-11-14/partition=3/00000000000000000000.parquet"
    man = json.loads((tmp_path / "log" / MANIFEST).read_text())
    assert [f["base"] for f in man["files"]] == [s[0] for s in closed]
    # rows: one per message, with the columns Spark reads
    t = pq.read_table(archive.path(keys[0]))  # the partition is the directory's key only
    assert t.column_names == ["offset", "id", "timestamp", "body", "timestamp_ns",
                              "attempts", "headers", "epoch"]
    assert t.column("timestamp").to_pylist()[0].timestamp() == T0 / 1e9
    assert t.column("offset").to_pylist() == list(range(closed[0][0], closed[0][1]))
    assert set(pq.read_table(archive.path("topic=orders")).column("partition")
               .to_pylist()) == {3}
    assert pq.ParquetFile(archive.path(keys[0])).metadata.row_group(0).column(0) \
        .compression == "ZSTD"
    # retention now deletes every archived segment
    start = lg.apply_retention(end, now=T0 / 1e9 + 10**6)
    assert start == closed[-1][1] > 0
    assert lg.earliest_offset == 0
    # frames below the local start come from the archive, byte for byte
    assert frames_of(lg, 0, end) == before
    data, nxt = read_all(lg, 0)
    assert nxt == end and data == b"".join(before)
    assert {o: lg.headers(o) for o in range(end)} == hdr_before
    assert lg.headers_range(0, end) == {o: h for o, h in hdr_before.items() if h}
    for lo, hi in ((3, start - 1), (start - 40, start + 20), (100, 101)):  # row group cuts
        assert lg.headers_range(lo, hi) == {o: h for o, h in hdr_before.items()
                                            if h and lo <= o < hi}
    # a read stops at the seam, the next continues locally without gap or duplicate
    r = lg.read(start - 2, 1 << 20, 10)
    assert (r.start, r.count, r.next_offset) == (start - 2, 2, start)
    assert lg.read(start, 1 << 20, 1).start == start
    assert bytes(lg.read_one(1)) == before[1]
    # time seek: the first offset of a batch's timestamp, in the archive and locally
    assert lg.offset_for_time(T0 + 5 * 1_000_000_000) == 5 * 7
    assert lg.offset_for_time(T0 - 1) == 0
    last_b = 39
    assert lg.offset_for_time(T0 + last_b * 1_000_000_000) == last_b * 7
    # epochs are kept per row
    t_all = pa.concat_tables(pq.read_table(archive.path(k)) for k in keys)
    eps = dict(zip(t_all.column("offset").to_pylist(), t_all.column("epoch").to_pylist(),
                   strict=True))
    assert eps[0] == 1 and eps.get(20 * 7, 2) == 2
    arch.join()
    lg.close()
    # after a restart the manifest brings the archive back
    lg2 = make_log(tmp_path / "log")
    arch2 = Archiver(archive)
    arch2.add("orders", 3, lg2)
    assert lg2.start_offset == start and lg2.earliest_offset == 0
    assert frames_of(lg2, 0, end) == before
    arch2.join()
    lg2.close()
    assert tier.archived_bytes() > 0


def test_time_seek_reads_one_row_group_not_the_file(tmp_path, archive, monkeypatch):
    lg = make_log(tmp_path / "log", segment_bytes=1 << 22)
    for b in range(6):  # 6 x 5000 messages in one closed segment: several row groups
        lg.append([b"x" * 20] * 5000, T0 + b * 10**9)
        lg.flush()
    lg.append([b"tail"], T0 + 10 * 10**9)  # a second segment so the first is closed
    lg._segments[-1].sizes[0] = lg.config.segment_bytes  # force a roll on the next flush
    lg.flush()
    lg.sync()
    assert len(lg.closed_segments()) == 1
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    tier = arch.add("t", 3, lg)
    arch.run_once()
    lg.apply_retention(lg.flushed_offset)
    assert lg.start_offset == 30000
    pf = tier._parquet(tier.files[0])
    assert pf.metadata.num_row_groups >= 3
    reads = []
    orig = type(pf).read_row_group

    def spy(self, i, *a, **kw):
        reads.append(i)
        return orig(self, i, *a, **kw)

    monkeypatch.setattr(type(pf), "read_row_group", spy)
    assert lg.offset_for_time(T0 + 4 * 10**9) == 20000
    assert reads == [20000 // 8192]  # only the group that holds the answer
    arch.join()
    lg.close()


def test_corrupt_or_truncated_file_is_refused_naming_it(tmp_path, archive):
    lg = make_log(tmp_path / "log")
    fill(lg)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("t", 3, lg)
    arch.run_once()
    lg.apply_retention(lg.flushed_offset)
    key = archive.list("t")[0]
    p = archive.path(key)
    with open(p, "rb") as f:
        raw = f.read()
    with open(p, "wb") as f:  # truncated: the footer is gone
        f.write(raw[: len(raw) // 2])
    arch.join()
    lg.close()
    lg = make_log(tmp_path / "log")
    arch = Archiver(archive)
    arch.add("t", 3, lg)
    with pytest.raises(ArchiveCorrupt, match="E_ARCHIVE_CORRUPT.*" + key.split("/")[-1]):
        lg.read(0, 1 << 20)
    with pytest.raises(ArchiveCorrupt, match=str(p)):
        lg.read_frame(1)
    # garbage of the right size: the magic is there, the pages are not
    with open(p, "wb") as f:
        f.write(raw[:4] + os.urandom(len(raw) - 8) + raw[-4:])
    tier = ArchiveTier(archive, tmp_path / "log", "t", 3)
    with pytest.raises(ArchiveCorrupt, match=str(p)):
        tier.chunk(0)
    arch.join()
    lg.close()


def test_killed_mid_write_leaves_nothing_archived_and_rewrites_same_key(tmp_path, archive):
    """A write that dies before the manifest records it: not archived, retention keeps the
    segment, the next run writes the same key again (the kill -9 case in-process; the
    process kill is in tests/nsqd/test_archive_nsqd.py)."""
    lg = make_log(tmp_path / "log")
    fill(lg)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    tier = arch.add("t", 3, lg)
    calls = {"n": 0}
    real_write = archive.write

    def dying_write(key, batches):
        calls["n"] += 1
        if calls["n"] == 2:
            next(iter(batches))
            raise ArchiveError("simulated crash mid-write")
        return real_write(key, batches)

    archive.write = dying_write  # type: ignore[method-assign]
    with pytest.raises(ArchiveError):
        arch.run_once()
    assert len(tier.files) == 1
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "arch").rglob("*"))
    n_local = len(lg.closed_segments())
    lg.apply_retention(lg.flushed_offset)
    assert len(lg.closed_segments()) == n_local - 1  # only the archived one went
    archive.write = real_write  # type: ignore[method-assign]
    arch.run_once()
    assert arch.lag(lg) == (0, 0)
    keys = archive.list("t")
    assert len(keys) == len(set(keys)) == len(tier.files)
    arch.join()
    lg.close()


def test_unreachable_archive_holds_local_deletion(tmp_path):
    target = tmp_path / "arch"
    archive = Archive(str(target))
    target.mkdir()
    lg = make_log(tmp_path / "log")
    fill(lg)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("t", 3, lg)
    os.chmod(target, 0o500)  # unwritable (as root: replace it by a file instead)
    if os.access(target, os.W_OK):
        os.chmod(target, 0o700)
        target.rmdir()
        target.write_bytes(b"not a directory")
    try:
        with pytest.raises(ArchiveError, match="archiving"):
            arch.run_once()
        segs = len(lg.closed_segments())
        assert lg.apply_retention(lg.flushed_offset, now=T0 / 1e9 + 10**6) == 0
        assert arch.lag(lg)[1] == segs > 0
    finally:
        if target.is_file():
            target.unlink()
            target.mkdir()
        os.chmod(target, 0o700)
    assert arch.run_once() == segs
    assert lg.apply_retention(lg.flushed_offset) > 0
    arch.join()
    lg.close()



def test_frames_to_batch_round_trip_and_malformed_runs():
    from nsqx.storage.archive import frames_to_batch, table_to_chunk
    from nsqx.storage.message_id import make_id

    def frame(body: bytes, off: int, ts: int) -> bytes:
        import struct

        return struct.pack(">IIqH", 30 + len(body), 2, ts, 1) + make_id(0, off) + body

    for bodies in ([b"same"] * 5, [b"", b"a", b"bb" * 50, b"c"]):  # one length, mixed
        data = b"".join(frame(b, 10 + i, T0 + i) for i, b in enumerate(bodies))
        batch = frames_to_batch(data, 10, {11: {"k": b"v"}}, [(10, 4), (12, 5)])
        assert batch.column("epoch").to_pylist()[:3] == [4, 4, 5]
        chunk, hdrs = table_to_chunk(pa.Table.from_batches([batch]), 10, "x")
        assert bytes(chunk.data) == data and hdrs == {11: {"k": b"v"}}
    good = frame(b"abc", 0, T0)
    for bad in (good[:-1], good + b"\0\0", good[:4] + b"\0\0\0\x03" + good[8:]):
        with pytest.raises(ValueError, match="frame"):
            frames_to_batch(bad, 0, {}, [])


def test_refresh_adopts_files_archived_elsewhere(tmp_path, archive):
    """Cluster mode's follower: a second log of the same partition learns the leader's files
    from the archive listing (only the days from its newest file on), so its retention may
    delete them and its reads reach them."""
    leader = make_log(tmp_path / "leader")
    fill(leader)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    tier = arch.add("t", 3, leader)
    arch.run_once()
    follower = make_log(tmp_path / "follower")
    fill(follower)  # the same messages (timestamps and all), as a replica holds them
    ftier = ArchiveTier(archive, tmp_path / "follower", "t", 3)
    follower.lower, follower.may_delete = ftier, (lambda end: end <= ftier.end)
    assert follower.apply_retention(follower.flushed_offset) == 0  # nothing known yet
    assert ftier.refresh() == len(tier.files)
    assert ftier.files == tier.files and ftier.refresh() == 0
    start = follower.apply_retention(follower.flushed_offset)
    assert start == tier.end and follower.earliest_offset == 0
    assert frames_of(follower, 0, 5) == frames_of(leader, 0, 5)
    # a later day only: the listing starts at the manifest's newest day
    listed = []
    real = archive.files
    archive.files = lambda topic=None, since=None: listed.append(since) or real(topic, since)
    ftier.refresh()
    assert listed == ["2023-11-14"]
    arch.join()
    leader.close()
    follower.close()


def test_a_corrupt_file_seen_by_a_follower_stops_only_its_partition(tmp_path, archive):
    """Cluster mode's refresh meets an unreadable file: that partition reports it (in
    /stats' archive_error) and waits; the archiver goes on with the other logs."""
    leader = make_log(tmp_path / "leader")
    fill(leader)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("t", 3, leader)
    arch.run_once()
    bad = archive.path(archive.list("t")[-1])
    with open(bad, "wb") as f:
        f.write(b"garbage")
    follower = make_log(tmp_path / "follower")
    other = make_log(tmp_path / "other")
    fill(other)
    arch2 = Archiver(archive, throttle_bytes_per_sec=0, refresh_interval=60,
                     limit=lambda plog: None if plog is follower else plog.flushed_offset)
    arch2.add("t", 3, follower)
    arch2.add("u", 0, other)
    assert arch2.run_once() == len(other.closed_segments())  # the other topic archived
    st = arch2.stats(follower)
    assert "E_ARCHIVE_CORRUPT" in st["archive_error"] and bad in st["archive_error"]
    for a in (arch, arch2):
        a.join()
    for lg in (leader, follower, other):
        lg.close()


def test_table_to_chunk_of_a_sliced_table_and_bad_rows():
    from nsqx.storage.archive import frames_to_batch, table_to_chunk
    from nsqx.storage.message_id import make_id

    def frame(body: bytes, off: int) -> bytes:
        import struct

        return struct.pack(">IIqH", 30 + len(body), 2, T0 + off, 1 + off % 2) \
            + make_id(0, off) + body

    frames = [frame(b"b%d" % i * (i % 4), i) for i in range(20)]
    batch = frames_to_batch(b"".join(frames), 0, {7: {"a": b"1"}, 15: {"b": b""}}, [(0, 1)])
    tbl = pa.Table.from_batches([batch.slice(0, 9), batch.slice(9)]).slice(5)  # offset views
    chunk, hdrs = table_to_chunk(tbl, 5, "x")
    assert bytes(chunk.data) == b"".join(frames[5:]) and chunk.count == 15
    assert [chunk.at(k) for k in range(16)] == [sum(map(len, frames[5:5 + k]))
                                                for k in range(16)]
    assert hdrs == {7: {"a": b"1"}, 15: {"b": b""}}
    with pytest.raises(ArchiveCorrupt, match="not offsets 6"):
        table_to_chunk(tbl, 6, "x")
    gap = pa.concat_tables([tbl.slice(0, 3), tbl.slice(4)])
    with pytest.raises(ArchiveCorrupt, match="E_ARCHIVE_CORRUPT archive file f.parquet"):
        table_to_chunk(gap, 5, "f.parquet")
    bad_id = tbl.set_column(tbl.schema.get_field_index("id"), "id",
                            pa.array(["short"] * tbl.num_rows))
    with pytest.raises(ArchiveCorrupt, match="bad row"):
        table_to_chunk(bad_id, 5, "x")


def test_ready_never_waits_for_the_store_and_notifies(tmp_path, archive):
    """The read side's non-blocking door (what nsqd's loop uses): ready() answers at once,
    the footer and row group are read in the reader thread, notify() says when; a failed
    read is raised once by the read, then tried again."""
    import threading

    from nsqx.storage.log import NO_LIMIT

    lg = make_log(tmp_path / "log")
    fill(lg)
    end = lg.flushed_offset
    before = frames_of(lg, 0, end)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("t", 3, lg)
    arch.run_once()
    arch.join()
    start = lg.apply_retention(end, now=T0 / 1e9 + 10**6)
    lg.lower = None
    tier = Archiver(archive).add("t", 3, lg)  # a new tier: nothing read yet
    gate = threading.Event()  # the store hangs until set
    opened = []
    real_open = archive.open

    def slow_open(key):
        opened.append(key)
        assert threading.current_thread() is not threading.main_thread()
        gate.wait(30)
        return real_open(key)

    archive.open = slow_open
    woke = threading.Semaphore(0)
    assert lg.ready_end(start, woke.release) == NO_LIMIT
    assert lg.ready_end(0, woke.release) == 0  # the footer is being read
    assert lg.ready_end(0, woke.release) == 0  # (one read, one notify per waiter)
    gate.set()
    assert woke.acquire(timeout=30)
    assert not woke.acquire(timeout=0.2)
    got = lg.ready_end(0, woke.release)  # footer here; the group now
    if got == 0:
        assert woke.acquire(timeout=30)
        got = lg.ready_end(0, woke.release)
    assert 0 < got <= tier.files[0].end
    archive.open = None  # a read needing the store now would fail
    r = lg.read(0, 1 << 20, got)
    assert r.count == got and bytes(r.data) == b"".join(before[:got])
    archive.open = real_open
    # the next group was prefetched meanwhile: ready without a wait once it is there
    nxt = got
    while lg.ready_end(nxt, woke.release) == nxt:
        assert woke.acquire(timeout=30)
    # a corrupt file: the failed read counts as ready, the read raises once, then retries
    f = tier.files[2]
    lg.lower = None
    tier.close()
    tier = Archiver(archive).add("t", 3, lg)
    with open(archive.path(f.key), "r+b") as fh:
        fh.truncate(20)
    while lg.ready_end(f.base, woke.release) == f.base:
        assert woke.acquire(timeout=30)
    assert lg.ready_end(f.base, woke.release) == f.base + 1
    with pytest.raises(ArchiveCorrupt, match=f.key.rsplit("/", 1)[1]):
        lg.read_frame(f.base)
    assert lg.ready_end(f.base, woke.release) == f.base  # reading it again
    tier.close()
    lg.close()
