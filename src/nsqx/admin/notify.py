"""Admin action notifications (upstream ``nsqadmin/notify.go``): every admin action is
POSTed as JSON to ``--notification-http-endpoint`` by a background task, so an action
never waits for (or fails because of) the endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import socket
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

__all__ = ["Notifier", "admin_action"]

log = logging.getLogger("nsqx.admin")

QUEUE_SIZE = 1024


def basic_auth_user(request: web.Request) -> str:
    kind, _, cred = request.headers.get("Authorization", "").partition(" ")
    if kind != "Basic" or not cred:
        return ""
    try:
        user, sep, _ = base64.b64decode(cred, validate=True).decode("utf-8", "replace").partition(":")
    except (binascii.Error, ValueError):
        return ""
    return user if sep else ""


def admin_action(action: str, topic: str, channel: str, node: str, request: web.Request,
                 acl_header: str = "") -> dict[str, Any]:
    """upstream's AdminAction JSON (``channel``, ``node``, ``user`` are omitempty)."""
    scheme = "https" if (request.secure or request.headers.get("X-Scheme") == "https") else "http"
    url = f"{scheme}://{request.host}{request.raw_path}"
    user = basic_auth_user(request) or (request.headers.get(acl_header, "") if acl_header else "")
    peer = request.transport.get_extra_info("peername") if request.transport else None
    remote = ""
    if peer:
        host, port = peer[0], peer[1]
        remote = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    a: dict[str, Any] = {"action": action, "topic": topic}
    if channel:
        a["channel"] = channel
    if node:
        a["node"] = node
    a["timestamp"] = int(time.time())
    if user:
        a["user"] = user
    a["remote_ip"] = remote
    a["user_agent"] = request.headers.get("User-Agent", "")
    a["url"] = url
    a["via"] = socket.gethostname()
    return a


class Notifier:
    def __init__(self, endpoint: str, connect_timeout: float, request_timeout: float) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.endpoint and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="notifier")

    def notify(self, action: dict[str, Any]) -> None:
        if not self.endpoint:
            return
        try:
            self._queue.put_nowait(action)
        except asyncio.QueueFull:
            log.error("notification queue full, dropping %s", action.get("action"))

    async def close(self, drain_timeout: float = 2.0) -> None:
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), drain_timeout)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout,
                                        sock_connect=self.connect_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                action = await self._queue.get()
                try:
                    log.info("POSTing notification to %s", self.endpoint)
                    async with session.post(self.endpoint, data=orjson.dumps(action),
                                            headers={"Content-Type": "application/json"}) as r:
                        await r.read()
                        if r.status >= 300:
                            log.error("notification POST to %s: HTTP %d", self.endpoint,
                                      r.status)
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    log.error("failed to POST notification - %s", e)
                finally:
                    self._queue.task_done()
