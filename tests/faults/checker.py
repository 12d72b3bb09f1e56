"""The fault suite's checker: the history of one run, judged per nemesis window.

Input: the producer's acknowledgements (message number -> ack time), every delivery the
consumer saw, how many numbers were published, the fault windows (name, injected, healed,
next window's start) and the servers' logs. Output per window (by ack time): acknowledged, lost
(acked, never delivered), duplicates (extra deliveries), the longest time without any acknowledgement inside the window (how long writes stayed
unavailable; the pynsq producer gives up on a silent node after 3 s, a floor of the
measure when the node it writes to stops answering), and the epochs claimed by two
leaders (from the ``leading at epoch`` log lines: two leaders that could acknowledge in
one epoch); for the run: invented (delivered, never published).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

LEADING = re.compile(r"CLUSTER: TOPIC\((\S+)\) PARTITION\((\d+)\): leading at epoch (\d+)")


@dataclass
class Window:
    nemesis: str
    start: float
    healed: float = 0.0
    end: float = 0.0  # the next window's start (or the end of the run)
    recovered: bool = True  # the ISR was full again before the next window
    stale_refusals: int = 0  # signed requests refused as too old/new during the window


@dataclass
class Row:
    nemesis: str
    acked: int = 0
    lost: list[int] = field(default_factory=list)
    duplicates: int = 0
    longest_gap: float = 0.0
    recovered: bool = True
    stale_refusals: int = 0


def split_brains(logs: dict[str, str]) -> dict[tuple[str, int, int], set[str]]:
    """(topic, partition, epoch) -> the nodes that led it, where more than one did."""
    leaders: dict[tuple[str, int, int], set[str]] = defaultdict(set)
    for node, text in logs.items():
        for m in LEADING.finditer(text):
            leaders[(m.group(1), int(m.group(2)), int(m.group(3)))].add(node)
    return {k: v for k, v in leaders.items() if len(v) > 1}


def judge(windows: list[Window], acks: dict[int, float], seen: Counter[int]) -> list[Row]:
    rows = []
    for w in windows:
        row = Row(w.nemesis, recovered=w.recovered, stale_refusals=w.stale_refusals)
        times = sorted(t for t in acks.values() if w.start <= t < w.end)
        for n, t in acks.items():
            if w.start <= t < w.end:
                row.acked += 1
                if n not in seen:
                    row.lost.append(n)
                row.duplicates += max(0, seen.get(n, 0) - 1)
        edges = [w.start, *times, w.end]
        row.longest_gap = max(b - a for a, b in zip(edges, edges[1:], strict=False))
        rows.append(row)
    return rows


def invented(seen: Counter[int], published: int) -> list[int]:
    """Delivered numbers no publish ever carried (the producer numbers from 0)."""
    return sorted(n for n in seen if not 0 <= n < published)


def table(rows: list[Row]) -> str:
    head = (f"{'nemesis':<16}{'acked':>8}{'lost':>6}{'dups':>7}"
            f"{'longest no-ack s':>18}{'stale-refused':>15}  recovered")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.nemesis:<16}{r.acked:>8}{len(r.lost):>6}{r.duplicates:>7}"
                     f"{r.longest_gap:>18.1f}{r.stale_refusals:>15}  {'yes' if r.recovered else 'NO'}")
    return "\n".join(lines)


@dataclass
class OrderedTally:
    """Per-key order on an ordered topic (tests/faults/ordered_load.py's events)."""

    acked: int = 0
    lost: list[tuple[str, int]] = field(default_factory=list)
    duplicates: int = 0
    violations: list[tuple[str, int, int]] = field(default_factory=list)  # key, seq, after

    def __str__(self) -> str:
        return (f"ordered: acked {self.acked}, lost {len(self.lost)}, duplicates "
                f"{self.duplicates}, order violations {len(self.violations)}")


def judge_ordered(events_out: list[dict], events_in: list[dict]) -> OrderedTally:
    """Every acknowledged (key, seq) delivered; per key, each number delivered for the first
    time only after every smaller one (a redelivery of an older one is a duplicate, not a
    violation: at-least-once)."""
    acked = {(e["ack"], e["seq"]) for e in events_out if "ack" in e}
    seen: Counter[tuple[str, int]] = Counter()
    highest: dict[str, int] = {}
    t = OrderedTally(acked=len(acked))
    for e in events_in:
        if "got" not in e:
            continue
        k, n = e["got"], e["seq"]
        if seen[(k, n)] == 0 and n < highest.get(k, -1):
            t.violations.append((k, n, highest[k]))
        seen[(k, n)] += 1
        highest[k] = max(highest.get(k, -1), n)
    t.lost = sorted(acked - set(seen))
    t.duplicates = sum(c - 1 for c in seen.values())
    return t
