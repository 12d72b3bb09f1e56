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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from nsqx.storage.cursor import Delivery


class Session(Protocol):
    """A consumer's TCP session (``client_v2.ClientV2``) as its channels see it."""

    id: int
    remote_address: str
    msg_timeout_ms: int
    sample_rate: int
    extend_support: bool
    desired_tag: str
    pub_counts: Any
    sub_all: bool  # a plain SUB in cluster mode: it reads every partition the node leads

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

    def delivered(self, channel: ChannelView, client: Session, deliveries: Iterable[Delivery]) -> None: ...

    def finished(self, channel: ChannelView, client: Session, offsets: Iterable[int]) -> None: ...

    def requeued(self, channel: ChannelView, client: Session, offset: int, delay_ms: int) -> None: ...

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


class WriteGate(Protocol):
    """What cluster mode puts in front of a topic partition's appends (``nsqx.cluster``'s
    leader, follower and unknown-topic gates); None standalone."""

    # a follower's gate: a publish it refuses goes to the leader (``forward``), and the
    # leader checks idempotency marks, not this node
    forwards: bool

    def refuse(self, topic: TopicView, count: int) -> str | None:
        """A reason to refuse this publish, or None to take it."""

    def wrap(self, topic: TopicView, end_offset: int, done: Callable[[int, Exception | None], None]
             ) -> Callable[[int, Exception | None], None]:
        """A completion that calls ``done`` once the append up to ``end_offset`` is replicated."""

    def refuse_consumers(self, topic: TopicView) -> str | None:
        """A reason this partition may not deliver to new subscribers here, or None."""

    def forward(self, topic: TopicView, bodies: list[bytes], defer_ms: int,
                done: Callable[[int, Exception | None], None],
                headers: list[dict[str, bytes] | None] | None = None,
                on_replayed: Callable[[], None] | None = None) -> bool:
        """Send a refused publish to the leader, which acks it through ``done``; False when
        it was not sent (the publish is then refused). ``on_replayed`` is called before
        ``done`` when the leader found the batch's mark stored already."""


class TopicView(Protocol):
    """One topic partition (``topic.Topic``) as its channels and the services see it."""

    nsqd: NodeContext
    gate: WriteGate | None
    epoch: int
    hold_reads: bool
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
    clients: dict[int, Session]
    ordered: bool
    dirty: bool
    max_attempts: int
    dlq_count: int
    expired_count: int
    tags: Any

    @property
    def confirmed(self) -> int:
        """Everything below this offset is finished."""

    @property
    def in_flight_count(self) -> int: ...

    def skip_to(self, offset: int) -> int:
        """Treat everything below ``offset`` as finished; how many that skipped."""

    def wake(self) -> None: ...

    def end_offset(self) -> int:
        """Where fresh delivery stops now (readable end; a paused topic: none)."""

    def send(self, client: Session, deliveries: list[Delivery]) -> None:
        """Write ``deliveries`` (taken from the cursor for ``client``) to its socket."""

    def finish_held(self, holder: int, offsets: Iterable[int]) -> None:
        """Finish the ``offsets`` ``holder`` still has in flight (dead-lettered, expired)."""

    def take_held(self, holder: int, want: int, end: int, now: int, hold_ms: int
                  ) -> list[Delivery]:
        """Take up to ``want`` messages below ``end`` in flight for ``holder`` (tag dispatch)."""

    def hand_over(self, offset: int, holder: int, client: Session, now: int) -> None:
        """Give ``client`` a message ``holder`` has in flight (NotInFlight / NotOwner if not)."""


class ReplicaChannel(Protocol):
    """A channel (``channel.Channel``) as cluster replication mirrors it: the follower
    follows the leader's confirmed offset and never writes the cursor itself."""

    name: str

    @property
    def confirmed(self) -> int:
        """Everything below is finished."""

    def mirror_confirmed(self, confirmed: int) -> None:
        """Move to the leader's confirmed offset (back: a reset; forward: a skip)."""


class ReplicaPartition(Protocol):
    """A topic partition (``topic.Topic``) as cluster mode drives it: the gate in front of
    its appends, the leader epoch stamped on commits, and the readable end (the high
    watermark) its channels deliver below. Cluster code calls these; it never writes the
    fields."""

    name: str
    partition: int
    partitions: list[Any]
    channels: dict[str, Any]
    ephemeral: bool
    log: Any
    committer: Any
    gate: WriteGate | None
    epoch: int
    hold_reads: bool
    readable_end: int

    def attach_gate(self, gate: WriteGate, epoch: int | None = None) -> None:
        """Put ``gate`` in front of the appends (and stamp ``epoch`` on commits from now on);
        reads are held below the high watermark (``hold_reads_from_start``)."""

    def hold_reads_from_start(self) -> None:
        """Channels read below the high watermark only; not known yet: the log start."""

    def advance_readable(self, end: int) -> None:
        """Channels may now read below ``end`` (the high watermark moved)."""

    def truncate_to(self, offset: int) -> None:
        """Drop the log from ``offset`` on (a diverged tail) and what channels could read of it."""

    def restore_deferred(self) -> int:
        """On becoming leader: defer again the DPUBs whose due time is ahead."""

    def get_channel(self, name: str, create: bool = True) -> Any: ...


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
    # cluster mode: /topic/delete is the cluster's operation (set by the member that runs it)
    topic_delete_hook: Callable[[str], Awaitable[bool]] | None
    # extensions that add routes to the HTTP app (cluster mode's replication API)
    http_route_hooks: list[Callable[[Any], None]]
    # --workers > 1: this worker's link to the others (nsqx.nsqd.workers.runtime): owned(),
    # forward(), hand_over(); None in a one-process node
    workers: Any

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

    async def create_routed_topic(self, name: str, count: int, logical: int,
                                  label: str) -> Any:
        """A new route-managed topic (``nsqd.routing.TopicRoutes``, loaded on first use)."""

    def set_lookupd_tcp_addresses(self, addrs: list[str]) -> None: ...

    def stats_dict(self, topic: str | None = None, channel: str | None = None,
                   include_clients: bool = True, include_mem: bool = True) -> dict[str, Any]: ...
