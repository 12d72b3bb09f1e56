"""The lone-FIN fast path (``ClientV2._lone_fin`` -> ``Channel.pump_now`` ->
``ChannelCursor.take_one`` / ``read_one``) against its general twin (parser -> ``_cmd_fin``
-> ``Channel.wake`` -> ``_pump`` -> ``take`` -> ``_send``).

The same random command sequences (FIN in and out of order, bad FINs, REQ with and without
a delay, TOUCH, RDY changes, two commands in one read, several clients per channel) run on
an in-process node with the fast path on and with it off; every client must receive the
same messages (id, attempts, body) and answers, and the cursors must end in the same state.
Clients are fake transports, so nothing depends on timing (the message timeout is long).
"""

from __future__ import annotations

import asyncio
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from nsqx.nsqd.client_v2 import ClientV2
from nsqx.protocol import v2
from tests.nsqd.inprocess import running_node


class FakeTransport:
    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.out.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        for c in chunks:
            self.out.append(bytes(c))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if key == "peername" else default

    def set_write_buffer_limits(self, **kw: Any) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closing = True


def frames_of(data: bytes) -> list[tuple]:
    """(id, attempts, body) per message frame, the frame itself for anything else."""
    out: list[tuple] = []
    pos = 0
    while pos < len(data):
        size, ftype = struct.unpack_from(">II", data, pos)
        body = data[pos + 8:pos + 4 + size]
        if ftype == 2:
            out.append((body[10:26], int.from_bytes(body[8:10], "big"), body[26:]))
        else:
            out.append((ftype, body))
        pos += 4 + size
    return out


async def run_scenario(tmp: Path, seed: int, fast: bool, ordered: bool) -> tuple[list, list]:
    rnd = random.Random(seed)
    async with running_node(tmp, "--msg-timeout=600s", "--log-level=warn") as nsqd:
        parts = 3
        nsqd.ensure_partitions("t", parts, ordered=ordered)
        for p, topic in enumerate(nsqd.topics["t"].partitions):
            await topic.publish([b"m%d-%d" % (p, i) for i in range(40)])
        clients: list[tuple[ClientV2, FakeTransport, list[bytes]]] = []
        for k in range(5):
            c = ClientV2(nsqd)
            if not fast:
                c._lone_fin = lambda data: False  # type: ignore[method-assign]
            tr = FakeTransport()
            c.connection_made(tr)
            p = k % parts
            sub = v2.sub_ordered("t", "c", p) if ordered else b"SUB t c %d\n" % p
            c.data_received(v2.MAGIC_V2 + sub + v2.rdy(rnd.choice([1, 1, 2, 5])))
            clients.append((c, tr, []))
        seen: list[list] = [[] for _ in clients]

        async def settle() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            for i, (_c, tr, held) in enumerate(clients):
                got = frames_of(b"".join(tr.out))
                tr.out.clear()
                seen[i].extend(got)
                held.extend(f[0] for f in got if len(f) == 3)

        await settle()
        for _step in range(300):
            i = rnd.randrange(len(clients))
            c, _tr, held = clients[i]
            op = rnd.random()
            if held and op < 0.6:
                mid = held.pop(0 if rnd.random() < 0.9 else rnd.randrange(len(held)))
                c.data_received(b"FIN " + mid + b"\n")
            elif held and op < 0.66:
                ids = [held.pop(0) for _ in range(min(2, len(held)))]
                c.data_received(b"".join(b"FIN " + m + b"\n" for m in ids))
            elif op < 0.7:
                c.data_received(b"FIN %016x\n" % rnd.randrange(1 << 20))  # not in flight
            elif held and op < 0.78:
                c.data_received(b"REQ " + held.pop(0) + b" 0\n")
            elif held and op < 0.8 and rnd.random() < 0.15:
                c.data_received(b"REQ " + held.pop(0) + b" 60000\n")  # deferred past the run
            elif held and op < 0.85:
                c.data_received(b"TOUCH " + held[0] + b"\n")
            elif op < 0.9:
                c.data_received(v2.rdy(rnd.choice([0, 1, 1, 3])))
            elif held:
                mid = held.pop(0)  # FIN followed by a NOP in the same read: general path
                c.data_received(b"FIN " + mid + b"\nNOP\n")
            await settle()
        state = []
        for topic in nsqd.topics["t"].partitions:
            cur = topic.channels["c"].cursor
            state.append((cur.confirmed, cur.next_read, cur.in_flight_count, cur.delivered_count,
                          cur.finish_count, cur.requeue_count, cur.deferred_count,
                          cur.finished_ranges()))
        for c, tr, _held in clients:
            tr.closing = True
            c.connection_lost(None)
        return seen, state


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_fast_and_general_paths_agree(tmp_path: Path, seed: int, ordered: bool) -> None:
    fast = asyncio.run(run_scenario(tmp_path / "fast", seed, True, ordered))
    general = asyncio.run(run_scenario(tmp_path / "general", seed, False, ordered))
    assert fast == general
    delivered = sum(1 for s in fast[0] for f in s if len(f) == 3)
    assert delivered > 40  # the scenario did deliver (and FIN) a good number


def test_fast_path_is_taken(tmp_path: Path) -> None:
    """The in-order lone FIN of an ordered partition's one consumer takes the fast path and
    the next message goes out in the same callback (no pump scheduled)."""
    async def main() -> None:
        async with running_node(tmp_path, "--log-level=warn") as nsqd:
            nsqd.ensure_partitions("t", 2, ordered=True)
            await nsqd.topics["t"].partitions[1].publish([b"a", b"b", b"c"])
            c = ClientV2(nsqd)
            tr = FakeTransport()
            c.connection_made(tr)
            c.data_received(v2.MAGIC_V2 + v2.sub_ordered("t", "c", 1) + v2.rdy(10))
            await asyncio.sleep(0.01)
            got = frames_of(b"".join(tr.out))
            tr.out.clear()
            assert [f[2] for f in got if len(f) == 3] == [b"a"]
            for want in (b"b", b"c"):
                mid = [f[0] for f in got if len(f) == 3][0]
                assert c._lone_fin(b"FIN " + mid + b"\n")
                got = frames_of(b"".join(tr.out))  # written at once, before any loop turn
                tr.out.clear()
                assert [f[2] for f in got] == [want]
            ch = nsqd.topics["t"].partitions[1].channels["c"]
            assert not ch._pump_scheduled
            mid = got[0][0]
            assert not c._lone_fin(b"FIN " + b"%016x" % (1 << 48) + b"\n")  # not in flight
            assert c._lone_fin(b"FIN " + mid + b"\n")
            assert ch.cursor.confirmed == 3 and ch.cursor.in_flight_count == 0
            c.connection_lost(None)

    asyncio.run(main())
