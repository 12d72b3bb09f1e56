"""Replay is a seek: time-to-offset lookups and channel resets on small and large logs
(prints seeks/s and the large/small ratio; not a test).

    .venv/bin/python bench/replay_seek.py [--quick] [--dir DIR]

Builds two partition logs with one day of timestamps spread over their records (one commit
of 100 x 200 B per simulated time step, 64 MiB segments), reopens them (page cache warm), then times
``PartitionLog.offset_for_time`` at random times of the day plus ``ChannelCursor.reset`` to
the answer (a durable cursor: tmp + fsync + rename each time), i.e. what
``POST /channel/setoffset`` with ``timestamp:<s>`` does. A scan would grow with the log; a
seek through the time index barely does.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.storage.cursor import ChannelCursor  # noqa: E402
from nsqx.storage.log import LogConfig, PartitionLog  # noqa: E402

DAY_NS = 86_400 * 1_000_000_000
T0 = 1_700_000_000 * 1_000_000_000


def build(path: Path, records: int) -> None:
    lg = PartitionLog(path, 0, LogConfig(segment_bytes=64 << 20, sync_every=10**12,
                                         sync_interval=0))
    batch = [b"x" * 200] * 100
    steps = records // 100
    for i in range(steps):
        lg.append(batch, timestamp_ns=T0 + DAY_NS * i // steps)
        lg.flush()  # one commit per MPUB, as a loop turn with one MPUB would make
    lg.close()


def bench(path: Path, seeks: int, cursor_dir: Path) -> tuple[float, float, int]:
    lg = PartitionLog(path, 0, LogConfig(segment_bytes=64 << 20))
    rnd = random.Random(7)
    times = [T0 + rnd.randrange(DAY_NS) for _ in range(seeks)]
    t = time.perf_counter()
    offsets = [lg.offset_for_time(ts) for ts in times]
    dt_lookup = time.perf_counter() - t
    cur = ChannelCursor(0, state_path=cursor_dir / "c.cursor")
    t = time.perf_counter()
    for off in offsets:
        cur.reset(off)
    dt_reset = time.perf_counter() - t
    cur.close()
    n = lg.flushed_offset
    # check: each answer is the first record at or after its time
    for ts, off in list(zip(times, offsets, strict=True))[:20]:
        assert int.from_bytes(lg.read_frame(off)[8:16], "big") >= ts
        if off > 0:
            assert int.from_bytes(lg.read_frame(off - 1)[8:16], "big") < ts
    lg.close()
    return seeks / dt_lookup, seeks / dt_reset, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller logs")
    ap.add_argument("--dir", help="where to build the logs (default: a temp dir)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(dir=a.dir))
    sizes = (10_000, 500_000) if a.quick else (10_000, 3_000_000)
    try:
        res = []
        for n in sizes:
            p = root / f"log{n}"
            t = time.perf_counter()
            build(p, n)
            built = time.perf_counter() - t
            (root / f"cur{n}").mkdir()
            lookups, resets, recs = bench(p, 2000, root / f"cur{n}")
            mib = sum(f.stat().st_size for f in p.iterdir()) / (1 << 20)
            print(f"{recs:>9,} records ({mib:,.0f} MiB, built in {built:.1f} s): "
                  f"offset_for_time {lookups:,.0f} seeks/s, "
                  f"reset with fsync {resets:,.0f} resets/s", flush=True)
            res.append(lookups)
        print(f"lookup rate, {sizes[1]:,} vs {sizes[0]:,} records: "
              f"{res[1] / res[0]:.2f}x (1.00x = independent of the log size)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
