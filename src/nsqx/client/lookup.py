"""nsqlookupd polling: which nsqd nodes have a topic.

``GET <lookupd>/lookup?topic=T`` with ``Accept: application/vnd.nsq; version=1.0`` (go-nsq);
an address is ``host:port`` or a full URL (path defaults to ``/lookup``, its query params are
kept, e.g. for an auth proxy). The answer is ``{"channels": [...], "producers": [...]}`` (or
the pre-1.0 ``{"status_code":200,"data":{...}}`` wrapping); a producer is reached at
``broadcast_address:tcp_port`` (legacy ``address`` accepted). 404 (topic not registered yet)
means no producers. Every lookupd is queried each round and the answers are merged.

Polling: go-nsq queries at once, then every interval after a random jitter; a topic that is
not registered yet is then found a minute or more later. Here a round that finds no producer
is retried soon (1 s, doubling up to the interval, each +-20 %), and the interval (with the
jitter before the first) applies once producers are known. Each lookupd's answer is logged
when it first comes and when it changes (no producer yet: a warning), never every round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import orjson

__all__ = ["LookupdPoller", "lookup", "lookup_url", "producers_from_response"]

FIRST_RETRY = 1.0  # seconds before the first retry of a round that found no producer

log = logging.getLogger("nsqx.client")

ACCEPT = "application/vnd.nsq; version=1.0"


def lookup_url(address: str, topic: str) -> str:
    """The ``/lookup`` URL for ``topic`` on a lookupd given as host:port or URL."""
    if "://" not in address:
        address = "http://" + address
    parts = urlsplit(address)
    path = parts.path if parts.path not in ("", "/") else "/lookup"
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "topic"]
    query.append(("topic", topic))
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), ""))


def producers_from_response(data: Any) -> list[str]:
    """nsqd TCP addresses (``host:port``) from a ``/lookup`` JSON answer."""
    if isinstance(data, dict) and "producers" not in data and isinstance(data.get("data"), dict):
        data = data["data"]
    out = []
    for p in (data or {}).get("producers") or []:
        host = p.get("broadcast_address") or p.get("address") or p.get("hostname")
        port = p.get("tcp_port")
        if host and port:
            host = f"[{host}]" if ":" in host else host
            out.append(f"{host}:{port}")
    return out


async def lookup(session: aiohttp.ClientSession, address: str, topic: str, *,
                 timeout: float = 5.0, auth_secret: str | None = None) -> list[str]:
    """Producers of ``topic`` on one lookupd. 404 -> []; other failures raise."""
    headers = {"Accept": ACCEPT}
    if auth_secret:
        headers["Authorization"] = f"Bearer {auth_secret}"
    url = lookup_url(address, topic)
    async with session.get(url, headers=headers,
                           timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        body = await resp.read()
        if resp.status == 404:
            return []
        if resp.status != 200:
            raise aiohttp.ClientResponseError(
                resp.request_info, (), status=resp.status, message=body[:200].decode("utf-8", "replace"))
    return producers_from_response(orjson.loads(body))


class LookupdPoller:
    """Polls every lookupd each ``interval`` (first poll at once, the next after a random
    ``jitter`` fraction of the interval); calls ``on_producers(set_of_addresses)`` after each
    round in which at least one lookupd answered. ``trigger()`` asks for a poll now."""

    def __init__(
        self,
        addresses: Sequence[str],
        topic: str,
        on_producers: Callable[[set[str]], Any],
        *,
        interval: float = 60.0,
        jitter: float = 0.3,
        timeout: float = 5.0,
        auth_secret: str | None = None,
    ) -> None:
        self.addresses = list(addresses)
        self.topic = topic
        self.on_producers = on_producers
        self.interval = interval
        self.jitter = jitter
        self.timeout = timeout
        self.auth_secret = auth_secret
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._answers: dict[str, tuple[str, ...] | None] = {}  # last logged, per lookupd
        self.found: set[str] | None = None  # the last round's producers (None: no answer)

    async def poll_once(self) -> set[str] | None:
        """Query all lookupds; the union of producers, or None if none answered."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        results = await asyncio.gather(
            *(lookup(self._session, a, self.topic, timeout=self.timeout,
                     auth_secret=self.auth_secret) for a in self.addresses),
            return_exceptions=True)
        found: set[str] = set()
        ok = False
        for addr, res in zip(self.addresses, results, strict=True):
            if isinstance(res, BaseException):
                log.warning("lookupd %s query for topic %s failed: %r", addr, self.topic, res)
                self._answers[addr] = None
                continue
            ok = True
            found.update(res)
            self._log_answer(addr, tuple(sorted(res)))
        self.found = found if ok else None
        return self.found

    def _log_answer(self, addr: str, producers: tuple[str, ...]) -> None:
        """Tell the first answer of a lookupd and every change, not each round's."""
        if addr in self._answers and self._answers[addr] == producers:
            return
        self._answers[addr] = producers
        if producers:
            log.info("lookupd %s: topic %s is on %s", addr, self.topic, ", ".join(producers))
        else:
            log.warning("lookupd %s: no nsqd has topic %s yet; asking again soon", addr,
                        self.topic)

    def next_wait(self, retry: float | None) -> tuple[float, float | None]:
        """(seconds until the next round, the retry delay after it): soon and doubling while
        the last round found no producer, else the interval."""
        if self.found:
            return self.interval, None
        delay = min(self.interval, FIRST_RETRY if retry is None else retry)
        return delay * random.uniform(0.8, 1.2), min(self.interval, delay * 2)

    def start(self, *, polled: bool = False) -> None:
        """Start polling; ``polled=True``: the caller just ran :meth:`poll_once`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(polled), name=f"nsqx-lookupd-{self.topic}")

    def trigger(self) -> None:
        self._wake.set()

    async def _run(self, polled: bool) -> None:
        first = True
        retry: float | None = None
        while True:
            self._wake.clear()
            if not polled:
                try:
                    found = await self.poll_once()
                except Exception:
                    log.exception("lookupd poll failed")
                    found = None
                if found is not None:
                    res = self.on_producers(found)
                    if asyncio.iscoroutine(res):
                        await res
            polled = False
            wait, retry = self.next_wait(retry)
            if first and retry is None:
                wait = self.interval * random.random() * self.jitter + self.interval
                first = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
