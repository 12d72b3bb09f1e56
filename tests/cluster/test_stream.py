"""The replication stream's framing (nsqx.cluster.stream) against an aiohttp server: fetches
of several partitions on one connection answered out of order, large answers whole, a
refused handshake, a leader without the stream, a malformed frame, a reconnect."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest
from aiohttp import web

from nsqx.cluster import stream
from nsqx.cluster.stream import FETCH, PATH, StreamConnection, StreamRefused


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


def stream_app(seen: list[tuple], active: set) -> web.Application:  # type: ignore[type-arg]
    async def fetch(topic: str, p: int, epoch: int, offset: int, max_bytes: int, wait: float
                    ) -> tuple[int, bytes, bytes]:
        seen.append((topic, p, epoch, offset, max_bytes, wait))
        if topic == "slow":
            await asyncio.sleep(0.3)
        if topic == "stale":
            return 409, b'{"message":"E_STALE_EPOCH"}', b""
        return 200, orjson.dumps({"start": offset, "p": p}), b"x" * max_bytes

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("node") != "good":
            return web.json_response({"message": "E_NODE_MISMATCH"}, status=403)
        return await stream.serve(request, fetch, active)

    app = web.Application()
    app.router.add_get(PATH, handler)
    return app


def test_fetches_multiplexed_answered_out_of_order_and_refusals() -> None:
    seen: list[tuple] = []  # type: ignore[type-arg]
    active: set = set()  # type: ignore[type-arg]

    async def main() -> None:
        runner, addr = await start(stream_app(seen, active))
        conn = StreamConnection(addr, "good")
        try:
            slow = asyncio.ensure_future(conn.fetch("slow", 1, 7, 10, 5, 500, 5))
            fast = [await conn.fetch("t", p, 7, 100 + p, n, 0, 5)
                    for p, n in ((0, 0), (2, 3 << 20), (3, 1))]
            assert not slow.done()  # answered after the later fetches: matched by id
            for (status, head, frames), (p, n) in zip(fast, ((0, 0), (2, 3 << 20), (3, 1)),
                                                     strict=True):
                assert status == 200 and orjson.loads(head) == {"start": 100 + p, "p": p}
                assert bytes(frames) == b"x" * n
            status, head, frames = await slow
            assert (status, orjson.loads(head), bytes(frames)) == (200, {"start": 10, "p": 1},
                                                                   b"xxxxx")
            status, head, _ = await conn.fetch("stale", 0, 1, 0, 1, 0, 5)
            assert status == 409 and b"E_STALE_EPOCH" in bytes(head)
            assert ("slow", 1, 7, 10, 5, 0.5) in seen
            assert len(active) == 1  # one stream for all of it
            # the leader ends the stream: the next fetch opens a new one
            for done in list(active):
                done.set_result(None)
            with pytest.raises(ConnectionError):
                await conn.fetch("t", 0, 7, 0, 1, 0, 5)
            assert (await conn.fetch("t", 0, 7, 0, 1, 0, 5))[0] == 200
            # refused handshakes: the leader's answer, or no stream at all (an older member)
            with pytest.raises(StreamRefused) as e:
                await StreamConnection(addr, "other").fetch("t", 0, 7, 0, 1, 0, 5)
            assert e.value.status == 403 and b"E_NODE_MISMATCH" in e.value.body
            runner2, addr2 = await start(web.Application())
            try:
                with pytest.raises(StreamRefused) as e:
                    await StreamConnection(addr2, "good").fetch("t", 0, 7, 0, 1, 0, 5)
                assert e.value.status == 404
            finally:
                await runner2.cleanup()
        finally:
            conn.close()
            await runner.cleanup()

    asyncio.run(main())


def test_malformed_frame_ends_the_stream_and_a_timeout_closes_it() -> None:
    seen: list[tuple] = []  # type: ignore[type-arg]
    active: set = set()  # type: ignore[type-arg]

    async def main() -> None:
        runner, addr = await start(stream_app(seen, active))
        host, port = addr.split(":")
        try:
            def raw(frames: bytes) -> bytes:
                with socket.create_connection((host, int(port)), timeout=5) as s:
                    s.sendall(f"GET {PATH}?node=good HTTP/1.1\r\nHost: x\r\nConnection: "
                              f"Upgrade\r\nUpgrade: tcp\r\n\r\n".encode())
                    out = s.recv(65536)  # the 101 first, as the follower waits for it
                    s.sendall(frames)
                    while chunk := s.recv(65536):
                        out += chunk
                    return out

            # a length no FETCH frame has: the leader closes at once, having served nothing
            out = await asyncio.to_thread(raw, b"\xff\xff\xff\xff" + b"\0" * 40)
            assert out.startswith(b"HTTP/1.1 101") and seen == []
            # a frame whose topic is not UTF-8: the same
            bad = FETCH.pack(FETCH.size - 4 + 2, 1, 0, 1, 0, 1, 0) + b"\xff\xfe"
            out = await asyncio.to_thread(raw, bad)
            assert out.startswith(b"HTTP/1.1 101") and seen == []
            conn = StreamConnection(addr, "good")
            with pytest.raises(TimeoutError):
                await conn.fetch("slow", 0, 1, 0, 1, 0, 0.05)
            assert (await conn.fetch("t", 0, 1, 0, 1, 0, 5))[0] == 200
            conn.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())
