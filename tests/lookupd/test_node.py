"""NSQLookupd in-process: start/stop with real bound ports, several nodes in one process,
listener address forms."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from nsqx.lookupd import NSQLookupd, Options
from nsqx.lookupd.registry import CLIENT, TOPIC
from nsqx.netutil import bind_listener
from nsqx.protocol import lookup_v1 as lk


def opts(**kw) -> Options:
    return Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0",
                   broadcast_address="bcast", **kw)


async def _roundtrip(ld: NSQLookupd) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", ld.tcp_port)
    rr = lk.ResponseReader()

    async def read() -> bytes:
        while True:
            got = rr.feed(await reader.read(4096))
            if got:
                assert len(got) == 1
                return got[0]

    writer.write(lk.MAGIC_V1 + lk.identify({"version": "1.3.0", "tcp_port": 1, "http_port": 2,
                                            "broadcast_address": "a"}))
    resp = json.loads(await read())
    assert resp == {"broadcast_address": "bcast", "hostname": socket.gethostname(),
                    "http_port": ld.http_port, "tcp_port": ld.tcp_port, "version": "1.3.0"}
    writer.write(lk.register("t", "c"))
    assert await read() == b"OK"
    assert [r.key for r in ld.db.find_registrations(TOPIC, "*", "")] == ["t"]
    assert len(ld.db.find_producers(CLIENT, "", "")) == 1
    writer.close()
    await writer.wait_closed()
    for _ in range(100):
        if not ld.db.find_producers(CLIENT, "", ""):
            break
        await asyncio.sleep(0.01)
    assert ld.db.find_producers(CLIENT, "", "") == []


def test_two_nodes_in_one_process():
    async def main() -> None:
        async with NSQLookupd(opts()) as a, NSQLookupd(opts()) as b:
            assert a.tcp_port and a.http_port and b.tcp_port and b.http_port
            assert len({a.tcp_port, a.http_port, b.tcp_port, b.http_port}) == 4
            assert a.tcp_address == f"127.0.0.1:{a.tcp_port}"
            await _roundtrip(a)
            await _roundtrip(b)
            # a connected peer is dropped by stop()
            _, w = await asyncio.open_connection("127.0.0.1", a.tcp_port)
            w.write(b"  V1")
            await asyncio.sleep(0.05)
            assert len(a.connections) == 1
        assert a.connections == set()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", a.tcp_port), timeout=1)

    asyncio.run(main())


def test_bind_failure_is_reported_and_cleaned_up():
    async def main() -> None:
        async with NSQLookupd(opts()) as a:
            bad = NSQLookupd(Options(tcp_address="127.0.0.1:0",
                                     http_address=f"127.0.0.1:{a.http_port}"))
            with pytest.raises(OSError, match=rf"listen \(127.0.0.1:{a.http_port}\) failed"):
                await bad.start()
            await bad.stop()

    asyncio.run(main())


@pytest.mark.parametrize("address", ["127.0.0.1:0", "localhost:0", ":0", "0.0.0.0:0"])
def test_bind_listener_forms(address):
    s = bind_listener(address)
    try:
        assert s.getsockname()[1] != 0
    finally:
        s.close()


def test_bind_listener_ipv6():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        s = bind_listener("[::1]:0")
    except OSError:
        pytest.skip("no IPv6 loopback")
    try:
        assert s.family == socket.AF_INET6
    finally:
        s.close()


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:x", "127.0.0.1:70000"])
def test_bind_listener_errors(address):
    with pytest.raises(OSError):
        bind_listener(address)
