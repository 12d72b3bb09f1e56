"""The server-enforced consumer barrier of ordered topics whose routes change. Pure, no IO.

Why it is enough for per-key order: a key's messages before a change are all in the
partition the change retires, ending before its command message (that partition refuses
every publish once the command is in, and the new route is committed only after); its
messages after the change are only in partitions the change created. So a channel that reads
version v+1's new partitions only after it has consumed the command message of *every*
partition v+1 retires (a merge has two) sees each key's messages in publish order, with no
cooperation from the client. nsqd's channel code keeps one :class:`ChannelRoute` per channel
(persisted beside its cursors) and asks:

* :func:`readable_partitions` - which partitions may deliver to the channel now;
* :func:`on_command_fin` - the channel consumed a partition's command message (or its cursor
  was placed beyond it), which may advance it;
* :func:`advance` - after a route commit, move channels whose barrier is already met;
* :func:`can_retire` - whether an old partition may be deleted (every channel passed it);
* :func:`check_publish_version` - the publish side: a sealed partition refuses.

Versions advance one at a time: each step checks its own barrier; :func:`advance` may take
several steps in one call when the later barriers were met early (a partition's command for
v+2 can be consumed while the channel is still on v).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from .routes import RouteError, RouteHistory

__all__ = [
    "ChannelRoute",
    "StaleRoute",
    "advance",
    "can_retire",
    "check_publish_version",
    "oldest_start",
    "on_command_fin",
    "readable_partitions",
    "start",
]


class StaleRoute(RouteError):
    """A publish to a sealed partition; ``version`` is the route version that replaced it, so
    the producer refreshes its route to at least that version and retries."""

    code = "E_BAD_PARTITION"

    def __init__(self, partition: int, version: int) -> None:
        self.partition = partition
        self.version = version
        super().__init__(f"E_BAD_PARTITION route version {version}")


@dataclass(frozen=True, slots=True)
class ChannelRoute:
    """A channel's place in the route history: the ``version`` it reads, and the partitions of
    that version (or later ones' retirees still open in it) whose command message it has
    consumed - ``passed`` partitions deliver nothing more to it."""

    version: int
    passed: frozenset[int] = frozenset()

    def to_json(self) -> bytes:
        return orjson.dumps({"version": self.version, "passed": sorted(self.passed)})

    @classmethod
    def from_json(cls, raw: bytes) -> ChannelRoute:
        try:
            d = orjson.loads(raw)
            version, passed = d["version"], d["passed"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise RouteError(f"bad channel route state: {exc!r:.80}") from None
        if type(version) is not int or version < 0 or not isinstance(passed, list) or not all(
                type(p) is int for p in passed):
            raise RouteError("bad channel route state: version must be an int >= 0 and "
                             "passed a list of partition ids")
        return cls(version, frozenset(passed))


def start(history: RouteHistory, version: int | None = None) -> ChannelRoute:
    """A channel created now (``version=None``: the newest committed) or reset to the time
    ``version`` was current. Its cursors in that version's partitions go where the creation or
    reset puts them; for each one placed beyond its command message, call
    :func:`on_command_fin`."""
    v = history.newest.version if version is None else history.version(version).version
    return ChannelRoute(v)


def readable_partitions(state: ChannelRoute, history: RouteHistory) -> tuple[int, ...]:
    """Partitions that may deliver to the channel: those of its version not yet passed (the
    ones the next version retires are drained up to and including their command message)."""
    passed = state.passed
    return tuple(p for p in history.version(state.version).partitions if p not in passed)


def advance(state: ChannelRoute, history: RouteHistory) -> ChannelRoute:
    """Step to each next committed version whose retired partitions the channel has all
    passed; stop at the first one it has not."""
    v, passed = state.version, state.passed
    last = history.newest.version
    while v < last:
        retired = history.change(v + 1).retired
        if not passed.issuperset(retired):
            break
        v += 1
        passed = passed.difference(retired)
    if v == state.version:
        return state
    return ChannelRoute(v, passed)


def on_command_fin(state: ChannelRoute, history: RouteHistory, partition: int) -> ChannelRoute:
    """The channel consumed ``partition``'s command message: it delivers nothing more from it,
    and the channel advances if that completed a barrier. Idempotent (a replayed FIN)."""
    r = history.retired_in(partition)
    if r is None:
        raise RouteError(f"partition {partition} has no command message (it is not retired)")
    if partition in state.passed or state.version >= r:
        return state
    if history.version(state.version).get(partition) is None:
        raise RouteError(f"partition {partition} is not readable on route version "
                         f"{state.version}")
    return advance(ChannelRoute(state.version, state.passed | {partition}), history)


def can_retire(partition: int, history: RouteHistory, channels: Iterable[ChannelRoute]) -> bool:
    """True when a partition retired by a committed version may be deleted: every channel is
    past that version or has consumed the partition's command message."""
    r = history.retired_in(partition)
    if r is None or r > history.newest.version:
        return False
    return all(c.version >= r or partition in c.passed for c in channels)


def oldest_start(history: RouteHistory, deleted: Iterable[int]) -> int:
    """The oldest version a channel may be reset to: none of its or later versions' partitions
    may have been deleted."""
    return max((history.retired_in(p) or 0 for p in deleted), default=0)


def check_publish_version(partition: int, sealed_version: int | None,
                          route_version: int | None = None) -> None:
    """Refuse a publish to a partition that holds its command message (``sealed_version``: the
    version in that message). Every publish is refused there, whatever route version it
    carries: a message behind the command would be behind the barrier, and channels that
    passed it would never read it. The error names the version to refresh to."""
    if sealed_version is not None:
        raise StaleRoute(partition, sealed_version)
    if route_version is not None and route_version < 0:
        raise RouteError(f"bad route version {route_version}")
