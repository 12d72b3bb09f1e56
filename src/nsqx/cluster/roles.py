"""Roles: every local partition gets the role the cluster's metadata gives it.

The leader's partition gets a :class:`~nsqx.cluster.gates.LeaderGate` (publishes admitted,
acked after the ISR), a follower's a :class:`~nsqx.cluster.gates.FollowerGate` and a fetch
task (:class:`~nsqx.cluster.replica_follower.ReplicaFollower`); a change of epoch switches
roles, and a deposed leader fails what it had not acked. A local partition without a role
(a topic made here by a PUB or SUB, or one the cluster never created) takes no publishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from nsqx.cluster.gates import FollowerGate, LeaderGate, UnknownTopicGate
from nsqx.cluster.model import PartitionMeta, TopicMeta
from nsqx.cluster.replica_follower import ReplicaFollower
from nsqx.cluster.topic_delete import LocalCopies, local_names
from nsqx.nsqd.interfaces import NodeContext, ReplicaPartition

log = logging.getLogger("nsqx.cluster.member")

__all__ = ["RoleHost", "Roles"]


class RoleHost(Protocol):
    """What the roles read of their member: the watched metadata, its identity and nsqd;
    it is also what the gates are handed (``lag_timeout``, ``forward``)."""

    nsqd: NodeContext
    node_id: str
    lag_timeout: float
    partitions: Mapping[tuple[str, int], PartitionMeta]
    topic_meta: Mapping[str, TopicMeta]

    def forward(self, topic: Any, bodies: list[bytes], defer_ms: int,
                headers: list[dict[str, bytes] | None] | None, command: bytes,
                done: Callable, on_replayed: Callable[[], None] | None = None) -> bool: ...


class Roles:
    """Owns nothing but the decisions: the gates dict is the member's, shared with the
    replica server, the ISR upkeep and the route handlers."""

    def __init__(self, host: RoleHost, gates: dict[tuple[str, int], Any],
                 follower: ReplicaFollower, copies: LocalCopies, root: str,
                 sync_routes: Callable[[], None]) -> None:
        self.host = host
        self.gates = gates
        self.follower = follower
        self.copies = copies
        self.root = root  # the cluster's etcd root, named in the refusal of an unknown topic
        self.sync_routes = sync_routes

    def reconcile(self) -> None:
        """Bring every local partition to the role the metadata gives it."""
        self.copies.sweep(self.host.topic_meta, local_names(self.host.nsqd.topics))  # deleted topics
        for k, pm in self.host.partitions.items():
            if self.host.node_id not in pm.replicas:
                self.drop_role(k)
                continue
            tm = self.host.topic_meta.get(pm.topic)
            if self.copies.stale(pm.topic, tm, pm.topic in self.host.nsqd.topics):
                self.drop_role(k)  # an earlier topic's copy: a role once it is deleted
                continue
            topic = self.local_partition(pm.topic, pm.partition)
            if topic is None:
                continue
            if tm is not None:
                self.copies.holds(tm)
            if tm is not None and topic.sync_every != tm.sync_every:
                topic.set_sync_every(tm.sync_every)  # the topic's fsync policy, on every replica
            gate = self.gates.get(k)
            if pm.leader == self.host.node_id:
                if isinstance(gate, LeaderGate) and gate.meta.epoch == pm.epoch and gate.active:
                    gate.on_meta(pm)
                    continue
                self.become_leader(k, topic, pm)
            else:
                if isinstance(gate, FollowerGate) and self.follower.is_following(k, pm):
                    continue
                self.become_follower(k, topic, pm)
        for k in [k for k in self.gates if k not in self.host.partitions]:
            self.drop_role(k)
        for topic in list(self.host.nsqd.topics.values()):
            if not topic.ephemeral:
                for part in topic.partitions:
                    self.guard(part)
        self.sync_routes()

    def guard(self, part: ReplicaPartition) -> None:
        """A local partition this node holds no role for may not take publishes."""
        part.hold_reads_from_start()
        k = (part.name, part.partition)
        if k in self.gates:
            return
        if part.name not in self.host.topic_meta:
            if not isinstance(part.gate, UnknownTopicGate):
                part.attach_gate(UnknownTopicGate(self.root))
        else:
            pm = self.host.partitions.get(k)
            part.attach_gate(FollowerGate(pm.leader if pm else None, self.host))

    def on_new_topic(self, topic: Any) -> None:
        """A topic this node made (a PUB or SUB to a new name): not writable unless the
        cluster made this node its leader, so nothing is ever acknowledged unreplicated."""
        if not topic.ephemeral:
            for part in topic.partitions:
                self.guard(part)

    def local_partition(self, name: str, p: int) -> Any:
        topic = self.host.nsqd.get_topic(name)
        if topic is None:
            return None
        parts = topic.partitions
        tm = self.host.topic_meta.get(name)
        if p < len(parts) and not (tm is not None and tm.ordered and not topic.ordered):
            return parts[p]
        if tm is not None:
            # more partitions than this node has, or an ordered topic it holds as plain (a
            # one-partition ordered topic was created here as a plain one)
            self.host.nsqd.ensure_partitions(name, tm.partitions, ordered=tm.ordered)
            parts = topic.partitions
            if p < len(parts):
                return parts[p]
        log.error("CLUSTER: TOPIC(%s) PARTITION(%d): this nsqd cannot hold partition %d",
                  name, p, p)
        return None

    def become_leader(self, k: tuple[str, int], topic: ReplicaPartition,
                      pm: PartitionMeta) -> None:
        self.follower.stop(k)
        old = self.gates.get(k)
        if isinstance(old, LeaderGate):
            old.deposed("new epoch")
        tm = self.host.topic_meta.get(pm.topic)
        min_isr = tm.effective_min_isr if tm else min(2, len(pm.replicas))
        gate = LeaderGate(self.host, topic, pm, min_isr)
        topic.attach_gate(gate, pm.epoch)
        self.gates[k] = gate
        topic.restore_deferred()  # before anything is delivered: DPUBs due later stay deferred
        gate.release()  # reads go on from this node's high watermark as the ISR catches up
        log.info("CLUSTER: TOPIC(%s) PARTITION(%d): leading at epoch %d, ISR %s, log end %d",
                 pm.topic, pm.partition, pm.epoch, ",".join(pm.isr), topic.log.flushed_offset)

    def become_follower(self, k: tuple[str, int], topic: ReplicaPartition,
                        pm: PartitionMeta) -> None:
        old = self.gates.get(k)
        if isinstance(old, LeaderGate):
            old.deposed(f"deposed by epoch {pm.epoch}")
            log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): no longer leader (epoch %d, leader %s)",
                        pm.topic, pm.partition, pm.epoch, pm.leader)
        self.follower.stop(k)
        gate = FollowerGate(pm.leader, self.host)
        topic.attach_gate(gate, pm.epoch)
        for ch in list(topic.channels.values()):  # they find the leader again through lookupd
            for client in list(ch.clients.values()):
                log.info("CLUSTER: TOPIC(%s) PARTITION(%d) CHANNEL(%s): closing consumer %s: "
                         "this node no longer leads", pm.topic, pm.partition, ch.name, client)
                client.close()
        self.gates[k] = gate
        if pm.leader is not None:
            self.follower.start(k, topic, pm)

    def drop_role(self, k: tuple[str, int]) -> None:
        self.follower.stop(k)
        gate = self.gates.pop(k, None)
        if isinstance(gate, LeaderGate):
            gate.deposed("no longer a replica")
            for ch in list(gate.topic.channels.values()):  # moved away: they follow lookupd
                for client in list(ch.clients.values()):
                    client.close()
