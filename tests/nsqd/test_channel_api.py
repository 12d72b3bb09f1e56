"""Channel's delivery API and the replica API of Topic/Channel (issue 29): what the TCP
session and cluster mode call instead of writing the cursor and the topic's fields."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nsqx.nsqd.channel import now_ms
from nsqx.storage.cursor import NotInFlight
from tests.nsqd.inprocess import running_node


class _Tracer:
    def __init__(self) -> None:
        self.finished_calls: list[list[int]] = []
        self.requeued_calls: list[tuple[int, int]] = []

    def finished(self, channel: Any, client: Any, offsets: Any) -> None:
        self.finished_calls.append(list(offsets))

    def requeued(self, channel: Any, client: Any, offset: int, delay_ms: int) -> None:
        self.requeued_calls.append((offset, delay_ms))


class _Gate:
    forwards = False

    def refuse(self, topic: Any, count: int) -> str | None:
        return None


def test_finish_requeue_touch_do_the_bookkeeping_once_per_batch(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            await nsqd.publish("t", [b"m%d" % i for i in range(6)])
            topic = nsqd.get_topic("t")
            ch = topic.get_channel("c")
            client = SimpleNamespace(id=1, msg_timeout_ms=60_000)
            ch.cursor.take(1, 6, topic.readable_end, now_ms(), 60_000)
            ch.persist_if_dirty()
            topic.tracer = tracer = _Tracer()
            errors = ch.finish_many(client, [0, 1, 2, 99, 4])  # type: ignore[arg-type]
            assert [off for off, _ in errors] == [99]
            assert tracer.finished_calls == [[0, 1, 2, 4]]  # one call, the failed one left out
            assert ch.dirty and ch.confirmed == 3
            ch.persist_if_dirty()
            assert not ch.dirty
            assert ch.finish_head(client, 3)  # type: ignore[arg-type]
            assert ch.confirmed == 5 and ch.dirty and tracer.finished_calls[-1] == [3]
            ch.touch(client, 5, 120_000)  # type: ignore[arg-type]
            ch.requeue(client, 5, 0)  # type: ignore[arg-type]
            assert tracer.requeued_calls == [(5, 0)] and ch.in_flight_of(1) == 0
            try:
                ch.finish(client, 5)  # type: ignore[arg-type]
            except NotInFlight:
                pass
            else:
                raise AssertionError("a requeued message is not in flight")

    asyncio.run(main())


def test_replica_api_moves_the_gate_the_readable_end_and_the_cursor(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            await nsqd.publish("t", [b"m%d" % i for i in range(5)])
            topic = nsqd.get_topic("t")
            ch = topic.get_channel("c")
            assert topic.readable_end == 5 and not topic.hold_reads
            gate = _Gate()
            topic.attach_gate(gate, 7)  # type: ignore[arg-type]
            assert topic.gate is gate and topic.epoch == 7
            assert topic.hold_reads and topic.readable_end == topic.log.start_offset == 0
            topic.advance_readable(4)
            assert topic.readable_end == 4 and ch.end_offset() == 4
            ch.mirror_confirmed(3)  # the leader is ahead: skip
            assert ch.confirmed == 3 and ch.dirty
            ch.mirror_confirmed(1)  # behind: a replay on the leader, reset (persisted)
            assert ch.confirmed == 1 and not ch.dirty
            ch.mirror_confirmed(50)  # never past what this replica has
            assert ch.confirmed == 5
            topic.truncate_to(2)
            assert topic.log.next_offset == 2 and topic.readable_end == 2

    asyncio.run(main())
