"""--mem-tail-budget: the topics' memory tails share one node-wide budget (in-process node)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nsqx.nsqd.node import TAIL_SHARE_MAX, TAIL_SHARE_MIN, TAIL_UNREAD
from nsqx.nsqd.topic import Topic
from tests.nsqd.inprocess import running_node


class _Reader:
    """Stands for a subscribed consumer: what makes a topic 'read'."""

    id = 1
    desired_tag = None

    def close(self) -> None:
        pass


def _read(topic: Topic) -> None:
    ch = topic.get_channel("c")
    assert ch is not None
    ch.clients[_Reader.id] = _Reader()  # type: ignore[assignment]


def test_topics_share_the_budget_and_reads_stay_whole(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path, f"--mem-tail-budget={4 * 1024 * 1024}") as nsqd:
            first = nsqd.get_topic("t0")
            assert first.log.tail_limit == TAIL_UNREAD  # nobody reads it yet
            _read(first)
            nsqd.share_memory()
            assert first.log.tail_limit == 4 * 1024 * 1024  # one read topic: all of it
            for i in range(1, 64):
                _read(nsqd.get_topic(f"t{i}"))
            nsqd.get_topic("eph#ephemeral")  # memory-only topics are not counted
            nsqd.get_topic("unread")  # written, not consumed: no share
            nsqd.share_memory()
            assert nsqd.get_topic("unread").log.tail_limit == TAIL_UNREAD
            assert {t.log.tail_limit for n, t in nsqd.topics.items()
                    if n not in ("eph#ephemeral", "unread")} == {4 * 1024 * 1024 // 64}
            bodies = [b"%0200d" % i for i in range(2000)]  # 460 KB: far over the 64 KiB share
            for k in range(0, 2000, 100):
                await nsqd.publish("t0", bodies[k : k + 100])
            lg = first.log
            assert lg._tail_bytes <= 64 * 1024 + 100 * 230  # trimmed to about its share
            got, off = [], 0
            while off < lg.flushed_offset:  # old frames come from the log files
                r = lg.read(off, 1 << 16)
                got.append(bytes(r.data))
                off = r.next_offset
            data = b"".join(got)
            assert all(b in data for b in (bodies[0], bodies[999], bodies[1999]))
            assert off == 2000
            for i in range(1, 64):
                await nsqd.delete_topic(f"t{i}")
            assert first.log.tail_limit == 4 * 1024 * 1024  # the share grows back

    asyncio.run(main())


def test_unread_topic_keeps_its_newest_batch(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            nsqd.get_topic("w")
            for k in range(10):
                await nsqd.publish("w", [b"%0200d" % (k * 20 + i) for i in range(20)])
            lg = nsqd.get_topic("w").log
            assert lg.tail_limit == TAIL_UNREAD
            assert 0 < lg._tail_bytes <= 20 * 240  # only the newest batch stays in memory
            assert lg.read(0, 1 << 16).next_offset > 0  # the rest reads from the files

    asyncio.run(main())


def test_subscribe_and_unsubscribe_resplit_soon(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path, f"--mem-tail-budget={4 * 1024 * 1024}") as nsqd:
            t = nsqd.get_topic("t")
            ch = t.get_channel("c")
            reader = _Reader()
            ch.add_client(reader)  # type: ignore[arg-type]
            await asyncio.sleep(0.7)
            assert t.log.tail_limit == 4 * 1024 * 1024
            ch.clients.pop(reader.id)
            ch.remove_client(reader)  # type: ignore[arg-type]  # already gone: no-op
            ch.clients[reader.id] = reader  # type: ignore[assignment]
            ch.remove_client(reader)  # type: ignore[arg-type]
            await asyncio.sleep(0.7)
            assert t.log.tail_limit == TAIL_UNREAD

    asyncio.run(main())


def test_share_bounds(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path, "--mem-tail-budget=1024") as nsqd:
            _read(nsqd.get_topic("a"))
            nsqd.share_memory()
            assert nsqd.get_topic("a").log.tail_limit == TAIL_SHARE_MIN
            nsqd.opts.mem_tail_budget = 1 << 40
            nsqd.share_memory()
            assert nsqd.get_topic("a").log.tail_limit == TAIL_SHARE_MAX

    asyncio.run(main())
