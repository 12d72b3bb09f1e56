"""The replication stream's framing (nsqx.cluster.stream) against an aiohttp server: fetches
of several partitions on one connection answered out of order, large answers whole, a
refused handshake, a leader without the stream, a malformed frame, a reconnect; the same
over the members' mutual TLS."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import orjson
import pytest
import uvloop
from aiohttp import web

from nsqx.cluster import stream
from nsqx.cluster.stream import FETCH, PATH, StreamConnection, StreamRefused
from nsqx.cluster.trust import tls_contexts
from tests.support.certs import _sign, make_tls_files


async def start(app: web.Application, tls: ssl.SSLContext | None = None
                ) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
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


def _member_tls(d: Path) -> tuple[ssl.SSLContext, ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts of a member certificate (--cluster-tls-*), and the client
    context of a certificate from another CA."""
    make_tls_files(d / "other")
    make_tls_files(d)
    ext = ("basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"
           "subjectAltName=IP:127.0.0.1\n")
    cert, key = _sign("member", "member", ext, 4, d)
    server, client = tls_contexts(str(cert), str(key), str(d / "ca.pem"))
    _, stranger = tls_contexts(str(d / "other" / "client.pem"), str(d / "other" / "client.key"),
                               str(d / "ca.pem"))
    return server, client, stranger


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_stream_over_mutual_tls(loop: str, tmp_path: Path) -> None:
    """Under TLS an answer goes out as one writelines (head and frames): answers of any size
    arrive whole and matched, on both event loops; a peer without a member certificate, or
    speaking plain TCP, never gets a fetch served."""
    server_ctx, client_ctx, stranger = _member_tls(tmp_path / "tls")
    seen: list[tuple] = []  # type: ignore[type-arg]
    active: set = set()  # type: ignore[type-arg]

    async def fetch(topic: str, p: int, epoch: int, offset: int, max_bytes: int, wait: float
                    ) -> tuple[int, bytes, bytes]:
        seen.append((topic, p, offset))
        if topic == "slow":
            await asyncio.sleep(0.3)
        return 200, orjson.dumps({"start": offset}), _pattern(offset, max_bytes)

    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream.serve(request, fetch, active)

    async def main() -> None:
        app = web.Application()
        app.router.add_get(PATH, handler)
        runner, addr = await start(app, server_ctx)
        conn = StreamConnection(addr, "good", ssl=client_ctx)
        try:
            slow = asyncio.ensure_future(conn.fetch("slow", 1, 7, 5, 70_000, 0, 10))
            sizes = (0, 1, 3 << 20, 16_384, 40_000)
            got = await asyncio.gather(*(conn.fetch("t", 0, 7, 100 + i, n, 0, 10)
                                         for i, n in enumerate(sizes)))
            for i, ((status, head, frames), n) in enumerate(zip(got, sizes, strict=True)):
                assert status == 200 and orjson.loads(head) == {"start": 100 + i}
                assert bytes(frames) == _pattern(100 + i, n)
            status, head, frames = await slow
            assert orjson.loads(head) == {"start": 5} and bytes(frames) == _pattern(5, 70_000)
            assert len(active) == 1
            served = len(seen)
            for who in (StreamConnection(addr, "good", ssl=stranger),  # another CA
                        StreamConnection(addr, "good", ssl=ssl.create_default_context(
                            cafile=str(tmp_path / "tls" / "ca.pem"))),  # no certificate
                        StreamConnection(addr, "good")):  # plain TCP
                with pytest.raises(OSError) as e:
                    await who.fetch("t", 0, 7, 0, 1, 0, 10)
                assert not isinstance(e.value, TimeoutError)
                who.close()
            assert len(seen) == served and len(active) == 1
        finally:
            conn.close()
            await runner.cleanup()

    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


def _pattern(offset: int, n: int) -> bytes:
    """n bytes that differ with the offset (a misplaced or reordered chunk shows)."""
    unit = bytes((offset + i) % 251 for i in range(251))
    return (unit * (n // 251 + 1))[:n]
