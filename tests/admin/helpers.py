"""Test support for nsqadmin: the process, a notification sink, curl-like requests."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.nsqd_process import _can_connect, _tail

READY_TIMEOUT = 30.0
_HTTP_RE = re.compile(rb"\bHTTP: listening on (\S+):(\d+)")


class AdminError(AssertionError):
    pass


def admin_command() -> list[str]:
    override = os.environ.get("NSQX_NSQADMIN_CMD")
    if override:
        return shlex.split(override)
    return [sys.executable, "-m", "nsqx.cli.nsqadmin"]


class AdminProcess:
    def __init__(self, log_dir: Path, args: list[str], name: str = "nsqadmin") -> None:
        self.log_dir = Path(log_dir)
        self.args = list(args)
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.log_dir / f"{name}.log"
        self.http_port: int | None = None

    @property
    def address(self) -> str:
        assert self.http_port
        return f"127.0.0.1:{self.http_port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def command(self) -> list[str]:
        return admin_command() + ["--http-address=127.0.0.1:0"] + self.args

    def log_text(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace") if self.log_path.exists() \
            else ""

    def start(self, timeout: float = READY_TIMEOUT) -> AdminProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, cwd=str(self.log_dir))
        deadline = time.monotonic() + timeout
        try:
            while True:
                m = _HTTP_RE.search(self.log_path.read_bytes())
                if m and _can_connect(int(m.group(2))):
                    self.http_port = int(m.group(2))
                    return self
                if self.proc.poll() is not None:
                    raise AdminError(f"nsqadmin exited ({self.proc.returncode}):\n"
                                     f"{_tail(self.log_path.read_bytes())}")
                if time.monotonic() > deadline:
                    raise AdminError(f"nsqadmin not ready after {timeout}s:\n"
                                     f"{_tail(self.log_path.read_bytes())}")
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AdminError(f"nsqadmin did not exit within {timeout}s of SIGTERM") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


class AdminFactory:
    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.procs: list[AdminProcess] = []

    def start(self, args: list[str]) -> AdminProcess:
        p = AdminProcess(self.base, args, name=f"nsqadmin{len(self.procs) + 1}")
        self.procs.append(p)
        return p.start()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{_tail(p.log_text().encode())}" for p in self.procs)

    def close(self) -> list[str]:
        complaints = []
        for p in self.procs:
            try:
                p.stop()
            except AdminError as e:
                complaints.append(str(e))
            finally:
                p.kill()
        return complaints


# ----------------------------------------------------------------------------- HTTP

@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 15.0) -> Resp:
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Resp(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return Resp(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def get_json(url: str) -> Any:
    r = http("GET", url)
    assert r.status == 200, f"GET {url} -> {r.status} {r.body[:300]!r}"
    return r.json()


def wait_for(pred: Any, timeout: float = 10.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what or pred} (last: {last!r})")


def nsqd_topic(address: str, topic: str) -> dict[str, Any] | None:
    st = get_json(f"http://{address}/stats?format=json&topic={topic}")
    for t in st.get("topics") or []:
        if t["topic_name"] == topic:
            return t
    return None


def nsqd_channel(address: str, topic: str, channel: str) -> dict[str, Any] | None:
    t = nsqd_topic(address, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            return c
    return None


# ----------------------------------------------------------------------------- notifications

class NotificationSink:
    """An HTTP endpoint that records the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                sink.received.append(json.loads(self.rfile.read(n)))
                sink.headers.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/notify"

    def start(self) -> NotificationSink:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        wait_for(lambda: len(self.received) >= n, timeout, what=f"{n} notifications")
        return self.received
