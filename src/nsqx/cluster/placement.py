"""The coordinator's decisions as pure functions: placement, leader election, ISR changes.

No I/O here: the coordinator reads metadata from etcd, calls these, and writes the result
back with a compare-and-swap, so every rule is tested on its own (tests/cluster/test_placement.py
and the hypothesis model in test_replication_model.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from nsqx.cluster.model import MetaError, MoveRequest, PartitionMeta

__all__ = [
    "add_replica",
    "elect_leader",
    "expand_isr",
    "load_of",
    "move_leader",
    "move_outcome",
    "move_step",
    "node_lost",
    "place",
    "plan_move",
    "plan_rebalance",
    "preferred_leader_move",
    "remove_replica",
    "shrink_isr",
    "step_down",
]


def load_of(partitions: Iterable[PartitionMeta]) -> tuple[Counter[str], Counter[str]]:
    """(replicas held, leaderships held) per node."""
    replicas: Counter[str] = Counter()
    leaders: Counter[str] = Counter()
    for pm in partitions:
        replicas.update(pm.replicas)
        if pm.leader:
            leaders[pm.leader] += 1
    return replicas, leaders


def place(topic: str, partitions: int, replicas: int, nodes: Sequence[str],
          existing: Iterable[PartitionMeta] = ()) -> list[PartitionMeta]:
    """Assign replicas for a new topic: leaders spread over the least-loaded nodes first,
    followers on the next nodes of the ring, so no node holds a partition twice."""
    live = sorted(set(nodes))
    if replicas > len(live):
        raise MetaError(f"replicator {replicas} is more than the {len(live)} live nodes")
    rep_load, lead_load = load_of(existing)
    order = sorted(live, key=lambda n: (lead_load[n], rep_load[n], n))
    out = []
    for p in range(partitions):
        start = p % len(order)
        ring = order[start:] + order[:start]
        chosen = tuple(ring[:replicas])
        out.append(PartitionMeta(topic, p, chosen, chosen[0], 1, chosen, ()))
    return out


def elect_leader(pm: PartitionMeta, live: Iterable[str],
                 log_ends: Mapping[str, int]) -> PartitionMeta:
    """A new leader from the live ISR members with the longest log (ties: replica order).

    Only ISR members hold every acknowledged message, so nobody else may lead (no unclean
    election): with no live ISR member the partition has no leader until one returns. The
    epoch grows on every change of leader, which fences the deposed one.
    """
    alive = set(live)
    isr = tuple(n for n in pm.isr if n in alive)
    if not isr:
        return replace(pm, leader=None, epoch=pm.epoch + 1)
    best = max(isr, key=lambda n: (log_ends.get(n, -1), -pm.replicas.index(n)))
    return replace(pm.with_isr(isr), leader=best, epoch=pm.epoch + 1)


def node_lost(pm: PartitionMeta, node: str, live: Iterable[str],
              log_ends: Mapping[str, int]) -> PartitionMeta:
    """React to a node's lease ending: a lost follower leaves the ISR, a lost leader is replaced."""
    if node not in pm.replicas:
        return pm
    if pm.leader == node:
        return elect_leader(pm, [n for n in live if n != node], log_ends)
    if node in pm.isr and len(pm.isr) > 1:
        return pm.with_isr(tuple(n for n in pm.isr if n != node))
    # the last in-sync replica stays in the ISR while it is away: it alone holds every
    # acknowledged message, so the partition waits for it rather than forget it
    return pm


def step_down(pm: PartitionMeta, node: str, live: Iterable[str]) -> PartitionMeta:
    """A restarted ``node`` gives up a leadership of its previous run (pure).

    Its log may have lost what it had not fsynced (power loss), yet the metadata still names
    it leader at the same epoch: leading again would make the followers truncate acknowledged
    records to match it. Another live ISR member holds every acknowledged message, so it
    leads at a new epoch and ``node`` leaves the ISR until it has caught up. When no other
    ISR member is live ``node`` keeps leading (nobody better exists: the lone ISR member
    case of docs/cluster.md), at a new epoch all the same: what it writes now may land at
    offsets where a catch-up replica holds records its disk lost, and only a new epoch
    makes that replica truncate them (KIP-101: an epoch per leadership, not per leader).
    """
    if pm.leader != node:
        return pm
    alive = set(live)
    others = [n for n in pm.isr if n != node and n in alive]
    if not others:
        return replace(pm, epoch=pm.epoch + 1)
    return elect_leader(pm, others, {})


def shrink_isr(pm: PartitionMeta, follower: str, epoch: int) -> PartitionMeta:
    """The leader of ``epoch`` drops a follower that stopped keeping up."""
    if epoch != pm.epoch:
        raise MetaError(f"stale epoch {epoch} (current {pm.epoch})")
    if follower == pm.leader:
        raise MetaError("the leader cannot leave its own ISR")
    return pm.with_isr(tuple(n for n in pm.isr if n != follower))


def expand_isr(pm: PartitionMeta, follower: str, epoch: int) -> PartitionMeta:
    """A caught-up replica rejoins (the leader of ``epoch`` vouches it reached its log end)."""
    if epoch != pm.epoch:
        raise MetaError(f"stale epoch {epoch} (current {pm.epoch})")
    if follower not in pm.replicas:
        raise MetaError(f"{follower} is not a replica of {pm.topic}/{pm.partition}")
    if pm.leader is None:
        raise MetaError("no leader to rejoin")
    return pm.with_isr(pm.isr + (follower,))


def move_leader(pm: PartitionMeta, to: str) -> PartitionMeta:
    if to not in pm.isr:
        raise MetaError(f"{to} is not in the ISR {pm.isr}")
    if to == pm.leader:
        return pm
    return replace(pm, leader=to, epoch=pm.epoch + 1)


def preferred_leader_move(pm: PartitionMeta) -> PartitionMeta | None:
    """Leadership back to the first replica (spread by :func:`place`) when it is in sync."""
    pref = pm.replicas[0]
    if pm.leader != pref and pref in pm.isr:
        return move_leader(pm, pref)
    return None


def add_replica(pm: PartitionMeta, node: str) -> PartitionMeta:
    """Start moving a partition onto ``node``: it catches up first, outside the ISR."""
    if node in pm.replicas:
        raise MetaError(f"{node} already holds {pm.topic}/{pm.partition}")
    return replace(pm, replicas=pm.replicas + (node,), catchup=pm.catchup + (node,))


def remove_replica(pm: PartitionMeta, node: str) -> PartitionMeta:
    """Finish a move: ``node`` leaves once another in-sync replica can lead."""
    if node not in pm.replicas:
        return pm
    rest_isr = tuple(n for n in pm.isr if n != node)
    if not rest_isr:
        raise MetaError(f"{node} is the only in-sync replica of {pm.topic}/{pm.partition}")
    if pm.leader == node:
        pm = move_leader(pm, rest_isr[0])
    replicas = tuple(n for n in pm.replicas if n != node)
    return replace(pm, replicas=replicas).with_isr(rest_isr)


# -- operator moves (/topic/partition/move) ------------------------------------------------------
def plan_move(pm: PartitionMeta, *, move_leader: bool, source: str | None, target: str,
              live: Iterable[str], draining: Iterable[str] = ()) -> MoveRequest:
    """Check an operator's move against the partition as it is, and say what it will do.

    Youzan's parameters: ``move_from`` (source), ``move_to`` (target), ``move_leader``
    (needed when the source leads). With ``move_leader`` and a target already in the ISR
    only leadership moves (the source stays a follower); otherwise the target becomes a
    new replica and the source leaves once the target is in sync. Refusals raise
    :class:`MetaError` with a sentence for the operator.
    """
    name = f"{pm.topic}/{pm.partition}"
    alive = set(live)
    if not target:
        raise MetaError("move_to is required")
    if source == target:
        raise MetaError("move_from and move_to are the same node")
    if target not in alive:
        raise MetaError(f"move_to {target} is not a live node of the cluster")
    if target in set(draining):
        raise MetaError(f"move_to {target} is being drained")
    if pm.leader is None:
        raise MetaError(f"{name} has no leader now; move it once it is led again")
    if source is not None and source not in pm.replicas:
        raise MetaError(f"move_from {source} holds no replica of {name} "
                        f"(replicas: {', '.join(pm.replicas)})")
    if move_leader:
        if source is not None and source != pm.leader:
            raise MetaError(f"move_from {source} is not the leader of {name} "
                            f"(leader: {pm.leader})")
        if target == pm.leader:
            raise MetaError(f"move_to {target} already leads {name}")
        if target in pm.isr:
            return MoveRequest(pm.topic, pm.partition, pm.leader, target, leader_only=True)
        if target in pm.replicas:
            raise MetaError(f"move_to {target} is still catching up on {name}; it can lead "
                            "once it is in the ISR")
        return MoveRequest(pm.topic, pm.partition, pm.leader, target)
    if source is None:
        raise MetaError("move_from is required (or move_leader=true to move only leadership "
                        "to an in-sync replica)")
    if source == pm.leader:
        raise MetaError(f"move_from {source} leads {name}: add move_leader=true to move its "
                        "replica and its leadership")
    if target in pm.replicas:
        raise MetaError(f"move_to {target} already holds a replica of {name}")
    return MoveRequest(pm.topic, pm.partition, source, target)


def move_step(pm: PartitionMeta, req: MoveRequest, live: Iterable[str]) -> PartitionMeta:
    """The next step of a pending move (pure; the coordinator applies it on every pass).

    Replica move: add the target outside the ISR; once its leader admitted it to the ISR,
    hand over leadership if the source leads and take the source out (the target takes its
    place in the replica order, so preferred leadership follows). Leader-only move: the
    target leads (with a new epoch) and becomes the preferred replica. A target that died
    before it was in sync is taken back out (the move is then abandoned).
    """
    alive = set(live)
    target, source = req.target, req.source
    if req.leader_only:
        if (target in alive and target in pm.isr and pm.leader is not None
                and pm.leader != target):
            pm = move_leader(pm, target)
            pm = replace(pm, replicas=(target,) + tuple(n for n in pm.replicas if n != target))
            pm = pm.with_isr(pm.isr)
        return pm
    if target not in alive:
        if target in pm.replicas and target not in pm.isr:
            pm = remove_replica(pm, target)
        return pm
    if source is None or source not in pm.replicas:
        return pm  # the source left some other way (a drain): nothing more to do
    if target not in pm.replicas:
        return add_replica(pm, target)
    if target not in pm.isr:
        return pm  # catching up; its leader admits it to the ISR
    if pm.leader == source:
        pm = move_leader(pm, target)
    replicas = tuple(target if n == source else n for n in pm.replicas if n != target)
    return replace(pm, replicas=replicas).with_isr(tuple(n for n in pm.isr if n != source))


def move_outcome(pm: PartitionMeta, req: MoveRequest, live: Iterable[str]) -> str | None:
    """None while a move is under way; else why its request can be cleared."""
    if req.leader_only:
        if pm.leader == req.target:
            return "done"
    elif req.target in pm.isr and (req.source is None or req.source not in pm.replicas):
        return "done"
    if req.target not in set(live):
        return f"abandoned: {req.target} is no longer live"
    if req.target not in pm.replicas and (req.leader_only or req.source not in pm.replicas):
        return f"abandoned: {req.source if not req.leader_only else req.target} no longer " \
               "holds a replica"
    return None


# -- rebalancing onto a node that joined ----------------------------------------------------------
def plan_rebalance(partitions: Iterable[PartitionMeta], live: Iterable[str], *,
                   draining: Iterable[str] = (), moves_pending: bool = False
                   ) -> MoveRequest | None:
    """One replica move onto a live node that holds clearly fewer replicas than the average
    (a node that joined), or None when the spread is even enough or it is not the time.

    Never while a node is draining or any move is pending (one move in flight, carried out
    by :func:`move_step` like an operator's). The target is the least loaded live node, if
    it holds at least one replica fewer than the average; the source the most loaded node
    holding two more than the target (so every move narrows the spread: passes converge).
    Only a partition whose leader is live and whose every replica is live and in the ISR is
    moved (the move itself never drops below its replica count in sync). The source's
    preferred (first) replica slot is taken when the target is at least two preferred slots
    behind it: the target then leads that partition, so leaders spread with the replicas.
    """
    alive = set(live) - set(draining)
    if moves_pending or set(draining) or len(alive) < 2:
        return None
    parts = list(partitions)
    load: Counter[str] = Counter({n: 0 for n in alive})
    pref: Counter[str] = Counter({n: 0 for n in alive})
    for pm in parts:
        for n in pm.replicas:
            if n in alive:
                load[n] += 1
        if pm.replicas and pm.replicas[0] in alive:
            pref[pm.replicas[0]] += 1
    avg = sum(load.values()) / len(alive)
    target = min(alive, key=lambda n: (load[n], pref[n], n))
    if load[target] > avg - 1:
        return None
    movable = [pm for pm in parts
               if pm.leader in alive and target not in pm.replicas and not pm.catchup
               and set(pm.isr) == set(pm.replicas) and set(pm.replicas) <= alive]
    for source in sorted(alive, key=lambda n: (-load[n], -pref[n], n)):
        if load[source] - load[target] < 2:
            break
        mine = [pm for pm in movable if source in pm.replicas]
        if not mine:
            continue
        take_lead = pref[source] - pref[target] >= 2
        best = min(mine, key=lambda pm: ((pm.replicas[0] == source) != take_lead,
                                         pm.topic, pm.partition))
        return MoveRequest(best.topic, best.partition, source, target)
    return None
