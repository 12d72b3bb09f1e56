"""A small in-memory NSQD/Topic/Channel facade that follows the shared contract.

HTTP, statsd and metrics unit tests run against it; the real node is covered
by the integration tests.
"""

from __future__ import annotations

import time
from typing import Any

from nsqx import NSQ_VERSION
from nsqx.nsqd.options import Options


class FakeChannel:
    def __init__(self, topic: FakeTopic, name: str) -> None:
        self.topic = topic
        self.name = name
        self.routes = None  # not route-managed
        self.ephemeral = name.endswith("#ephemeral")
        self.paused = False
        self.clients: dict[int, Any] = {}
        self.in_flight_count = 0
        self.deferred_count = 0
        self.depth = 0
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.emptied = 0

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False

    def empty(self) -> None:
        self.emptied += 1
        self.depth = 0
        self.in_flight_count = 0
        self.deferred_count = 0


class FakeTopic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.routes = None  # not route-managed
        self.ephemeral = name.endswith("#ephemeral")
        self.paused = False
        self.channels: dict[str, FakeChannel] = {}
        self.messages: list[tuple[bytes, int]] = []
        self.message_count = 0
        self.message_bytes = 0
        self.depth = 0
        self.emptied = 0

    def get_channel(self, name: str, create: bool = True) -> FakeChannel | None:
        ch = self.channels.get(name)
        if ch is None and create:
            ch = self.channels[name] = FakeChannel(self, name)
        return ch

    async def delete_channel(self, name: str) -> None:
        del self.channels[name]  # KeyError if absent, like the contract says

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False

    def empty(self) -> None:
        self.emptied += 1
        self.depth = 0


class FakeClient:
    def __init__(self, **kw: Any) -> None:
        self._stats = {
            "client_id": "c1", "hostname": "host1", "version": "V2",
            "remote_address": "127.0.0.1:50000", "state": 3, "ready_count": 1,
            "in_flight_count": 0, "message_count": 5, "finish_count": 5, "requeue_count": 0,
            "connect_ts": int(time.time()) - 65, "sample_rate": 0, "deflate": False,
            "snappy": False, "user_agent": "go-nsq/1.1.0", "tls": False,
            "tls_cipher_suite": "", "tls_version": "", "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False, "topology_zone": "",
            "topology_region": "",
        }
        self._stats.update(kw)
        self.pub_counts = {p["topic"]: p["count"] for p in kw.get("pub_counts", [])}

    def stats(self) -> dict[str, Any]:
        return dict(self._stats)


class FakeNSQD:
    def __init__(self, opts: Options | None = None, **kw: Any) -> None:
        self.opts = opts or Options(node_id=7, broadcast_address="node1.example", **kw)
        self.start_time = int(time.time()) - 100
        self.topics: dict[str, FakeTopic] = {}
        self.tcp_port = 4150
        self.http_port = 4151
        self.https_port: int | None = None
        self.error: str | None = None
        self.exiting = False
        self.publish_error: Exception | None = None
        self.persisted = 0
        self.topic_delete_hook = None  # standalone: /topic/delete deletes here
        self.http_route_hooks: list[Any] = []
        self.lookupd: list[list[str]] = []
        self.producers: list[FakeClient] = []
        self.stats_error: Exception | None = None

    def health(self) -> str:
        return "OK" if self.error is None else f"NOK - {self.error}"

    def is_healthy(self) -> bool:
        return self.error is None

    def get_topic(self, name: str, create: bool = True) -> FakeTopic | None:
        t = self.topics.get(name)
        if t is None and create and not self.exiting:
            t = self.topics[name] = FakeTopic(name)
        return t

    async def delete_topic(self, name: str) -> None:
        del self.topics[name]

    async def publish(self, topic_name: str, bodies: list[bytes], defer_ms: int = 0,
                      partition: int | None = None, *,
                      headers: list[dict[str, bytes] | None] | None = None,
                      producer: str = "") -> tuple[int, int]:
        if self.publish_error is not None:
            raise self.publish_error
        t = self.get_topic(topic_name)
        assert t is not None
        base = t.message_count
        for b in bodies:
            t.messages.append((b, defer_ms))
            t.message_count += 1
            t.message_bytes += len(b)
            t.depth += 1
        return 0, base

    def clients(self) -> list[Any]:
        return list(self.producers)

    def persist_metadata(self) -> None:
        self.persisted += 1

    def set_lookupd_tcp_addresses(self, addrs: list[str]) -> None:
        self.opts.nsqlookupd_tcp_addresses = list(addrs)
        self.lookupd.append(list(addrs))

    def stats_dict(self, topic: str | None = None, channel: str | None = None,
                   include_clients: bool = True, include_mem: bool = True) -> dict[str, Any]:
        if self.stats_error is not None:
            raise self.stats_error
        topics = []
        for t in sorted(self.topics.values(), key=lambda t: t.name):
            if topic is not None and t.name != topic:
                continue
            chans = []
            for c in sorted(t.channels.values(), key=lambda c: c.name):
                if channel is not None and c.name != channel:
                    continue
                chans.append({
                    "channel_name": c.name, "depth": c.depth, "backend_depth": c.depth,
                    "in_flight_count": c.in_flight_count, "deferred_count": c.deferred_count,
                    "message_count": c.message_count, "requeue_count": c.requeue_count,
                    "timeout_count": c.timeout_count, "client_count": len(c.clients),
                    "clients": [cl.stats() for cl in c.clients.values()] if include_clients else [],
                    "paused": c.paused,
                    "e2e_processing_latency": {"count": 0, "percentiles": None},
                })
            topics.append({
                "topic_name": t.name, "channels": chans, "depth": t.depth,
                "backend_depth": t.depth, "message_count": t.message_count,
                "message_bytes": t.message_bytes, "paused": t.paused,
                "e2e_processing_latency": {"count": 0, "percentiles": None},
            })
        return {
            "version": NSQ_VERSION, "health": self.health(), "start_time": self.start_time,
            "topics": topics,
            "producers": [p.stats() for p in self.producers] if include_clients else [],
        }
