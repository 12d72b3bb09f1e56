"""Run a real ``nsqlookupd`` process for integration tests (the sibling of ``nsqd_process``).

Started on port 0; the real ports come from its ``TCP: listening on``/``HTTP: listening on`` log
lines. Output goes to a log file per start. :meth:`LookupdProcess.restart` keeps the ports, so
nsqds configured with ``--lookupd-tcp-address`` find it again. :class:`LookupdFactory` kills
whatever is still alive in its finalizer.

``NSQX_NSQLOOKUPD_CMD`` (a shell-quoted command) replaces ``<python> -m nsqx.cli.nsqlookupd``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.nsqd_process import _LISTEN_RE, _can_connect, _tail

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0


class LookupdError(AssertionError):
    """nsqlookupd did not start, stop or behave as a process should; carries its log."""


def lookupd_command() -> list[str]:
    override = os.environ.get("NSQX_NSQLOOKUPD_CMD")
    if override:
        return shlex.split(override)
    return [sys.executable, "-m", "nsqx.cli.nsqlookupd"]


class LookupdProcess:
    def __init__(self, log_dir: Path, args: list[str] | None = None, *,
                 name: str = "nsqlookupd") -> None:
        self.log_dir = Path(log_dir)
        self.args = list(args or [])
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_paths: list[Path] = []
        self.tcp_port: int | None = None
        self.http_port: int | None = None
        self._expected_exit = True

    # -- addresses --------------------------------------------------------------------------
    @property
    def tcp_address(self) -> str:
        assert self.tcp_port, "nsqlookupd not started"
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        assert self.http_port, "nsqlookupd not started"
        return f"127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        tcp = self.tcp_port or 0
        http = self.http_port or 0
        flags = [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
                 "--broadcast-address=127.0.0.1"]
        return lookupd_command() + flags + self.args

    # -- logs -------------------------------------------------------------------------------
    def log_bytes(self) -> bytes:
        return self.log_paths[-1].read_bytes() if self.log_paths else b""

    def all_logs(self, limit: int = 6000) -> str:
        parts = []
        for i, path in enumerate(self.log_paths, 1):
            data = path.read_bytes() if path.exists() else b""
            parts.append(f"--- {self.name} start #{i} log ({path}) ---\n{_tail(data, limit)}")
        return "\n".join(parts)

    def _fail(self, what: str) -> LookupdError:
        rc = self.proc.poll() if self.proc else None
        return LookupdError(f"{what}\ncommand: {shlex.join(self.command())}\nexit code: {rc}\n"
                            f"{_tail(self.log_bytes())}")

    # -- lifecycle --------------------------------------------------------------------------
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = READY_TIMEOUT) -> LookupdProcess:
        """Start (on the previous ports after the first start) and wait until both listen."""
        assert not self.is_running(), "already running"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log_path = self.log_dir / f"{self.name}-{self.starts}.log"
        self.log_paths.append(log_path)
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = self.command()
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         cwd=str(self.log_dir))
        self._expected_exit = False
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        found: dict[str, int] = {}
        while True:
            data = self.log_bytes()
            for key in ("tcp", "http"):
                if key not in found:
                    m = _LISTEN_RE[key].search(data)
                    if m:
                        found[key] = int(m.group(2))
            if len(found) == 2 and all(_can_connect(p) for p in found.values()):
                break
            if self.proc is not None and self.proc.poll() is not None:
                raise self._fail("nsqlookupd exited before it was ready")
            if time.monotonic() > deadline:
                raise self._fail(f"nsqlookupd not ready after {timeout:.0f}s")
            time.sleep(0.05)
        self.tcp_port = found["tcp"]
        self.http_port = found["http"]

    def stop(self, timeout: float = STOP_TIMEOUT, sig: int = signal.SIGTERM) -> int:
        """SIGTERM (or ``sig``) and wait; a process that hangs is SIGKILLed and reported."""
        if self.proc is None:
            return 0
        self._expected_exit = True
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise self._fail(f"nsqlookupd did not exit within {timeout:.0f}s of SIGTERM") \
                    from None
        return self.proc.returncode

    def kill(self) -> int:
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
        except subprocess.TimeoutExpired:  # pragma: no cover
            return -9

    def restart(self, *, graceful: bool = True, timeout: float = READY_TIMEOUT) -> LookupdProcess:
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start(timeout)

    def died_unexpectedly(self) -> bool:
        return self.proc is not None and not self._expected_exit and self.proc.poll() is not None

    # -- HTTP -------------------------------------------------------------------------------
    def get_json(self, path: str, timeout: float = 10.0) -> tuple[int, Any]:
        """GET ``path`` (with query) -> (status, decoded JSON body or None)."""
        url = f"http://{self.http_address}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            body = e.read()
            return e.code, json.loads(body) if body else None


class LookupdFactory:
    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.procs: list[LookupdProcess] = []

    def create(self, args: list[str] | None = None, *, name: str | None = None
               ) -> LookupdProcess:
        name = name or f"nsqlookupd{len(self.procs) + 1}"
        proc = LookupdProcess(self.base, args, name=name)
        self.procs.append(proc)
        return proc

    def start(self, args: list[str] | None = None, **kw: Any) -> LookupdProcess:
        return self.create(args, **kw).start()

    def logs(self) -> str:
        return "\n".join(p.all_logs() for p in self.procs)

    def close(self) -> list[str]:
        complaints = []
        for p in self.procs:
            if p.died_unexpectedly():
                assert p.proc is not None
                complaints.append(f"{p.name} (pid {p.proc.pid}) exited on its own with code "
                                  f"{p.proc.returncode}:\n{_tail(p.log_bytes(), 3000)}")
            if p.is_running():
                try:
                    p.stop(timeout=10)
                except LookupdError as e:
                    complaints.append(str(e))
                finally:
                    p.kill()
        return complaints
