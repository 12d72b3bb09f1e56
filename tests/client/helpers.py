"""Helpers for client tests: run a coroutine with a deadline, free ports, nsqd on fixed ports."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.certs import TLSFiles
from tests.support.nsqd_process import NsqdFactory, NsqdProcess


def run(coro: Awaitable[Any], timeout: float = 60.0) -> Any:
    """asyncio.run with a deadline (no pytest-asyncio needed)."""

    async def main() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(main())


async def wait_for(pred: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(step)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fixed(factory: NsqdFactory, args: list[str] | None = None) -> NsqdProcess:
    """An nsqd on ports chosen now, so a restart comes back on the same address."""
    tcp, http = free_port(), free_port()
    return factory.start([f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
                          *(args or [])])


def client_tls(tls: TLSFiles) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls.ca_cert))
    return ctx


