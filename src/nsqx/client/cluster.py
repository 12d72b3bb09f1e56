"""ClusterProducer: publish straight to each partition's leader, found through nsqlookupd.

A stock producer may publish to any node of a cluster (a node that does not lead the
partition forwards it, one more hop). This one asks lookupd (``/lookup?topic=T&access=w
&metainfo=true``) for the topic's partition count and each partition's leader and epoch,
sends ``PUB <topic> <partition>`` to that leader over one :class:`Producer` per node, and
when a publish fails because leadership moved (a refusal, a closed connection, no
connection) it looks the topic up again and retries on the new leader. A key picks the
partition with :func:`~nsqx.client.producer.key_partition` over the topic's own partition
count, so every message of a key lands in one partition, in order.

Idempotent by default (``idempotent=False`` opts out): each (topic, partition) is a
sequence stream of its own (:mod:`nsqx.client.idempotent`), and the partition's replicated
log carries the sequences, so a publish whose connection closed before its answer, sent
again to the same or to a new leader, is stored once. Not idempotent, such a retry is
at-least-once, as :class:`Producer`'s own retries are.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from nsqx.protocol import v2

from .errors import ConnectionClosedError, NoConnectionsError, NSQError
from .idempotent import RETRY_CODES as IDEMPOTENT_RETRY_CODES
from .idempotent import Sequences, ext_headers, mark_command
from .lookup import ACCEPT, lookup_url
from .producer import GAP_WAIT, Producer, _check_topic, key_partition

__all__ = ["ClusterProducer", "PartitionLeader", "TopicLayout"]

log = logging.getLogger("nsqx.client")

# what a leader answers while leadership moves: look up again and retry
RETRY_CODES = frozenset({"E_FAILED_ON_NOT_LEADER", "E_PUB_FAILED", "E_MPUB_FAILED",
                         "E_DPUB_FAILED"})


@dataclass(frozen=True)
class PartitionLeader:
    partition: int
    address: str  # host:port of the leader's TCP API
    epoch: int | None  # the leader epoch lookupd reported (None: not reported)


@dataclass(frozen=True)
class TopicLayout:
    topic: str
    partitions: int  # the topic's partition count (keys hash over it)
    ordered: bool
    leaders: dict[int, PartitionLeader]  # partitions with a live leader now
    fetched_at: float


def layout_from_lookup(topic: str, data: Any) -> TopicLayout:
    """Parse lookupd's cluster ``/lookup`` answer (``partitions`` + ``meta``)."""
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict):
        raise ValueError(f"topic {topic} is not a cluster topic (lookupd gave no metainfo)")
    meta = data["meta"]
    count = int(meta.get("partition_num", 1))
    leaders: dict[int, PartitionLeader] = {}
    for key, peer in (data.get("partitions") or {}).items():
        host = peer.get("broadcast_address") or peer.get("hostname")
        port = peer.get("tcp_port")
        if not host or not port:
            continue
        host = f"[{host}]" if ":" in host else host
        epoch = peer.get("epoch")
        leaders[int(key)] = PartitionLeader(int(key), f"{host}:{port}",
                                            None if epoch is None else int(epoch))
    return TopicLayout(topic, count, bool(meta.get("ordered")), leaders, time.monotonic())


class ClusterProducer:
    """``async with ClusterProducer(["127.0.0.1:4161"]) as p: await p.publish("t", b"x", key="k")``.

    ``lookupd_http_addresses``: nsqlookupd HTTP addresses of the cluster (any of them
    answers). A layout is looked up on first use of a topic and again after ``max_age``
    seconds or a failure; a publish is retried on the new leader until ``wait_timeout``
    (its publish timeout). Other keyword arguments go to each node's :class:`Producer`
    (``tls``, ``auth_secret``...).
    """

    def __init__(self, lookupd_http_addresses: str | Sequence[str], *,
                 wait_timeout: float = 10.0, max_age: float = 30.0,
                 http_timeout: float = 5.0, idempotent: bool = True,
                 **producer_options: Any) -> None:
        if isinstance(lookupd_http_addresses, str):
            lookupd_http_addresses = [lookupd_http_addresses]
        if not lookupd_http_addresses:
            raise ValueError("at least one nsqlookupd HTTP address is needed")
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        self.wait_timeout = wait_timeout
        self.max_age = max_age
        self.http_timeout = http_timeout
        self.producer_options = producer_options
        self.idempotent = idempotent
        self._seqs = Sequences()
        self._layouts: dict[str, TopicLayout] = {}
        self._producers: dict[str, Producer] = {}
        self._rr = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self.lookups = 0  # layouts fetched (first use, age, or after a failed publish)
        self.retries = 0  # publishes sent again after leadership moved

    async def __aenter__(self) -> ClusterProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        producers = list(self._producers.values())
        self._producers.clear()
        for p in producers:
            with contextlib.suppress(Exception):
                await p.close()
        if self._session is not None:
            await self._session.close()

    # -- layout -------------------------------------------------------------------------
    async def layout(self, topic: str, *, refresh: bool = False) -> TopicLayout:
        """The topic's partitions and their leaders (cached up to ``max_age`` seconds)."""
        cached = self._layouts.get(topic)
        if cached is not None and not refresh and \
                time.monotonic() - cached.fetched_at < self.max_age:
            return cached
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.http_timeout))
        errors: list[str] = []
        for addr in random.sample(self.lookupd_http_addresses, len(self.lookupd_http_addresses)):
            url = lookup_url(addr, topic)
            try:
                async with self._session.get(url, params={"access": "w", "metainfo": "true"},
                                             headers={"Accept": ACCEPT}) as r:
                    body = await r.read()
                    if r.status != 200:
                        errors.append(f"{addr}: HTTP {r.status} {body[:100]!r}")
                        continue
                    layout = layout_from_lookup(topic, orjson.loads(body))
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
                errors.append(f"{addr}: {e}")
                continue
            self.lookups += 1
            self._layouts[topic] = layout
            return layout
        raise NoConnectionsError(f"no nsqlookupd answered for topic {topic}: "
                                 + "; ".join(errors))

    def _producer(self, address: str) -> Producer:
        p = self._producers.get(address)
        if p is None:
            p = self._producers[address] = Producer(
                address, wait_timeout=min(self.wait_timeout, 5.0), retries=0,
                idempotent=False, **self.producer_options)  # the sequences are kept here
        return p

    # -- publishing ---------------------------------------------------------------------
    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      key: bytes | str | None = None, headers: Mapping[str, bytes | str] | None = None,
                      tag: str | None = None, trace_id: int | None = None) -> int:
        """PUB one message to its partition's leader; returns the partition used.
        ``headers``, ``tag``, ``trace_id`` as :meth:`Producer.publish` (the traced answer
        is not returned here: the partition is)."""
        _check_topic(topic)
        hdrs = ext_headers(headers, tag, trace_id)
        part, _ = await self._send(topic, partition, key, lambda part, mark: mark_command(
            topic, [body], part, hdrs, mark, False), idempotent=self.idempotent)
        return part

    async def mpublish(self, topic: str, bodies: Iterable[bytes], *,
                       partition: int | None = None, key: bytes | str | None = None,
                       headers: Mapping[str, bytes | str] | None = None,
                       tag: str | None = None) -> int:
        """MPUB (all or none) to one partition's leader; returns the partition used."""
        _check_topic(topic)
        bodies = list(bodies)
        if not bodies:
            raise ValueError("mpublish needs at least one message")
        hdrs = ext_headers(headers, tag, None)
        part, _ = await self._send(topic, partition, key, lambda part, mark: mark_command(
            topic, bodies, part, hdrs, mark, True), idempotent=self.idempotent)
        return part

    async def dpublish(self, topic: str, delay: float, body: bytes, *,
                       partition: int | None = None, key: bytes | str | None = None) -> int:
        """Deliver after ``delay`` seconds; returns the partition used.

        Idempotent (the default): ``PUB_EXT`` to a partition's leader (``partition``,
        ``key`` or the next live one, as :meth:`publish`) with the producer's mark and the
        delay as the ``##nsqx_defer`` header, retried through failovers and stored once.
        ``idempotent=False``: plain ``DPUB`` to a leader of the topic (it names no
        partition: that leader picks one of those it leads), at least once."""
        _check_topic(topic)
        if delay < 0:
            raise ValueError("delay must be >= 0")
        ms = round(delay * 1000)
        if self.idempotent:
            hdrs = {v2.DEFER_KEY: b"%d" % ms}
            part, _ = await self._send(topic, partition, key, lambda part, mark: mark_command(
                topic, [body], part, hdrs, mark, False), idempotent=True)
            return part
        if partition is not None or key is not None:
            raise ValueError("a partition or a key needs an idempotent producer (DPUB "
                             "names no partition)")
        part, _ = await self._send(topic, None, None, lambda _part, _mark: v2.dpub(
            topic, ms, body), idempotent=False)
        return part

    async def _send(self, topic: str, partition: int | None, key: bytes | str | None,
                    build: Callable[[int, bytes | None], bytes], *,
                    idempotent: bool) -> tuple[int, bytes]:
        """(partition, answer). An idempotent publish takes its sequence when first sent and
        keeps it (and its partition) through every retry, to whichever node leads then."""
        if partition is not None and key is not None:
            raise ValueError("give a partition or a key, not both")
        deadline = time.monotonic() + self.wait_timeout
        refresh = False
        mark: bytes | None = None
        chosen: int | None = None
        gap_since: float | None = None
        while True:
            layout = await self.layout(topic, refresh=refresh)
            part = chosen if chosen is not None else self._pick(layout, partition, key)
            leader = layout.leaders.get(part)
            error: Exception
            if leader is None:
                error = NoConnectionsError(f"TOPIC({topic}) PARTITION({part}) has no leader now")
            else:
                def command(part: int = part) -> bytes:
                    # the sequence is taken when first written: in order on the connection
                    nonlocal mark, chosen
                    if idempotent and mark is None:
                        chosen, mark = part, self._seqs.next((topic, part))
                    return build(part, mark)
                try:
                    return part, await self._producer(leader.address)._send(command)
                except (ConnectionClosedError, NoConnectionsError, OSError) as e:
                    error = e  # (subclasses of NSQError: caught first)
                except NSQError as e:
                    if e.code not in RETRY_CODES and (
                            mark is None or e.code not in IDEMPOTENT_RETRY_CODES):
                        if mark is not None:  # refused, so not stored: a new epoch next
                            self._seqs.give_up((topic, part), mark)
                        raise
                    error = e
                    if mark is not None and e.code == "E_OUT_OF_ORDER_SEQUENCE":
                        gap_since = gap_since or time.monotonic()
                        if time.monotonic() - gap_since >= GAP_WAIT:
                            # refused, so not stored; the missing sequence is not coming
                            self._seqs.give_up((topic, part), mark)
                            mark, gap_since = None, None
            if time.monotonic() >= deadline:
                if mark is not None:  # outcome unknown: the stream goes on in a new epoch
                    self._seqs.give_up((topic, part), mark)
                raise error
            log.info("TOPIC(%s) PARTITION(%d): %s; looking up the leader again", topic, part,
                     error)
            self.retries += 1
            gap = isinstance(error, NSQError) and error.code == "E_OUT_OF_ORDER_SEQUENCE"
            refresh = not gap  # an earlier sequence is being sent again: wait for it
            await asyncio.sleep(0.05 if gap else 0.1)

    def _pick(self, layout: TopicLayout, partition: int | None, key: bytes | str | None) -> int:
        if key is not None:
            return key_partition(key, layout.partitions)
        if partition is not None:
            if not 0 <= partition < layout.partitions:
                raise ValueError(f"partition {partition} of topic {layout.topic} does not "
                                 f"exist ({layout.partitions} partitions)")
            return partition
        if layout.ordered:
            raise ValueError(f"topic {layout.topic} is ordered: give a partition or a key")
        live = sorted(layout.leaders) or list(range(layout.partitions))
        return live[next(self._rr) % len(live)]
