"""nsqlookupd in cluster mode: the coordinator plugin and Youzan's HTTP endpoints.

Attached by the entry point when ``--cluster-leadership-addresses`` is set. Every lookupd
campaigns; the elected one reconciles. Any of them answers (reads come from etcd):

- ``GET /lookup?topic=T[&access=r|w][&metainfo=true]``: for a cluster topic, ``producers``
  are the partition leaders (deduplicated, upstream's PeerInfo shape, so stock clients find
  every partition), ``partitions`` maps each partition to its leader (with its ``epoch``;
  nsqx.client's ClusterProducer publishes to it directly), ``meta`` (with
  ``metainfo``) gives ``partition_num``, ``replica``, ``ordered``. Other topics: upstream's
  answer from the registrations.
- ``POST /topic/create?topic=T[&partition_num=P][&replicator=R][&syncdisk=N][&orderedmulti=true][&min_isr=M]``:
  creates the topic in the cluster (1 partition, min(3, live nodes) replicas by default);
  the same shape again is a no-op, another shape is refused (400 ``E_TOPIC_EXISTS``).
- ``POST /topic/delete?topic=T``: the topic leaves the cluster; every replica is deleted.
- ``POST /cluster/node/remove?remove_node=ID`` drains a node; ``&undo=true`` stops it.
- ``POST /topic/partition/move?topic=T&partition=P&move_from=A&move_to=B[&move_leader=true]``
  (Youzan's parameters): moves partition P's replica from node A to node B (B catches up
  outside the ISR, then A leaves; ``move_leader=true`` is needed when A leads, and then
  leadership goes to B). With ``move_leader=true`` and B already in the ISR only
  leadership moves (``move_from`` optional, A stays a follower). The request is checked
  against the partition (400 with the reason), recorded in etcd and carried out by the
  coordinator's reconcile passes; it shows under ``moves`` in ``/cluster/stats`` until done.
- Route-managed ordered topics (:mod:`nsqx.cluster.route_coord`): ``/topic/create`` with
  ``&logical=L``; ``GET /topic/route?topic=T`` (the history plus ``leaders``);
  ``POST /topic/split|merge|move`` with nsqd's parameters, run by the elected coordinator
  (another lookupd forwards the request), 400 with the rule's text when refused.
- ``POST /channel/setoffset?topic=T&channel=C`` on a route-managed topic, with nsqd's body
  forms (``earliest``, ``latest``, ``timestamp:<unix s>``, or ``?to=``): resets the channel
  on every node at once and walks the route versions again from the one current at that
  position (:meth:`~nsqx.cluster.route_coord.RouteCoordinator.reset_channel`); run by the
  elected coordinator. 200 ``{"topic", "channel", "route_version", "gen", "partitions":
  {p: offset}, "passed", "unapplied"}``; refusals change nothing: 400 (``E_INVALID``: a
  per-partition offset, a time in the future; ``E_ROUTE_CHANGE_PENDING``; ``E_RETENTION``;
  ``E_CONFLICT``: a route change started meanwhile), 404 ``TOPIC_NOT_FOUND`` /
  ``CHANNEL_NOT_FOUND``, 503 (``E_CLUSTER_UNAVAILABLE``: etcd, ``E_NO_LEADER``,
  ``E_NODE_UNAVAILABLE``: a live node did not answer).
- ``GET /cluster/stats[?log_ends=true]``: coordinator, live nodes, and every partition's
  leader, epoch, ISR and catch-up set; with ``log_ends`` also each replica's log end as its
  node reports it (``/nsqx/cluster/state``, asked concurrently, 2 s timeout; null when a
  node does not answer or does not hold the partition) and its lag behind the leader's end
  (for nsqadmin's cluster page).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from nsqx.cluster.coordinator import Coordinator
from nsqx.cluster.etcd import EtcdClient, EtcdError
from nsqx.cluster.model import MetaError, NodeInfo, TopicMeta
from nsqx.cluster.placement import plan_move
from nsqx.cluster.route_coord import ResetRefused
from nsqx.cluster.trust import Signer
from nsqx.httpapi import HTTPError, topic_channel_args
from nsqx.httpapi import query as parse_query
from nsqx.lookupd.http import registry_lookup
from nsqx.lookupd.http import topic_delete as lookupd_topic_delete
from nsqx.lookupd.registry import CHANNEL
from nsqx.nsqd.replay_api import MAX_POSITION_BODY, split_position_arg
from nsqx.nsqd.routes_api import parse_change
from nsqx.protocol.routes import DEFAULT_LOGICAL, MAX_LOGICAL, RouteError

log = logging.getLogger("nsqx.cluster.lookupd")

__all__ = ["ClusterLookupd"]


def _json(status: int, obj: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


def _err(status: int, code: str, text: str = "") -> web.Response:
    body: dict[str, Any] = {"message": code}
    if text:
        body["detail"] = text
    return _json(status, body)


def _peer(n: NodeInfo) -> dict[str, Any]:
    return {"remote_address": f"{n.broadcast_address}:{n.tcp_port}",
            "hostname": n.broadcast_address, "broadcast_address": n.broadcast_address,
            "tcp_port": n.tcp_port, "http_port": n.http_port, "version": n.version or "1.3.0",
            "topology_zone": "", "topology_region": "", "id": n.id}


def _int(q: Any, name: str, default: int, lo: int, hi: int) -> int:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise MetaError(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise MetaError(f"{name} must be in {lo}..{hi}, got {v}")
    return v


class ClusterLookupd:
    """The cluster side of one nsqlookupd (plugin + routes)."""

    def __init__(self, lookupd: Any, endpoints: list[str], cluster_id: str, *,
                 rebalance: bool = True, secret: bytes | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.lookupd = lookupd
        self.rebalance = rebalance
        self.secret = secret  # signs the coordinator's calls to nodes (seal, reset)
        self.tls = tls  # client context of mutual TLS to the nodes' cluster listeners
        self.etcd = EtcdClient(endpoints)
        self.cluster_id = cluster_id
        self.coordinator: Coordinator | None = None
        self._upstream_lookup: Any = None
        self._session: aiohttp.ClientSession | None = None
        lookupd.plugins.append(self)
        for path, fn in (("/lookup", self.h_lookup), ("/cluster/stats", self.h_stats),
                         ("/topic/route", self.h_route)):
            lookupd.http_routes.append(("GET", path, fn))
        for path, fn in (("/topic/create", self.h_topic_create),
                         ("/topic/delete", self.h_topic_delete),
                         ("/topic/partition/move", self.h_partition_move),
                         ("/cluster/node/remove", self.h_node_remove),
                         ("/topic/split", self.h_route_change), ("/topic/merge", self.h_route_change),
                         ("/topic/move", self.h_route_change),
                         ("/channel/setoffset", self.h_channel_setoffset)):
            lookupd.http_routes.append(("POST", path, fn))

    @property
    def meta(self):  # type: ignore[no-untyped-def]
        assert self.coordinator is not None
        return self.coordinator.meta

    async def start(self) -> None:
        me = f"{self.lookupd.opts.broadcast_address}:{self.lookupd.http_port}"
        self.coordinator = Coordinator(self.etcd, self.cluster_id, me, rebalance=self.rebalance,
                                       signer=Signer(self.secret, f"nsqlookupd:{me}")
                                       if self.secret else None, tls=self.tls)
        self.coordinator.start()
        log.info("CLUSTER: nsqlookupd %s campaigning to coordinate cluster %s at %s", me,
                 self.cluster_id, ", ".join(self.etcd.endpoints))

    async def stop(self) -> None:
        if self.coordinator is not None:
            await self.coordinator.close()
        if self._session is not None:
            await self._session.close()
        await self.etcd.close()

    # -- handlers ---------------------------------------------------------------------------
    async def h_lookup(self, request: web.Request) -> web.StreamResponse:
        name = request.query.get("topic")
        try:
            tm = await self.meta.topic(name) if name else None
        except EtcdError as e:
            log.error("CLUSTER: /lookup: %s", e)
            tm = None
        if tm is None:
            return await registry_lookup(self.lookupd, request)
        nodes = await self.meta.nodes()
        parts = await self.meta.partitions(tm.name)
        producers: list[dict[str, Any]] = []
        seen: set[str] = set()
        partitions: dict[str, Any] = {}
        for p, v in parts.items():
            leader = v.meta.leader
            if leader is None or leader not in nodes:
                continue
            partitions[str(p)] = {**_peer(nodes[leader]), "epoch": v.meta.epoch}
            if leader not in seen:
                seen.add(leader)
                producers.append(_peer(nodes[leader]))
        channels = sorted({r.subkey for r in
                           self.lookupd.db.find_registrations(CHANNEL, tm.name, "*")})
        body: dict[str, Any] = {"channels": channels, "producers": producers,
                                "partitions": partitions}
        if request.query.get("metainfo") == "true":
            body["meta"] = {"partition_num": tm.partitions, "replica": tm.replicas,
                            "ordered": tm.ordered, "extend_support": False,
                            "multi_part": tm.partitions > 1, "min_isr": tm.effective_min_isr}
        return _json(200, body)

    async def h_topic_create(self, request: web.Request) -> web.Response:
        q = request.query
        name = q.get("topic", "")
        if not name:
            return _err(400, "MISSING_ARG_TOPIC")
        try:
            nodes = await self.meta.nodes()
            parts = _int(q, "partition_num", 1, 1, 1024)
            reps = _int(q, "replicator", min(3, max(len(nodes), 1)), 1, 16)
            routed = q.get("logical") is not None  # a route-managed ordered topic
            tm = TopicMeta(name, parts, reps, sync_every=_int(q, "syncdisk", 0, 0, 1 << 30),
                           ordered=routed or q.get("orderedmulti") == "true",
                           min_isr=_int(q, "min_isr", 0, 0, 16))
            if routed:
                logical = _int(q, "logical", DEFAULT_LOGICAL, 1, MAX_LOGICAL)
                history, placed = await self.coordinator.routes.create(  # type: ignore[union-attr]
                    tm, logical)
            else:
                placed = await self.meta.create_topic(tm, sorted(nodes))
        except RouteError as e:
            return _err(400, "E_INVALID", str(e))
        except MetaError as e:
            code = "E_TOPIC_EXISTS" if "already exists" in str(e) else "E_INVALID"
            return _err(400, code, str(e))
        except EtcdError as e:
            return _err(503, "E_CLUSTER_UNAVAILABLE", str(e))
        body: dict[str, Any] = {"topic": name, "partitions": [
            {"partition": p.partition, "leader": p.leader, "replicas": list(p.replicas),
             "epoch": p.epoch, "isr": list(p.isr)} for p in placed]}
        if routed:
            body["route"] = history.to_dict()
        return _json(200, body)

    async def h_topic_delete(self, request: web.Request) -> web.Response:
        """``POST /topic/delete?topic=T`` (Youzan's): the topic leaves the cluster's
        metadata, and every nsqd holding a replica deletes it (nsqx.cluster.topic_delete);
        then, as upstream, its registrations here. 200 also for a name nobody knew."""
        name = request.query.get("topic", "")
        if not name:
            return _err(400, "MISSING_ARG_TOPIC")
        try:
            await self.meta.delete_topic(name)
        except EtcdError as e:
            return _err(503, "E_CLUSTER_UNAVAILABLE", str(e))
        return await lookupd_topic_delete(self.lookupd, request)

    # -- route-managed ordered topics (nsqx.cluster.route_coord) ----------------------------
    async def h_route(self, request: web.Request) -> web.Response:
        """``GET /topic/route?topic=T``: the route history (the shape of nsqd's answer, so
        ``HttpRouteSource`` reads either) plus ``leaders``: partition -> leader TCP address,
        where a producer sends a keyed publish."""
        name = request.query.get("topic", "")
        if not name:
            return _err(400, "MISSING_ARG_TOPIC")
        try:
            h = await self.coordinator.routes.history(name)  # type: ignore[union-attr]
            if h is None:
                return _err(404, "TOPIC_NOT_FOUND", f"no route-managed topic {name}")
            nodes = await self.meta.nodes()
            parts = await self.meta.partitions(name)
        except (EtcdError, RouteError) as e:
            return _err(503, "E_CLUSTER_UNAVAILABLE", str(e))
        body = h.to_dict()
        body["leaders"] = {str(p): nodes[v.meta.leader].tcp_address for p, v in parts.items()
                           if v.meta.leader in nodes}
        return _json(200, body)

    async def h_route_change(self, request: web.Request) -> web.StreamResponse:
        """``POST /topic/split|merge|move`` with nsqd's parameters (``parse_change``): run by
        the elected coordinator (another lookupd passes the request on to it); 400 with the
        rule's text as ``message`` when refused, as nsqd answers."""
        c = self.coordinator
        assert c is not None
        if not c.is_leader:
            return await self._to_coordinator(request)
        kind = request.path.rsplit("/", 1)[-1]
        try:
            params = parse_query(request)
            name = (params.get("topic") or [""])[0]
            if not name:
                return _err(400, "MISSING_ARG_TOPIC")
            nodes = await self.meta.nodes()
            what, op = parse_change(kind, params, node=lambda n: _node_id(n, nodes))
            h = await c.routes.change(name, op)
        except HTTPError as e:
            return _err(e.status, e.code)
        except RouteError as e:
            log.info("CLUSTER: TOPIC(%s): route change refused - %s", name, e)
            return _err(400, str(e))
        except TimeoutError as e:
            return _err(503, "E_ROUTE_CHANGE_PENDING", str(e))
        except EtcdError as e:
            return _err(503, "E_CLUSTER_UNAVAILABLE", str(e))
        log.info("CLUSTER: TOPIC(%s): %s by HTTP client %s", name, what, request.remote)
        return _json(200, h.to_dict())

    async def h_channel_setoffset(self, request: web.Request) -> web.StreamResponse:
        """``POST /channel/setoffset?topic=T&channel=C`` + nsqd's position body: a cluster
        reset of a route-managed topic's channel (RouteCoordinator.reset_channel)."""
        c = self.coordinator
        assert c is not None
        if not c.is_leader:
            return await self._to_coordinator(request)
        try:
            params = parse_query(request)
            name, channel = topic_channel_args(params)
            body = await request.content.read(MAX_POSITION_BODY + 1)
            if len(body) > MAX_POSITION_BODY:
                return _err(413, "BODY_TOO_BIG")
            pos = split_position_arg(body, params)
            if params.get("partition"):
                return _err(400, "E_BAD_PARTITION",
                            "a route-managed topic's channel is reset on every partition")
            out = await c.routes.reset_channel(name, channel, pos)
        except HTTPError as e:
            return _err(e.status, e.code)
        except ResetRefused as e:
            log.info("CLUSTER: TOPIC(%s) CHANNEL(%s): reset refused - %s", name, channel, e)
            return _err(e.status, e.code, str(e))
        log.info("CLUSTER: TOPIC(%s) CHANNEL(%s): reset to route version %d by HTTP client %s",
                 name, channel, out["route_version"], request.remote)
        return _json(200, out)

    async def _to_coordinator(self, request: web.Request) -> web.Response:
        leader = self.coordinator.leader if self.coordinator else None
        if not leader:
            return _err(503, "E_NO_COORDINATOR", "no coordinator is elected; retry")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        try:
            body = await request.read()
            auth = request.headers.get("Authorization")  # the client's, for --auth-http-address
            async with self._session.post(f"http://{leader}{request.path_qs}", data=body,
                                          headers={"Authorization": auth} if auth else None,
                                          timeout=aiohttp.ClientTimeout(total=60)) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    content_type="application/json")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            return _err(503, "E_NO_COORDINATOR", f"coordinator {leader}: {e!r}")

    async def h_node_remove(self, request: web.Request) -> web.Response:
        node = request.query.get("remove_node", "")
        if not node:
            return _err(400, "MISSING_ARG_REMOVE_NODE")
        try:
            if request.query.get("undo") == "true":
                await self.coordinator.undrain(node)  # type: ignore[union-attr]
            else:
                if node not in await self.meta.nodes():
                    return _err(404, "NODE_NOT_FOUND", f"no live node {node}")
                await self.coordinator.drain(node)  # type: ignore[union-attr]
        except EtcdError as e:
            return _err(503, "E_CLUSTER_UNAVAILABLE", str(e))
        return _json(200, {"node": node, "draining": request.query.get("undo") != "true"})

    async def h_partition_move(self, request: web.Request) -> web.Response:
        q = request.query
        name = q.get("topic", "")
        if not name:
            return _err(400, "MISSING_ARG_TOPIC")
        if q.get("partition", "") == "":
            return _err(400, "MISSING_ARG_TOPIC_PARTITION")
        target = q.get("move_to", "")
        if not target:
            return _err(400, "MISSING_ARG_MOVE_TO", "move_to: the node id to move to")
        move_leader = q.get("move_leader", "false").lower()
        if move_leader not in ("true", "false"):
            return _err(400, "E_INVALID", f"move_leader must be true or false, got {move_leader!r}")
        c = self.coordinator
        assert c is not None
        try:
            p = _int(q, "partition", 0, 0, 1 << 20)
            tm = await self.meta.topic(name)
            if tm is None:
                return _err(400, "E_TOPIC_NOT_EXIST", f"no topic {name} in the cluster")
            v = (await self.meta.partitions(name)).get(p)
            if v is None:
                return _err(400, "INVALID_ARG_TOPIC_PARTITION",
                            f"topic {name} has partitions 0..{tm.partitions - 1}, not {p}")
            nodes = await self.meta.nodes()
            drain_kvs, _ = await self.etcd.get_prefix(self.meta.keys.root + b"drain/")
            req = plan_move(v.meta, move_leader=move_leader == "true",
                            source=q.get("move_from") or None, target=target, live=set(nodes),
                            draining={kv.key.rsplit(b"/", 1)[-1].decode() for kv in drain_kvs})
            if not await c.request_move(req):
                pending = (await c.moves()).get((name, p))
                what = (f" ({pending[0].source} -> {pending[0].target})" if pending else "")
                return _err(400, "E_MOVE_IN_PROGRESS",
                            f"a move of {name}/{p} is already under way{what}")
        except MetaError as e:
            return _err(400, "E_INVALID", str(e))
        except EtcdError as e:
            return _err(503, "E_CLUSTER_UNAVAILABLE", str(e))
        log.info("CLUSTER: TOPIC(%s) PARTITION(%d): move requested: %s", name, p,
                 f"leadership {req.source} -> {req.target}" if req.leader_only
                 else f"replica {req.source} -> {req.target}")
        return _json(200, {"topic": name, "partition": p, "move_from": req.source,
                           "move_to": req.target, "leader_only": req.leader_only})

    async def h_stats(self, request: web.Request) -> web.Response:
        c = self.coordinator
        assert c is not None
        try:
            nodes = await self.meta.nodes()
            topics = await self.meta.topics()
            parts = await self.meta.all_partitions()
            drain_kvs, _ = await self.etcd.get_prefix(self.meta.keys.root + b"drain/")
            moves = await c.moves()
        except EtcdError as e:
            return _err(503, "E_CLUSTER_UNAVAILABLE", str(e))
        ends = (await self._log_ends(list(nodes.values()))
                if request.query.get("log_ends") == "true" else None)
        return _json(200, {
            "cluster_id": self.cluster_id,
            "coordinator": c.leader, "is_coordinator": c.is_leader,
            "rebalance": c.rebalance, "rebalance_moves": c.rebalance_moves,
            "nodes": [{"id": n.id, "tcp_address": n.tcp_address, "http_address": n.http_address,
                       "version": n.version} for n in nodes.values()],
            "draining": [kv.key.rsplit(b"/", 1)[-1].decode() for kv in drain_kvs],
            "moves": [{"topic": r.topic, "partition": r.partition, "move_from": r.source,
                       "move_to": r.target, "leader_only": r.leader_only}
                      for r, _mod in moves.values()],
            "topics": {
                t.name: {"partition_num": t.partitions, "replica": t.replicas,
                         "ordered": t.ordered, "min_isr": t.effective_min_isr,
                         "partitions": [
                             {"partition": v.meta.partition, "leader": v.meta.leader,
                              "epoch": v.meta.epoch, "replicas": list(v.meta.replicas),
                              "isr": list(v.meta.isr), "catchup": list(v.meta.catchup),
                              **_replica_ends(v.meta, ends)}
                             for (tn, _), v in sorted(parts.items()) if tn == t.name]}
                for t in topics.values()},
        })

    async def _log_ends(self, nodes: list[NodeInfo]) -> dict[str, dict[tuple[str, int], int]]:
        """{node id: {(topic, partition): log end}} from every live node that answers."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))

        async def one(n: NodeInfo) -> dict[tuple[str, int], int]:
            async with self._session.get(  # type: ignore[union-attr]
                    f"http://{n.http_address}/nsqx/cluster/state") as r:
                body = orjson.loads(await r.read()) if r.status == 200 else {}
            return {(p["topic"], int(p["partition"])): int(p["log_end"])
                    for p in body.get("partitions") or () if p.get("log_end") is not None}

        got = await asyncio.gather(*(one(n) for n in nodes), return_exceptions=True)
        out: dict[str, dict[tuple[str, int], int]] = {}
        for n, r in zip(nodes, got, strict=True):
            if isinstance(r, dict):
                out[n.id] = r
            else:
                log.warning("CLUSTER: /cluster/stats: no log ends from %s: %r", n.id, r)
        return out


def _node_id(given: str, nodes: dict[str, NodeInfo]) -> str:
    """A move's ``node``: a node id, or a live node's TCP or HTTP address (its id then)."""
    if given in nodes:
        return given
    for n in nodes.values():
        if given in (n.tcp_address, n.http_address):
            return n.id
    return given  # unknown: place_created refuses it with the live nodes listed


def _replica_ends(pm: Any, ends: dict[str, dict[tuple[str, int], int]] | None
                  ) -> dict[str, Any]:
    """``log_end`` and ``lag`` (leader's end minus the replica's) per replica, or nothing."""
    if ends is None:
        return {}
    k = (pm.topic, pm.partition)
    log_end = {r: ends.get(r, {}).get(k) for r in pm.replicas}
    lead = log_end.get(pm.leader) if pm.leader else None
    lag = {r: (lead - e if lead is not None and e is not None else None)
           for r, e in log_end.items()}
    return {"log_end": log_end, "lag": lag}
