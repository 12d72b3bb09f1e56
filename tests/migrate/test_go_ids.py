"""Imported messages keep Go's ids: FIN, REQ and TOUCH by them, in an in-process nsqd.

The Go 1.3.0 fixture (see test_import.py) is imported, then an nsqd runs on the result in
this process and fake connections (tests/nsqd/test_fin_fast_path.py) speak to it, so each
path can be named: the lone-FIN fast path, the general FIN/REQ/TOUCH path, the server-side
FINs of ``sample_rate``. The fixture has the same Go id in several channels' blocks (Go
copies a message to each channel with its id), so the right copy must be chosen.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from pathlib import Path

import pytest

from nsqx.migrate.importer import run_import
from nsqx.nsqd.client_v2 import ClientV2
from nsqx.protocol import v2
from nsqx.storage.message_id import parse_id
from tests.nsqd.inprocess import running_node
from tests.nsqd.test_fin_fast_path import FakeTransport, frames_of

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "go-1.3.0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())["channels"]


@pytest.fixture
def imported(tmp_path: Path) -> Path:
    go = tmp_path / "go"
    shutil.copytree(FIXTURE / "data", go)
    target = tmp_path / "nsqx"
    err = io.StringIO()
    assert run_import(go, target, out=io.StringIO(), err=err) == 0, err.getvalue()
    return target


def go_ids(channel: str) -> list[bytes]:
    return [m["id"].encode() for m in EXPECTED["orders"][channel]]


class Conn:
    """One fake client connection subscribed to orders/``channel``."""

    def __init__(self, nsqd, channel: str, rdy: int, identify: dict | None = None) -> None:
        self.c = ClientV2(nsqd)
        self.tr = FakeTransport()
        self.c.connection_made(self.tr)
        hello = v2.MAGIC_V2 + (v2.identify(identify) if identify else b"")
        self.c.data_received(hello + b"SUB orders %s\n" % channel.encode() + v2.rdy(rdy))

    def frames(self) -> list[tuple]:
        """Messages and error frames since the last call (responses such as OK left out)."""
        out = frames_of(b"".join(self.tr.out))
        self.tr.out.clear()
        return [f for f in out if f[0] != 0]

    def messages(self) -> list[tuple[bytes, int, bytes]]:
        got = self.frames()
        assert all(len(f) == 3 for f in got), got
        return got

    async def send(self, data: bytes) -> list[tuple]:
        self.c.data_received(data)
        for _ in range(3):
            await asyncio.sleep(0)
        return self.frames()

    async def req_until_back(self, mid: bytes) -> tuple[tuple, list[bytes]]:
        """REQ ``mid`` (delay 0), FIN (general path) what comes before it comes back; the
        redelivery and the ids FINed."""
        got = await self.send(b"REQ " + mid + b" 0\n")
        finned = []
        while got[0][0] != mid:
            finned.append(got[0][0])
            got = got[1:] + await self.send(b"FIN " + got[0][0] + b"\nNOP\n")
        return got[0], finned

    def close(self) -> None:
        self.tr.closing = True
        self.c.connection_lost(None)


async def turns() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_fin_req_touch_by_go_ids(imported: Path) -> None:
    async def main() -> None:
        async with running_node(imported, "--msg-timeout=600s", "--log-level=warn") as nsqd:
            want = go_ids("shipping")
            ship = Conn(nsqd, "shipping", 1)
            await turns()
            [(mid, attempts, _)] = ship.messages()
            assert (mid, attempts) == (want[0], 1)
            assert parse_id(mid)[0] >= 1024  # no partition of any topic: Go's id as it was
            # the lone FIN of Go's id takes the fast path: the next one goes out at once
            assert ship.c._lone_fin(b"FIN " + mid + b"\n")
            [(mid, attempts, body)] = ship.messages()
            assert mid == want[1]
            # REQ by Go's id: the same id again, one attempt more (fresh ones may go first:
            # FIN then NOP in one read, the general path)
            back, finned = await ship.req_until_back(mid)
            assert back == (want[1], 2, body)
            finned.insert(0, want[0])
            # TOUCH has no answer (an error frame if the id were not found)
            assert await ship.send(b"TOUCH " + mid + b"\n") == []
            got = await ship.send(b"FIN " + mid + b"\nNOP\n")
            finned.append(mid)
            assert sorted(finned) == sorted(want[:len(finned)])
            assert [f[0] for f in got] == want[len(finned):len(finned) + 1]
            held = len(got)
            # a Go id this client does not hold (a later shipping message, also stored in
            # billing's and audit's blocks) and an unknown one: not in flight, as upstream
            for bad in (want[6], b"18aa0342ffffffff"):
                [(ftype, text)] = await ship.send(b"FIN " + bad + b"\n")
                assert ftype == 1 and text == b"E_FIN_FAILED FIN %s failed ID not in flight" % bad
                [(ftype, text)] = await ship.send(b"REQ " + bad + b" 0\n")
                assert ftype == 1 and text.startswith(b"E_REQ_FAILED")
                [(ftype, text)] = await ship.send(b"TOUCH " + bad + b"\n")
                assert ftype == 1 and text.startswith(b"E_TOUCH_FAILED")

            # billing holds Go's attempts (stored + 1): a REQ goes on counting from there
            bill = Conn(nsqd, "billing", 3)
            await turns()
            got = bill.messages()
            assert [(m, a) for m, a, _ in got] == [
                (m["id"].encode(), m["attempts"]) for m in EXPECTED["orders"]["billing"][:3]]
            third = got[2][0]  # order-08, attempts 2; also in shipping's and audit's blocks
            back, bfinned = await bill.req_until_back(third)
            assert back == (third, 3, got[2][2])
            # another channel's client FINs the same Go id: its own copy is not in flight
            [(ftype, text)] = await ship.send(b"FIN " + third + b"\n")
            assert text == b"E_FIN_FAILED FIN %s failed ID not in flight" % third
            for mid in (got[0][0], got[1][0], third):
                answer = await bill.send(b"FIN " + mid + b"\nNOP\n")
                assert all(len(f) == 3 for f in answer), answer  # messages, no error
            billing = nsqd.topics["orders"].channels["billing"]
            assert billing.cursor.finish_count == len(bfinned) + 3
            shipping = nsqd.topics["orders"].channels["shipping"]
            assert shipping.cursor.finish_count == len(finned)
            assert shipping.in_flight_count == held
            bill.close()
            ship.close()

    asyncio.run(main())


def test_sample_rate_drops_are_finished_by_go_id(imported: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The messages a client's sample_rate skips are FINed by the server through the id in
    the frame: Go's, here."""
    async def main() -> None:
        async with running_node(imported, "--msg-timeout=600s", "--log-level=warn") as nsqd:
            monkeypatch.setattr("nsqx.nsqd.channel.random.randint", lambda a, b: 99)
            conn = Conn(nsqd, "shipping", 100, {"sample_rate": 1})
            await turns()
            assert [f for f in conn.frames() if len(f) == 3] == []  # every one skipped
            ch = nsqd.topics["orders"].channels["shipping"]
            assert ch.in_flight_count == 0 and ch.depth == 0
            assert ch.cursor.finish_count == len(go_ids("shipping"))
            conn.close()

    asyncio.run(main())


def test_trace_search_finds_an_imported_message_by_its_go_id(imported: Path) -> None:
    """Delivery and FIN events of an imported message are found by the Go id a client saw,
    and the answer names that id (not nsqx's id of the offset)."""
    from nsqx.nsqd.trace import search_trace  # noqa: PLC0415

    async def main() -> None:
        async with running_node(imported, "--msg-timeout=600s", "--log-level=warn") as nsqd:
            nsqd.tracer.set_traced(nsqd.topics["orders"], True)
            want = go_ids("shipping")
            ship = Conn(nsqd, "shipping", 1)
            await turns()
            [(mid, _, _)] = ship.messages()
            assert mid == want[0]
            await ship.send(b"FIN " + mid + b"\nNOP\n")
            part, off = parse_id(mid)
            for _ in range(100):  # trace events are written by a periodic flush
                found = search_trace(nsqd, "orders", msg_id=(part, off))
                kinds = {e.get("event") for m in found["messages"] for e in m["events"]}
                if {"deliver", "fin"} <= kinds:
                    break
                await asyncio.sleep(0.05)
            # one entry per stored copy (Go kept one per channel), each named by Go's id;
            # the events are those of the copy shipping was given
            copies = found["messages"]
            assert len(copies) > 1 and all(m["id"] == mid.decode() for m in copies), copies
            traced = [m for m in copies if m["events"]]
            assert len(traced) == 1, copies
            assert {e.get("event") for e in traced[0]["events"]} >= {"deliver", "fin"}, traced
            assert {e.get("channel") for e in traced[0]["events"]} == {"shipping"}, traced
            # an unknown foreign id finds nothing (not some other message)
            none = search_trace(nsqd, "orders", msg_id=parse_id(b"18aa0342ffffffff"))
            assert none["messages"] == []
            ship.close()

    asyncio.run(main())
