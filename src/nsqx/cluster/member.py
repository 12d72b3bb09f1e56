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
  heads and frames, ``_serve_fetch`` on the leader for both), or with
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
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from nsqx.cluster.archive_fence import fence_for
from nsqx.cluster.etcd import EtcdClient, EtcdError
from nsqx.cluster.fetchconn import FetchConnection
from nsqx.cluster.forward import forward_command
from nsqx.cluster.forwarding import Forwarder
from nsqx.cluster.metadata import ClusterMetadata, Versioned
from nsqx.cluster.model import MetaError, NodeInfo, PartitionMeta, TopicMeta
from nsqx.cluster.outage import Outage
from nsqx.cluster.placement import expand_isr, shrink_isr
from nsqx.cluster.replication import LeaderProgress, Regressed, truncation_point
from nsqx.cluster.restart import step_down_after_restart
from nsqx.cluster.route_store import (
    HeldResets,
    ResetRecord,
    parse_pass_key,
    parse_reset_key,
    pass_key,
    passes_prefix,
    reset_key,
    resets_prefix,
    routes_prefix,
)
from nsqx.cluster.stream import PATH as STREAM_PATH
from nsqx.cluster.stream import StreamConnection, StreamRefused, cork, serve
from nsqx.cluster.topic_delete import LocalCopies, local_names, refuse_imported_topics
from nsqx.cluster.trust import (
    RefusalLog,
    Refused,
    SignedSession,
    Signer,
    Verifier,
    receiver_name,
)
from nsqx.httpapi import make_runner
from nsqx.httpbase import HTTPError
from nsqx.netutil import bind_listener
from nsqx.nsqd.config_api import apply_settings, export_settings
from nsqx.nsqd.interfaces import ReplicaPartition
from nsqx.nsqd.routing import TopicRoutes
from nsqx.nsqd.topic import PublishRefused, settle
from nsqx.protocol.routes import RouteError, RouteHistory, routes_key

log = logging.getLogger("nsqx.cluster.member")

__all__ = ["NodeMember", "epoch_spans", "frame_runs"]

LAG_TIMEOUT = 3.0  # seconds a follower may stay behind before it leaves the ISR
FETCH_WAIT = 0.5  # long-poll at the tail
FETCH_MAX_BYTES = 4 << 20
CURSOR_EVERY = 1.0  # channel cursors ride with a fetch answer at least this often
ORDERED_CURSOR_EVERY = 0.1  # ...and for ordered topics with every answer, this often when idle
HTTP_ONLY_RETRY = 60.0  # a leader without the stream is asked again after this (upgraded?)
RESET_HOLD = 20.0  # a channel held for a cluster reset delivers again after this at most
_FRAME_HEAD = struct.Struct(">IIQH")  # size, type, timestamp, attempts


def epoch_spans(plog: Any) -> list[tuple[int, int]]:
    """(epoch, first offset) of each run of commits with one epoch, from the log's metadata."""
    spans: list[tuple[int, int]] = []
    for b in plog.batches(plog.start_offset):
        if b.count and (not spans or spans[-1][0] != b.epoch):
            spans.append((b.epoch, b.base_offset))
    return spans


def frame_runs(data: bytes, offset: int, spans: list[tuple[int, ...]]
               ) -> list[tuple[int, int, int, int, int, list[int]]]:
    """Cut stored frames into runs that share a timestamp and an epoch (one leader batch
    each): (first offset, count, byte start, byte end, timestamp, frame lengths)."""
    runs: list[tuple[int, int, int, int, int, list[int]]] = []
    starts = {s[1] for s in spans}
    pos, n, off = 0, len(data), offset
    unpack = _FRAME_HEAD.unpack_from
    cur_ts = -1
    lens: list[int] = []
    first = lo = 0
    while pos < n:
        if n - pos < 34:
            raise ValueError("truncated frame")
        size, ftype, ts, _ = unpack(data, pos)
        if ftype != 2 or size < 30 or pos + 4 + size > n:
            raise ValueError(f"malformed frame at byte {pos}")
        if ts != cur_ts or off in starts:
            if lens:
                runs.append((first, len(lens), lo, pos, cur_ts, lens))
            first, lo, cur_ts, lens = off, pos, ts, []
        lens.append(size + 4)
        pos += 4 + size
        off += 1
    if lens:
        runs.append((first, len(lens), lo, pos, cur_ts, lens))
    return runs


class StaleEpoch(Exception):
    pass


class NotAMember(Exception):
    """The leader refused this node's credential (401/403): another secret, a clock more
    than 30 s off, or a registration the leader does not see yet."""


def _check_answer(status: int, raw: Any) -> None:
    if status == 409:
        raise StaleEpoch(bytes(raw).decode(errors="replace"))
    if status in (401, 403):
        raise NotAMember(f"HTTP {status}: {bytes(raw[:300]).decode(errors='replace')}")
    if status == 416:
        raise StaleEpoch("offset beyond the leader's log: truncate again")
    if status != 200:
        raise ValueError(f"HTTP {status}: {bytes(raw[:200])!r}")


# ------------------------------------------------------------------------------------- gates
class FollowerGate:
    """Client publishes go to the leader; this replica only copies it.

    A publish that reaches a follower is forwarded to the leader over NSQ's own protocol
    and acknowledged when the leader acknowledges it (after the leader's ISR), so a stock
    producer pointed at any node of the cluster works. A partitioned topic's publish goes
    to the leader of the partition this node picked (``PUB <topic> <partition>``), headers
    and trace ids included (``PUB_EXT``/``MPUB_EXT``/``MPUB_TRACE``); a deferred one (DPUB
    names no partition) to the leader, which spreads it over the partitions it leads.
    """

    forwards = True

    def __init__(self, leader: str | None, member: NodeMember | None = None) -> None:
        self.leader = leader
        self.member = member

    def forward(self, topic: Any, bodies: list[bytes], defer_ms: int, done: Callable,
                headers: list[dict[str, bytes] | None] | None = None) -> bool:
        if self.member is None:  # a leader may exist by the time the forward retries
            return False
        if defer_ms and (len(bodies) != 1 or (headers is not None and any(headers))):
            return False  # DPUB is one message without headers
        partition = topic.partition if len(topic.partitions) > 1 or topic.ordered else None
        command = forward_command(topic.name, partition, bodies, defer_ms, headers)
        return self.member.forward(topic, bodies, defer_ms, headers, command, done)

    def refuse(self, topic: Any, count: int) -> str | None:
        return (f"TOPIC({topic.name}) PARTITION({topic.partition}): this node is not the "
                f"leader (leader: {self.leader or 'none'})")

    def wrap(self, topic: Any, end_offset: int, done: Callable) -> Callable:
        return done

    def refuse_consumers(self, topic: Any) -> str | None:
        return self.refuse(topic, 0)


class UnknownTopicGate:
    """A topic the cluster has not created: refused, with how to create it."""

    forwards = False

    def __init__(self, root: str) -> None:
        self.root = root

    def forward(self, *_args: Any) -> bool:
        return False  # refused: the topic must be created first

    def refuse(self, topic: Any, count: int) -> str | None:
        return (f"TOPIC({topic.name}): not created in the cluster ({self.root}); create it "
                f"with `nsqx topic create` or nsqlookupd's /topic/create")

    def wrap(self, topic: Any, end_offset: int, done: Callable) -> Callable:
        return done

    def refuse_consumers(self, topic: Any) -> str | None:
        return None  # consumers may come first; a role change later moves them


class LeaderGate:
    """Admits publishes while this node leads with enough in-sync replicas; acks after ISR."""

    def __init__(self, member: NodeMember, topic: Any, meta: PartitionMeta, min_isr: int) -> None:
        self.member = member
        self.topic = topic
        self.meta = meta
        self.min_isr = min_isr
        self.progress = LeaderProgress(set(meta.isr), lag_timeout=member.lag_timeout)
        self.waiters: list[tuple[int, int, Callable]] = []  # (end offset, base, done)
        self.active = True
        self.new_data = asyncio.Event()
        self.last_cursor_sent: dict[str, float] = {}
        self._last_read: tuple | None = None  # (offset, end, max_bytes, data, count)
        # the log's epoch history, read once; this epoch starts at the current end
        self.spans = epoch_spans(topic.log)
        if not self.spans or self.spans[-1][0] != meta.epoch:
            self.spans.append((meta.epoch, topic.log.next_offset))

    def refuse(self, topic: Any, count: int) -> str | None:
        if not self.active:
            return f"TOPIC({topic.name}) PARTITION({topic.partition}): leadership lost"
        if len(self.meta.isr) < self.min_isr:
            return (f"TOPIC({topic.name}) PARTITION({topic.partition}): only "
                    f"{len(self.meta.isr)} in-sync replicas, {self.min_isr} needed")
        return None

    def wrap(self, topic: Any, end_offset: int, done: Callable) -> Callable:
        def committed(base: int, exc: Exception | None) -> None:
            if exc is not None:
                done(base, exc)
                return
            if not self.active:
                done(base, _refused(topic, "leadership lost before replication"))
                return
            self.waiters.append((end_offset, base, done))
            self.new_data.set()
            self.release()
        return committed

    def refuse_consumers(self, topic: Any) -> str | None:
        return None if self.active else self.refuse(topic, 0)

    forwards = False

    def forward(self, *_args: Any) -> bool:
        return False  # this node leads: a refusal stands

    def read(self, offset: int, max_bytes: int) -> tuple[Any, int]:
        """Frames from offset to the flushed end (up to max_bytes) and their count; the
        followers usually ask for the same range, so the last read is shared (reading
        several chunks joins them: one copy of the frames, not one per follower)."""
        plog = self.topic.log
        end = plog.flushed_offset
        last = self._last_read
        if last is not None and last[0] == offset and last[1] == end and last[2] == max_bytes:
            return last[3], last[4]
        r = plog.read(offset, max_bytes, end - offset)
        self._last_read = (offset, end, max_bytes, r.data, r.count)
        return r.data, r.count

    def acked_end(self) -> int:
        return self.progress.acked_end(self.topic.log.flushed_offset, self.member.node_id)

    def release(self) -> None:
        """Acknowledge what every ISR member has; first let channels read up to it."""
        hw = self.acked_end()
        if hw > self.topic.readable_end and self.active:
            self.topic.advance_readable(hw)  # the high watermark: consumers see acked only
        if not self.waiters:
            return
        if len(self.meta.isr) < self.min_isr:
            # the ISR shrank under the waiting appends: acking them now would be unsafe
            waiters, self.waiters = self.waiters, []
            why = f"only {len(self.meta.isr)} in-sync replicas, {self.min_isr} needed"
            for _end, base, done in waiters:
                done(base, _refused(self.topic, why))
            return
        if self.waiters[0][0] > hw:
            return
        keep = []
        for end, base, done in self.waiters:
            if end <= hw:
                done(base, None)
            else:
                keep.append((end, base, done))
        self.waiters = keep

    def refuse_waiting(self, why: str) -> None:
        """Fail the publishes waiting for replication (they may still be in the log)."""
        waiters, self.waiters = self.waiters, []
        for _end, base, done in waiters:
            done(base, _refused(self.topic, why))

    def on_meta(self, meta: PartitionMeta) -> None:
        self.meta = meta
        self.progress.isr = set(meta.isr)
        self.release()

    def deposed(self, why: str) -> None:
        self.active = False
        waiters, self.waiters = self.waiters, []
        for _end, base, done in waiters:
            done(base, _refused(self.topic, why))
        self.new_data.set()


class _FramesResponse(web.StreamResponse):
    """A fetch answer: its HTTP headers wait for the first write, as aiohttp's Response's do
    (a StreamResponse sends them alone: one more send per fetch)."""

    _send_headers_immediately = False


def _answer(status: int, obj: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


def _refused(topic: Any, why: str) -> Exception:
    return PublishRefused(f"TOPIC({topic.name}) PARTITION({topic.partition}): {why}")


# ------------------------------------------------------------------------------------ member
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
        # mutual TLS between members (server, client contexts; --cluster-tls-*)
        self.tls_server, self.tls_client = tls if tls is not None else (None, None)
        self._internal_runner: web.AppRunner | None = None
        self._refused_warned: dict[str, float] = {}  # leader -> when a refusal was last logged
        # fetches go over one stream per leader (--cluster-replication=stream) or HTTP
        self.replication = getattr(nsqd.opts, "cluster_replication", "stream") or "stream"
        self._streams: dict[str, StreamConnection] = {}  # leader's cluster address -> stream
        self._http_only: dict[str, float] = {}  # leaders without the stream: since when
        self._served_streams: set[asyncio.Future[None]] = set()  # followers' streams here
        self.internal_address = ""
        self.etcd = EtcdClient(endpoints)
        self.meta = ClusterMetadata(self.etcd, cluster_id)
        self.ttl = max(2, round(ttl))
        self.lag_timeout = lag_timeout
        self.node_id = ""
        self.lease = 0
        self.info: NodeInfo | None = None
        self.partitions: dict[tuple[str, int], PartitionMeta] = {}
        self.topic_meta: dict[str, TopicMeta] = {}
        self.gates: dict[tuple[str, int], LeaderGate | FollowerGate] = {}
        self.followers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._following: dict[tuple[str, int], tuple[str | None, int]] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.node_leases: dict[str, int] = {}  # node -> its registration's lease: one run of it
        self._tasks: list[asyncio.Task[None]] = []
        self._http: SignedSession | None = None
        self.forwarder = Forwarder(self)  # publishes that reach this node as a follower
        self.copies = LocalCopies(Path(nsqd.data_path), nsqd.delete_topic, self._reconcile)
        nsqd.topic_delete_hook = self.delete_topic
        self.forwarded = 0
        self.etcd_ok = True
        self.watch_outage = Outage("CLUSTER: metadata watch", log)  # backoff, one line a state
        # route-managed ordered topics: their histories and the barrier passes recorded by
        # the leaders (this node's own included), both from the etcd watch
        self.route_histories: dict[str, RouteHistory] = {}
        self.route_passes: dict[str, dict[str, set[int]]] = {}
        self._passes_sent: set[tuple[str, str, int]] = set()
        self._pass_tasks: set[asyncio.Task[None]] = set()
        self.route_resets: dict[tuple[str, str], ResetRecord] = {}
        self.held_resets = HeldResets(Path(nsqd.data_path) / "cluster-reset-holds.json")
        nsqd.http_route_hooks.append(self.add_routes)
        nsqd.topic_hooks.append(self._on_new_topic)
        if getattr(nsqd, "archiver", None) is not None:  # --archive-url: files count once
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
        from nsqx import NSQ_VERSION

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
        port = getattr(self.nsqd.opts, "broadcast_cluster_port", 0) or port
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
        self._http = SignedSession(self.signer, ssl=self.tls_client)
        for topic in list(self.nsqd.topics.values()):  # until the metadata says otherwise
            if not topic.ephemeral:
                for part in topic.partitions:
                    self._guard(part)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._membership(), name="cluster membership"))
        self._tasks.append(loop.create_task(self._watch(), name="cluster metadata"))
        self._tasks.append(loop.create_task(self._isr_loop(), name="cluster ISR"))
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
        if self._http is not None:
            await self._http.close()
        for conn in self._streams.values():
            conn.close()
        for done in self._served_streams:
            if not done.done():
                done.set_result(None)
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
                    self._reconcile()
            except EtcdError as e:
                await self.watch_outage.failed(e)

    def _load(self, kvs: list) -> None:
        self.partitions.clear()
        self.topic_meta.clear()
        self.nodes.clear()
        self.node_leases.clear()
        self.route_histories.clear()
        self.route_passes.clear()
        self.route_resets.clear()
        for kv in kvs:
            self._apply_kv(kv.key, kv.value, kv.lease)
        self._reconcile()

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
            elif key.startswith(routes_prefix(keys.root)):
                name = key[len(routes_prefix(keys.root)):].decode()
                if value is None:
                    self.route_histories.pop(name, None)
                else:
                    self.route_histories[name] = RouteHistory.from_json(value)
            elif key.startswith(passes_prefix(keys.root)):
                found = parse_pass_key(keys.root, key)
                if found is not None:
                    topic, channel, p = found
                    passes = self.route_passes.setdefault(topic, {}).setdefault(channel, set())
                    if value is not None:
                        passes.add(p)
                    else:  # a cluster reset of the channel walks that partition again
                        passes.discard(p)
                        self._passes_sent.discard((topic, channel, p))
            elif key.startswith(resets_prefix(keys.root)):
                where = parse_reset_key(keys.root, key)
                if where is not None:
                    if value is None:
                        self.route_resets.pop(where, None)
                    else:
                        self.route_resets[where] = ResetRecord.from_json(value)
        except (ValueError, KeyError, TypeError, MetaError) as e:
            log.warning("CLUSTER: ignoring malformed metadata %r: %s", key, e)

    def _reconcile(self) -> None:
        """Bring every local partition to the role the metadata gives it."""
        self.copies.sweep(self.topic_meta, local_names(self.nsqd.topics))  # deleted topics
        for k, pm in self.partitions.items():
            if self.node_id not in pm.replicas:
                self._drop_role(k)
                continue
            tm = self.topic_meta.get(pm.topic)
            if self.copies.stale(pm.topic, tm, pm.topic in self.nsqd.topics):
                self._drop_role(k)  # an earlier topic's copy: a role once it is deleted
                continue
            topic = self._local_partition(pm.topic, pm.partition)
            if topic is None:
                continue
            if tm is not None:
                self.copies.holds(tm)
            if tm is not None and topic.sync_every != tm.sync_every:
                topic.set_sync_every(tm.sync_every)  # the topic's fsync policy, on every replica
            gate = self.gates.get(k)
            if pm.leader == self.node_id:
                if isinstance(gate, LeaderGate) and gate.meta.epoch == pm.epoch and gate.active:
                    gate.on_meta(pm)
                    continue
                self._become_leader(k, topic, pm)
            else:
                if isinstance(gate, FollowerGate) and k in self.followers and \
                        self._following.get(k) == (pm.leader, pm.epoch):
                    continue
                self._become_follower(k, topic, pm)
        for k in [k for k in self.gates if k not in self.partitions]:
            self._drop_role(k)
        for topic in list(self.nsqd.topics.values()):
            if not topic.ephemeral:
                for part in topic.partitions:
                    self._guard(part)
        for name in list(self.route_histories):
            self._sync_routes(name)

    # -- route-managed ordered topics -------------------------------------------------------
    def _sync_routes(self, name: str) -> None:
        """Give the local topic the route history from etcd and the barrier passes other
        nodes recorded (nsqd's TopicRoutes never reads etcd itself)."""
        h = self.route_histories.get(name)
        topic = self.nsqd.topics.get(name)
        if h is None or topic is None:
            return
        routes = topic.routes
        if routes is None:
            routes = TopicRoutes.mirror(self.nsqd, topic, h, lambda p: self._leads(name, p),
                                        lambda ch, p: self._record_pass(name, ch, p))
            for part in topic.partitions:
                if not topic.ephemeral:
                    self._guard(part)
        elif (routes.history.newest.version, routes.history.pending is not None) <= (
                h.newest.version, h.pending is not None):  # never back to an older copy
            routes.apply(h)
        for channel, parts in self.route_passes.get(name, {}).items():
            routes.set_passes(channel, parts)
        was_held = self.held_resets.restored(name)  # held when this node stopped
        for (topic, channel), rec in self.route_resets.items():
            # a reset this node was prepared for (held) whose apply call did not come (the
            # coordinator died after its transaction, or gave up while the node restarted)
            if topic == name and (channel in routes.held or channel in was_held) and \
                    rec.gen > routes.reset_gen(channel):
                self._clear_sent(name, channel)
                routes.apply_reset(channel, rec.gen, rec.version, rec.offsets,
                                   set(self.route_passes.get(name, {}).get(channel, ())))
        routes.subscribe_led()

    def _leads(self, name: str, p: int) -> bool:
        gate = self.gates.get((name, p))
        return isinstance(gate, LeaderGate) and gate.active

    def _record_pass(self, name: str, channel: str, p: int) -> None:
        """A channel passed the command message of a partition this node leads: record it in
        etcd (once), so the nodes leading the next version's partitions open them to it."""
        k = (name, channel, p)
        if k in self._passes_sent or not self._leads(name, p):
            return
        self._passes_sent.add(k)
        self.route_passes.setdefault(name, {}).setdefault(channel, set()).add(p)
        task = asyncio.get_running_loop().create_task(self._put_pass(name, channel, p),
                                                      name=f"pass {name}/{channel}")
        self._pass_tasks.add(task)
        task.add_done_callback(self._pass_tasks.discard)

    def _clear_sent(self, name: str, channel: str) -> None:
        self._passes_sent = {k for k in self._passes_sent if k[:2] != (name, channel)}

    async def _put_pass(self, name: str, channel: str, p: int) -> None:
        key = pass_key(self.meta.keys.root, name, channel, p)
        for attempt in range(100):
            try:
                await self.etcd.put(key, b"1")
                log.info("CLUSTER: TOPIC(%s) CHANNEL(%s): passed the command message of "
                         "partition %d (recorded for the other nodes)", name, channel, p)
                return
            except EtcdError as e:
                log.warning("CLUSTER: recording a route pass failed (%s); retry %d", e, attempt)
                await asyncio.sleep(0.5)
        self._passes_sent.discard((name, channel, p))

    async def h_route_seal(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/seal?topic=T&partition=P&version=V`` (the coordinator): append
        the command message of route version V to P, which this node leads, and answer once
        the ISR has it. The history is read from etcd first, so the seal never runs ahead of
        the pending change it belongs to."""
        caller = await self._caller(request)
        if isinstance(caller, web.Response):
            return caller
        q = request.query
        try:
            name, p, version = q["topic"], int(q["partition"]), int(q["version"])
        except (KeyError, ValueError):
            return _answer(400, {"message": "E_INVALID",
                                 "detail": "topic, partition and version are required"})
        gate = self.gates.get((name, p))
        if not isinstance(gate, LeaderGate) or not gate.active:
            return _answer(409, {"message": "E_NOT_LEADER"})
        try:
            kv = await self.etcd.get(routes_key(self.meta.keys.root, name))
        except EtcdError as e:
            return _answer(503, {"message": f"E_CLUSTER_UNAVAILABLE: {e}"})
        if kv is None:
            return _answer(404, {"message": "TOPIC_NOT_FOUND"})
        h = RouteHistory.from_json(kv.value)
        if h.retired_in(p) != version:
            return _answer(400, {"message": f"partition {p} is not retired by route version "
                                            f"{version}"})
        known = self.route_histories.get(name)
        if known is None or (known.newest.version, known.pending is not None) <= (
                h.newest.version, h.pending is not None):
            self.route_histories[name] = h  # the watch may not have brought it yet
        self._sync_routes(name)
        routes = gate.topic.routes
        if routes is None:
            return _answer(409, {"message": "E_NOT_ROUTE_MANAGED"})
        try:
            off, fut = routes.seal(p)
            if fut is not None:
                await fut
        except RouteError as e:
            return _answer(400, {"message": str(e)})
        if gate.acked_end() <= off:  # wait until the ISR has the command message
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            gate.wrap(gate.topic, off + 1, settle(done))(off, None)
            try:
                await asyncio.wait_for(done, 10)
            except (TimeoutError, PublishRefused) as e:
                return _answer(503, {"message": f"command message not replicated: {e}"})
        log.info("CLUSTER: TOPIC(%s) PARTITION(%d): sealed for route version %d (command "
                 "message at %d)", name, p, version, off)
        return _answer(200, {"offset": off})

    # -- cluster reset of a channel (the coordinator's steps on this node) -------------------
    async def _reset_target(self, request: web.Request
                            ) -> tuple[str, str, Any] | web.Response:
        caller = await self._caller(request)
        if isinstance(caller, web.Response):
            return caller
        q = request.query
        name, channel = q.get("topic", ""), q.get("channel", "")
        try:
            pass_key(self.meta.keys.root, name, channel, 0)  # validates both names
        except RouteError as e:
            return _answer(400, {"message": "E_INVALID", "detail": str(e)})
        topic = self.nsqd.topics.get(name)
        return name, channel, topic.routes if topic is not None else None

    async def h_reset_prepare(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/reset/prepare?topic=T&channel=C&to=POS`` (the coordinator):
        hold channel C on this node (nothing delivered, so no barrier pass is recorded),
        wait for the pass records already under way, and report, per partition this node
        leads, where POS is, the log's bounds and the command message's offset."""
        from nsqx.protocol.errors import ProtocolError
        from nsqx.protocol.v2 import parse_start_position

        found = await self._reset_target(request)
        if isinstance(found, web.Response):
            return found
        name, channel, routes = found
        try:
            pos = parse_start_position(request.query.get("to", "").encode())
        except ProtocolError:
            return _answer(400, {"message": "E_INVALID", "detail": "bad position"})
        if routes is None:  # this node holds nothing of the topic
            return _answer(200, {"node": self.node_id, "partitions": {}})
        routes.hold(channel, RESET_HOLD)
        self.held_resets.add(name, channel)
        busy = [t for t in self._pass_tasks if t.get_name() == f"pass {name}/{channel}"]
        if busy:
            _done, pending = await asyncio.wait(busy, timeout=5)
            if pending:
                routes.release(channel)
                return _answer(503, {"message": "E_CLUSTER_UNAVAILABLE",
                                     "detail": f"{self.node_id}: a barrier pass of {channel} "
                                               f"could not be recorded in etcd"})
        parts = routes.prepare_reset(channel, pos)
        return _answer(200, {"node": self.node_id,
                             "partitions": {str(p): v for p, v in parts.items()}})

    async def h_reset_apply(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/reset/apply?topic=T&channel=C&gen=N``: apply the reset record
        N the coordinator committed (read from etcd with the channel's pass keys, so this
        never acts on an older watch view), then deliver again."""
        found = await self._reset_target(request)
        if isinstance(found, web.Response):
            return found
        name, channel, routes = found
        try:
            gen = int(request.query.get("gen", ""))
            kv = await self.etcd.get(reset_key(self.meta.keys.root, name, channel))
            kvs, _ = await self.etcd.get_prefix(passes_prefix(self.meta.keys.root)
                                                + f"{name}/{channel}/".encode())
        except ValueError:
            return _answer(400, {"message": "E_INVALID", "detail": "gen must be an integer"})
        except EtcdError as e:
            return _answer(503, {"message": "E_CLUSTER_UNAVAILABLE", "detail": str(e)})
        if kv is None:
            return _answer(404, {"message": "E_NO_RESET"})
        rec = ResetRecord.from_json(kv.value)
        if rec.gen != gen:
            return _answer(409, {"message": "E_STALE_RESET", "gen": rec.gen})
        self.route_resets[(name, channel)] = rec
        self.held_resets.discard(name, channel)
        passes = {pk[2] for k in kvs if (pk := parse_pass_key(self.meta.keys.root, k.key))}
        self.route_passes.setdefault(name, {})[channel] = set(passes)
        self._clear_sent(name, channel)
        applied = False
        if routes is not None:
            applied = routes.apply_reset(channel, rec.gen, rec.version, rec.offsets, passes)
            routes.subscribe_led()
        return _answer(200, {"node": self.node_id, "applied": applied, "gen": rec.gen})

    async def h_reset_release(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/reset/release?topic=T&channel=C``: the coordinator gave the
        reset up before its transaction: deliver again, nothing changed."""
        found = await self._reset_target(request)
        if isinstance(found, web.Response):
            return found
        name, channel, routes = found
        self.held_resets.discard(name, channel)
        if routes is not None:
            routes.release(channel)
        return _answer(200, {"node": self.node_id})

    def _guard(self, part: ReplicaPartition) -> None:
        """A local partition this node holds no role for may not take publishes."""
        part.hold_reads_from_start()
        k = (part.name, part.partition)
        if k in self.gates:
            return
        if part.name not in self.topic_meta:
            if not isinstance(part.gate, UnknownTopicGate):
                part.attach_gate(UnknownTopicGate(self.meta.keys.root.decode()))
        else:
            pm = self.partitions.get(k)
            part.attach_gate(FollowerGate(pm.leader if pm else None, self))

    def _on_new_topic(self, topic: Any) -> None:
        """A topic this node made (a PUB or SUB to a new name): not writable unless the
        cluster made this node its leader, so nothing is ever acknowledged unreplicated."""
        if not topic.ephemeral:
            for part in topic.partitions:
                self._guard(part)

    def _local_partition(self, name: str, p: int) -> Any:
        topic = self.nsqd.get_topic(name)
        if topic is None:
            return None
        parts = topic.partitions
        ensure = getattr(self.nsqd, "ensure_partitions", None)
        tm = self.topic_meta.get(name)
        if p < len(parts) and not (tm is not None and tm.ordered and not topic.ordered):
            return parts[p]
        if ensure is not None and tm is not None:
            # more partitions than this node has, or an ordered topic it holds as plain (a
            # one-partition ordered topic was created here as a plain one)
            ensure(name, tm.partitions, ordered=tm.ordered)
            parts = topic.partitions
            if p < len(parts):
                return parts[p]
        log.error("CLUSTER: TOPIC(%s) PARTITION(%d): this nsqd cannot hold partition %d",
                  name, p, p)
        return None

    def _become_leader(self, k: tuple[str, int], topic: ReplicaPartition,
                       pm: PartitionMeta) -> None:
        self._stop_following(k)
        old = self.gates.get(k)
        if isinstance(old, LeaderGate):
            old.deposed("new epoch")
        tm = self.topic_meta.get(pm.topic)
        min_isr = tm.effective_min_isr if tm else min(2, len(pm.replicas))
        gate = LeaderGate(self, topic, pm, min_isr)
        topic.attach_gate(gate, pm.epoch)
        self.gates[k] = gate
        topic.restore_deferred()  # before anything is delivered: DPUBs due later stay deferred
        gate.release()  # reads go on from this node's high watermark as the ISR catches up
        log.info("CLUSTER: TOPIC(%s) PARTITION(%d): leading at epoch %d, ISR %s, log end %d",
                 pm.topic, pm.partition, pm.epoch, ",".join(pm.isr), topic.log.flushed_offset)

    def _become_follower(self, k: tuple[str, int], topic: ReplicaPartition,
                         pm: PartitionMeta) -> None:
        old = self.gates.get(k)
        if isinstance(old, LeaderGate):
            old.deposed(f"deposed by epoch {pm.epoch}")
            log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): no longer leader (epoch %d, leader %s)",
                        pm.topic, pm.partition, pm.epoch, pm.leader)
        self._stop_following(k)
        gate = FollowerGate(pm.leader, self)
        topic.attach_gate(gate, pm.epoch)
        for ch in list(topic.channels.values()):  # they find the leader again through lookupd
            for client in list(ch.clients.values()):
                log.info("CLUSTER: TOPIC(%s) PARTITION(%d) CHANNEL(%s): closing consumer %s: "
                         "this node no longer leads", pm.topic, pm.partition, ch.name, client)
                client.close()
        self.gates[k] = gate
        if pm.leader is not None:
            self._following[k] = (pm.leader, pm.epoch)
            self.followers[k] = asyncio.get_running_loop().create_task(
                self._follow(topic, pm), name=f"follow {pm.topic}/{pm.partition}")

    def _stop_following(self, k: tuple[str, int]) -> None:
        task = self.followers.pop(k, None)
        self._following.pop(k, None)
        if task is not None:
            task.cancel()

    def _drop_role(self, k: tuple[str, int]) -> None:
        self._stop_following(k)
        gate = self.gates.pop(k, None)
        if isinstance(gate, LeaderGate):
            gate.deposed("no longer a replica")
            for ch in list(gate.topic.channels.values()):  # moved away: they follow lookupd
                for client in list(ch.clients.values()):
                    client.close()

    # -- follower ---------------------------------------------------------------------------
    async def _follow(self, topic: Any, pm: PartitionMeta) -> None:
        conns: list[FetchConnection] = []  # the keep-alive connection to the leader
        try:
            await self._follow_loop(topic, pm, conns)
        finally:
            for conn in conns:
                conn.close()

    async def _follow_loop(self, topic: Any, pm: PartitionMeta,
                           conns: list[FetchConnection]) -> None:
        name, p, epoch = pm.topic, pm.partition, pm.epoch
        truncated = False
        while True:
            leader = self.nodes.get(pm.leader or "")
            try:
                if leader is None:
                    await asyncio.sleep(0.2)
                    continue
                if not conns or conns[0].address != leader.internal_address:
                    for old in conns:
                        old.close()
                    conns[:] = [FetchConnection(leader.internal_address, self.tls_client)]
                base = f"http://{leader.internal_address}/nsqx/replica"
                if not truncated:
                    info = await self._get_json(f"{base}/epochs", topic=name, partition=p,
                                                epoch=epoch, node=self.node_id)
                    plog = topic.log
                    cut = truncation_point(epoch_spans(plog), plog.flushed_offset,
                                           [tuple(s) for s in info["spans"]], int(info["end"]))
                    if cut < plog.flushed_offset:
                        log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): truncating %d diverged "
                                    "records (%d -> %d) to follow %s at epoch %d", name, p,
                                    plog.flushed_offset - cut, plog.flushed_offset, cut,
                                    pm.leader, epoch)
                        topic.truncate_to(cut)
                    truncated = True
                await self._fetch_once(topic, conns[0], name, p, epoch)
            except StaleEpoch:
                await asyncio.sleep(0.2)  # wait for the metadata to move on
                truncated = False
            except NotAMember as e:
                now = time.monotonic()
                if now - self._refused_warned.get(pm.leader or "", -60.0) >= 60:
                    self._refused_warned[pm.leader or ""] = now
                    log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): leader %s refuses this "
                                "node's fetches: %s (same --cluster-secret-file everywhere? "
                                "clocks within 30 s?)", name, p, pm.leader, e)
                await asyncio.sleep(0.5)
                truncated = False
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as e:
                log.info("CLUSTER: TOPIC(%s) PARTITION(%d): fetch from %s failed: %s",
                         name, p, pm.leader, e)
                await asyncio.sleep(0.3)
                truncated = False

    def _sign(self, method: str, path: str, params: dict[str, str], *, to: str
              ) -> dict[str, str] | None:
        """Signature headers of a request to the member at cluster address ``to``."""
        return self.signer.headers(method, path, params, to=to) if self.signer else None

    async def _get_json(self, url: str, **params: Any) -> dict:
        assert self._http is not None
        async with self._http.get(url, params=params,
                                  timeout=aiohttp.ClientTimeout(total=5)) as resp:
            raw = await resp.read()
            _check_answer(resp.status, raw)
            return orjson.loads(raw)

    async def _fetch_once(self, topic: Any, conn: FetchConnection, name: str, p: int,
                          epoch: int) -> None:
        offset = topic.log.flushed_offset
        stream = self._stream_to(conn.address)
        if stream is not None:
            try:
                status, head_raw, frames = await stream.fetch(
                    name, p, epoch, offset, FETCH_MAX_BYTES, int(FETCH_WAIT * 1000),
                    FETCH_WAIT + 5)
            except StreamRefused as e:
                if e.status not in (404, 405):
                    _check_answer(e.status, e.body)
                log.warning("CLUSTER: the leader at %s has no replication stream (an older "
                            "member?): fetching over HTTP from it", conn.address)
                self._http_only[conn.address] = time.monotonic()
                stream.close()
                return
            _check_answer(status, head_raw)
        else:
            params = {"topic": name, "partition": str(p), "offset": str(offset),
                      "epoch": str(epoch), "node": self.node_id,
                      "wait_ms": str(int(FETCH_WAIT * 1000))}
            status, raw = await conn.get("/nsqx/replica/fetch", params, FETCH_WAIT + 5,
                                         self._sign("GET", "/nsqx/replica/fetch", params,
                                                    to=conn.address))
            _check_answer(status, raw)
            nl = _index_nl(raw)
            head_raw, frames = raw[:nl], raw[nl + 1:]
        head = orjson.loads(head_raw)
        # frames: a view, sliced per commit: the log keeps these bytes
        if head["start"] != offset:
            raise ValueError(f"leader answered from {head['start']}, asked {offset}")
        if frames:
            await self._append(topic, offset, frames, head)
        if "hw" in head:  # the leader's high watermark: where this node starts if it leads
            topic.advance_readable(int(head["hw"]))
        for ch_name, confirmed in (head.get("channels") or {}).items():
            self._advance_channel(topic, ch_name, int(confirmed))
        if isinstance(head.get("settings"), dict) and apply_settings(topic, head["settings"]):
            self.nsqd.metadata_changed()  # the leader's settings, kept for a failover

    def _stream_to(self, address: str) -> StreamConnection | None:
        """The stream to the leader at ``address`` (shared by every partition it leads for
        this node), or None to fetch over HTTP."""
        if self.replication != "stream" or \
                time.monotonic() - self._http_only.get(address, -HTTP_ONLY_RETRY) < HTTP_ONLY_RETRY:
            return None
        conn = self._streams.get(address)
        if conn is None:
            conn = self._streams[address] = StreamConnection(
                address, self.node_id, ssl=self.tls_client,
                sign=self._sign if self.signer else None)
        return conn

    async def _append(self, topic: Any, offset: int, frames: memoryview, head: dict) -> None:
        """Append the leader's frames as they are: one batch per leader commit when the
        answer lists them (``commits``: no per-message Python here), else one per run of
        (timestamp, epoch) found by walking the frames (a range starting inside a commit)."""
        spans = [tuple(x) for x in head.get("spans", ())]
        hdrs = {int(k): {hk: base64.b64decode(hv) for hk, hv in v.items()}
                for k, v in (head.get("headers") or {}).items()}
        futs = []
        loop = asyncio.get_running_loop()
        commits = head.get("commits")
        if commits:
            pos, n = 0, len(frames)
            for base, count, ts, max_ts, epoch, flen, lengths in commits:
                size = count * flen if flen else sum(lengths)
                if base != offset or pos + size > n:
                    raise ValueError(f"commit at {base} does not match the frames at {offset}")
                kw = {"epoch": epoch, "flen": flen, "lengths": lengths, "max_ts": max_ts}
                if hdrs:
                    headers = [hdrs.get(o) for o in range(base, base + count)]
                    if any(headers):
                        kw["headers"] = headers
                fut = loop.create_future()
                topic.committer.append_frames_cb(frames[pos:pos + size], count, settle(fut),
                                                 ts, **kw)
                futs.append(fut)
                pos += size
                offset += count
            if pos != n:
                raise ValueError(f"{n - pos} bytes of frames after the listed commits")
            await asyncio.gather(*futs)  # durable here before the next fetch acks it
            return
        for start, count, lo, hi, ts, lengths in frame_runs(frames, offset, spans):
            headers = [hdrs.get(o) for o in range(start, start + count)] if hdrs else None
            kw: dict = {"epoch": _epoch_at(spans, start, start + count)[0], "lengths": lengths}
            if headers and any(headers):
                kw["headers"] = headers
            fut = loop.create_future()
            topic.committer.append_frames_cb(frames[lo:hi], count, settle(fut), ts, **kw)
            futs.append(fut)
        await asyncio.gather(*futs)  # durable here before the next fetch acks it

    def _advance_channel(self, topic: ReplicaPartition, name: str, confirmed: int) -> None:
        ch = topic.channels.get(name) or topic.get_channel(name)
        if ch is None:
            return
        ch.mirror_confirmed(confirmed)

    # -- forwarding publishes to the leader ---------------------------------------------------
    def forward(self, topic: Any, bodies: list[bytes], defer_ms: int,
                headers: list[dict[str, bytes] | None] | None, command: bytes,
                done: Callable) -> bool:
        """Send a follower's publish to the partition's leader, whichever it is by then
        (``forwarding.Forwarder``); ``done`` is called with the outcome."""
        self.forwarded += len(bodies)
        self.forwarder.start(topic, bodies, defer_ms, headers, command, done)
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
        handlers = (self.h_epochs, self.h_fetch, self.h_stream, self.h_route_seal, self.h_reset_prepare,
                    self.h_reset_apply, self.h_reset_release)
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
        return self._refuse(request, Refused(
            403, "E_CLUSTER_PORT", f"internal endpoint: served to cluster members on "
            f"{self.internal_address or 'the cluster address'}, not on the public port"))

    def _refuse(self, request: web.Request, e: Refused) -> web.Response:
        self.refusals.record(e, request.remote or "?", request.path)
        return _answer(e.status, {"message": e.code, "detail": e.detail})

    async def _caller(self, request: web.Request) -> str | web.Response:
        """The member that signed the request, or the refusal; without a secret the node id
        the request claims (the unauthenticated, compatible mode)."""
        if self.verifier is None:
            return request.query.get("node", "")
        body = await request.read() if request.can_read_body else b""
        try:
            return self.verifier.verify(request.method, request.path, request.query.items(),
                                        body, request.headers)
        except Refused as e:
            return self._refuse(request, e)

    async def _leader_gate(self, request: web.Request
                           ) -> tuple[LeaderGate, Any, dict[str, str]] | web.Response:
        """The gate of the partition a replica (a signed member) asks for, or the answer
        refusing it."""
        caller = await self._caller(request)
        if isinstance(caller, web.Response):
            return caller
        q = request.query
        try:
            name = q["topic"]
            p = int(q.get("partition", "0"))
            epoch = int(q["epoch"])
        except (KeyError, ValueError):
            return _answer(400, {"message": "E_INVALID",
                                 "detail": "topic, partition and epoch are required integers"})
        gate = self._gate_of(name, p, epoch, request.remote or "?", request.path)
        if not isinstance(gate, LeaderGate):
            return _answer(409, gate)
        node = q.get("node")
        if node is not None and self.verifier is not None and node != caller:
            return self._refuse(request, Refused(
                403, "E_NODE_MISMATCH", f"signed by {caller}, asks as {node}"))
        return gate, gate.topic, dict(q)

    def _gate_of(self, name: str, p: int, epoch: int, peer: str, path: str
                 ) -> LeaderGate | dict[str, Any]:
        """This node's active gate of the partition at ``epoch``, or the 409 answer's body
        (the refusal counted): a deposed leader never collects acks."""
        gate = self.gates.get((name, p))
        if isinstance(gate, LeaderGate) and gate.active and gate.meta.epoch == epoch:
            return gate
        mine = gate.meta.epoch if isinstance(gate, LeaderGate) and gate.active else None
        self.refusals.record(Refused(409, "E_STALE_EPOCH", f"epoch {epoch} of {name}/{p} "
                                     f"(this node: {mine})"), peer, path)
        return {"message": "E_STALE_EPOCH", "leader_epoch": mine}

    async def h_epochs(self, request: web.Request) -> web.Response:
        found = await self._leader_gate(request)
        if isinstance(found, web.Response):
            return found
        gate, topic, _q = found
        return _answer(200, {"spans": gate.spans, "end": topic.log.flushed_offset})

    async def h_fetch(self, request: web.Request) -> web.StreamResponse:
        found = await self._leader_gate(request)
        if isinstance(found, web.Response):
            return found
        gate, _, q = found
        try:
            offset = int(q["offset"])
            node = q["node"]
            wait = int(q.get("wait_ms", "0")) / 1000  # clamped by _serve_fetch, as max_bytes
            max_bytes = int(q.get("max_bytes", FETCH_MAX_BYTES))
        except (KeyError, ValueError):
            return _answer(400, {"message": "E_INVALID",
                                 "detail": "offset and node are required, offset an integer"})
        try:
            status, head, data = await self._serve_fetch(gate, node, offset, wait, max_bytes)
        except Refused as e:
            return self._refuse(request, e)
        if status != 200:
            return _answer(status, head)
        # The frames go to the socket as they are. A Response body would be copied with the
        # head and again with the HTTP headers (aiohttp joins them: no writev on 3.11), and
        # copying large buffers here costs more than one more send (copy 350 KB: ~125 us,
        # send it: ~70 us); the small head goes with the HTTP headers.
        # TCP_CORK holds the first (small) send until the frames follow: one transmission
        # and one wakeup of the follower instead of two (py-spy --gil: the small send cost
        # the leader as much as the frames' send).
        line = orjson.dumps(head) + b"\n"
        resp = _FramesResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = len(line) + len(data)
        sock = request.transport.get_extra_info("socket") if data and request.transport else None
        corked = cork(sock, 1)
        try:
            await resp.prepare(request)
            await resp.write(line)
            if data:
                await resp.write(data)
        finally:
            if corked:
                cork(sock, 0)
        await resp.write_eof()
        return resp

    async def _serve_fetch(self, gate: LeaderGate, node: str, offset: int, wait: float,
                           max_bytes: int) -> tuple[int, dict[str, Any], Any]:
        """One fetch of ``node`` (already authenticated), over HTTP or the stream: (status,
        head or error body, frames). The offset is the follower's ack (``on_fetch``) before
        the answer long-polls at the tail; Refused when ``node`` has no live registration."""
        if node not in self.nodes:
            # a fetch is an ack: only from a member whose etcd registration (lease) is alive,
            # so a node whose lease ended rejoins the ISR only after it registers again
            raise Refused(403, "E_NOT_REGISTERED", f"node {node} has no live registration "
                          "in etcd")
        wait = min(max(wait, 0.0), 5.0)
        max_bytes = min(max(max_bytes, 1), 64 << 20)
        topic = gate.topic
        epoch = gate.meta.epoch
        plog = topic.log
        if offset > plog.flushed_offset or offset < plog.start_offset:
            return 416, {"message": "OFFSET_OUT_OF_RANGE", "start": plog.start_offset,
                         "end": plog.flushed_offset}, b""
        now = time.monotonic()
        try:  # one session per registration: a lower fetch in it is refused, not recorded
            gate.progress.on_fetch(node, offset, plog.flushed_offset, now,
                                   self.node_leases.get(node, 0))
        except Regressed as e:
            raise Refused(409, "E_OFFSET_REGRESSED", str(e)) from None
        gate.release()
        ordered = topic.ordered
        if ordered:  # ordered channels' cursors go with every answer, at least this often
            wait = min(wait, ORDERED_CURSOR_EVERY)
        if offset == plog.flushed_offset and wait:
            gate.new_data.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gate.new_data.wait(), wait)
            if not gate.active or gate.meta.epoch != epoch:
                return 409, {"message": "E_STALE_EPOCH", "leader_epoch": None}, b""
        data, count = b"", 0
        commits = None
        if offset < plog.flushed_offset:
            data, count = gate.read(offset, max_bytes)
            commits = plog.commits_range(offset, offset + count)
            if commits is None and count:
                # the read stopped inside a commit (max_bytes): send whole commits only,
                # unless one commit alone is larger (then the replica walks the frames)
                whole = _whole_commits(plog, offset, offset + count)
                if whole:
                    commits = whole
                    count = whole[-1][0] + whole[-1][1] - offset
                    data = memoryview(data)[:_commits_bytes(whole)]
        head: dict[str, Any] = {"start": offset, "count": count, "end": plog.flushed_offset,
                                "hw": gate.acked_end()}
        if count:
            head["spans"] = _spans_in(gate.spans, offset, offset + count)
            if commits is not None:  # the replica appends them as they are: no frame walk
                head["commits"] = commits
            hdrs = plog.headers_range(offset, offset + count)
            if hdrs:
                head["headers"] = {str(off): {k: base64.b64encode(v).decode()
                                              for k, v in h.items()} for off, h in hdrs.items()}
        last = gate.last_cursor_sent.get(node, 0.0)
        if ordered or now - last >= CURSOR_EVERY:
            gate.last_cursor_sent[node] = now
            head["channels"] = {c.name: c.confirmed for c in topic.channels.values()
                                if not c.ephemeral}
            head["settings"] = export_settings(topic)  # TTL, tracing, max attempts
        return 200, head, data

    async def h_stream(self, request: web.Request) -> web.StreamResponse:
        """A follower's replication stream (nsqx.cluster.stream): the handshake is checked as
        every internal request (signature, the signer is the node named, its registration is
        alive), then its fetches of every partition this node leads for it."""
        caller = await self._caller(request)
        if isinstance(caller, web.Response):
            return caller
        node = request.query.get("node", "")
        if self.verifier is not None and node != caller:
            return self._refuse(request, Refused(
                403, "E_NODE_MISMATCH", f"signed by {caller}, asks as {node}"))
        if node not in self.nodes:
            return self._refuse(request, Refused(
                403, "E_NOT_REGISTERED", f"node {node} has no live registration in etcd"))
        peer = request.remote or "?"

        async def fetch(name: str, p: int, epoch: int, offset: int, max_bytes: int,
                        wait: float) -> tuple[int, bytes, Any]:
            gate = self._gate_of(name, p, epoch, peer, STREAM_PATH)
            if not isinstance(gate, LeaderGate):
                return 409, orjson.dumps(gate), b""
            try:
                status, head, data = await self._serve_fetch(gate, node, offset, wait,
                                                             max_bytes)
            except Refused as e:
                self.refusals.record(e, peer, STREAM_PATH)
                return e.status, orjson.dumps({"message": e.code, "detail": e.detail}), b""
            return status, orjson.dumps(head), data

        return await serve(request, fetch, self._served_streams)

    async def h_state(self, request: web.Request) -> web.Response:
        """This node's view: role, epoch, log end per partition (``nsqx topic describe``)."""
        out = []
        for (name, p), gate in sorted(self.gates.items()):
            topic = self._local_partition(name, p)
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
                                  "streams_served": len(self._served_streams),
                                  "refused": dict(self.refusals.counts)})

    # -- leader side: ISR upkeep -----------------------------------------------------------
    async def _isr_loop(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            for k, gate in list(self.gates.items()):
                if not isinstance(gate, LeaderGate) or not gate.active:
                    continue
                try:
                    await self._isr_step(k, gate)
                except EtcdError as e:
                    log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): ISR update failed: %s",
                                k[0], k[1], e)
                    # a follower is gone and the ISR cannot shrink without etcd: what waits
                    # for it is refused (a clear E_PUB_FAILED) rather than left hanging
                    # or acked unsafely; publishing resumes once etcd answers again
                    gate.refuse_waiting(f"a follower stopped and etcd is unreachable ({e})")
                except MetaError as e:
                    log.info("CLUSTER: TOPIC(%s) PARTITION(%d): %s", k[0], k[1], e)

    async def _isr_step(self, k: tuple[str, int], gate: LeaderGate) -> None:
        end = gate.topic.log.flushed_offset
        now = time.monotonic()
        gate.progress.isr = set(gate.meta.isr)
        drop = gate.progress.laggards(end, now, self.node_id)
        join = [n for n in gate.meta.catchup
                if n in self.nodes and gate.progress.ready_to_join(n, end)]
        if not drop and not join:
            return
        current = (await self.meta.partitions(k[0])).get(k[1])
        if current is None:
            return
        if current.meta.leader != self.node_id or current.meta.epoch != gate.meta.epoch:
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


def _index_nl(view: memoryview) -> int:
    """Index of the first newline in a view that ends where its bytes object ends (as
    FetchConnection's bodies do), found by bytes.find without copying the view."""
    obj = view.obj
    if isinstance(obj, bytes) and view.nbytes <= len(obj):
        start = len(obj) - view.nbytes
        return obj.index(b"\n", start) - start
    return bytes(view).index(b"\n")


def _whole_commits(plog: Any, lo: int, hi: int) -> list[tuple] | None:
    """commits_range of the longest prefix of [lo, hi) made of whole commits (None: none)."""
    ends = [b.base_offset + b.count for b in _batches_upto(plog, lo, hi)]
    for end in reversed(ends):
        if lo < end <= hi:
            return plog.commits_range(lo, end)
    return None


def _batches_upto(plog: Any, lo: int, hi: int) -> list[Any]:
    out = []
    for b in plog.batches(lo):
        if b.base_offset >= hi:
            break
        out.append(b)
    return out


def _commits_bytes(commits: list[tuple]) -> int:
    return sum(c[1] * c[5] if c[5] else sum(c[6]) for c in commits)


def _spans_in(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    for i, (ep, start) in enumerate(spans):
        end = spans[i + 1][1] if i + 1 < len(spans) else hi
        if end > lo and start < hi:
            out.append((ep, max(start, lo)))
    return out


def _epoch_at(spans: list[tuple[int, ...]], off: int, limit: int) -> tuple[int, int]:
    """The epoch of ``off`` and where it stops applying (the next span start or ``limit``)."""
    ep = spans[0][0] if spans else 0
    stop = limit
    for i, (e, start) in enumerate(spans):
        if start <= off:
            ep = e
            stop = spans[i + 1][1] if i + 1 < len(spans) else limit
    return ep, min(stop, limit)
