"""Built-in graphs without Graphite: sample every nsqd's ``/stats`` on a timer and keep
the numbers in a ring buffer (``--stats-sample-window`` of history at
``--stats-sample-interval`` resolution).

One ring of sample times; per (node, topic[, channel], metric) one ``array('d')`` of the
same length, NaN where the series had no value at that sample (node down, topic not yet
there). Rates are derived from the ``message_count`` counters at read time (a counter that
goes backwards -- a restarted node -- gives a gap, not a negative rate).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from array import array
from collections.abc import Callable
from typing import Any

from .cluster import ClusterClient, UpstreamError, http_address

__all__ = ["CHANNEL_METRICS", "TOPIC_METRICS", "Sampler"]

log = logging.getLogger("nsqx.admin")

NAN = float("nan")
TOPIC_METRICS = ("depth", "message_count")
CHANNEL_METRICS = ("depth", "in_flight_count", "deferred_count", "requeue_count",
                   "timeout_count", "message_count", "client_count")
DERIVED = {"rate": "message_count"}

Key = tuple[str, ...]


class Sampler:
    def __init__(self, cluster: ClusterClient, interval: float, window: float, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.interval = interval
        self.capacity = max(3, int(window / interval) + 1) if interval > 0 else 3
        self.clock = clock
        self.times = array("d", [NAN]) * self.capacity
        self.head = 0  # slot of the next sample
        self.samples = 0
        # (kind, node, topic[, channel]) -> {metric: array}
        self.series: dict[Key, dict[str, array]] = {}
        self._last_seen: dict[Key, int] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sampler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stats sampler: sample failed")
            next_at += self.interval
            delay = next_at - loop.time()
            if delay < 0:  # we fell behind (slow nodes): skip, never burst
                next_at = loop.time() + self.interval
                delay = self.interval
            await asyncio.sleep(delay)

    # -- writing --------------------------------------------------------------------------
    async def sample_once(self) -> None:
        try:
            producers, _ = await self.cluster.producers()
            stats, _ = await self.cluster.nsqd_stats(producers, include_clients=False)
        except UpstreamError as e:
            log.debug("stats sampler: %s", e)
            stats = []
        self.record(stats, self.clock())

    def record(self, stats: list[tuple[dict[str, Any], dict[str, Any]]], now: float) -> None:
        """One sample: [(producer, /stats JSON)] at time ``now``."""
        slot = self.head
        self.times[slot] = now
        for metrics in self.series.values():
            for arr in metrics.values():
                arr[slot] = NAN
        n = self.samples
        for producer, st in stats:
            node = http_address(producer)
            for t in st.get("topics") or []:
                tname = t.get("topic_name", "")
                self._put(("t", node, tname), TOPIC_METRICS, t, slot, n)
                for c in t.get("channels") or []:
                    self._put(("c", node, tname, c.get("channel_name", "")), CHANNEL_METRICS,
                              c, slot, n)
        self.head = (slot + 1) % self.capacity
        self.samples += 1
        # forget series not seen for a whole window
        stale = [k for k, seen in self._last_seen.items() if n - seen >= self.capacity]
        for k in stale:
            del self._last_seen[k]
            self.series.pop(k, None)

    def _put(self, key: Key, metrics: tuple[str, ...], src: dict[str, Any], slot: int, n: int
             ) -> None:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = {m: array("d", [NAN]) * self.capacity for m in metrics}
        for m in metrics:
            v = src.get(m)
            s[m][slot] = float(v) if isinstance(v, int | float) else NAN
        self._last_seen[key] = n

    # -- reading --------------------------------------------------------------------------
    def _order(self) -> list[int]:
        """Slot indexes from oldest to newest sample."""
        if self.samples < self.capacity:
            return list(range(self.samples))
        return [(self.head + i) % self.capacity for i in range(self.capacity)]

    def _values(self, arr: array, order: list[int], metric: str) -> list[float]:
        if metric not in DERIVED:
            return [arr[i] for i in order]
        out = [NAN]
        for a, b in zip(order, order[1:], strict=False):
            dt = self.times[b] - self.times[a]
            d = arr[b] - arr[a]
            out.append(d / dt if dt > 0 and d >= 0 else NAN)
        return out

    def query(self, topic: str, channel: str | None = None,
              metrics: tuple[str, ...] = ("rate", "depth")) -> dict[str, Any]:
        """Time series of a topic (or channel): per node and the sum over nodes ("*")."""
        order = self._order()
        kind = "c" if channel is not None else "t"
        keys = [k for k in self.series
                if k[0] == kind and k[2] == topic and (channel is None or k[3] == channel)]
        out: dict[str, Any] = {"interval": self.interval, "window": self.capacity * self.interval,
                               "timestamps": [self.times[i] for i in order], "series": {}}
        for metric in metrics:
            src = DERIVED.get(metric, metric)
            per_node: dict[str, list[float]] = {}
            for k in sorted(keys):
                arr = self.series[k].get(src)
                if arr is not None:
                    per_node[k[1]] = self._values(arr, order, metric)
            total = []
            for i in range(len(order)):
                vals = [v[i] for v in per_node.values() if not math.isnan(v[i])]
                total.append(sum(vals) if vals else NAN)
            series = {"*": total, **per_node}
            out["series"][metric] = {n: [None if math.isnan(x) else round(x, 3) for x in v]
                                     for n, v in series.items()}
        return out

    def latest_topic_rates(self) -> dict[str, float]:
        """Messages/s per topic over the last sampling interval (sum over nodes)."""
        if self.samples < 2:
            return {}
        b = (self.head - 1) % self.capacity
        a = (self.head - 2) % self.capacity
        dt = self.times[b] - self.times[a]
        if not dt > 0:
            return {}
        rates: dict[str, float] = {}
        for k, s in self.series.items():
            if k[0] != "t":
                continue
            arr = s["message_count"]
            d = arr[b] - arr[a]
            if d >= 0:  # False for NaN too
                rates[k[2]] = rates.get(k[2], 0.0) + d / dt
        return rates
