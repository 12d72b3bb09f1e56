"""End-to-end processing latency quantiles (`--e2e-processing-latency-percentile`).

Upstream keeps quantile streams over a sliding window; here each window is split
into two halves holding a bounded random sample, which keeps memory constant and
the cost per FIN tiny, at the price of sampled (not exact) quantiles.
"""

from __future__ import annotations

import random
import time
from typing import Any

SAMPLE_SIZE = 2048


class _Half:
    __slots__ = ("start", "count", "sample")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0
        self.sample: list[int] = []

    def add(self, value: int, count: int) -> None:
        self.count += count
        if len(self.sample) < SAMPLE_SIZE:
            self.sample.append(value)
        else:  # reservoir sampling keeps every observation equally likely
            j = random.randrange(self.count)
            if j < SAMPLE_SIZE:
                self.sample[j] = value


class LatencyWindow:
    """Latency observations (ns) over the last `window` seconds."""

    def __init__(self, window: float, quantiles: list[float]) -> None:
        self.window = max(window, 1.0)
        self.quantiles = sorted(quantiles)
        now = time.monotonic()
        self._halves = [_Half(now), _Half(now)]

    def _rotate(self, now: float) -> _Half:
        cur = self._halves[-1]
        if now - cur.start >= self.window / 2:
            self._halves = [cur, _Half(now)]
            cur = self._halves[-1]
        return cur

    def add(self, value_ns: int, count: int = 1) -> None:
        self._rotate(time.monotonic()).add(value_ns, count)

    def snapshot(self) -> dict[str, Any]:
        self._rotate(time.monotonic())
        count = sum(h.count for h in self._halves)
        if not self.quantiles:
            return {"count": count, "percentiles": None}
        values = sorted(v for h in self._halves for v in h.sample)
        if not values:
            return {"count": 0, "percentiles": None}
        out = []
        for q in self.quantiles:
            idx = min(len(values) - 1, max(0, int(q * len(values) + 0.5) - 1))
            out.append({"quantile": q, "value": values[idx]})
        return {"count": count, "percentiles": out}

    @staticmethod
    def merge(windows: list[LatencyWindow], quantiles: list[float]) -> dict[str, Any]:
        """Topic-level view: the union of its channels' samples."""
        if not windows or not quantiles:
            return {"count": 0, "percentiles": None}
        merged = LatencyWindow(windows[0].window, quantiles)
        half = merged._halves[-1]
        for w in windows:
            w._rotate(time.monotonic())
            for h in w._halves:
                half.count += h.count
                half.sample.extend(h.sample)
        if len(half.sample) > SAMPLE_SIZE * 2:
            half.sample = random.sample(half.sample, SAMPLE_SIZE * 2)
        return merged.snapshot()
