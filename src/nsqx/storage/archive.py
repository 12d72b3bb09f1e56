"""Tiered storage: closed log segments archived as Parquet files, and read back as frames.

An ``Archive`` is a directory (``/path``, ``file:///path``) or an S3 prefix
(``s3://bucket/prefix`` plus an endpoint; credentials from the usual AWS environment
variables), both through ``pyarrow.fs`` (a maintained client, no hand-written signing).
One closed segment becomes one Parquet file, one row per message (the Spark nsq source's columns first)::

    topic=T/date=YYYY-MM-DD/partition=P/<base offset, 20 digits>.parquet

(the date is the UTC day of the segment's first message), so Spark, DuckDB or pandas read
the archive as one table partitioned by topic and date. The key is a function of the
segment alone: writing it again replaces the same file (idempotent). A directory write goes
to a dot-named temp file that is renamed; an S3 write is one object that appears only when
its upload completes. Only then is the file recorded in the partition's manifest
(``archive.json`` beside the log, written atomically), so a file that is not recorded is
never read, and a crash between the write and the record re-archives to the same key.

``ArchiveTier`` is the read side handed to a ``PartitionLog`` (which knows it only by its
methods): frames rebuilt from the rows, a row group at a time, with their original ids,
timestamps and headers; a time seek from the manifest's per-file bounds plus the row groups'
min/max statistics, never a scan. A file that cannot be read, or whose rows are not the
offsets the manifest promises, raises ``ArchiveCorrupt`` naming it (``E_ARCHIVE_CORRUPT``).

pyarrow is imported on first use: a node without ``--archive-url`` never loads it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import struct
import threading
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from nsqx.storage.fileio import fsync_dir, write_durably
from nsqx.storage.records import Chunk, LogError

MANIFEST = "archive.json"
ROW_GROUP_ROWS = 8192  # a seek reads at most one row group of a file
_PREFIX = struct.Struct(">IIqH")  # size, frame type, timestamp, attempts
_U32 = struct.Struct(">I")


class ArchiveError(LogError):
    """The archive cannot be reached or written (the archiver retries; retention waits)."""


class ArchiveCorrupt(LogError):
    """An archived file is unreadable or does not hold what the manifest says."""

    code = "E_ARCHIVE_CORRUPT"


def _pa() -> Any:
    import pyarrow  # noqa: PLC0415 - optional dependency, loaded only with an archive

    return pyarrow


def schema() -> Any:
    """The archive table's columns (one row per message)."""
    pa = _pa()
    return pa.schema([
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("id", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),  # as the Spark nsq source gives it
        ("body", pa.binary()),
        ("timestamp_ns", pa.int64()),  # exact, as in the frame (rebuilt from it)
        ("attempts", pa.int32()),
        ("headers", pa.map_(pa.string(), pa.binary())),
        ("epoch", pa.int64()),
    ])


@dataclass(frozen=True, slots=True)
class ArchivedFile:
    """One archived segment, as the manifest records it."""

    base: int
    end: int  # first offset after the file
    key: str  # path relative to the archive root
    bytes: int
    min_ts: int
    max_ts: int


def parse_url(url: str) -> tuple[str, str]:
    """("dir", absolute path) or ("s3", "bucket/prefix") of an archive URL; ValueError with
    what is wrong otherwise. Needs no pyarrow (nsqd checks its flags with it)."""
    u = urlparse(url)
    if u.scheme in ("", "file"):
        root = u.path if u.scheme == "file" else url
        if not root or not os.path.isabs(root):
            raise ValueError(f"archive directory must be an absolute path: {url!r}")
        return "dir", root.rstrip("/") or "/"
    if u.scheme == "s3":
        if not u.netloc:
            raise ValueError(f"s3 archive URL needs a bucket: {url!r}")
        return "s3", (u.netloc + "/" + u.path.strip("/")).rstrip("/")
    raise ValueError(f"archive URL must be a directory or s3://bucket/prefix: {url!r}")


class Archive:
    """Where archived files live: a directory or an S3 prefix (see module doc)."""

    def __init__(self, url: str, *, s3_endpoint: str | None = None,
                 s3_timeout: float = 30.0) -> None:
        kind, self.root = parse_url(url)
        fs_mod = __import__("pyarrow.fs", fromlist=["fs"])
        self.url = url
        self.local = kind == "dir"
        if self.local:
            self.fs = fs_mod.LocalFileSystem()  # (directories are made by the first write)
        else:
            kw: dict[str, Any] = {}
            if s3_endpoint:
                e = urlparse(s3_endpoint if "://" in s3_endpoint else f"http://{s3_endpoint}")
                kw["endpoint_override"] = e.netloc
                kw["scheme"] = e.scheme or "http"
            kw["region"] = os.environ.get("AWS_REGION") or os.environ.get(
                "AWS_DEFAULT_REGION") or "us-east-1"
            kw["connect_timeout"] = min(5.0, s3_timeout)
            kw["request_timeout"] = s3_timeout
            kw["retry_strategy"] = fs_mod.AwsStandardS3RetryStrategy(max_attempts=2)
            self.fs = fs_mod.S3FileSystem(**kw)

    def key_for(self, topic: str, partition: int, base: int, first_ts: int) -> str:
        day = datetime.datetime.fromtimestamp(first_ts / 1e9, datetime.UTC).date().isoformat()
        return f"topic={topic}/date={day}/partition={partition}/{base:020d}.parquet"

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def describe(self, key: str) -> str:
        """The file as an operator finds it (for error messages)."""
        return self.path(key) if self.local else f"s3://{self.path(key)}"

    def write(self, key: str, batches: Iterator[Any]) -> int:
        """Write record batches as one Parquet file at ``key``; its size in bytes.

        Directory: a dot-named temp file (Spark and the manifest ignore it), fsynced, renamed.
        S3: encoded in memory (one segment, compressed), then one upload that becomes
        visible only when complete, so an object exists only whole. An exception from ``batches`` leaves nothing at ``key``."""
        pa = _pa()
        pq = __import__("pyarrow.parquet", fromlist=["parquet"])
        final = self.path(key)
        parent, name = final.rsplit("/", 1)
        if not self.local:
            sink = pa.BufferOutputStream()
            _write_parquet(pq, sink, batches)
            buf = sink.getvalue()
            try:
                with self.fs.open_output_stream(final) as out:
                    out.write(buf)
            except OSError as e:
                raise ArchiveError(f"archiving {self.describe(key)} failed: {e}") from e
            return buf.size
        target = f"{parent}/.{name}.{os.getpid()}.tmp"
        try:
            os.makedirs(parent, exist_ok=True)
            for stale in Path(parent).glob(f".{name}.*.tmp"):  # of a writer killed mid-way
                stale.unlink()
            with pa.OSFile(target, "wb") as out:  # native: writes need no GIL
                _write_parquet(pq, out, batches)
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(target, final)
            fsync_dir(parent)
            return os.stat(final).st_size
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(target)
            if isinstance(e, OSError):
                raise ArchiveError(f"archiving {self.describe(key)} failed: {e}") from e
            raise

    def open(self, key: str) -> Any:
        """A ParquetFile of an archived file (footer read), or ArchiveCorrupt/ArchiveError."""
        pq = __import__("pyarrow.parquet", fromlist=["parquet"])
        pa = _pa()
        try:
            f = self.fs.open_input_file(self.path(key))
        except FileNotFoundError as e:
            raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {self.describe(key)} is "
                                 f"missing") from e
        except OSError as e:
            raise ArchiveError(f"reading {self.describe(key)} failed: {e}") from e
        try:
            return pq.ParquetFile(f)
        except (pa.ArrowInvalid, OSError) as e:
            raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {self.describe(key)} "
                                 f"is not readable Parquet: {e}") from e

    def list(self, topic: str | None = None) -> list[str]:
        """Keys of every archived file (of one topic), sorted."""
        return [k for k, _ in self.files(topic)]

    def files(self, topic: str | None = None, since_date: str | None = None
              ) -> list[tuple[str, int]]:
        """(key, bytes) of every archived file (of one topic), sorted: `nsqx archive ls`.
        ``since_date`` (with a topic): only the days from that one on (YYYY-MM-DD), so a
        follower's periodic look lists a day or two, not the topic's whole history."""
        fs_mod = __import__("pyarrow.fs", fromlist=["fs"])
        base = self.root + (f"/topic={topic}" if topic else "")
        try:
            bases = [base]
            if topic and since_date:
                days = self.fs.get_file_info(fs_mod.FileSelector(base, allow_not_found=True))
                bases = [d.path for d in days if d.type == fs_mod.FileType.Directory
                         and d.base_name.startswith("date=") and d.base_name[5:] >= since_date]
            infos = [i for b in bases for i in self.fs.get_file_info(
                fs_mod.FileSelector(b, recursive=True, allow_not_found=True))]
        except OSError as e:
            raise ArchiveError(f"listing {self.url} failed: {e}") from e
        return sorted((i.path[len(self.root) + 1:], i.size) for i in infos
                      if i.type == fs_mod.FileType.File and i.path.endswith(".parquet")
                      and not i.base_name.startswith("."))


# Columns with min/max statistics: the fixed-width ones (the seeks use offset and
# timestamp_ns; Spark and DuckDB prune on timestamp); none for body, id and headers, whose
# statistics cost time and say nothing.
STATS_COLUMNS = ["partition", "offset", "timestamp", "timestamp_ns", "attempts", "epoch"]


def _write_parquet(pq: Any, sink: Any, batches: Iterator[Any]) -> None:
    """Encode batches into sink, one row group each: zstd level 1 and no dictionary
    (bodies and ids are nearly unique: a dictionary is built, then abandoned, and the file
    is larger than plain + zstd)."""
    with pq.ParquetWriter(sink, schema(), compression="zstd", compression_level=1,
                          use_dictionary=False, write_statistics=STATS_COLUMNS) as w:
        for b in batches:
            w.write_batch(b, row_group_size=ROW_GROUP_ROWS)


# -- frames <-> rows ---------------------------------------------------------------------
_NO_TS = ((1 << 63) - 1, -(1 << 63))  # (min, max) timestamps of no frame


def split_frames(data: bytes | memoryview, max_count: int, max_bytes: int) -> tuple:
    """The leading whole frames of ``data`` split into columns: at most ``max_count`` frames
    and, after the first, at most ``max_bytes``; a partial frame at the end is left.

    (count, bytes used, bodies back to back, body offsets int32 (count + 1), timestamps
    int64, attempts int32, ids 16 bytes each, min ts, max ts), arrays as native-endian
    bytes. ValueError "malformed frame K" (K from 0) for a frame under 34 bytes or not a
    message. nsqx._speedups does it in C without the GIL (beside the event loop); this
    numpy twin runs where it was not built (tests compare the two)."""
    native = __import__("nsqx.speedups", fromlist=["native"]).native
    if native is not None:
        return native.split_frames(data, max_count, max_bytes)
    return _split_frames_np(data, max_count, max_bytes)


def _split_frames_np(data: bytes | memoryview, max_count: int, max_bytes: int) -> tuple:
    import numpy as np  # noqa: PLC0415 - with pyarrow, the archive extra

    mv = memoryview(data).cast("B")
    n = len(mv)
    buf = np.frombuffer(mv, dtype=np.uint8)
    st = None
    if n >= 34 and max_count > 0:
        flen = 4 + _U32.unpack_from(mv, 0)[0]
        k = min(n // flen, max_count, max(1, max_bytes // flen)) if flen >= 34 else 0
        if k:  # one frame length (fixed-size bodies): no walk when every size agrees
            cand = np.arange(0, k * flen, flen, dtype=np.int64)
            heads = buf[cand[:, None] + np.arange(8)]
            sizes = np.ascontiguousarray(heads[:, :4]).view(">u4").ravel()
            types = np.ascontiguousarray(heads[:, 4:]).view(">u4").ravel()
            nxt = k * flen  # the walk would stop before a frame here too?
            if (sizes == flen - 4).all() and (types == 2).all() and (
                    k == max_count or n - nxt < 34 or not _takes(mv, nxt, n, max_bytes, k)):
                st, used = cand, nxt
    if st is None:
        starts: list[int] = []
        pos = 0
        unpack = _U32.unpack_from
        while len(starts) < max_count and n - pos >= 34:
            flen = 4 + unpack(mv, pos)[0]
            if flen < 34 or unpack(mv, pos + 4)[0] != 2:
                raise ValueError(f"malformed frame {len(starts)}")
            if flen > n - pos or (starts and pos + flen > max_bytes):
                break
            starts.append(pos)
            pos += flen
        st, used = np.array(starts, dtype=np.int64), pos
    count = len(st)
    ends = np.append(st[1:], used).astype(np.int64)
    ts = np.ascontiguousarray(buf[st[:, None] + np.arange(8, 16)]).view(">i8").ravel()
    att = np.ascontiguousarray(buf[st[:, None] + np.arange(16, 18)]).view(">u2").ravel()
    ids = np.ascontiguousarray(buf[st[:, None] + np.arange(18, 34)])
    boff = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(ends - st - 34, out=boff[1:])
    keep = np.ones(used, dtype=bool)  # every byte but the frames' 34-byte heads: the bodies
    keep[st[:, None] + np.arange(34)] = False
    lo, hi = (int(ts.min()), int(ts.max())) if count else _NO_TS
    return (count, used, buf[:used][keep].tobytes(), boff.tobytes(),
            ts.astype(np.int64).tobytes(), att.astype(np.int32).tobytes(), ids.tobytes(),
            lo, hi)


def _takes(mv: memoryview, pos: int, n: int, max_bytes: int, index: int) -> bool:
    """Whether the split takes frame ``index`` (at pos, after others); ValueError when it
    is malformed, as the walk would."""
    flen = 4 + _U32.unpack_from(mv, pos)[0]
    if flen < 34 or _U32.unpack_from(mv, pos + 4)[0] != 2:
        raise ValueError(f"malformed frame {index}")
    return flen <= n - pos and pos + flen <= max_bytes


def frames_to_batch(data: bytes | memoryview, base: int, partition: int,
                    headers: dict[int, dict[str, bytes]], epochs: Sequence[tuple[int, int]]
                    ) -> Any:
    """A record batch of the frames in ``data`` (offsets from ``base``); ``epochs`` is
    (first offset, epoch) of each commit in order. Raises ValueError naming the offset of
    a truncated or malformed frame."""
    n = len(memoryview(data).cast("B"))
    try:
        split = split_frames(data, n // 34 + 1, n)
    except ValueError as e:
        k = int(str(e).rsplit(" ", 1)[1])
        raise ValueError(f"malformed frame at offset {base + k}") from None
    if split[1] != n:
        raise ValueError(f"truncated frame at offset {base + split[0]}")
    return split_to_batch(split, base, partition, headers, epochs)


def split_to_batch(split: tuple, base: int, partition: int,
                   headers: dict[int, dict[str, bytes]], epochs: Sequence[tuple[int, int]]
                   ) -> Any:
    """The record batch of ``split_frames``' columns (offsets from ``base``): the buffers
    are wrapped, not copied; Python per commit and per message with headers only."""
    import numpy as np  # noqa: PLC0415 - with pyarrow, the archive extra

    pa = _pa()
    count, _, bodies, boffs, ts, att, ids = split[:7]
    ts_us = np.frombuffer(ts, dtype=np.int64) // 1000

    def wrap(typ: Any, *bufs: Any) -> Any:
        return pa.Array.from_buffers(typ, count, [None, *(pa.py_buffer(b) for b in bufs)])

    ep = np.zeros(count, dtype=np.int64)
    for first, epoch in epochs:  # commits: few per piece
        ep[max(0, first - base):] = epoch
    mtype = pa.map_(pa.string(), pa.binary())
    hdrs = pa.nulls(count, mtype)
    if headers:
        hdrs = pa.array([list(h.items()) if (h := headers.get(base + k)) else None
                         for k in range(count)], mtype)
    cols = [pa.array(np.full(count, partition, np.int32)),
            pa.array(np.arange(base, base + count, dtype=np.int64)),
            wrap(pa.string(), np.arange(0, 16 * (count + 1), 16, dtype=np.int32), ids),
            wrap(pa.timestamp("us", tz="UTC"), ts_us), wrap(pa.binary(), boffs, bodies),
            wrap(pa.int64(), ts), wrap(pa.int32(), att), hdrs, pa.array(ep)]
    return pa.RecordBatch.from_arrays(cols, schema=schema())


def table_to_chunk(tbl: Any, expect_base: int, what: str) -> tuple[Chunk, dict[int, dict]]:
    """Frames of archived rows (their original ids, timestamps, attempts) as a Chunk, plus
    their headers; ArchiveCorrupt unless the rows are exactly the offsets from expect_base."""
    offs = tbl.column("offset").to_pylist()
    n = len(offs)
    if n == 0 or offs[0] != expect_base or offs[-1] != expect_base + n - 1 or (
            n > 1 and any(b - a != 1 for a, b in zip(offs, offs[1:], strict=False))):
        raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {what}: rows are not offsets "
                             f"{expect_base}.. in order")
    tss = tbl.column("timestamp_ns").to_pylist()
    atts = tbl.column("attempts").to_pylist()
    ids = tbl.column("id").to_pylist()
    bodies = tbl.column("body").to_pylist()
    pack = _PREFIX.pack
    parts: list[bytes] = []
    pos = array("q", [0])
    p = 0
    for ts, att, mid, body in zip(tss, atts, ids, bodies, strict=True):
        if mid is None or len(mid) != 16 or body is None:
            raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {what}: bad row")
        parts.append(pack(len(body) + 30, 2, ts, att))
        parts.append(mid.encode("ascii"))
        parts.append(body)
        p += len(body) + 34
        pos.append(p)
    headers: dict[int, dict] = {}
    for i, h in enumerate(tbl.column("headers").to_pylist()):
        if h:
            headers[expect_base + i] = dict(h)
    return Chunk(expect_base, n, b"".join(parts), pos, 0, None, 0, max(tss)), headers


# -- manifest and read side --------------------------------------------------------------
class ArchiveTier:
    """The archived ranges of one partition (its manifest) and reads from them.

    A ``PartitionLog`` given one (``log.lower``) serves offsets below its local start from
    here. The manifest is replaced atomically by ``record`` (the archiver's thread) and read
    by the loop; the list object is swapped whole, never mutated."""

    def __init__(self, archive: Archive, log_dir: str | Path, topic: str, partition: int
                 ) -> None:
        self.archive = archive
        self.topic = topic
        self.partition = partition
        self.manifest_path = Path(log_dir) / MANIFEST
        self.files: list[ArchivedFile] = self._load()
        # (files, their bases) swapped as one object: the loop reads while record() adds
        self._index = (self.files, [f.base for f in self.files])
        self._cache: dict[tuple[str, int], tuple[Chunk, dict]] = {}
        self._pf: dict[str, Any] = {}  # key -> ParquetFile (footer read once)
        self._starts: dict[str, list[int]] = {}  # key -> first offset of each row group, end
        self._prefetch: tuple[tuple[str, int], Future] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # one reader of the Parquet files at a time: the loop and the prefetch thread
        self._io = threading.RLock()

    def _load(self) -> list[ArchivedFile]:
        try:
            raw = json.loads(self.manifest_path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            raise LogError(f"archive manifest {self.manifest_path} is unreadable: {e}") from e
        return [ArchivedFile(**f) for f in raw.get("files", [])]

    def record(self, *new: ArchivedFile) -> None:
        """Add (or replace, same base) written files; the manifest is fsynced and renamed
        before they count as archived."""
        bases = {f.base for f in new}
        files = [x for x in self.files if x.base not in bases] + list(new)
        files.sort(key=lambda x: x.base)
        body = json.dumps({"url": self.archive.url, "topic": self.topic,
                           "partition": self.partition,
                           "files": [asdict(x) for x in files]}).encode()
        write_durably(self.manifest_path, body,
                      self.manifest_path.with_name(f"{MANIFEST}.{threading.get_ident()}.tmp"))
        with self._lock:
            self.files = files
            self._index = (files, [x.base for x in files])

    def refresh(self) -> int:
        """Adopt the files of this partition that the archive holds and the manifest lacks
        (cluster mode: what the partition's leader archived, seen by its followers and by a
        new leader after a failover); how many. Lists the archive, reads new footers only."""
        known = {f.key for f in self.files}
        want = f"/partition={self.partition}/"
        new = []
        last = self.files[-1].key.split("/") if self.files else []  # topic=, date=, ...
        since = last[1][5:] if len(last) > 1 and last[1].startswith("date=") else None
        for key, size in self.archive.files(self.topic, since):
            if want not in key or key in known:
                continue
            try:
                base = int(key.rsplit("/", 1)[1].split(".", 1)[0])
            except ValueError:
                continue  # not one of ours
            md = self.archive.open(key).metadata
            ti = md.schema.to_arrow_schema().get_field_index("timestamp_ns")
            lo, hi = [], []
            for g in range(md.num_row_groups):
                st = md.row_group(g).column(ti).statistics
                if st is None or not st.has_min_max:
                    raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file "
                                         f"{self.archive.describe(key)}: no timestamp statistics")
                lo.append(st.min)
                hi.append(st.max)
            if md.num_rows and lo:
                new.append(ArchivedFile(base, base + md.num_rows, key, size, min(lo), max(hi)))
        if new:
            self.record(*new)
        return len(new)

    # -- bounds --------------------------------------------------------------------------
    @property
    def end(self) -> int:
        """First offset after the archived run (0 when nothing is archived)."""
        files = self.files
        return files[-1].end if files else 0

    def start_for(self, local_start: int) -> int:
        """Oldest offset readable through the archive, given the local log's start: the
        start of the contiguous run of files that reaches it (local_start when none)."""
        files = self.files
        start = local_start
        for f in reversed(files):
            if f.base >= start:
                continue  # still local too
            if f.end < start:
                break  # a gap: what lies before it cannot be read in order
            start = f.base
        return start

    def archived_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    # -- reads ---------------------------------------------------------------------------
    def _file_for(self, offset: int) -> ArchivedFile | None:
        files, bases = self._index
        i = bisect_right(bases, offset) - 1
        if i < 0 or offset >= files[i].end:
            return None
        return files[i]

    def _parquet(self, f: ArchivedFile) -> Any:
        with self._io:
            return self._parquet_locked(f)

    def _parquet_locked(self, f: ArchivedFile) -> Any:
        pf = self._pf.get(f.key)
        if pf is None:
            pf = self.archive.open(f.key)
            md = pf.metadata
            if md.num_rows != f.end - f.base:
                raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file "
                                     f"{self.archive.describe(f.key)} has {md.num_rows} rows, "
                                     f"the manifest says {f.end - f.base}")
            if len(self._pf) > 16:
                self._pf.clear()
                self._starts.clear()
            self._pf[f.key] = pf
            self._starts[f.key] = list(accumulate(
                (md.row_group(g).num_rows for g in range(md.num_row_groups)), initial=f.base))
        return pf

    def _row_group_of(self, f: ArchivedFile, offset: int) -> tuple[int, int]:
        """(row group index, its first offset) holding offset: from row counts (the rows
        are the file's offsets in order), checked when the group is decoded."""
        starts = self._starts.get(f.key)
        if starts is None:  # footer not read yet (or dropped): read it under the lock
            with self._io:
                self._parquet_locked(f)
                starts = self._starts[f.key]
        g = bisect_right(starts, offset) - 1
        if 0 <= g < len(starts) - 1:
            return g, starts[g]
        raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {self.archive.describe(f.key)}: "
                             f"offset {offset} not in its row groups")

    def _decode(self, f: ArchivedFile, g: int, first: int) -> tuple[Chunk, dict]:
        pa = _pa()
        what = self.archive.describe(f.key)
        try:
            with self._io:
                tbl = self._parquet(f).read_row_group(g)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            if isinstance(e, ArchiveError | ArchiveCorrupt):
                raise
            raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {what}: row group {g} "
                                 f"unreadable: {e}") from e
        return table_to_chunk(tbl, first, what)

    def _group(self, f: ArchivedFile, g: int, first: int) -> tuple[Chunk, dict]:
        k = (f.key, g)
        hit = self._cache.get(k)
        if hit is not None:
            return hit
        pre = self._prefetch
        if pre is not None and pre[0] == k:
            self._prefetch = None
            hit = pre[1].result()
        else:
            hit = self._decode(f, g, first)
        if len(self._cache) >= 4:
            self._cache.pop(next(iter(self._cache)))
        self._cache[k] = hit
        self._start_prefetch(f, g, first + hit[0].count)
        return hit

    def _start_prefetch(self, f: ArchivedFile, g: int, nxt: int) -> None:
        """Decode the next row group in a worker thread while this one is sent."""
        md = self._parquet(f).metadata
        if g + 1 < md.num_row_groups:
            nf, ng = f, g + 1
        else:
            nf = self._file_for(f.end)
            if nf is None:
                return
            ng, nxt = 0, nf.base
        k = (nf.key, ng)
        if k in self._cache or (self._prefetch is not None and self._prefetch[0] == k):
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="nsqx-archive-read")
        self._prefetch = (k, self._pool.submit(self._decode, nf, ng, nxt))

    def chunk(self, offset: int) -> Chunk:
        """The decoded row group holding an archived offset (KeyError if not archived)."""
        f = self._file_for(offset)
        if f is None:
            raise KeyError(offset)
        g, first = self._row_group_of(f, offset)
        return self._group(f, g, first)[0]

    def headers(self, offset: int) -> dict[str, bytes] | None:
        f = self._file_for(offset)
        if f is None:
            return None
        g, first = self._row_group_of(f, offset)
        return self._group(f, g, first)[1].get(offset)

    def offset_for_time(self, ts: int) -> int | None:
        """First archived offset whose timestamp is >= ts, None if every archived one is
        older: the manifest's per-file max picks the file, the row groups' statistics the
        group, and only that group's timestamp column is read."""
        for f in self.files:
            if f.max_ts < ts:
                continue
            if f.min_ts >= ts:
                return f.base
            pf = self._parquet(f)
            md = pf.metadata
            ti = pf.schema_arrow.get_field_index("timestamp_ns")
            first = f.base
            for g in range(md.num_row_groups):
                rg = md.row_group(g)
                st = rg.column(ti).statistics
                if st is not None and st.has_min_max and st.max < ts:
                    first += rg.num_rows
                    continue
                with self._io:
                    col = pf.read_row_group(g, columns=["timestamp_ns"]).column(0).to_pylist()
                for i, t in enumerate(col):
                    if t >= ts:
                        return first + i
                first += rg.num_rows
        return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._cache.clear()
        self._pf.clear()
        self._starts.clear()
