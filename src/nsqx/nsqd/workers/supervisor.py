"""The process behind ``nsqd --workers=N`` (N > 1): it binds the node's listening sockets
once, before any worker runs, and keeps N workers serving on them.

Every worker is a whole nsqd (its own uvloop loop) started with the same flags and told
its index, N and the descriptors of the sockets it inherits (``WORKER_ENV``); the kernel
spreads the connections over the workers accepting on the same socket. The supervisor
holds the data path's lock, splits the metadata over the workers before they start and
merges it back once they stopped (``ownership``), restarts a worker that dies, stops the
node with the reason when one keeps dying (``CRASH_LIMIT`` exits in ``CRASH_WINDOW``
seconds), and on SIGTERM/SIGINT tells every worker to drain and stop, then exits.
It runs no event loop and opens no topic: a plain loop over ``waitpid``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from nsqx.nsqd import datapath
from nsqx.nsqd.node import fmt_addr, listening_socket
from nsqx.nsqd.workers.ownership import merge_metadata, split_metadata

__all__ = ["CRASH_LIMIT", "CRASH_WINDOW", "WORKER_ENV", "Supervisor"]

log = logging.getLogger("nsqx.nsqd")

WORKER_ENV = "NSQX_WORKER"  # JSON: {"index", "count", "fds": {"tcp", "http", "https"}}
CRASH_LIMIT = 5  # a worker that exits this often...
CRASH_WINDOW = 60.0  # ...within this many seconds stops the node
STOP_TIMEOUT = 30.0  # workers still running this long after SIGTERM are killed
POLL = 0.05
MAX_UNIX_PATH = 100  # sun_path is 108 bytes


class Supervisor:
    def __init__(self, opts: Any, argv: list[str]) -> None:
        self.opts = opts
        self.argv = list(argv)
        self.count = int(opts.workers)
        self.data_path = Path(opts.data_path or os.getcwd()).resolve()
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * self.count
        self.exits: list[deque[float]] = [deque() for _ in range(self.count)]
        self.sockets: dict[str, socket.socket] = {}
        self.stop_signal: int | None = None
        self._lock_fd: int | None = None

    # -- set-up --------------------------------------------------------------------------
    def _lock(self) -> None:
        self._lock_fd = datapath.lock_data_path(self.data_path,
                                                datapath.lock_path(self.data_path))

    def _bind(self) -> None:
        """The node's public listeners, bound and listening before any worker starts."""
        o = self.opts
        tcp = self.sockets["tcp"] = listening_socket(o.tcp_address)
        log.info("TCP: listening on %s", fmt_addr(tcp))
        if o.http_address:
            http = self.sockets["http"] = listening_socket(o.http_address)
            log.info("HTTP: listening on %s", fmt_addr(http))
        if o.tls_cert and o.tls_key and o.https_address:
            https = self.sockets["https"] = listening_socket(o.https_address)
            log.info("HTTPS: listening on %s", fmt_addr(https))

    def _check_socket_paths(self) -> None:
        longest = datapath.worker_socket_path(self.data_path, self.count - 1, "http")
        if len(str(longest).encode()) > MAX_UNIX_PATH:
            raise SystemExit(f"FATAL: --workers: --data-path={self.data_path} is too long for "
                             f"the workers' unix sockets ({longest}: at most {MAX_UNIX_PATH} "
                             "bytes); use a shorter path or --workers=1")
        wdir = datapath.workers_dir(self.data_path)
        wdir.mkdir(exist_ok=True)
        for stale in wdir.iterdir():  # a previous run's, killed
            with contextlib.suppress(OSError):
                stale.unlink()

    def _spawn(self, k: int) -> None:
        fds = {name: s.fileno() for name, s in self.sockets.items()}
        env = dict(os.environ)
        env[WORKER_ENV] = json.dumps({"index": k, "count": self.count, "fds": fds,
                                      "supervisor": os.getpid()})
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [sys.executable, "-m", "nsqx.cli.nsqd", *self.argv]
        self.procs[k] = subprocess.Popen(cmd, pass_fds=tuple(fds.values()), env=env,
                                         stdin=subprocess.DEVNULL)
        log.info("workers: worker %d started (pid %d)", k, self.procs[k].pid)

    # -- running -------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 0) or a worker that keeps dying (exit 1)."""
        self._lock()
        try:
            self._check_socket_paths()
            self._bind()
        except OSError as exc:
            log.critical("failed to start: %s", exc)
            return 1
        split_metadata(self.data_path, self.count)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for k in range(self.count):
            self._spawn(k)
        log.info("workers: %d workers serving on these listeners", self.count)
        reason = None
        while self.stop_signal is None and reason is None:
            time.sleep(POLL)
            for k, proc in enumerate(self.procs):
                if self.stop_signal is not None or proc is None:
                    break
                rc = proc.poll()
                if rc is None:
                    continue
                reason = self._exited(k, rc)
                if reason is None:
                    self._spawn(k)
                else:
                    break
        if reason is not None:
            log.critical("workers: %s; stopping the node", reason)
        else:
            log.info("workers: %s: stopping every worker",
                     signal.Signals(self.stop_signal or signal.SIGTERM).name)
        self._stop_all()
        return 1 if reason is not None else 0

    def _exited(self, k: int, rc: int) -> str | None:
        """Log a worker's exit; the reason to stop the node when it keeps dying."""
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        now = time.monotonic()
        times = self.exits[k]
        times.append(now)
        while times and now - times[0] > CRASH_WINDOW:
            times.popleft()
        log.error("workers: worker %d (pid %d) exited (%s): restarting it", k,
                  self.procs[k].pid if self.procs[k] else -1, how)
        if len(times) >= CRASH_LIMIT:
            return (f"worker {k} exited {len(times)} times within {CRASH_WINDOW:g} s "
                    f"(last: {how}; its log lines above say why)")
        return None

    def _stop_all(self) -> None:
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGTERM)
        for sock in self.sockets.values():  # workers hold their own copies until they exit
            sock.close()
        deadline = time.monotonic() + STOP_TIMEOUT
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("workers: worker pid %d did not stop within %g s: killing it",
                          p.pid, STOP_TIMEOUT)
                p.kill()
                p.wait()
        try:
            merge_metadata(self.data_path)
        except (OSError, SystemExit) as exc:
            log.error("workers: failed to merge the workers' metadata into nsqd.dat: %s "
                      "(the next start merges it)", exc)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.info("NSQ: bye")
