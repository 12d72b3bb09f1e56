"""nsqd's side of cluster route-managed topics without a cluster (TopicRoutes.mirror, apply,
seal, learn_passes, subscribe_led are what nsqx.cluster.member drives): the mirrored
history refuses local changes, a pending history closes the retired partition, a seal is
idempotent, and a channel's barrier advances on passes learnt from other nodes only for
partitions this node does not lead."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

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

            with pytest.raises(RouteError, match="not supported yet"):
                routes.reset_channel("c", parse_start_position(b"earliest"))

    asyncio.run(main())
