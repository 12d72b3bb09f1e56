"""The cluster's metadata in etcd: typed reads and the only writes anybody makes.

Writes that decide something (create a topic, change a partition's leader, epoch or ISR)
are transactions conditioned on what the writer read, so two writers (a coordinator that
has just lost its lease and its successor, a leader and the coordinator) can never both
win: the loser re-reads and decides again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable

from nsqx.cluster.etcd import Compare, EtcdClient, Op, WatchEvent
from nsqx.cluster.model import ClusterKeys, MetaError, NodeInfo, PartitionMeta, TopicMeta
from nsqx.cluster.placement import place
from nsqx.cluster.route_store import passes_prefix, resets_prefix
from nsqx.protocol.names import valid_name
from nsqx.protocol.routes import routes_key

log = logging.getLogger("nsqx.cluster.metadata")

__all__ = ["ClusterMetadata", "Versioned"]


class Versioned:
    """A partition's metadata with the etcd revision it was read at (for the CAS)."""

    __slots__ = ("meta", "mod_revision")

    def __init__(self, meta: PartitionMeta, mod_revision: int) -> None:
        self.meta = meta
        self.mod_revision = mod_revision

    def __repr__(self) -> str:
        return f"Versioned({self.meta!r}, rev={self.mod_revision})"


class ClusterMetadata:
    def __init__(self, etcd: EtcdClient, cluster_id: str) -> None:
        self.etcd = etcd
        self.keys = ClusterKeys(cluster_id)

    # -- nodes --------------------------------------------------------------------------------
    async def register_node(self, info: NodeInfo, lease: int) -> None:
        await self.etcd.put(self.keys.node(info.id), info.to_json(), lease=lease)

    async def nodes(self) -> dict[str, NodeInfo]:
        kvs, _ = await self.etcd.get_prefix(self.keys.nodes)
        out = {}
        for kv in kvs:
            try:
                info = NodeInfo.from_json(kv.value)
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed node record %r", kv.key)
                continue
            out[info.id] = info
        return out

    # -- topics -------------------------------------------------------------------------------
    async def topic(self, name: str) -> TopicMeta | None:
        kv = await self.etcd.get(self.keys.topic(name))
        return TopicMeta.from_json(kv.value) if kv else None

    async def topics(self) -> dict[str, TopicMeta]:
        kvs, _ = await self.etcd.get_prefix(self.keys.topics)
        return {t.name: t for t in (TopicMeta.from_json(kv.value) for kv in kvs)}

    async def create_topic(self, meta: TopicMeta, nodes: list[str]) -> list[PartitionMeta]:
        """Create a topic and place its partitions in one transaction.

        Creating it again with the same shape is a no-op that returns the placement (so a
        retried create is safe); with another partition count or replica count it is refused.
        """
        existing = await self.topic(meta.name)
        if existing is not None:
            return await self._same_or_refuse(existing, meta)
        if not meta.incarnation:
            meta = dataclasses.replace(meta, incarnation=time.time_ns())
        if meta.effective_min_isr > len(nodes):
            raise MetaError(f"min ISR {meta.effective_min_isr} is more than the "
                            f"{len(nodes)} live nodes")
        current = [v.meta for v in (await self.all_partitions()).values()]
        parts = place(meta.name, meta.partitions, meta.replicas, nodes, current)
        ops = [Op.put(self.keys.topic(meta.name), meta.to_json())]
        ops += [Op.put(self.keys.partition(meta.name, p.partition), p.to_json()) for p in parts]
        won, _ = await self.etcd.txn([Compare.absent(self.keys.topic(meta.name))], ops)
        if not won:  # created by somebody else meanwhile
            again = await self.topic(meta.name)
            assert again is not None
            return await self._same_or_refuse(again, meta)
        log.info("TOPIC(%s): created with %d partitions x %d replicas: %s", meta.name,
                 meta.partitions, meta.replicas,
                 ", ".join(f"{p.partition}->{p.leader}" for p in parts))
        return parts

    async def _same_or_refuse(self, existing: TopicMeta, meta: TopicMeta) -> list[PartitionMeta]:
        if (existing.partitions, existing.replicas, existing.ordered) != (
                meta.partitions, meta.replicas, meta.ordered):
            raise MetaError(
                f"topic {meta.name} already exists with {existing.partitions} partitions x "
                f"{existing.replicas} replicas{' (ordered)' if existing.ordered else ''}")
        return [v.meta for v in (await self.partitions(meta.name)).values()]

    async def delete_topic(self, name: str) -> int:
        """Remove a topic from the cluster (``/topic/delete`` on nsqlookupd or a member):
        its partitions first, so no member sees partitions of a topic it does not know,
        then the topic, its route-managed state and its archive record. Every member that
        holds a replica deletes its copy when the watch shows the topic gone. Returns the
        keys deleted (0: no such topic)."""
        root = self.keys.root
        n = await self.etcd.delete(self.keys.topic_partitions(name), prefix=True)
        n += await self.etcd.delete(self.keys.topic(name))
        if valid_name(name):
            for prefix in (passes_prefix(root), resets_prefix(root)):
                await self.etcd.delete(prefix + name.encode() + b"/", prefix=True)
            n += await self.etcd.delete(routes_key(root, name))
        # the archive record: the next topic of this name has another incarnation, which
        # its archive keys carry, so it neither adopts nor overwrites this one's files
        await self.etcd.delete(self.keys.archive_topic(name), prefix=True)
        if n:
            log.info("TOPIC(%s): deleted from the cluster", name)
        return n

    # -- partitions ---------------------------------------------------------------------------
    async def partitions(self, topic: str) -> dict[int, Versioned]:
        kvs, _ = await self.etcd.get_prefix(self.keys.topic_partitions(topic))
        out = {v.meta.partition: v for v in _versioned(kvs)}
        return dict(sorted(out.items()))

    async def all_partitions(self) -> dict[tuple[str, int], Versioned]:
        kvs, _ = await self.etcd.get_prefix(self.keys.partitions)
        return {(v.meta.topic, v.meta.partition): v for v in _versioned(kvs)}

    async def update_partition(self, current: Versioned,
                               change: Callable[[PartitionMeta], PartitionMeta]) -> Versioned | None:
        """Apply ``change`` if nobody wrote the partition since ``current`` was read.

        Returns the new version, or None when the CAS lost (re-read and decide again).
        Refuses a change that breaks an invariant or lowers the epoch.
        """
        new = change(current.meta)
        if new == current.meta:
            return current
        new.check()
        if new.epoch < current.meta.epoch:
            raise MetaError(f"epoch may not go back ({current.meta.epoch} -> {new.epoch})")
        key = self.keys.partition(new.topic, new.partition)
        won, rev = await self.etcd.txn([Compare.mod_revision(key, current.mod_revision)],
                                       [Op.put(key, new.to_json())])
        if not won:
            return None
        if new.leader != current.meta.leader or new.isr != current.meta.isr:
            log.info("TOPIC(%s) PARTITION(%d): leader %s epoch %d ISR %s (was %s epoch %d ISR %s)",
                     new.topic, new.partition, new.leader, new.epoch, ",".join(new.isr),
                     current.meta.leader, current.meta.epoch, ",".join(current.meta.isr))
        return Versioned(new, rev)

    async def watch(self, prefix: bytes, start_revision: int = 0
                    ) -> AsyncIterator[list[WatchEvent]]:
        async for events in self.etcd.watch_prefix(prefix, start_revision):
            yield events


def _versioned(kvs: list) -> list[Versioned]:
    """Partition records as read, a malformed one (written by hand or by an attacker with
    etcd access) skipped with a warning: it must not stop the coordinator's pass over the
    others."""
    out = []
    for kv in kvs:
        try:
            out.append(Versioned(PartitionMeta.from_json(kv.value), kv.mod_revision))
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed partition record %r", kv.key)
    return out
