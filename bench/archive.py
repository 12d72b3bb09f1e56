"""Tiered storage on its own (storage layer, directory backend): how fast closed segments
become Parquet, how many bytes a message takes there against the local log, how fast
archived messages are read back as frames, and how long a time seek into the archive takes.

    .venv/bin/python bench/archive.py [--messages 300000] [--body-bytes 200]

Bodies are JSON-like events (a few fields, 32 random hex digits each), so compression has
something realistic to work on; ``--random`` makes them incompressible random bytes.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from nsqx.storage.archive import Archive
from nsqx.storage.archiver import Archiver
from nsqx.storage.log import LogConfig, PartitionLog

BATCH = 500


def body(i: int, size: int, rnd: bool) -> bytes:
    if rnd:
        return os.urandom(size)
    b = (b'{"event":"click","user":%d,"session":"%s","page":"/p/%d","ts":%d}'
         % (i % 50_000, os.urandom(16).hex().encode(), i % 977, 1_700_000_000 + i))
    return (b + b" " * size)[:size]


def dir_bytes(path: Path, suffix: str | None = None) -> int:
    return sum(p.stat().st_size for p in path.rglob("*")
               if p.is_file() and (suffix is None or p.name.endswith(suffix)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--body-bytes", type=int, default=200)
    ap.add_argument("--segment-mb", type=int, default=16)
    ap.add_argument("--random", action="store_true", help="incompressible bodies")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nsqx-bench-archive-"))
    try:
        lg = PartitionLog(tmp / "log", 0, LogConfig(segment_bytes=a.segment_mb << 20))
        t0 = 1_700_000_000 * 10**9
        for k in range(0, a.messages, BATCH):
            lg.append([body(i, a.body_bytes, a.random) for i in range(k, k + BATCH)],
                      t0 + k * 1_000_000)  # 1 ms per message
            lg.flush()
        lg.append([b"last"])
        lg._segments[-1].sizes[0] = lg.config.segment_bytes  # roll: every full one closes
        lg.flush()
        lg.sync()
        closed = lg.closed_segments()
        msgs = closed[-1][1]
        log_bytes = sum(s[2] for s in closed)
        all_local = dir_bytes(tmp / "log")  # frames, indexes, commit metadata
        archive = Archive(str(tmp / "archive"))
        arch = Archiver(archive, throttle_bytes_per_sec=0)
        arch.add("bench", 0, lg)
        w0, c0 = time.perf_counter(), time.process_time()
        arch.run_once()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        pq_bytes = dir_bytes(tmp / "archive", ".parquet")
        print(f"archived {msgs:,} msgs of {a.body_bytes} B in {len(closed)} segments: "
              f"{msgs / wall:,.0f} msgs/s, {log_bytes / wall / 2**20:.1f} MB/s of log "
              f"(wall {wall:.2f} s, CPU {cpu:.2f} s = {cpu / wall:.0%} of a core)")
        print(f"bytes/message: local log {log_bytes / msgs:.1f} (frames only; "
              f"{all_local / msgs:.1f} with indexes and metadata), Parquet zstd "
              f"{pq_bytes / msgs:.1f} -> ratio {pq_bytes / log_bytes:.2f} of the frames")
        lg.apply_retention(lg.flushed_offset)
        assert lg.start_offset == msgs and lg.earliest_offset == 0
        # replay from the archive: frames rebuilt from the rows (what a consumer gets)
        w0 = time.perf_counter()
        off, n = 0, 0
        while off < msgs:
            r = lg.read(off, 1 << 20)
            n += r.count
            off = r.next_offset
        wall = time.perf_counter() - w0
        print(f"replay from the archive: {n / wall:,.0f} msgs/s "
              f"({n * (a.body_bytes + 34) / wall / 2**20:.0f} MB/s of frames)")
        # time seeks (a fresh tier each: cold footers), random points
        arch.join()
        seeks = []
        for _ in range(20):
            arch2 = Archiver(archive)
            lg.lower = None
            arch2.add("bench", 0, lg)
            target = random.randrange(0, msgs - BATCH, BATCH)  # a batch shares its timestamp
            s0 = time.perf_counter()
            got = lg.offset_for_time(t0 + target * 1_000_000)
            seeks.append(time.perf_counter() - s0)
            assert got == target, (got, target)
            arch2.join()
        seeks.sort()
        print(f"time seek into the archive (cold, {len(seeks)} seeks): median "
              f"{seeks[len(seeks) // 2] * 1e3:.1f} ms, max {seeks[-1] * 1e3:.1f} ms")
        lg.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
