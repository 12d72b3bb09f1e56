"""nsqd ``/stats`` JSON -> upstream nsqadmin's ``/api`` shapes (``clusterinfo/types.go``):
per-node TopicStats/ChannelStats/ClientStats, and their sums over nodes (``node: "*"``).

Pure functions over dicts; nothing here does I/O.
"""

from __future__ import annotations

import time
from typing import Any

from .cluster import http_address

__all__ = ["aggregate_channels", "aggregate_topic", "client_stats", "e2e_from_nsqd",
           "e2e_merge", "node_channel_stats", "node_topic_stats"]

_TOPIC_SUMS = ("depth", "memory_depth", "backend_depth", "message_count", "delivery_msg_count",
               "zone_local_msg_count", "region_local_msg_count", "global_msg_count")
_CHANNEL_SUMS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count",
                 "requeue_count", "timeout_count", "message_count", "delivery_msg_count",
                 "zone_local_msg_count", "region_local_msg_count", "global_msg_count",
                 "client_count", "dlq_count", "expired_count")
_OMITEMPTY = ("zone_local_msg_count", "region_local_msg_count", "global_msg_count")


def _i(v: Any) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def e2e_from_nsqd(raw: Any, topic: str = "", channel: str = "", host: str = ""
                  ) -> dict[str, Any]:
    """nsqd's ``{"count", "percentiles": [{"quantile","value"}]}`` -> upstream's aggregate
    (each percentile also gets min/max/average = value and the count)."""
    raw = raw if isinstance(raw, dict) else {}
    count = _i(raw.get("count"))
    pcts = []
    for p in raw.get("percentiles") or []:
        v = float(p.get("value", 0))
        pcts.append({"quantile": float(p.get("quantile", 0)), "value": v, "min": v, "max": v,
                     "average": v, "count": float(count)})
    return {"count": count, "percentiles": pcts or None, "topic": topic, "channel": channel,
            "host": host}


def e2e_merge(items: list[dict[str, Any]], topic: str, channel: str = "") -> dict[str, Any]:
    """Upstream ``E2eProcessingLatencyAggregate.Add`` over nodes: counts add up, per quantile
    min/max over nodes and the count-weighted average; sorted by quantile, highest first."""
    by_q: dict[float, dict[str, float]] = {}
    count = 0
    for e in items:
        count += _i(e.get("count"))
        for p in e.get("percentiles") or []:
            q = p["quantile"]
            agg = by_q.get(q)
            if agg is None:
                by_q[q] = {"quantile": q, "min": p["min"], "max": p["max"],
                           "average": p["average"], "count": p["count"]}
                continue
            agg["min"] = min(agg["min"], p["min"])
            agg["max"] = max(agg["max"], p["max"])
            total = agg["count"] + p["count"]
            if total:
                agg["average"] = (agg["average"] * agg["count"] + p["average"] * p["count"]) / total
            agg["count"] = total
    pcts = sorted(by_q.values(), key=lambda x: -x["quantile"])
    return {"count": count, "percentiles": pcts or None, "topic": topic, "channel": channel,
            "host": "*"}


def client_stats(raw: dict[str, Any], node: str, producer: dict[str, Any], now: float
                 ) -> dict[str, Any]:
    connect_ts = _i(raw.get("connect_ts"))
    c = {
        "node": node,
        "remote_address": raw.get("remote_address", ""),
        "version": raw.get("version", ""),
        "client_id": raw.get("client_id", ""),
        "hostname": raw.get("hostname", ""),
        "user_agent": raw.get("user_agent", ""),
        "connect_ts": connect_ts,
        # a Go time.Duration: nanoseconds since connect, to the second
        "connected": max(0, int(now) - connect_ts) * 1_000_000_000,
        "in_flight_count": _i(raw.get("in_flight_count")),
        "ready_count": _i(raw.get("ready_count")),
        "finish_count": _i(raw.get("finish_count")),
        "requeue_count": _i(raw.get("requeue_count")),
        "message_count": _i(raw.get("message_count")),
        "sample_rate": _i(raw.get("sample_rate")),
        "deflate": bool(raw.get("deflate")),
        "snappy": bool(raw.get("snappy")),
        "authed": bool(raw.get("authed")),
        "auth_identity": raw.get("auth_identity", ""),
        "auth_identity_url": raw.get("auth_identity_url", ""),
        "tls": bool(raw.get("tls")),
        "tls_cipher_suite": raw.get("tls_cipher_suite", ""),
        "tls_version": raw.get("tls_version", ""),
        "tls_negotiated_protocol": raw.get("tls_negotiated_protocol", ""),
        "tls_negotiated_protocol_is_mutual": bool(raw.get("tls_negotiated_protocol_is_mutual")),
    }
    for key, val in (("node_topology_region", producer.get("topology_region", "")),
                     ("node_topology_zone", producer.get("topology_zone", "")),
                     ("topology_region", raw.get("topology_region", "")),
                     ("topology_zone", raw.get("topology_zone", ""))):
        if val:
            c[key] = val
    return c


def node_channel_stats(raw: dict[str, Any], topic: str, node: str, producer: dict[str, Any],
                       now: float) -> dict[str, Any]:
    depth, backend = _i(raw.get("depth")), _i(raw.get("backend_depth"))
    zl, rl, gl = (_i(raw.get(k)) for k in _OMITEMPTY)
    c: dict[str, Any] = {
        "node": node,
        "hostname": producer.get("hostname", ""),
        "topic_name": topic,
        "channel_name": raw.get("channel_name", ""),
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "in_flight_count": _i(raw.get("in_flight_count")),
        "deferred_count": _i(raw.get("deferred_count")),
        "requeue_count": _i(raw.get("requeue_count")),
        "timeout_count": _i(raw.get("timeout_count")),
        "dlq_count": _i(raw.get("dlq_count")),
        "expired_count": _i(raw.get("expired_count")),
        "message_count": _i(raw.get("message_count")),
        "delivery_msg_count": zl + rl + gl,
        "zone_local_msg_count": zl,
        "region_local_msg_count": rl,
        "global_msg_count": gl,
        "client_count": _i(raw.get("client_count")),
        "nodes": None,
        "clients": [client_stats(cl, node, producer, now) for cl in raw.get("clients") or []],
        "paused": bool(raw.get("paused")),
        "e2e_processing_latency": e2e_from_nsqd(raw.get("e2e_processing_latency")),
    }
    return c


def node_topic_stats(raw: dict[str, Any], producer: dict[str, Any], now: float | None = None
                     ) -> dict[str, Any]:
    now = time.time() if now is None else now
    node = http_address(producer)
    name = raw.get("topic_name", "")
    depth, backend = _i(raw.get("depth")), _i(raw.get("backend_depth"))
    zl, rl, gl = (_i(raw.get(k)) for k in _OMITEMPTY)
    out = {
        "node": node,
        "hostname": producer.get("hostname", ""),
        "topic_name": name,
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "message_count": _i(raw.get("message_count")),
        "delivery_msg_count": zl + rl + gl,
        "zone_local_msg_count": zl,
        "region_local_msg_count": rl,
        "global_msg_count": gl,
        "nodes": None,
        "channels": [node_channel_stats(c, name, node, producer, now)
                     for c in raw.get("channels") or []],
        "paused": bool(raw.get("paused")),
        "e2e_processing_latency": e2e_from_nsqd(raw.get("e2e_processing_latency")),
    }
    if raw.get("archive"):  # nsqx tiered storage: per partition (nsqd --archive-url)
        out["archive"] = raw["archive"]
    return out


def aggregate_channels(per_node: list[dict[str, Any]], topic: str, channel: str
                       ) -> dict[str, Any]:
    """ChannelStats.Add over nodes: sums, ``nodes`` sorted by hostname, all clients."""
    agg: dict[str, Any] = {"node": "*", "hostname": "", "topic_name": topic,
                           "channel_name": channel}
    for k in _CHANNEL_SUMS:
        agg[k] = sum(c.get(k, 0) for c in per_node)
    agg["nodes"] = sorted(per_node, key=lambda c: (c["hostname"], c["node"]))
    clients = [cl for c in per_node for cl in c.get("clients") or []]
    clients.sort(key=lambda cl: (cl["node"], cl["hostname"], cl["remote_address"]))
    agg["clients"] = clients
    agg["paused"] = any(c.get("paused") for c in per_node)
    agg["e2e_processing_latency"] = e2e_merge(
        [c["e2e_processing_latency"] for c in per_node], topic, channel)
    return agg


def aggregate_topic(topic: str, per_node: list[dict[str, Any]]) -> dict[str, Any]:
    """TopicStats.Add over nodes (each node's TopicStats as made by node_topic_stats)."""
    agg: dict[str, Any] = {"node": "*", "hostname": "", "topic_name": topic}
    for k in _TOPIC_SUMS:
        agg[k] = sum(t.get(k, 0) for t in per_node)
    nodes = sorted(per_node, key=lambda t: (t["hostname"], t["node"]))
    agg["nodes"] = nodes
    by_channel: dict[str, list[dict[str, Any]]] = {}
    for t in nodes:
        for c in t["channels"]:
            by_channel.setdefault(c["channel_name"], []).append(c)
    agg["channels"] = [aggregate_channels(v, topic, name)
                       for name, v in sorted(by_channel.items())]
    agg["paused"] = any(t.get("paused") for t in per_node)
    agg["e2e_processing_latency"] = e2e_merge(
        [t["e2e_processing_latency"] for t in per_node], topic)
    return agg


def strip_omitempty(d: dict[str, Any]) -> dict[str, Any]:
    """Drop the ``omitempty`` zero counters (recursively in nodes/channels) for /api output."""
    out = {k: v for k, v in d.items() if not (k in _OMITEMPTY and not v)}
    if out.get("delivery_msg_count") == 0 and "channel_name" in out:
        del out["delivery_msg_count"]  # omitempty on ChannelStats only
    for key in ("nodes", "channels"):
        if isinstance(out.get(key), list):
            out[key] = [strip_omitempty(x) for x in out[key]]
    return out
