"""The follower's fetch connection: keep-alive GETs to an aiohttp server, answers of any
status with their bodies, a new connection after a close, an error or a timeout."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from nsqx.cluster.fetchconn import FetchConnection


async def serve(handler) -> tuple[web.AppRunner, str]:  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_get("/f", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


def test_keep_alive_statuses_bodies_and_reconnects() -> None:
    peers: list[object] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        q = request.query
        if q.get("sleep"):
            await asyncio.sleep(float(q["sleep"]))
        if q.get("status"):
            return web.Response(status=int(q["status"]), body=b"no")
        if q.get("close"):
            return web.Response(body=b"bye", headers={"Connection": "close"})
        n = int(q.get("n", "0"))
        resp = web.StreamResponse()
        resp.content_length = n + 2
        await resp.prepare(request)
        await resp.write(b"h\n")
        if n:
            await resp.write(b"x" * n)
        await resp.write_eof()
        return resp

    async def main() -> None:
        runner, addr = await serve(handler)
        conn = FetchConnection(addr)
        try:
            for n in (0, 10, 3 << 20, 5):  # one connection for all, a large body included
                assert await conn.get("/f", {"n": str(n)}, 5) == (200, b"h\n" + b"x" * n)
            assert len(set(peers)) == 1
            assert await conn.get("/f", {"status": "409"}, 5) == (409, b"no")
            assert await conn.get("/f", {"close": "1"}, 5) == (200, b"bye")
            assert await conn.get("/f", {"n": "1"}, 5) == (200, b"h\nx")
            assert len(set(peers)) == 2  # the server closed: a new connection
            with pytest.raises(TimeoutError):
                await conn.get("/f", {"sleep": "1"}, 0.1)
            assert await conn.get("/f", {"n": "2"}, 5) == (200, b"h\nxx")
            assert len(set(peers)) == 3  # never reused after a timeout
        finally:
            conn.close()
            await runner.cleanup()
        with pytest.raises(OSError):
            await FetchConnection(addr).get("/f", {}, 5)  # nobody listens any more

    asyncio.run(main())
