"""Spawn-to-/ping: how long a fresh nsqd process takes until its HTTP API answers (issue 24).

Each run starts nsqd on free 127.0.0.1 ports over an empty data directory, polls
``GET /ping`` on a raw socket until it answers 200, records the time since the spawn, then
stops the process (SIGTERM, then SIGKILL). Prints the median and the spread of N runs for
nsqx's nsqd and, with ``--go-nsqd PATH``, for Go's nsqd binary the same way.

    .venv/bin/python bench/startup.py --runs 21 [--go-nsqd /usr/local/bin/nsqd]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

POLL = 0.002  # seconds between connection attempts
TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ping(port: int) -> bool:
    """True once GET /ping answers 200 (a refused or cut connection is False)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return False
    return head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200")


def one_run(cmd: list[str]) -> float:
    """Seconds from spawn to the first 200 from /ping."""
    with tempfile.TemporaryDirectory(prefix="nsqx-startup-") as data:
        http = free_port()
        argv = [*cmd, f"--tcp-address=127.0.0.1:{free_port()}",
                f"--http-address=127.0.0.1:{http}", f"--data-path={data}"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            while not ping(http):
                if proc.poll() is not None:
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    raise SystemExit(f"{argv[0]} exited with {proc.returncode}:\n{err[-2000:]}")
                if time.perf_counter() - t0 > TIMEOUT:
                    raise SystemExit(f"{argv[0]}: /ping did not answer within {TIMEOUT} s")
                time.sleep(POLL)
            return time.perf_counter() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()


def measure(name: str, cmd: list[str], runs: int) -> None:
    times = sorted(one_run(cmd) for _ in range(runs))
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    print(f"{name:12s} spawn to /ping: median {statistics.median(times) * 1000:7.1f} ms  "
          f"(min {times[0] * 1000:.1f}, p25 {q[0] * 1000:.1f}, p75 {q[2] * 1000:.1f}, "
          f"max {times[-1] * 1000:.1f}; {runs} runs)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=11, help="runs per program (default 11)")
    ap.add_argument("--go-nsqd", metavar="PATH", help="also measure this Go nsqd binary")
    ap.add_argument("--nsqx-cmd", default=f"{sys.executable} -m nsqx.cli.nsqd",
                    help="how to start nsqx's nsqd (default: this Python, -m nsqx.cli.nsqd)")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    if a.go_nsqd and not os.access(a.go_nsqd, os.X_OK):
        ap.error(f"--go-nsqd {a.go_nsqd}: not an executable file")
    with contextlib.suppress(KeyboardInterrupt):
        measure("nsqx nsqd", a.nsqx_cmd.split(), a.runs)
        if a.go_nsqd:
            measure("Go nsqd", [a.go_nsqd], a.runs)


if __name__ == "__main__":
    main()
