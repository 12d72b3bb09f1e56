"""Tiered storage on its own (storage layer, directory backend): how fast closed segments
become Parquet, how many bytes a message takes there against the local log, how fast
archived messages are read back as frames, and how long a time seek into the archive takes.

    .venv/bin/python bench/archive.py [--messages 300000] [--body-bytes 200] [--compression zstd]
    .venv/bin/python bench/archive.py --nsqd [--seconds 5] [--replay] [--compression zstd]

``--nsqd``: a real nsqd, first without then with ``--archive-url``, the same load: 200-byte
MPUB ingest at full rate (2 writers) while a consumer drains and one client PUBs a message
at a time (latency): ingest, drain and PUB latency on/off, the archive lag every second,
msgs/s archived, time to catch up, the archiver thread's CPU (its OS thread name).
``--replay``: then drain the rest, reset the channel to the archive start and replay it with
a stock-protocol reader (nsqx.benchmark's, SUB/RDY/FIN). ``--compression``: the Parquet
codec (nsqd's ``--archive-compression``).

Bodies are JSON-like events (a few fields, 32 random hex digits each), so compression has
something realistic to work on; ``--random`` makes them incompressible random bytes.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsqd_compare import server  # noqa: E402  (bench/: starts an nsqd on free ports)
from nsqx.benchmark import loadgen, scenarios  # noqa: E402
from nsqx.storage.archive import Archive  # noqa: E402
from nsqx.storage.archive_codecs import CODECS  # noqa: E402
from nsqx.storage.archiver import THREAD_NAME, Archiver  # noqa: E402
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


def thread_cpu(pid: int, name: str = THREAD_NAME) -> float:
    """CPU seconds of the process's threads called ``name`` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != name:
                continue
            fields = (task / "stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def node_run(archiving: bool, seconds: float, replay: bool, codec: str = "zstd") -> dict:
    """One nsqd: `seconds` of MPUB ingest (2 writers, 200 x 200 B per MPUB) while a reader
    drains and one client PUBs one message at a time (publish latency); with archiving,
    the lag sampled every second, then how long the archiver takes to catch up."""
    arch = tempfile.mkdtemp(prefix="nsqx-bench-archive-") if archiving else ""
    flags = ["--max-bytes-per-file=16777216"] + (
        [f"--archive-url={arch}", f"--archive-compression={codec}"] if arch else [])
    out: dict = {"archiving": archiving, "lag": []}
    try:
        with server("nsqx", None, flags) as (tcp, http, pid), \
                mp.get_context("fork").Pool(4) as pool:
            scenarios.http_post(http, "/topic/create?topic=bench")
            scenarios.http_post(http, "/channel/create?topic=bench&channel=ch")
            cpu0, acpu0, t0 = loadgen.proc_stats(pid)["cpu_s"], thread_cpu(pid), time.monotonic()
            writers = pool.starmap_async(loadgen.run_writer, [
                (tcp, "bench", 200, 200, seconds, None, 8, False)] * 2)
            reader = pool.apply_async(loadgen.run_reader,
                                      (tcp, "bench", "ch", 1 << 40, seconds, 2500, False))
            pub = pool.apply_async(loadgen.run_pub_latency, (tcp, "bench", 200, seconds))
            while archiving and not writers.ready():
                writers.wait(1.0)
                a = archive_stats(http)
                out["lag"].append((round(time.monotonic() - t0), a["archive_lag_segments"],
                                   a["archive_end"]))
            w = scenarios._sum(writers.get(), seconds)  # noqa: SLF001 - bench/ is nsqx's
            r, p = reader.get(), pub.get()
            wall = time.monotonic() - t0
            n = w["messages"] + p.messages
            out.update(ingest=w["msgs_per_s"], drained=r.rate, node_cpu=(
                loadgen.proc_stats(pid)["cpu_s"] - cpu0) / wall, messages=n,
                pub_p50_us=statistics.median(p.latencies_us),
                pub_p99_us=sorted(p.latencies_us)[int(0.99 * len(p.latencies_us))])
            if archiving:
                a = archive_stats(http)
                out.update(lag_end=a["archive_lag_segments"],
                           lag_end_mb=a["archive_lag_bytes"] / 2**20,
                           archived_in_ingest=a["archive_end"] / wall)
                # everything closed is archived (the newest segment stays open)
                caught = wait(lambda: archive_stats(http)["archive_lag_segments"] == 0, 120)
                a = archive_stats(http)
                busy = wall + caught
                cpu = thread_cpu(pid) - acpu0
                out.update(caught_up_s=caught, archived=a["archive_end"],
                           archived_per_s=a["archive_end"] / busy,
                           archiver_cpu=cpu / busy, archiver_us_per_msg=cpu / a["archive_end"] * 1e6,
                           archiver_mb_per_cpu_s=a["archive_end"] * 234 / 2**20 / cpu,
                           parquet_bytes_per_msg=a["archived_bytes"] / a["archive_end"])
                if replay:
                    scenarios.drain(tcp, "bench", "ch", expect=n - r.messages, seconds=120)
                    wait(lambda: archive_stats(http)["log_start"] > 0, 30)
                    scenarios.http_post(
                        http, "/channel/setoffset?topic=bench&channel=ch&to=earliest")
                    start = archive_stats(http)["log_start"]
                    rr = scenarios.drain(tcp, "bench", "ch", expect=n, seconds=120, pid=pid)
                    out.update(replay=rr["msgs_per_s"], replay_from_parquet=start / n)
    finally:
        if arch:
            shutil.rmtree(arch, ignore_errors=True)
    return out


def node_bench(seconds: float, replay: bool, codec: str) -> None:
    """Archiving off, then on, same load (see node_run); printed side by side."""
    off = node_run(False, seconds, replay=False)
    on = node_run(True, seconds, replay, codec)
    for r in (off, on):
        print(f"archiving {'on ' if r['archiving'] else 'off'}: ingest {r['ingest']:,.0f} msgs/s"
              f" while draining {r['drained']:,.0f} msgs/s; PUB latency p50 "
              f"{r['pub_p50_us']:.0f} us, p99 {r['pub_p99_us']:.0f} us; node CPU "
              f"{r['node_cpu']:.2f} cores")
    print(f"on/off: ingest {on['ingest'] / off['ingest']:.2f}, drain "
          f"{on['drained'] / off['drained']:.2f}, PUB p99 {on['pub_p99_us'] / off['pub_p99_us']:.2f}")
    print("archive lag during the ingest (s, segments behind, archived offsets): "
          + " ".join(f"{t}:{lag}/{end:,}" for t, lag, end in on["lag"]))
    print(f"archived {on['archived']:,} msgs: {on['archived_in_ingest']:,.0f} msgs/s during the "
          f"ingest ({on['archived_in_ingest'] * 234 / 2**20:.0f} MB/s of log), lag at its end "
          f"{on['lag_end']} segments ({on['lag_end_mb']:.0f} MB), caught up "
          f"{on['caught_up_s']:.1f} s later; overall {on['archived_per_s']:,.0f} msgs/s")
    print(f"archiver thread: {on['archiver_cpu']:.2f} of a core, {on['archiver_us_per_msg']:.2f}"
          f" us/msg ({on['archiver_mb_per_cpu_s']:.0f} MB of log per CPU second); "
          f"Parquet ({codec}) {on['parquet_bytes_per_msg']:.1f} B/msg")
    if "replay" in on:
        print(f"replay from the archive start: {on['replay']:,.0f} msgs/s "
              f"({on['replay_from_parquet']:.0%} of it from Parquet)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--body-bytes", type=int, default=200)
    ap.add_argument("--segment-mb", type=int, default=16)
    ap.add_argument("--random", action="store_true", help="incompressible bodies")
    ap.add_argument("--nsqd", action="store_true", help="through a real nsqd (see above)")
    ap.add_argument("--seconds", type=float, default=5.0, help="--nsqd: ingest time")
    ap.add_argument("--replay", action="store_true",
                    help="--nsqd: then drain, reset to the archive start and replay")
    ap.add_argument("--compression", choices=list(CODECS), default="zstd",
                    help="Parquet codec (nsqd --archive-compression)")
    a = ap.parse_args()
    if a.nsqd:
        node_bench(a.seconds, a.replay, a.compression)
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
        archive = Archive(str(tmp / "archive"), compression=a.compression)
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
              f"{all_local / msgs:.1f} with indexes and metadata), Parquet {a.compression} "
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
