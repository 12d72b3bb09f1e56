"""Consumer: SUB to a topic/channel on every nsqd that has it, with go-nsq's flow control.

Discovery: nsqd addresses given directly (reconnected with backoff when they drop) and/or
lookupds polled for the topic (see :mod:`.lookup`); one connection per nsqd.

RDY (go-nsq ``consumer.go``; nsqd treats RDY as a window, so RDY is only sent on changes):

* each connection gets ``max(1, max_in_flight // n_conns)`` (capped at nsqd's
  ``max_rdy_count``) and the sum never exceeds ``max_in_flight``: a connection that would
  exceed it gets nothing and retries in 5 s;
* when there are more connections than ``max_in_flight`` (or the consumer is backing off
  with several connections), every ``rdy_redistribute_interval`` connections idle for
  ``low_rdy_idle_timeout`` or holding RDY for ``low_rdy_timeout`` drop to RDY 0 and RDY 1 is
  handed to randomly chosen connections until the budget is used, so every nsqd is served.

Backoff: a requeue with ``backoff=True`` (the default when a handler raises) sets RDY 0 on
every connection, waits ``backoff_multiplier * 2**level`` seconds (capped at
``max_backoff_duration``), then sends RDY 1 to one random connection; each success steps the
level down, and at level 0 every connection gets its full RDY again. Signals arriving while a
backoff timer runs are ignored (so a burst of failures counts once).

Ordered topics (Youzan's ``SUB_ORDERED``): an nsqd that refuses the plain SUB with
``E_SUB_ORDER_IS_MUST`` gets one connection per partition, ``SUB_ORDERED <topic> <channel>
<k>`` for k = 0, 1, ... until ``E_BAD_PARTITION`` (partitions another node leads,
``E_FAILED_ON_NOT_LEADER``, are skipped). nsqd delivers each partition in log order with one
message in flight; a ``max_in_flight`` of at least the partition count reads them all at
once.

Messages with ``attempts > max_attempts`` are finished without calling the handler, after
calling the ``give_up`` hook. ``close()`` sends CLS, waits for messages in flight to be
answered (up to a timeout), requeues what is left (REQ 0) and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nsqx.protocol import v2
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.names import valid_channel_name, valid_topic_name

from .conn import ConnConfig, Connection, make_config
from .errors import ClosedError, NSQError
from .lookup import LookupdPoller
from .message import Message

__all__ = ["Consumer"]

log = logging.getLogger("nsqx.client")

Handler = Callable[[Message], Any]  # sync, or async (returns an awaitable)
GiveUpHook = Callable[[Message], Any]


class Consumer:
    """``Consumer(topic, channel, handler, nsqd_tcp_addresses=[...] or lookupd_http_addresses=[...])``.

    ``handler(message)`` may be a plain function or a coroutine function. Connection options
    (``tls``, ``snappy``, ``deflate``, ``auth_secret``, ``heartbeat_interval``,
    ``msg_timeout``, ...) are keyword arguments or ``config=``. Durations are seconds.
    ``start`` (``"timestamp:<unix s>"``, ``"msgcount:<offset>"``, ``"earliest"``,
    ``"latest"``) subscribes with ``SUB_ADVANCED``: a channel with no client yet starts
    there (replay), one with clients is joined where it is (nsqx and Youzan nsqd only).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        *,
        nsqd_tcp_addresses: str | Sequence[str] = (),
        lookupd_http_addresses: str | Sequence[str] = (),
        max_in_flight: int = 1,
        max_attempts: int = 5,
        give_up: GiveUpHook | None = None,
        auto_finish: bool = True,
        requeue_delay: float = 90.0,
        max_requeue_delay: float = 900.0,
        backoff_multiplier: float = 1.0,
        max_backoff_duration: float = 120.0,
        lookupd_poll_interval: float = 60.0,
        lookupd_poll_jitter: float = 0.3,
        lookupd_auth_secret: str | None = None,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        rdy_redistribute_interval: float = 5.0,
        rdy_retry_interval: float = 5.0,
        reconnect_interval: float = 15.0,
        start: str | None = None,
        config: ConnConfig | None = None,
        **options: Any,
    ) -> None:
        if not valid_topic_name(topic.encode()):
            raise ValueError(f"invalid topic name {topic!r}")
        if not valid_channel_name(channel.encode()):
            raise ValueError(f"invalid channel name {channel!r}")
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        if isinstance(lookupd_http_addresses, str):
            lookupd_http_addresses = [lookupd_http_addresses]
        if not nsqd_tcp_addresses and not lookupd_http_addresses:
            raise ValueError("give nsqd_tcp_addresses or lookupd_http_addresses")
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        if start is not None:
            try:
                v2.parse_start_position(start.encode())
            except ProtocolError as exc:
                raise ValueError(f"invalid start position {start!r}: {exc.text}") from None
        self.start_position = start
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.nsqd_tcp_addresses = list(dict.fromkeys(nsqd_tcp_addresses))
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        self.config = make_config(config, options)
        self.max_attempts = max_attempts
        self.give_up = give_up
        self.auto_finish = auto_finish
        self.requeue_delay = requeue_delay
        self.max_requeue_delay = max_requeue_delay
        self.backoff_multiplier = backoff_multiplier
        self.max_backoff_duration = max_backoff_duration
        self.lookupd_poll_interval = lookupd_poll_interval
        self.lookupd_poll_jitter = lookupd_poll_jitter
        self.lookupd_auth_secret = lookupd_auth_secret
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.low_rdy_timeout = low_rdy_timeout
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.rdy_retry_interval = rdy_retry_interval
        self.reconnect_interval = reconnect_interval

        self._max_in_flight = max_in_flight
        self._conns: dict[str, Connection] = {}  # by slot: address, or address/p<k>
        self._pending: set[str] = set()  # slots being connected
        self._ordered: dict[str, set[int]] = {}  # ordered nsqd -> partitions it serves us
        self._probed: set[str] = set()  # ordered nsqd whose partitions were all tried
        self._probing: set[str] = set()
        self._reconnecting: set[str] = set()
        self._total_rdy = 0
        self._rdy_retry: dict[str, asyncio.TimerHandle] = {}
        self._need_redistribute = False
        self._backoff_level = 0
        self._backoff_timer: asyncio.TimerHandle | None = None  # "in backoff timeout"
        self._in_flight = 0
        self._drained: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # handler / reconnect tasks
        self._rdy_task: asyncio.Task[None] | None = None
        self._poller: LookupdPoller | None = None
        self._started = False
        self._stopping = False
        self._closed = False
        self._closed_event = asyncio.Event()
        self._is_async = inspect.iscoroutinefunction(handler)
        self._unanswered: set[Message] = set()
        # stats
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.gave_up = 0

    # -- public ---------------------------------------------------------------------------
    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def connections(self) -> list[Connection]:
        return list(self._conns.values())

    @property
    def in_flight(self) -> int:
        """Messages received and not yet finished/requeued."""
        return self._in_flight

    @property
    def backoff_level(self) -> int:
        return self._backoff_level

    @property
    def total_rdy(self) -> int:
        return self._total_rdy

    async def start(self) -> None:
        """Connect to the nsqd addresses and lookupds (failures are retried in background)."""
        if self._started:
            return
        self._started = True
        self._drained = asyncio.Event()
        self._drained.set()
        loop = asyncio.get_running_loop()
        self._rdy_task = loop.create_task(self._rdy_loop(), name="nsqx-consumer-rdy")
        if self.nsqd_tcp_addresses:
            results = await asyncio.gather(
                *(self.connect_to_nsqd(a) for a in self.nsqd_tcp_addresses),
                return_exceptions=True)
            for addr, res in zip(self.nsqd_tcp_addresses, results, strict=True):
                if isinstance(res, BaseException):
                    log.warning("[%s] connect failed: %r; will retry", addr, res)
                    self._schedule_reconnect(addr)
        if self.lookupd_http_addresses:
            self._poller = LookupdPoller(
                self.lookupd_http_addresses, self.topic, self._on_lookup,
                interval=self.lookupd_poll_interval, jitter=self.lookupd_poll_jitter,
                auth_secret=self.lookupd_auth_secret)
            found = await self._poller.poll_once()
            if found:
                await self._on_lookup(found)
            self._poller.start(polled=True)

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_max_in_flight(self, n: int) -> None:
        """Change max_in_flight (0 pauses); RDY is updated on every connection."""
        if n < 0:
            raise ValueError("max_in_flight must be >= 0")
        if n == self._max_in_flight:
            return
        self._max_in_flight = n
        for c in list(self._conns.values()):
            self._maybe_update_rdy(c)

    async def connect_to_nsqd(self, address: str) -> Connection | None:
        """Connect and SUB (no-op if already connected); an ordered topic's nsqd gets one
        SUB_ORDERED connection per partition (the first one is returned). Raises on failure."""
        if self._stopping:
            raise ClosedError("consumer closing")
        if address in self._ordered:
            return await self._connect_ordered(address)
        if address in self._conns or address in self._pending:
            return self._conns.get(address)
        try:
            return await self._open(address, None)
        except NSQError as e:
            if e.code != "E_SUB_ORDER_IS_MUST":
                raise
        log.info("[%s] topic %s is ordered: reading each partition in order (SUB_ORDERED)",
                 address, self.topic)
        if self.start_position is not None:
            log.warning("[%s] start %s is not applied to an ordered topic (SUB_ORDERED has "
                        "no position)", address, self.start_position)
        self._ordered.setdefault(address, set())
        return await self._connect_ordered(address)

    async def _connect_ordered(self, address: str) -> Connection | None:
        """SUB_ORDERED to partitions 0, 1, ... of ``address`` not connected yet, until
        E_BAD_PARTITION says there are no more."""
        if address in self._probing:
            return None
        self._probing.add(address)
        first: Connection | None = None
        try:
            k = 0
            while not self._stopping:
                slot = _slot(address, k)
                if slot in self._conns or slot in self._pending:
                    first = first or self._conns.get(slot)
                    k += 1
                    continue
                try:
                    conn = await self._open(address, k)
                except NSQError as e:
                    if e.code == "E_BAD_PARTITION":
                        self._probed.add(address)
                        break
                    if e.code != "E_FAILED_ON_NOT_LEADER":  # another node leads it: skip
                        raise
                else:
                    self._ordered[address].add(k)
                    first = first or conn
                k += 1
        finally:
            self._probing.discard(address)
        return first

    def _connected(self, address: str) -> bool:
        """Whether every subscription this consumer wants on ``address`` is open."""
        parts = self._ordered.get(address)
        if parts is None:
            return address in self._conns
        return address in self._probed and all(_slot(address, k) in self._conns
                                                for k in parts)

    async def _open(self, address: str, partition: int | None) -> Connection:
        """One connection: IDENTIFY, then SUB (``partition`` None) or SUB_ORDERED."""
        slot = _slot(address, partition)
        self._pending.add(slot)
        conn = Connection(
            address, self.config,
            on_message=self._on_message, on_response=self._on_response,
            on_error=self._on_error, on_close=self._on_close, make_message=self._make_message)
        conn.partition = partition
        try:
            resp = await conn.connect()
            if resp.get("max_rdy_count", 2500) < self._max_in_flight:
                log.warning("[%s] max_rdy_count %s < max_in_flight %d", address,
                            resp.get("max_rdy_count"), self._max_in_flight)
            if partition is not None:
                await conn.command(v2.sub_ordered(self.topic, self.channel, partition))
            elif self.start_position is None:
                await conn.command(v2.sub(self.topic, self.channel))
            else:
                await conn.command(v2.sub_advanced(self.topic, self.channel, 0,
                                                    self.start_position))
        except BaseException:
            conn.close()
            raise
        finally:
            self._pending.discard(slot)
        if self._stopping:
            conn.close()
            raise ClosedError("consumer closing")
        if conn.closing or not conn.is_open:
            raise NSQError("E_CONNECTION_CLOSED", f"{address} closed after SUB")
        conn.last_message_time = time.monotonic()
        self._conns[slot] = conn
        log.info("[%s] subscribed to %s/%s", slot, self.topic, self.channel)
        # lower the others first, then this one (go-nsq ConnectToNSQD)
        for c in list(self._conns.values()):
            if c is not conn:
                self._maybe_update_rdy(c)
        self._maybe_update_rdy(conn)
        return conn

    async def close(self, timeout: float = 30.0) -> None:
        """Graceful stop: CLS everywhere, wait up to ``timeout`` for in-flight messages to be
        answered, requeue (REQ 0) any that are not, close the connections."""
        if self._closed:
            return
        if self._stopping:  # another close() is running
            await self._closed_event.wait()
            return
        self._stopping = True
        if self._poller is not None:
            await self._poller.close()
        if self._rdy_task is not None:
            self._rdy_task.cancel()
        for h in self._rdy_retry.values():
            h.cancel()
        self._rdy_retry.clear()
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
            self._backoff_timer = None
        for c in list(self._conns.values()):
            if c.is_open and not c.closing:
                c.closing = True
                with contextlib.suppress(Exception):
                    c.send(v2.cls())
        # nsqd answers CLS with CLOSE_WAIT and sends no more messages after it; messages
        # already on the wire are still handled. Wait for CLOSE_WAIT and for every message in
        # flight to be answered (or be past its msg_timeout: then nsqd has taken it back).
        if self._drained is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    while self._draining():
                        self._drained.clear()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(0.25):
                                await self._drained.wait()
        # whatever is still unanswered goes back to the queue now, not at msg_timeout
        now = time.monotonic()
        for msg in list(self._unanswered):
            if msg._deadline > now:
                msg.requeue(0, backoff=False)
        self._closed = True
        left = [t for t in self._tasks if not t.done()]
        for t in left:
            t.cancel()
        conns = list(self._conns.values())
        for c in conns:
            c.close()
        for t in left:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for c in conns:
            await c.wait_closed()
        self._conns.clear()
        if self._rdy_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._rdy_task
        self._closed_event.set()

    def _draining(self) -> bool:
        if any(c.is_open and not c.close_wait for c in self._conns.values()):
            return True
        now = time.monotonic()
        return any(m._deadline > now for m in self._unanswered)

    # -- connection callbacks -------------------------------------------------------------
    def _make_message(self, conn: Connection, ts: int, attempts: int, mid: bytes,
                      body: bytes) -> Message:
        return Message(mid, body, ts, attempts, conn, self)

    def _on_message(self, conn: Connection, msg: Message) -> None:
        self.received += 1
        self._in_flight += 1
        self._unanswered.add(msg)
        conn.in_flight += 1
        conn.last_message_time = now = time.monotonic()
        msg._deadline = now + (conn.msg_timeout or 60.0)
        if self.max_attempts > 0 and msg.attempts > self.max_attempts:
            log.warning("[%s] msg %s attempted %d times, giving up", conn.address,
                        msg.id.decode(errors="replace"), msg.attempts)
            self.gave_up += 1
            if self.give_up is None:
                msg.finish()
            else:
                self._run(self._give_up(msg))
            return
        if self._is_async:
            self._run(self._handle_async(msg))
            return
        try:
            res = self.handler(msg)
        except Exception as e:
            self._handler_failed(msg, e)
            return
        if inspect.isawaitable(res):
            self._run(self._await_result(msg, res))
        else:
            self._handler_done(msg)

    def _run(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _give_up(self, msg: Message) -> None:
        try:
            assert self.give_up is not None
            res = self.give_up(msg)
            if inspect.isawaitable(res):
                await res
        except Exception:
            log.exception("give_up hook failed for msg %s", msg.id)
        finally:
            msg.finish()

    async def _handle_async(self, msg: Message) -> None:
        try:
            await self.handler(msg)
        except asyncio.CancelledError:
            if not msg.has_responded:
                msg.requeue(0, backoff=False)
            raise
        except Exception as e:
            self._handler_failed(msg, e)
            return
        self._handler_done(msg)

    async def _await_result(self, msg: Message, res: Awaitable[Any]) -> None:
        try:
            await res
        except asyncio.CancelledError:
            if not msg.has_responded:
                msg.requeue(0, backoff=False)
            raise
        except Exception as e:
            self._handler_failed(msg, e)
            return
        self._handler_done(msg)

    def _handler_done(self, msg: Message) -> None:
        if self.auto_finish and msg.auto_response:
            msg.finish()

    def _handler_failed(self, msg: Message, exc: BaseException) -> None:
        log.warning("handler failed for msg %s: %r", msg.id.decode(errors="replace"), exc,
                    exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)
        if self.auto_finish and msg.auto_response:
            msg.requeue(None, backoff=True)

    def _on_response(self, conn: Connection, data: bytes) -> None:
        if data == b"CLOSE_WAIT":
            log.info("[%s] CLOSE_WAIT", conn.address)
            conn.closing = True
            conn.close_wait = True
            if self._drained is not None:
                self._drained.set()

    def _on_error(self, conn: Connection, err: NSQError) -> None:
        pass  # logged by the connection; fatal ones are followed by a close

    def _on_close(self, conn: Connection, exc: BaseException | None) -> None:
        addr = conn.address
        slot = _key(conn)
        if self._conns.get(slot) is not conn:
            return
        del self._conns[slot]
        rdy = conn.rdy
        self._total_rdy -= rdy
        conn.rdy = 0
        # the messages still in flight on it are gone: nsqd will redeliver them
        if conn.in_flight:
            self._in_flight -= conn.in_flight
            conn.in_flight = 0
            self._unanswered.difference_update(
                [m for m in self._unanswered if m.connection is conn])
        if self._drained is not None:
            self._drained.set()
        h = self._rdy_retry.pop(slot, None)
        if h is not None:
            h.cancel()
        left = len(self._conns)
        if (h is not None or rdy > 0) and (left == self._max_in_flight or self._in_backoff()):
            self._need_redistribute = True
        if self._stopping:
            return
        log.warning("[%s] connection closed (%d left)", slot, left)
        if conn.partition is not None:
            # leadership may have moved: the next lookup tries every partition again
            self._probed.clear()
        if self._poller is not None:
            self._poller.trigger()
        if addr in self.nsqd_tcp_addresses:
            self._schedule_reconnect(addr)

    def _schedule_reconnect(self, addr: str) -> None:
        if addr not in self._reconnecting:
            self._reconnecting.add(addr)
            self._run(self._reconnect(addr))

    async def _reconnect(self, addr: str) -> None:
        delay = min(0.25, self.reconnect_interval)
        try:
            while not self._stopping and not self._connected(addr):
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                if self._stopping or self._connected(addr) or addr in self._pending:
                    return
                try:
                    await self.connect_to_nsqd(addr)
                except Exception as e:
                    log.warning("[%s] reconnect failed: %r", addr, e)
                    delay = min(delay * 2, self.reconnect_interval)
        finally:
            self._reconnecting.discard(addr)

    async def _on_lookup(self, found: set[str]) -> None:
        new = [a for a in found if not self._connected(a) and a not in self._pending]
        if not new or self._stopping:
            return
        results = await asyncio.gather(*(self.connect_to_nsqd(a) for a in new),
                                       return_exceptions=True)
        for addr, res in zip(new, results, strict=True):
            if isinstance(res, BaseException):
                log.warning("[%s] connect (from lookupd) failed: %r", addr, res)

    # -- responses from messages ----------------------------------------------------------
    def _responded(self, msg: Message) -> Connection | None:
        conn = msg.connection
        if conn is None:
            return None
        if conn.in_flight > 0 and self._conns.get(_key(conn)) is conn:
            conn.in_flight -= 1
            self._in_flight -= 1
            self._unanswered.discard(msg)
            self._check_drained()
        if not conn.is_open:
            return None
        return conn

    def _check_drained(self) -> None:
        if self._in_flight <= 0 and self._drained is not None:
            self._in_flight = max(self._in_flight, 0)
            self._drained.set()

    def _msg_finish(self, msg: Message) -> None:
        self.finished += 1
        conn = self._responded(msg)
        if conn is not None:
            conn.send(v2.fin(msg.id))
        self._backoff_signal(conn, "resume")

    def _msg_requeue(self, msg: Message, delay: float | None, backoff: bool) -> None:
        self.requeued += 1
        if delay is None:
            delay = min(self.requeue_delay * msg.attempts, self.max_requeue_delay)
        conn = self._responded(msg)
        if conn is not None:
            conn.send(v2.req(msg.id, max(0, round(delay * 1000))))
        self._backoff_signal(conn, "backoff" if backoff else "continue")

    def _msg_touch(self, msg: Message) -> None:
        conn = msg.connection
        if conn is not None and conn.is_open:
            conn.send(v2.touch(msg.id))
            msg._deadline = time.monotonic() + (conn.msg_timeout or 60.0)

    # -- RDY ------------------------------------------------------------------------------
    def _per_conn_max_in_flight(self) -> int:
        n = len(self._conns)
        m = self._max_in_flight
        if n == 0:
            return m
        return min(max(1, m // n), m)

    def _in_backoff(self) -> bool:
        return self._backoff_level > 0

    def _in_backoff_timeout(self) -> bool:
        return self._backoff_timer is not None

    def _maybe_update_rdy(self, conn: Connection) -> None:
        if self._in_backoff() or self._in_backoff_timeout():
            return
        self._update_rdy(conn, self._per_conn_max_in_flight())

    def _update_rdy(self, conn: Connection, count: int) -> bool:
        if conn.closing or not conn.is_open or self._stopping:
            return False
        count = min(count, conn.max_rdy_count)
        h = self._rdy_retry.pop(_key(conn), None)
        if h is not None:
            h.cancel()
        # never exceed max_in_flight in total (truncate if possible)
        max_possible = self._max_in_flight - self._total_rdy + conn.rdy
        if 0 < max_possible < count:
            count = max_possible
        if max_possible <= 0 and count > 0:
            if conn.rdy == 0:
                # could not leave RDY 0: retry later so this conn does not starve
                self._rdy_retry[_key(conn)] = asyncio.get_running_loop().call_later(
                    self.rdy_retry_interval, self._rdy_retry_fire, conn, count)
            return False
        self._send_rdy(conn, count)
        return True

    def _rdy_retry_fire(self, conn: Connection, count: int) -> None:
        self._rdy_retry.pop(_key(conn), None)
        self._update_rdy(conn, count)

    def _send_rdy(self, conn: Connection, count: int) -> None:
        if count == conn.rdy:
            return
        self._total_rdy += count - conn.rdy
        conn.rdy = count
        conn.last_rdy_time = time.monotonic()
        conn.send(v2.rdy(count))

    async def _rdy_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rdy_redistribute_interval)
            try:
                self._redistribute_rdy()
            except Exception:
                log.exception("RDY redistribution failed")

    def _redistribute_rdy(self) -> None:
        if self._in_backoff_timeout() or self._stopping:
            return
        conns = [c for c in self._conns.values() if c.is_open and not c.closing]
        if not conns:
            return
        if len(conns) > self._max_in_flight:
            self._need_redistribute = True
        if self._in_backoff() and len(conns) > 1:
            self._need_redistribute = True
        if not self._need_redistribute:
            return
        self._need_redistribute = False
        now = time.monotonic()
        for c in conns:
            if c.rdy > 0 and (now - c.last_message_time > self.low_rdy_idle_timeout
                              or now - c.last_rdy_time > self.low_rdy_timeout):
                log.debug("[%s] idle or RDY timeout, giving up RDY", c.address)
                self._update_rdy(c, 0)
        available = self._max_in_flight - self._total_rdy
        if self._in_backoff():
            available = 1 - self._total_rdy
        possible = list(conns)
        while possible and available > 0:
            available -= 1
            c = possible.pop(random.randrange(len(possible)))
            self._update_rdy(c, 1)

    # -- backoff --------------------------------------------------------------------------
    def _backoff_duration(self, level: int) -> float:
        return self.backoff_multiplier * (2 ** level)

    def _backoff_signal(self, conn: Connection | None, signal: str) -> None:
        if self._stopping or self._in_backoff_timeout():
            return
        updated = False
        level = self._backoff_level
        if signal == "resume":
            if level > 0:
                level -= 1
                updated = True
        elif (signal == "backoff"
              and self._backoff_duration(level + 1) <= self.max_backoff_duration):
            level += 1
            updated = True
        self._backoff_level = level
        if level == 0 and updated:
            count = self._per_conn_max_in_flight()
            log.warning("exiting backoff, returning all to RDY %d", count)
            for c in list(self._conns.values()):
                self._update_rdy(c, count)
        elif level > 0:
            duration = min(self._backoff_duration(level), self.max_backoff_duration)
            log.warning("backing off for %.2fs (level %d), RDY 0 everywhere", duration, level)
            for c in list(self._conns.values()):
                self._update_rdy(c, 0)
            self._backoff_timer = asyncio.get_running_loop().call_later(duration, self._resume)

    def _resume(self) -> None:
        self._backoff_timer = None
        if self._stopping:
            return
        conns = [c for c in self._conns.values() if c.is_open and not c.closing]
        if not conns:
            log.warning("no connection to resume on; backing off 1s")
            self._backoff_timer = asyncio.get_running_loop().call_later(1.0, self._resume)
            return
        choice = random.choice(conns)
        log.warning("[%s] backoff timeout expired, sending RDY 1", choice.address)
        # while in backoff only one message at a time
        self._update_rdy(choice, 1)


def _slot(address: str, partition: int | None) -> str:
    """A subscription's key: the address for a plain SUB, ``address/p<k>`` for a partition."""
    return address if partition is None else f"{address}/p{partition}"


def _key(conn: Connection) -> str:
    return _slot(conn.address, conn.partition)
