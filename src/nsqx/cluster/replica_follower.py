"""The follower's side of replication: one task per followed partition pulls from its leader.

Before its first fetch in an epoch the follower truncates to where its log agrees with the
leader's (``/nsqx/replica/epochs`` and :func:`~nsqx.cluster.replication.truncation_point`);
then it fetches from its log end (its ack) and appends each leader commit as one batch
through the topic's group committer, so both logs hold the same bytes. Fetches go over one
stream per leader (:mod:`nsqx.cluster.stream`) or, with ``--cluster-replication=http`` or a
leader without the stream, over one keep-alive connection per partition.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp
import orjson

from nsqx.cluster.fetchconn import FetchConnection
from nsqx.cluster.model import NodeInfo, PartitionMeta
from nsqx.cluster.replica_server import FETCH_MAX_BYTES
from nsqx.cluster.replication import FetchHead, epoch_at, epoch_spans, frame_runs, truncation_point
from nsqx.cluster.stream import StreamConnection, StreamRefused
from nsqx.cluster.trust import SignedSession, Signer
from nsqx.nsqd.config_api import apply_settings
from nsqx.nsqd.interfaces import ReplicaPartition
from nsqx.nsqd.topic import settle

log = logging.getLogger("nsqx.cluster.member")

__all__ = ["FETCH_WAIT", "FollowerHost", "NotAMember", "ReplicaFollower", "StaleEpoch"]

FETCH_WAIT = 0.5  # long-poll at the tail
HTTP_ONLY_RETRY = 60.0  # a leader without the stream is asked again after this (upgraded?)


class StaleEpoch(Exception):
    pass


class NotAMember(Exception):
    """The leader refused this node's credential (401/403): another secret, a clock more
    than 30 s off, or a registration the leader does not see yet."""


class FollowerHost(Protocol):
    """What the fetch loop reads of its member (set once the member started)."""

    node_id: str
    nodes: Mapping[str, NodeInfo]
    signer: Signer | None
    tls_client: ssl.SSLContext | None
    replication: str
    http: SignedSession | None


def check_answer(status: int, raw: Any) -> None:
    if status == 409:
        raise StaleEpoch(bytes(raw).decode(errors="replace"))
    if status in (401, 403):
        raise NotAMember(f"HTTP {status}: {bytes(raw[:300]).decode(errors='replace')}")
    if status == 416:
        raise StaleEpoch("offset beyond the leader's log: truncate again")
    if status != 200:
        raise ValueError(f"HTTP {status}: {bytes(raw[:200])!r}")


class ReplicaFollower:
    """The fetch tasks of the partitions this node follows, and the streams they share."""

    def __init__(self, host: FollowerHost, settings_changed: Callable[[], None]) -> None:
        self.host = host
        self.settings_changed = settings_changed  # the leader's settings, kept for a failover
        self.tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.following: dict[tuple[str, int], tuple[str | None, int]] = {}
        self.streams: dict[str, StreamConnection] = {}  # leader's cluster address -> stream
        self.http_only: dict[str, float] = {}  # leaders without the stream: since when
        self.refused_warned: dict[str, float] = {}  # leader -> when a refusal was last logged

    # -- the tasks ---------------------------------------------------------------------------
    def is_following(self, k: tuple[str, int], pm: PartitionMeta) -> bool:
        return k in self.tasks and self.following.get(k) == (pm.leader, pm.epoch)

    def start(self, k: tuple[str, int], topic: Any, pm: PartitionMeta) -> None:
        self.following[k] = (pm.leader, pm.epoch)
        self.tasks[k] = asyncio.get_running_loop().create_task(
            self.follow(topic, pm), name=f"follow {pm.topic}/{pm.partition}")

    def stop(self, k: tuple[str, int]) -> None:
        task = self.tasks.pop(k, None)
        self.following.pop(k, None)
        if task is not None:
            task.cancel()

    def close_streams(self) -> None:
        for conn in self.streams.values():
            conn.close()

    # -- one partition -----------------------------------------------------------------------
    async def follow(self, topic: Any, pm: PartitionMeta) -> None:
        conns: list[FetchConnection] = []  # the keep-alive connection to the leader
        try:
            await self.follow_loop(topic, pm, conns)
        finally:
            for conn in conns:
                conn.close()

    async def follow_loop(self, topic: Any, pm: PartitionMeta,
                          conns: list[FetchConnection]) -> None:
        name, p, epoch = pm.topic, pm.partition, pm.epoch
        truncated = False
        while True:
            leader = self.host.nodes.get(pm.leader or "")
            try:
                if leader is None:
                    await asyncio.sleep(0.2)
                    continue
                if not conns or conns[0].address != leader.internal_address:
                    for old in conns:
                        old.close()
                    conns[:] = [FetchConnection(leader.internal_address, self.host.tls_client)]
                base = f"http://{leader.internal_address}/nsqx/replica"
                if not truncated:
                    info = await self.get_json(f"{base}/epochs", topic=name, partition=p,
                                               epoch=epoch, node=self.host.node_id)
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
                await self.fetch_once(topic, conns[0], name, p, epoch)
            except StaleEpoch:
                await asyncio.sleep(0.2)  # wait for the metadata to move on
                truncated = False
            except NotAMember as e:
                now = time.monotonic()
                if now - self.refused_warned.get(pm.leader or "", -60.0) >= 60:
                    self.refused_warned[pm.leader or ""] = now
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

    def sign(self, method: str, path: str, params: dict[str, str], *, to: str
             ) -> dict[str, str] | None:
        """Signature headers of a request to the member at cluster address ``to``."""
        signer = self.host.signer
        return signer.headers(method, path, params, to=to) if signer else None

    async def get_json(self, url: str, **params: Any) -> dict:
        http = self.host.http
        assert http is not None
        async with http.get(url, params=params, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            raw = await resp.read()
            check_answer(resp.status, raw)
            return orjson.loads(raw)

    async def fetch_once(self, topic: Any, conn: FetchConnection, name: str, p: int,
                         epoch: int) -> None:
        offset = topic.log.flushed_offset
        stream = self.stream_to(conn.address)
        if stream is not None:
            try:
                status, head_raw, frames = await stream.fetch(
                    name, p, epoch, offset, FETCH_MAX_BYTES, int(FETCH_WAIT * 1000),
                    FETCH_WAIT + 5)
            except StreamRefused as e:
                if e.status not in (404, 405):
                    check_answer(e.status, e.body)
                log.warning("CLUSTER: the leader at %s has no replication stream (an older "
                            "member?): fetching over HTTP from it", conn.address)
                self.http_only[conn.address] = time.monotonic()
                stream.close()
                return
            check_answer(status, head_raw)
        else:
            params = {"topic": name, "partition": str(p), "offset": str(offset),
                      "epoch": str(epoch), "node": self.host.node_id,
                      "wait_ms": str(int(FETCH_WAIT * 1000))}
            status, raw = await conn.get("/nsqx/replica/fetch", params, FETCH_WAIT + 5,
                                         self.sign("GET", "/nsqx/replica/fetch", params,
                                                   to=conn.address))
            check_answer(status, raw)
            nl = index_nl(raw)
            head_raw, frames = raw[:nl], raw[nl + 1:]
        head = FetchHead.from_wire(orjson.loads(head_raw))
        # frames: a view, sliced per commit: the log keeps these bytes
        if head.start != offset:
            raise ValueError(f"leader answered from {head.start}, asked {offset}")
        if frames:
            await append(topic, offset, frames, head)
        if head.hw is not None:  # the leader's high watermark: where this node starts if it leads
            topic.advance_readable(head.hw)
        for ch_name, confirmed in (head.channels or {}).items():
            advance_channel(topic, ch_name, confirmed)
        if head.settings is not None and apply_settings(topic, head.settings):
            self.settings_changed()

    def stream_to(self, address: str) -> StreamConnection | None:
        """The stream to the leader at ``address`` (shared by every partition it leads for
        this node), or None to fetch over HTTP."""
        if self.host.replication != "stream" or \
                time.monotonic() - self.http_only.get(address, -HTTP_ONLY_RETRY) < HTTP_ONLY_RETRY:
            return None
        conn = self.streams.get(address)
        if conn is None:
            conn = self.streams[address] = StreamConnection(
                address, self.host.node_id, ssl=self.host.tls_client,
                sign=self.sign if self.host.signer else None)
        return conn


async def append(topic: Any, offset: int, frames: memoryview, head: FetchHead) -> None:
    """Append the leader's frames as they are: one batch per leader commit when the answer
    lists them (``commits``: no per-message Python here), else one per run of (timestamp,
    epoch) found by walking the frames (a range starting inside a commit)."""
    spans = head.spans or []
    hdrs = head.headers or {}
    futs = []
    loop = asyncio.get_running_loop()
    if head.commits:
        pos, n = 0, len(frames)
        for c in head.commits:
            size = c.size
            if c.base != offset or pos + size > n:
                raise ValueError(f"commit at {c.base} does not match the frames at {offset}")
            kw: dict = {"epoch": c.epoch, "flen": c.flen, "lengths": c.lengths,
                        "max_ts": c.max_ts}
            if hdrs:
                headers = [hdrs.get(o) for o in range(c.base, c.base + c.count)]
                if any(headers):
                    kw["headers"] = headers
            fut = loop.create_future()
            topic.committer.append_frames_cb(frames[pos:pos + size], c.count, settle(fut),
                                             c.ts, **kw)
            futs.append(fut)
            pos += size
            offset += c.count
        if pos != n:
            raise ValueError(f"{n - pos} bytes of frames after the listed commits")
        await asyncio.gather(*futs)  # durable here before the next fetch acks it
        return
    for start, count, lo, hi, ts, lengths in frame_runs(frames, offset, spans):
        headers = [hdrs.get(o) for o in range(start, start + count)] if hdrs else None
        kw = {"epoch": epoch_at(spans, start, start + count)[0], "lengths": lengths}
        if headers and any(headers):
            kw["headers"] = headers
        fut = loop.create_future()
        topic.committer.append_frames_cb(frames[lo:hi], count, settle(fut), ts, **kw)
        futs.append(fut)
    await asyncio.gather(*futs)  # durable here before the next fetch acks it


def advance_channel(topic: ReplicaPartition, name: str, confirmed: int) -> None:
    """Mirror the leader's confirmed cursor of a channel (creating the channel here)."""
    ch = topic.channels.get(name) or topic.get_channel(name)
    if ch is None:
        return
    ch.mirror_confirmed(confirmed)


def index_nl(view: memoryview) -> int:
    """Index of the first newline in a view that ends where its bytes object ends (as
    FetchConnection's bodies do), found by bytes.find without copying the view."""
    obj = view.obj
    if isinstance(obj, bytes) and view.nbytes <= len(obj):
        start = len(obj) - view.nbytes
        return obj.index(b"\n", start) - start
    return bytes(view).index(b"\n")
