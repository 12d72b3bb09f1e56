"""A starting node answers no PUB before its HTTP API is up (issue 21): a keyed producer
refreshes its route over HTTP, so TCP that answers while HTTP is down turns a restart into
failed publishes. The node binds TCP first (its port is in /info) but serves it only once HTTP
listens; here HTTP's start is held back and a PUB sent meanwhile must wait for it."""

from __future__ import annotations

import asyncio
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


@pytest.mark.parametrize("loop_factory", ["asyncio", "uvloop"])
def test_tcp_answers_only_once_http_listens(tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
                                            loop_factory: str) -> None:
    release = asyncio.Event()
    setup = web.AppRunner.setup

    async def held_setup(self: web.AppRunner) -> None:
        await release.wait()
        await setup(self)

    monkeypatch.setattr(web.AppRunner, "setup", held_setup)

    async def main() -> None:
        nsqd = NSQD(parse_args(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                f"--data-path={tmp_path}"]))
        starting = asyncio.create_task(nsqd.start())
        writer = None
        try:
            for _ in range(500):
                if nsqd.tcp_port or starting.done():
                    break
                await asyncio.sleep(0.01)
            assert nsqd.tcp_port, "TCP was never bound"
            # HTTP is held: a PUB now is refused (the socket does not listen yet) or waits
            # unanswered in the backlog; it is never answered while HTTP is down
            early = None
            try:
                reader, writer = await _pub(nsqd.tcp_port)
                early = asyncio.ensure_future(reader.readexactly(4))
                done, _ = await asyncio.wait({early}, timeout=0.5)
                assert not done, "the node answered a PUB while its HTTP API was down"
            except ConnectionRefusedError:
                pass
            assert nsqd.http_port == 0
            release.set()
            await starting
            assert nsqd.http_port
            if early is None:
                reader, writer = await _pub(nsqd.tcp_port)
                early = asyncio.ensure_future(reader.readexactly(4))
            size = struct.unpack(">I", await asyncio.wait_for(early, 10))[0]
            frame = await asyncio.wait_for(reader.readexactly(size), 10)
            assert frame == struct.pack(">I", 0) + b"OK"
        finally:
            if writer is not None:
                writer.close()
            release.set()
            await asyncio.gather(starting, return_exceptions=True)
            await nsqd.stop()

    factory = uvloop.new_event_loop if loop_factory == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
