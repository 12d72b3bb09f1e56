"""Run a real ``nsqd`` process for integration and compatibility tests.

The server is started on port 0 (the kernel picks free ports) and we learn the real ports from its
log lines (``TCP: listening on 127.0.0.1:PORT``, ``HTTP: ...``, ``HTTPS: ...``), exactly as an
operator would. stdout and stderr go to a log file per start, never a pipe, so a chatty server can
never block on a full pipe and the whole log is there to show when something fails.

Every process is signalled by its pid only; :class:`NsqdFactory` kills whatever is still alive
in its finalizer, even when the test failed half way.

``NSQX_NSQD_CMD`` (a shell-quoted command) replaces the default
``<python> -m nsqx.cli.nsqd``, e.g. to run the same tests against another build.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0

_LISTEN_RE = {
    "tcp": re.compile(rb"\bTCP: listening on (\S+):(\d+)"),
    "http": re.compile(rb"\bHTTP: listening on (\S+):(\d+)"),
    "https": re.compile(rb"\bHTTPS: listening on (\S+):(\d+)"),
}


class NsqdError(AssertionError):
    """nsqd did not start, stop or behave as a process should; the message carries its log."""


def nsqd_command() -> list[str]:
    """The command that starts nsqd, without flags."""
    override = os.environ.get("NSQX_NSQD_CMD")
    if override:
        return shlex.split(override)
    return [sys.executable, "-m", "nsqx.cli.nsqd"]


def _tail(data: bytes, limit: int = 6000) -> str:
    text = data.decode("utf-8", "replace")
    if len(text) > limit:
        text = "...[log cut]...\n" + text[-limit:]
    return text


class NsqdProcess:
    """One nsqd on one data directory; may be stopped, killed and started again on the same data."""

    def __init__(
        self,
        data_path: Path,
        args: list[str] | None = None,
        *,
        log_dir: Path | None = None,
        name: str = "nsqd",
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_path = Path(data_path)
        self.args = list(args or [])
        self.log_dir = Path(log_dir) if log_dir else self.data_path.parent
        self.name = name
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_paths: list[Path] = []
        self.tcp_port: int | None = None
        self.http_port: int | None = None
        self.https_port: int | None = None
        self._expected_exit = True

    # -- addresses --------------------------------------------------------------------------
    @property
    def tcp_address(self) -> str:
        assert self.tcp_port, "nsqd not started"
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        assert self.http_port, "nsqd not started"
        return f"127.0.0.1:{self.http_port}"

    @property
    def https_address(self) -> str:
        assert self.https_port, "nsqd not started with TLS"
        return f"127.0.0.1:{self.https_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def wants_https(self) -> bool:
        return any(a.startswith("--tls-cert") for a in self.args)

    def command(self) -> list[str]:
        flags = [
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={self.data_path}",
        ]
        if self.wants_https and not any(a.startswith("--https-address") for a in self.args):
            # upstream's default HTTPS address is 0.0.0.0:4152: tests bind loopback only
            flags.append("--https-address=127.0.0.1:0")
        return nsqd_command() + flags + self.args

    # -- logs -------------------------------------------------------------------------------
    def log_bytes(self) -> bytes:
        return self.log_paths[-1].read_bytes() if self.log_paths else b""

    def all_logs(self, limit: int = 6000) -> str:
        parts = []
        for i, path in enumerate(self.log_paths, 1):
            data = path.read_bytes() if path.exists() else b""
            parts.append(f"--- {self.name} start #{i} log ({path}) ---\n{_tail(data, limit)}")
        return "\n".join(parts)

    def _fail(self, what: str) -> NsqdError:
        rc = self.proc.poll() if self.proc else None
        return NsqdError(
            f"{what}\ncommand: {shlex.join(self.command())}\nexit code: {rc}\n"
            f"{_tail(self.log_bytes())}"
        )

    # -- lifecycle --------------------------------------------------------------------------
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = READY_TIMEOUT) -> NsqdProcess:
        """Start and wait until TCP and HTTP (and HTTPS with TLS) accept connections."""
        assert not self.is_running(), "already running"
        self.data_path.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log_path = self.log_dir / f"{self.name}-{self.starts}.log"
        self.log_paths.append(log_path)
        self.tcp_port = self.http_port = self.https_port = None
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.env:
            env.update(self.env)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.log_dir),
            )
        self._expected_exit = False
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        needed = ["tcp", "http"] + (["https"] if self.wants_https else [])
        found: dict[str, int] = {}
        while True:
            data = self.log_bytes()
            for key in needed:
                if key not in found:
                    m = _LISTEN_RE[key].search(data)
                    if m:
                        found[key] = int(m.group(2))
            if len(found) == len(needed) and all(_can_connect(p) for p in found.values()):
                break
            if self.proc is not None and self.proc.poll() is not None:
                raise self._fail("nsqd exited before it was ready")
            if time.monotonic() > deadline:
                raise self._fail(
                    f"nsqd not ready after {timeout:.0f}s (saw listen lines for {sorted(found)}, "
                    f"need {needed}; the server must log 'TCP: listening on HOST:PORT' etc.)"
                )
            time.sleep(0.05)
        self.tcp_port = found["tcp"]
        self.http_port = found["http"]
        self.https_port = found.get("https")

    def signal(self, sig: int) -> None:
        if self.is_running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait for a graceful exit; a server that hangs is SIGKILLed and reported."""
        if self.proc is None:
            return 0
        self._expected_exit = True
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise self._fail(f"nsqd did not exit within {timeout:.0f}s of SIGTERM") from None
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL (a crash: no shutdown code runs) and reap."""
        if self.proc is None:
            return 0
        self._expected_exit = True
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed process always dies
            return -9

    def restart(self, *, graceful: bool = True, timeout: float = READY_TIMEOUT) -> NsqdProcess:
        """Stop (SIGTERM, or SIGKILL if not graceful) and start again on the same data path."""
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start(timeout)

    def children(self) -> list[int]:
        """The pids of the processes nsqd started (its workers with ``--workers`` > 1)."""
        if not self.is_running():
            return []
        assert self.proc is not None
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(x) for x in text.split()]

    def died_unexpectedly(self) -> bool:
        return self.proc is not None and not self._expected_exit and self.proc.poll() is not None


def _can_connect(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


class NsqdFactory:
    """Creates nsqd processes under a test's tmp dir and guarantees they are gone afterwards."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.procs: list[NsqdProcess] = []
        #: flags every process of this factory gets before its own (e.g. ``--workers=2``)
        self.default_args: list[str] = []

    def create(self, args: list[str] | None = None, *, name: str | None = None,
               data_path: Path | None = None) -> NsqdProcess:
        name = name or f"nsqd{len(self.procs) + 1}"
        data = Path(data_path) if data_path else self.base / f"{name}-data"
        proc = NsqdProcess(data, [*self.default_args, *(args or [])], log_dir=self.base,
                           name=name)
        self.procs.append(proc)
        return proc

    def start(self, args: list[str] | None = None, **kw) -> NsqdProcess:
        return self.create(args, **kw).start()

    def logs(self) -> str:
        return "\n".join(p.all_logs() for p in self.procs)

    def close(self) -> list[str]:
        """Stop everything (SIGTERM, then SIGKILL); returns complaints about crashed servers."""
        complaints = []
        for p in self.procs:
            if p.died_unexpectedly():
                assert p.proc is not None
                complaints.append(
                    f"{p.name} (pid {p.proc.pid}) exited on its own with code "
                    f"{p.proc.returncode} during the test:\n{_tail(p.log_bytes(), 3000)}"
                )
            if p.is_running():
                try:
                    p.stop(timeout=10)
                except NsqdError as e:
                    complaints.append(str(e))
                finally:
                    p.kill()
        return complaints
