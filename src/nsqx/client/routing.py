"""Where a producer learns route-managed topics' routes (:mod:`nsqx.protocol.routes`).

:class:`RouteSource` is what :class:`~nsqx.client.Producer` asks; :class:`HttpRouteSource`
reads ``GET /topic/route?topic=T`` from a standalone nsqd or, in a cluster, from nsqlookupd
(whose answer also names each partition's leader).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence
from typing import Any, Protocol

import aiohttp
import orjson

from nsqx.protocol.routes import RouteHistory

__all__ = ["HttpRouteSource", "RouteSource", "refused_version"]

_REFUSED = re.compile(r"\broute version (\d+)\b")
# a route fetch that failed or found an older version is tried again after this (doubling
# up to RETRY_MAX on failures), until the publish's wait_timeout
RETRY_MIN = 0.02
RETRY_MAX = 0.5


def refused_version(text: str) -> int | None:
    """The N of an ``E_BAD_PARTITION route version N ...`` refusal (None if not one)."""
    m = _REFUSED.search(text)
    return int(m.group(1)) if m else None


class RouteSource(Protocol):
    """Where a producer learns a route-managed topic's routes (``Producer(route_source=)``)."""

    async def fetch(self, topic: str) -> RouteHistory | None:
        """The topic's route history, None if the topic is not route-managed (or unknown)."""

    def leader(self, topic: str, partition: int) -> str | None:
        """The TCP address of the partition's leader when known (cluster mode), else None:
        the publish then goes to any connection."""

    async def close(self) -> None:
        """Release what the source holds (sessions); called by ``Producer.close``."""


class HttpRouteSource:
    """``GET http://<nsqd http>/topic/route?topic=T`` on one of the given addresses.

    nsqlookupd in cluster mode answers the same call with ``leaders`` added (partition ->
    leader TCP address): :meth:`leader` then tells the producer where to send a keyed
    publish (a cluster partition takes publishes on its leader only)."""

    def __init__(self, http_addresses: str | Sequence[str], *, timeout: float = 5.0) -> None:
        if isinstance(http_addresses, str):
            http_addresses = [http_addresses]
        if not http_addresses:
            raise ValueError("at least one nsqd HTTP address is needed")
        self.addresses = list(http_addresses)
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self.leaders: dict[str, dict[int, str]] = {}

    def leader(self, topic: str, partition: int) -> str | None:
        """The TCP address of the partition's leader, if the last answer named one."""
        return self.leaders.get(topic, {}).get(partition)

    async def fetch(self, topic: str) -> RouteHistory | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout))
        errors: list[str] = []
        for addr in random.sample(self.addresses, len(self.addresses)):
            url = (addr if "://" in addr else "http://" + addr) + "/topic/route"
            try:
                async with self._session.get(url, params={"topic": topic}) as r:
                    body = await r.read()
                    if r.status in (400, 404):
                        return None
                    if r.status != 200:
                        errors.append(f"{addr}: HTTP {r.status}")
                        continue
                    h = RouteHistory.from_json(body)
                    leaders = orjson.loads(body).get("leaders")
                    if isinstance(leaders, dict):
                        self.leaders[topic] = {int(p): str(a) for p, a in leaders.items()}
                    return h
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                errors.append(f"{addr}: {exc!r}")
        raise ConnectionError(f"no route for topic {topic}: {'; '.join(errors)}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class RouteCache:
    """A producer's newest known routes, refreshed (one fetch at a time per topic) when nsqd
    refuses a publish with ``route version N``."""

    def __init__(self, source: Any, wait_timeout: float) -> None:
        self.source = source
        self.wait_timeout = wait_timeout
        self._routes: dict[str, RouteHistory | None] = {}
        self._fetching: dict[str, asyncio.Future[RouteHistory | None]] = {}

    def invalidate(self, topic: str) -> None:
        """Forget the cached route (and leaders): the next get() fetches it again."""
        self._routes.pop(topic, None)

    async def get(self, topic: str, min_version: int = -1) -> RouteHistory | None:
        """The cached route, fetched if missing or older than ``min_version`` (polling until
        nsqd committed that version, up to ``wait_timeout``).

        A fetch that cannot reach the route endpoint (``ConnectionError``: nsqd restarting,
        its HTTP port not yet open) is retried until ``wait_timeout`` too, as a keyless
        publish waits for a connection; only then is the last error raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_timeout
        backoff = RETRY_MIN
        while True:
            if topic in self._routes and _enough(self._routes[topic], min_version):
                return self._routes[topic]
            try:
                await self._fetch_once(topic)
            except ConnectionError:
                left = deadline - loop.time()
                if left <= 0:
                    raise
                await asyncio.sleep(min(backoff, left))
                backoff = min(backoff * 2, RETRY_MAX)
                continue
            if _enough(self._routes.get(topic), min_version):
                return self._routes.get(topic)
            if loop.time() >= deadline:
                raise TimeoutError(f"topic {topic}: route version {min_version} not committed "
                                   f"within {self.wait_timeout}s")
            await asyncio.sleep(RETRY_MIN)

    async def _fetch_once(self, topic: str) -> None:
        """One fetch of the topic's route, shared by every caller waiting at the same time;
        an older answer never replaces a newer cached one."""
        fut = self._fetching.get(topic)
        if fut is not None:
            await asyncio.shield(fut)
            return
        fut = asyncio.get_running_loop().create_future()
        self._fetching[topic] = fut
        try:
            h = await self.source.fetch(topic)
            old = self._routes.get(topic)
            if h is None or old is None or h.newest.version >= old.newest.version:
                self._routes[topic] = h
            fut.set_result(h)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._fetching[topic]


def _enough(h: RouteHistory | None, min_version: int) -> bool:
    return min_version < 0 if h is None else h.newest.version >= min_version
