"""Process memory/GC stats under upstream's key names, and Prometheus ``/metrics``.

Upstream's ``memory`` block (``/stats``, statsd ``mem.*``) comes from Go's
runtime.MemStats. Python has no such heap; the closest cheap numbers are used
under the same keys so dashboards and nsqadmin keep working:

- heap_objects: blocks allocated by pymalloc (sys.getallocatedblocks())
- heap_in_use_bytes: resident set size; heap_idle_bytes: virtual size - RSS
- heap_released_bytes: 0 (no equivalent)
- gc_pause_usec_{100,99,95}: percentiles of the last 256 cyclic-GC pauses (gc.callbacks)
- next_gc_bytes: 0 (CPython's GC is triggered by allocation counts, not bytes)
- gc_total_runs: collections of all generations
"""

from __future__ import annotations

import gc
import math
import os
import resource
import sys
import time
from collections import deque
from typing import Any

from nsqx import NSQ_VERSION, __version__

__all__ = ["GC_PAUSES", "memory_stats", "process_stats", "prometheus_text"]

_PAGE = resource.getpagesize()  # (/proc/self/statm counts pages)
_PROCESS_START = time.time()


class _GCPauses:
    """Keeps the last 256 cyclic-GC pause times (ns), like Go's MemStats.PauseNs."""

    def __init__(self, size: int = 256) -> None:
        self.pauses: deque[int] = deque(maxlen=size)
        self._start = 0
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
        elif self._start:
            self.pauses.append(time.perf_counter_ns() - self._start)
            self._start = 0

    def percentile_usec(self, perc: float) -> int:
        """Upstream's percentile(): nearest rank over the sorted pauses, in µs."""
        arr = sorted(self.pauses)
        n = len(arr)
        if n == 0:
            return 0
        idx = int(math.floor(perc / 100.0 * n + 0.5))
        return arr[min(idx, n - 1)] // 1000


GC_PAUSES = _GCPauses()


def _rss_and_vms() -> tuple[int, int]:
    try:
        with open("/proc/self/statm", "rb") as fh:
            parts = fh.read().split()
        return int(parts[1]) * _PAGE, int(parts[0]) * _PAGE
    except (OSError, IndexError, ValueError):
        # not Linux: peak RSS is the best portable number
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rss = peak if sys.platform == "darwin" else peak * 1024
        return rss, rss


def memory_stats() -> dict[str, int]:
    """Upstream's memStats JSON object, from this Python process."""
    GC_PAUSES.install()
    rss, vms = _rss_and_vms()
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": max(vms - rss, 0),
        "heap_in_use_bytes": rss,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": GC_PAUSES.percentile_usec(100.0),
        "gc_pause_usec_99": GC_PAUSES.percentile_usec(99.0),
        "gc_pause_usec_95": GC_PAUSES.percentile_usec(95.0),
        "next_gc_bytes": 0,
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }


def process_stats() -> dict[str, float]:
    rss, vms = _rss_and_vms()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = -1
    return {
        "rss": rss,
        "vms": vms,
        "cpu": ru.ru_utime + ru.ru_stime,
        "start": _PROCESS_START,
        "fds": fds,
    }


# ---------------------------------------------------------------- Prometheus

def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    return repr(f)


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str,
               samples: list[tuple[dict[str, str], Any]]) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            if labels:
                lab = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
                self.lines.append(f"{name}{{{lab}}} {_num(value)}")
            else:
                self.lines.append(f"{name} {_num(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


_TOPIC_METRICS = (
    # (stats key, metric name, type, help)
    ("depth", "nsq_topic_depth", "gauge", "Messages in the topic not yet given to a channel."),
    ("backend_depth", "nsq_topic_backend_depth", "gauge", "Topic depth kept on disk."),
    ("message_count", "nsq_topic_messages_total", "counter", "Messages published to the topic."),
    ("message_bytes", "nsq_topic_message_bytes_total", "counter",
     "Bytes of message bodies published to the topic."),
    ("paused", "nsq_topic_paused", "gauge", "1 if the topic is paused."),
)
_CHANNEL_METRICS = (
    ("depth", "nsq_channel_depth", "gauge", "Messages waiting in the channel (not in flight)."),
    ("backend_depth", "nsq_channel_backend_depth", "gauge", "Channel depth kept on disk."),
    ("in_flight_count", "nsq_channel_in_flight", "gauge", "Messages sent and not yet finished."),
    ("deferred_count", "nsq_channel_deferred", "gauge", "Messages deferred or requeued with delay."),
    ("message_count", "nsq_channel_messages_total", "counter", "Messages delivered by the channel."),
    ("requeue_count", "nsq_channel_requeues_total", "counter", "Messages requeued."),
    ("timeout_count", "nsq_channel_timeouts_total", "counter", "Messages that timed out in flight."),
    ("dlq_count", "nsqx_channel_dead_lettered_total", "counter",
     "Messages moved to the dead-letter topic after --max-attempts deliveries."),
    ("expired_count", "nsqx_channel_expired_total", "counter",
     "Messages skipped because they were older than the topic's TTL."),
    ("client_count", "nsq_channel_clients", "gauge", "Connected consumers."),
    ("paused", "nsq_channel_paused", "gauge", "1 if the channel is paused."),
)


_ARCHIVE_METRICS = (
    ("archive_lag_bytes", "nsqx_archive_lag_bytes",
     "Bytes of closed log segments not archived yet (local deletion waits for them)."),
    ("archive_lag_segments", "nsqx_archive_lag_segments",
     "Closed log segments not archived yet."),
    ("archived_bytes", "nsqx_archived_bytes", "Bytes of the partition's archived Parquet files."),
    ("archive_start", "nsqx_archive_start_offset", "Oldest offset readable (archive included)."),
    ("log_start", "nsqx_log_start_offset", "Oldest offset in the local log."),
)


def prometheus_text(stats: dict[str, Any], *, healthy: bool = True, node_id: int | None = None,
                    start_time: float | None = None) -> str:
    """Prometheus text exposition (0.0.4) of an upstream /stats dict plus the process."""
    w = _Writer()
    info = {"version": NSQ_VERSION, "nsqx_version": __version__}
    if node_id is not None:
        info["node_id"] = str(node_id)
    w.metric("nsqd_info", "gauge", "Constant 1, labelled with the versions.", [(info, 1)])
    w.metric("nsqd_healthy", "gauge", "1 if /ping answers OK.", [({}, 1 if healthy else 0)])
    topics = stats.get("topics") or []
    for key, name, kind, help_ in _TOPIC_METRICS:
        w.metric(name, kind, help_,
                 [({"topic": t["topic_name"]}, t.get(key, 0)) for t in topics])
    for key, name, kind, help_ in _CHANNEL_METRICS:
        w.metric(name, kind, help_, [
            ({"topic": t["topic_name"], "channel": c["channel_name"]}, c.get(key, 0))
            for t in topics for c in (t.get("channels") or [])
        ])
    e2e: list[tuple[dict[str, str], Any]] = []
    for t in topics:
        for c in t.get("channels") or []:
            for p in (c.get("e2e_processing_latency") or {}).get("percentiles") or []:
                e2e.append(({"topic": t["topic_name"], "channel": c["channel_name"],
                             "quantile": _num(float(p["quantile"]))}, p["value"] / 1e9))
    if e2e:
        w.metric("nsq_channel_e2e_processing_latency_seconds", "gauge",
                 "End-to-end processing latency quantiles (publish to FIN).", e2e)
    for key, name, help_ in _ARCHIVE_METRICS:  # tiered storage (only with --archive-url)
        rows = [({"topic": t["topic_name"], "partition": str(a["partition"])}, a.get(key, 0))
                for t in topics for a in t.get("archive") or () if key in a]
        if rows:
            w.metric(name, "gauge", help_, rows)
    p = process_stats()
    now = time.time()
    w.metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
             [({}, p["rss"])])
    w.metric("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
             [({}, p["vms"])])
    w.metric("process_cpu_seconds_total", "counter", "User and system CPU time spent.",
             [({}, p["cpu"])])
    w.metric("process_start_time_seconds", "gauge", "Start time of the process (unix seconds).",
             [({}, p["start"])])
    if p["fds"] >= 0:
        w.metric("process_open_fds", "gauge", "Open file descriptors.", [({}, p["fds"])])
    st = start_time if start_time is not None else p["start"]
    w.metric("nsqd_uptime_seconds", "gauge", "Seconds since nsqd started.",
             [({}, max(now - st, 0.0))])
    w.metric("python_gc_collections_total", "counter", "Cyclic GC runs per generation.",
             [({"generation": str(i)}, s["collections"]) for i, s in enumerate(gc.get_stats())])
    return w.text()
