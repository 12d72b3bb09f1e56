"""The coordinator on a real etcd, with nodes registered under real leases."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from nsqx.cluster.coordinator import Coordinator, reconcile_partition, repair_contradictions
from nsqx.cluster.etcd import EtcdClient
from nsqx.cluster.etcd_server import EtcdServer
from nsqx.cluster.metadata import ClusterMetadata
from nsqx.cluster.model import MetaError, MoveRequest, NodeInfo, PartitionMeta, TopicMeta
from nsqx.cluster.placement import expand_isr
from nsqx.cluster.restart import step_down_after_restart
from tests.client.helpers import run

CID = "test"


async def eventually(check, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)


class Nodes:
    """Fake nsqd members: a node record under a lease per node."""

    def __init__(self, meta: ClusterMetadata) -> None:
        self.meta = meta
        self.leases: dict[str, int] = {}

    async def up(self, node: str) -> None:
        lease = await self.meta.etcd.lease_grant(30)
        await self.meta.register_node(NodeInfo(node, "127.0.0.1", 4150, 4151), lease)
        self.leases[node] = lease

    async def down(self, node: str) -> None:
        """Like a lease running out after kill -9 (revoked at once to keep the test short)."""
        await self.meta.etcd.lease_revoke(self.leases.pop(node))


def test_create_topic_places_and_refuses_a_different_shape(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            parts = await meta.create_topic(TopicMeta("t", 6, 3), ["n1", "n2", "n3"])
            assert Counter(p.leader for p in parts) == {"n1": 2, "n2": 2, "n3": 2}
            again = await meta.create_topic(TopicMeta("t", 6, 3), ["n1", "n2", "n3"])
            assert again == parts  # a retried create is harmless
            with pytest.raises(MetaError, match="already exists with 6 partitions x 3"):
                await meta.create_topic(TopicMeta("t", 4, 3), ["n1", "n2", "n3"])
            with pytest.raises(MetaError, match="more than the 2 live nodes"):
                await meta.create_topic(TopicMeta("u", 1, 3), ["n1", "n2"])
            with pytest.raises(MetaError, match="min ISR 2"):
                await meta.create_topic(TopicMeta("v", 1, 3, min_isr=2), ["n1"])
            assert set(await meta.topics()) == {"t"}
            assert len(await meta.partitions("t")) == 6

    run(body())


def test_leader_loss_elects_from_the_isr_with_a_new_epoch(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            nodes = Nodes(meta)
            for n in ("n1", "n2", "n3"):
                await nodes.up(n)
            await meta.create_topic(TopicMeta("t", 3, 3), ["n1", "n2", "n3"])
            coord = Coordinator(EtcdClient([etcd_server.endpoint]), CID, "lookupd-1", ttl=2)
            coord.start()
            try:
                await eventually(lambda: _true(coord.passes > 0))
                await nodes.down("n1")

                async def moved() -> bool:
                    ps = [v.meta for v in (await meta.partitions("t")).values()]
                    return all(p.leader not in (None, "n1") and "n1" not in p.isr
                               and "n1" in p.catchup for p in ps)

                await eventually(moved)
                ps = [v.meta for v in (await meta.partitions("t")).values()]
                led_by_n1 = [p for p in ps if p.replicas[0] == "n1"]
                assert led_by_n1 and all(p.epoch == 2 for p in led_by_n1)
                assert all(p.epoch == 1 for p in ps if p.replicas[0] != "n1")
            finally:
                await coord.close()
                await coord.meta.etcd.close()

    run(body())


def test_a_node_back_within_its_lease_gives_up_its_leaderships(etcd_server: EtcdServer) -> None:
    """Its old registration is still alive, so the coordinator sees nothing: the node itself
    hands each leadership to another live ISR member before it takes any role; one whose
    ISR is itself alone stays led by it, at a new epoch."""
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            nodes = Nodes(meta)
            for n in ("n1", "n2", "n3"):
                await nodes.up(n)
            await meta.create_topic(TopicMeta("t", 3, 3), ["n1", "n2", "n3"])
            await meta.create_topic(TopicMeta("solo", 1, 1), ["n1"])
            before = {p: v.meta for p, v in (await meta.partitions("t")).items()}
            assert await step_down_after_restart(meta, "n1") == 1
            after = {p: v.meta for p, v in (await meta.partitions("t")).items()}
            for p, was in before.items():
                if was.leader == "n1":
                    now = after[p]
                    assert now.leader in ("n2", "n3") and now.epoch == was.epoch + 1
                    assert "n1" not in now.isr and "n1" in now.catchup
                else:
                    assert after[p] == was
            solo = (await meta.partitions("solo"))[0].meta  # its only ISR member: kept,
            assert (solo.leader, solo.isr, solo.epoch) == ("n1", ("n1",), 2)  # at a new epoch
            assert await step_down_after_restart(meta, "n1") == 0  # nothing left to hand over

    run(body())


def test_a_leaderless_partition_is_led_again_when_its_isr_returns(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            nodes = Nodes(meta)
            await nodes.up("n1")
            await nodes.up("n2")
            await meta.create_topic(TopicMeta("solo", 1, 1), ["n1"])
            coord = Coordinator(EtcdClient([etcd_server.endpoint]), CID, "lookupd-1", ttl=2)
            coord.start()
            try:
                await nodes.down("n1")

                async def leaderless() -> bool:
                    p = (await meta.partitions("solo"))[0].meta
                    return p.leader is None and p.epoch == 2

                await eventually(leaderless)
                # n2 holds no replica: it must not lead (no unclean election)
                await asyncio.sleep(0.3)
                assert (await meta.partitions("solo"))[0].meta.leader is None
                await nodes.up("n1")

                async def back() -> bool:
                    p = (await meta.partitions("solo"))[0].meta
                    return p.leader == "n1" and p.epoch == 3

                await eventually(back)
            finally:
                await coord.close()
                await coord.meta.etcd.close()

    run(body())


def test_coordinator_failover(etcd_server: EtcdServer) -> None:
    """The elected coordinator dies without resigning; the other takes over and keeps working."""

    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            nodes = Nodes(meta)
            for n in ("n1", "n2", "n3"):
                await nodes.up(n)
            await meta.create_topic(TopicMeta("t", 3, 3), ["n1", "n2", "n3"])
            coords = [Coordinator(EtcdClient([etcd_server.endpoint]), CID, f"l{i}", ttl=1)
                      for i in range(2)]
            for c in coords:
                c.start()
            try:
                await eventually(lambda: _true(sum(c.is_leader for c in coords) == 1))
                first = next(c for c in coords if c.is_leader)
                other = next(c for c in coords if c is not first)
                await first._stop_leading()
                await first.election.close(resign=False)  # its lease is left to run out
                await eventually(lambda: _true(other.is_leader))
                await nodes.down("n2")

                async def handled() -> bool:
                    ps = [v.meta for v in (await meta.partitions("t")).values()]
                    return all(p.leader != "n2" and "n2" not in p.isr for p in ps)

                await eventually(handled)
            finally:
                for c in coords:
                    await c.close()
                    await c.meta.etcd.close()

    run(body())


def test_drain_moves_every_replica_off_a_node(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            nodes = Nodes(meta)
            for n in ("n1", "n2", "n3", "n4"):
                await nodes.up(n)
            await meta.create_topic(TopicMeta("t", 4, 2), ["n1", "n2", "n3", "n4"])
            coord = Coordinator(EtcdClient([etcd_server.endpoint]), CID, "l", ttl=2)
            coord.start()
            try:
                await eventually(lambda: _true(coord.passes > 0))
                await coord.drain("n1")

                async def replacements_added() -> bool:
                    ps = [v.meta for v in (await meta.partitions("t")).values()]
                    return all(len(p.catchup) == 1 for p in ps if "n1" in p.replicas)

                await eventually(replacements_added)
                # each leader admits its caught-up replacement (what the nsqd leader does)
                for v in (await meta.partitions("t")).values():
                    if v.meta.catchup:
                        new = v.meta.catchup[0]
                        assert await meta.update_partition(
                            v, lambda pm, n=new: expand_isr(pm, n, pm.epoch)) is not None

                async def drained() -> bool:
                    ps = [v.meta for v in (await meta.partitions("t")).values()]
                    return all("n1" not in p.replicas and len(p.replicas) == 2
                               and p.leader in p.isr for p in ps)

                await eventually(drained)
            finally:
                await coord.close()
                await coord.meta.etcd.close()

    run(body())


def test_a_requested_move_is_carried_out_and_cleared(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            nodes = Nodes(meta)
            for n in ("n1", "n2", "n3", "n4"):
                await nodes.up(n)
            await meta.create_topic(TopicMeta("t", 1, 3), ["n1", "n2", "n3"])
            coord = Coordinator(EtcdClient([etcd_server.endpoint]), CID, "l", ttl=2)
            coord.start()
            try:
                await eventually(lambda: _true(coord.passes > 0))
                leader = (await meta.partitions("t"))[0].meta.leader
                assert await coord.request_move(MoveRequest("t", 0, leader, "n4"))
                assert not await coord.request_move(MoveRequest("t", 0, leader, "n4"))

                async def catching_up() -> bool:
                    return (await meta.partitions("t"))[0].meta.catchup == ("n4",)

                await eventually(catching_up)
                assert (await coord.moves())  # pending until n4 is in sync
                v = (await meta.partitions("t"))[0]
                assert await meta.update_partition(
                    v, lambda pm: expand_isr(pm, "n4", pm.epoch)) is not None

                async def moved() -> bool:
                    p = (await meta.partitions("t"))[0].meta
                    return p.leader == "n4" and leader not in p.replicas and \
                        not await coord.moves()

                await eventually(moved)
                p = (await meta.partitions("t"))[0].meta
                assert p.epoch == 2 and len(p.replicas) == 3 and len(p.isr) == 3
            finally:
                await coord.close()
                await coord.meta.etcd.close()

    run(body())


def test_forged_leader_and_isr_are_repaired_from_the_live_replicas(
        etcd_server: EtcdServer) -> None:
    """Issue 31: a PUT naming an ISR of a node with no lease made every publish fail and the
    coordinator did not repair it."""
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            meta = ClusterMetadata(etcd, CID)
            nodes = Nodes(meta)
            for n in ("n1", "n2", "n3"):
                await nodes.up(n)
            await meta.create_topic(TopicMeta("t", 2, 3), ["n1", "n2", "n3"])
            coord = Coordinator(EtcdClient([etcd_server.endpoint]), CID, "lookupd-1", ttl=2,
                                rebalance=False)
            coord.start()
            try:
                await eventually(lambda: _true(coord.passes > 0))
                ps = {k: v.meta for k, v in (await meta.partitions("t")).items()}
                # as an attacker with etcd access writes them: unchecked
                forged = {0: PartitionMeta("t", 0, ps[0].replicas, ps[0].leader, ps[0].epoch,
                                           ("ghost",), ()),
                          1: PartitionMeta("t", 1, ps[1].replicas, "ghost", ps[1].epoch,
                                           ("ghost", ps[1].replicas[1]), ())}
                # a record that is not even JSON must not stop the pass over the others
                await etcd.put(meta.keys.partition("junk", 0), b"{not json")
                for p, pm in forged.items():
                    await etcd.put(meta.keys.partition("t", p), pm.to_json())

                async def repaired() -> bool:
                    now = {k: v.meta for k, v in (await meta.partitions("t")).items()}
                    return all("ghost" not in (pm.leader, *pm.isr) and pm.leader is not None
                               for pm in now.values())

                await eventually(repaired, timeout=20)
                now = {k: v.meta for k, v in (await meta.partitions("t")).items()}
                # the live leader kept its epoch; the forged one was replaced with a new one
                assert now[0].leader == ps[0].leader and now[0].epoch == ps[0].epoch
                assert now[0].isr == (ps[0].leader,), now[0]
                assert now[1].leader == ps[1].replicas[1] and now[1].epoch > ps[1].epoch
                for pm in now.values():
                    pm.check()
            finally:
                await coord.close()
                await coord.meta.etcd.close()

    run(body())


def test_an_isr_naming_no_replica_elects_nobody() -> None:
    pm = PartitionMeta("t", 0, ("a", "b"), "ghost", 4, ("ghost",), ())
    out = repair_contradictions(pm, {"a", "b"})
    assert out.leader is None and out.isr == () and out.catchup == ("a", "b")
    assert out.epoch == 5
    assert repair_contradictions(out, {"a", "b"}) == out  # stable: no epoch per pass


def test_reconcile_partition_rebalances_to_the_preferred_replica() -> None:
    pm = PartitionMeta("t", 0, ("a", "b"), "b", 2, ("a", "b"), ())
    out = reconcile_partition(pm, {"a", "b"}, set(), Counter(), 2)
    assert out.leader == "a" and out.epoch == 3
    kept = reconcile_partition(pm, {"a", "b"}, set(), Counter(), 2, rebalance=False)
    assert kept == pm


async def _true(value: bool) -> bool:
    return value
