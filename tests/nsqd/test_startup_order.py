"""A starting node binds every listener before any answers (issue 28, as Go's nsqd.New): a
client that waits for /ping and then connects to TCP or HTTPS is never refused, and a keyed
producer refreshing its route over HTTP is never refused while TCP takes PUBs (issue 21).
aiohttp and the rest of the API load after that (issue 24: it is most of a start), and a
request for them waits until they are there instead of being refused, while /ping and /pub
are answered at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from pathlib import Path

import pytest
import uvloop
from aiohttp import web

from nsqx.nsqd.node import NSQD
from nsqx.nsqd.options import parse_args
from tests.support.certs import TLSFiles


async def _pub(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"  V2PUB t\n" + struct.pack(">I", 2) + b"hi")
    await writer.drain()
    return reader, writer


async def _get(port: int, path: str) -> tuple[asyncio.Future[bytes], asyncio.StreamWriter]:
    """Send GET ``path``; the future is the whole answer (the server closes after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                 .encode())
    await writer.drain()
    return asyncio.ensure_future(reader.read()), writer


@pytest.mark.parametrize("loop_factory", ["asyncio", "uvloop"])
def test_http_listens_before_tcp_answers(tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
                                         caplog, loop_factory: str) -> None:
    release = asyncio.Event()
    setup = web.AppRunner.setup

    async def held_setup(self: web.AppRunner) -> None:
        await release.wait()
        await setup(self)

    monkeypatch.setattr(web.AppRunner, "setup", held_setup)
    caplog.set_level(logging.INFO, logger="nsqx.nsqd")

    async def main() -> None:
        nsqd = NSQD(parse_args(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                f"--data-path={tmp_path}"]))
        writers: list[asyncio.StreamWriter] = []
        try:
            await nsqd.start()  # does not wait for aiohttp
            order = [r.getMessage().split(":")[0] for r in caplog.records
                     if "listening on" in r.getMessage()]
            assert order == ["TCP", "HTTP"], order
            # aiohttp is held: a request for it is accepted and waits, never refused
            stats, w = await _get(nsqd.http_port, "/stats?format=json")
            writers.append(w)
            ping, w = await _get(nsqd.http_port, "/ping")
            writers.append(w)
            answer = await asyncio.wait_for(ping, 10)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nOK")
            reader, w = await _pub(nsqd.tcp_port)
            writers.append(w)
            size = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 10))[0]
            assert await asyncio.wait_for(reader.readexactly(size), 10) == \
                struct.pack(">I", 0) + b"OK"
            done, _ = await asyncio.wait({stats}, timeout=0.3)
            assert not done, "a request for aiohttp was answered before aiohttp was there"
            release.set()
            answer = await asyncio.wait_for(stats, 10)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"topic_name":"t"' in answer
        finally:
            for w in writers:
                w.close()
            release.set()
            await nsqd.stop()

    factory = uvloop.new_event_loop if loop_factory == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def _hold_aiohttp(monkeypatch) -> asyncio.Event:  # type: ignore[no-untyped-def]
    """aiohttp's runner setup waits for the returned event (a slow load, made certain)."""
    release = asyncio.Event()
    setup = web.AppRunner.setup

    async def held_setup(self: web.AppRunner) -> None:
        await release.wait()
        await setup(self)

    monkeypatch.setattr(web.AppRunner, "setup", held_setup)
    return release


def test_every_listener_bound_before_ping_answers(tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
                                                  tls_files: TLSFiles) -> None:
    """With HTTPS on, /ping answered while TCP was not yet listening (issue 28 defect 1):
    a client that connects to TCP right after /ping was refused."""
    async def main() -> None:
        release = _hold_aiohttp(monkeypatch)
        nsqd = NSQD(parse_args(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                "--https-address=127.0.0.1:0", f"--data-path={tmp_path}",
                                f"--tls-cert={tls_files.server_cert}",
                                f"--tls-key={tls_files.server_key}"]))
        starting = asyncio.ensure_future(nsqd.start())
        writers: list[asyncio.StreamWriter] = []
        try:
            while True:  # poll /ping as an init script does
                await asyncio.sleep(0.005)
                assert not starting.done() or starting.exception() is None
                if not nsqd.http_port:
                    continue
                try:
                    ping, w = await _get(nsqd.http_port, "/ping")
                except ConnectionError:
                    continue
                writers.append(w)
                if (await asyncio.wait_for(ping, 10)).endswith(b"\r\n\r\nOK"):
                    break
            reader, w = await _pub(nsqd.tcp_port)  # refused before the fix
            writers.append(w)
            size = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 10))[0]
            assert await asyncio.wait_for(reader.readexactly(size), 10) == \
                struct.pack(">I", 0) + b"OK"
            # HTTPS accepts now too; it answers once aiohttp is there
            ctx = ssl.create_default_context(cafile=str(tls_files.ca_cert))
            connecting = asyncio.ensure_future(asyncio.open_connection(
                "127.0.0.1", nsqd.https_port, ssl=ctx, server_hostname="127.0.0.1"))
            await asyncio.sleep(0.1)
            assert not connecting.done(), connecting  # accepted, waits for its handshake
            release.set()
            await asyncio.wait_for(starting, 30)
            reader, w = await asyncio.wait_for(connecting, 30)
            writers.append(w)
            w.write(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 30)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"OK")
        finally:
            for w in writers:
                w.close()
            release.set()
            with contextlib.suppress(BaseException):
                await starting
            await nsqd.stop()

    asyncio.run(main())
