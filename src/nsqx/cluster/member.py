"""An nsqd as a cluster member: liveness, roles per partition, and replication.

Attached to an :class:`~nsqx.nsqd.node.NSQD` by the entry point in cluster mode (as a
plugin plus HTTP routes); nsqd itself knows only the narrow write gate of a topic.

- **Liveness**: the node's record lives under an etcd lease refreshed every third of its
  TTL; when the process dies the lease ends and the coordinator moves leadership.
- **Roles**: the member watches the partition metadata; for each partition it holds it is
  the leader (its gate admits publishes and acks them once every ISR member has fetched
  past them) or a follower (its gate refuses client publishes; a task pulls from the
  leader). A change of epoch switches roles; a deposed leader fails what it had not acked.
- **Replication is a pull of ready log bytes**: ``GET /nsqx/replica/fetch`` returns the
  stored frames from the follower's log end (long-polled at the tail) with the leader's
  commits that make them up (``commits``: base, count, timestamps, epoch, frame length or
  lengths); the follower appends each commit as one batch through the topic's group
  committer without walking its frames, so both logs hold the same bytes, and its next
  fetch offset is its ack. Fetches go over one stream per leader, the fetches of all the
  partitions this node copies from it multiplexed (:mod:`nsqx.cluster.stream`, the same
  heads and frames, ``ReplicaServer.serve_fetch`` on the leader for both), or with
  ``--cluster-replication=http`` over one keep-alive connection per followed partition
  (:class:`~nsqx.cluster.fetchconn.FetchConnection`). Before its
  first fetch in an epoch a follower truncates to where its log agrees with the leader's
  (``/nsqx/replica/epochs`` and :func:`~nsqx.cluster.replication.truncation_point`).
- **ISR**: the leader drops a follower that stays behind for ``lag_timeout`` (so a dead or
  paused follower blocks acks only that long) and re-admits one that reached its log end,
  both by compare-and-swap on the partition's metadata with its own epoch, which also
  fences a deposed leader: its CAS fails and it steps down.
- **High watermark**: the partition's channels read only below what every ISR member has
  (``Topic.readable_end``, moved by the leader's gate in ``release()``); fetch answers carry
  the leader's acked end (``hw``), so a follower that becomes leader starts from it.
- **Channel cursors** travel with fetch answers (at most once a second): followers create
  the channels and advance them, so a new leader redelivers only the unconfirmed window.

This module is the facade: it holds the membership and the metadata watch, and builds the
parts, handing each only what it uses (a small Protocol of the member's public fields, or
callbacks): the write gates (:mod:`~nsqx.cluster.gates`), roles
(:mod:`~nsqx.cluster.roles`), the follower's fetch loop
(:mod:`~nsqx.cluster.replica_follower`), the leader's serving of fetches and streams
(:mod:`~nsqx.cluster.replica_server`, its head a :class:`~nsqx.cluster.replication.FetchHead`),
ISR upkeep (:mod:`~nsqx.cluster.isr_upkeep`), route seal/reset
(:mod:`~nsqx.cluster.route_handlers`), forwarding (:mod:`~nsqx.cluster.forwarding`) and
topic delete (:mod:`~nsqx.cluster.topic_delete`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.cluster.archive_fence import fence_for
from nsqx.cluster.etcd import EtcdClient, EtcdError
from nsqx.cluster.forwarding import Forwarder
from nsqx.cluster.gates import FollowerGate, LeaderGate, UnknownTopicGate
from nsqx.cluster.internal_auth import InternalAuth
from nsqx.cluster.isr_upkeep import IsrUpkeep
from nsqx.cluster.metadata import ClusterMetadata
from nsqx.cluster.model import MetaError, NodeInfo, PartitionMeta, TopicMeta
from nsqx.cluster.outage import Outage
from nsqx.cluster.replica_follower import ReplicaFollower
from nsqx.cluster.replica_server import ReplicaServer
from nsqx.cluster.replication import epoch_spans, frame_runs
from nsqx.cluster.restart import step_down_after_restart
from nsqx.cluster.roles import Roles
from nsqx.cluster.route_handlers import RouteHandlers
from nsqx.cluster.stream import PATH as STREAM_PATH
from nsqx.cluster.topic_delete import LocalCopies, refuse_imported_topics
from nsqx.cluster.trust import RefusalLog, Refused, SignedSession, Signer, Verifier, receiver_name
from nsqx.httpapi import make_runner
from nsqx.httpbase import HTTPError
from nsqx.netutil import bind_listener

log = logging.getLogger("nsqx.cluster.member")

__all__ = ["FollowerGate", "LeaderGate", "NodeMember", "UnknownTopicGate", "epoch_spans",
           "frame_runs"]

LAG_TIMEOUT = 3.0  # seconds a follower may stay behind before it leaves the ISR


class NodeMember:
    """The cluster side of one nsqd (a plugin: ``start``/``stop``)."""

    def __init__(self, nsqd: Any, endpoints: list[str], cluster_id: str, *,
                 ttl: float = 3.0, lag_timeout: float = LAG_TIMEOUT,
                 secret: bytes | None = None, cluster_address: str = "",
                 tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> None:
        self.nsqd = nsqd
        # trust: requests between members are signed with the cluster secret (none: the
        # compatible, unauthenticated mode, warned about at start)
        self.secret = secret
        self.cluster_address = cluster_address  # the internal listener; "": HTTP host, any port
        self.signer: Signer | None = None
        self.verifier = Verifier(secret) if secret else None
        self.refusals = RefusalLog()
        self.auth = InternalAuth(self.verifier, self.refusals)
        # mutual TLS between members (server, client contexts; --cluster-tls-*)
        self.tls_server, self.tls_client = tls if tls is not None else (None, None)
        self._internal_runner: web.AppRunner | None = None
        # fetches go over one stream per leader (--cluster-replication=stream) or HTTP
        self.replication = nsqd.opts.cluster_replication or "stream"
        self.internal_address = ""
        self.etcd = EtcdClient(endpoints)
        self.meta = ClusterMetadata(self.etcd, cluster_id)
        self.ttl = max(2, round(ttl))
        self.lag_timeout = lag_timeout
        self.node_id = ""
        self.lease = 0
        self.info: NodeInfo | None = None
        # the watched metadata (shared, never replaced, with the parts below)
        self.partitions: dict[tuple[str, int], PartitionMeta] = {}
        self.topic_meta: dict[str, TopicMeta] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.node_leases: dict[str, int] = {}  # node -> its registration's lease: one run of it
        self.gates: dict[tuple[str, int], LeaderGate | FollowerGate] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.http: SignedSession | None = None
        # the parts, each handed what it uses
        self.follower = ReplicaFollower(self, lambda: self.nsqd.metadata_changed())
        self.followers = self.follower.tasks
        self.server = ReplicaServer(self.gates, self.nodes, self.node_leases, self.auth)
        self.isr = IsrUpkeep(self.meta, self.gates, self.nodes, lambda: self.node_id)
        self.copies = LocalCopies(Path(nsqd.data_path), nsqd.delete_topic,
                                  lambda: self.roles.reconcile())
        self.roles = Roles(self, self.gates, self.follower, self.copies,
                           self.meta.keys.root.decode(), lambda: self.routes.sync_all())
        self.routes = RouteHandlers(nsqd, self.etcd, self.meta.keys.root, self.gates,
                                    self.auth, self.roles.guard, lambda: self.node_id)
        self.forwarder = Forwarder(self)  # publishes that reach this node as a follower
        nsqd.topic_delete_hook = self.delete_topic
        self.forwarded = 0
        self.etcd_ok = True
        self.watch_outage = Outage("CLUSTER: metadata watch", log)  # backoff, one line a state
        nsqd.http_route_hooks.append(self.add_routes)
        nsqd.topic_hooks.append(self.roles.on_new_topic)
        if nsqd.archiver is not None:  # --archive-url: files count once
            nsqd.archiver.use_fence(fence_for(self))  # recorded in etcd by the leader

    def __repr__(self) -> str:
        return f"<NodeMember {self.node_id}>"

    # -- identity -------------------------------------------------------------------------
    def _identity(self) -> str:
        """Kept in the data path, so a restarted node (even on new ports) is the same member."""
        path = Path(self.nsqd.data_path) / "cluster-node-id"
        try:
            ident = path.read_text().strip()
            if ident:
                return ident
        except FileNotFoundError:
            pass
        o = self.nsqd.opts
        ident = f"{o.broadcast_address or 'localhost'}:{self.nsqd.tcp_port}:{self.nsqd.http_port}"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(ident + "\n")
        tmp.replace(path)
        return ident

    def _node_info(self) -> NodeInfo:
        o = self.nsqd.opts
        return NodeInfo(self.node_id, o.broadcast_address or "127.0.0.1",
                        o.broadcast_tcp_port or self.nsqd.tcp_port,
                        o.broadcast_http_port or self.nsqd.http_port, NSQ_VERSION,
                        self.internal_address)

    async def _listen_internal(self) -> None:
        """The cluster listener: replication, route and state endpoints for other members,
        on ``--cluster-address`` (default: the HTTP listener's host, a port the OS picks;
        the address goes into this node's etcd record, where the others find it)."""
        addr = self.cluster_address
        if not addr:
            host = self.nsqd.opts.http_address.rpartition(":")[0] or "127.0.0.1"
            addr = f"{host}:0"
        sock = bind_listener(addr)
        app = web.Application()
        self._add_internal(app)
        app.router.add_get("/nsqx/cluster/state", self.h_state)
        # the public listeners' runner: a malformed request is one warning and Go's 400/431,
        # never a traceback; no Server header
        runner = make_runner(app, logging.getLogger("nsqx.cluster.http"))
        host, port = sock.getsockname()[:2]
        if host in ("0.0.0.0", "::", ""):
            host = self.nsqd.opts.broadcast_address or "127.0.0.1"
        port = self.nsqd.opts.broadcast_cluster_port or port
        self.internal_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.verifier is not None:  # requests signed for another member are refused
            self.verifier.receivers = {receiver_name(self.internal_address)}
        await runner.setup()
        await web.SockSite(runner, sock, ssl_context=self.tls_server).start()
        self._internal_runner = runner
        log.info("CLUSTER: internal endpoints on %s (%s%s)", self.internal_address,
                 "signed requests only" if self.verifier else "NOT authenticated",
                 ", mutual TLS" if self.tls_server else "")

    # -- plugin ---------------------------------------------------------------------------
    async def start(self) -> None:
        refuse_imported_topics(self.nsqd.topics)
        self.node_id = self._identity()
        if self.secret:
            self.signer = Signer(self.secret, self.node_id)
        else:
            log.warning("CLUSTER: no --cluster-secret-file: requests between cluster members "
                        "are not authenticated, so any client that reaches this node's ports "
                        "can speak as a member (fetch as a follower, seal, reset); set a "
                        "shared secret on every nsqd and nsqlookupd of the cluster")
        await self._listen_internal()
        self.info = self._node_info()
        self.http = SignedSession(self.signer, ssl=self.tls_client)
        for topic in list(self.nsqd.topics.values()):  # until the metadata says otherwise
            if not topic.ephemeral:
                for part in topic.partitions:
                    self.roles.guard(part)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._membership(), name="cluster membership"))
        self._tasks.append(loop.create_task(self._watch(), name="cluster metadata"))
        self._tasks.append(loop.create_task(self.isr.run(), name="cluster ISR"))
        log.info("CLUSTER: node %s joining cluster %s at %s", self.node_id,
                 self.meta.keys.root.decode(), ", ".join(self.etcd.endpoints))

    async def stop(self) -> None:
        for task in list(self.followers.values()) + self._tasks:
            task.cancel()
        for task in list(self.followers.values()) + self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for gate in self.gates.values():
            if isinstance(gate, LeaderGate):
                gate.deposed("node shutting down")
        if self.lease:
            with contextlib.suppress(EtcdError):
                await self.etcd.lease_revoke(self.lease)  # leadership moves at once
        await self.forwarder.close()
        await self.copies.close()
        if self.http is not None:
            await self.http.close()
        self.follower.close_streams()
        self.server.close()
        if self._internal_runner is not None:
            await self._internal_runner.cleanup()
        await self.etcd.close()

    # -- liveness -------------------------------------------------------------------------
    async def _membership(self) -> None:
        assert self.info is not None
        while True:
            try:
                if not self.lease:
                    self.lease = await self.etcd.lease_grant(self.ttl)
                    await self.meta.register_node(self.info, self.lease)
                    log.info("CLUSTER: node %s registered (lease %x, ttl %d s)",
                             self.node_id, self.lease, self.ttl)
                await asyncio.sleep(self.ttl / 3)
                if await self.etcd.lease_keepalive(self.lease) <= 0:
                    log.warning("CLUSTER: node %s lease expired; registering again", self.node_id)
                    self.lease = 0
                if not self.etcd_ok:
                    log.info("CLUSTER: etcd reachable again")
                    self.etcd_ok = True
            except EtcdError as e:
                if self.etcd_ok:
                    log.error("CLUSTER: etcd unreachable (%s); partitions this node leads keep "
                              "serving only while their ISR acks", e)
                self.etcd_ok = False
                await asyncio.sleep(0.5)

    # -- metadata -------------------------------------------------------------------------
    async def _watch(self) -> None:
        stepped_down = False
        while True:
            try:
                if not stepped_down:  # leaderships of a previous run: given up before any role
                    await step_down_after_restart(self.meta, self.node_id)
                    stepped_down = True
                kvs, rev = await self.etcd.get_prefix(self.meta.keys.root)
                self.watch_outage.ok()
                self._load(kvs)
                async for events in self.meta.watch(self.meta.keys.root, rev + 1):
                    for ev in events:
                        self._apply_kv(ev.kv.key, None if ev.type == "DELETE" else ev.kv.value,
                                       ev.kv.lease)
                    self.roles.reconcile()
            except EtcdError as e:
                await self.watch_outage.failed(e)

    def _load(self, kvs: list) -> None:
        self.partitions.clear()
        self.topic_meta.clear()
        self.nodes.clear()
        self.node_leases.clear()
        self.routes.clear()
        for kv in kvs:
            self._apply_kv(kv.key, kv.value, kv.lease)
        self.roles.reconcile()

    def _apply_kv(self, key: bytes, value: bytes | None, lease: int = 0) -> None:
        keys = self.meta.keys
        try:
            if key.startswith(keys.partitions):
                topic, _, p = key[len(keys.partitions):].decode().rpartition("/")
                k = (topic, int(p))
                if value is None:
                    self.partitions.pop(k, None)
                else:
                    self.partitions[k] = PartitionMeta.from_json(value)
            elif key.startswith(keys.topics):
                name = key[len(keys.topics):].decode()
                if value is None:
                    self.topic_meta.pop(name, None)
                else:
                    self.topic_meta[name] = TopicMeta.from_json(value)
            elif key.startswith(keys.nodes):
                nid = key[len(keys.nodes):].decode()
                if value is None:
                    self.nodes.pop(nid, None)
                    self.node_leases.pop(nid, None)
                else:
                    self.nodes[nid] = NodeInfo.from_json(value)
                    self.node_leases[nid] = lease
            else:
                self.routes.apply_kv(key, value)
        except (ValueError, KeyError, TypeError, MetaError) as e:
            log.warning("CLUSTER: ignoring malformed metadata %r: %s", key, e)

    # -- forwarding publishes to the leader ---------------------------------------------------
    def forward(self, topic: Any, bodies: list[bytes], defer_ms: int,
                headers: list[dict[str, bytes] | None] | None, command: bytes,
                done: Callable, on_replayed: Callable[[], None] | None = None) -> bool:
        """Send a follower's publish to the partition's leader, whichever it is by then
        (``forwarding.Forwarder``); ``done`` is called with the outcome (``on_replayed``
        first when the leader found the batch stored already)."""
        self.forwarded += len(bodies)
        self.forwarder.start(topic, bodies, defer_ms, headers, command, done, on_replayed)
        return True

    # -- deleting a topic: a cluster operation (cluster.topic_delete) ------------------------
    async def delete_topic(self, name: str) -> bool:
        """nsqd's ``/topic/delete`` in cluster mode: the topic leaves etcd, so every member
        deletes its replica (this one at once). Idempotent: a name already gone is not an
        error (nsqadmin deletes through nsqlookupd and then on each node); the result says
        whether etcd or this node knew it."""
        try:
            removed = await self.meta.delete_topic(name)
        except EtcdError as e:
            log.error("CLUSTER: TOPIC(%s): delete refused: etcd: %s", name, e)
            raise HTTPError(503, "E_CLUSTER_UNAVAILABLE") from None
        here = name in self.nsqd.topics
        if here:
            with contextlib.suppress(KeyError):
                await self.nsqd.delete_topic(name)
        return bool(removed) or here

    # -- leader side: the replication API ---------------------------------------------------
    _INTERNAL_GET = ("/nsqx/replica/epochs", "/nsqx/replica/fetch", STREAM_PATH)
    _INTERNAL_POST = ("/nsqx/route/seal", "/nsqx/route/reset/prepare", "/nsqx/route/reset/apply",
                      "/nsqx/route/reset/release")

    def _add_internal(self, app: web.Application) -> None:
        r = self.routes
        handlers = (self.server.h_epochs, self.server.h_fetch, self.server.h_stream,
                    r.h_route_seal, r.h_reset_prepare, r.h_reset_apply, r.h_reset_release)
        for path, h in zip(self._INTERNAL_GET + self._INTERNAL_POST, handlers, strict=True):
            (app.router.add_get if path in self._INTERNAL_GET else app.router.add_post)(path, h)

    def add_routes(self, app: web.Application) -> None:
        """nsqd's public HTTP listener: the read-only ``/nsqx/cluster/state`` (the spark
        source and lookupd read it), the refusal counters in ``/metrics``, and the internal
        endpoints only in the unauthenticated mode (without a secret: what older members
        call); with a secret they answer 403 there and live on the cluster listener."""
        app.router.add_get("/nsqx/cluster/state", self.h_state)
        app.middlewares.append(self._metrics_middleware)
        if self.verifier is None:
            self._add_internal(app)
            return
        for path in self._INTERNAL_GET:
            app.router.add_get(path, self.h_public_refused)
        for path in self._INTERNAL_POST:
            app.router.add_post(path, self.h_public_refused)

    @web.middleware
    async def _metrics_middleware(self, request: web.Request, handler: Callable) -> Any:
        resp = await handler(request)
        if request.path == "/metrics" and isinstance(resp, web.Response) and resp.body:
            resp.body = bytes(resp.body) + self.refusals.prometheus().encode()
        return resp

    async def h_public_refused(self, request: web.Request) -> web.Response:
        return self.auth.refuse(request, Refused(
            403, "E_CLUSTER_PORT", f"internal endpoint: served to cluster members on "
            f"{self.internal_address or 'the cluster address'}, not on the public port"))

    async def h_state(self, request: web.Request) -> web.Response:
        """This node's view: role, epoch, log end per partition (``nsqx topic describe``)."""
        out = []
        for (name, p), gate in sorted(self.gates.items()):
            topic = self.roles.local_partition(name, p)
            entry: dict[str, Any] = {"topic": name, "partition": p,
                                     "role": "leader" if isinstance(gate, LeaderGate) else "follower",
                                     "epoch": topic.epoch if topic else None,
                                     "log_end": topic.log.flushed_offset if topic else None,
                                     "readable_end": topic.readable_end if topic else None}
            if isinstance(gate, LeaderGate):
                entry["acked_end"] = gate.acked_end()
                entry["followers"] = {n: fp.end for n, fp in gate.progress.followers.items()}
            out.append(entry)
        return web.json_response({"node": self.node_id, "etcd_ok": self.etcd_ok,
                                  "forwarded": self.forwarded, "partitions": out,
                                  "cluster_address": self.internal_address,
                                  "authenticated": self.verifier is not None,
                                  "replication": self.replication,
                                  "streams_served": len(self.server.served_streams),
                                  "refused": dict(self.refusals.counts)})
