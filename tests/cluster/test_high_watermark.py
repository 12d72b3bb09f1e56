"""The high watermark: a cluster partition's channels read only what its ISR has.

In-process node, no etcd: a real :class:`LeaderGate` on a topic partition with a stand-in
member; follower fetches are simulated through the gate's progress. Standalone topics read
up to the flushed end, as before.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from nsqx.cluster.member import LeaderGate
from nsqx.cluster.model import PartitionMeta
from nsqx.nsqd.fetch_api import readable_end
from tests.nsqd.inprocess import running_node


def fresh(ch) -> int:  # type: ignore[no-untyped-def]
    """How many fresh messages a client of the channel could be handed now."""
    got = ch.cursor.take(1, 10_000, ch.end_offset(), 0, 60_000)
    return sum(d.count for d in got)


def test_standalone_channels_read_up_to_the_flushed_end(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            topic = nsqd.get_topic("t")
            ch = topic.get_channel("c")
            await nsqd.publish("t", [b"a", b"b", b"c"])
            assert not topic.hold_reads
            assert topic.readable_end == topic.log.flushed_offset == 3
            assert fresh(ch) == 3 and readable_end(topic) == 3

    asyncio.run(main())


def test_leader_channels_advance_only_with_the_acked_end(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            topic = nsqd.get_topic("t")
            ch = topic.get_channel("c")
            await nsqd.publish("t", [b"old"] * 2)  # before the cluster held it: end 2
            member = SimpleNamespace(node_id="a", lag_timeout=3.0)
            pm = PartitionMeta("t", 0, ("a", "b"), "a", 1, ("a", "b"))
            topic.hold_reads_from_start()  # a restarted replica: its acked end is not known
            assert topic.readable_end == 0
            gate = LeaderGate(member, topic, pm, min_isr=2)  # type: ignore[arg-type]
            topic.gate = gate
            gate.release()
            assert topic.readable_end == 0  # b has not fetched in this epoch
            assert fresh(ch) == 0

            seen_at_ack: list[int] = []
            fut = topic.publish([b"x", b"y", b"z"],
                                done=lambda base, exc: seen_at_ack.append(topic.readable_end))
            assert fut is None
            await asyncio.sleep(0.05)  # flushed locally, not acknowledged
            assert topic.log.flushed_offset == 5 and not seen_at_ack
            assert topic.readable_end == 0 and fresh(ch) == 0
            # the pipeline API (/nsqx/offsets, /nsqx/fetch: Spark) stops there too
            assert readable_end(topic) == 0 and readable_end(topic, uncommitted=True) == 5

            now = asyncio.get_running_loop().time()
            gate.progress.on_fetch("b", 3, 5, now)  # b has the old records and x
            gate.release()
            assert topic.readable_end == 3 and not seen_at_ack
            assert fresh(ch) == 3 and readable_end(topic) == 3
            gate.progress.on_fetch("b", 5, 5, now)
            gate.release()
            assert seen_at_ack == [5]  # channels could read it before the producer's ack
            assert fresh(ch) == 2

            # the watermark never goes back, nor past the flushed end
            topic.advance_readable(4)
            topic.advance_readable(99)
            assert topic.readable_end == 5

            # a deposed leader advances nothing more
            gate.deposed("test")
            gate.progress.on_fetch("b", 5, 5, now)
            gate.release()
            assert topic.readable_end == 5

    asyncio.run(main())


def test_a_lone_in_sync_leader_reads_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            topic = nsqd.get_topic("t")
            ch = topic.get_channel("c")
            member = SimpleNamespace(node_id="a", lag_timeout=3.0)
            pm = PartitionMeta("t", 0, ("a",), "a", 1, ("a",))
            topic.hold_reads_from_start()
            gate = LeaderGate(member, topic, pm, min_isr=1)  # type: ignore[arg-type]
            topic.gate = gate
            await topic.publish([b"x", b"y"])
            assert topic.readable_end == 2 and fresh(ch) == 2

    asyncio.run(main())


def test_a_repeat_waiting_behind_a_later_batch_is_acked_with_its_own_end(tmp_path: Path) -> None:
    """Idempotence answers a repeat of an earlier, unacked batch through the gate
    (``wrap``) after later batches already wait: it is acked when its own end is, not
    when the later batches' is."""
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            topic = nsqd.get_topic("t")
            member = SimpleNamespace(node_id="a", lag_timeout=3.0)
            pm = PartitionMeta("t", 0, ("a", "b"), "a", 1, ("a", "b"))
            topic.hold_reads_from_start()
            gate = LeaderGate(member, topic, pm, min_isr=2)  # type: ignore[arg-type]
            topic.gate = gate
            acked: list[str] = []
            topic.publish([b"1", b"2"], done=lambda b, e: acked.append("first"))
            topic.publish([b"3", b"4"], done=lambda b, e: acked.append("later"))
            await asyncio.sleep(0.05)
            assert topic.log.flushed_offset == 4 and not acked
            gate.progress.on_fetch("b", 2, 4, asyncio.get_running_loop().time())
            gate.release()
            assert acked == ["first"]
            # the repeat's end (2) is acked already; the later batch (end 4) still waits
            gate.wrap(topic, 2, lambda b, e: acked.append(f"repeat@{b}"))(0, None)
            assert acked == ["first", "repeat@0"]
            gate.progress.on_fetch("b", 4, 4, asyncio.get_running_loop().time())
            gate.release()
            assert acked == ["first", "repeat@0", "later"]

    asyncio.run(main())
