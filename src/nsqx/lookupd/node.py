"""One nsqlookupd: the registration DB, the TCP listener for nsqds, the HTTP API
(upstream ``nsqlookupd/nsqlookupd.go``).

``start()`` binds both listeners first (port 0 allowed; the real ports are in
``tcp_port``/``http_port`` and in the ``TCP: listening on``/``HTTP: listening on``
log lines), then serves. ``stop()`` follows upstream's ``Exit``: stop accepting,
close every nsqd connection (dropping its registrations), close HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.httpapi import make_runner
from nsqx.netutil import bind_listener

from .http import make_app
from .options import Options
from .registry import RegistrationDB
from .tcp import LookupProtocol, format_address

__all__ = ["NSQLookupd"]

log = logging.getLogger("nsqx.lookupd")

HTTP_SHUTDOWN_TIMEOUT = 5.0




class NSQLookupd:
    def __init__(self, opts: Options | None = None, *,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.opts = opts or Options()
        self.db = RegistrationDB(clock=clock)
        self.version = NSQ_VERSION
        self.hostname = socket.gethostname()
        self.connections: set[LookupProtocol] = set()
        self.tcp_port = 0
        self.http_port = 0
        self.tcp_address = ""
        self.http_address = ""
        self._tcp_server: asyncio.AbstractServer | None = None
        self._runner: web.AppRunner | None = None
        self._started = False
        self._stopped = False
        # Extensions attached by the entry point (cluster mode's coordinator): objects with
        # async start()/stop(), and (method, path, handler) routes added over the defaults.
        self.plugins: list[Any] = []
        self.http_routes: list[tuple[str, str, Callable[..., Any]]] = []

    async def start(self) -> None:
        """Bind and serve; raises OSError (``listen (addr) failed - ...``) if a bind fails."""
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        o = self.opts
        tcp_sock = http_sock = None
        try:
            try:
                tcp_sock = bind_listener(o.tcp_address)
            except OSError as e:
                raise OSError(f"listen ({o.tcp_address}) failed - {e}") from e
            try:
                http_sock = bind_listener(o.http_address)
            except OSError as e:
                raise OSError(f"listen ({o.http_address}) failed - {e}") from e
            self.tcp_address = format_address(tcp_sock.getsockname())
            self.tcp_port = tcp_sock.getsockname()[1]
            self.http_address = format_address(http_sock.getsockname())
            self.http_port = http_sock.getsockname()[1]

            self._tcp_server = await loop.create_server(lambda: LookupProtocol(self),
                                                        sock=tcp_sock)
            tcp_sock = None
            log.info("TCP: listening on %s", self.tcp_address)

            runner = make_runner(make_app(self), logging.getLogger("nsqx.lookupd.http"),
                                 shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT)
            await runner.setup()
            self._runner = runner
            await web.SockSite(runner, http_sock).start()
            http_sock = None
            log.info("HTTP: listening on %s", self.http_address)
        finally:
            for s in (tcp_sock, http_sock):
                if s is not None:
                    s.close()
        for plugin in self.plugins:
            await plugin.start()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for plugin in reversed(self.plugins):
            try:
                await plugin.stop()
            except Exception as exc:  # keep shutting down
                log.error("stopping %r failed: %s", plugin, exc)
        if self._tcp_server is not None:
            self._tcp_server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self.connections:
            await asyncio.sleep(0)  # let connection_lost run
        if self._tcp_server is not None:
            log.info("TCP: closing %s", self.tcp_address)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp_server.wait_closed(), 5.0)
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
            log.info("HTTP: closing %s", self.http_address)

    async def __aenter__(self) -> NSQLookupd:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
