"""Run the utilities as real processes (``python -m nsqx.tools.<name>``) and talk to nsqd."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from nsqx.client import Consumer, Message

STOP_TIMEOUT = 20.0


class Tool:
    def __init__(self, name: str, args: list[str], log_dir: Path, *, stdin: Any = None) -> None:
        self.name = name
        self.args = args
        self.stdout_path = log_dir / f"{name}-{id(self)}.out"
        self.stderr_path = log_dir / f"{name}-{id(self)}.err"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"nsqx.tools.{name}", *args],
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=out, stderr=err, env=env, cwd=str(log_dir))

    @property
    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout}s\n"
                                 f"stderr:\n{self.stderr[-4000:]}") from None

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def wait_stderr(self, text: str, timeout: float = 15.0) -> None:
        wait_for(lambda: text in self.stderr, timeout, f"{text!r} in {self.name}'s stderr")


class ToolFactory:
    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.procs: list[Tool] = []

    def start(self, name: str, args: list[str], **kw: Any) -> Tool:
        t = Tool(name, args, self.base, **kw)
        self.procs.append(t)
        return t

    def run(self, name: str, args: list[str], timeout: float = 20.0,
            input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", f"nsqx.tools.{name}", *args],
                              input=input, capture_output=True, timeout=timeout,
                              cwd=str(self.base))

    def logs(self) -> str:
        parts = []
        for t in self.procs:
            parts.append(f"--- {t.name} {' '.join(t.args)} (rc={t.proc.poll()})\n"
                         f"stderr:\n{t.stderr[-4000:]}\nstdout:\n"
                         f"{t.stdout[-2000:].decode(errors='replace')}")
        return "\n".join(parts)

    def close(self) -> None:
        for t in self.procs:
            t.kill()


def wait_for(pred: Callable[[], Any], timeout: float = 15.0, what: str = "condition",
             interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# -- nsqd HTTP ------------------------------------------------------------------------------


def http(method: str, address: str, path: str, params: dict[str, Any] | None = None,
         body: bytes | None = None, timeout: float = 10.0) -> bytes:
    q = f"?{urlencode(params)}" if params else ""
    req = urllib.request.Request(f"http://{address}{path}{q}", data=body, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def pub(address: str, topic: str, bodies: list[bytes]) -> None:
    """Publish through nsqd's HTTP API (binary /mpub keeps any bytes)."""
    import struct
    for i in range(0, len(bodies), 500):
        chunk = bodies[i:i + 500]
        data = struct.pack(">I", len(chunk)) + b"".join(
            struct.pack(">I", len(b)) + b for b in chunk)
        http("POST", address, "/mpub", {"topic": topic, "binary": "true"}, data)


def create_topic(address: str, topic: str, channel: str | None = None) -> None:
    http("POST", address, "/topic/create", {"topic": topic})
    if channel:
        http("POST", address, "/channel/create", {"topic": topic, "channel": channel})


def stats(address: str, topic: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"format": "json"}
    if topic:
        params["topic"] = topic
    return json.loads(http("GET", address, "/stats", params))


def topic_stats(address: str, topic: str) -> dict[str, Any] | None:
    for t in stats(address, topic).get("topics") or []:
        if t["topic_name"] == topic:
            return t
    return None


def channel_stats(address: str, topic: str, channel: str) -> dict[str, Any] | None:
    t = topic_stats(address, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            return c
    return None


def consume(tcp_address: str, topic: str, count: int, timeout: float = 15.0,
            channel: str = "check", settle: float = 0.3) -> list[bytes]:
    """Read ``count`` messages (then ``settle`` more seconds for extras) with nsqx.client."""
    async def go() -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        def handle(m: Message) -> None:
            got.append(m.body)
            if len(got) >= count:
                done.set()

        c = Consumer(topic, channel, handle, nsqd_tcp_addresses=[tcp_address],
                     max_in_flight=100)
        await c.start()
        try:
            async with asyncio.timeout(timeout):
                await done.wait()
            await asyncio.sleep(settle)
        except TimeoutError:
            pass
        finally:
            await c.close()
        return got

    return asyncio.run(go())
