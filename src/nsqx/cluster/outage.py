"""Waiting out an unreachable etcd: capped exponential backoff and one log line per change
of state (issue 28). A loop that retried every 0.5 s and logged each retry filled the log
for as long as etcd was down and hammered it when it came back."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

__all__ = ["Outage"]


class Outage:
    """The state of one retry loop against etcd.

    ``await failed(exc)`` after an attempt failed: logs "lost" on the first failure and
    "still down" once per ``remind`` seconds, then sleeps the next delay (``first``,
    doubled each time, at most ``cap``). ``ok()`` after an attempt worked: logs "back"
    when there was an outage, and the next one starts from ``first`` again."""

    def __init__(self, what: str, log: logging.Logger, *, first: float = 0.25,
                 cap: float = 5.0, remind: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.log = log
        self.first = first
        self.cap = cap
        self.remind = remind
        self.clock = clock
        self.delay = first
        self.since: float | None = None  # when the outage began; None: none now
        self._reminded = 0.0
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def next_delay(self) -> float:
        """The sleep after this failure; the one after it doubles, up to ``cap``."""
        delay = self.delay
        self.delay = min(self.cap, self.delay * 2)
        return delay

    async def failed(self, exc: BaseException) -> None:
        now = self.clock()
        self.failures += 1
        if self.since is None:
            self.since = self._reminded = now
            self.log.warning("%s: etcd unreachable (%s); retrying with backoff up to %g s",
                             self.what, exc, self.cap)
        elif now - self._reminded >= self.remind:
            self._reminded = now
            self.log.warning("%s: etcd still unreachable after %.0f s, %d attempts (%s)",
                             self.what, now - self.since, self.failures, exc)
        await asyncio.sleep(self.next_delay())

    def ok(self) -> None:
        if self.since is not None:
            self.log.info("%s: etcd reachable again after %.1f s", self.what,
                          self.clock() - self.since)
        self.since = None
        self.failures = 0
        self.delay = self.first
