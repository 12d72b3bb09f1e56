"""nsqd's side of cluster route-managed topics without a cluster (TopicRoutes.mirror, apply,
seal, learn_passes, subscribe_led are what nsqx.cluster.member drives): the mirrored
history refuses local changes, a pending history closes the retired partition, a seal is
idempotent, and a channel's barrier advances on passes learnt from other nodes only for
partitions this node does not lead."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nsqx.cluster.barrier import ChannelRoute
from nsqx.cluster.routes import RouteError, RouteHistory
from nsqx.nsqd.routing import TopicRoutes
from tests.nsqd.inprocess import running_node


def test_mirror_seal_and_learnt_passes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as n:
            h0 = RouteHistory.initial("t", ["a", "b"], 16)
            topic = n.ensure_partitions("t", 2, ordered=True)
            passes: list[tuple[str, int]] = []
            led = {0, 2, 3}  # partition 1 is led by another node
            routes = TopicRoutes.mirror(n, topic, h0, lambda p: p in led,
                                        lambda ch, p: passes.append((ch, p)))
            assert topic.routes is routes and len(topic.partitions) == 2
            with pytest.raises(RouteError, match="change its route through nsqlookupd"):
                await routes.change(lambda h: h.split(0, 4))
            topic.get_channel("c")
            assert routes.states["c"].version == 0
            await n.publish("t", [b"before"], partition=0)
            # the coordinator stored the split as pending: partition 0 is closed at once
            pending = h0.split(0, 4)
            routes.apply(pending)
            assert len(topic.partitions) == 4 and all(p.routes is routes
                                                       for p in topic.partitions)
            with pytest.raises(Exception, match="route version 1"):
                await n.publish("t", [b"late"], partition=0)
            off, fut = routes.seal(0)
            assert fut is not None and await fut == off == 1
            assert routes.seal(0) == (1, None)  # asked again (a retry): the same command
            routes.apply(pending.commit(1))
            assert routes.states["c"].version == 0  # "before" is not consumed yet
            # merge 3 + 1 -> 4: the node leading 1 recorded that c consumed 1's command
            h2 = pending.commit(1).merge(3, 1)
            routes.apply(h2)
            routes.seal(3)
            routes.apply(h2.commit(2))
            routes.learn_passes("c", {1})
            assert routes.states["c"].passed == frozenset({1})
            # channel c finishes "before" on partition 0 (this node leads it): the pump
            # passes the command and tells the member
            ch0 = topic.partitions[0].channels["c"]
            ch0.cursor.skip_to(1)
            assert routes.gate(ch0, topic.partitions[0].readable_end) == -1
            assert ("c", 0) in passes and routes.states["c"].version == 1
            ch3 = topic.partitions[3].channels["c"]
            routes.gate(ch3, topic.partitions[3].readable_end)
            assert ("c", 3) in passes and routes.states["c"].version == 2
            assert set(routes.readable["c"]) == {2, 4}
            # a channel created now starts on version 0 (the cluster's rule) and counts the
            # commands its cursors are past only on partitions this node leads
            topic.get_channel("late")
            assert ("late", 0) in passes and ("late", 3) in passes
            assert ("late", 1) not in passes and routes.states["late"].version == 1
            from nsqx.protocol.v2 import parse_start_position

            with pytest.raises(RouteError, match="through nsqlookupd"):
                routes.reset_channel("c", parse_start_position(b"earliest"))
            # a cluster reset (the coordinator drives these through the member): held, the
            # channel delivers from no partition; the report gives positions and commands
            routes.hold("c", 30)
            assert routes.readable["c"] == frozenset()
            report = routes.prepare_reset("c", parse_start_position(b"earliest"))
            assert set(report) == {0, 2, 3} and report[0]["command"] == 1
            assert report[0]["offset"] == 0 and report[0]["channel"]
            # applied: cursors of the led partitions at their offsets, the barrier back on
            # version 0 with etcd's passes (1's was deleted), released
            passes.clear()
            assert routes.apply_reset("c", 1, 0, {0: 0, 1: 0, 2: 0, 3: 0, 4: 0}, set())
            assert routes.states["c"] == ChannelRoute(0) and "c" not in routes.held
            assert set(routes.readable["c"]) == {0, 1}
            assert topic.partitions[0].channels["c"].cursor.next_read == 0
            assert passes == []  # nothing passed again yet
            assert not routes.apply_reset("c", 1, 0, {0: 0}, set())  # the same gen: once
            assert routes.reset_gen("c") == 1
            assert (topic.dir / "channels" / "c-c.reset").read_text() == "1"
            # latest: the newest version at once (the coordinator keeps the pass keys of the
            # retired partitions, every cursor being beyond its command)
            assert routes.apply_reset("c", 2, 2, {0: 2, 3: 1}, {0, 1, 3})
            assert routes.states["c"] == ChannelRoute(2)
            assert set(routes.readable["c"]) == {2, 4}
            assert topic.partitions[3].channels["c"].cursor.next_read == 1
            # a channel this node did not have is created by the reset, its cursors at the
            # reset's offsets; being created at the log end is no pass of the commands
            passes.clear()
            assert routes.apply_reset("new", 1, 0, {0: 0, 1: 0, 2: 0, 3: 0, 4: 0}, set())
            assert passes == [] and routes.states["new"] == ChannelRoute(0)
            assert topic.partitions[0].channels["new"].cursor.next_read == 0

    asyncio.run(main())
