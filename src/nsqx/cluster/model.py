"""The cluster's metadata as values, and where each lives in etcd.

Everything here is plain data with JSON round trips, so the coordinator, the nodes, the CLI
and the tests agree on one layout. Keys (all under ``/nsqx/<cluster-id>/``):

| key | value | written by |
|---|---|---|
| ``nodes/<node-id>`` | :class:`NodeInfo` (under the node's lease: gone when it dies) | the node |
| ``coordinator`` | id of the elected nsqlookupd (under its lease) | election |
| ``topics/<topic>`` | :class:`TopicMeta` | coordinator (create is a put-if-absent) |
| ``partitions/<topic>/<p>`` | :class:`PartitionMeta` (leader, epoch, ISR, catch-up) | coordinator, CAS on mod revision |
| ``drain/<node-id>`` | ``1`` while the node is being drained | lookupd (operator), cleared by the operator |
| ``moves/<topic>/<p>`` | :class:`MoveRequest` (one pending move per partition) | lookupd (put-if-absent), cleared by the coordinator |
| ``routes/<topic>`` | a route-managed topic's ``RouteHistory`` (:mod:`nsqx.cluster.route_store`) | coordinator, CAS on mod revision |
| ``route_passed/<topic>/<channel>/<p>`` | ``1``: the channel consumed p's command message | the node leading p |

A partition's archived files (``--archive-url``) are recorded under ``/nsqx-archive/<cluster-id>/``
(outside the root the members watch: the record grows with the archive's history), by the
partition's leader, each write a transaction conditioned on the partition key
(:mod:`nsqx.cluster.archive_fence`): ``<topic>/<p>`` holds the end of the recorded run,
``<topic>/<p>/<base, 20 digits>`` one file each.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson

from nsqx.protocol.names import is_ephemeral, valid_name

__all__ = ["ClusterKeys", "MetaError", "MoveRequest", "NodeInfo", "PartitionMeta", "TopicMeta"]


class MetaError(ValueError):
    """A request that the metadata rules refuse (the text is for the operator)."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str = ""
    cluster_address: str = ""  # the internal listener (``--cluster-address``); "": the HTTP port

    @property
    def http_address(self) -> str:
        return f"{self.broadcast_address}:{self.http_port}"

    @property
    def internal_address(self) -> str:
        """Where other members send replication and route calls to this node."""
        return self.cluster_address or self.http_address

    @property
    def tcp_address(self) -> str:
        return f"{self.broadcast_address}:{self.tcp_port}"

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> NodeInfo:
        d = orjson.loads(raw)
        return cls(str(d["id"]), str(d["broadcast_address"]), int(d["tcp_port"]),
                   int(d["http_port"]), str(d.get("version", "")),
                   str(d.get("cluster_address", "")))


@dataclass(frozen=True, slots=True)
class TopicMeta:
    name: str
    partitions: int
    replicas: int
    sync_every: int = 0  # 0: the node's --sync-every
    ordered: bool = False
    min_isr: int = 0  # 0: min(2, replicas)
    # which topic of this name (issue 28): set at creation, so a topic deleted and created
    # again is another one to replicas that kept a copy and to the archive; 0: created
    # before incarnations existed
    incarnation: int = 0

    def __post_init__(self) -> None:
        if not valid_name(self.name) or is_ephemeral(self.name):
            raise MetaError(f"invalid topic name {self.name!r} for a cluster topic")
        if not 1 <= self.partitions <= 1024:
            raise MetaError(f"partition_num must be 1..1024, got {self.partitions}")
        if not 1 <= self.replicas <= 16:
            raise MetaError(f"replicator must be 1..16, got {self.replicas}")
        if self.sync_every < 0:
            raise MetaError("syncdisk must be >= 0")
        if self.min_isr < 0 or self.min_isr > self.replicas:
            raise MetaError(f"min_isr must be 0..{self.replicas}, got {self.min_isr}")

    @property
    def effective_min_isr(self) -> int:
        return self.min_isr or min(2, self.replicas)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> TopicMeta:
        d = orjson.loads(raw)
        return cls(str(d["name"]), int(d["partitions"]), int(d["replicas"]),
                   int(d.get("sync_every", 0)), bool(d.get("ordered", False)),
                   int(d.get("min_isr", 0)), int(d.get("incarnation", 0)))


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """Who holds a partition: ``replicas`` are assigned, ``isr`` are in sync (leader first).

    Invariants (checked by :meth:`check`): leader in ISR, ISR within replicas, catch-up =
    replicas not in ISR, epoch only grows.
    """

    topic: str
    partition: int
    replicas: tuple[str, ...]
    leader: str | None
    epoch: int
    isr: tuple[str, ...]
    catchup: tuple[str, ...] = field(default=())

    def check(self) -> None:
        if len(set(self.replicas)) != len(self.replicas):
            raise MetaError(f"{self.topic}/{self.partition}: duplicate replicas {self.replicas}")
        if not set(self.isr) <= set(self.replicas):
            raise MetaError(f"{self.topic}/{self.partition}: ISR {self.isr} not within replicas")
        if self.leader is not None and self.leader not in self.isr:
            raise MetaError(f"{self.topic}/{self.partition}: leader {self.leader} not in ISR")
        if set(self.catchup) != set(self.replicas) - set(self.isr):
            raise MetaError(f"{self.topic}/{self.partition}: catch-up set is not replicas - ISR")

    def with_isr(self, isr: tuple[str, ...]) -> PartitionMeta:
        ordered = tuple(r for r in self.replicas if r in isr)
        return replace(self, isr=ordered,
                       catchup=tuple(r for r in self.replicas if r not in ordered))

    def to_json(self) -> bytes:
        d = asdict(self)
        return orjson.dumps(d)

    @classmethod
    def from_json(cls, raw: bytes) -> PartitionMeta:
        d: dict[str, Any] = orjson.loads(raw)
        return cls(str(d["topic"]), int(d["partition"]), tuple(d["replicas"]),
                   d.get("leader"), int(d["epoch"]), tuple(d["isr"]), tuple(d.get("catchup", ())))


@dataclass(frozen=True, slots=True)
class MoveRequest:
    """An operator's ``/topic/partition/move`` waiting for the coordinator to carry it out.

    A replica move (``leader_only`` false) adds ``target`` as a catch-up replica and, once it
    is in the ISR, removes ``source`` (handing leadership to ``target`` if ``source`` led).
    A leader-only move hands leadership to ``target``, already in the ISR; nothing moves.
    """

    topic: str
    partition: int
    source: str | None
    target: str
    leader_only: bool = False

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> MoveRequest:
        d = orjson.loads(raw)
        src = d.get("source")
        return cls(str(d["topic"]), int(d["partition"]), None if src is None else str(src),
                   str(d["target"]), bool(d.get("leader_only", False)))


class ClusterKeys:
    """etcd key names for one cluster id."""

    def __init__(self, cluster_id: str) -> None:
        if not cluster_id or "/" in cluster_id:
            raise MetaError(f"invalid cluster id {cluster_id!r}")
        self.root = f"/nsqx/{cluster_id}/".encode()

    @property
    def nodes(self) -> bytes:
        return self.root + b"nodes/"

    def node(self, node_id: str) -> bytes:
        return self.nodes + node_id.encode()

    @property
    def coordinator(self) -> bytes:
        return self.root + b"coordinator"

    @property
    def topics(self) -> bytes:
        return self.root + b"topics/"

    def topic(self, name: str) -> bytes:
        return self.topics + name.encode()

    @property
    def partitions(self) -> bytes:
        return self.root + b"partitions/"

    def topic_partitions(self, name: str) -> bytes:
        return self.partitions + name.encode() + b"/"

    def partition(self, name: str, p: int) -> bytes:
        return self.topic_partitions(name) + str(p).encode()

    @property
    def archive_root(self) -> bytes:
        """Archive records (see module doc): not under ``root``, so not in the members' watch."""
        return b"/nsqx-archive/" + self.root[len(b"/nsqx/"):]

    def archive_topic(self, name: str) -> bytes:
        return self.archive_root + name.encode() + b"/"

    def archive_head(self, name: str, p: int) -> bytes:
        """The end of partition p's recorded run of archived files."""
        return self.archive_topic(name) + str(p).encode()

    def archive_files(self, name: str, p: int) -> bytes:
        """The prefix of partition p's recorded files (``<base, 20 digits>`` each)."""
        return self.archive_head(name, p) + b"/"

    @property
    def moves(self) -> bytes:
        return self.root + b"moves/"

    def move(self, name: str, p: int) -> bytes:
        return self.moves + name.encode() + b"/" + str(p).encode()
