"""What a member does once on start, before it takes any role: leaderships of its previous
run are given up.

A leader role belongs to the run (etcd registration) it was granted to. A process that dies
and returns within its lease's TTL finds its old registration alive, so the coordinator sees
no change and the metadata still names it leader at the same epoch, though its log may lack
what it had not fsynced (power loss with the default ``--sync-timeout``). Were it to lead
again, its followers would truncate acknowledged records to match it (KIP-101's problem).
So before its first metadata load it hands each such leadership to another live ISR member
with a guarded transaction (:func:`~nsqx.cluster.placement.step_down`) and then follows it,
truncating to where its log agrees with the new leader's (KIP-279) and catching up. A
leadership nobody else can take (it is the only live ISR member) it keeps, at a new epoch.
"""

from __future__ import annotations

import logging

from nsqx.cluster.metadata import ClusterMetadata
from nsqx.cluster.placement import step_down

log = logging.getLogger("nsqx.cluster.restart")

__all__ = ["step_down_after_restart"]


async def step_down_after_restart(meta: ClusterMetadata, node: str) -> int:
    """Give up every leadership the metadata names ``node`` for; returns how many moved.

    Raises :class:`~nsqx.cluster.etcd.EtcdError` when etcd cannot be reached: the caller
    retries before taking any role. Every write is a compare-and-swap on what was read (the
    coordinator may move the partition meanwhile: read again and decide again).
    """
    live = set(await meta.nodes()) - {node}  # registered; this node's own is of either run
    moved = 0
    for v in (await meta.all_partitions()).values():
        for _ in range(5):
            if v.meta.leader != node:
                break
            new = await meta.update_partition(v, lambda pm: step_down(pm, node, live))
            if new is not None:
                if new.meta.leader != node:
                    moved += 1
                    log.warning("TOPIC(%s) PARTITION(%d): this node led it before it restarted "
                                "and may have lost unsynced records: leadership handed to %s "
                                "(epoch %d); it follows and catches up", new.meta.topic,
                                new.meta.partition, new.meta.leader, new.meta.epoch)
                else:
                    log.info("TOPIC(%s) PARTITION(%d): this node led it before it restarted "
                             "and no other ISR member is live: it keeps leading, at a new epoch %d",
                             new.meta.topic, new.meta.partition, new.meta.epoch)
                break
            fresh = (await meta.partitions(v.meta.topic)).get(v.meta.partition)
            if fresh is None:
                break
            v = fresh
    return moved
