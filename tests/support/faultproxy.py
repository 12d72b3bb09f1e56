"""A small fault-injecting TCP proxy for network-cut tests (asyncio, in a thread of its own).

Put one in front of a listener and hand its port to the peers instead (for nsqd:
``--broadcast-tcp-port`` / ``--broadcast-http-port``, which the cluster registers in etcd,
so other nodes, lookupd's /lookup and its clients reach the node through the proxy; for
etcd: the endpoint a node is given). Then, from the test's thread:

- ``cut("refuse")``: existing connections are reset and new ones refused (the listening
  socket is closed): what a peer sees when the host is down or a firewall rejects.
- ``cut("drop")``: the listener stays, but nothing is forwarded any more in either
  direction, on old or new connections: bytes vanish, as when packets are dropped; peers
  learn of it only through their own timeouts.
- ``heal()``: connections made before or during the cut are reset (their bytes were lost)
  and new ones are forwarded again.
- ``cut_after(n)``: once; the next ``n`` bytes the target sends (on any connection) are
  forwarded and the connection carrying byte ``n + 1`` is reset there, the rest of its
  read lost: an answer cut in the middle (``cuts`` counts them).

With ``record=True`` it also keeps what each client sent (the first 64 KiB of every
connection, in ``recorded``): an on-path observer's capture, for replay tests.

Only loopback, only what the tests need: no latency or bandwidth shaping.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any

__all__ = ["FaultProxy", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Conn:
    def __init__(self, down: asyncio.StreamWriter) -> None:
        self.down = down
        self.up: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        for w in (self.down, self.up):
            if w is not None:
                w.transport.abort()
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``target_host:target_port`` until told otherwise."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *,
                 port: int = 0, name: str = "", record: bool = False) -> None:
        self.target = (target_host, target_port)
        self.record = record
        self.recorded: list[bytearray] = []  # per connection, what the client sent (record)
        self.port = port or free_port()
        self.name = name or f"proxy:{self.port}->{target_port}"
        self.mode = "open"  # open | drop | refuse
        self.connections = 0  # accepted, for the tests' curiosity
        self.cuts = 0  # connections reset by cut_after
        self._cut_after: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=self.name,
                                        daemon=True)
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- the test's side (any thread) -------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self, mode: str = "refuse") -> None:
        if mode not in ("refuse", "drop"):
            raise ValueError(f"mode is refuse or drop, not {mode!r}")
        self._call(self._cut(mode))

    def heal(self) -> None:
        self._call(self._heal())

    def cut_after(self, nbytes: int) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_cut_after", nbytes)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- the proxy's loop ---------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port,
                                                  reuse_address=True)

    async def _cut(self, mode: str) -> None:
        self.mode = mode
        if mode == "refuse":
            await self._stop_listening()
            self._abort_all()

    async def _heal(self) -> None:
        self._abort_all()
        self.mode = "open"
        if self._server is None:
            await self._listen()

    async def _close(self) -> None:
        await self._stop_listening()
        self._abort_all()

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _abort_all(self) -> None:
        for c in list(self._conns):
            c.abort()
        self._conns.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            writer.transport.abort()
            return
        self.connections += 1
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            if self.mode == "drop":
                await self._sink(reader)  # accepted, but nothing reaches the target
                return
            try:
                up_reader, conn.up = await asyncio.open_connection(*self.target)
            except OSError:
                writer.transport.abort()
                return
            conn.tasks = [asyncio.current_task()]  # type: ignore[list-item]
            other = asyncio.get_running_loop().create_task(
                self._pump(up_reader, writer, down=conn))
            conn.tasks.append(other)
            capture = None
            if self.record:
                capture = bytearray()
                self.recorded.append(capture)
            await self._pump(reader, conn.up, capture=capture)
            await other
        except (asyncio.CancelledError, ConnectionError, OSError):
            pass
        finally:
            self._conns.discard(conn)
            conn.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    down: _Conn | None = None, capture: bytearray | None = None) -> None:
        """Copy src to dst; ``down``: the connection this pump answers on (cut_after);
        ``capture``: where the bytes forwarded are also kept (64 KiB at most)."""
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if self.mode != "open":
                    continue  # dropped on the floor
                if down is not None and self._cut_after is not None:
                    if len(data) > self._cut_after:
                        dst.write(data[:self._cut_after])
                        await dst.drain()
                        self._cut_after = None
                        self.cuts += 1
                        down.abort()  # both ends reset, the rest of this read lost
                        return
                    self._cut_after -= len(data)
                if capture is not None and len(capture) < 65536:
                    capture += data[:65536 - len(capture)]
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            if self.mode == "open" and dst.can_write_eof():
                dst.write_eof()

    async def _sink(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while await reader.read(65536):
                pass
