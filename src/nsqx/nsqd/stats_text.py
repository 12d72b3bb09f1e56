"""Upstream's human ``/stats`` report (the default when ``format`` isn't ``json``).

Byte-for-byte the layout of ``printStats`` in nsqd/http.go, so people (and
scripts that grep it) see what they know.
"""

from __future__ import annotations

import datetime as _dt
import time
from typing import Any

from nsqx.flags import format_go_duration
from nsqx.nsqd.options import version_string

__all__ = ["client_line", "e2e_text", "format_stats", "nanoseconds_to_human"]


def nanoseconds_to_human(v: float) -> str:
    """internal/stringy.NanoSecondToHuman."""
    if v > 1_000_000_000:
        v, suffix = v / 1_000_000_000, "s"
    elif v > 1_000_000:
        v, suffix = v / 1_000_000, "ms"
    elif v > 1000:
        v, suffix = v / 1000, "us"
    else:
        suffix = "ns"
    return f"{v:0.1f}{suffix}"


def e2e_text(e2e: dict[str, Any] | None) -> str:
    pcts = (e2e or {}).get("percentiles") or []
    return ", ".join(nanoseconds_to_human(float(p["value"])) for p in pcts)


def _port(addr: str) -> str:
    host, sep, port = addr.rpartition(":")
    return port if sep and host else ""


def client_line(c: dict[str, Any], now: float | None = None) -> str:
    """ClientV2Stats.String(): one line per consumer or producer."""
    now = time.time() if now is None else now
    connected = format_go_duration(0, ns=max(int(now) - int(c.get("connect_ts", 0)), 0)
                                   * 1_000_000_000)
    ident = f"{c.get('hostname', '')}:{_port(str(c.get('remote_address', '')))} " \
            f"{c.get('user_agent', '')}"
    pubs = c.get("pub_counts") or []
    if pubs:
        total = sum(int(p["count"]) for p in pubs)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pubs)
        return (f"[{c.get('version', '')} {ident:<21}] msgs: {total:<8d} topics: {topics} "
                f"connected: {connected}")
    return (f"[{c.get('version', '')} {ident:<21}] state: {int(c.get('state', 0))} "
            f"inflt: {int(c.get('in_flight_count', 0)):<4d} rdy: {int(c.get('ready_count', 0)):<4d} "
            f"fin: {int(c.get('finish_count', 0)):<8d} re-q: {int(c.get('requeue_count', 0)):<8d} "
            f"msgs: {int(c.get('message_count', 0)):<8d} connected: {connected}")


_MEM_KEYS = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
             "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
             "gc_total_runs")


def format_stats(stats: dict[str, Any], memory: dict[str, int] | None, health: str,
                 start_time: float, now: float | None = None) -> str:
    """The text report. ``stats`` is the upstream /stats JSON dict (topics, producers)."""
    now = time.time() if now is None else now
    out: list[str] = []
    w = out.append
    w(f"{version_string()}\n")
    start = _dt.datetime.fromtimestamp(start_time).astimezone()
    stamp = start.isoformat(timespec="seconds")
    if stamp.endswith("+00:00"):
        stamp = stamp[:-6] + "Z"
    w(f"start_time {stamp}\n")
    w(f"uptime {format_go_duration(max(now - start_time, 0.0))}\n")
    w(f"\nHealth: {health}\n")
    if memory is not None:
        w("\nMemory:\n")
        for key in _MEM_KEYS:
            w(f"   {key:<25s}\t{int(memory.get(key, 0))}\n")
    topics = stats.get("topics") or []
    w("\nTopics: None\n" if not topics else "\nTopics:")
    for t in topics:
        prefix = "*P " if t.get("paused") else "   "
        w(f"\n{prefix}[{t['topic_name']:<15s}] depth: {int(t.get('depth', 0)):<5d} "
          f"be-depth: {int(t.get('backend_depth', 0)):<5d} msgs: {int(t.get('message_count', 0)):<8d} "
          f"e2e%: {e2e_text(t.get('e2e_processing_latency'))}\n")
        for c in t.get("channels") or []:
            prefix = "   *P " if c.get("paused") else "      "
            w(f"{prefix}[{c['channel_name']:<25s}] depth: {int(c.get('depth', 0)):<5d} "
              f"be-depth: {int(c.get('backend_depth', 0)):<5d} "
              f"inflt: {int(c.get('in_flight_count', 0)):<4d} "
              f"def: {int(c.get('deferred_count', 0)):<4d} "
              f"re-q: {int(c.get('requeue_count', 0)):<5d} "
              f"timeout: {int(c.get('timeout_count', 0)):<5d} "
              f"msgs: {int(c.get('message_count', 0)):<8d} "
              f"e2e%: {e2e_text(c.get('e2e_processing_latency'))}\n")
            for client in c.get("clients") or []:
                w(f"        {client_line(client, now)}\n")
    producers = stats.get("producers") or []
    if not producers:
        w("\nProducers: None\n")
    else:
        w("\nProducers:\n")
        for client in producers:
            w(f"   {client_line(client, now)}\n")
    return "".join(out)
