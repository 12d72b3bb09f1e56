"""Route changes of route-managed ordered topics in a cluster, carried out by the coordinator.

A standalone nsqd runs a change itself (:meth:`nsqx.nsqd.routing.TopicRoutes.change`). In a
cluster the physical partitions are cluster partitions (replicated, each with a leader), so
the elected coordinator runs the same steps across nodes, every write a CAS in etcd:

1. **pending**: ``op(history)`` checks the rules (:class:`~nsqx.protocol.routes.RouteHistory`:
   one change at a time, a boundary strictly inside, adjacent merges, a live target node);
   one transaction stores the pending history with a CAS on ``routes/<topic>``, the new
   physical partitions (placed with replicas: the route's node leads, the least-loaded
   other live nodes follow) and the topic's partition count. Every node's member sees the
   pending history in its watch: the retired partitions refuse publishes from then on.
2. **ready**: the new partitions' leaders report ``leader`` in ``/nsqx/cluster/state`` (so
   the producers that route by the committed version find them serving).
3. **seal**: the leader of each retired partition appends the command message and answers
   once its ISR has it (``POST /nsqx/route/seal`` on the node, :mod:`nsqx.cluster.route_handlers`).
4. **commit**: the version becomes the newest with a CAS; nodes learn it from their watch,
   and channels advance through the cross-node barrier (``route_passed/`` keys).

A change interrupted after step 1 (the coordinator died, a leader did not answer) stays
pending: every further change is refused with the rule's text until the coordinator rolls
it forward (:meth:`RouteCoordinator.roll_forward_all`, run when a coordinator is elected).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from nsqx.cluster.etcd import Compare, EtcdError, KeyValue, Op
from nsqx.cluster.metadata import ClusterMetadata
from nsqx.cluster.model import MetaError, NodeInfo, PartitionMeta, TopicMeta
from nsqx.cluster.placement import load_of, place
from nsqx.cluster.route_store import (
    EtcdRouteStore,
    ResetRecord,
    pass_key,
    reset_key,
    routes_prefix,
)
from nsqx.cluster.trust import SignedSession, Signer
from nsqx.protocol.routes import RouteError, RouteHistory, routes_key
from nsqx.protocol.v2 import StartKind, StartPosition

log = logging.getLogger("nsqx.cluster.routes")

__all__ = ["ResetPlan", "ResetRefused", "RouteCoordinator", "check_reset", "place_created",
           "relabel_dead_nodes", "reset_target"]

class ResetRefused(Exception):
    """A channel reset that was refused or could not be done; nothing was changed.
    ``status`` (400, 404 or 503) and ``code`` are lookupd's answer, the text its detail."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code = status, code


STEP_TIMEOUT = 15.0  # seconds each of "ready" and "seal" may take before the change is left pending


def place_created(topic: str, history: RouteHistory, replicas: int, live: list[str],
                  current: list[PartitionMeta]) -> list[PartitionMeta]:
    """PartitionMeta of the partitions the pending change creates (pure): the route's node
    leads, followers are the least-loaded other live nodes. RouteError if the route names a
    node that is not live or there are too few nodes."""
    ch = history.pending_change
    assert ch is not None and history.pending is not None
    load, _ = load_of(current)
    out = []
    for p in ch.created:
        route = history.pending.get(p)
        assert route is not None
        if route.node not in live:
            raise RouteError(f"topic {topic}: node {route.node} is not a live node (live: "
                             f"{', '.join(sorted(live))})")
        if replicas > len(live):
            raise RouteError(f"topic {topic}: replicator {replicas} is more than the "
                             f"{len(live)} live nodes")
        others = sorted((n for n in live if n != route.node), key=lambda n: (load[n], n))
        reps = (route.node, *others[:replicas - 1])
        load.update(reps)
        out.append(PartitionMeta(topic, p, reps, route.node, 1, reps, ()))
    return out


def relabel_dead_nodes(old: RouteHistory, new: RouteHistory, live: list[str],
                       leaders: dict[int, str | None]) -> RouteHistory:
    """A split or merge puts its new partitions on the retired partition's route node by
    default: a label from when that partition was created, which may be a node that has
    since died (its partitions failed over). Then use the retired partition's current
    leader (or the first live node). A move names its node on purpose: left as it is."""
    ch, pend = new.pending_change, new.pending
    assert ch is not None and pend is not None
    if ch.kind == "move" or not live:
        return new
    nodes = [pend.get(p) for p in ch.created]
    if all(r is not None and r.node in live for r in nodes):
        return new
    node = leaders.get(ch.retired[0])
    if node not in live:
        node = sorted(live)[0]
    if ch.kind == "split":
        second = nodes[1]
        assert second is not None
        return old.split(ch.retired[0], second.lo, nodes=(node, node))
    return old.merge(ch.retired[0], ch.retired[1], node=node)


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """What a channel reset read before any node holds the channel (see
    :meth:`RouteCoordinator.reset_channel`)."""

    topic: str
    store: EtcdRouteStore
    history: RouteHistory
    version: int  # the route version the channel walks again from
    to: str  # the position as the nodes' prepare step reads it
    nodes: dict[str, NodeInfo]  # the live nodes
    leaders: dict[int, str | None]  # partition -> its leader (partitions etcd knows)
    rkey: bytes  # route_reset/<topic>/<channel>
    last: KeyValue | None  # the channel's last reset record, None before its first

    def require_live_leaders(self) -> None:
        """ResetRefused E_NO_LEADER unless every physical partition has a live leader."""
        missing = [p for p in range(self.history.next_partition)
                   if self.leaders.get(p) not in self.nodes]
        if missing:
            raise ResetRefused(503, "E_NO_LEADER",
                               f"topic {self.topic}: partitions {missing} have no live leader")


def reset_target(h: RouteHistory, pos: StartPosition, now_ms: int) -> tuple[int, str]:
    """The route version a reset to ``pos`` walks again from, and ``pos`` as the nodes read
    it; ResetRefused for a time in the future or a per-partition offset (pure)."""
    if pos.kind is StartKind.TIMESTAMP and pos.value * 1000 > now_ms:
        raise ResetRefused(400, "E_INVALID",
                           f"timestamp {pos.value} is in the future (now "
                           f"{now_ms // 1000}): nothing to replay from there")
    try:
        return h.restart_version(pos), pos.to_text()
    except RouteError as e:
        raise ResetRefused(400, "E_INVALID", str(e)) from None


def check_reset(plan: ResetPlan, channel: str, pos: StartPosition,
                reports: dict[str, dict]) -> tuple[dict[int, int], frozenset[int]]:
    """Step 2 (pure): every physical partition answered by its leader, the channel exists
    on one, no position the walk needs was deleted by retention. Returns each partition's
    offset and the retired partitions the channel is already beyond; ResetRefused."""
    h, topic, leaders = plan.history, plan.topic, plan.leaders
    want = range(h.next_partition)
    offsets: dict[int, int] = {}
    exists = False
    for p in want:
        r = reports.get(leaders[p] or "", {}).get(str(p))
        if r is None:
            raise ResetRefused(503, "E_NO_LEADER",
                               f"topic {topic}: partition {p}'s leader "
                               f"{leaders[p]} does not lead it yet")
        exists = exists or r["channel"]
        retired = h.retired_in(p)
        walked = retired is None or retired > plan.version
        if walked and r["start"] > 0 and r["offset"] <= r["start"] and \
                pos.kind is not StartKind.LATEST:
            raise ResetRefused(400, "E_RETENTION",
                               f"topic {topic}: partition {p} keeps offsets "
                               f"{r['start']}..{r['end']} only (retention deleted "
                               f"the messages before); the reset would walk it "
                               f"again from where they were")
        if retired is not None and retired <= h.newest.version and \
                r["command"] is None:
            raise ResetRefused(503, "E_NOT_SEALED",
                               f"topic {topic}: retired partition {p} has no "
                               f"command message on its leader {leaders[p]}")
        offsets[p] = r["offset"]
    if not exists:
        raise ResetRefused(404, "CHANNEL_NOT_FOUND",
                           f"channel {channel} of topic {topic} exists on no "
                           f"partition leader")
    passed = frozenset(p for p in want if h.retired_in(p) is not None
                       and offsets[p] > reports[leaders[p] or ""][str(p)]["command"])
    return offsets, passed


class RouteCoordinator:
    """The coordinator's route operations (lookupd's HTTP handlers call them)."""

    def __init__(self, meta: ClusterMetadata, signer: Signer | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.meta = meta
        self._session = SignedSession(signer, ssl=tls)  # calls to nodes' internal endpoints
        self._rolling: set[str] = set()
        self._resetting: set[str] = set()  # topics with a channel reset under way

    def _http(self) -> SignedSession:
        return self._session

    async def close(self) -> None:
        await self._session.close()

    def store(self, topic: str) -> EtcdRouteStore:
        return EtcdRouteStore(self.meta.etcd, self.meta.keys.root, topic)

    async def history(self, topic: str) -> RouteHistory | None:
        return await self.store(topic).fetch()

    # -- creation ---------------------------------------------------------------------------
    async def create(self, tm: TopicMeta, logical: int) -> tuple[RouteHistory, list[PartitionMeta]]:
        """A route-managed ordered topic: partitions placed as any cluster topic's, version 0
        mapping ``logical`` partitions over them (each range labelled with its leader), all in
        one transaction. The same shape again returns what exists; another is refused."""
        store = self.store(tm.name)
        existing = await self.meta.topic(tm.name)
        if existing is not None:
            return await self._same_or_refuse(store, tm, logical)
        nodes = sorted(await self.meta.nodes())
        if tm.effective_min_isr > len(nodes):
            raise MetaError(f"min ISR {tm.effective_min_isr} is more than the {len(nodes)} "
                            f"live nodes")
        current = [v.meta for v in (await self.meta.all_partitions()).values()]
        parts = place(tm.name, tm.partitions, tm.replicas, nodes, current)
        history = RouteHistory.initial(tm.name, [p.leader or "" for p in parts], logical,
                                       now_ms=time.time_ns() // 1_000_000)
        key = routes_key(self.meta.keys.root, tm.name)
        ops = [Op.put(self.meta.keys.topic(tm.name), tm.to_json()), Op.put(key, history.to_json())]
        ops += [Op.put(self.meta.keys.partition(tm.name, p.partition), p.to_json()) for p in parts]
        won, _ = await self.meta.etcd.txn(
            [Compare.absent(self.meta.keys.topic(tm.name)), Compare.absent(key)], ops)
        if not won:
            return await self._same_or_refuse(store, tm, logical)
        log.info("TOPIC(%s): route-managed, %d logical over %d partitions x %d replicas",
                 tm.name, logical, tm.partitions, tm.replicas)
        return history, parts

    async def _same_or_refuse(self, store: EtcdRouteStore, tm: TopicMeta, logical: int
                              ) -> tuple[RouteHistory, list[PartitionMeta]]:
        h = await store.fetch()
        existing = await self.meta.topic(tm.name)
        if h is None or existing is None or h.logical != logical or \
                len(h.versions[0].routes) != tm.partitions or existing.replicas != tm.replicas:
            what = (f"{len(h.versions[0].routes)} partitions over {h.logical} logical"
                    if h is not None else "without routes")
            raise MetaError(f"topic {tm.name} already exists ({what})")
        return h, [v.meta for v in (await self.meta.partitions(tm.name)).values()]

    # -- changes ----------------------------------------------------------------------------
    async def change(self, topic: str, op: Callable[[RouteHistory], RouteHistory]
                     ) -> RouteHistory:
        """Run one split, merge or move to its commit. RouteError (the rule's text) if
        refused; TimeoutError if a step did not finish (the change stays pending and is rolled
        forward later)."""
        return await self._roll_forward(*await self.propose(topic, op))

    async def propose(self, topic: str, op: Callable[[RouteHistory], RouteHistory]
                      ) -> tuple[EtcdRouteStore, RouteHistory]:
        """Step 1 alone: store the change as pending with its placed partitions (CAS).
        Returns the store and the pending history (what :meth:`_roll_forward` finishes)."""
        store = self.store(topic)
        old = await store.fetch()
        if old is None:
            raise RouteError(f"topic {topic} is not a route-managed topic in this cluster")
        if topic in self._resetting:
            raise RouteError(f"topic {topic}: a channel reset is under way; change the route "
                             f"after it")
        new = op(old)  # refuses a second change while one is pending
        tm = await self.meta.topic(topic)
        if tm is None:
            raise RouteError(f"topic {topic} has routes but no topic record")
        live = sorted(await self.meta.nodes())
        parts = await self.meta.all_partitions()
        current = [v.meta for v in parts.values()]
        new = relabel_dead_nodes(old, new, live, {p: v.meta.leader for (t, p), v in
                                                  parts.items() if t == topic})
        created = place_created(topic, new, tm.replicas, live, current)
        grown = TopicMeta(tm.name, max(tm.partitions, new.next_partition), tm.replicas,
                          tm.sync_every, True, tm.min_isr)
        ops = [Op.put(self.meta.keys.topic(topic), grown.to_json())]
        ops += [Op.put(self.meta.keys.partition(topic, p.partition), p.to_json())
                for p in created]
        await store.replace(old, new, ops)
        ch = new.pending_change
        assert ch is not None
        log.info("TOPIC(%s): %s to route version %d pending (retires %s, creates %s on %s)",
                 topic, ch.kind, ch.version, list(ch.retired), list(ch.created),
                 ", ".join(p.leader or "?" for p in created))
        return store, new

    async def _roll_forward(self, store: EtcdRouteStore, pending: RouteHistory) -> RouteHistory:
        ch = pending.pending_change
        assert ch is not None and pending.pending is not None
        topic = pending.topic
        self._rolling.add(topic)
        try:
            await self._wait_ready(topic, ch.created)
            await asyncio.gather(*(self._seal(topic, p, ch.version) for p in ch.retired))
            done = pending.commit(ch.version, time.time_ns() // 1_000_000)
            await store.replace(pending, done)
        finally:
            self._rolling.discard(topic)
        log.info("TOPIC(%s): route version %d committed (%s: %s -> %s)", topic, ch.version,
                 ch.kind, list(ch.retired), list(ch.created))
        return done

    async def roll_forward_all(self) -> None:
        """Finish every change left pending (a coordinator that died between pending and
        commit): run when this coordinator is elected."""
        kvs, _ = await self.meta.etcd.get_prefix(routes_prefix(self.meta.keys.root))
        for kv in kvs:
            try:
                h = RouteHistory.from_json(kv.value)
            except RouteError as e:
                log.error("ignoring a malformed route history %r: %s", kv.key, e)
                continue
            if h.pending is None or h.topic in self._rolling:
                continue
            store = self.store(h.topic)
            if await store.fetch() != h:
                continue
            log.warning("TOPIC(%s): rolling forward the pending change to route version %d",
                        h.topic, h.pending.version)
            try:
                await self._roll_forward(store, h)
            except (TimeoutError, RouteError) as e:
                log.error("TOPIC(%s): roll-forward failed: %s", h.topic, e)

    async def _leader(self, topic: str, p: int) -> tuple[PartitionMeta | None, NodeInfo | None]:
        v = (await self.meta.partitions(topic)).get(p)
        if v is None or v.meta.leader is None:
            return (v.meta if v else None), None
        return v.meta, (await self.meta.nodes()).get(v.meta.leader)

    async def _wait_ready(self, topic: str, parts: tuple[int, ...]) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT
        todo = set(parts)
        while todo:
            for p in sorted(todo):
                pm, node = await self._leader(topic, p)
                if pm is None or node is None:
                    continue
                try:
                    async with self._http().get(
                            f"http://{node.internal_address}/nsqx/cluster/state") as r:
                        state = orjson.loads(await r.read()) if r.status == 200 else {}
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                    continue
                if any(e["topic"] == topic and e["partition"] == p and e["role"] == "leader"
                       and e.get("epoch") == pm.epoch for e in state.get("partitions", ())):
                    todo.discard(p)
            if todo:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {topic}: new partitions {sorted(todo)} have no "
                                       f"serving leader after {STEP_TIMEOUT:.0f} s; the change "
                                       f"stays pending")
                await asyncio.sleep(0.05)

    async def _seal(self, topic: str, p: int, version: int) -> None:
        """Have p's leader append the command message of ``version`` (idempotent there)."""
        deadline = time.monotonic() + STEP_TIMEOUT
        last = "no leader"
        while time.monotonic() < deadline:
            _pm, node = await self._leader(topic, p)
            if node is not None:
                try:
                    async with self._http().post(
                            f"http://{node.internal_address}/nsqx/route/seal",
                            params={"topic": topic, "partition": str(p),
                                    "version": str(version)},
                            timeout=aiohttp.ClientTimeout(total=STEP_TIMEOUT)) as r:
                        body = await r.read()
                        if r.status == 200:
                            return
                        last = f"{node.id}: HTTP {r.status} {body[:200]!r}"
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    last = f"{node.id}: {e!r}"
            await asyncio.sleep(0.1)
        raise TimeoutError(f"topic {topic}: partition {p} not sealed for route version "
                           f"{version} ({last}); the change stays pending")

    # -- channel reset ----------------------------------------------------------------------
    async def reset_channel(self, topic: str, channel: str, pos: StartPosition,
                            now_ms: int | None = None) -> dict[str, Any]:
        """Reset ``channel`` of a route-managed topic on every node at once (lookupd's
        ``POST /channel/setoffset``); the mechanism is in docs/design-notes.md, "Channel
        reset in a cluster":

        1. **prepare**: every live node holds the channel (delivers nothing of it, so no
           barrier pass can be recorded meanwhile, and waits for passes under way) and
           reports, per partition it leads, where ``pos`` is, its log's bounds and its
           command message's offset;
        2. **check**: every physical partition answered by its leader, the channel exists,
           no position the walk needs was deleted by retention;
        3. **commit**, one etcd transaction guarded by the route history's and the reset
           record's mod revisions (so a route change started meanwhile makes it fail):
           delete the channel's pass keys of the retired partitions the channel now walks
           again, keep those it is already beyond, and write ``route_reset/<topic>/<channel>``
           (generation + 1, the route version it restarts on, each partition's offset);
        4. **apply**: every node moves its led partitions' cursors, restarts the channel's
           barrier on that version with the passes etcd holds, and delivers again.

        Any refusal before step 3 releases the holds and changes nothing (ResetRefused).
        """
        if topic in self._resetting:
            raise ResetRefused(400, "E_RESET_IN_PROGRESS",
                               f"topic {topic}: another channel reset is under way")
        self._resetting.add(topic)
        nodes: dict[str, NodeInfo] = {}
        try:
            plan = await self._reset_read(topic, channel, pos, now_ms)
            nodes = plan.nodes  # from here a refusal releases every live node
            plan.require_live_leaders()
            reports = await self._reset_prepare(topic, channel, plan.to, nodes)
            offsets, passed = check_reset(plan, channel, pos, reports)
            gen = await self._reset_commit(plan, channel, offsets, passed)
        except BaseException:
            await self._reset_release(topic, channel, nodes)
            self._resetting.discard(topic)
            raise
        h, version = plan.history, plan.version
        try:
            log.info("TOPIC(%s) CHANNEL(%s): reset %d committed (%s: route version %d, "
                     "walks again %s)", topic, channel, gen, plan.to, version,
                     sorted(p for p in offsets if p not in passed and
                            (h.retired_in(p) or 1 << 30) > version))
            unapplied = await self._reset_apply(topic, channel, gen, nodes)
        finally:
            self._resetting.discard(topic)
        return {"topic": topic, "channel": channel, "route_version": version, "gen": gen,
                "partitions": {str(p): o for p, o in sorted(offsets.items())},
                "passed": sorted(passed), "unapplied": unapplied}

    async def _reset_read(self, topic: str, channel: str, pos: StartPosition,
                          now_ms: int | None) -> ResetPlan:
        """Before step 1: the topic's route history, the version ``pos`` restarts on, the
        live nodes, each partition's leader and the channel's last reset record."""
        try:
            store = self.store(topic)
            h = await store.fetch()
            if h is None:
                raise ResetRefused(404, "TOPIC_NOT_FOUND",
                                   f"no route-managed topic {topic} in this cluster")
            if h.pending is not None:
                ch = h.pending_change
                assert ch is not None
                raise ResetRefused(400, "E_ROUTE_CHANGE_PENDING",
                                   f"topic {topic}: {ch.kind} to route version "
                                   f"{ch.version} is still pending; reset the channel "
                                   f"after it commits")
            now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
            version, to = reset_target(h, pos, now)
            nodes = await self.meta.nodes()
            parts = {p: v.meta for (t, p), v in (await self.meta.all_partitions()).items()
                     if t == topic}
            rkey = reset_key(self.meta.keys.root, topic, channel)
            last = await self.meta.etcd.get(rkey)
        except EtcdError as e:
            raise ResetRefused(503, "E_CLUSTER_UNAVAILABLE", str(e)) from None
        leaders = {p: parts[p].leader for p in range(h.next_partition) if p in parts}
        return ResetPlan(topic, store, h, version, to, nodes, leaders, rkey, last)

    async def _reset_commit(self, plan: ResetPlan, channel: str, offsets: dict[int, int],
                            passed: frozenset[int]) -> int:
        """Step 3: one etcd transaction, guarded by the route history's and the reset
        record's mod revisions, writes the pass keys and the new reset record; its gen."""
        h, topic, root = plan.history, plan.topic, self.meta.keys.root
        last = plan.last
        gen = (ResetRecord.from_json(last.value).gen if last is not None else 0) + 1
        rec = ResetRecord(gen, plan.version, offsets, passed)
        ops = []
        for p in range(h.next_partition):
            if h.retired_in(p) is None:
                continue
            k = pass_key(root, topic, channel, p)
            ops.append(Op.put(k, b"1") if p in passed else Op.delete(k))
        ops.append(Op.put(plan.rkey, rec.to_json()))
        cmp = [plan.store.compare(), Compare.absent(plan.rkey) if last is None
               else Compare.mod_revision(plan.rkey, last.mod_revision)]
        try:
            won, _ = await self.meta.etcd.txn(cmp, ops)
        except EtcdError as e:
            raise ResetRefused(503, "E_CLUSTER_UNAVAILABLE", str(e)) from None
        if not won:
            raise ResetRefused(400, "E_CONFLICT",
                               f"topic {topic}: its route or the channel's reset changed "
                               f"during the reset; nothing was reset, try again")
        return gen

    async def _reset_post(self, node: NodeInfo, step: str, params: dict[str, str]
                          ) -> tuple[int, dict]:
        async with self._http().post(f"http://{node.internal_address}/nsqx/route/reset/{step}",
                                     params=params,
                                     timeout=aiohttp.ClientTimeout(total=10)) as r:
            body = await r.read()
            try:
                return r.status, orjson.loads(body)
            except ValueError:
                return r.status, {"message": body[:200].decode(errors="replace")}

    async def _reset_prepare(self, topic: str, channel: str, to: str,
                             nodes: dict[str, NodeInfo]) -> dict[str, dict]:
        """Hold the channel on every live node; {node id: {partition: report}}."""
        params = {"topic": topic, "channel": channel, "to": to}
        got = await asyncio.gather(*(self._reset_post(n, "prepare", params)
                                     for n in nodes.values()), return_exceptions=True)
        out: dict[str, dict] = {}
        for n, r in zip(nodes.values(), got, strict=True):
            if isinstance(r, BaseException) or r[0] != 200:
                why = repr(r) if isinstance(r, BaseException) else f"HTTP {r[0]} {r[1]}"
                raise ResetRefused(503, "E_NODE_UNAVAILABLE",
                                   f"node {n.id} did not hold channel {channel}: {why}")
            out[n.id] = r[1].get("partitions") or {}
        return out

    async def _reset_release(self, topic: str, channel: str, nodes: dict[str, NodeInfo]) -> None:
        params = {"topic": topic, "channel": channel}
        await asyncio.gather(*(self._reset_post(n, "release", params) for n in nodes.values()),
                             return_exceptions=True)  # one that misses it: its hold expires

    async def _reset_apply(self, topic: str, channel: str, gen: int,
                           nodes: dict[str, NodeInfo]) -> list[str]:
        """Every node applies reset ``gen`` (retried for a while); the nodes that did not
        (they apply it from their watch, or deliver again when their hold expires)."""
        params = {"topic": topic, "channel": channel, "gen": str(gen)}
        todo = dict(nodes)
        deadline = time.monotonic() + STEP_TIMEOUT
        while todo and time.monotonic() < deadline:
            got = await asyncio.gather(*(self._reset_post(n, "apply", params)
                                         for n in todo.values()), return_exceptions=True)
            for n, r in zip(list(todo.values()), got, strict=True):
                if not isinstance(r, BaseException) and r[0] == 200:
                    todo.pop(n.id)
                else:
                    log.warning("TOPIC(%s) CHANNEL(%s): reset %d not applied on %s yet: %r",
                                topic, channel, gen, n.id, r)
            if todo:
                await asyncio.sleep(0.2)
        return sorted(todo)
