"""The leader's side of replication: followers' fetches over HTTP and the stream.

``GET /nsqx/replica/epochs`` gives a follower the leader's epoch history (to truncate to
where both agree), ``GET /nsqx/replica/fetch`` and the stream (:mod:`nsqx.cluster.stream`)
answer fetches with a :class:`~nsqx.cluster.replication.FetchHead` and the stored frames.
A fetch is the follower's ack: its offset moves the partition's progress first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from nsqx.cluster.gates import LeaderGate
from nsqx.cluster.internal_auth import InternalAuth, answer
from nsqx.cluster.model import NodeInfo
from nsqx.cluster.replication import Commit, FetchHead, Regressed, spans_in
from nsqx.cluster.stream import PATH as STREAM_PATH
from nsqx.cluster.stream import cork, serve
from nsqx.cluster.trust import Refused
from nsqx.nsqd.config_api import export_settings

__all__ = ["CURSOR_EVERY", "FETCH_MAX_BYTES", "ORDERED_CURSOR_EVERY", "ReplicaServer"]

FETCH_MAX_BYTES = 4 << 20
CURSOR_EVERY = 1.0  # channel cursors ride with a fetch answer at least this often
ORDERED_CURSOR_EVERY = 0.1  # ...and for ordered topics with every answer, this often when idle


class _FramesResponse(web.StreamResponse):
    """A fetch answer: its HTTP headers wait for the first write, as aiohttp's Response's do
    (a StreamResponse sends them alone: one more send per fetch)."""

    _send_headers_immediately = False


class ReplicaServer:
    """Serves the partitions this node leads to their followers. Handed the member's live
    views (gates, registered nodes and their leases), never the member itself."""

    def __init__(self, gates: Mapping[tuple[str, int], Any], nodes: Mapping[str, NodeInfo],
                 node_leases: Mapping[str, int], auth: InternalAuth) -> None:
        self.gates = gates
        self.nodes = nodes
        self.node_leases = node_leases
        self.auth = auth
        self.served_streams: set[asyncio.Future[None]] = set()  # followers' streams here

    def close(self) -> None:
        for done in self.served_streams:
            if not done.done():
                done.set_result(None)

    async def leader_gate(self, request: web.Request
                          ) -> tuple[LeaderGate, Any, dict[str, str]] | web.Response:
        """The gate of the partition a replica (a signed member) asks for, or the answer
        refusing it."""
        caller = await self.auth.caller(request)
        if isinstance(caller, web.Response):
            return caller
        q = request.query
        try:
            name = q["topic"]
            p = int(q.get("partition", "0"))
            epoch = int(q["epoch"])
        except (KeyError, ValueError):
            return answer(400, {"message": "E_INVALID",
                                "detail": "topic, partition and epoch are required integers"})
        gate = self.gate_of(name, p, epoch, request.remote or "?", request.path)
        if not isinstance(gate, LeaderGate):
            return answer(409, gate)
        refusal = self.auth.mismatch(request, caller, q.get("node"))
        if refusal is not None:
            return refusal
        return gate, gate.topic, dict(q)

    def gate_of(self, name: str, p: int, epoch: int, peer: str, path: str
                ) -> LeaderGate | dict[str, Any]:
        """This node's active gate of the partition at ``epoch``, or the 409 answer's body
        (the refusal counted): a deposed leader never collects acks."""
        gate = self.gates.get((name, p))
        if isinstance(gate, LeaderGate) and gate.active and gate.meta.epoch == epoch:
            return gate
        mine = gate.meta.epoch if isinstance(gate, LeaderGate) and gate.active else None
        self.auth.refusals.record(Refused(409, "E_STALE_EPOCH", f"epoch {epoch} of {name}/{p} "
                                          f"(this node: {mine})"), peer, path)
        return {"message": "E_STALE_EPOCH", "leader_epoch": mine}

    async def h_epochs(self, request: web.Request) -> web.Response:
        found = await self.leader_gate(request)
        if isinstance(found, web.Response):
            return found
        gate, topic, _q = found
        return answer(200, {"spans": gate.spans, "end": topic.log.flushed_offset})

    async def h_fetch(self, request: web.Request) -> web.StreamResponse:
        found = await self.leader_gate(request)
        if isinstance(found, web.Response):
            return found
        gate, _, q = found
        try:
            offset = int(q["offset"])
            node = q["node"]
            wait = int(q.get("wait_ms", "0")) / 1000  # clamped by serve_fetch, as max_bytes
            max_bytes = int(q.get("max_bytes", FETCH_MAX_BYTES))
        except (KeyError, ValueError):
            return answer(400, {"message": "E_INVALID",
                                "detail": "offset and node are required, offset an integer"})
        try:
            status, head, data = await self.serve_fetch(gate, node, offset, wait, max_bytes)
        except Refused as e:
            return self.auth.refuse(request, e)
        if status != 200:
            return answer(status, head)
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

    async def serve_fetch(self, gate: LeaderGate, node: str, offset: int, wait: float,
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
        commits: list[Commit] | None = None
        if offset < plog.flushed_offset:
            data, count = gate.read(offset, max_bytes)
            rows = plog.commits_range(offset, offset + count)
            commits = [Commit.from_row(r) for r in rows] if rows is not None else None
            if commits is None and count:
                # the read stopped inside a commit (max_bytes): send whole commits only,
                # unless one commit alone is larger (then the replica walks the frames)
                whole = whole_commits(plog, offset, offset + count)
                if whole:
                    commits = whole
                    count = whole[-1].base + whole[-1].count - offset
                    data = memoryview(data)[:sum(c.size for c in whole)]
        head = FetchHead(start=offset, count=count, end=plog.flushed_offset,
                         hw=gate.acked_end())
        if count:
            head.spans = spans_in(gate.spans, offset, offset + count)
            head.commits = commits  # the replica appends them as they are: no frame walk
            head.headers = plog.headers_range(offset, offset + count) or None
        last = gate.last_cursor_sent.get(node, 0.0)
        if ordered or now - last >= CURSOR_EVERY:
            gate.last_cursor_sent[node] = now
            head.channels = {c.name: c.confirmed for c in topic.channels.values()
                             if not c.ephemeral}
            head.settings = export_settings(topic)  # TTL, tracing, max attempts
        return 200, head.to_wire(), data

    async def h_stream(self, request: web.Request) -> web.StreamResponse:
        """A follower's replication stream (nsqx.cluster.stream): the handshake is checked as
        every internal request (signature, the signer is the node named, its registration is
        alive), then its fetches of every partition this node leads for it."""
        caller = await self.auth.caller(request)
        if isinstance(caller, web.Response):
            return caller
        node = request.query.get("node", "")
        refusal = self.auth.mismatch(request, caller, node)
        if refusal is not None:
            return refusal
        if node not in self.nodes:
            return self.auth.refuse(request, Refused(
                403, "E_NOT_REGISTERED", f"node {node} has no live registration in etcd"))
        peer = request.remote or "?"

        async def fetch(name: str, p: int, epoch: int, offset: int, max_bytes: int,
                        wait: float) -> tuple[int, bytes, Any]:
            gate = self.gate_of(name, p, epoch, peer, STREAM_PATH)
            if not isinstance(gate, LeaderGate):
                return 409, orjson.dumps(gate), b""
            try:
                status, head, data = await self.serve_fetch(gate, node, offset, wait,
                                                            max_bytes)
            except Refused as e:
                self.auth.refusals.record(e, peer, STREAM_PATH)
                return e.status, orjson.dumps({"message": e.code, "detail": e.detail}), b""
            return status, orjson.dumps(head), data

        return await serve(request, fetch, self.served_streams)


def whole_commits(plog: Any, lo: int, hi: int) -> list[Commit] | None:
    """The commits of the longest prefix of [lo, hi) made of whole commits (None: none)."""
    ends = []
    for b in plog.batches(lo):
        if b.base_offset >= hi:
            break
        ends.append(b.base_offset + b.count)
    for end in reversed(ends):
        if lo < end <= hi:
            rows = plog.commits_range(lo, end)
            return [Commit.from_row(r) for r in rows] if rows is not None else None
    return None
