"""nsqlookupd's registration database (upstream ``nsqlookupd/registration_db.go``).

A *registration* is ``(category, key, subkey)``:

* ``("client", "", "")``  - every identified nsqd (what ``/nodes`` lists);
* ``("topic", T, "")``    - nsqds that have topic T;
* ``("channel", T, C)``   - nsqds that have channel C of topic T.

Each registration maps peer ids (the nsqd connection's remote address) to a
:class:`Producer`. A producer wraps the :class:`Peer` (shared by all the
registrations of one connection, so a PING refreshes them all) and carries its
own tombstone: a tombstoned producer is hidden from ``/lookup`` for the
tombstone lifetime. Inactive producers (no PING for the inactive timeout) are
filtered out on read, never removed. A registration may exist without
producers (``/topic/create`` over HTTP, or after the last producer left).

``"*"`` as a key or subkey is a wildcard in the ``find_*`` queries, as upstream.
Lookups are indexed by (category, key) and by peer id, so no query scans the
whole database except the wildcard-key ones.

Single-threaded (one event loop): no locks. The clock is injected (nanoseconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from nsqx.protocol.lookup_v1 import PeerInfo

__all__ = [
    "CHANNEL",
    "CLIENT",
    "TOPIC",
    "Peer",
    "Producer",
    "Registration",
    "RegistrationDB",
    "filter_by_active",
]

CLIENT = "client"
TOPIC = "topic"
CHANNEL = "channel"

Clock = Callable[[], int]  # nanoseconds since the epoch


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str

    def is_match(self, category: str, key: str, subkey: str) -> bool:
        if category != self.category:
            return False
        if key != "*" and self.key != key:
            return False
        return subkey == "*" or self.subkey == subkey


@dataclass(eq=False)
class Peer:
    """One identified nsqd connection: its IDENTIFY info, id and last PING (ns)."""

    id: str
    info: PeerInfo
    last_update: int = 0

    def node_address(self) -> str:
        """``broadcast_address:http_port``: how ``/topic/tombstone?node=`` names it."""
        return f"{self.info.broadcast_address}:{self.info.http_port}"


@dataclass(eq=False)
class Producer:
    """A peer inside one registration, with that registration's tombstone."""

    peer: Peer
    tombstoned: bool = False
    tombstoned_at: int = 0  # ns; 0 = never

    def tombstone(self, now_ns: int) -> None:
        self.tombstoned = True
        self.tombstoned_at = now_ns

    def is_tombstoned(self, lifetime_ns: int, now_ns: int) -> bool:
        return self.tombstoned and now_ns - self.tombstoned_at < lifetime_ns


@dataclass
class RegistrationDB:
    clock: Clock = field(default=time.time_ns)
    # category -> key -> subkey -> {peer id: Producer}
    _db: dict[str, dict[str, dict[str, dict[str, Producer]]]] = field(default_factory=dict)
    # peer id -> its registrations (insertion ordered)
    _by_peer: dict[str, dict[Registration, None]] = field(default_factory=dict)

    # ------------------------------------------------------------------ writes
    def add_registration(self, reg: Registration) -> None:
        """Make ``reg`` exist (no producer needed)."""
        self._db.setdefault(reg.category, {}).setdefault(reg.key, {}).setdefault(reg.subkey, {})

    def add_producer(self, reg: Registration, producer: Producer) -> bool:
        """Add a producer; False (and the old one kept, tombstone and all) if already there."""
        producers = (
            self._db.setdefault(reg.category, {}).setdefault(reg.key, {}).setdefault(reg.subkey, {})
        )
        pid = producer.peer.id
        if pid in producers:
            return False
        producers[pid] = producer
        self._by_peer.setdefault(pid, {})[reg] = None
        return True

    def remove_producer(self, reg: Registration, peer_id: str) -> tuple[bool, int]:
        """-> (was it there, producers left). The registration stays, even empty."""
        producers = self._producers_of(reg)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._unindex(peer_id, reg)
        return removed, len(producers)

    def remove_registration(self, reg: Registration) -> None:
        """Drop a registration and all its producers."""
        keys = self._db.get(reg.category)
        if keys is None:
            return
        subkeys = keys.get(reg.key)
        if subkeys is None:
            return
        producers = subkeys.pop(reg.subkey, None)
        if not subkeys:
            del keys[reg.key]
        if producers:
            for pid in producers:
                self._unindex(pid, reg)

    def _unindex(self, peer_id: str, reg: Registration) -> None:
        regs = self._by_peer.get(peer_id)
        if regs is not None:
            regs.pop(reg, None)
            if not regs:
                del self._by_peer[peer_id]

    def _producers_of(self, reg: Registration) -> dict[str, Producer] | None:
        keys = self._db.get(reg.category)
        if keys is None:
            return None
        subkeys = keys.get(reg.key)
        if subkeys is None:
            return None
        return subkeys.get(reg.subkey)

    # ------------------------------------------------------------------ reads
    def _iter(self, category: str, key: str, subkey: str
              ) -> Iterable[tuple[Registration, dict[str, Producer]]]:
        keys = self._db.get(category)
        if not keys:
            return
        if key == "*":
            key_items: Iterable[tuple[str, dict[str, dict[str, Producer]]]] = list(keys.items())
        else:
            sub = keys.get(key)
            key_items = [(key, sub)] if sub is not None else []
        for k, subkeys in key_items:
            if subkey == "*":
                for sk, producers in list(subkeys.items()):
                    yield Registration(category, k, sk), producers
            else:
                producers = subkeys.get(subkey)
                if producers is not None:
                    yield Registration(category, k, subkey), producers

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        return [reg for reg, _ in self._iter(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers of the matching registrations, one per peer id (the first found)."""
        if key != "*" and subkey != "*":
            producers = self._producers_of(Registration(category, key, subkey))
            return list(producers.values()) if producers else []
        seen: set[str] = set()
        out: list[Producer] = []
        for _, producers in self._iter(category, key, subkey):
            for pid, p in producers.items():
                if pid not in seen:
                    seen.add(pid)
                    out.append(p)
        return out

    def producer(self, reg: Registration, peer_id: str) -> Producer | None:
        producers = self._producers_of(reg)
        return producers.get(peer_id) if producers else None

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every registration ``peer_id`` is a producer of."""
        return list(self._by_peer.get(peer_id, ()))

    def items(self) -> Iterable[tuple[Registration, list[Producer]]]:
        """Every registration with its producers (for ``/debug``)."""
        for category, keys in list(self._db.items()):
            for key, subkeys in list(keys.items()):
                for subkey, producers in list(subkeys.items()):
                    yield Registration(category, key, subkey), list(producers.values())

    # ------------------------------------------------------------------ peers
    def new_peer(self, peer_id: str, info: PeerInfo) -> Peer:
        return Peer(peer_id, info, self.clock())

    def touch(self, peer: Peer) -> int:
        """A PING: refresh ``last_update``; returns the ns since the previous one."""
        now = self.clock()
        since = now - peer.last_update
        peer.last_update = now
        return since

    def remove_peer(self, peer_id: str) -> list[Registration]:
        """A closed connection: remove the peer from everything; returns what it left."""
        regs = self.lookup_registrations(peer_id)
        for reg in regs:
            self.remove_producer(reg, peer_id)
        return regs


def filter_by_active(producers: Iterable[Producer], inactive_timeout_ns: int,
                     tombstone_lifetime_ns: int, now_ns: int) -> list[Producer]:
    """Producers that PINGed within the timeout and are not tombstoned (upstream FilterByActive)."""
    return [
        p for p in producers
        if now_ns - p.peer.last_update <= inactive_timeout_ns
        and not p.is_tombstoned(tombstone_lifetime_ns, now_ns)
    ]
