"""A cold time seek into a large archive (issue 22: "a seek by time into a 10 GB archive
answers in under a second"): how long ``offset_for_time`` plus the first row group read at
the answer take, against hundreds of Parquet files (not a test; nothing asserts a time).

    .venv/bin/python bench/archive_seek.py [--gb 10] [--path DIR] [--keep] [--seeks 50]

Builds (or, with ``--path`` naming an existing one, reuses) an archive of ``--gb`` GiB of
log frames in the real layout: ``<path>/archive/topic=bench/date=.../partition=0/*.parquet``
written by the archiver's own writer (``frames_to_batch`` slices of one row group,
``Archive.write``), one file per ``--segment-mb`` segment, and its manifest
``<path>/log/archive.json`` (``ArchiveTier.record``). Messages are 200-byte JSON-like
events (32 random hex digits each, as bench/archive.py) 1 ms apart, made with numpy.

Each seek is cold as far as a process can make it: a new ``Archive`` and ``ArchiveTier``
(manifest parsed again, no footer cached) and every archived file's pages dropped from the
OS page cache (``posix_fadvise(DONTNEED)``, no root needed) before the timer starts.
The directory is deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.storage.archive import (  # noqa: E402
    MANIFEST,
    ROW_GROUP_ROWS,
    Archive,
    ArchivedFile,
    ArchiveTier,
    frames_to_batch,
)

T0 = 1_700_000_000 * 10**9
STEP = 1_000_000  # ns between messages
HEAD = 34  # size, frame type, timestamp, attempts, id
_TEMPLATE = (b'{"event":"click","user":00000,"session":"' + b"0" * 32
             + b'","page":"/p/000","ts":0000000000}')
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_DIG = np.frombuffer(b"0123456789", np.uint8)


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """ASCII decimal digits of ``values``, zero-padded to ``width`` (n x width uint8)."""
    p = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return _DIG[(values[:, None] // p) % 10]


def frames(base: int, n: int, body_bytes: int, rng: np.random.Generator) -> bytes:
    """n stored frames (attempts 1, nsqx ids) of offsets base.. with JSON-like bodies."""
    flen = HEAD + body_bytes
    out = np.empty((n, flen), np.uint8)
    offs = np.arange(base, base + n, dtype=np.int64)
    out[:, 0:4] = np.array([flen - 4], ">u4").view(np.uint8)
    out[:, 4:8] = np.array([2], ">u4").view(np.uint8)
    out[:, 8:16] = (T0 + offs * STEP).astype(">i8").view(np.uint8).reshape(n, 8)
    out[:, 16:18] = np.array([1], ">u2").view(np.uint8)
    out[:, 18:34] = _HEX[(offs[:, None] >> (4 * np.arange(15, -1, -1))) & 15]  # partition 0
    body = np.full((n, body_bytes), ord(" "), np.uint8)
    body[:, :len(_TEMPLATE)] = np.frombuffer(_TEMPLATE, np.uint8)
    u, s, p, t = (_TEMPLATE.index(k) + len(k) for k in (b'user":', b'session":"', b"/p/",
                                                          b'ts":'))
    body[:, u:u + 5] = _digits(offs % 50_000, 5)
    body[:, s:s + 32] = _HEX[rng.integers(0, 16, (n, 32), dtype=np.uint8)]
    body[:, p:p + 3] = _digits(offs % 977, 3)
    body[:, t:t + 10] = _digits(1_700_000_000 + offs // 1000, 10)
    out[:, HEAD:] = body
    return out.tobytes()


def build(root: Path, gib: float, segment_mb: int, body_bytes: int) -> None:
    archive = Archive(str(root / "archive"))
    (root / "log").mkdir(parents=True, exist_ok=True)
    tier = ArchiveTier(archive, root / "log", "bench", 0)
    per_file = (segment_mb << 20) // (HEAD + body_bytes)
    total = int(gib * 2**30) // (HEAD + body_bytes)
    rng = np.random.default_rng(1)
    done, pq_bytes, files = 0, 0, []
    w0, c0 = time.perf_counter(), time.process_time()
    while done < total:
        lo, hi = done, min(done + per_file, total)

        def pieces(lo: int = lo, hi: int = hi):  # as the archiver: one row group per slice
            for cur in range(lo, hi, ROW_GROUP_ROWS):
                n = min(ROW_GROUP_ROWS, hi - cur)
                yield frames_to_batch(frames(cur, n, body_bytes, rng), cur, {}, [(lo, 1)])

        key = archive.key_for("bench", 0, lo, T0 + lo * STEP)
        size = archive.write(key, pieces())
        files.append(ArchivedFile(lo, hi, key, size, T0 + lo * STEP, T0 + (hi - 1) * STEP))
        pq_bytes += size
        done = hi
        if len(files) % 32 == 0 or done == total:
            tier.record(*files)  # the manifest, as the archiver keeps it
            files = []
            wall = time.perf_counter() - w0
            print(f"  {done:,}/{total:,} msgs, {done * (HEAD + body_bytes) / 2**30:.2f} GiB "
                  f"of log -> {pq_bytes / 2**30:.2f} GiB Parquet: {done / wall:,.0f} msgs/s, "
                  f"{done * (HEAD + body_bytes) / wall / 2**20:.0f} MB/s of log", flush=True)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(f"built {len(tier.files)} files, {done:,} msgs ({done * (HEAD + body_bytes) / 2**30:.2f}"
          f" GiB of frames, {pq_bytes / 2**30:.2f} GiB Parquet, {pq_bytes / done:.1f} B/msg) in "
          f"{wall:.0f} s: {done / wall:,.0f} msgs/s (CPU {cpu / wall:.0%} of a core)")


def drop_cache(root: Path) -> None:
    """Evict the archive's files from the page cache (clean pages; no root needed)."""
    for p in list((root / "archive").rglob("*.parquet")) + [root / "log" / MANIFEST]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def seeks(root: Path, count: int) -> None:
    probe = ArchiveTier(Archive(str(root / "archive")), root / "log", "bench", 0)
    first, end, nfiles = probe.files[0].base, probe.end, len(probe.files)
    size = sum(f.bytes for f in probe.files)
    print(f"archive: {nfiles} files, {size / 2**30:.2f} GiB Parquet, offsets {first:,}..{end:,}")
    t_seek, t_read, t_all = [], [], []
    for _ in range(count):
        target = random.randrange(first, end)
        ts = T0 + target * STEP - random.randrange(STEP)  # between two messages: next one
        drop_cache(root)
        s0 = time.perf_counter()
        tier = ArchiveTier(Archive(str(root / "archive")), root / "log", "bench", 0)
        off = tier.offset_for_time(ts)
        s1 = time.perf_counter()
        ch = tier.chunk(off)
        s2 = time.perf_counter()
        tier.close()
        if off != target or not ch.base <= off < ch.base + ch.count:
            raise SystemExit(f"seek to {ts} gave offset {off}, expected {target}")
        t_seek.append(s1 - s0)
        t_read.append(s2 - s1)
        t_all.append(s2 - s0)
    for name, xs in (("timestamp -> offset (manifest, footer, ts column)", t_seek),
                     ("first row group read at it (frames rebuilt)", t_read),
                     ("both", t_all)):
        xs.sort()
        print(f"{name}: median {xs[len(xs) // 2] * 1e3:.1f} ms, max {xs[-1] * 1e3:.1f} ms "
              f"({count} cold seeks)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=10.0, help="GiB of log frames to archive")
    ap.add_argument("--segment-mb", type=int, default=16)
    ap.add_argument("--body-bytes", type=int, default=200)
    ap.add_argument("--path", help="directory to build in, or an archive built before "
                    "(default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true", help="leave the directory for a rerun")
    ap.add_argument("--seeks", type=int, default=50)
    a = ap.parse_args()
    if a.body_bytes < len(_TEMPLATE):
        raise SystemExit(f"--body-bytes must be at least {len(_TEMPLATE)}")
    root = Path(a.path) if a.path else Path(tempfile.mkdtemp(prefix="nsqx-archive-seek-"))
    try:
        if (root / "log" / MANIFEST).exists():
            print(f"reusing the archive in {root}")
        else:
            print(f"building {a.gb:g} GiB of log as Parquet in {root}")
            build(root, a.gb, a.segment_mb, a.body_bytes)
        seeks(root, a.seeks)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root} (rerun with --path {root})")


if __name__ == "__main__":
    main()
