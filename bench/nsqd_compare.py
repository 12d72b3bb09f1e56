"""Side-by-side benchmark: nsqx nsqd vs another nsqd (e.g. Go nsqd 1.3.0) on this machine.

    .venv/bin/python bench/nsqd_compare.py [--go-nsqd /path/to/nsqd] [--seconds 10] [--only NAME] [--floor]

Each scenario gets a fresh server on a fresh data directory. Prints msgs/s per
server and the ratio nsqx/other, plus server CPU per message and peak RSS.
Go nsqd runs with --mem-queue-size=1000000 (nsq's own bench.sh settings),
except in backlog_disk, where it keeps its default 10000 so the backlog
overflows to its disk queue.

tls_* scenarios give both servers a throwaway self-signed cert (made with the
openssl CLI in the server's temp data dir) and upgrade each client connection
with IDENTIFY tls_v1. topics_1000's idle part always measures 10 s of server
CPU with nothing happening and reports it as % of one core. pub_one_at_a_time and
http_pub run with 1 and 16 connections; --floor adds bench/floor_server.py (a uvloop
server answering OK without storing anything) to them, the single-loop floor.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.benchmark import scenarios  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cert(directory: str) -> tuple[str, str]:
    """A throwaway self-signed cert + key for 127.0.0.1, via the openssl CLI."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return cert, key


@contextlib.contextmanager
def server(kind: str, go_path: str | None, extra: list[str],
           tls: bool = False) -> Iterator[tuple[str, str, int]]:
    data = tempfile.mkdtemp(prefix=f"bench-{kind}-")
    tcp, http = free_port(), free_port()
    if kind == "nsqx":
        cmd = [sys.executable, "-m", "nsqx.cli.nsqd"]
    elif kind == "floor":
        cmd = [sys.executable, str(Path(__file__).with_name("floor_server.py"))]
    else:
        cmd = [go_path or "nsqd", "--mem-queue-size=1000000"]
    cmd += [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
            f"--data-path={data}", *extra]
    if tls:
        cert, key = make_cert(data)
        # without --https-address Go nsqd (and nsqx) would bind 0.0.0.0:4152
        cmd += [f"--tls-cert={cert}", f"--tls-key={key}",
                f"--https-address=127.0.0.1:{free_port()}"]
    log = open(os.path.join(data, "server.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", http), 0.2):
                break
            time.sleep(0.05)
        yield f"127.0.0.1:{tcp}", f"127.0.0.1:{http}", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def run_scenario(name: str, kind: str, go_path: str | None, secs: float) -> dict:
    extra: list[str] = []
    if name == "backlog_disk" and kind == "go":
        extra.append("--mem-queue-size=10000")  # Go's default: overflow to its disk queue
    with server(kind, go_path, extra, tls=name.startswith("tls_")) as (tcp, http, pid):
        topic = "bench"
        scenarios.http_post(http, f"/topic/create?topic={topic}")
        scenarios.http_post(http, f"/channel/create?topic={topic}&channel=ch")
        if name == "ingest_200x200":
            w = scenarios.ingest(tcp, topic, size=200, batch=200, seconds=secs, pid=pid)
            scenarios.wait_depth(http, topic, "ch", w["messages"])
            r = scenarios.drain(tcp, topic, "ch", expect=w["messages"], seconds=secs * 6, pid=pid)
            return {"ingest": w, "drain": r}
        if name == "ingest_100x100":
            return {"ingest": scenarios.ingest(tcp, topic, size=100, batch=100, seconds=secs, pid=pid)}
        if name == "mixed_50_2000":
            return {"ingest": scenarios.ingest(tcp, topic, size=0, batch=200, seconds=secs,
                                               mixed=(50, 2000), pid=pid)}
        if name == "pub_one_at_a_time":
            return {"pub_1": scenarios.pub_latency(tcp, topic, size=200, seconds=secs, pid=pid),
                    "pub_16": scenarios.pub_latency(tcp, topic, size=200, seconds=secs,
                                                    clients=16, pid=pid)}
        if name == "channels_10":
            chans = [f"c{i}" for i in range(10)]
            for c in chans:
                scenarios.http_post(http, f"/channel/create?topic={topic}&channel={c}")
            w = scenarios.ingest(tcp, topic, size=200, batch=200, seconds=secs / 2, writers=1,
                                 pid=pid)
            scenarios.wait_depth(http, topic, "c9", w["messages"])
            r = scenarios.fanout(tcp, topic, chans, expect=w["messages"], seconds=secs * 10, pid=pid)
            return {"ingest": w, "drain_10ch": r}
        if name == "tls_ingest":
            return {"ingest": scenarios.ingest(tcp, topic, size=200, batch=200, seconds=secs,
                                               pid=pid, tls=True)}
        if name == "tls_drain":
            # fill over plain TCP, then drain over TLS; only the drain is reported
            w = scenarios.ingest(tcp, topic, size=200, batch=200, seconds=secs, pid=pid)
            scenarios.wait_depth(http, topic, "ch", w["messages"])
            return {"drain": scenarios.drain(tcp, topic, "ch", expect=w["messages"],
                                             seconds=secs * 6, pid=pid, tls=True)}
        if name == "http_pub":
            # http.client (as a typical client) and a raw pre-encoded sender (server-bound)
            return {"http_pub": scenarios.http_pub(http, topic, size=200, seconds=secs, pid=pid),
                    "raw_1": scenarios.http_pub(http, topic, size=200, seconds=secs, raw=True,
                                                clients=1, pid=pid),
                    "raw_16": scenarios.http_pub(http, topic, size=200, seconds=secs, raw=True,
                                                 clients=16, pid=pid)}
        if name == "topics_1000":
            topics = [f"t{i:04d}" for i in range(1000)]
            paths: list[str] = []
            for t in topics:
                paths += [f"/topic/create?topic={t}", f"/channel/create?topic={t}&channel=c0",
                          f"/channel/create?topic={t}&channel=c1"]
            scenarios.http_post_many(http, paths)
            idle = scenarios.idle_cpu(pid, 10.0)
            active = scenarios.ingest_topics(tcp, topics, size=200, batch=20, seconds=secs,
                                             pid=pid)
            return {"idle": idle, "active": active}
        if name == "backlog_disk":
            w = scenarios.ingest(tcp, topic, size=200, batch=200, seconds=secs, pid=pid)
            scenarios.wait_depth(http, topic, "ch", w["messages"])
            if DROP_CACHES:
                drop_page_cache()
            r = scenarios.drain(tcp, topic, "ch", expect=w["messages"], seconds=secs * 6, pid=pid)
            return {"ingest": w, "drain": r}
    raise ValueError(name)


DROP_CACHES = False  # --drop-caches: backlog_disk's drain reads from the disk, not the page cache


def drop_page_cache() -> None:
    """sync, then drop the clean page cache (root only): the next reads hit the disk."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        print(f"# could not drop the page cache ({exc}); reads may come from memory")


FLOOR_SCENARIOS = ("pub_one_at_a_time", "http_pub")
SCENARIOS = ["ingest_200x200", "ingest_100x100", "mixed_50_2000", "pub_one_at_a_time", "channels_10",
             "tls_ingest", "tls_drain", "http_pub", "topics_1000", "backlog_disk"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--go-nsqd", default=os.environ.get("NSQD_GO"), help="path of the other nsqd")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--only", action="append", choices=SCENARIOS)
    ap.add_argument("--drop-caches", action="store_true",
                    help="backlog_disk: drop the page cache between ingest and drain (root)")
    ap.add_argument("--floor", action="store_true",
                    help="pub_one_at_a_time/http_pub: also run bench/floor_server.py (a uvloop "
                         "server that answers without storing anything: the single-loop floor)")
    args = ap.parse_args()
    global DROP_CACHES
    DROP_CACHES = args.drop_caches
    kinds = ["nsqx"] + (["go"] if args.go_nsqd else [])
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {os.cpu_count()} cpus, {args.seconds:.0f}s runs")
    for name in args.only or SCENARIOS:
        ks = kinds + (["floor"] if args.floor and name in FLOOR_SCENARIOS else [])
        results = {k: run_scenario(name, k, args.go_nsqd, args.seconds) for k in ks}
        for part in results["nsqx"]:
            row = [f"{name}/{part}"]
            for k in ks:
                d = results[k][part]
                row.append(f"{k}: {d['msgs_per_s']:>10,.0f} msgs/s {d.get('mb_per_s', 0):6.1f} MB/s"
                           f" cpu {d.get('server_us_per_msg', 0):5.2f} us/msg"
                           f" rss {d.get('server_peak_rss_mib', 0):6.1f} MiB")
                if "cpu_pct" in d:
                    row.append(f"cpu {d['cpu_pct']:.1f}% of a core")
                if "p50_us" in d:
                    row.append(f"p50 {d['p50_us']:.0f}us p99 {d['p99_us']:.0f}us p999 {d['p999_us']:.0f}us")
                if d.get("errors"):
                    row.append(f"errors {d['errors']}")
            if "go" in results and "cpu_pct" in results["nsqx"][part]:
                ratio = results["nsqx"][part]["cpu_pct"] / max(results["go"][part]["cpu_pct"], 0.01)
                row.append(f"cpu ratio nsqx/go {ratio:.2f}x")
            elif "go" in results:
                ratio = results["nsqx"][part]["msgs_per_s"] / max(results["go"][part]["msgs_per_s"], 1)
                row.append(f"ratio nsqx/go {ratio:.2f}x")
            if "floor" in results and "go" in results:
                ratio = results["floor"][part]["msgs_per_s"] / max(results["go"][part]["msgs_per_s"], 1)
                row.append(f"floor/go {ratio:.2f}x")
            print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
