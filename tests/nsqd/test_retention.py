"""Log retention driven by channel cursors (in-process node: retention is a node-internal job)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nsqx.nsqd.channel import now_ms
from nsqx.nsqd.node import NSQD
from tests.nsqd.inprocess import running_node


async def _fill(nsqd: NSQD, n: int) -> None:
    for i in range(0, n, 10):
        await nsqd.publish("t", [b"%0100d" % j for j in range(i, i + 10)])


def _segments(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "topics" / "t-t" / "p0").glob("*.log"))


def _consume(nsqd: NSQD, channel: str, count: int) -> None:
    ch = nsqd.get_topic("t").get_channel(channel)
    deliveries = ch.cursor.take(1, count, nsqd.get_topic("t").log.flushed_offset, now_ms(), 60_000)
    offsets = [d.offset + k for d in deliveries for k in range(d.count)]
    assert len(offsets) == count
    assert not ch.cursor.finish_many(1, offsets)


def test_segments_below_every_channel_are_deleted(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path, "--max-bytes-per-file=4096") as nsqd:
            topic = nsqd.get_topic("t")
            topic.get_channel("a")
            topic.get_channel("b")
            await _fill(nsqd, 300)
            before = _segments(tmp_path)
            assert len(before) > 3
            _consume(nsqd, "a", 300)
            topic.apply_retention()
            assert topic.log.start_offset == 0  # channel b still needs everything
            assert _segments(tmp_path) == before
            _consume(nsqd, "b", 200)
            topic.apply_retention()
            start = topic.log.start_offset
            assert 0 < start <= 200  # whole segments below b's confirmed offset went
            assert len(_segments(tmp_path)) < len(before)
            # what b has not consumed is still readable
            assert topic.log.read(200, 1 << 20, 1).count == 1

    asyncio.run(main())


def test_retention_time_keeps_consumed_segments_for_replay(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path, "--max-bytes-per-file=4096", "--retention-time=1h") as nsqd:
            topic = nsqd.get_topic("t")
            topic.get_channel("a")
            await _fill(nsqd, 300)
            _consume(nsqd, "a", 300)
            topic.apply_retention()
            assert topic.log.start_offset == 0  # younger than an hour: kept for replay

    asyncio.run(main())


def test_hard_cap_moves_lagging_channels_forward(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path, "--max-bytes-per-file=4096", "--max-log-bytes=8192") as nsqd:
            topic = nsqd.get_topic("t")
            ch = topic.get_channel("slow")
            await _fill(nsqd, 300)
            topic.apply_retention()
            start = topic.log.start_offset
            assert start > 0
            assert topic.log.size_bytes() <= 8192 + 4096
            assert ch.cursor.confirmed >= start  # skipped what the cap dropped
            assert ch.depth == topic.log.next_offset - ch.cursor.confirmed

    asyncio.run(main())
