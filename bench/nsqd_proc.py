"""What the benchmarks that start their own nsqd share: free ports, a process's CPU time
(and its children's pids), an nsqd started from this tree's ``src`` (or with ``--workers``,
once every worker is ready) and stopped. Imported by the scripts beside it
(``python bench/<script>.py`` puts ``bench/`` on ``sys.path``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree(pid: int) -> list[int]:
    """``pid`` and its direct children (an ``nsqd --workers`` supervisor and its workers)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    return [pid, *map(int, kids)]


def start_nsqd(data: Path, *flags: str, log: Path | None = None,
               ready: Callable[[], bool] = lambda: True,
               ) -> tuple[subprocess.Popen[bytes], str, str]:
    """An nsqd of this tree on free ports over ``data``, once ``ready()`` and ``/ping``
    answer: (process, TCP address, HTTP address). Its output goes to ``log`` (or nowhere)."""
    tcp, http = free_port(), free_port()
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the process's
    proc = subprocess.Popen([sys.executable, "-m", "nsqx.cli.nsqd", f"--data-path={data}",
                             f"--tcp-address=127.0.0.1:{tcp}",
                             f"--http-address=127.0.0.1:{http}", *flags],
                            env={**os.environ, "PYTHONPATH": SRC}, stdout=out,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ready():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/ping", timeout=1).read()
                return proc, f"127.0.0.1:{tcp}", f"127.0.0.1:{http}"
            except OSError:
                pass
        time.sleep(0.1)
    proc.kill()
    tail = log.read_text()[-3000:] if log is not None else ""
    raise RuntimeError(f"nsqd {' '.join(flags)} did not start\n{tail}")


def start_workers(data: Path, workers: int, *flags: str,
                  ) -> tuple[subprocess.Popen[bytes], str, str]:
    """``start_nsqd`` with ``--workers=N``, ready once every worker logged ``ready`` (the
    log is ``nsqd-<N>.log`` beside ``data``)."""
    logpath = data.parent / f"nsqd-{workers}.log"

    def ready() -> bool:
        return logpath.exists() and logpath.read_bytes().count(b"INFO: ready: ") >= workers
    return start_nsqd(data, f"--workers={workers}", *flags, log=logpath, ready=ready)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
