"""Prometheus /metrics text and the upstream-shaped memory stats."""

from __future__ import annotations

import gc
import re

from nsqx.nsqd.metrics import GC_PAUSES, memory_stats, prometheus_text

_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                     r"[-+0-9.eE]+|NaN|[+-]Inf$")


def _stats() -> dict:
    return {"topics": [{
        "topic_name": "orders", "depth": 3, "backend_depth": 3, "message_count": 10,
        "message_bytes": 100, "paused": True,
        "e2e_processing_latency": {"count": 0, "percentiles": None},
        "channels": [{
            "channel_name": 'we"ird\\name', "depth": 4, "backend_depth": 4,
            "in_flight_count": 5, "deferred_count": 6, "message_count": 8,
            "requeue_count": 2, "timeout_count": 1, "client_count": 1, "paused": False,
            "e2e_processing_latency": {"count": 2, "percentiles": [
                {"quantile": 0.99, "value": 2_000_000.0}]},
        }],
    }], "producers": []}


def test_prometheus_text_is_well_formed() -> None:
    text = prometheus_text(_stats(), healthy=True, node_id=5, start_time=0.0)
    assert text.endswith("\n")
    seen_types: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert name not in seen_types, name
            seen_types.add(name)
            continue
        if line.startswith("# HELP "):
            continue
        assert _SAMPLE.match(line), line
    assert 'nsq_topic_depth{topic="orders"} 3' in text
    assert 'nsq_topic_paused{topic="orders"} 1' in text
    assert 'nsq_topic_messages_total{topic="orders"} 10' in text
    ch = 'topic="orders",channel="we\\"ird\\\\name"'
    for metric, value in [("nsq_channel_depth", 4), ("nsq_channel_in_flight", 5),
                          ("nsq_channel_deferred", 6), ("nsq_channel_messages_total", 8),
                          ("nsq_channel_requeues_total", 2), ("nsq_channel_timeouts_total", 1),
                          ("nsq_channel_clients", 1)]:
        assert f"{metric}{{{ch}}} {value}" in text, metric
    assert f'nsq_channel_e2e_processing_latency_seconds{{{ch},quantile="0.99"}} 0.002' in text
    assert 'nsqd_info{version="' in text and 'node_id="5"' in text
    assert "nsqd_healthy 1" in text
    assert re.search(r"^process_resident_memory_bytes \d+$", text, re.M)
    assert re.search(r"^nsqd_uptime_seconds [0-9.e+]+$", text, re.M)
    assert "# TYPE nsq_channel_requeues_total counter" in text


def test_prometheus_empty_node() -> None:
    text = prometheus_text({"topics": []}, healthy=False)
    assert "nsqd_healthy 0" in text
    assert "# TYPE nsq_topic_depth gauge" in text


def test_memory_stats_keys_and_gc_pauses() -> None:
    ms = memory_stats()
    assert list(ms) == ["heap_objects", "heap_idle_bytes", "heap_in_use_bytes",
                        "heap_released_bytes", "gc_pause_usec_100", "gc_pause_usec_99",
                        "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs"]
    assert all(isinstance(v, int) and v >= 0 for v in ms.values())
    assert ms["heap_in_use_bytes"] > 0 and ms["heap_objects"] > 0
    before = len(GC_PAUSES.pauses)
    gc.collect()
    assert len(GC_PAUSES.pauses) > before or len(GC_PAUSES.pauses) == 256
    assert memory_stats()["gc_total_runs"] > ms["gc_total_runs"]
