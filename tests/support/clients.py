"""Drive third-party NSQ clients (pynsq, gnsq, nsqjs) in subprocesses.

Each client has one script implementing the same scenarios, so the tests of every client read the
same. A script is run as ``<interpreter> <script> SCENARIO`` with the JSON params on stdin (bodies
can be bigger than an argv string may be) and prints one JSON object as its last stdout line. Running clients out of process keeps tornado's IOLoop and gevent's
monkeypatching away from pytest, and gives every run a hard timeout.

Params common to all scenarios::

    nsqd        "127.0.0.1:PORT"
    conn        {"tls": bool, "ca": path, "cert": path, "key": path, "snappy": bool,
                 "deflate": bool, "deflate_level": int, "auth_secret": str,
                 "msg_timeout_ms": int, "heartbeat_s": int}   (every key optional)
    deadline_s  the script gives up (timed_out=true) after this long

Scenario ``publish``: ``ops`` = list of ``{"op": "pub", "topic", "body"}``,
``{"op": "mpub", "topic", "bodies"}``, ``{"op": "dpub", "topic", "delay_ms", "body"}``;
bodies are hex. Ops run one after the other, each waiting for its answer; the first failure stops
the rest. Output ``results``: one "OK" or "ERR <error text>" per op that ran.

Scenario ``consume``: ``topic``, ``channel``, ``expect`` (number of FINs to send), ``max_in_flight``,
``mode``: "fin" (FIN each message), "req" (REQ first deliveries with ``req_delay_ms``, FIN later
ones), "touch" (TOUCH first deliveries ``touches`` times every ``touch_interval_ms``, then FIN),
"hold_first" (never answer first deliveries: they must time out; FIN redeliveries); ``idle_s``:
``late_fin_bodies`` (hex) with ``late_fin_ms``: the first delivery of
these bodies is held and FINed only after that delay (action "late-fin"); ``fin_limit``: FIN at most
that many, hold the rest; ``expect_bodies`` (hex): done once each was FINed; ``idle_s``:
keep consuming that long after the expected FINs to catch extra deliveries (which are FINed and
reported too); ``stop_on_error``: end as soon as the server sends an error.

Scenario ``handoff``: reader A gets ``expect`` messages, holds them unanswered and sets RDY 0; then
reader B starts on the same channel and must get them after the msg timeout; B FINs them.

Output of every scenario::

    {"timed_out": bool, "results": [...], "deliveries": [{"reader", "id", "body" (hex),
     "attempts", "timestamp_ns", "recv_ns", "action"}], "errors": ["E_... text"],
     "identify": [IDENTIFY response dicts], "auth": [AUTH response dicts],
     "heartbeats": number of _heartbeat_ frames the client answered}
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPAT_DIR = REPO / "tests" / "compat"
JS_DIR = COMPAT_DIR / "js"
PYNSQ_SCRIPT = COMPAT_DIR / "pynsq_scripts" / "client.py"
GNSQ_SCRIPT = COMPAT_DIR / "gnsq_scripts" / "client.py"
NSQJS_SCRIPT = JS_DIR / "client.js"


def hexs(bodies: list[bytes]) -> list[str]:
    return [b.hex() for b in bodies]


@dataclass
class Delivery:
    reader: str
    id: str
    body: bytes
    attempts: int
    timestamp_ns: int
    recv_ns: int
    action: str


@dataclass
class ClientResult:
    raw: dict[str, Any]
    stderr: str = ""
    deliveries: list[Delivery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.deliveries = [
            Delivery(d["reader"], d["id"], bytes.fromhex(d["body"]), int(d["attempts"]),
                     int(d.get("timestamp_ns") or 0), int(d.get("recv_ns") or 0), d["action"])
            for d in self.raw.get("deliveries", [])
        ]

    @property
    def timed_out(self) -> bool:
        return bool(self.raw.get("timed_out"))

    @property
    def results(self) -> list[str]:
        return list(self.raw.get("results", []))

    @property
    def errors(self) -> list[str]:
        return list(self.raw.get("errors", []))

    @property
    def identify(self) -> list[dict[str, Any]]:
        return list(self.raw.get("identify", []))

    @property
    def heartbeats(self) -> int:
        return int(self.raw.get("heartbeats", 0))

    @property
    def auth(self) -> list[dict[str, Any]]:
        return list(self.raw.get("auth", []))

    def bodies(self, action: str | None = None) -> list[bytes]:
        return [d.body for d in self.deliveries if action is None or d.action == action]

    def describe(self) -> str:
        raw = json.dumps(self.raw, indent=1)
        if len(raw) > 4000:
            raw = raw[:4000] + "...[cut]"
        return f"client result: {raw}\nclient stderr (tail):\n{self.stderr[-3000:]}"


@dataclass
class ClientRunner:
    """How to run one client's scenario script."""

    name: str
    argv: list[str]
    cwd: Path

    def run(self, scenario: str, params: dict[str, Any], *, timeout: float | None = None,
            ) -> ClientResult:
        params = dict(params)
        params.setdefault("deadline_s", 20.0)
        limit = timeout or float(params["deadline_s"]) + 20.0
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [*self.argv, scenario]
        try:
            res = subprocess.run(cmd, cwd=self.cwd, capture_output=True, timeout=limit, env=env,
                                 input=json.dumps(params).encode())
        except subprocess.TimeoutExpired as e:
            # subprocess.run kills the child (by pid) before raising
            err = (e.stderr or b"").decode(errors="replace")
            raise AssertionError(
                f"{self.name} {scenario} did not finish within {limit:.0f}s\n"
                f"stderr tail:\n{err[-3000:]}") from None
        stdout = res.stdout.decode(errors="replace")
        stderr = res.stderr.decode(errors="replace")
        lines = [ln for ln in stdout.splitlines() if ln.strip()]
        if res.returncode != 0 or not lines:
            raise AssertionError(
                f"{self.name} {scenario} exited {res.returncode}\nstdout:\n{stdout[-3000:]}\n"
                f"stderr:\n{stderr[-5000:]}")
        try:
            raw = json.loads(lines[-1])
        except ValueError:
            raise AssertionError(
                f"{self.name} {scenario}: last stdout line is not JSON\nstdout:\n"
                f"{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}") from None
        if raw.get("crash"):
            raise AssertionError(f"{self.name} {scenario} script crashed: {raw['crash']}\n"
                                 f"stderr:\n{stderr[-5000:]}")
        return ClientResult(raw, stderr)


def python_runner(name: str, script: Path) -> ClientRunner:
    return ClientRunner(name, [sys.executable, str(script)], script.parent)


def pynsq_runner() -> ClientRunner:
    return python_runner("pynsq", PYNSQ_SCRIPT)


def gnsq_runner() -> ClientRunner:
    return python_runner("gnsq", GNSQ_SCRIPT)


def nsqjs_runner() -> ClientRunner:
    """The nsqjs runner; skips (or fails in CI) when node or the npm deps are missing."""
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not installed"
    elif not (JS_DIR / "node_modules" / "nsqjs" / "package.json").exists():
        missing = "nsqjs is not installed: run scripts/install-test-deps.sh"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    assert node is not None
    return ClientRunner("nsqjs", [node, str(NSQJS_SCRIPT)], JS_DIR)
