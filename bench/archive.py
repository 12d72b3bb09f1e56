"""Tiered storage on its own (storage layer, directory backend): how fast closed segments
become Parquet, how many bytes a message takes there against the local log, how fast
archived messages are read back as frames, and how long a time seek into the archive takes.

    .venv/bin/python bench/archive.py [--messages 300000] [--body-bytes 200]
    .venv/bin/python bench/archive.py --nsqd [--seconds 5]

``--nsqd``: a real nsqd with ``--archive-url``: 200-byte MPUB ingest at full rate while a
consumer drains (does archiving keep up: lag at the end, time to catch up, the node's
CPU), then the channel reset to the archive start after retention deleted the local
copy, and a stock-protocol reader (nsqx.benchmark's, SUB/RDY/FIN) drains it: msgs/s
from the archive against the same drain from the local log in the same run.

Bodies are JSON-like events (a few fields, 32 random hex digits each), so compression has
something realistic to work on; ``--random`` makes them incompressible random bytes.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsqd_compare import server  # noqa: E402  (bench/: starts an nsqd on free ports)
from nsqx.benchmark import scenarios  # noqa: E402
from nsqx.storage.archive import Archive  # noqa: E402
from nsqx.storage.archiver import Archiver  # noqa: E402
from nsqx.storage.log import LogConfig, PartitionLog  # noqa: E402

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


def archive_stats(http: str) -> dict:
    with urllib.request.urlopen(f"http://{http}/stats?format=json&topic=bench", timeout=10) as r:
        st = json.loads(r.read())
    return st.get("data", st)["topics"][0]["archive"][0]


def wait(pred, timeout: float = 300.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise SystemExit("timed out")
        time.sleep(0.1)
    return time.monotonic() - t0


def node_bench(seconds: float) -> None:
    arch = tempfile.mkdtemp(prefix="nsqx-bench-archive-")
    try:
        with server("nsqx", None, [f"--archive-url={arch}", "--max-bytes-per-file=16777216"]
                    ) as (tcp, http, pid):
            scenarios.http_post(http, "/topic/create?topic=bench")
            scenarios.http_post(http, "/channel/create?topic=bench&channel=ch")
            w = scenarios.ingest(tcp, "bench", size=200, batch=200, seconds=seconds, pid=pid)
            n = w["messages"]
            a = archive_stats(http)
            print(f"ingest: {w['msgs_per_s']:,.0f} msgs/s for {seconds:.0f} s "
                  f"(node CPU {w.get('server_cpu_s', 0):.1f} s); archive lag at the end: "
                  f"{a['archive_lag_segments']} segments, {a['archive_lag_bytes'] / 2**20:.0f} MB")
            r = scenarios.drain(tcp, "bench", "ch", expect=n, seconds=120, pid=pid)
            print(f"drain from the local log: {r['msgs_per_s']:,.0f} msgs/s")
            caught = wait(lambda: archive_stats(http)["archive_lag_segments"] == 0)
            a = archive_stats(http)
            print(f"archive caught up {caught:.1f} s after the drain; local log starts at "
                  f"{a['log_start']:,} of {n:,}, {a['archived_bytes'] / 2**20:.0f} MB archived "
                  f"({a['archived_bytes'] / max(a['archive_end'], 1):.1f} B/msg)")
            scenarios.http_post(http, "/channel/setoffset?topic=bench&channel=ch&to=earliest")
            r = scenarios.drain(tcp, "bench", "ch", expect=n, seconds=120, pid=pid)
            print(f"replay from the archive start (reset to earliest): "
                  f"{r['msgs_per_s']:,.0f} msgs/s, node CPU {r.get('server_us_per_msg', 0):.1f}"
                  f" us/msg ({a['log_start'] / n:.0%} of it from Parquet)")
    finally:
        shutil.rmtree(arch, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--body-bytes", type=int, default=200)
    ap.add_argument("--segment-mb", type=int, default=16)
    ap.add_argument("--random", action="store_true", help="incompressible bodies")
    ap.add_argument("--nsqd", action="store_true", help="through a real nsqd (see above)")
    ap.add_argument("--seconds", type=float, default=5.0, help="--nsqd: ingest time")
    a = ap.parse_args()
    if a.nsqd:
        node_bench(a.seconds)
        return
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
