"""A worker's side of ``nsqd --workers=N``: what makes N processes one nsqd.

``attach(node, spec)`` (the entry point, before ``node.start()``) makes the node one
worker: it serves on the sockets the supervisor bound, owns the topics ``ownership``
gives it (the others' are never opened here), keeps its own metadata file and lock, and
gets a ``WorkerRuntime`` (a node plugin, started once the public listeners are) that:

* listens on three unix sockets under ``<data-path>/.workers/``: ``w<K>.tcp`` (NSQ's TCP
  protocol: the publishes other workers forward), ``w<K>.http`` (the HTTP API: the
  requests other workers proxy) and ``w<K>.ctl`` (SUB connections handed over with
  SCM_RIGHTS, and lookupd registrations relayed to worker 0);
* forwards a client's PUB/MPUB/DPUB (and the _EXT/_TRACE forms) for another worker's
  topic to its owner over one pipelined connection per owner, written once per loop
  turn; the owner's answer fills the command's slot (ClientV2._forward);
* hands a SUB for another worker's topic over to the owner with the socket itself
  (ClientV2._hand_over): deliveries then come from the owner, nothing is relayed;
* keeps nsqlookupd's connections in worker 0 only: the others send it their topics and
  channels (``RelayLookup``), so the node registers once, with its one set of ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import struct
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsqx.nsqd import datapath
from nsqx.nsqd.client_v2 import ClientV2
from nsqx.nsqd.lookup import LookupPeers
from nsqx.nsqd.topic import PublishRefused
from nsqx.nsqd.workers import http_routing
from nsqx.nsqd.workers.limits import FORWARD_TIMEOUT, RETRY_CAP, RETRY_FIRST
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.protocol import v2
from nsqx.protocol.errors import ProtocolError

__all__ = ["RelayLookup", "WorkerRuntime", "attach"]

log = logging.getLogger("nsqx.nsqd.workers")

CTL_SEND_TIMEOUT = 2.0
MAX_HANDOVER_BYTES = 1 << 20  # bytes read but not executed that a handover carries
_FRAME = struct.Struct(">II")
_LEN = struct.Struct(">I")
_PR_SET_PDEATHSIG = 1


def attach(node: Any, spec: dict[str, Any]) -> WorkerRuntime:
    """Make ``node`` worker ``spec["index"]`` of ``spec["count"]`` (see module doc)."""
    k, n = int(spec["index"]), int(spec["count"])
    _die_with_parent(int(spec.get("supervisor") or 0))
    rt = WorkerRuntime(node, k, n)
    node.owns = rt.owned
    node.workers = rt
    node.inherited_sockets = {
        name: socket.socket(fileno=int(fd)) for name, fd in spec.get("fds", {}).items()}
    for sock in node.inherited_sockets.values():
        sock.setblocking(False)
    node.metadata_file = datapath.worker_metadata_path(node.data_path, k)
    node.lock_file = datapath.worker_lock_path(node.data_path, k)
    if k != 0:
        node.lookup = RelayLookup(node, rt)
    node.plugins.append(rt)
    node.http_route_hooks.append(rt.http_hook)
    return rt


def _die_with_parent(supervisor: int) -> None:
    """A worker whose supervisor was killed (-9) stops too (SIGTERM: a graceful stop)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if supervisor and os.getppid() != supervisor:
        raise SystemExit("FATAL: the workers' supervisor is gone")


class WorkerRuntime:
    """One worker's links to the others (a node plugin: start()/stop())."""

    def __init__(self, node: Any, index: int, count: int) -> None:
        self.node = node
        self.index = index
        self.count = count
        self.loop: asyncio.AbstractEventLoop = node.loop
        self.data_path: Path = node.data_path
        self.links: dict[int, OwnerLink] = {}
        self.ctl_out: dict[int, socket.socket] = {}
        self.http_sessions: dict[int, Any] = {}  # owner -> aiohttp session (http_routing)
        self._servers: list[asyncio.AbstractServer] = []
        self._ctl_listener: socket.socket | None = None
        self._ctl_conns: dict[int, _CtlConn] = {}
        # worker 0: the registrations the other workers relayed, per worker
        self.relayed_by: dict[int, set[tuple[str, str | None]]] = {}
        self._lookup_dirty = False
        self._lookup_task: asyncio.Task[None] | None = None
        self.stopping = False

    # -- ownership -----------------------------------------------------------------------
    def owner(self, topic: str) -> int:
        return owner_of(topic, self.count)

    def owned(self, topic: str) -> bool:
        return owner_of(topic, self.count) == self.index

    def path(self, k: int, kind: str) -> str:
        return str(datapath.worker_socket_path(self.data_path, k, kind))

    # -- plugin --------------------------------------------------------------------------
    async def start(self) -> None:
        node = self.node
        for kind in ("tcp", "http", "ctl"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(self.index, kind))
        self._servers.append(await self.loop.create_unix_server(
            lambda: ClientV2(node), self.path(self.index, "tcp"), backlog=1024))
        http = node.plain_http_protocol
        if node.opts.http_address:
            self._servers.append(await self.loop.create_unix_server(
                http, self.path(self.index, "http"), backlog=1024))
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ctl.bind(self.path(self.index, "ctl"))
        ctl.listen(128)
        ctl.setblocking(False)
        self._ctl_listener = ctl
        self.loop.add_reader(ctl.fileno(), self._ctl_accept)
        if self.index != 0:
            self.lookup_changed()
        else:  # a restarted worker 0 has lost what the others relayed: they send it again
            for k in range(1, self.count):
                try:
                    self._ctl_send(k, {"op": "resync"})
                except OSError:
                    pass  # not up: it sends its registrations once it is
        log.info("workers: worker %d of %d ready (internal sockets in %s)", self.index,
                 self.count, datapath.workers_dir(self.data_path))

    async def stop(self) -> None:
        self.stopping = True
        for server in self._servers:
            server.close()
        if self._ctl_listener is not None:
            self.loop.remove_reader(self._ctl_listener.fileno())
            self._ctl_listener.close()
        for conn in list(self._ctl_conns.values()):
            conn.close()
        for link in self.links.values():
            link.close()
        for sock in self.ctl_out.values():
            sock.close()
        if self._lookup_task is not None:
            self._lookup_task.cancel()
        for session in self.http_sessions.values():
            with contextlib.suppress(Exception):
                await session.close()
        for kind in ("tcp", "http", "ctl"):
            with contextlib.suppress(OSError):
                os.unlink(self.path(self.index, kind))

    def http_hook(self, app: Any) -> None:
        """Added to the node's HTTP app: requests for another worker's topic go to it,
        /stats and /metrics answer for every worker (``http_routing``)."""
        http_routing.install(app, self)

    # -- publishes (ClientV2._forward) ---------------------------------------------------
    def forward(self, topic: str, command: bytes,
                answered: Callable[[bytes | None, Exception | None], None]) -> None:
        k = self.owner(topic)
        link = self.links.get(k)
        if link is None:
            link = self.links[k] = OwnerLink(self, k)
        link.send(command, answered)

    # -- control channel: handovers and lookupd registrations --------------------------------
    def _ctl_send(self, k: int, msg: dict[str, Any], raw: bytes = b"",
                  fd: int | None = None) -> None:
        """One control message to worker ``k`` (blocking, bounded: it is a local socket)."""
        head = json.dumps(msg).encode()
        data = _LEN.pack(len(head)) + head + _LEN.pack(len(raw)) + raw
        for attempt in (0, 1):  # a cached connection to a worker restarted since: once more
            sock = self.ctl_out.get(k)
            try:
                if sock is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.settimeout(CTL_SEND_TIMEOUT)
                    try:
                        sock.connect(self.path(k, "ctl"))
                    except OSError:
                        sock.close()
                        raise
                    self.ctl_out[k] = sock
                if fd is not None:
                    sent = socket.send_fds(sock, [data], [fd])
                    if sent < len(data):
                        sock.sendall(data[sent:])
                else:
                    sock.sendall(data)
                return
            except OSError:
                dead = self.ctl_out.pop(k, None)
                if dead is not None:
                    dead.close()
                if attempt:
                    raise

    async def hand_over(self, topic: str, fd: int, state: dict[str, Any], raw: bytes, *,
                        wait: bool = True) -> int:
        """ClientV2._hand_over: the socket and its state to the topic's owner (returned).

        ``wait``: an owner that is down (restarting, or not up yet after the node's start:
        the supervisor's listeners accept before every worker is ready) is tried again
        until ``FORWARD_TIMEOUT``, as a forwarded publish is; without, OSError at once."""
        if len(raw) > MAX_HANDOVER_BYTES:
            raise ValueError(f"{len(raw)} bytes read ahead, more than a handover carries")
        k = self.owner(topic)
        msg = {"op": "handover", "state": state, "from": self.index}
        deadline = self.loop.time() + FORWARD_TIMEOUT
        delay = RETRY_FIRST
        while True:
            try:
                self._ctl_send(k, msg, raw, fd)
                return k
            except OSError:
                if not wait or self.stopping or self.loop.time() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP)

    def _ctl_accept(self) -> None:
        assert self._ctl_listener is not None
        while True:
            try:
                sock, _ = self._ctl_listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            conn = _CtlConn(self, sock)
            self._ctl_conns[sock.fileno()] = conn
            self.loop.add_reader(sock.fileno(), conn.readable)

    def ctl_message(self, msg: dict[str, Any], raw: bytes, fd: int | None) -> None:
        op = msg.get("op")
        if op == "handover" and fd is not None:
            self.loop.create_task(self._adopt(fd, msg.get("state") or {}, raw))
        elif op == "lookup":
            self._relayed(int(msg["from"]), {(t, c) for t, c in msg.get("regs", [])})
        elif op == "resync" and self.index != 0:
            self.lookup_changed()
        elif fd is not None:
            os.close(fd)

    async def _adopt(self, fd: int, state: dict[str, Any], raw: bytes) -> None:
        sock = socket.socket(fileno=fd)
        if self.node.exiting:
            sock.close()
            return
        sock.setblocking(False)
        node = self.node
        try:
            await self.loop.connect_accepted_socket(
                lambda: ClientV2.handed_over(node, state, raw), sock)
        except OSError as exc:
            log.warning("workers: a handed-over connection was lost: %s", exc)
            sock.close()

    # -- lookupd ---------------------------------------------------------------------------
    def lookup_changed(self) -> None:
        """A worker other than 0: send worker 0 this worker's registrations soon (the whole
        set, once per loop turn however many changed)."""
        self._lookup_dirty = True
        if self._lookup_task is None or self._lookup_task.done():
            self._lookup_task = self.loop.create_task(self._sync_lookup())

    async def _sync_lookup(self) -> None:
        delay = RETRY_FIRST
        await asyncio.sleep(0)
        while self._lookup_dirty and not self.stopping:
            self._lookup_dirty = False
            regs: list[tuple[str, str | None]] = []
            for t in list(self.node.topics.values()):
                regs.append((t.name, None))
                regs.extend((t.name, c) for c in t.channels)
            try:
                self._ctl_send(0, {"op": "lookup", "from": self.index, "regs": regs})
                delay = RETRY_FIRST
            except OSError:  # worker 0 is (re)starting: again in a moment
                self._lookup_dirty = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP)

    def _relayed(self, k: int, regs: set[tuple[str, str | None]]) -> None:
        """Worker 0: worker ``k``'s registrations now; lookupd gets the difference."""
        old = self.relayed_by.get(k, set())
        self.relayed_by[k] = regs
        lookup = self.node.lookup
        lookup.relayed = set().union(*self.relayed_by.values())
        for t, c in sorted(regs - old, key=lambda r: (r[0], r[1] or "")):
            lookup.register(t, c)
        for t, c in sorted(old - regs, key=lambda r: (r[0], r[1] or ""), reverse=True):
            lookup.unregister(t, c)

    def ctl_closed(self, conn: _CtlConn) -> None:
        self._ctl_conns.pop(conn.fileno, None)


class _CtlConn:
    """One incoming control connection: ``[4 len][json][4 len][raw]`` messages, a
    handover's descriptor riding with its bytes (SCM_RIGHTS)."""

    def __init__(self, rt: WorkerRuntime, sock: socket.socket) -> None:
        self.rt = rt
        self.sock = sock
        self.fileno = sock.fileno()
        self.buf = bytearray()
        self.fds: deque[int] = deque()

    def readable(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 8)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data, fds = b"", []
            self.fds.extend(fds)
            if not data:
                self.close()
                return
            self.buf += data
        self._parse()

    def _parse(self) -> None:
        buf = self.buf
        while len(buf) >= 4:
            hl = _LEN.unpack_from(buf)[0]
            if len(buf) < 8 + hl:
                return
            rl = _LEN.unpack_from(buf, 4 + hl)[0]
            end = 8 + hl + rl
            if len(buf) < end:
                return
            msg = json.loads(bytes(buf[4:4 + hl]))
            raw = bytes(buf[8 + hl:end])
            del buf[:end]
            fd = self.fds.popleft() if msg.get("op") == "handover" and self.fds else None
            try:
                self.rt.ctl_message(msg, raw, fd)
            except Exception:  # one bad message must not end the channel
                log.exception("workers: control message %s failed", msg.get("op"))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.rt.loop.remove_reader(self.fileno)
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        self.sock.close()
        self.rt.ctl_closed(self)


class OwnerLink(asyncio.Protocol):
    """One pipelined NSQ connection to the owner's ``w<K>.tcp``: commands queued in a loop
    turn go in one write; answers come back in order and fill the callbacks in order."""

    def __init__(self, rt: WorkerRuntime, k: int) -> None:
        self.rt = rt
        self.k = k
        self.loop = rt.loop
        self.transport: asyncio.Transport | None = None
        self.pending: deque[Callable[[bytes | None, Exception | None], None]] = deque()
        self.out: list[bytes] = []
        self.waiting: list[tuple[bytes, Callable[[bytes | None, Exception | None], None]]] = []
        self.buf = bytearray()
        self._flush_handle: asyncio.Handle | None = None
        self._connecting: asyncio.Task[None] | None = None
        self.closed = False

    def send(self, command: bytes, answered: Callable[[bytes | None, Exception | None], None]
             ) -> None:
        if self.transport is None:
            self.waiting.append((command, answered))
            if self._connecting is None or self._connecting.done():
                self._connecting = self.loop.create_task(self._connect())
            return
        self.out.append(command)
        self.pending.append(answered)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if self.out and self.transport is not None:
            data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
            self.out.clear()
            self.transport.write(data)

    async def _connect(self) -> None:
        deadline = self.loop.time() + FORWARD_TIMEOUT
        delay = RETRY_FIRST
        path = self.rt.path(self.k, "tcp")
        while not self.closed:
            try:
                await self.loop.create_unix_connection(lambda: self, path)
                return
            except OSError as exc:
                if self.loop.time() > deadline:
                    waiting, self.waiting = self.waiting, []
                    err = PublishRefused(f"worker {self.k} (the topic's owner) not reachable "
                                         f"within {FORWARD_TIMEOUT:g} s: {exc}")
                    for _cmd, cb in waiting:
                        cb(None, err)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf.clear()
        ident = v2.identify({"client_id": f"nsqd-worker-{self.rt.index}",
                             "user_agent": "nsqx-worker", "heartbeat_interval": -1,
                             "feature_negotiation": False})
        self.out.append(v2.MAGIC_V2 + ident)
        self.pending.append(_ignore)
        for cmd, cb in self.waiting:
            self.out.append(cmd)
            self.pending.append(cb)
        self.waiting.clear()
        self._flush()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 8:
            size, ftype = _FRAME.unpack_from(buf, pos)
            if n - pos < 4 + size:
                break
            payload = bytes(buf[pos + 8:pos + 4 + size])
            pos += 4 + size
            if ftype == 0:
                if payload == b"_heartbeat_":
                    self.send(b"NOP\n", _ignore)
                    continue
                if self.pending:
                    self.pending.popleft()(payload, None)
            elif ftype == 1:
                code, _, text = payload.decode("utf-8", "replace").partition(" ")
                if self.pending:
                    self.pending.popleft()(None, ProtocolError(code, text or code, False))
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        pending, self.pending = self.pending, deque()
        self.out.clear()
        err = PublishRefused(f"worker {self.k} (the topic's owner) closed the connection"
                             f"{f': {exc}' if exc else ''}")
        for cb in pending:
            cb(None, err)

    def close(self) -> None:
        self.closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self.transport is not None:
            self.transport.close()


def _ignore(_data: bytes | None, _exc: Exception | None) -> None:
    return None


class RelayLookup(LookupPeers):
    """lookupd for a worker other than 0: no connections of its own; worker 0 registers
    this worker's topics and channels with the node's one identity."""

    def __init__(self, node: Any, rt: WorkerRuntime) -> None:
        super().__init__(node)
        self.rt = rt

    def start(self) -> None:
        self._started = True

    def set_addresses(self, addrs: list[str]) -> None:
        return None  # worker 0 holds the connections

    def register(self, topic: str, channel: str | None) -> None:
        if self._started:
            self.rt.lookup_changed()

    def unregister(self, topic: str, channel: str | None) -> None:
        if self._started:
            self.rt.lookup_changed()

    def precreate_channels_soon(self, topic: str) -> None:
        return None  # not yet with workers: see docs/operations.md
