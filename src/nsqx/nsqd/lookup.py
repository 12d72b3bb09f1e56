"""nsqd's connections to nsqlookupd (upstream `nsqd/lookup.go`).

For every `--lookupd-tcp-address`: connect, IDENTIFY, REGISTER every topic and
channel, PING every 15 s, send REGISTER/UNREGISTER as topics and channels come
and go, and start over (re-registering everything) after a lost connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from nsqx import NSQ_VERSION
from nsqx.protocol.names import is_ephemeral, valid_channel_name

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeContext

log = logging.getLogger("nsqx.nsqd.lookup")

PING_INTERVAL = 15.0
IO_TIMEOUT = 1.0  # upstream's dial/read/write deadline


class LookupPeer:
    """One lookupd: a task that keeps a registered connection alive."""

    def __init__(self, nsqd: NodeContext, addr: str,
                 relayed: Callable[[], set[tuple[str, str | None]]] | None = None) -> None:
        self.nsqd = nsqd
        self.addr = addr
        self.relayed = relayed  # --workers: the other workers' registrations
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.http_address: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.closing = False

    def start(self) -> None:
        self.task = self.nsqd.loop.create_task(self._run(), name=f"lookupd-{self.addr}")

    def send(self, line: bytes) -> None:
        self.queue.put_nowait(line)

    async def close(self) -> None:
        self.closing = True
        if self.task is not None:
            self.task.cancel()
            # Bounded: a cancel must never hold up the node's shutdown.
            await asyncio.wait([self.task], timeout=2.0)

    async def _run(self) -> None:
        backoff = 1.0
        while not self.closing:
            try:
                await self._session()
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("LOOKUP(%s): connection error - %s", self.addr, exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 15.0)

    async def _session(self) -> None:
        host, _, port = self.addr.rpartition(":")
        async with asyncio.timeout(IO_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, int(port))
        try:
            log.info("LOOKUP(%s): connected", self.addr)
            nsqd = self.nsqd
            o = nsqd.opts
            ident = {
                "version": NSQ_VERSION,
                "tcp_port": o.broadcast_tcp_port or nsqd.tcp_port,
                "http_port": o.broadcast_http_port or nsqd.http_port,
                "hostname": socket.gethostname(),
                "broadcast_address": o.broadcast_address or socket.gethostname(),
                "topology_zone": o.topology_zone,
                "topology_region": o.topology_region,
            }
            body = orjson.dumps(ident)
            writer.write(b"  V1IDENTIFY\n" + struct.pack(">I", len(body)) + body)
            resp = await self._response(reader)
            if resp.startswith(b"E_"):
                raise ConnectionError(f"IDENTIFY refused: {resp.decode('latin-1')}")
            with contextlib.suppress(ValueError):
                info = orjson.loads(resp)
                # Upstream dials the lookupd's broadcast address; we use the address we
                # reached it at, which also works when lookupd broadcasts a name we cannot
                # resolve (e.g. tests on loopback).
                if isinstance(info, dict) and info.get("http_port"):
                    self.http_address = f"{host}:{info['http_port']}"
            # Drop commands queued while disconnected: the full registration replaces them.
            while not self.queue.empty():
                self.queue.get_nowait()
            lines = []
            for topic in list(nsqd.topics.values()):
                if topic.channels:
                    lines += [f"REGISTER {topic.name} {c}\n".encode() for c in topic.channels]
                else:
                    lines.append(f"REGISTER {topic.name}\n".encode())
            for t, c in sorted(self.relayed() if self.relayed else (),
                               key=lambda r: (r[0], r[1] or "")):
                lines.append(f"REGISTER {t}{' ' + c if c else ''}\n".encode())
            for line in lines:
                writer.write(line)
                await self._response(reader)
            loop = asyncio.get_running_loop()
            next_ping = loop.time() + PING_INTERVAL
            while not self.closing:
                # PING on a fixed 15 s timer, busy or not (lookupd expires silent peers).
                wait = next_ping - loop.time()
                line = b"PING\n"
                if wait > 0:
                    try:
                        async with asyncio.timeout(wait):
                            line = await self.queue.get()
                    except TimeoutError:
                        pass
                if line == b"PING\n":
                    next_ping = loop.time() + PING_INTERVAL
                writer.write(line)
                resp = await self._response(reader)
                if resp != b"OK":
                    log.warning("LOOKUP(%s): %s -> %s", self.addr, line.strip().decode(), resp.decode("latin-1"))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _response(self, reader: asyncio.StreamReader) -> bytes:
        async with asyncio.timeout(IO_TIMEOUT):
            size = struct.unpack(">I", await reader.readexactly(4))[0]
            if size > 1 << 20:
                raise ValueError(f"response too large ({size} bytes)")
            return await reader.readexactly(size)


class LookupPeers:
    """All lookupd peers of a node."""

    def __init__(self, nsqd: NodeContext) -> None:
        self.nsqd = nsqd
        self.peers: dict[str, LookupPeer] = {}
        self._started = False
        # --workers > 1, worker 0: what the other workers registered through it
        # (nsqx.nsqd.workers.runtime), registered again with everything after a reconnect
        self.relayed: set[tuple[str, str | None]] = set()

    def start(self) -> None:
        self._started = True
        self.set_addresses(list(self.nsqd.opts.nsqlookupd_tcp_addresses))

    def set_addresses(self, addrs: list[str]) -> None:
        if not self._started:
            return
        for addr in list(self.peers):
            if addr not in addrs:
                peer = self.peers.pop(addr)
                self.nsqd.loop.create_task(peer.close())
        for addr in addrs:
            if addr not in self.peers:
                peer = LookupPeer(self.nsqd, addr, lambda: self.relayed)
                self.peers[addr] = peer
                peer.start()

    def _broadcast(self, line: bytes) -> None:
        for peer in self.peers.values():
            peer.send(line)

    def register(self, topic: str, channel: str | None) -> None:
        self._broadcast(f"REGISTER {topic}{' ' + channel if channel else ''}\n".encode())

    def unregister(self, topic: str, channel: str | None) -> None:
        self._broadcast(f"UNREGISTER {topic}{' ' + channel if channel else ''}\n".encode())

    def precreate_channels_soon(self, topic: str) -> None:
        """Create the channels lookupd lists for a new topic, in the background."""
        if self.peers:
            self.nsqd.loop.create_task(self.precreate_channels(topic))

    async def precreate_channels(self, topic_name: str) -> None:
        """Create the channels lookupd lists for a new topic.

        A new topic keeps everything from its first offset until its first channel
        exists, so creating them a moment later loses nothing.
        """
        import aiohttp  # the HTTP client loads with the first lookupd query, not at start

        names: set[str] = set()
        timeout = aiohttp.ClientTimeout(total=self.nsqd.opts.http_client_request_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for peer in list(self.peers.values()):
                if not peer.http_address:
                    continue
                try:
                    async with session.get(f"http://{peer.http_address}/channels",
                                           params={"topic": topic_name},
                                           headers={"Accept": "application/vnd.nsq; version=1.0"}) as r:
                        if r.status == 200:
                            data: Any = await r.json(content_type=None)
                            names.update(data.get("channels") or [])
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    log.warning("LOOKUP(%s): /channels?topic=%s failed - %s", peer.addr, topic_name, exc)
        topic = self.nsqd.topics.get(topic_name)
        if topic is None:
            return
        for name in names:
            if isinstance(name, str) and not is_ephemeral(name) \
                    and valid_channel_name(name):
                topic.get_channel(name)

    async def close(self) -> None:
        for peer in self.peers.values():
            await peer.close()
