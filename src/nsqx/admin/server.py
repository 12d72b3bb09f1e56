"""One nsqadmin: the HTTP server, the cluster client, the stats sampler and the
notification sender, started and stopped together (upstream ``nsqadmin/nsqadmin.go``)."""

from __future__ import annotations

import contextlib
import logging

from aiohttp import web

from nsqx.httpapi import make_runner
from nsqx.netutil import bind_listener

from .cluster import ClusterClient
from .http import AdminHTTP
from .notify import Notifier
from .options import Options
from .sampler import Sampler

__all__ = ["NSQAdmin"]

log = logging.getLogger("nsqx.admin")




def _format(addr: tuple) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class NSQAdmin:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.cluster = ClusterClient(opts)
        self.sampler = Sampler(self.cluster, opts.stats_sample_interval, opts.stats_sample_window)
        self.notifier = Notifier(opts.notification_http_endpoint,
                                 opts.http_client_connect_timeout,
                                 opts.http_client_request_timeout)
        self.http = AdminHTTP(opts, self.cluster, self.sampler, self.notifier)
        self.http_address = ""
        self.http_port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        try:
            sock = bind_listener(self.opts.http_address)
        except OSError as e:
            raise OSError(f"listen ({self.opts.http_address}) failed - {e}") from e
        try:
            self.http_address = _format(sock.getsockname())
            self.http_port = sock.getsockname()[1]
            await self.cluster.start()
            runner = make_runner(self.http.make_app(), logging.getLogger("nsqx.admin.http"),
                                 shutdown_timeout=3.0)
            await runner.setup()
            self._runner = runner
            await web.SockSite(runner, sock).start()
            sock = None
        finally:
            if sock is not None:
                sock.close()
        log.info("HTTP: listening on %s", self.http_address)
        self.sampler.start()
        self.notifier.start()

    async def stop(self) -> None:
        if self._runner is not None:
            log.info("HTTP: closing %s", self.http_address)
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
            self._runner = None
        await self.sampler.close()
        await self.notifier.close()
        await self.cluster.close()

    async def __aenter__(self) -> NSQAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
