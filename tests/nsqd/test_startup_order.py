"""A starting node answers no PUB while its HTTP API is down (issue 21): a keyed producer
refreshes its route over HTTP, so TCP that answers while HTTP refuses turns a restart into
failed publishes. The node opens its HTTP listener before TCP serves; aiohttp and the rest of
the API load after that (issue 24: it is most of a start), and a request for them waits until
they are there instead of being refused, while /ping and /pub are answered at once."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import pytest
import uvloop
from aiohttp import web

from nsqx.nsqd.node import NSQD
from nsqx.nsqd.options import parse_args


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
            assert order == ["HTTP", "TCP"], order
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
