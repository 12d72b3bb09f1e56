"""The leader's ISR upkeep: drop a follower that stays behind for ``lag_timeout`` and
re-admit one that reached the log end, both by compare-and-swap on the partition's
metadata with the leader's own epoch, which also fences a deposed leader (its CAS fails,
or the metadata names another leader, and it steps down)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from nsqx.cluster.etcd import EtcdError
from nsqx.cluster.gates import LeaderGate
from nsqx.cluster.metadata import ClusterMetadata, Versioned
from nsqx.cluster.model import MetaError, NodeInfo
from nsqx.cluster.placement import expand_isr, shrink_isr

log = logging.getLogger("nsqx.cluster.member")

__all__ = ["IsrUpkeep"]

ISR_EVERY = 0.25  # seconds between two looks at every led partition's followers


class IsrUpkeep:
    """Handed the member's live views (its gates, the registered nodes) and its identity."""

    def __init__(self, meta: ClusterMetadata, gates: Mapping[tuple[str, int], Any],
                 nodes: Mapping[str, NodeInfo], node_id: Callable[[], str]) -> None:
        self.meta = meta
        self.gates = gates
        self.nodes = nodes
        self.node_id = node_id  # a callable: the id is known once the member started

    async def run(self) -> None:
        while True:
            await asyncio.sleep(ISR_EVERY)
            for k, gate in list(self.gates.items()):
                if not isinstance(gate, LeaderGate) or not gate.active:
                    continue
                try:
                    await self.step(k, gate)
                except EtcdError as e:
                    log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): ISR update failed: %s",
                                k[0], k[1], e)
                    # a follower is gone and the ISR cannot shrink without etcd: what waits
                    # for it is refused (a clear E_PUB_FAILED) rather than left hanging
                    # or acked unsafely; publishing resumes once etcd answers again
                    gate.refuse_waiting(f"a follower stopped and etcd is unreachable ({e})")
                except MetaError as e:
                    log.info("CLUSTER: TOPIC(%s) PARTITION(%d): %s", k[0], k[1], e)

    async def step(self, k: tuple[str, int], gate: LeaderGate) -> None:
        me = self.node_id()
        end = gate.topic.log.flushed_offset
        now = time.monotonic()
        gate.progress.isr = set(gate.meta.isr)
        drop = gate.progress.laggards(end, now, me)
        join = [n for n in gate.meta.catchup
                if n in self.nodes and gate.progress.ready_to_join(n, end)]
        if not drop and not join:
            return
        current = (await self.meta.partitions(k[0])).get(k[1])
        if current is None:
            return
        if current.meta.leader != me or current.meta.epoch != gate.meta.epoch:
            gate.deposed(f"metadata says leader {current.meta.leader} epoch {current.meta.epoch}")
            return
        new: Versioned | None = current
        for n in drop:
            log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): follower %s is %d behind for more "
                        "than %.1f s: leaving the ISR", k[0], k[1], n,
                        end - gate.progress.followers[n].end, gate.progress.lag_timeout)
            new = await self.meta.update_partition(
                new, lambda pm, n=n: shrink_isr(pm, n, gate.meta.epoch)) if new else None
        for n in join:
            log.info("CLUSTER: TOPIC(%s) PARTITION(%d): %s caught up: rejoins the ISR", k[0], k[1], n)
            new = await self.meta.update_partition(
                new, lambda pm, n=n: expand_isr(pm, n, gate.meta.epoch)) if new else None
        if new is None:
            return  # lost a race: the watch brings the new state
        gate.on_meta(new.meta)
