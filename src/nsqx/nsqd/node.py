"""The nsqd node: topics, listeners, background work and shutdown in upstream's order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from nsqx import NSQ_VERSION
from nsqx.nsqd import datapath, lazy
from nsqx.nsqd.channel import Channel, now_ms
from nsqx.nsqd.client_v2 import ClientV2
from nsqx.nsqd.e2e import LatencyWindow
from nsqx.nsqd.http_fast import DeferredApp, FastPubProtocol
from nsqx.nsqd.lookup import LookupPeers
from nsqx.nsqd.options import TLS_NOT_REQUIRED, TLS_REQUIRED
from nsqx.nsqd.topic import Topic
from nsqx.protocol.names import valid_channel_name, valid_topic_name
from nsqx.protocol.v2 import TRACE_TOPIC
from nsqx.storage.commit import CommitScheduler, FileSystemSyncer
from nsqx.storage.fileio import write_durably
from nsqx.storage.log import PartitionLog
from nsqx.storage.segment import open_segments

if TYPE_CHECKING:
    from nsqx.nsqd.options import Options
    from nsqx.nsqd.routing import TopicRoutes

log = logging.getLogger("nsqx.nsqd")
TAIL_SHARE_MIN = 16 << 10  # a topic's memory tail, whatever the topic count
TAIL_SHARE_MAX = 8 << 20
TAIL_UNREAD = 0  # a topic nobody reads keeps only its newest batch in memory
SHARE_DELAY = 0.5  # subscribes/unsubscribes re-split the tail budget at most this often

SCAN_INTERVAL = 0.1  # in-flight timeouts and due deferrals (upstream QueueScanInterval)
META_COALESCE_FROM = 0.005  # nsqd.dat writes slower than this are coalesced...
META_COALESCE_MAX = 0.5  # ...for at most this long
SWEEP_TICKS = 600  # every 60 s: check that every channel with timers is scheduled
PERSIST_INTERVAL = 1.0  # cursor state to disk
RETENTION_INTERVAL = 30.0
FILES_PER_SEGMENT = 6
RELEASE_INTERVAL = 15.0  # logs idle since the last pass close their files
BUDGET_WARN_INTERVAL = 60.0  # at most one descriptor-budget warning this often


class WarnEvery:
    """A warning at most once per ``interval`` seconds: ``due()`` says whether to log now
    and how many were held back since the last one logged (None: hold this one back)."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.last: float | None = None
        self.held = 0

    def due(self) -> int | None:
        now = self.clock()
        if self.last is not None and now - self.last < self.interval:
            self.held += 1
            return None
        held, self.held, self.last = self.held, 0, now
        return held


def split_hostport(addr: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or default_host
    return host, int(port)


class NSQD:
    """One broker node. Explicit context: everything it needs is passed in."""

    def __init__(self, opts: Options, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.opts = opts
        self.loop = loop or asyncio.get_running_loop()
        self.data_path = Path(opts.data_path or os.getcwd()).resolve()
        self.start_time = int(time.time())
        self.topics: dict[str, Topic] = {}
        self.timed_channels: set[Channel] = set()  # cursors with timers (see _scan_loop)
        self.dirty_channels: set[Channel] = set()  # cursors to persist (see _persist_loop)
        # log files may take half the descriptors; past that the persist pass releases the
        # files of synced logs without consumers, whether or not they idled long
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.fd_budget = (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 2
        self.fd_warning = WarnEvery(BUDGET_WARN_INTERVAL)  # the pass runs every second
        self._reclaiming = False
        self._clients: dict[int, ClientV2] = {}
        self.exiting = False
        self.tcp_port = 0
        self.http_port = 0
        self.https_port: int | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._runners: list[Any] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._meta_dirty = False
        self._meta_scheduled = False
        self._meta_write_s = 0.0  # how long the last nsqd.dat write took
        self._lock_fd: int | None = None
        self._error: str | None = None
        self.tls_context = self._make_tls_context()
        # tls_required: 0 no, 1 TCP only ("tcp-https"), 2 TCP and plain HTTP (upstream's iota).
        self.tls_required_tcp = opts.tls_required != TLS_NOT_REQUIRED
        self.tls_required_http = opts.tls_required == TLS_REQUIRED
        self.lookup = LookupPeers(self)
        # interval fsyncs of every topic's log share one syncfs() per pass
        self.fs_syncer = FileSystemSyncer(str(self.data_path), self.loop)
        # every topic's appends of a loop turn are flushed in one pass (not one call each)
        self.commit_scheduler = CommitScheduler(self.loop)
        self._share_handle: asyncio.TimerHandle | None = None  # see readers_changed
        self.statsd: Any = None
        # Extensions attached by the entry point (cluster mode): objects with async
        # start()/stop(), started after the listeners and stopped before any topic closes,
        # and functions that add HTTP routes to the node's app. nsqd knows nothing more of them.
        self.plugins: list[Any] = []
        self.http_route_hooks: list[Callable[[Any], None]] = []
        self.topic_hooks: list[Callable[[Topic], None]] = []  # called with each new Topic
        # cluster mode: /topic/delete deletes the topic in the cluster (every replica),
        # idempotently; returns whether anything knew the name
        self.topic_delete_hook: Callable[[str], Awaitable[bool]] | None = None
        self._tracer: Any = None  # see tracer
        self._http_app: DeferredApp | None = None  # of the plain listener, see start()
        self._http_services: Any = None  # nsqd.http.HTTPServices, built with the first app
        self._idle_socks: list[socket.socket] = []  # listening, not served yet: see start()
        self._leftover_meta: list[Path] = []  # workers' metadata files merged at start
        # --workers > 1 (nsqx.nsqd.workers): this process is one worker of the node. The
        # entry point sets ``owns`` (topic name -> whether this worker owns it: the others'
        # topics are never opened here), the listening sockets the supervisor bound
        # (``inherited_sockets``: "tcp", "http", "https"), this worker's metadata file and
        # lock, and ``workers`` (what ClientV2 asks to forward a publish or hand a SUB over).
        # Unset, the node is one process, as always.
        self.owns: Callable[[str], bool] | None = None
        self.workers: Any = None
        self.inherited_sockets: dict[str, socket.socket] = {}
        self.metadata_file = datapath.metadata_path(self.data_path)
        self.lock_file = datapath.lock_path(self.data_path)
        self.archiver: Any = None  # tiered storage (--archive-url): nsqx.nsqd.archiving
        if opts.archive_url:
            self.archiver = lazy.node_archiver()(self.loop, opts.archive_url, opts.archive_s3_endpoint,
                                         cluster=bool(opts.cluster_leadership_addresses),
                                         compression=opts.archive_compression)
            self.plugins.append(self.archiver)
            self.topic_hooks.append(self.archiver.topic_added)

    @property
    def tracer(self) -> Any:
        """The recorder of traced topics' events (``trace.TraceRecorder``, into ``__trace``),
        made when first needed: a node that traces nothing never loads the tracing code."""
        if self._tracer is None:
            self._tracer = lazy.trace_recorder()(self)
        return self._tracer

    # -- facade used by the TCP and HTTP front ends --------------------------------------
    @property
    def auth_enabled(self) -> bool:
        return bool(self.opts.auth_http_addresses)

    def health(self) -> str:
        return "OK" if self._error is None else f"NOK - {self._error}"

    def is_healthy(self) -> bool:
        return self._error is None

    def set_health(self, error: str | None) -> None:
        if error != self._error:
            (log.error if error else log.info)("health: %s", error or "OK")
        self._error = error

    def clients(self) -> list[ClientV2]:
        return list(self._clients.values())

    def client_connected(self, client: ClientV2) -> None:
        self._clients[client.id] = client

    def client_disconnected(self, client: ClientV2) -> None:
        self._clients.pop(client.id, None)

    def get_topic(self, name: str, create: bool = True) -> Topic | None:
        topic = self.topics.get(name)
        if topic is not None or not create or self.exiting:
            return topic
        if self.owns is not None and not self.owns(name):
            return None  # another worker's (--workers): its owner alone opens it
        topic = Topic(self, name)
        self.topics[name] = topic
        log.info("TOPIC(%s): created", name)
        for hook in self.topic_hooks:
            hook(topic)
        # after the hooks: cluster mode's gate makes it a read topic. A new topic nobody
        # reads changes no other topic's share: it only gets its own (small) limit,
        # instead of a walk over every topic per create (O(n^2) over 10,000 creates)
        if name == TRACE_TOPIC or any(p.is_read() for p in topic.partitions):
            self.share_memory()
        else:
            for p in topic.partitions:
                if isinstance(p.log, PartitionLog) and p.log.tail_limit != TAIL_UNREAD:
                    p.log.set_tail_limit(TAIL_UNREAD)
        # Pre-create the channels lookupd knows of, so messages published before the
        # consumers reconnect are kept for them. Upstream asks synchronously; here it
        # happens a moment later, which loses nothing: a topic's first channel starts
        # at the topic's first offset.
        if not topic.ephemeral:
            self.lookup.precreate_channels_soon(name)
        self.metadata_changed()
        self.lookup_register(name, None)
        return topic

    async def delete_topic(self, name: str) -> None:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise KeyError(name)
        log.info("TOPIC(%s): deleting", name)
        await topic.close(delete=True)
        self.share_memory()
        self.metadata_changed()
        self.lookup_unregister(name, None)

    def share_memory(self) -> None:
        """Split --mem-tail-budget evenly over the durable topics that are read (16 KiB..8 MiB
        each); a topic nobody consumes keeps only its newest batch.

        A topic's memory tail serves readers that keep up without a disk read; with
        many topics a fixed 8 MiB each made RSS grow with the topic count (1,000 active
        topics: 250-340 MiB), so the budget is node-wide and the share shrinks instead.
        A topic without subscribed consumers (written, not read) gains nothing from a
        tail: its channels will read from the page cache when they come, so its share
        goes to the read topics (1,000 written, unread topics: ~18 MiB less peak RSS).
        """
        read: list[PartitionLog] = []
        unread: list[PartitionLog] = []
        for t in self.topics.values():
            if t.name == TRACE_TOPIC:
                continue
            for p in t.partitions:
                if isinstance(p.log, PartitionLog):
                    (read if p.is_read() else unread).append(p.log)
        trace = self.topics.get(TRACE_TOPIC)
        if trace is not None and isinstance(trace.log, PartitionLog):
            # written all the time, read rarely: tracing must not halve the others' tails
            trace.log.set_tail_limit(TAIL_SHARE_MIN)
        for lg in unread:
            if lg.tail_limit != TAIL_UNREAD:
                lg.set_tail_limit(TAIL_UNREAD)
        if read:
            share = max(TAIL_SHARE_MIN, min(TAIL_SHARE_MAX, self.opts.mem_tail_budget // len(read)))
            for lg in read:
                if lg.tail_limit != share:
                    lg.set_tail_limit(share)

    def readers_changed(self) -> None:
        """A topic gained its first or lost its last consumer: re-split the tail budget
        soon, once for every change of that moment (thousands of consumers connecting
        cost one pass over the topics, not one each)."""
        if self._share_handle is None and not self.exiting:
            self._share_handle = self.loop.call_later(SHARE_DELAY, self._share_soon)

    def _share_soon(self) -> None:
        self._share_handle = None
        self.share_memory()

    async def publish(self, topic_name: str, bodies: list[bytes], defer_ms: int = 0,
                      partition: int | None = None, *,
                      headers: list[dict[str, bytes] | None] | None = None,
                      producer: str = "") -> tuple[int, int]:
        """Publish and wait until durable; returns (partition, base offset)."""
        topic = self.get_topic(topic_name)
        if topic is None:
            raise RuntimeError("exiting")
        part = topic.route(partition)
        fut = part.publish(bodies, defer_ms, headers=headers, producer=producer)
        assert fut is not None
        return part.partition, await fut

    async def create_routed_topic(self, name: str, count: int, logical: int,
                                  label: str) -> TopicRoutes:
        """A new route-managed topic (``/topic/create?partition_num=``): the routing code
        loads with the first one."""
        routes: TopicRoutes = await lazy.topic_routes().create(self, name, count, logical, label)
        return routes

    def ensure_partitions(self, name: str, count: int, *, ordered: bool = False) -> Topic:
        """The topic with at least ``count`` partitions (created as needed, persisted).

        Partition k is its own Topic object (log under ``p<k>``, ids carrying k) with the
        same channels; ``ordered`` topics take only SUB_ORDERED and keyed/partitioned PUBs.
        """
        topic = self.get_topic(name)
        if topic is None:
            raise RuntimeError("exiting")
        if topic.ephemeral and count > 1:
            raise ValueError("an ephemeral topic has one partition")
        for k in range(len(topic.partitions), count):
            part = Topic(self, name, partition=k, paused=topic.paused)
            part.partitions = topic.partitions  # one shared list
            part.tracer, part.ext = topic.tracer, topic.ext
            part.msg_ttl_ns, part.msg_ttl_set = topic.msg_ttl_ns, topic.msg_ttl_set
            if topic.sync_every:
                part.set_sync_every(topic.sync_every)
            topic.partitions.append(part)
            for cname, ch in topic.channels.items():
                sib = part.get_channel_here(cname)
                if sib is not None and ch.paused:
                    sib.paused = True
            for hook in self.topic_hooks:
                hook(part)
            log.info("TOPIC(%s): partition %d created", name, k)
        for part in topic.partitions:
            part.ordered = ordered or topic.ordered
            if part.ordered:
                for ch in part.channels.values():
                    ch.set_ordered()  # channels made before the topic was known ordered
        self.share_memory()
        self.metadata_changed()
        return topic

    def lookup_register(self, topic: str, channel: str | None) -> None:
        self.lookup.register(topic, channel)

    def lookup_unregister(self, topic: str, channel: str | None) -> None:
        self.lookup.unregister(topic, channel)

    def set_lookupd_tcp_addresses(self, addrs: list[str]) -> None:
        self.opts.nsqlookupd_tcp_addresses = list(addrs)
        self.lookup.set_addresses(addrs)

    # -- metadata (nsqd.dat) -------------------------------------------------------------
    def metadata_changed(self) -> None:
        """Write nsqd.dat soon: once per loop turn (clients SIGKILL servers), or, when a
        write has become slow (thousands of topics: each rewrites them all, as upstream),
        after twice its duration, so a burst of creations shares one write instead of
        each waiting for the whole file (upstream persists asynchronously too)."""
        self._meta_dirty = True
        if not self._meta_scheduled and not self.exiting:
            self._meta_scheduled = True
            took = self._meta_write_s
            if took > META_COALESCE_FROM:
                self.loop.call_later(min(META_COALESCE_MAX, 2 * took), self._write_metadata_soon)
            else:
                self.loop.call_soon(self._write_metadata_soon)

    def _write_metadata_soon(self) -> None:
        self._meta_scheduled = False
        if self._meta_dirty:
            self.persist_metadata()

    def persist_metadata(self) -> None:
        self._meta_dirty = False
        t0 = time.monotonic()
        data = {
            "topics": [t.metadata() for t in self.topics.values() if not t.ephemeral],
            "version": NSQ_VERSION,
        }
        path = self.metadata_file
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            write_durably(path, orjson.dumps(data), tmp)
            self._meta_write_s = time.monotonic() - t0
            if self._leftover_meta:  # merged into nsqd.dat, which is durable now
                for p in self._leftover_meta:
                    with contextlib.suppress(OSError):
                        p.unlink()
                self._leftover_meta = []
        except OSError as exc:
            self.set_health(f"failed to persist metadata - {exc}")
            log.error("failed to persist metadata to %s: %s", path, exc)

    def _load_metadata(self) -> None:
        path = self.metadata_file
        entries: dict[str, dict[str, Any]] = {}
        files = [path]
        if self.owns is None and path == datapath.metadata_path(self.data_path):
            # a node run with --workers > 1 last, stopped without merging its workers'
            # files into nsqd.dat (killed): their topics are read too, and the files go
            # once nsqd.dat has them
            self._leftover_meta = datapath.worker_metadata_paths(self.data_path)
            files += self._leftover_meta
        for f in files:
            if not f.exists():
                continue
            try:
                data = orjson.loads(f.read_bytes())
            except (OSError, ValueError) as exc:
                raise SystemExit(f"FATAL: failed to load metadata {f}: {exc}") from exc
            for t in data.get("topics", []):
                entries[t.get("name", "")] = t
        if not any(f.exists() for f in files):
            return
        if self._leftover_meta:
            self.metadata_changed()
        for t in entries.values():
            name = t.get("name", "")
            if not valid_topic_name(name):
                log.warning("skipping creation of invalid topic %s", name)
                continue
            if self.owns is not None and not self.owns(name):
                continue  # another worker's
            topic = Topic(self, name, paused=bool(t.get("paused")), pending_from=t.get("pending_from"),
                          pending_deferred=t.get("pending_deferred"))
            self.topics[name] = topic
            for c in t.get("channels", []):
                cname = c.get("name", "")
                if not valid_channel_name(cname):
                    log.warning("skipping creation of invalid channel %s", cname)
                    continue
                ch = topic.get_channel(cname)
                assert ch is not None
                ch.paused = bool(c.get("paused"))
                if "max_attempts" in c:
                    ch.max_attempts, ch.max_attempts_set = int(c["max_attempts"]), True
            if "msg_ttl_ms" in t:
                topic.msg_ttl_ns, topic.msg_ttl_set = int(t["msg_ttl_ms"]) * 1_000_000, True
            if t.get("sync_every"):
                topic.set_sync_every(int(t["sync_every"]))
            topic.ext = bool(t.get("ext", True))
            if t.get("trace") and name != TRACE_TOPIC:
                topic.tracer = self.tracer
            count = int(t.get("partitions", 1))
            if count > 1 or t.get("ordered"):
                self.ensure_partitions(name, count, ordered=bool(t.get("ordered")))
                for part, st in zip(topic.partitions[1:], t.get("partition_state", []),
                                    strict=False):
                    part.pending_from = st.get("pending_from", part.pending_from)
                    part.pending_deferred = [tuple(x) for x in st.get("pending_deferred", ())]
                for part in topic.partitions[1:]:
                    for c in t.get("channels", []):
                        ch = part.channels.get(c.get("name", ""))
                        if ch is not None and "max_attempts" in c:
                            ch.max_attempts, ch.max_attempts_set = int(c["max_attempts"]), True
                    part.msg_ttl_ns, part.msg_ttl_set = topic.msg_ttl_ns, topic.msg_ttl_set
                    part.set_sync_every(topic.sync_every)
            if datapath.has_routes(topic.dir):
                lazy.topic_routes().load(self, topic)
        self.share_memory()
        log.info("loaded %d topics from %s", len(self.topics), path)

    def _adopt_unlisted_topics(self) -> None:
        """Load topics whose log is on disk but not in nsqd.dat.

        A topic made by its first PUB is acknowledged before the (coalesced) nsqd.dat
        write; a kill -9 in between must not hide its messages until someone publishes
        to it again. Only single-partition logs are adopted: partitioned, ordered and
        route-managed topics are made by /topic/create, which persists before answering.
        A deleted topic's directory is gone, so nothing deleted comes back.
        """
        root = datapath.topics_root(self.data_path)
        if not root.is_dir():
            return
        adopted = 0
        for d in sorted(root.iterdir()):
            name = datapath.topic_name(d)
            if (name is None or name in self.topics or not d.is_dir()
                    or (self.owns is not None and not self.owns(name))
                    or not valid_topic_name(name) or name.endswith("#ephemeral")
                    or not datapath.partition_dir(d, 0).is_dir()
                    or datapath.partition_dir(d, 1).exists() or datapath.has_routes(d)):
                continue
            topic = Topic(self, name)
            self.topics[name] = topic
            cdir = datapath.channels_dir(d)
            for f in sorted(cdir.glob(datapath.CURSOR_GLOB)) if cdir.is_dir() else ():
                cname = datapath.cursor_channel(f)
                if valid_channel_name(cname):
                    topic.get_channel(cname)
            log.warning("TOPIC(%s): adopted from %s (not in nsqd.dat: a crash came before "
                        "its metadata was written)", name, d)
            adopted += 1
        if adopted:  # once: each call walks every topic
            self.metadata_changed()
            self.share_memory()

    # -- life cycle ----------------------------------------------------------------------
    def _make_tls_context(self) -> ssl.SSLContext | None:
        o = self.opts
        if not (o.tls_cert and o.tls_key):
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(o.tls_cert, o.tls_key)
        with contextlib.suppress(ValueError, ssl.SSLError):
            ctx.minimum_version = o.tls_min_version_ssl
        policy = o.tls_client_auth_policy
        if o.tls_root_ca_file:
            ctx.load_verify_locations(o.tls_root_ca_file)
        if policy == "require-verify":
            ctx.verify_mode = ssl.CERT_REQUIRED
        elif policy == "require":
            # Go's RequireAnyClientCert: a certificate is demanded but not verified.
            ctx.verify_mode = ssl.CERT_OPTIONAL if not o.tls_root_ca_file else ssl.CERT_REQUIRED
        return ctx

    def _lock_data_path(self) -> None:
        # unusable: one FATAL line, as upstream (before this, stop() had nothing to save)
        self._lock_fd = datapath.lock_data_path(self.data_path, self.lock_file)

    async def start(self) -> None:
        self._lock_data_path()
        self._load_metadata()
        if not self.opts.cluster_leadership_addresses:
            self._adopt_unlisted_topics()
        if self.archiver is not None:  # before any read: channels may sit in the archive
            for part in (p for t in self.topics.values() for p in t.partitions):
                self.archiver.topic_added(part)
        for topic in list(self.topics.values()):
            if topic.routes is not None:
                await topic.routes.recover()  # commit a change a stop interrupted
        o = self.opts
        # Every listener is bound and listening before any of them answers (issue 28, as Go's
        # nsqd.New): a client that waits for /ping and then connects to TCP or HTTPS is never
        # refused. A listener whose handler is not loaded yet (aiohttp: HTTPS, or plain HTTP
        # under --tls-required) queues connections in its backlog until it is.
        inherited = self.inherited_sockets  # --workers: bound once by the supervisor
        tcp_sock = inherited.get("tcp") or listening_socket(o.tcp_address)
        self.tcp_port = tcp_sock.getsockname()[1]
        log.info("TCP: listening on %s", fmt_addr(tcp_sock))
        http_sock = https_sock = None
        if o.http_address:
            http_sock = inherited.get("http") or listening_socket(o.http_address)
            self.http_port = http_sock.getsockname()[1]
            log.info("HTTP: listening on %s", fmt_addr(http_sock))
        if self.tls_context is not None and o.https_address:
            https_sock = inherited.get("https") or listening_socket(o.https_address)
            self.https_port = https_sock.getsockname()[1]
            log.info("HTTPS: listening on %s", fmt_addr(https_sock))
        self._idle_socks = [s for s in (tcp_sock, http_sock, https_sock) if s is not None]
        await self._serve(lambda: ClientV2(self), tcp_sock)
        plain_aiohttp = http_sock is not None and o.tls_required == TLS_REQUIRED
        if plain_aiohttp:  # every plain request gets 403: no fast path, the API first
            runner = await self._http_runner(tls_listener=False)
            await self._serve(runner.server, http_sock)
        elif http_sock is not None:
            # The fast path answers /pub, /mpub and /ping at once; aiohttp and the rest of
            # the API load meanwhile (most of a start's time), and a request for them waits
            # until they are ready instead of being refused.
            app = self._http_app = DeferredApp(self.loop)
            await self._serve(lambda: FastPubProtocol(self, app), http_sock)
            self._tasks.append(self.loop.create_task(self._build_http(app, https_sock),
                                                     name="http-app"))
        if https_sock is not None and (plain_aiohttp or http_sock is None):
            runner = await self._http_runner(tls_listener=True)
            await self._serve(runner.server, https_sock, tls=True)
        self._tasks.append(self.loop.create_task(self._scan_loop(), name="queue-scan"))
        self._tasks.append(self.loop.create_task(self._persist_loop(), name="persist"))
        self.lookup.start()
        if o.statsd_address:
            self.statsd = lazy.statsd_emitter()(self)
            self.statsd.start()
        for topic in self.topics.values():
            self.lookup_register(topic.name, None)
            for ch in topic.channels:
                self.lookup_register(topic.name, ch)
        for plugin in self.plugins:
            await plugin.start()

    async def _serve(self, factory: Callable[[], asyncio.BaseProtocol], sock: socket.socket,
                     *, tls: bool = False) -> None:
        """Answer on a listening socket of start() (stop() closes the server)."""
        server = await self.loop.create_server(
            factory, sock=sock, backlog=1024, ssl=self.tls_context if tls else None)
        self._servers.append(server)
        self._idle_socks.remove(sock)

    def plain_http_protocol(self) -> asyncio.BaseProtocol:
        """A connection of the plain HTTP listener, as start() serves it (the workers'
        internal HTTP sockets serve the same)."""
        assert self._http_app is not None, "no plain HTTP listener"
        return FastPubProtocol(self, self._http_app)

    async def http_loaded(self) -> None:
        """Wait until the whole HTTP API is loaded (start() returns once its listener is
        open); for callers that want no loading in the background, such as tests."""
        if self._http_app is not None:
            await asyncio.shield(self._http_app.ready)

    async def _http_runner(self, *, tls_listener: bool) -> Any:
        """The HTTP API's aiohttp runner, set up (cleaned up by stop())."""
        http = lazy.http_api()
        if self._http_services is None:  # one set for the HTTP and HTTPS apps
            self._http_services = http.http_services(self)
        app = http.make_app(self, tls_listener=tls_listener, services=self._http_services)
        runner = http.make_runner(app, logging.getLogger("nsqx.nsqd.http"))
        await runner.setup()
        self._runners.append(runner)
        return runner

    async def _build_http(self, app: Any, https_sock: socket.socket | None) -> None:
        """Load aiohttp and the HTTP API for the plain listener (``http_fast.DeferredApp``)
        and then serve HTTPS (bound already, its connections wait in the backlog): the
        modules are imported in a worker thread, so the loop keeps serving while they load;
        a failure is the node's health and closes the requests that waited."""
        try:
            await self.loop.run_in_executor(None, lazy.http_api)
            runner = await self._http_runner(tls_listener=False)
            if https_sock is not None:
                tls_runner = await self._http_runner(tls_listener=True)
                await self._serve(tls_runner.server, https_sock, tls=True)
        except BaseException as exc:
            app.fail(exc)
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("HTTP: the API failed to load")
                self.set_health(f"HTTP API failed to load - {exc}")
            raise
        app.set(runner.server)

    async def _scan_loop(self) -> None:
        """Timeouts and due deferrals of the channels whose cursors have timers (they put
        themselves in ``timed_channels``): the cost of a tick follows the busy channels,
        not the number of topics. A slow sweep checks that no channel was missed."""
        ticks = 0
        while True:
            await asyncio.sleep(SCAN_INTERVAL)
            t = now_ms()
            timed = self.timed_channels
            for ch in list(timed):
                try:
                    if not ch.exiting:
                        ch.tick(t)
                except Exception:  # one channel's bug must not stop every timeout
                    log.exception("TOPIC(%s) CHANNEL(%s): timer pass failed", ch.topic.name,
                                  ch.name)
                if ch.exiting or not ch.has_timers():
                    ch.armed = False
                    timed.discard(ch)
            ticks += 1
            if ticks % SWEEP_TICKS == 0:
                self._sweep_timers()

    def _sweep_timers(self) -> None:
        for topic in list(self.topics.values()):
            for part in topic.partitions:
                for ch in part.channels.values():
                    if ch not in self.timed_channels and ch.has_timers():
                        log.error("TOPIC(%s) CHANNEL(%s): BUG: timers were not scheduled; "
                                  "scheduling them now", part.name, ch.name)
                        ch.armed = True
                        self.timed_channels.add(ch)

    async def _persist_loop(self) -> None:
        last_retention = last_release = time.monotonic()
        while True:
            await asyncio.sleep(PERSIST_INTERVAL)
            try:
                await self._persist_dirty_off_loop()
                if open_segments() * FILES_PER_SEGMENT > self.fd_budget:
                    self.release_files_over_budget()
                if time.monotonic() - last_release > RELEASE_INTERVAL:
                    last_release = time.monotonic()
                    self.share_memory()  # leadership moves (cluster mode) change what is read
                    for topic in list(self.topics.values()):
                        for part in topic.partitions:
                            part.release_idle_files()
                if time.monotonic() - last_retention > RETENTION_INTERVAL:
                    last_retention = time.monotonic()
                    for topic in list(self.topics.values()):
                        for part in topic.partitions:
                            part.apply_retention()
            except OSError as exc:
                self.set_health(f"failed to persist channel state - {exc}")
            except Exception:  # keep persisting: a bug here must not end the loop
                log.exception("persist pass failed")

    def release_files_over_budget(self, *, wait: bool = True,
                                  why: str = "log segments held open") -> int:
        """Too many log files open (a burst of writes to thousands of topics, faster than
        the idle passes release them): close the files of every log that is synced and has
        no consumer now; they reopen on their next use. Returns how many logs let go.
        ``wait=False``: skip a log whose sync holds its lock now."""
        released = 0
        for topic in list(self.topics.values()):
            for part in topic.partitions:
                if not any(ch.clients for ch in part.channels.values()) \
                        and part.log.release_files(wait=wait):
                    released += 1
        held = self.fd_warning.due()
        if held is not None:
            log.warning("NSQ: %d %s (budget %d descriptors): released the "
                        "files of %d idle logs%s", open_segments(), why, self.fd_budget, released,
                        f" ({held} similar warnings suppressed since the last one)" if held
                        else "")
        return released

    def reclaim_files(self) -> int:
        """A log's files could not be opened for want of descriptors (EMFILE, ENFILE; the
        segment tries once more after this): let the idle logs go now, as the persist pass
        does over budget. Only on the node's loop (a sync thread must not close files the
        loop may be reading) and not from within itself; returns how many logs let go."""
        try:
            if asyncio.get_running_loop() is not self.loop:
                return 0
        except RuntimeError:  # a thread without a loop
            return 0
        if self._reclaiming:
            return 0
        self._reclaiming = True
        try:
            return self.release_files_over_budget(
                wait=False, why="log segments held open, too many open files")
        finally:
            self._reclaiming = False

    async def _persist_dirty_off_loop(self) -> None:
        """The persist pass: each changed cursor's state is taken on the loop (cheap: a few
        arrays to bytes) and written in a worker thread, whose write + fsync + rename +
        directory fsync release the GIL. Done on the loop, a pass over many busy channels
        stalled every client for one fsync pair per channel (~11% of nsqd's time with 64
        ordered channels draining). A channel whose write failed stays dirty."""
        dirty, self.dirty_channels = self.dirty_channels, set()
        snaps = []
        failed: dict[Channel, OSError] = {}
        for ch in dirty:
            if ch.dirty and not ch.ephemeral and not ch.exiting:
                try:
                    snap = ch.snapshot()  # (clean from now: a change marks it again)
                except OSError as exc:
                    failed[ch] = exc
                    continue
                if snap is not None:
                    snaps.append((ch, *snap))
        if snaps:
            failed.update(await self.loop.run_in_executor(None, _write_snapshots, snaps))
        for ch in failed:
            ch.snapshot_failed()
            self.dirty_channels.add(ch)
        if failed:
            raise next(iter(failed.values()))

    async def stop(self) -> None:
        """Upstream order: stop accepting, close clients, flush + fsync topics, write metadata."""
        if self.exiting:
            return
        self.exiting = True
        log.info("NSQ: closing")
        if self._share_handle is not None:
            self._share_handle.cancel()
            self._share_handle = None
        for plugin in reversed(self.plugins):
            try:
                await plugin.stop()
            except Exception as exc:  # keep shutting down
                log.error("stopping %r failed: %s", plugin, exc)
        for server in self._servers:
            server.close()
        for sock in self._idle_socks:  # bound, never served (a stop during start)
            sock.close()
        self._idle_socks.clear()
        for client in self.clients():
            client.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.statsd is not None:
            await self.statsd.close()
        await self.lookup.close()
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        self.persist_metadata()
        for topic in list(self.topics.values()):
            try:
                await topic.close()  # and its other partitions
            except Exception as exc:  # keep closing the others
                log.error("TOPIC(%s): close failed: %s", topic.name, exc)
        self.persist_metadata()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.info("NSQ: bye")

    # -- stats ---------------------------------------------------------------------------
    def stats_dict(self, topic: str | None = None, channel: str | None = None,
                   include_clients: bool = True, include_mem: bool = True) -> dict[str, Any]:
        topics = []
        for t in sorted(self.topics.values(), key=lambda t: t.name):
            if topic is not None and t.name != topic:
                continue
            parts = t.partitions
            chans = []
            for c in sorted(t.channels.values(), key=lambda c: c.name):
                if channel is not None and c.name != channel:
                    continue
                sibs = c.siblings()  # the channel in every partition: one upstream entry
                seen: dict[int, Any] = {}
                for sc in sibs:
                    seen.update(sc.clients)
                clients = [cl.stats() for cl in seen.values()] if include_clients else []
                depth = sum(sc.depth for sc in sibs)
                entry = {
                    "channel_name": c.name,
                    "depth": depth,
                    "backend_depth": depth,
                    "in_flight_count": sum(sc.in_flight_count for sc in sibs),
                    "deferred_count": sum(sc.deferred_count for sc in sibs),
                    "message_count": sum(sc.message_count for sc in sibs),
                    "requeue_count": sum(sc.requeue_count for sc in sibs),
                    "timeout_count": sum(sc.timeout_count for sc in sibs),
                    "dlq_count": sum(sc.dlq_count for sc in sibs),
                    "expired_count": sum(sc.expired_count for sc in sibs),
                    "max_attempts": c.max_attempts,
                    "client_count": len(seen),
                    "clients": clients,
                    "paused": c.paused,
                    "e2e_processing_latency": (
                        (c.e2e.snapshot() if c.e2e else _NO_E2E) if len(sibs) == 1 else
                        LatencyWindow.merge([sc.e2e for sc in sibs if sc.e2e is not None],
                                            list(self.opts.e2e_processing_latency_percentiles))),
                }
                if len(parts) > 1:
                    entry["ordered"] = c.ordered
                chans.append(entry)
            depth = sum(p.depth for p in parts)
            entry_t: dict[str, Any] = {
                "topic_name": t.name,
                "channels": chans,
                "depth": depth,
                "backend_depth": depth,
                "message_count": sum(p.message_count for p in parts),
                "message_bytes": sum(p.message_bytes for p in parts),
                "paused": t.paused,
                "msg_ttl_ms": t.msg_ttl_ns // 1_000_000,
                # nsqx: fsync after this many messages (the topic's policy or --sync-every)
                "sync_every": t.sync_every or self.opts.sync_every,
                "trace": t.tracer is not None,  # nsqx: message tracing on (/topic/trace)
                "e2e_processing_latency": LatencyWindow.merge(
                    [c.e2e for p in parts for c in p.channels.values() if c.e2e is not None],
                    list(self.opts.e2e_processing_latency_percentiles)),
            }
            if self.archiver is not None:  # nsqx: tiered storage, per partition
                entry_t["archive"] = [{"partition": p.partition, **self.archiver.stats(p.log)}
                                      for p in parts]
            if len(parts) > 1 or t.ordered:
                # nsqx: per-partition detail (stock tools read the aggregate above)
                entry_t["ordered"] = t.ordered
                entry_t["partitions"] = [{
                    "partition": p.partition,
                    "depth": p.depth,
                    "message_count": p.message_count,
                    "log_start": p.log.start_offset,
                    "log_end": p.log.flushed_offset,
                    "channels": [{"channel_name": pc.name, "depth": pc.depth,
                                  "in_flight_count": pc.in_flight_count,
                                  "confirmed": pc.confirmed}
                                 for pc in sorted(p.channels.values(), key=lambda x: x.name)
                                 if channel is None or pc.name == channel],
                } for p in parts]
            topics.append(entry_t)
        producers = [c.stats() for c in self._clients.values() if c.pub_counts] if include_clients else []
        return {
            "version": NSQ_VERSION,
            "health": self.health(),
            "start_time": self.start_time,
            "topics": topics,
            "producers": producers,
        }


_NO_E2E = {"count": 0, "percentiles": None}


def listening_socket(addr: str) -> socket.socket:
    """A socket bound to ``addr`` (host:port, port 0 for any) and listening: connections
    are accepted into its backlog from now on, answered once a server serves it."""
    host, port = split_hostport(addr)
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=1024)
    sock.setblocking(False)
    return sock


def fmt_addr(sock: socket.socket) -> str:
    name = sock.getsockname()
    if sock.family == socket.AF_INET6:
        return f"[{name[0]}]:{name[1]}"
    return f"{name[0]}:{name[1]}"


def _write_snapshots(snaps: list[tuple[Channel, int, bytes]]) -> dict[Channel, OSError]:
    """Worker thread: write cursor snapshots; the channels whose write failed, with why."""
    failed: dict[Channel, OSError] = {}
    for ch, gen, data in snaps:
        try:
            ch.write_snapshot(gen, data)
        except OSError as exc:
            failed[ch] = exc
    return failed
