"""Storage log benchmark: append and read throughput (prints msgs/s and MB/s; not a test).

    .venv/bin/python bench/storage_log.py [--quick] [--dir DIR]

Append: 100 B / 200 B / mixed (1..400 B, same mean as 200 B) bodies in batches of 1 and 100, under
sync policies none / every 2500 messages / every commit (fsync before the next commit, as the
group committer would do for sync_every=1). Batches of 1 are flushed every 100 appends and batches
of 100 every 10 appends, like loop turns of the group committer with 100 PUBs / 10 MPUBs. Read: sequential reads of ready-to-send frames
(256 KiB per read) from the in-memory tail and cold from disk (after reopen). Recover: the
open (start) time of a fully fsynced log, page cache warm and cold (``--only recover``).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.storage.log import LogConfig, PartitionLog  # noqa: E402


def bodies_for(kind: str, n: int, rnd: random.Random) -> list[bytes]:
    if kind == "mixed":
        return [b"m" * rnd.randint(1, 399) for _ in range(n)]
    return [b"u" * int(kind)] * n


def bench_append(root: Path, kind: str, batch: int, sync: str, total: int) -> tuple[float, int]:
    path = Path(tempfile.mkdtemp(dir=root))
    sync_every = {"none": 10**12, "2500": 2500, "commit": 1}[sync]
    lg = PartitionLog(path, 0, LogConfig(sync_every=sync_every, sync_interval=0))
    rnd = random.Random(1)
    pool = bodies_for(kind, 10000, rnd)
    per_flush = 100 if batch == 1 else 10  # messages per loop turn: 100 / 1000
    nbytes = 0
    t0 = time.perf_counter()
    done = 0
    i = 0
    while done < total:
        for _ in range(per_flush):
            b = pool[i : i + batch]
            if len(b) < batch:
                i = 0
                b = pool[:batch]
            i += batch
            lg.append(b)
            done += batch
            nbytes += sum(map(len, b)) + 34 * batch
        lg.flush()
        if lg.needs_sync():
            lg.sync()
    lg.sync()
    dt = time.perf_counter() - t0
    lg.close()
    shutil.rmtree(path)
    return dt, nbytes


def bench_read(root: Path, kind: str, total: int, batch: int = 100
               ) -> list[tuple[str, float, int, int, float]]:
    """Reads of a log of ``total`` messages appended ``batch`` at a time (batch 1: flushed
    after each, one commit per message; else 100 appends per flush)."""
    path = Path(tempfile.mkdtemp(dir=root))
    cfg = LogConfig(sync_every=10**12, sync_interval=0, mem_tail_bytes=1 << 30)
    lg = PartitionLog(path, 0, cfg)
    rnd = random.Random(2)
    pool = bodies_for(kind, 10000, rnd)
    per_flush = 100 * batch if batch > 1 else 1
    for k in range(0, total, batch):
        lg.append(pool[k % 10000 : k % 10000 + batch])
        if k % per_flush == per_flush - batch:
            lg.flush()
    lg.flush()
    out = []

    def run(label: str, log: PartitionLog) -> None:
        off, n, nb = 0, 0, 0
        t0, c0 = time.perf_counter(), time.process_time()
        while True:
            r = log.read(off, 256 * 1024)
            if not r.count:
                break
            n += r.count
            nb += len(r.data)
            off = r.next_offset
        out.append((label, time.perf_counter() - t0, n, nb, time.process_time() - c0))

    run("read tail (memory)", lg)
    lg.close()
    lg = PartitionLog(path, 0, cfg)
    lg._drop_caches()
    run("read cold (pread)", lg)
    lg.close()
    shutil.rmtree(path)
    return out


def cold(path: Path) -> None:
    """Drop these files' pages from the page cache (per file: other work keeps its cache)."""
    for p in path.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench_recover(root: Path, nbytes: int, batch: int
                  ) -> list[tuple[str, float, int, float]]:
    """Open (recovery) time of a fully fsynced log of ``nbytes`` of 200 B bodies in commits
    of ``batch``: the recovery point covers everything, so this is the start-time crc scrub
    (issue 28) on top of loading the metadata; warm (page cache) and cold (fadvise)."""
    path = Path(tempfile.mkdtemp(dir=root))
    cfg = LogConfig(sync_every=10**12, sync_interval=0)
    lg = PartitionLog(path, 0, cfg)
    body = [b"r" * 200] * batch
    while lg.size_bytes() < nbytes:
        for _ in range(100):
            lg.append(body)
            lg.flush()
    lg.sync()
    size = lg.size_bytes()
    lg.close()
    out = []
    for label in ("warm", "cold"):
        if label == "cold":
            cold(path)
        t0, c0 = time.perf_counter(), time.process_time()
        lg = PartitionLog(path, 0, cfg)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        lg.close()
        out.append((f"recover {size >> 20} MiB batch {batch:>3} {label}", dt, size, cpu))
    shutil.rmtree(path)
    return out


def line(label: str, dt: float, n: int, nbytes: int, cpu: float | None = None) -> str:
    """One result; with ``cpu`` (process CPU seconds) also CPU per message, which a loaded
    machine disturbs less than the rates."""
    per = "" if cpu is None else f", {cpu / n * 1e9:.0f} ns CPU/msg"
    return (f"{label:<44} {n / dt / 1e6:7.2f} M msgs/s {nbytes / dt / 1e6:9.1f} MB/s  "
            f"({n} msgs{per})")


def recover_line(label: str, dt: float, nbytes: int, cpu: float) -> str:
    return f"{label:<44} {dt * 1e3:9.1f} ms {cpu * 1e3:9.1f} ms CPU {nbytes / dt / 1e6:9.1f} MB/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer messages")
    ap.add_argument("--dir", default=None, help="directory for the logs (default: a temp dir)")
    ap.add_argument("--recover-mib", type=int, default=256,
                    help="size of the fsynced log whose recovery (start) is timed")
    ap.add_argument("--only", choices=("read", "recover"), default=None,
                    help="run only the read or the recovery part")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir))
    big = 200_000 if args.quick else 2_000_000
    rates: dict[tuple, float] = {}
    try:
        if args.only == "recover":
            for batch in (1, 100):
                for r in bench_recover(root, args.recover_mib << 20, batch):
                    print(recover_line(*r), flush=True)
            return
        if args.only == "read":
            for kind in ("100", "200", "mixed"):
                for label, dt, n, nb, cpu in bench_read(root, kind, big):
                    print(line(f"{label} {kind:>5} B", dt, n, nb, cpu), flush=True)
            for label, dt, n, nb, cpu in bench_read(root, "200", big // 4, batch=1):
                print(line(f"{label}   200 B batch 1", dt, n, nb, cpu), flush=True)
            return
        for sync in ("none", "2500", "commit"):
            for kind in ("100", "200", "mixed"):
                for batch in (1, 100):
                    total = big if sync != "commit" else 2_000 * (batch if batch > 1 else 1)
                    if sync == "2500":
                        total //= 2
                    dt, nb = bench_append(root, kind, batch, sync, total)
                    rates[(sync, kind, batch)] = total / dt
                    print(line(f"append {kind:>5} B batch {batch:>3} sync={sync}", dt, total, nb),
                          flush=True)
        for kind in ("100", "200", "mixed"):
            for label, dt, n, nb, cpu in bench_read(root, kind, big):
                rates[(label, kind)] = n / dt
                print(line(f"{label} {kind:>5} B", dt, n, nb, cpu), flush=True)
        for batch in (1, 100):
            for r in bench_recover(root, args.recover_mib << 20, batch):
                print(recover_line(*r), flush=True)
        print()
        for batch in (1, 100):
            r = rates[("none", "mixed", batch)] / rates[("none", "200", batch)]
            print(f"mixed/uniform(200 B) append ratio, batch {batch}: {r:.2f}")
        for label in ("read tail (memory)", "read cold (pread)"):
            print(f"mixed/uniform(200 B) {label} ratio: "
                  f"{rates[(label, 'mixed')] / rates[(label, '200')]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
