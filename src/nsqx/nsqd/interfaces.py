"""The narrow views nsqd's parts have of each other (typing Protocols, no behaviour).

``node`` is the hub: it builds the topics, the TCP sessions, the HTTP app and the services
(lookupd registration, tracing, auth, statsd) and hands each part the node itself or one of
its objects. A part never imports the concrete class it is handed (that would point an
import upward and close a circle: ``channel`` -> ``client_v2`` -> ``channel``); it names the
view below instead, so every import in ``nsqx.nsqd`` points down (``docs/architecture.md``).

The views list what the parts use; they are checked by reading, not at run time (nothing
here is ``runtime_checkable``: the hot paths call the concrete objects directly).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from nsqx.storage.cursor import ChannelCursor, Delivery


class Session(Protocol):
    """A consumer's TCP session (``client_v2.ClientV2``) as its channels see it."""

    id: int
    remote_address: str
    msg_timeout_ms: int
    sample_rate: int
    extend_support: bool
    desired_tag: str
    pub_counts: Any

    def ready_room(self) -> int:
        """How many more messages it may take now (RDY minus in flight)."""

    def send_messages(self, chunks: list[Any], count: int) -> None:
        """Write ``count`` message frames (``chunks``) to the socket."""

    def close(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class Tracer(Protocol):
    """The node's trace recorder (``trace.TraceRecorder``) as a traced topic calls it."""

    def wrap_publish(self, topic: TopicView, headers: Sequence[dict[str, bytes] | None] | None,
                     count: int, producer: str,
                     done: Callable[[int, Exception | None], None] | None) -> Any: ...

    def delivered(self, channel: ChannelView, client: Any, deliveries: Iterable[Delivery]) -> None: ...

    def finished(self, channel: ChannelView, client: Any, offsets: Iterable[int]) -> None: ...

    def requeued(self, channel: ChannelView, client: Any, offset: int, delay_ms: int) -> None: ...

    def timed_out(self, channel: ChannelView, expired: Iterable[tuple[int, int, int]]) -> None: ...

    def dead_lettered(self, channel: ChannelView, client_id: int, offsets: Any,
                      dead_topic: str) -> None: ...


class TopicRouting(Protocol):
    """A route-managed topic's routes (``routing.TopicRoutes``) as topics, channels and the
    publish paths consult them."""

    open: Any

    def pick_open(self) -> int: ...

    def check_publish(self, partition: int, route_version: int | None = None) -> None: ...

    def gate(self, channel: ChannelView, end: int) -> int: ...

    def channel_created(self, name: str, *, first: bool) -> None: ...

    def channel_deleted(self, name: str) -> None: ...


class TopicView(Protocol):
    """One topic partition (``topic.Topic``) as its channels and the services see it."""

    nsqd: NodeContext
    name: str
    partition: int
    partitions: list[Any]
    channels: dict[str, Any]
    log: Any
    ordered: bool
    paused: bool
    ephemeral: bool
    msg_ttl_ns: int
    readable_end: int
    routes: TopicRouting | None
    tracer: Tracer | None

    def publish(self, bodies: list[bytes], defer_ms: int = 0, *, headers: Any = None,
                producer: str = "") -> Any: ...

    def delete_channel(self, name: str) -> Any: ...

    def delete_unused_ephemeral(self, name: str) -> Any: ...


class ChannelView(Protocol):
    """A channel (``channel.Channel``) as the services it is handed see it (dead letters,
    tag dispatch, tracing)."""

    name: str
    topic: TopicView
    cursor: ChannelCursor
    clients: dict[int, Session]
    ordered: bool
    dirty: bool
    max_attempts: int
    dlq_count: int
    expired_count: int
    tags: Any

    def wake(self) -> None: ...


class NodeContext(Protocol):
    """The node (``node.NSQD``) as its model (topics, channels, routes) and its services
    (lookupd registration, auth, tracing) see it."""

    opts: Any  # options.Options
    loop: asyncio.AbstractEventLoop
    data_path: Path
    topics: dict[str, Any]
    exiting: bool
    tcp_port: int
    http_port: int
    fs_syncer: Any
    commit_scheduler: Any
    timed_channels: set[Any]
    dirty_channels: set[Any]
    tracer: Any
    lookup: Any

    def get_topic(self, name: str, create: bool = True) -> Any: ...

    async def delete_topic(self, name: str) -> None: ...

    def ensure_partitions(self, name: str, count: int, *, ordered: bool = False) -> Any: ...

    def metadata_changed(self) -> None: ...

    def readers_changed(self) -> None: ...

    def reclaim_files(self) -> int: ...

    def lookup_register(self, topic: str, channel: str | None) -> None: ...

    def lookup_unregister(self, topic: str, channel: str | None) -> None: ...


class NodeAPI(NodeContext, Protocol):
    """The node as its front ends (TCP sessions, the HTTP API, statsd) use it: the model's
    view plus clients, health, listeners and stats."""

    start_time: int
    https_port: int | None
    auth_enabled: bool
    tls_context: Any
    tls_required_tcp: bool
    tls_required_http: bool

    def health(self) -> str: ...

    def is_healthy(self) -> bool: ...

    def set_health(self, error: str | None) -> None: ...

    def clients(self) -> list[Any]: ...

    def client_connected(self, client: Any) -> None: ...

    def client_disconnected(self, client: Any) -> None: ...

    async def publish(self, topic_name: str, bodies: list[bytes], defer_ms: int = 0,
                      partition: int | None = None, *, headers: Any = None,
                      producer: str = "") -> tuple[int, int]: ...

    def persist_metadata(self) -> None: ...

    def set_lookupd_tcp_addresses(self, addrs: list[str]) -> None: ...

    def stats_dict(self, topic: str | None = None, channel: str | None = None,
                   include_clients: bool = True, include_mem: bool = True) -> dict[str, Any]: ...
