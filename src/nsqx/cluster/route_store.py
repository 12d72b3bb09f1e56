"""Route histories of route-managed ordered topics in etcd (cluster mode).

The standalone nsqd keeps a topic's :class:`~nsqx.protocol.routes.RouteHistory` in a file
(:class:`nsqx.nsqd.routing.FileRouteStore`); a cluster keeps it at
``<root>routes/<topic>`` (:func:`~nsqx.protocol.routes.routes_key`) and replaces it only with
a transaction comparing the key's mod revision with the one this store last read or wrote,
so two coordinators (one that just lost its lease and its successor) can never both move a
route: the loser gets :class:`~nsqx.nsqd.routing.RouteConflict`, re-reads and decides again.
The history's own rules (versions +1, one pending change at a time, pending -> seal ->
commit) are checked by ``RouteHistory`` before anything is written.

The cross-node consumer barrier lives beside it: ``<root>route_passed/<topic>/<channel>/<p>``
says that channel ``channel`` consumed the command message of physical partition ``p``
(written by the node leading ``p``, once per change and channel; read by every node through
its member's watch). See ``docs/design-notes.md`` §Route changes in a cluster.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from nsqx.cluster.etcd import Compare, EtcdClient, Op
from nsqx.nsqd.routing import RouteConflict
from nsqx.protocol.names import valid_name
from nsqx.protocol.routes import RouteError, RouteHistory, routes_key

__all__ = ["EtcdRouteStore", "HeldResets", "ResetRecord", "parse_pass_key", "parse_reset_key", "pass_key",
           "passes_prefix", "reset_key", "resets_prefix", "routes_prefix"]


class EtcdRouteStore:
    """One topic's history at ``<root>routes/<topic>``, replaced with a CAS on its mod
    revision. :meth:`fetch` reads it; :meth:`load` gives what was last read or written
    (the ``RouteStore`` protocol of :mod:`nsqx.nsqd.routing`)."""

    def __init__(self, etcd: EtcdClient, root: bytes, topic: str) -> None:
        self.etcd = etcd
        self.topic = topic
        self.key = routes_key(root, topic)
        self._current: RouteHistory | None = None
        self._mod = 0  # mod revision of what _current was read as (0: absent)

    async def fetch(self) -> RouteHistory | None:
        kv = await self.etcd.get(self.key)
        if kv is None:
            self._current, self._mod = None, 0
        else:
            self._current, self._mod = RouteHistory.from_json(kv.value), kv.mod_revision
        return self._current

    def load(self) -> RouteHistory | None:
        return self._current

    def compare(self) -> Compare:
        """The condition a write of this key must hold (for callers adding ops to the txn)."""
        return (Compare.absent(self.key) if self._mod == 0
                else Compare.mod_revision(self.key, self._mod))

    async def replace(self, old: RouteHistory | None, new: RouteHistory,
                      extra: Sequence[Op] = ()) -> None:
        """Store ``new`` if the stored history is still ``old``, with ``extra`` ops in the
        same transaction (the partitions a change creates). RouteConflict if not."""
        if new.topic != self.topic:
            raise RouteError(f"route history of {new.topic} given to the store of {self.topic}")
        if self._current != old:
            raise RouteConflict(f"topic {self.topic}: the stored route history changed "
                                f"meanwhile")
        won, rev = await self.etcd.txn([self.compare()],
                                       [Op.put(self.key, new.to_json()), *extra])
        if not won:
            await self.fetch()
            raise RouteConflict(f"topic {self.topic}: the route history in etcd changed "
                                f"meanwhile (now version {self._newest()})")
        self._current, self._mod = new, rev

    def _newest(self) -> str:
        h = self._current
        if h is None:
            return "none"
        return f"{h.newest.version}" + (f", pending {h.pending.version}" if h.pending else "")


def routes_prefix(root: bytes) -> bytes:
    return root + b"routes/"


def passes_prefix(root: bytes) -> bytes:
    return root + b"route_passed/"


def pass_key(root: bytes, topic: str, channel: str, partition: int) -> bytes:
    """``<root>route_passed/<topic>/<channel>/<p>``: ``channel`` consumed p's command message."""
    if not valid_name(topic) or not valid_name(channel):
        raise RouteError(f"invalid topic or channel name {topic!r}/{channel!r}")
    return passes_prefix(root) + f"{topic}/{channel}/{partition}".encode()


def parse_pass_key(root: bytes, key: bytes) -> tuple[str, str, int] | None:
    """(topic, channel, partition) of a :func:`pass_key`, None if it is not one."""
    prefix = passes_prefix(root)
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix):].decode(errors="replace").split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


def resets_prefix(root: bytes) -> bytes:
    return root + b"route_reset/"


def reset_key(root: bytes, topic: str, channel: str) -> bytes:
    """``<root>route_reset/<topic>/<channel>``: the channel's last cluster reset
    (:class:`ResetRecord`), written by the coordinator in the same transaction that clears
    the channel's pass keys of the versions it walks again."""
    if not valid_name(topic) or not valid_name(channel):
        raise RouteError(f"invalid topic or channel name {topic!r}/{channel!r}")
    return resets_prefix(root) + f"{topic}/{channel}".encode()


def parse_reset_key(root: bytes, key: bytes) -> tuple[str, str] | None:
    prefix = resets_prefix(root)
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix):].decode(errors="replace").split("/")
    return (parts[0], parts[1]) if len(parts) == 2 else None


@dataclass(frozen=True, slots=True)
class ResetRecord:
    """A channel reset across the cluster: ``gen`` grows by one per reset of the channel;
    the channel restarts on route ``version``, each physical partition's cursor at
    ``offsets[p]`` (set by p's leader), and ``passed`` are the retired partitions whose
    command message that position is already beyond (their pass keys stay)."""

    gen: int
    version: int
    offsets: dict[int, int]
    passed: frozenset[int]

    def to_json(self) -> bytes:
        return orjson.dumps({"gen": self.gen, "version": self.version,
                             "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
                             "passed": sorted(self.passed)})

    @classmethod
    def from_json(cls, raw: bytes) -> ResetRecord:
        try:
            d = orjson.loads(raw)
            rec = cls(int(d["gen"]), int(d["version"]),
                      {int(p): int(o) for p, o in d["offsets"].items()},
                      frozenset(int(p) for p in d["passed"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise RouteError(f"bad channel reset record: {e!r:.80}") from None
        if rec.gen < 1 or rec.version < 0:
            raise RouteError("bad channel reset record: gen >= 1 and version >= 0")
        return rec


class HeldResets:
    """The channels this node holds for a cluster reset, kept in a file beside the node's
    data so that a hold survives a restart.

    A node restarted between the coordinator's *prepare* (hold) and *apply* lost its
    in-memory hold; if it comes back after the coordinator stopped retrying the apply, its
    channel would keep the barrier state from before the reset. With the hold on disk, the
    node's first route sync after the start (:meth:`restored`) still knows it was held and
    applies the reset record it finds in etcd, or drops the hold if no newer record came
    (the coordinator gave the reset up)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.marks: set[tuple[str, str]] = set()
        try:
            self.marks = {(t, c) for t, c in orjson.loads(path.read_bytes())}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError):
            pass  # unreadable: forget it (the in-memory holds still work)
        self._restored = set(self.marks)  # held when the node stopped; settled once each

    def add(self, topic: str, channel: str) -> None:
        if (topic, channel) not in self.marks:
            self.marks.add((topic, channel))
            self._save()

    def discard(self, topic: str, channel: str) -> None:
        self._restored.discard((topic, channel))
        if (topic, channel) in self.marks:
            self.marks.discard((topic, channel))
            self._save()

    def restored(self, topic: str) -> set[str]:
        """The topic's channels that were held when the node stopped, once: the caller
        applies a newer reset record or none, and either way the hold is over."""
        found = {c for t, c in self._restored if t == topic}
        for c in found:
            self.discard(topic, c)
        return found

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(sorted(self.marks)))
        os.replace(tmp, self.path)
