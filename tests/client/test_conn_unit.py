"""Connection against a scripted fake nsqd: response ordering, heartbeats, error routing."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

from nsqx.client import ConnConfig, Connection, ConnectionClosedError, NSQError
from nsqx.client.lookup import lookup_url, producers_from_response
from nsqx.protocol import v2
from nsqx.protocol.frames import HEARTBEAT, encode_error, encode_response
from tests.client.helpers import run

IDENTIFY_RESP = json.dumps({"max_rdy_count": 123, "version": "1.3.0", "max_msg_timeout": 900000,
                            "msg_timeout": 60000, "tls_v1": False, "deflate": False,
                            "snappy": False, "auth_required": False}).encode()


async def read_command(reader: asyncio.StreamReader) -> tuple[bytes, bytes | None]:
    line = await reader.readline()
    name = line.split(b" ")[0].strip()
    if name in (b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"):
        (size,) = struct.unpack(">I", await reader.readexactly(4))
        return line, await reader.readexactly(size)
    return line, None


async def trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write byte by byte: the client must reassemble frames split anywhere."""
    for i in range(len(data)):
        writer.write(data[i : i + 1])
        await writer.drain()
        if i % 7 == 0:
            await asyncio.sleep(0)


class FakeNsqd:
    def __init__(self, script) -> None:  # type: ignore[no-untyped-def]
        self.script = script
        self.received: list[tuple[bytes, bytes | None]] = []
        self.server: asyncio.Server | None = None
        self.done = asyncio.Event()
        self.error: BaseException | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            assert await reader.readexactly(4) == v2.MAGIC_V2
            await self.script(self, reader, writer)
        except BaseException as e:  # surfaced by the test
            self.error = e
        finally:
            writer.close()
            self.done.set()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def test_responses_matched_in_order_and_heartbeats_answered() -> None:
    async def script(fake: FakeNsqd, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        line, body = await read_command(reader)
        assert line == b"IDENTIFY\n"
        ident = json.loads(body)  # type: ignore[arg-type]
        assert ident["feature_negotiation"] is True and ident["heartbeat_interval"] == 30000
        # a heartbeat before the IDENTIFY answer is answered and skipped
        writer.write(encode_response(HEARTBEAT))
        assert await read_command(reader) == (b"NOP\n", None)
        writer.write(encode_response(IDENTIFY_RESP))
        for _ in range(4):
            fake.received.append(await read_command(reader))
        await trickle(writer, b"".join([
            encode_response(b"OK"),
            encode_response(HEARTBEAT),
            encode_error("E_FIN_FAILED", "FIN 0123456789abcdef failed ID not in flight"),
            encode_response(b"SECOND"),
        ]))
        assert await read_command(reader) == (b"NOP\n", None)
        writer.write(encode_error("E_BAD_MESSAGE", "PUB message too big 9 > 8"))
        await writer.drain()
        # fatal: nsqd closes; the 4th command never gets its answer

    async def main() -> None:
        fake = FakeNsqd(script)
        addr = await fake.start()
        errors: list[NSQError] = []
        closed: list[BaseException | None] = []
        conn = Connection(addr, ConnConfig(), on_error=lambda c, e: errors.append(e),
                          on_close=lambda c, e: closed.append(e))
        resp = await conn.connect()
        assert resp["max_rdy_count"] == 123 and conn.max_rdy_count == 123
        futs = [conn.command(v2.pub("t", b"%d" % i)) for i in range(4)]
        assert conn.pending == 4
        assert await futs[0] == b"OK"
        assert await futs[1] == b"SECOND"  # the non-fatal error did not take its place
        with pytest.raises(NSQError) as ei:
            await futs[2]
        assert ei.value.code == "E_BAD_MESSAGE" and ei.value.text == "PUB message too big 9 > 8"
        with pytest.raises(ConnectionClosedError):
            await futs[3]
        await conn.wait_closed()
        assert [e.code for e in errors] == ["E_FIN_FAILED"]
        assert len(closed) == 1 and not conn.is_open
        with pytest.raises(ConnectionClosedError):
            conn.send(v2.nop())
        await fake.done.wait()
        assert fake.error is None, fake.error
        assert [b for _, b in fake.received] == [b"0", b"1", b"2", b"3"]
        await fake.close()

    run(main(), 20)


def test_server_without_feature_negotiation_and_messages() -> None:
    async def script(fake: FakeNsqd, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        await read_command(reader)
        writer.write(encode_response(b"OK"))  # an old server: no JSON
        fake.received.append(await read_command(reader))  # SUB
        writer.write(encode_response(b"OK"))
        frame = struct.pack(">iiqH16s", 30 + 3, 2, 1234, 7, b"0001000000000005") + b"abc"
        writer.write(frame)
        fake.received.append(await read_command(reader))  # FIN
        await writer.drain()

    async def main() -> None:
        from nsqx.client import Message
        fake = FakeNsqd(script)
        addr = await fake.start()
        got: list[Message] = []
        conn = Connection(addr, on_message=lambda c, m: got.append(m),
                          make_message=lambda c, ts, a, i, b: Message(i, b, ts, a, c))
        resp = await conn.connect()
        assert resp == {} and conn.max_rdy_count == 2500
        assert await conn.command(v2.sub("t", "c")) == b"OK"
        while not got:
            await asyncio.sleep(0.01)
        m = got[0]
        assert (m.body, m.timestamp, m.attempts, m.id) == (b"abc", 1234, 7, b"0001000000000005")
        assert (m.partition, m.offset) == (1, 5)
        conn.send(v2.fin(m.id))
        await fake.done.wait()
        assert fake.received[1] == (b"FIN 0001000000000005\n", None)
        conn.close()
        await conn.wait_closed()
        await fake.close()

    run(main(), 20)


def test_read_timeout_drops_a_silent_connection() -> None:
    async def script(fake: FakeNsqd, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        await read_command(reader)
        writer.write(encode_response(IDENTIFY_RESP))
        await asyncio.sleep(5)  # never a heartbeat

    async def main() -> None:
        fake = FakeNsqd(script)
        addr = await fake.start()
        conn = Connection(addr, ConnConfig(read_timeout=0.3))
        await conn.connect()
        fut = conn.command(v2.pub("t", b"x"))
        with pytest.raises(ConnectionClosedError) as ei:
            await fut
        assert ei.value.code == "E_TIMEOUT"
        await fake.close()

    run(main(), 20)


def test_lookup_helpers() -> None:
    assert lookup_url("127.0.0.1:4161", "t") == "http://127.0.0.1:4161/lookup?topic=t"
    assert lookup_url("https://h/proxy/lookup?auth=x&topic=old", "a b") == (
        "https://h/proxy/lookup?auth=x&topic=a+b")
    assert producers_from_response(
        {"channels": [], "producers": [{"broadcast_address": "h1", "tcp_port": 1},
                                       {"address": "h2", "tcp_port": 2},
                                       {"broadcast_address": "::1", "tcp_port": 3}]}
    ) == ["h1:1", "h2:2", "[::1]:3"]
    assert producers_from_response(
        {"status_code": 200, "data": {"producers": [{"broadcast_address": "h", "tcp_port": 4}]}}
    ) == ["h:4"]
