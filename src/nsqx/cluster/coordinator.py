"""The coordinator: the one elected nsqlookupd that keeps every partition led.

It watches the cluster's keys in etcd (no polling) and after every change makes one
reconciling pass over all partitions (the metadata is small): a partition whose leader's
node lease ended gets a new leader from its live ISR with a higher epoch; a dead follower
leaves the ISR; a leaderless partition is led again as soon as an ISR member returns; a
preferred replica that is back in sync gets its leadership back (spreading leaders when a
node joins); a node being drained has its replicas moved (a new replica is added outside
the ISR, the partition's leader admits it once caught up, then the drained one leaves);
an operator's move of one partition (``moves/<topic>/<p>``, from ``/topic/partition/move``)
is carried out the same way, restricted to that partition, and its request is cleared when
it is done (or abandoned because its target died before it was in sync). A live node that
holds clearly fewer replicas than the average (one that joined) gets replicas the same way:
the pass records one move from the most loaded node (:func:`plan_rebalance`) when no move is
pending and no node is draining, and the next passes carry it out.

Every write is a compare-and-swap on what the pass read, so a coordinator that lost its
lease mid-pass cannot overwrite its successor's decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import Counter
from dataclasses import replace

from nsqx.cluster.election import Election
from nsqx.cluster.etcd import Compare, EtcdClient, EtcdError, Op
from nsqx.cluster.metadata import ClusterMetadata, Versioned
from nsqx.cluster.model import MetaError, MoveRequest, PartitionMeta
from nsqx.cluster.outage import Outage
from nsqx.cluster.placement import (
    add_replica,
    elect_leader,
    load_of,
    move_outcome,
    move_step,
    node_lost,
    plan_rebalance,
    preferred_leader_move,
    remove_replica,
)
from nsqx.cluster.route_coord import RouteCoordinator
from nsqx.cluster.trust import Signer

log = logging.getLogger("nsqx.cluster.coordinator")

__all__ = ["Coordinator", "reconcile_partition", "repair_contradictions"]


def repair_contradictions(pm: PartitionMeta, live: set[str]) -> PartitionMeta:
    """A record no member's step could have written (edited or forged in etcd) made
    consistent with the live replicas (pure).

    ISR members that are not replicas leave it; a live leader missing from its own ISR is put
    back (it holds every message of its epoch: it is the reference the ISR is measured by);
    a leader that is no replica, or is gone and not in the ISR, is replaced from the live ISR
    with a new epoch. An ISR left with nobody cannot be guessed (electing a replica that may
    lack acknowledged messages would lose them): the partition waits, logged as an error.
    """
    isr = tuple(n for n in pm.isr if n in pm.replicas)
    leader = pm.leader
    if leader is not None and leader in pm.replicas and leader in live and leader not in isr:
        isr += (leader,)
    fixed = pm if isr == pm.isr and set(pm.catchup) == set(pm.replicas) - set(isr) \
        else pm.with_isr(isr)
    if leader is not None and leader not in fixed.isr:
        fixed = elect_leader(replace(fixed, leader=None), live, {})
    if fixed != pm:
        log.warning("TOPIC(%s) PARTITION(%d): metadata contradicted the live replicas (leader "
                    "%s ISR %s, live: %s): repaired to leader %s ISR %s; who can write to etcd "
                    "controls the cluster (docs/cluster-trust.md)", pm.topic, pm.partition,
                    pm.leader, ",".join(pm.isr), ",".join(sorted(live)), fixed.leader,
                    ",".join(fixed.isr))
        if not fixed.isr:
            log.error("TOPIC(%s) PARTITION(%d): its ISR names no replica: no replica is known "
                      "to hold every acknowledged message, so none is elected; an operator "
                      "must restore the ISR", pm.topic, pm.partition)
    return fixed


def reconcile_partition(pm: PartitionMeta, live: set[str], draining: set[str],
                        replica_load: Counter[str], want: int, *,
                        rebalance: bool = True, move: MoveRequest | None = None) -> PartitionMeta:
    """One partition's next state given who is alive and who is being drained (pure).

    ``want`` is the topic's replica count: a drained node's replica is replaced first and
    leaves only once every other replica is in sync. ``move`` is the operator's pending
    move of this partition, if any (:func:`~nsqx.cluster.placement.move_step`); while it
    is pending leadership is not rebalanced.
    """
    pm = repair_contradictions(pm, live)
    for node in list(pm.replicas):
        if node not in live and (node in pm.isr or pm.leader == node):
            pm = node_lost(pm, node, live, {})
    if pm.leader is None and any(n in live for n in pm.isr):
        pm = elect_leader(pm, live, {})
    if move is not None:
        with contextlib.suppress(MetaError):
            pm = move_step(pm, move, live)
    for node in sorted(draining & set(pm.replicas)):
        healthy = [n for n in pm.replicas if n not in draining]
        if len(healthy) < want:
            candidates = sorted((n for n in live - draining if n not in pm.replicas),
                                key=lambda n: (replica_load[n], n))
            if candidates:
                pm = add_replica(pm, candidates[0])
                replica_load[candidates[0]] += 1
        elif all(n in pm.isr for n in healthy):
            with contextlib.suppress(MetaError):
                pm = remove_replica(pm, node)
    if rebalance and move is None and not draining & set(pm.replicas):
        moved = preferred_leader_move(pm)
        if moved is not None and moved.leader in live:
            pm = moved
    return pm


class Coordinator:
    """Campaigns on start; while elected, reconciles after every change in etcd."""

    def __init__(self, etcd: EtcdClient, cluster_id: str, candidate_id: str, *,
                 ttl: int = 5, rebalance: bool = True, signer: Signer | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.meta = ClusterMetadata(etcd, cluster_id)
        self.candidate_id = candidate_id
        self.rebalance = rebalance
        self.election = Election(etcd, self.meta.keys.coordinator, candidate_id, ttl=ttl,
                                 on_change=self._on_leader_change)
        self._lead_task: asyncio.Task[None] | None = None
        self.passes = 0  # reconciling passes made while leading (for /cluster/stats and tests)
        self.rebalance_moves = 0  # replica moves this coordinator started to spread the load
        self.routes = RouteCoordinator(self.meta, signer, tls)  # route-managed ordered topics' changes
        self._roll_task: asyncio.Task[None] | None = None
        self.outage = Outage(f"coordinator {candidate_id}", log, first=0.5, cap=5.0)

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    @property
    def leader(self) -> str | None:
        return self.election.leader

    def start(self) -> None:
        self.election.start()

    async def close(self) -> None:
        await self._stop_leading()
        await self.election.close()
        await self.routes.close()

    def _on_leader_change(self, _leader: str | None, is_me: bool) -> None:
        if is_me and self._lead_task is None:
            self._lead_task = asyncio.get_running_loop().create_task(
                self._lead(), name="coordinator")
        elif not is_me and self._lead_task is not None:
            asyncio.get_running_loop().create_task(self._stop_leading())

    async def _stop_leading(self) -> None:
        task, self._lead_task = self._lead_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def drain_key(self, node: str) -> bytes:
        return self.meta.keys.root + b"drain/" + node.encode()

    async def _lead(self) -> None:
        log.info("coordinator %s: leading", self.candidate_id)
        rolled = False
        while True:
            try:
                rev = await self.reconcile()
                self.outage.ok()
                if not rolled:  # route changes a previous coordinator left pending
                    rolled = True
                    self._roll_task = asyncio.get_running_loop().create_task(
                        self.routes.roll_forward_all(), name="route roll-forward")
                async for _events in self.meta.watch(self.meta.keys.root, rev + 1):
                    await asyncio.sleep(0.05)  # let a burst of changes land together
                    await self.reconcile()
            except EtcdError as e:
                await self.outage.failed(e)

    async def reconcile(self) -> int:
        """One pass over every partition; returns the etcd revision it read."""
        nodes = await self.meta.nodes()
        drain_kvs, rev = await self.meta.etcd.get_prefix(self.meta.keys.root + b"drain/")
        draining = {kv.key.rsplit(b"/", 1)[-1].decode() for kv in drain_kvs}
        live = set(nodes)
        moves = await self.moves()
        parts = await self.meta.all_partitions()
        topics = await self.meta.topics()
        replica_load, _ = load_of(v.meta for v in parts.values())
        now: list[PartitionMeta] = []
        for v in parts.values():
            t = topics.get(v.meta.topic)
            want = t.replicas if t else len(v.meta.replicas)
            pm = await self._apply(v, live, draining, replica_load, want,
                                   moves.get((v.meta.topic, v.meta.partition)))
            if pm is not None:
                now.append(pm)
        for (topic, p), (_req, mod) in moves.items():
            if (topic, p) not in parts:  # the topic was deleted under the request
                await self._clear_move(topic, p, mod, "abandoned: no such partition")
        if self.rebalance and len(now) == len(parts):
            req = plan_rebalance(now, live, draining=draining, moves_pending=bool(moves))
            if req is not None and await self.request_move(req):
                self.rebalance_moves += 1
                log.info("TOPIC(%s) PARTITION(%d): rebalancing: moving the replica of %s to "
                         "%s (it holds fewer replicas than the average)", req.topic,
                         req.partition, req.source, req.target)
        self.passes += 1
        return max(rev, max((v.mod_revision for v in parts.values()), default=0))

    async def moves(self) -> dict[tuple[str, int], tuple[MoveRequest, int]]:
        """Pending operator moves: (request, mod revision of its key) per partition."""
        kvs, _ = await self.meta.etcd.get_prefix(self.meta.keys.moves)
        out = {}
        for kv in kvs:
            try:
                req = MoveRequest.from_json(kv.value)
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed move request %r", kv.key)
                continue
            out[(req.topic, req.partition)] = (req, kv.mod_revision)
        return out

    async def _clear_move(self, topic: str, p: int, mod: int, why: str) -> None:
        key = self.meta.keys.move(topic, p)
        won, _ = await self.meta.etcd.txn([Compare.mod_revision(key, mod)], [Op.delete(key)])
        if won:
            log.info("TOPIC(%s) PARTITION(%d): move %s", topic, p, why)

    async def _apply(self, v: Versioned, live: set[str], draining: set[str],
                     replica_load: Counter[str], want: int,
                     pending: tuple[MoveRequest, int] | None = None) -> PartitionMeta | None:
        """Reconcile one partition; its state after the pass (None: unknown, e.g. refused)."""
        move = pending[0] if pending else None
        for _ in range(3):
            try:
                new = await self.meta.update_partition(
                    v, lambda pm: reconcile_partition(pm, live, draining, replica_load, want,
                                                      rebalance=self.rebalance, move=move))
            except MetaError as e:
                log.error("TOPIC(%s) PARTITION(%d): %s", v.meta.topic, v.meta.partition, e)
                return None
            if new is not None:
                if pending is not None:
                    outcome = move_outcome(new.meta, pending[0], live)
                    if outcome is not None:
                        await self._clear_move(v.meta.topic, v.meta.partition, pending[1],
                                               outcome)
                return new.meta
            fresh = (await self.meta.partitions(v.meta.topic)).get(v.meta.partition)
            if fresh is None:
                return None
            v = fresh
        return None

    # -- operator requests (lookupd's HTTP API and `nsqx node drain`) ---------------------------
    async def drain(self, node: str) -> None:
        await self.meta.etcd.put(self.drain_key(node), b"1")

    async def undrain(self, node: str) -> None:
        await self.meta.etcd.delete(self.drain_key(node))

    async def request_move(self, req: MoveRequest) -> bool:
        """Record a move for the reconcile passes; False if one is already pending there."""
        key = self.meta.keys.move(req.topic, req.partition)
        won, _ = await self.meta.etcd.txn([Compare.absent(key)], [Op.put(key, req.to_json())])
        return won
