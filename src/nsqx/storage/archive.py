"""Tiered storage: closed log segments archived as Parquet files, and read back as frames.

An ``Archive`` is a directory (``/path``, ``file:///path``) or an S3 prefix
(``s3://bucket/prefix`` plus an endpoint; credentials from the usual AWS environment
variables), both through ``pyarrow.fs`` (a maintained client, no hand-written signing).
One closed segment becomes one Parquet file, one row per message (the Spark nsq source's columns first)::

    topic=T/date=YYYY-MM-DD/partition=P/<base offset, 20 digits>.parquet

(the date is the UTC day of the segment's first message), so Spark, DuckDB, pyarrow or
pandas read the archive as one table partitioned by topic, date and partition. The
directory is the only place of those three: a ``partition`` column in the file as well
(files written before 2026-11-29 have one, which nsqx still reads) makes pyarrow and pandas
refuse the directory (int32 column vs the path's dictionary). The key is a function of the
segment alone: writing it again replaces the same file (idempotent). A directory write goes
to a dot-named temp file that is renamed; an S3 write is one object that appears only when
its upload completes. Only then is the file recorded in the partition's manifest
(``archive.json`` beside the log, written atomically), so a file that is not recorded is
never read, and a crash between the write and the record re-archives to the same key.

``ArchiveTier`` is the read side handed to a ``PartitionLog`` (which knows it only by its
methods): frames rebuilt from the rows, a row group at a time, with their original ids,
timestamps and headers; a time seek from the manifest's per-file bounds plus the row groups'
min/max statistics, never a scan. Footers and row groups are read in the tier's reader
thread: ``ready`` tells an event loop, without waiting, how far reads go now and calls it
back when the rest is decoded, so a slow store never stalls the loop. A file that cannot
be read, or whose rows are not the offsets the manifest promises, raises ``ArchiveCorrupt``
naming it (``E_ARCHIVE_CORRUPT``).

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
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from nsqx.storage.archive_codecs import CODECS
from nsqx.storage.archive_url import parse_url
from nsqx.storage.fileio import fsync_dir, write_durably
from nsqx.storage.records import Chunk, LogError

MANIFEST = "archive.json"
ROW_GROUP_ROWS = 8192  # a seek reads at most one row group of a file
CACHED_GROUPS = 5  # decoded row groups kept per partition: being sent, next, redeliveries
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
    """The archive file's columns (one row per message; topic, date and partition are the
    directory's keys)."""
    pa = _pa()
    return pa.schema([
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


class Archive:
    """Where archived files live: a directory or an S3 prefix (see module doc)."""

    def __init__(self, url: str, *, s3_endpoint: str | None = None,
                 s3_timeout: float = 30.0, compression: str = "zstd") -> None:
        kind, self.root = parse_url(url)
        if compression not in CODECS:
            raise ValueError(f"archive compression must be one of {', '.join(CODECS)}: "
                             f"{compression!r}")
        self.compression = compression  # of the files this Archive writes (CODECS)
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
        visible only when complete, so an object exists only whole. An exception from
        ``batches`` leaves nothing at ``key``."""
        pa = _pa()
        pq = __import__("pyarrow.parquet", fromlist=["parquet"])
        final = self.path(key)
        parent, name = final.rsplit("/", 1)
        if not self.local:
            sink = pa.BufferOutputStream()
            _write_parquet(pq, sink, batches, self.compression)
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
                _write_parquet(pq, out, batches, self.compression)
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

    def delete(self, key: str) -> None:
        """Remove an archived file (cluster mode: one the fence did not record); a file
        already gone is fine."""
        fs_mod = __import__("pyarrow.fs", fromlist=["fs"])
        try:
            self.fs.delete_file(self.path(key))
        except FileNotFoundError:
            return
        except OSError as e:
            with contextlib.suppress(OSError):
                if self.fs.get_file_info(self.path(key)).type == fs_mod.FileType.NotFound:
                    return
            raise ArchiveError(f"deleting {self.describe(key)} failed: {e}") from e
        if self.local:
            fsync_dir(self.path(key).rsplit("/", 1)[0])

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
        repeated ``ArchiveTier.refresh`` lists a day or two, not the topic's whole history."""
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
STATS_COLUMNS = ["offset", "timestamp", "timestamp_ns", "attempts", "epoch"]


def _write_parquet(pq: Any, sink: Any, batches: Iterator[Any], codec: str = "zstd") -> None:
    """Encode batches into sink, one row group each: ``codec`` (CODECS) and no dictionary
    (bodies and ids are nearly unique: a dictionary is built, then abandoned, and the file
    is larger than plain + zstd)."""
    name, level = CODECS[codec]
    with pq.ParquetWriter(sink, schema(), compression=name, compression_level=level,
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


def frames_to_batch(data: bytes | memoryview, base: int,
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
    return split_to_batch(split, base, headers, epochs)


def split_to_batch(split: tuple, base: int,
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
    cols = [pa.array(np.arange(base, base + count, dtype=np.int64)),
            wrap(pa.string(), np.arange(0, 16 * (count + 1), 16, dtype=np.int32), ids),
            wrap(pa.timestamp("us", tz="UTC"), ts_us), wrap(pa.binary(), boffs, bodies),
            wrap(pa.int64(), ts), wrap(pa.int32(), att), hdrs, pa.array(ep)]
    return pa.RecordBatch.from_arrays(cols, schema=schema())


def table_to_chunk(tbl: Any, expect_base: int, what: str) -> tuple[Chunk, dict[int, dict]]:
    """Frames of archived rows (their original ids, timestamps, attempts) as a Chunk, plus
    their headers; ArchiveCorrupt unless the rows are exactly the offsets from expect_base.

    Speed: no step per row in Python. The 34-byte frame heads are one numpy structured
    array; ``binary_join_element_wise(heads, bodies)`` concatenates head and body of every
    row in C++, so its data buffer is the run of frames and its offsets their positions."""
    import numpy as np  # noqa: PLC0415 - with pyarrow, the archive extra

    pa = _pa()
    pc = __import__("pyarrow.compute", fromlist=["compute"])
    n = tbl.num_rows
    cols = {k: tbl.column(k).combine_chunks() for k in
            ("offset", "timestamp_ns", "attempts", "id", "body")}
    offs = cols["offset"]
    if n == 0 or offs.null_count or offs[0].as_py() != expect_base or (
            n > 1 and not (np.diff(offs.to_numpy()) == 1).all()):
        raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {what}: rows are not offsets "
                             f"{expect_base}.. in order")
    ids, body = cols["id"], cols["body"]
    if ids.type != pa.string():  # (the buffers below are read as int32 offsets)
        ids = ids.cast(pa.string())
    if any(c.null_count for c in cols.values()) or pc.min_max(
            pc.binary_length(ids)).as_py() != {"min": 16, "max": 16}:
        raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {what}: bad row")
    blen = pc.binary_length(body).to_numpy().astype(np.int64)
    tss = cols["timestamp_ns"].to_numpy()
    heads = np.empty(n, np.dtype([("size", ">u4"), ("type", ">u4"), ("ts", ">i8"),
                                  ("att", ">u2"), ("id", "S16")]))  # packed: 34 bytes
    heads["size"] = blen + 30
    heads["type"] = 2
    heads["ts"] = tss
    heads["att"] = cols["attempts"].to_numpy()
    io = np.frombuffer(ids.buffers()[1], np.int32, n + 1, ids.offset * 4)  # 16 bytes each
    heads["id"] = np.frombuffer(ids.buffers()[2], "S16", n, int(io[0]))
    lb = pa.large_binary()
    head_col = pa.Array.from_buffers(lb, n, [None, pa.py_buffer(
        np.arange(0, 34 * (n + 1), 34, dtype=np.int64)), pa.py_buffer(heads)])
    frames = pc.binary_join_element_wise(head_col, body.cast(lb), pa.scalar(b"", lb))
    fo = np.frombuffer(frames.buffers()[1], np.int64, n + 1, frames.offset * 8)
    data = frames.buffers()[2].slice(int(fo[0]), int(fo[-1] - fo[0])).to_pybytes()
    if blen.min() == blen.max():  # one frame size: positions implied
        chunk = Chunk(expect_base, n, data, None, int(blen[0]) + 34, None, 0, int(tss.max()))
    else:
        chunk = Chunk(expect_base, n, data, array("q", (fo - fo[0]).tobytes()), 0, None, 0,
                      int(tss.max()))
    headers: dict[int, dict] = {}
    hcol = tbl.column("headers")
    if hcol.null_count < n:  # only the rows that have any
        rows = np.flatnonzero(pc.is_valid(hcol).to_numpy(zero_copy_only=False))
        for i, h in zip(rows.tolist(), hcol.take(pa.array(rows)).to_pylist(), strict=True):
            if h:
                headers[expect_base + i] = dict(h)
    return chunk, headers


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
        self._pf: dict[str, Any] = {}  # key -> ParquetFile (footer read once)
        self._starts: dict[str, list[int]] = {}  # key -> first offset of each row group, end
        # (file key, row group) -> decoded group, or the error reading it (raised once);
        # (file key, -1): the error reading that file's footer. Guarded by _lock: the loop,
        # the reader thread and HTTP handlers' threads share them.
        self._cache: OrderedDict[tuple[str, int], tuple[Chunk, dict] | LogError] = OrderedDict()
        self._loading: dict[tuple[str, int], Future] = {}  # being read in the reader thread
        self._waiters: dict[tuple[str, int], dict[Callable[[], None], None]] = {}
        self._times: dict[int, int | None] = {}  # offset_for_time answers (this manifest)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # one reader of the Parquet files at a time: the reader thread, HTTP handlers'
        # threads, and the loop when a caller reads without asking ``ready`` first
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
            self._times = {}

    def refresh(self) -> int:
        """Adopt the files of this partition that the archive holds and the manifest lacks;
        how many. Lists the archive, reads new footers only. (Cluster mode adopts from the
        fence's record in etcd instead, and from the listing only once, for an archive
        written before the record existed: nsqx.cluster.archive_fence.)"""
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
        except (pa.ArrowException, OSError) as e:
            if isinstance(e, ArchiveError | ArchiveCorrupt):
                raise
            raise ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file {what}: row group {g} "
                                 f"unreadable: {e}") from e
        return table_to_chunk(tbl, first, what)

    def _read_group(self, k: tuple[str, int], f: ArchivedFile, g: int, first: int
              ) -> tuple[Chunk, dict] | LogError | None:
        """Read row group g of f (g == -1: only its footer), publish it in the cache and
        call whoever waits for it; any thread. An error is published (and returned), not
        raised: the next read of the group raises it once, then a later one tries again."""
        res: tuple[Chunk, dict] | LogError | None = None
        try:
            if g < 0:
                self._parquet(f)
            else:
                res = self._decode(f, g, first)
        except LogError as e:
            res = e
        except Exception as e:  # noqa: BLE001 - e.g. a pyarrow type error: a bad file
            res = ArchiveCorrupt(f"E_ARCHIVE_CORRUPT archive file "
                                 f"{self.archive.describe(f.key)}: unreadable: {e!r}")
        finally:
            with self._lock:
                if res is not None:
                    self._cache[k] = res
                    self._cache.move_to_end(k)
                    while len(self._cache) > CACHED_GROUPS:
                        self._cache.popitem(last=False)
                self._loading.pop(k, None)
                waiters = self._waiters.pop(k, {})
            for notify in waiters:
                notify()
        return res

    def _submit(self, k: tuple[str, int], f: ArchivedFile, g: int, first: int,
                notify: Callable[[], None] | None) -> None:
        """Start reading k in the reader thread (once); notify() when it is there."""
        with self._lock:
            done = k in self._cache
            if not done:
                if notify is not None:
                    self._waiters.setdefault(k, {})[notify] = None
                if k in self._loading:
                    return
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="nsqx-archive-read")
                try:
                    self._loading[k] = self._pool.submit(self._read_group, k, f, g, first)
                except RuntimeError:  # closed
                    self._waiters.pop(k, None)
                    return
        if done and notify is not None:  # it arrived meanwhile
            notify()

    def _prefetch_after(self, f: ArchivedFile, g: int) -> None:
        """Read the row group after g (of f, or the next file's first) in the reader
        thread while this one is sent."""
        starts = self._starts.get(f.key)
        if starts is not None and g + 2 < len(starts):
            nf, ng, first = f, g + 1, starts[g + 1]
        else:
            nxt = self._file_for(f.end)
            if nxt is None:
                return
            nf, ng, first = nxt, 0, nxt.base
        k = (nf.key, ng)
        with self._lock:
            if k in self._cache or k in self._loading:
                return
        self._submit(k, nf, ng, first, None)

    def _group_at(self, f: ArchivedFile, offset: int) -> tuple[Chunk, dict]:
        """The decoded row group of f holding offset: from the cache, else waiting for the
        reader thread, else read here (blocking: ``ready`` says when it would not be)."""
        with self._lock:
            err = self._cache.pop((f.key, -1), None)
        if isinstance(err, LogError):
            raise err
        g, first = self._row_group_of(f, offset)
        k = (f.key, g)
        fut = None
        with self._lock:
            hit = self._cache.get(k)
            if hit is None:
                fut = self._loading.get(k)
            elif isinstance(hit, LogError):
                del self._cache[k]
            else:
                self._cache.move_to_end(k)
        if hit is None:
            hit = fut.result() if fut is not None else self._read_group(k, f, g, first)
            if isinstance(hit, LogError):
                with self._lock:
                    if self._cache.get(k) is hit:
                        del self._cache[k]
        if isinstance(hit, LogError):
            raise hit
        assert hit is not None
        self._prefetch_after(f, g)
        return hit

    def ready(self, offset: int, notify: Callable[[], None]) -> int:
        """Never blocks: the end of the offsets from an archived ``offset`` that reads serve
        now without waiting for the archive (at least offset + 1); or ``offset`` itself when
        its row group (or its file's footer) is not here yet: then it is being read in the
        reader thread and ``notify()`` is called, from that thread, once it is. A group
        whose read failed counts as ready: the read raises the error."""
        f = self._file_for(offset)
        if f is None:
            return offset + 1  # not archived: the read decides
        with self._lock:
            if (f.key, -1) in self._cache:
                return offset + 1
        starts = self._starts.get(f.key)
        if starts is None:
            self._submit((f.key, -1), f, -1, f.base, notify)
            return offset
        g = bisect_right(starts, offset) - 1
        if not 0 <= g < len(starts) - 1:
            return offset + 1  # the read raises ArchiveCorrupt
        k = (f.key, g)
        with self._lock:
            hit = self._cache.get(k)
            if hit is not None:
                self._cache.move_to_end(k)
        if hit is None:
            self._submit(k, f, g, starts[g], notify)
            return offset
        if isinstance(hit, LogError):
            return offset + 1
        self._prefetch_after(f, g)
        return starts[g + 1]

    def chunk(self, offset: int) -> Chunk:
        """The decoded row group holding an archived offset (KeyError if not archived)."""
        f = self._file_for(offset)
        if f is None:
            raise KeyError(offset)
        return self._group_at(f, offset)[0]

    def headers(self, offset: int) -> dict[str, bytes] | None:
        f = self._file_for(offset)
        if f is None:
            return None
        return self._group_at(f, offset)[1].get(offset)

    def headers_range(self, lo: int, hi: int) -> dict[int, dict[str, bytes]]:
        """Headers of the archived offsets in [lo, hi) that have any: one look-up per row
        group, not per offset."""
        out: dict[int, dict[str, bytes]] = {}
        off = lo
        while off < hi:
            f = self._file_for(off)
            if f is None:
                off += 1
                continue
            chunk, hdrs = self._group_at(f, off)
            end = min(hi, chunk.base + chunk.count)
            out.update((o, h) for o, h in hdrs.items() if off <= o < end and h)
            off = end
        return out

    def offset_for_time(self, ts: int) -> int | None:
        """First archived offset whose timestamp is >= ts, None if every archived one is
        older: the manifest's per-file max picks the file, the row groups' statistics the
        group, and only that group's timestamp column is read. Answers are kept (until the
        manifest changes), so one computed in a thread is served to the loop at once."""
        with self._lock:
            times = self._times
            if ts in times:
                return times[ts]
        ans = self._offset_for_time(ts)
        with self._lock:
            if self._times is times:  # the manifest did not change meanwhile
                if len(times) >= 64:
                    times.pop(next(iter(times)))
                times[ts] = ans
        return ans

    def _offset_for_time(self, ts: int) -> int | None:
        import numpy as np  # noqa: PLC0415 - with pyarrow, the archive extra

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
                    col = pf.read_row_group(g, columns=["timestamp_ns"]).column(0)
                hit = np.flatnonzero(col.to_numpy(zero_copy_only=False) >= ts)
                if len(hit):
                    return first + int(hit[0])
                first += rg.num_rows
        return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._lock:
            self._cache.clear()
            self._waiters.clear()
        self._pf.clear()
        self._starts.clear()
