"""Many idle topics: descriptors, idle CPU, memory and restart time, against an empty node.

    .venv/bin/python bench/idle_topics.py [--topics 10000] [--idle-seconds 10]

Issue target (10,000 idle topics with a channel each): idle CPU <= 2% of a core, RSS <=
300 MiB, restart with that data <= 10 s. Two nsqd processes run in the same session: a
baseline with no topics, then one given N topics (each with one channel and one message,
so every topic has log files), both measured idle over the same window. Creation goes
through the HTTP API like a user's script; each creation rewrites nsqd.dat (as upstream),
so it slows with N. Everything binds to 127.0.0.1 and is removed at the end.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.benchmark import loadgen  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.tcp, self.http = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start and return the seconds until /ping answers (topics are loaded before)."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address=127.0.0.1:{self.tcp}",
             f"--http-address=127.0.0.1:{self.http}", f"--data-path={self.data}",
             "--log-level=warn"],
            stdout=(self.data.parent / f"{self.data.name}.log").open("ab"),
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.http}/ping", timeout=1).read()
                return time.monotonic() - t0
            except OSError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"nsqd exited: see {self.data}.log") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

    def idle(self, seconds: float) -> dict[str, float]:
        assert self.proc is not None
        pid = self.proc.pid
        before = loadgen.proc_stats(pid)
        time.sleep(seconds)
        after = loadgen.proc_stats(pid)
        return {"cpu_pct": (after["cpu_s"] - before["cpu_s"]) / seconds * 100,
                "rss_mib": after["rss"] / 2**20, "peak_mib": after["peak_rss"] / 2**20,
                "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def fill(node: Node, n: int) -> float:
    c = http.client.HTTPConnection("127.0.0.1", node.http, timeout=60)
    t0 = time.monotonic()
    for i in range(n):
        for method, url, body in (("POST", f"/topic/create?topic=t{i}", None),
                                  ("POST", f"/channel/create?topic=t{i}&channel=c", None),
                                  ("POST", f"/pub?topic=t{i}", b"hello")):
            c.request(method, url, body=body)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit(f"{url}: HTTP {r.status}")
        if (i + 1) % 1000 == 0:
            el = time.monotonic() - t0
            print(f"  {i + 1:>6} topics  {el:6.1f} s  {(i + 1) / el:6.0f} topics/s", flush=True)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    nodes: list[Node] = []
    try:
        base = Node(tmp / "empty")
        nodes.append(base)
        base.start()
        many = Node(tmp / "many")
        nodes.append(many)
        many.start()
        took = fill(many, args.topics)
        print(f"created {args.topics} topics (channel + one message each) in {took:.1f} s")
        time.sleep(35)  # two passes of the idle-file release (15 s each)
        b, m = base.idle(args.idle_seconds), many.idle(args.idle_seconds)
        many.stop()
        restart = many.start()
        time.sleep(3)
        r = many.idle(args.idle_seconds)
        print(f"{'':24} {'idle CPU':>9} {'RSS':>9} {'peak RSS':>9} {'fds':>6}")
        for name, x in (("empty node (baseline)", b), (f"{args.topics} topics", m),
                        (f"{args.topics} after restart", r)):
            print(f"{name:24} {x['cpu_pct']:8.2f}% {x['rss_mib']:6.0f} MiB {x['peak_mib']:6.0f} MiB"
                  f" {x['fds']:6.0f}")
        print(f"restart with {args.topics} topics: {restart:.2f} s to /ping (targets: idle CPU "
              f"<= 2%, RSS <= 300 MiB, restart <= 10 s)")
    finally:
        for n in nodes:
            n.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
