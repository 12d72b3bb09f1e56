"""Key -> partition hashing and an ordered topic's route history (logical partitions mapped by
ranges onto physical ones).

These are protocol-level facts that producers (:mod:`nsqx.client`), servers (:mod:`nsqx.nsqd`)
and the cluster (:mod:`nsqx.cluster`) must agree on, so they live below all of them.
Pure values, no IO (QMQ's design, ``DESIGN.md`` §Ordered partitions that can change). Why
each rule exists:

* A key hashes to one of ``logical`` partitions (default 1024) with the same CRC-32 as
  :func:`key_partition`; that count never changes, so a key's logical
  partition never changes, and only the range table decides where it goes.
* Version ``v`` maps contiguous ranges ``[lo, hi)`` covering ``0..logical`` exactly onto
  physical partitions, each on a node. Versions grow by exactly one per change.
* Every change **creates new physical partitions** for the ranges it touches and retires the
  ones it replaces (split: 1 -> 2 new, merge: 2 adjacent -> 1 new, move: 1 -> 1 new on another
  node). Physical ids are never reused and a physical partition's range and node never
  change, so each one lives for one contiguous run of versions and its log holds its keys'
  messages of exactly that run, ended by one command message. That keeps the consumer
  barrier (:mod:`nsqx.protocol.barrier`) one uniform rule: read version v+1's new partitions
  after the command message of every partition v+1 retires.
* One change at a time: a change is first *pending* (stored so a coordinator that fails over
  finds it and rolls it forward), the retired partitions get their command messages, then
  :meth:`RouteHistory.commit` makes it the newest version (a CAS on ``routes/<topic>``).

Every refusal is a :class:`RouteError` whose text is meant for the operator.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from nsqx.protocol.names import is_ephemeral, valid_name
from nsqx.protocol.v2 import StartKind, StartPosition

__all__ = [
    "DEFAULT_LOGICAL",
    "MAX_PHYSICAL",
    "Change",
    "Route",
    "RouteError",
    "RouteHistory",
    "RouteVersion",
    "command_body",
    "key_partition",
    "logical_partition",
    "parse_command",
    "routes_key",
]

DEFAULT_LOGICAL = 1024
MAX_LOGICAL = 65536
MAX_PHYSICAL = 65535  # message ids carry the partition in 16 bits
_COMMAND_KEY = "nsqx_route_change"


class RouteError(ValueError):
    """A route operation or stored route that the rules refuse (the text is for the operator)."""


def key_partition(key: bytes | str, partitions: int) -> int:
    """The partition of a key: CRC-32 (zlib's, IEEE) of its UTF-8 bytes modulo the count.

    Stable across processes, machines and versions, so producers in any language can
    agree on it (``crc32(key) % partitions``).
    """
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    data = key.encode() if isinstance(key, str) else bytes(key)
    return zlib.crc32(data) % partitions


def logical_partition(key: bytes | str, logical: int = DEFAULT_LOGICAL) -> int:
    """A key's logical partition: the producer's ``crc32(key) % logical``, never anything else."""
    return key_partition(key, logical)


@dataclass(frozen=True, slots=True)
class Route:
    """Logical partitions ``[lo, hi)`` live in physical ``partition`` on ``node``."""

    lo: int
    hi: int
    partition: int
    node: str


@dataclass(frozen=True, slots=True)
class Change:
    """What one version changed: the partitions it retired and the ones it created.

    ``version`` is the version the change produces; ``kind`` is ``split``, ``merge`` or
    ``move``. The retired partitions are the ones whose command messages a channel must
    consume before it reads the created ones.
    """

    version: int
    kind: str
    retired: tuple[int, ...]
    created: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RouteVersion:
    """One version's range table, sorted by ``lo`` (checked by :class:`RouteHistory`)."""

    version: int
    routes: tuple[Route, ...]
    committed_ms: int = 0  # wall clock of the commit (0: unknown); reset-by-time uses it
    _los: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _by_partition: dict[int, Route] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_los", tuple(r.lo for r in self.routes))
        object.__setattr__(self, "_by_partition", {r.partition: r for r in self.routes})

    @property
    def partitions(self) -> tuple[int, ...]:
        """Physical partition ids in logical order."""
        return tuple(r.partition for r in self.routes)

    def lookup(self, logical: int) -> Route:
        """The route holding a logical partition (bisect over the ranges)."""
        if not self.routes or not 0 <= logical < self.routes[-1].hi:
            raise RouteError(f"logical partition {logical} out of range")
        return self.routes[bisect.bisect_right(self._los, logical) - 1]

    def get(self, partition: int) -> Route | None:
        return self._by_partition.get(partition)


def _diff(old: RouteVersion, new: RouteVersion) -> Change:
    """The change from ``old`` to ``new``; RouteError unless it is one split, merge or move."""
    old_p, new_p = set(old.partitions), set(new.partitions)
    retired = tuple(sorted(old_p - new_p))
    created = tuple(sorted(new_p - old_p))
    where = f"route version {new.version}"
    for p in old_p & new_p:
        if old.get(p) != new.get(p):
            raise RouteError(f"{where}: partition {p} changed its range or node (ids are "
                             f"never reused; a change creates new partitions)")
    if not retired and not created:
        raise RouteError(f"{where}: changes nothing")
    span = sorted((old._by_partition[p].lo, old._by_partition[p].hi) for p in retired)
    new_span = sorted((new._by_partition[p].lo, new._by_partition[p].hi) for p in created)

    def cover(spans: list[tuple[int, int]]) -> tuple[int, int] | None:
        if not spans or any(a[1] != b[0] for a, b in zip(spans, spans[1:], strict=False)):
            return None
        return spans[0][0], spans[-1][1]

    if cover(span) is None or cover(span) != cover(new_span):
        raise RouteError(f"{where}: the created partitions must cover exactly the contiguous "
                         f"ranges of the retired ones")
    if len(retired) == 1 and len(created) == 2:
        kind = "split"
    elif len(retired) == 2 and len(created) == 1:
        kind = "merge"
    elif len(retired) == 1 and len(created) == 1:
        kind = "move"
        if old._by_partition[retired[0]].node == new._by_partition[created[0]].node:
            raise RouteError(f"{where}: a move must change the node")
    else:
        raise RouteError(f"{where}: retires {list(retired)} and creates {list(created)}; one "
                         f"change per version (split 1->2, merge 2->1, move 1->1)")
    return Change(new.version, kind, retired, created)


def _check_version(v: RouteVersion, logical: int) -> None:
    where = f"route version {v.version}"
    if not v.routes:
        raise RouteError(f"{where}: no ranges")
    expect = 0
    seen: set[int] = set()
    for r in v.routes:
        if r.lo != expect:
            raise RouteError(f"{where}: ranges must be contiguous from 0: "
                             f"{'gap' if r.lo > expect else 'overlap'} at logical {expect}")
        if r.hi <= r.lo:
            raise RouteError(f"{where}: empty range [{r.lo}, {r.hi})")
        if not 0 <= r.partition <= MAX_PHYSICAL:
            raise RouteError(f"{where}: physical partition {r.partition} not in 0..{MAX_PHYSICAL}")
        if r.partition in seen:
            raise RouteError(f"{where}: physical partition {r.partition} holds two ranges")
        if not r.node or len(r.node) > 255:
            raise RouteError(f"{where}: partition {r.partition} has no valid node")
        seen.add(r.partition)
        expect = r.hi
    if expect != logical:
        raise RouteError(f"{where}: ranges end at {expect}, not at {logical}")


@dataclass(frozen=True, slots=True)
class RouteHistory:
    """All versions of one ordered topic's routes, plus the one pending change (if any).

    Operations return a new history (the etcd value is replaced with a CAS); the constructor
    checks every rule, so a history read from anywhere is either valid or a RouteError.
    """

    topic: str
    logical: int
    versions: tuple[RouteVersion, ...]
    next_partition: int
    pending: RouteVersion | None = None
    _changes: dict[int, Change] = field(init=False, repr=False, compare=False)
    _born: dict[int, int] = field(init=False, repr=False, compare=False)
    _retired: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not valid_name(self.topic) or is_ephemeral(self.topic):
            raise RouteError(f"invalid topic name {self.topic!r}")
        if not 1 <= self.logical <= MAX_LOGICAL:
            raise RouteError(f"logical partition count must be 1..{MAX_LOGICAL}, "
                             f"got {self.logical}")
        if not self.versions:
            raise RouteError("a route history needs version 0")
        changes: dict[int, Change] = {}
        born: dict[int, int] = {}
        retired: dict[int, int] = {}
        chain = self.versions + ((self.pending,) if self.pending is not None else ())
        prev: RouteVersion | None = None
        for v in chain:
            want = 0 if prev is None else prev.version + 1
            if v.version != want:
                raise RouteError(f"route versions must start at 0 and grow by one: "
                                 f"expected {want}, got {v.version}")
            _check_version(v, self.logical)
            if prev is None:
                born.update((p, 0) for p in v.partitions)
            else:
                ch = _diff(prev, v)
                for p in ch.created:
                    if p in born:
                        raise RouteError(f"route version {v.version}: physical partition {p} "
                                         f"reused (ids are never reused)")
                    born[p] = v.version
                retired.update((p, v.version) for p in ch.retired)
                changes[v.version] = ch
            prev = v
        if born and self.next_partition <= max(born):
            raise RouteError(f"next partition id {self.next_partition} is not above the "
                             f"highest used ({max(born)})")
        if self.next_partition > MAX_PHYSICAL + 1:
            raise RouteError(f"next partition id {self.next_partition} exceeds {MAX_PHYSICAL}")
        object.__setattr__(self, "_changes", changes)
        object.__setattr__(self, "_born", born)
        object.__setattr__(self, "_retired", retired)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def initial(cls, topic: str, nodes: Sequence[str], logical: int = DEFAULT_LOGICAL,
                now_ms: int = 0) -> RouteHistory:
        """Version 0: ``len(nodes)`` physical partitions 0..P-1 over equal ranges, in order."""
        if not 1 <= len(nodes) <= logical:
            raise RouteError(f"need 1..{logical} physical partitions, got {len(nodes)}")
        n = len(nodes)
        routes = tuple(Route(i * logical // n, (i + 1) * logical // n, i, node)
                       for i, node in enumerate(nodes))
        return cls(topic, logical, (RouteVersion(0, routes, now_ms),), n)

    # -- reading --------------------------------------------------------------------------------
    @property
    def newest(self) -> RouteVersion:
        """The newest committed version: the one producers route by."""
        return self.versions[-1]

    def version(self, v: int) -> RouteVersion:
        """A committed version (RouteError if it does not exist)."""
        if not 0 <= v < len(self.versions):
            raise RouteError(f"topic {self.topic}: no route version {v} "
                             f"(newest is {self.newest.version})")
        return self.versions[v]

    def change(self, v: int) -> Change:
        """The change that produced version ``v`` (committed or pending), ``v >= 1``."""
        ch = self._changes.get(v)
        if ch is None:
            raise RouteError(f"topic {self.topic}: no change produced route version {v}")
        return ch

    def created_in(self, partition: int) -> int | None:
        """The version that created a physical partition (pending included), None if unknown."""
        return self._born.get(partition)

    def retired_in(self, partition: int) -> int | None:
        """The version that retires a physical partition (pending included), None if open."""
        return self._retired.get(partition)

    def open_partitions(self) -> tuple[int, ...]:
        """Partitions a publish may use: the newest version's, minus those a pending change
        retires (they are sealed or about to be). Keyless publishes pick any of them."""
        gone = set(self.pending_change.retired) if self.pending_change else set()
        return tuple(p for p in self.newest.partitions if p not in gone)

    @property
    def pending_change(self) -> Change | None:
        return None if self.pending is None else self._changes[self.pending.version]

    def route(self, key: bytes | str) -> Route:
        """Where a keyed publish goes: the key's logical partition in the newest version."""
        return self.newest.lookup(logical_partition(key, self.logical))

    def version_at(self, ms: int) -> int:
        """The version current at wall-clock ``ms`` (the newest committed at or before it)."""
        v = 0
        for rv in self.versions:
            if rv.committed_ms <= ms:
                v = rv.version
            else:
                break
        return v

    def restart_version(self, pos: StartPosition) -> int:
        """The version a channel reset to ``pos`` walks the versions again from: 0 for
        earliest (no partition is deleted yet), the newest for latest, the one current at a
        timestamp. A per-partition offset has no meaning across partitions: RouteError."""
        if pos.kind is StartKind.EARLIEST:
            return 0
        if pos.kind is StartKind.LATEST:
            return self.newest.version
        if pos.kind is StartKind.TIMESTAMP:
            return self.version_at(pos.value * 1000)
        raise RouteError(f"topic {self.topic} is route-managed: reset a channel to earliest, "
                         f"latest or a timestamp, not to a partition's {pos.kind}")

    # -- changes --------------------------------------------------------------------------------
    def _base(self, op: str, expect: int | None) -> RouteVersion:
        if self.pending is not None:
            ch = self._changes[self.pending.version]
            raise RouteError(f"topic {self.topic}: {ch.kind} to route version "
                             f"{ch.version} is still pending; one change at a time ({op} "
                             f"refused)")
        if expect is not None and expect != self.newest.version:
            raise RouteError(f"topic {self.topic}: stale route version {expect}, newest is "
                             f"{self.newest.version} ({op} refused)")
        return self.newest

    def _route_of(self, base: RouteVersion, partition: int) -> Route:
        r = base.get(partition)
        if r is None:
            gone = self._retired.get(partition)
            why = (f"retired in version {gone}" if gone is not None else "unknown")
            raise RouteError(f"topic {self.topic}: partition {partition} is not in route "
                             f"version {base.version} ({why})")
        return r

    def _ids(self, n: int) -> list[int]:
        if self.next_partition + n - 1 > MAX_PHYSICAL:
            raise RouteError(f"topic {self.topic}: physical partition ids exhausted")
        return list(range(self.next_partition, self.next_partition + n))

    def _propose(self, base: RouteVersion, old: Sequence[Route], new: Sequence[Route],
                 used: int) -> RouteHistory:
        keep = [r for r in base.routes if r not in old]
        routes = tuple(sorted(keep + list(new), key=lambda r: r.lo))
        pending = RouteVersion(base.version + 1, routes)
        return replace(self, pending=pending, next_partition=self.next_partition + used)

    def split(self, partition: int, at: int, nodes: tuple[str, str] | None = None,
              expect: int | None = None) -> RouteHistory:
        """Split ``partition``'s range ``[lo, hi)`` at ``lo < at < hi`` into two new physical
        partitions (on ``nodes``, default the old one's node)."""
        base = self._base("split", expect)
        r = self._route_of(base, partition)
        if not r.lo < at < r.hi:
            raise RouteError(f"topic {self.topic}: cannot split partition {partition} "
                             f"[{r.lo}, {r.hi}) at {at}: the boundary must be strictly inside")
        n1, n2 = nodes if nodes is not None else (r.node, r.node)
        a, b = self._ids(2)
        return self._propose(base, [r], [Route(r.lo, at, a, n1), Route(at, r.hi, b, n2)], 2)

    def merge(self, a: int, b: int, node: str | None = None,
              expect: int | None = None) -> RouteHistory:
        """Merge two physical partitions with adjacent ranges into one new partition (on
        ``node``, default the lower range's node)."""
        base = self._base("merge", expect)
        if a == b:
            raise RouteError(f"topic {self.topic}: cannot merge partition {a} with itself")
        ra, rb = sorted((self._route_of(base, a), self._route_of(base, b)), key=lambda r: r.lo)
        if ra.hi != rb.lo:
            raise RouteError(f"topic {self.topic}: partitions {a} and {b} are not adjacent "
                             f"([{ra.lo}, {ra.hi}) and [{rb.lo}, {rb.hi})); merge only "
                             f"neighbouring ranges")
        (c,) = self._ids(1)
        return self._propose(base, [ra, rb], [Route(ra.lo, rb.hi, c, node or ra.node)], 1)

    def move(self, partition: int, node: str, expect: int | None = None) -> RouteHistory:
        """Move a partition's range to a new physical partition on another node."""
        base = self._base("move", expect)
        r = self._route_of(base, partition)
        if node == r.node:
            raise RouteError(f"topic {self.topic}: partition {partition} is already on {node}")
        (c,) = self._ids(1)
        return self._propose(base, [r], [Route(r.lo, r.hi, c, node)], 1)

    def commit(self, version: int, now_ms: int = 0) -> RouteHistory:
        """Make the pending change the newest version. Call it only after every retired
        partition holds its command message (so none accepts an old-route publish)."""
        if self.pending is None:
            raise RouteError(f"topic {self.topic}: no pending change to commit")
        if version != self.pending.version:
            raise RouteError(f"topic {self.topic}: pending change is route version "
                             f"{self.pending.version}, not {version}")
        done = replace(self.pending, committed_ms=now_ms)
        return replace(self, versions=self.versions + (done,), pending=None)

    def abort(self) -> RouteHistory:
        """Drop the pending change. Only safe before any command message was appended: once
        one was, the change must be rolled forward (its partition refuses publishes). The
        ids it took stay used: the new partitions may already exist on their nodes."""
        if self.pending is None:
            raise RouteError(f"topic {self.topic}: no pending change to abort")
        return replace(self, pending=None)

    # -- storage --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        def ver(v: RouteVersion) -> dict[str, Any]:
            return {"version": v.version, "committed_ms": v.committed_ms,
                    "routes": [[r.lo, r.hi, r.partition, r.node] for r in v.routes]}

        return {"topic": self.topic, "logical": self.logical,
                "next_partition": self.next_partition,
                "versions": [ver(v) for v in self.versions],
                "pending": None if self.pending is None else ver(self.pending)}

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes | str) -> RouteHistory:
        """Parse and check a stored history; anything malformed is a RouteError."""
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise RouteError(f"route history is not JSON: {exc}") from None
        if not isinstance(d, dict):
            raise RouteError("route history must be a JSON object")
        versions = d.get("versions")
        if not isinstance(versions, list):
            raise RouteError("route history: 'versions' must be a list")
        pending = d.get("pending")
        return cls(_str(d.get("topic"), "topic"), _int(d.get("logical"), "logical"),
                   tuple(_ver(v) for v in versions),
                   _int(d.get("next_partition"), "next_partition"),
                   None if pending is None else _ver(pending))


def _int(x: object, what: str) -> int:
    if type(x) is not int:
        raise RouteError(f"route history: {what} must be an integer, got {x!r:.40}")
    return x


def _str(x: object, what: str) -> str:
    if not isinstance(x, str):
        raise RouteError(f"route history: {what} must be a string, got {x!r:.40}")
    return x


def _ver(v: object) -> RouteVersion:
    if not isinstance(v, dict) or not isinstance(v.get("routes"), list):
        raise RouteError("route history: a version must be an object with a 'routes' list")
    routes = []
    for r in v["routes"]:
        if not isinstance(r, list) or len(r) != 4:
            raise RouteError(f"route history: a route must be [lo, hi, partition, node], "
                             f"got {r!r:.60}")
        routes.append(Route(_int(r[0], "lo"), _int(r[1], "hi"), _int(r[2], "partition"),
                            _str(r[3], "node")))
    return RouteVersion(_int(v.get("version"), "version"), tuple(routes),
                        _int(v.get("committed_ms", 0), "committed_ms"))


def routes_key(root: bytes, topic: str) -> bytes:
    """etcd key of a topic's route history: ``<root>routes/<topic>`` (``root`` is
    ``ClusterKeys.root``); written with a CAS on its mod revision, like partitions."""
    if not valid_name(topic):
        raise RouteError(f"invalid topic name {topic!r}")
    return root + b"routes/" + topic.encode()


def command_body(topic: str, change: Change) -> bytes:
    """The body of the command message appended to each retired partition (stored with an
    internal flag so clients never see it): the version it seals for and the change."""
    return orjson.dumps({_COMMAND_KEY: {"topic": topic, "version": change.version,
                                        "kind": change.kind, "retired": change.retired,
                                        "created": change.created}})


def parse_command(body: bytes) -> tuple[str, Change]:
    """(topic, change) of a command message body; RouteError if it is not one."""
    try:
        d = orjson.loads(body)[_COMMAND_KEY]
        ch = Change(_int(d["version"], "version"), _str(d["kind"], "kind"),
                    tuple(_int(p, "retired") for p in d["retired"]),
                    tuple(_int(p, "created") for p in d["created"]))
        topic = _str(d["topic"], "topic")
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise RouteError(f"not a route command message: {exc!r:.80}") from None
    if ch.kind not in ("split", "merge", "move") or ch.version < 1:
        raise RouteError(f"not a route command message: {ch}")
    return topic, ch
