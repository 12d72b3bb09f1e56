"""Producer: PUB/MPUB/DPUB over one or more nsqd, pipelined, with failover.

* One connection per nsqd address, each kept open by a supervisor task that reconnects
  with exponential backoff (``reconnect_interval`` is the cap).
* Each publish picks a random open connection (pynsq ``Writer``); commands are pipelined
  and matched to responses in order (go-nsq ``Producer``).
* Idempotent by default (``idempotent=False`` opts out): every batch carries a producer id,
  epoch and sequence number (:mod:`nsqx.client.idempotent`) and nsqd stores it once, so a
  publish whose connection failed before its answer is sent again *to the same nsqd*
  (waiting through its restart) until ``publish_timeout``: exactly once. Only when that
  nsqd stays unreachable for ``wait_timeout`` while another one is connected does the
  publish go to the other (at-least-once: the first may have stored it).
* Not idempotent: if the connection fails before the response arrives, the publish is
  retried on another open connection, at most ``retries`` times (the message may then be
  stored twice: at-least-once). Error frames from nsqd are never retried: they raise
  :class:`~nsqx.client.errors.NSQError` with nsqd's code.
* Backpressure: at most ``max_pending`` commands are in flight over all connections;
  ``publish`` waits for a slot, and also waits while a socket's write buffer is full.
* With no open connection, a publish waits up to ``wait_timeout`` for one, then raises
  :class:`~nsqx.client.errors.NoConnectionsError` (or, when every nsqd refused the
  connection itself, e.g. ``E_AUTH_FAILED``, that error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from nsqx.protocol import v2
from nsqx.protocol.names import valid_topic_name
from nsqx.protocol.routes import key_partition

from .conn import ConnConfig, Connection, make_config
from .errors import ClosedError, ConnectionClosedError, NoConnectionsError, NSQError
from .idempotent import RETRY_CODES, Sequences, ext_headers, mark_command
from .routing import HttpRouteSource, RouteCache, RouteSource, refused_version

__all__ = ["Producer", "key_partition"]

Headers = Mapping[str, bytes | str] | None


def _pick(partition: int | None, key: bytes | str | None, partitions: int | None) -> int | None:
    if key is None:
        if partition is not None and not 0 <= partition <= 65535:
            raise ValueError("partition must be 0..65535")
        return partition
    if partition is not None:
        raise ValueError("give a partition or a key, not both")
    if not partitions:
        raise ValueError("a key needs the topic's partition count (partitions=)")
    return key_partition(key, partitions)

log = logging.getLogger("nsqx.client")

# a keyed publish refused by a sealed partition is retried once per route change it meets
MAX_ROUTE_RETRIES = 4
# a routed publish whose partition leader fails is sent to the new leader for this long
LEADER_WAIT = 15.0
# an idempotent publish refused for a sequence gap this long starts a new epoch (the
# missing sequence is not being resent: the leader forgot the producer, or it was given up)
GAP_WAIT = 2.0


class Producer:
    """``async with Producer(["127.0.0.1:4150"]) as p: await p.publish("topic", b"body")``.

    ``nsqd_tcp_addresses``: one ``"host:port"`` or a list. Connection options
    (``tls``, ``snappy``, ``deflate``, ``auth_secret``, ``heartbeat_interval``, ...; see
    :class:`~nsqx.client.conn.ConnConfig`) are keyword arguments or ``config=``.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        *,
        max_pending: int = 1024,
        retries: int = 2,
        wait_timeout: float = 5.0,
        reconnect_interval: float = 15.0,
        config: ConnConfig | None = None,
        nsqd_http_addresses: str | Sequence[str] | None = None,
        route_source: RouteSource | None = None,
        idempotent: bool = True,
        publish_timeout: float = 30.0,
        **options: Any,
    ) -> None:
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        if not nsqd_tcp_addresses:
            raise ValueError("at least one nsqd address is needed")
        self.addresses = list(dict.fromkeys(nsqd_tcp_addresses))
        self.config = make_config(config, options)
        self.max_pending = max_pending
        self.retries = retries
        self.wait_timeout = wait_timeout
        self.reconnect_interval = reconnect_interval
        self.idempotent = idempotent
        self.publish_timeout = publish_timeout
        self._seqs = Sequences()
        self.idempotent_retries = 0  # idempotent publishes sent again (same sequence)
        self._conns: dict[str, Connection] = {}
        self._supervisors: list[asyncio.Task[None]] = []
        self._slots: asyncio.Semaphore | None = None
        self._changed: asyncio.Event | None = None  # set whenever a connection opens
        self._started = False
        self._closed = False
        self._closing = False
        self._inflight: set[asyncio.Future[bytes]] = set()
        self._last_error: dict[str, Exception] = {}  # per address, cleared on connect
        # route-managed topics: a key is routed by the newest route (nsqx.client.routing)
        if route_source is None and nsqd_http_addresses:
            route_source = HttpRouteSource(nsqd_http_addresses)
        self.route_source = route_source
        self._routes = RouteCache(route_source, wait_timeout) if route_source else None
        self.route_retries = 0  # publishes sent again after E_BAD_PARTITION route version N
        self.leader_retries = 0  # routed publishes sent again after their leader failed

    # -- lifecycle -------------------------------------------------------------------------
    async def connect(self) -> None:
        """Start the connection supervisors and wait (up to ``wait_timeout``) for the first
        connection. Publishing connects implicitly; call this to fail fast."""
        self._start()
        await self._wait_open()

    def _start(self) -> None:
        if self._closed or self._closing:
            raise ClosedError("producer closed")
        if self._started:
            return
        self._started = True
        self._slots = asyncio.Semaphore(self.max_pending)
        self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        for addr in self.addresses:
            self._supervisors.append(
                loop.create_task(self._supervise(addr), name=f"nsqx-producer-{addr}"))

    async def __aenter__(self) -> Producer:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connections(self) -> list[Connection]:
        """Open connections."""
        return [c for c in self._conns.values() if c.is_open]

    async def close(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout``) for responses to publishes in flight, then close."""
        if self._closed:
            return
        self._closing = True
        if self._inflight:
            with contextlib.suppress(Exception):
                await asyncio.wait(list(self._inflight), timeout=timeout)
        self._closed = True
        for t in self._supervisors:
            t.cancel()
        for t in self._supervisors:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        conns = list(self._conns.values())
        self._conns.clear()
        for c in conns:
            c.close()
        for c in conns:
            await c.wait_closed()
        if self._changed is not None:
            self._changed.set()  # wake waiters: they see _closed
        if self.route_source is not None:
            await self.route_source.close()

    async def _supervise(self, addr: str) -> None:
        delay = min(0.25, self.reconnect_interval)
        while not self._closed:
            conn = Connection(addr, self.config)
            try:
                await conn.connect()
            except asyncio.CancelledError:
                conn.close()
                raise
            except Exception as e:
                log.warning("[%s] producer connect failed: %s; retrying in %.2fs", addr, e, delay)
                self._last_error[addr] = e
                if self._changed is not None:
                    self._changed.set()
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.reconnect_interval)
                continue
            log.info("[%s] producer connected", addr)
            self._last_error.pop(addr, None)
            delay = min(0.25, self.reconnect_interval)
            self._conns[addr] = conn
            assert self._changed is not None
            self._changed.set()
            try:
                await conn.wait_closed()
            finally:
                if self._conns.get(addr) is conn:
                    del self._conns[addr]
                if self._closed:
                    conn.close()
            if not self._closed:
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _wait_open(self, address: str | None = None) -> Connection:
        """An open connection, chosen at random (or the one to ``address``, connected on
        first use: a partition's leader); waits up to wait_timeout for one."""
        assert self._changed is not None
        if address is not None and address not in self.addresses:
            self.addresses.append(address)
            self._supervisors.append(asyncio.get_running_loop().create_task(
                self._supervise(address), name=f"nsqx-producer-{address}"))
        deadline = asyncio.get_running_loop().time() + self.wait_timeout
        while True:
            if self._closed:
                raise ClosedError("producer closed")
            conns = [c for a, c in self._conns.items()
                     if c.is_open and (address is None or a == address)]
            if conns:
                return random.choice(conns)
            remaining = deadline - asyncio.get_running_loop().time()
            if address is not None and self._last_error.get(address) is not None:
                # a partition's leader that cannot be reached: the caller asks where it went
                raise NoConnectionsError(f"no connection to {address}: "
                                         f"{self._last_error[address]}")
            errors = [self._last_error.get(a) for a in
                      (self.addresses if address is None else [address])]
            if remaining <= 0 or all(e is not None for e in errors):
                # every nsqd refused us: surface nsqd's own error (E_AUTH_FAILED, ...)
                refused = [e for e in errors if isinstance(e, NSQError) and not e.retriable]
                if refused and all(e is not None for e in errors):
                    raise refused[0]
                if remaining <= 0:
                    detail = "; ".join(f"{a}: {e}" for a, e in self._last_error.items())
                    raise NoConnectionsError(
                        f"no open connection to any of {', '.join(self.addresses)}"
                        + (f" ({detail})" if detail else ""))
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()

    # -- publishing -----------------------------------------------------------------------
    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      key: bytes | str | None = None, partitions: int | None = None,
                      headers: Headers = None, tag: str | None = None,
                      trace_id: int | None = None) -> tuple[int, int, int, int] | None:
        """PUB one message; returns when nsqd acknowledged it (``OK``).

        ``partition`` sends Youzan's ``PUB <topic> <partition>``; ``key`` with the topic's
        ``partitions`` count picks it with :func:`key_partition` instead, so every message
        of one key lands in one partition, in order (ordered topics need one of the two).

        ``headers`` (string keys, string or bytes values), ``tag`` (Youzan's dispatch tag,
        for consumers that IDENTIFY ``desired_tag``) and ``trace_id`` (a uint64) send
        ``PUB_EXT``; with ``trace_id`` this returns nsqd's traced answer (message id, trace
        id, offset, raw size). An idempotent producer always sends ``PUB_EXT``.

        A ``key`` without ``partitions`` on a producer with a route source
        (``nsqd_http_addresses=`` or ``route_source=``) routes by the topic's newest route
        (route-managed topics); refused with ``E_BAD_PARTITION route version N`` (the
        partition was sealed by a split, merge or move), it waits for version N, routes again
        and retries once. Per-key order holds for a key's publishes made one after another
        (each awaited before the next), as always with NSQ. These routed publishes take
        no headers; idempotent (the default), each carries its mark, is sent again with it
        to the partition's leader of the moment until ``publish_timeout`` and is stored
        once (a split's refusal is not stored: it is routed again with a new mark).
        """
        _check_topic(topic)
        hdrs = ext_headers(headers, tag, trace_id)
        if key is not None and partitions is None and partition is None and self._routes:
            if hdrs:
                raise ValueError("a route-managed keyed publish takes no headers")
            await self._routed(topic, key, [_bytes(body)], multi=False)
            return None
        answer = await self._publish(topic, [_bytes(body)], _pick(partition, key, partitions),
                                     hdrs, multi=False)
        return v2.parse_traced_response(answer) if trace_id is not None else None

    async def _publish(self, topic: str, bodies: list[bytes], partition: int | None,
                       headers: Headers, *, multi: bool) -> bytes:
        if self.idempotent:
            return await self._send_once(topic, bodies, partition, headers, multi)
        return await self._send(mark_command(topic, bodies, partition, headers, None, multi))

    async def _routed(self, topic: str, key: bytes | str, bodies: list[bytes], *,
                      multi: bool) -> None:
        """A route-managed topic's keyed publish: to the partition the newest route gives
        the key, retried by route version N when refused by a sealed partition."""
        if self.idempotent:
            await self._routed_once(topic, key, bodies, multi)
            return

        def build(p: int, v: int) -> bytes:
            return (v2.mpub(topic, bodies, p, v) if multi
                    else v2.pub(topic, bodies[0], p, v))
        assert self._routes is not None
        h = await self._routes.get(topic)
        if h is None:
            raise ValueError(f"topic {topic} is not route-managed: a key needs partitions=")
        loop = asyncio.get_running_loop()
        leader_deadline = loop.time() + LEADER_WAIT
        attempt = 0
        while attempt < MAX_ROUTE_RETRIES:
            attempt += 1
            try:
                p = h.route(key).partition
                leader = self._leader(topic, p)
                await self._send(build(p, h.newest.version), leader)
                return
            except NSQError as e:
                need = refused_version(e.text) if e.code == "E_BAD_PARTITION" else None
                if need is None and leader is not None and loop.time() < leader_deadline and (
                        isinstance(e, ConnectionError) or e.code in ("E_PUB_FAILED", "E_MPUB_FAILED")):
                    # the leader died or moved (a cluster failover): ask again where the
                    # partition is led and send there (at least once: it may be a duplicate)
                    self.leader_retries += 1
                    attempt -= 1
                    await asyncio.sleep(0.25)
                    self._routes.invalidate(topic)
                    h = await self._routes.get(topic)
                    assert h is not None
                    continue
                if need is None:
                    raise
                self.route_retries += 1
                # one retry per change: the refusal names the version that sealed it
                h = await self._routes.get(topic, max(need, h.newest.version + 1))
                assert h is not None
        p = h.route(key).partition
        await self._send(build(p, h.newest.version), self._leader(topic, p))

    async def _routed_once(self, topic: str, key: bytes | str, bodies: list[bytes],
                           multi: bool) -> None:
        """:meth:`_routed`, idempotent: one mark per partition tried. Without a known
        leader (a standalone nsqd) :meth:`_send_once` sends it; with one (a cluster) the
        same mark goes to whichever node leads the partition, looked up again after each
        failure, until ``publish_timeout``. ``E_BAD_PARTITION route version N`` (a sealed
        partition: refused, so not stored) routes the key again by version N."""
        assert self._routes is not None
        h = await self._routes.get(topic)
        if h is None:
            raise ValueError(f"topic {topic} is not route-managed: a key needs partitions=")
        for attempt in range(MAX_ROUTE_RETRIES + 1):
            p, version = h.route(key).partition, h.newest.version
            try:
                if self._leader(topic, p) is None:
                    await self._send_once(topic, bodies, p, None, multi,
                                          route_version=version)
                else:
                    await self._to_leaders_once(topic, p, version, bodies, multi)
                return
            except NSQError as e:
                need = refused_version(e.text) if e.code == "E_BAD_PARTITION" else None
                if need is None or attempt == MAX_ROUTE_RETRIES:
                    raise
                self.route_retries += 1
                h = await self._routes.get(topic, max(need, h.newest.version + 1))
                assert h is not None

    async def _to_leaders_once(self, topic: str, partition: int, version: int,
                               bodies: list[bytes], multi: bool) -> None:
        """One marked batch to the partition's leader, sent again with the same mark (to
        the leader of the moment: the partition's state is replicated, a new leader
        continues it) until ``publish_timeout``. One stream per (topic, partition)."""
        assert self._routes is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.publish_timeout
        stream = ("routed", topic, partition)
        mark: bytes | None = None

        def command() -> bytes:
            nonlocal mark
            if mark is None:  # taken when first written: in order on the connection
                mark = self._seqs.next(stream)
            return mark_command(topic, bodies, partition, None, mark, multi, version)
        while True:
            error: Exception
            try:
                await self._send(command, self._leader(topic, partition))
                return
            except (ConnectionClosedError, NoConnectionsError) as e:
                error = e
            except NSQError as e:
                if e.code not in RETRY_CODES:
                    if mark is not None:  # refused (a sealed partition...): not stored
                        self._seqs.give_up(stream, mark)
                    raise
                error = e
            if self._closed or loop.time() >= deadline:
                if mark is not None:  # outcome unknown: the stream goes on in a new epoch
                    self._seqs.give_up(stream, mark)
                raise error
            self.leader_retries += 1
            self.idempotent_retries += 1
            log.info("TOPIC(%s) PARTITION(%d): idempotent publish failed (%s); sending it "
                     "again to the partition's leader", topic, partition, error)
            await asyncio.sleep(0.25)
            self._routes.invalidate(topic)  # where is the partition led now?
            await self._routes.get(topic)

    def _leader(self, topic: str, partition: int) -> str | None:
        """Where a routed publish goes: the partition's leader when the route source knows
        it (nsqlookupd in cluster mode), else any connection."""
        source = self.route_source
        return source.leader(topic, partition) if source is not None else None

    async def mpublish(self, topic: str, bodies: Iterable[bytes], *,
                       partition: int | None = None, key: bytes | str | None = None,
                       partitions: int | None = None, headers: Headers = None,
                       tag: str | None = None) -> None:
        """MPUB: several messages, atomically (all or none); partition/key as publish();
        ``headers`` and ``tag`` go on every message (``MPUB_EXT``)."""
        _check_topic(topic)
        bodies = [_bytes(b) for b in bodies]
        if not bodies:
            raise ValueError("mpublish needs at least one message")
        hdrs = ext_headers(headers, tag, None)
        if key is not None and partitions is None and partition is None and self._routes:
            if hdrs:
                raise ValueError("a route-managed keyed publish takes no headers")
            await self._routed(topic, key, bodies, multi=True)
            return
        await self._publish(topic, bodies, _pick(partition, key, partitions), hdrs, multi=True)

    async def dpublish(self, topic: str, delay: float, body: bytes) -> None:
        """Deliver after ``delay`` seconds (nsqd rejects delays over its ``--max-delay``).

        Idempotent (the default): ``PUB_EXT`` with the producer's mark and the delay as
        the ``##nsqx_defer`` header (DPUB carries no mark), retried as :meth:`publish` is
        and stored once; it lands in the partition the producer's id sticks to (nsqx nsqd
        only: stock nsqd does not know the header). ``idempotent=False``: plain ``DPUB``,
        at least once."""
        _check_topic(topic)
        if delay < 0:
            raise ValueError("delay must be >= 0")
        ms = round(delay * 1000)
        if self.idempotent:
            await self._send_once(topic, [_bytes(body)], None, {v2.DEFER_KEY: b"%d" % ms},
                                  False)
            return
        await self._send(v2.dpub(topic, ms, _bytes(body)))

    async def send_command(self, data: bytes) -> bytes:
        """Send one ready-made publish command (built with :mod:`nsqx.protocol.v2`) and return
        nsqd's answer; for forwarding nodes and tools that already hold the wire bytes."""
        return await self._send(data)

    async def _send(self, data: bytes | Callable[[], bytes], address: str | None = None) -> bytes:
        """``data`` may be a function building the command when it is written (an
        idempotent ClusterProducer takes its sequence number then, so they go out in
        order)."""
        if self._closing:
            raise ClosedError("producer closed")
        self._start()
        assert self._slots is not None
        async with self._slots:
            attempt = 0
            while True:
                conn = await self._wait_open(address)
                try:
                    fut = conn.command(data if isinstance(data, bytes) else data())
                except ConnectionClosedError:
                    continue
                try:
                    return await self._answer(conn, fut)
                except ConnectionClosedError as e:
                    attempt += 1
                    if attempt > self.retries or self._closed:
                        raise
                    log.warning("[%s] publish failed (%s); retrying on another nsqd",
                                conn.address, e)


    async def _answer(self, conn: Connection, fut: asyncio.Future[bytes]) -> bytes:
        """Await the answer to a command just written on ``conn``; tracked in ``_inflight``
        meanwhile (close() waits for those), and a large write buffer is drained first."""
        self._inflight.add(fut)
        try:
            if conn.write_buffer_size > 1 << 20:
                with contextlib.suppress(ConnectionClosedError):
                    await conn.drain()
            return await fut
        finally:
            self._inflight.discard(fut)

    async def _send_once(self, topic: str, bodies: list[bytes], partition: int | None,
                         headers: Headers, multi: bool, address: str | None = None, *,
                         route_version: int | None = None) -> bytes:
        """An idempotent publish: the sequence is taken on the connection it is first
        written to (so sequences go out in order), and a failure before the answer sends
        the same bytes again to the same nsqd until ``publish_timeout``. A refusal other
        than those sent again (not stored) moves the stream to a new epoch, so its next
        batch is no gap."""
        if self._closing:
            raise ClosedError("producer closed")
        self._start()
        assert self._slots is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.publish_timeout
        stream: tuple[str, str, int | None] | None = None
        mark = data = b""
        down_since: float | None = None
        gap_since: float | None = None
        async with self._slots:
            while True:
                error: Exception
                try:
                    conn = await self._wait_open(address)
                except NoConnectionsError as e:
                    if stream is None:
                        raise  # nothing was sent
                    error = e
                    now = loop.time()
                    down_since = down_since or now
                    if now - down_since >= self.wait_timeout and any(
                            c.is_open for a, c in self._conns.items() if a != address):
                        # its nsqd stays away: another one takes it (at-least-once, the
                        # first nsqd may have stored it), as a non-idempotent retry would
                        log.warning("[%s] unreachable for %.0fs: publishing on another nsqd",
                                    address, now - down_since)
                        self._seqs.give_up(stream, mark)
                        stream, address, down_since = None, None, None
                        continue
                else:
                    down_since = None
                    if stream is None:
                        address = conn.address
                        stream = (address, topic, partition)
                        mark = self._seqs.next(stream)
                        data = mark_command(topic, bodies, partition, headers, mark, multi,
                                            route_version)
                    try:
                        fut = conn.command(data)
                    except ConnectionClosedError:
                        continue
                    try:
                        return await self._answer(conn, fut)
                    except ConnectionClosedError as e:
                        error = e
                    except NSQError as e:
                        if e.code not in RETRY_CODES:
                            self._seqs.give_up(stream, mark)  # refused: not stored
                            raise
                        error = e
                        if e.code == "E_OUT_OF_ORDER_SEQUENCE":
                            gap_since = gap_since or loop.time()
                            if loop.time() - gap_since >= GAP_WAIT:
                                # not stored (refused before the append), and the missing
                                # sequence is not coming: this batch starts a new epoch
                                self._seqs.give_up(stream, mark)
                                mark = self._seqs.next(stream)
                                data = mark_command(topic, bodies, partition, headers, mark,
                                                    multi, route_version)
                                gap_since = None
                if self._closed or loop.time() >= deadline:
                    self._seqs.give_up(stream, mark)  # outcome unknown: a new epoch next
                    raise error
                self.idempotent_retries += 1
                log.info("[%s] idempotent publish failed (%s); sending it again", address, error)
                await asyncio.sleep(0.05 if isinstance(error, NSQError) and
                                    error.code == "E_OUT_OF_ORDER_SEQUENCE" else 0.25)


def _check_topic(topic: str) -> None:
    # what nsqd would answer, without sending a line that could break the framing
    if not valid_topic_name(topic.encode("utf-8", "surrogateescape")):
        raise NSQError("E_BAD_TOPIC", f"topic name {topic!r} is not valid")


def _bytes(b: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(b, bytes):
        return b
    if isinstance(b, str):
        return b.encode()
    return bytes(b)
