"""The forwarder's rules without processes (issue 28 defect 2): the leader is re-read from
the metadata on every attempt, an attempt to a dead leader is given up when the metadata
moves, this node appends locally once it leads, and a failure always says why."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nsqx.cluster.forwarding import Forwarder, reason_of
from nsqx.cluster.model import NodeInfo, PartitionMeta
from nsqx.protocol import v2
from tests.nsqd.inprocess import running_node


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


class LeaderGate:
    """Admits everything (a leader's gate does not forward)."""

    forwards = False

    def refuse(self, topic: Any, count: int) -> str | None:
        return None


class FollowerGate:
    forwards = True

    def forward(self) -> None:  # never called by the forwarder
        raise AssertionError


class Topic:
    name = "orders"
    partition = 0

    def __init__(self) -> None:
        self.gate: Any = FollowerGate()
        self.published: list[list[bytes]] = []

    def publish(self, bodies: list[bytes], defer_ms: int, done: Any, *, headers: Any,
                trace: bool = True) -> None:
        assert not trace, "done records the trace events already: no second pub event"
        self.published.append(bodies)
        done(7, None)


def _meta(leader: str | None) -> PartitionMeta:
    isr = ("me", "dead") if leader else ("me",)
    return PartitionMeta("orders", 0, ("me", "dead"), leader, 2, isr,
                         () if leader else ("dead",))


def test_reason_is_never_empty() -> None:
    assert reason_of(TimeoutError()) == "TimeoutError"
    assert reason_of(ConnectionRefusedError(111, "refused")) == \
        "ConnectionRefusedError: [Errno 111] refused"


def test_follows_the_metadata_from_a_dead_leader_to_this_node() -> None:
    async def main() -> None:
        member = SimpleNamespace(
            node_id="me", partitions={("orders", 0): _meta("dead")},
            nodes={"dead": NodeInfo("dead", "127.0.0.1", _closed_port(), 1)})
        fwd = Forwarder(member, timeout=30)  # type: ignore[arg-type]
        topic = Topic()
        outcome: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        fwd.start(topic, [b"x"], 0, None, v2.pub("orders", b"x"),
                  lambda off, exc: outcome.set_result((off, exc)))
        await asyncio.sleep(0.3)  # its producer keeps failing to reach the dead leader
        assert not outcome.done()
        member.partitions[("orders", 0)] = _meta("me")  # the failover: this node leads
        await asyncio.sleep(0.3)
        assert not outcome.done()  # ...but it is still taking over: no local append yet
        topic.gate = LeaderGate()
        assert await asyncio.wait_for(outcome, 10) == (7, None)
        assert topic.published == [[b"x"]] and fwd.local_appends == 1
        await fwd.close()

    asyncio.run(main())


def test_no_leader_within_the_timeout_fails_with_a_reason() -> None:
    async def main() -> None:
        member = SimpleNamespace(node_id="me", partitions={("orders", 0): _meta(None)},
                                 nodes={})
        fwd = Forwarder(member, timeout=0.5)  # type: ignore[arg-type]
        outcome: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        fwd.start(Topic(), [b"x"], 0, None, v2.pub("orders", b"x"),
                  lambda off, exc: outcome.set_result((off, exc)))
        off, exc = await asyncio.wait_for(outcome, 10)
        assert off == -1 and str(exc).endswith("failed: the partition has no leader"), exc
        await fwd.close()

    asyncio.run(main())


def test_a_marked_publish_appended_here_is_checked_for_idempotence(tmp_path: Path) -> None:
    """A follower forwarded a keyed publish to a leader that stored and replicated it, then
    died before answering; this node leads now and appends the publish itself: it is
    answered from what it holds, not stored twice (CI saw ``http-13`` twice)."""
    async def main() -> None:
        async with running_node(tmp_path) as n:
            part = n.get_topic("orders")
            assert part is not None
            marked = [{"nsqx-pub": b"h/req-13#1#fp"}]
            first = part.publish([b"http-13"], 0, headers=marked)  # the replicated copy
            assert first is not None and await first == 0
            part.gate = LeaderGate()  # type: ignore[assignment]
            member = SimpleNamespace(node_id="me", partitions={("orders", 0): _meta("me")},
                                     nodes={})
            fwd = Forwarder(member)  # type: ignore[arg-type]
            outcome: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
            fwd.start(part, [b"http-13"], 0, marked, v2.pub("orders", b"http-13"),
                      lambda off, exc: outcome.set_result((off, exc)))
            assert await asyncio.wait_for(outcome, 10) == (0, None)
            assert fwd.local_appends == 1 and part.log.next_offset == 1
            await fwd.close()

    asyncio.run(main())
