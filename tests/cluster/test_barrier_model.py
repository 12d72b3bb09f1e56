"""The consumer barrier of ordered topics: unit tests, then a hypothesis model of the whole
route change (producers with stale routes, sealing, commits, two more channels, retirement).

The model's logs are lists of records per physical partition: ``("msg", key, seq)`` or
``("cmd", version)``. Producers route keys with the version they know (stale until they
refresh) and a sealed partition refuses them; consumers read only what the barrier allows,
one record at a time. Checked after every step: per key and channel, messages arrive in seq
order with no gap; a channel's version only grows, and each step to v+1 happened after the
channel consumed the command message of every partition v+1 retires; no deleted partition is
still needed. ``drain`` consumes everything and checks that nothing acknowledged was lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nsqx.cluster.barrier import (
    ChannelRoute,
    StaleRoute,
    advance,
    can_retire,
    check_publish_version,
    oldest_start,
    on_command_fin,
    readable_partitions,
    start,
)
from nsqx.cluster.routes import RouteError, RouteHistory, logical_partition


def hist() -> RouteHistory:
    return RouteHistory.initial("orders", ["a", "b"], logical=16)


# -- unit tests ----------------------------------------------------------------------------------
def test_split_needs_the_command_message_of_the_split_partition() -> None:
    h = hist().split(0, 4)
    c = start(h)
    assert c == ChannelRoute(0) and readable_partitions(c, h) == (0, 1)
    c = on_command_fin(c, h, 0)  # pending: the channel stops reading 0 but stays on 0
    assert c == ChannelRoute(0, frozenset({0})) and readable_partitions(c, h) == (1,)
    h = h.commit(1)
    c = advance(c, h)
    assert c == ChannelRoute(1) and readable_partitions(c, h) == (2, 3, 1)


def test_merge_needs_both_command_messages() -> None:
    h = hist().merge(0, 1).commit(1)
    c = start(h, 0)
    c = on_command_fin(c, h, 1)
    assert c.version == 0 and readable_partitions(c, h) == (0,), "2 waits for partition 0"
    c = on_command_fin(c, h, 0)
    assert c == ChannelRoute(1) and readable_partitions(c, h) == (2,)


def test_command_fin_is_idempotent_and_checked() -> None:
    h = hist().merge(0, 1).commit(1)
    c = on_command_fin(start(h, 0), h, 1)
    assert on_command_fin(c, h, 1) is c
    done = on_command_fin(c, h, 0)
    assert on_command_fin(done, h, 0) is done, "a FIN replayed after the channel moved on"
    with pytest.raises(RouteError, match="partition 2 has no command message"):
        on_command_fin(done, h, 2)
    h2 = h.split(2, 5).commit(2)
    with pytest.raises(RouteError, match="partition 2 is not readable on route version 0"):
        on_command_fin(start(h2, 0), h2, 2)


def test_a_later_command_consumed_early_lets_the_channel_walk_two_versions() -> None:
    h = RouteHistory.initial("t", ["a", "b", "c"], logical=12)  # 0:[0,4) 1:[4,8) 2:[8,12)
    h = h.split(0, 2).commit(1)  # -> 3, 4
    h = h.merge(1, 2).commit(2)  # -> 5
    c = start(h, 0)
    c = on_command_fin(c, h, 1)
    c = on_command_fin(c, h, 2)
    assert c.version == 0 and readable_partitions(c, h) == (0,)
    c = on_command_fin(c, h, 0)  # v1's barrier, then v2's (already met)
    assert c == ChannelRoute(2) and readable_partitions(c, h) == (3, 4, 5)


def test_advance_stops_at_the_first_unmet_barrier() -> None:
    h = hist().split(0, 4).commit(1).move(1, "c").commit(2)
    c = on_command_fin(start(h, 0), h, 1)  # v2's retiree first
    assert c.version == 0 and advance(c, h) is c
    c = on_command_fin(c, h, 0)
    assert c == ChannelRoute(2)


def test_new_channel_starts_at_the_newest_committed_version() -> None:
    h = hist().split(0, 4).commit(1).move(1, "c")  # v2 pending
    assert start(h) == ChannelRoute(1)
    with pytest.raises(RouteError, match="no route version 2"):
        start(h, 2)


def test_can_retire_only_when_every_channel_passed() -> None:
    h = hist().split(0, 4)
    c0 = start(h, 0)
    assert not can_retire(0, h, []), "a pending change retires nothing yet"
    h = h.commit(1)
    assert not can_retire(0, h, [c0]) and not can_retire(1, h, [c0])
    c1 = on_command_fin(c0, h, 0)
    assert c1.version == 1
    assert can_retire(0, h, [c1]) and not can_retire(0, h, [c1, c0])
    h = h.move(1, "c").commit(2)
    c2 = on_command_fin(c0, h, 1)  # passed 1 while still on version 0
    assert can_retire(1, h, [c2]) and not can_retire(0, h, [c2])
    assert can_retire(0, h, []), "no channel needs it"


def test_oldest_start_after_deletion() -> None:
    h = hist().split(0, 4).commit(1).merge(2, 3).commit(2)
    assert oldest_start(h, []) == 0
    assert oldest_start(h, [0]) == 1 and oldest_start(h, [0, 2]) == 2


def test_publish_to_a_sealed_partition_is_refused_with_the_new_version() -> None:
    check_publish_version(3, None, 7)
    check_publish_version(3, None, None)
    for route_version in (None, 4, 5, 9):
        with pytest.raises(StaleRoute, match=r"^E_BAD_PARTITION route version 5$") as e:
            check_publish_version(3, 5, route_version)
        assert e.value.version == 5 and e.value.partition == 3
        assert e.value.code == "E_BAD_PARTITION"
    with pytest.raises(RouteError, match="bad route version"):
        check_publish_version(3, None, -1)


def test_channel_route_json() -> None:
    c = ChannelRoute(4, frozenset({9, 2}))
    assert c.to_json() == b'{"version":4,"passed":[2,9]}'
    assert ChannelRoute.from_json(c.to_json()) == c
    for raw in (b"", b"[]", b"{}", b'{"version": -1, "passed": []}',
                b'{"version": 1, "passed": ["x"]}', b'{"version": true, "passed": []}'):
        with pytest.raises(RouteError, match="bad channel route state"):
            ChannelRoute.from_json(raw)


# -- the model -----------------------------------------------------------------------------------
NODES = ("a", "b", "c")
KEYS = tuple(f"k{i}" for i in range(10))
LOGICAL = 16


@dataclass
class Chan:
    state: ChannelRoute
    cursors: dict[int, int]
    first: dict[str, int]  # per key: the seq this channel must see first
    got: dict[str, int] = field(default_factory=dict)  # per key: the next seq it must see
    consumed_cmds: set[int] = field(default_factory=set)  # the model's own record
    walked: list[int] = field(default_factory=list)  # versions it stood on, in order


class RouteChanges(RuleBasedStateMachine):
    @initialize(n=st.integers(1, 3))
    def setup(self, n: int) -> None:
        self.h = RouteHistory.initial("orders", list(NODES[:n]), logical=LOGICAL)
        self.logs: dict[int, list[tuple]] = {p: [] for p in range(n)}
        self.sealed: dict[int, int] = {}
        self.deleted: set[int] = set()
        self.next_seq = dict.fromkeys(KEYS, 0)
        self.known = [0, 0]  # the route version each producer knows
        self.waiting = [0, 0]  # a version a refusal named that is not committed yet
        self.refusals = 0
        # (log lengths, next seqs) when each version was committed: a reset's starting point
        self.snapshots = {0: ({}, dict(self.next_seq))}
        self.chans = {"main": self._chan(0, {}, dict(self.next_seq)),
                      "reset": self._chan(0, {}, dict(self.next_seq))}

    def _chan(self, version: int, cursors: dict[int, int], first: dict[str, int]) -> Chan:
        c = Chan(start(self.h, version), dict(cursors), dict(first), dict(first))
        c.walked.append(c.state.version)
        for p in readable_partitions(c.state, self.h):  # placed beyond a command message
            if p in self.sealed and c.cursors.get(p, 0) >= len(self.logs[p]):
                self._fin_cmd(c, p)
        return c

    def _move(self, c: Chan, new: ChannelRoute) -> None:
        old = c.state.version
        assert new.version >= old, "a channel's version never goes back"
        for v in range(old + 1, new.version + 1):
            retired = set(self.h.change(v).retired)
            assert retired <= c.consumed_cmds, (
                f"stepped to version {v} before consuming the command messages of "
                f"{sorted(retired - c.consumed_cmds)}")
            c.walked.append(v)
        c.state = new

    def _fin_cmd(self, c: Chan, p: int) -> None:
        c.consumed_cmds.add(p)
        self._move(c, on_command_fin(c.state, self.h, p))

    # -- route changes ------------------------------------------------------------------------
    @precondition(lambda self: self.h.pending is None)
    @rule(data=st.data())
    def begin_split(self, data: st.DataObject) -> None:
        wide = [r for r in self.h.newest.routes if r.hi - r.lo >= 2]
        if not wide:
            return
        r = data.draw(st.sampled_from(wide))
        at = data.draw(st.integers(r.lo + 1, r.hi - 1))
        nodes = data.draw(st.tuples(st.sampled_from(NODES), st.sampled_from(NODES)))
        self.h = self.h.split(r.partition, at, nodes, expect=self.h.newest.version)

    @precondition(lambda self: self.h.pending is None and len(self.h.newest.routes) > 1)
    @rule(data=st.data())
    def begin_merge(self, data: st.DataObject) -> None:
        routes = self.h.newest.routes
        i = data.draw(st.integers(0, len(routes) - 2))
        a, b = routes[i].partition, routes[i + 1].partition
        if data.draw(st.booleans()):
            a, b = b, a
        self.h = self.h.merge(a, b, data.draw(st.sampled_from(NODES)))

    @precondition(lambda self: self.h.pending is None)
    @rule(data=st.data())
    def begin_move(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(self.h.newest.routes))
        self.h = self.h.move(r.partition, data.draw(st.sampled_from(
            [n for n in NODES if n != r.node])))

    @precondition(lambda self: self.h.pending is not None)
    @rule(data=st.data())
    def second_change_is_refused(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(self.h.newest.routes))
        with pytest.raises(RouteError, match="one change at a time"):
            self.h.move(r.partition, "z")

    def _unsealed(self) -> list[int]:
        ch = self.h.pending_change
        return [] if ch is None else [p for p in ch.retired if p not in self.sealed]

    @precondition(lambda self: self._unsealed())
    @rule(data=st.data())
    def seal(self, data: st.DataObject) -> None:
        """The coordinator appends a command message to one retired partition."""
        p = data.draw(st.sampled_from(self._unsealed()))
        ch = self.h.pending_change
        assert ch is not None
        for c in ch.created:
            self.logs.setdefault(c, [])
        v = ch.version
        self.logs[p].append(("cmd", v))
        self.sealed[p] = v

    @precondition(lambda self: self.h.pending is not None and not self._unsealed())
    @rule()
    def commit(self) -> None:
        event(f"commit {self.h.pending_change.kind}")  # type: ignore[union-attr]
        self.h = self.h.commit(self.h.pending.version)  # type: ignore[union-attr]
        self.snapshots[self.h.newest.version] = (
            {p: len(log) for p, log in self.logs.items()}, dict(self.next_seq))
        for c in self.chans.values():  # the route watch nudges every channel
            self._move(c, advance(c.state, self.h))

    # -- producers ----------------------------------------------------------------------------
    @rule(who=st.integers(0, 1))
    def refresh(self, who: int) -> None:
        self.known[who] = self.h.newest.version

    @rule(key=st.sampled_from(KEYS), n=st.integers(1, 3))
    def publish(self, key: str, n: int) -> None:
        """Publish ``n`` messages of a key as nsqx.client would: route by the known version; on
        E_BAD_PARTITION wait until the route reaches the version the error names, refresh,
        retry (the same message: nothing is lost or reordered by the retry)."""
        who = KEYS.index(key) % 2  # one producer per key: its order is the publish order
        for _ in range(n):
            if self.waiting[who] > self.h.newest.version:
                return  # the change is still pending; the client waits for the route watch
            if self.waiting[who]:
                self.known[who], self.waiting[who] = self.h.newest.version, 0
            refused_at = -1
            while True:
                p = self.h.version(self.known[who]).lookup(logical_partition(key, LOGICAL)).partition
                try:
                    check_publish_version(p, self.sealed.get(p), self.known[who])
                except StaleRoute as e:
                    assert e.version > max(self.known[who], refused_at), "a refusal teaches"
                    refused_at = e.version
                    event("publish refused")
                    self.refusals += 1
                    if self.h.newest.version < e.version:
                        self.waiting[who] = e.version
                        return
                    self.known[who] = self.h.newest.version
                    continue
                assert p not in self.deleted
                self.logs[p].append(("msg", key, self.next_seq[key]))
                self.next_seq[key] += 1
                break

    # -- consumers ----------------------------------------------------------------------------
    def _candidates(self, c: Chan) -> list[int]:
        return [p for p in readable_partitions(c.state, self.h)
                if c.cursors.get(p, 0) < len(self.logs[p])]

    def _consume(self, c: Chan, p: int) -> None:
        assert p not in self.deleted, f"partition {p} was deleted but a channel reads it"
        rec = self.logs[p][c.cursors.get(p, 0)]
        c.cursors[p] = c.cursors.get(p, 0) + 1
        if rec[0] == "cmd":
            assert rec[1] == self.h.retired_in(p)
            self._fin_cmd(c, p)
            return
        _, key, seq = rec
        want = c.got[key]
        assert seq == want, f"key {key}: got seq {seq}, expected {want} (from partition {p})"
        c.got[key] = seq + 1

    @rule(name=st.sampled_from(["main", "reset", "late"]), data=st.data(), n=st.integers(1, 8))
    def consume(self, name: str, data: st.DataObject, n: int) -> None:
        c = self.chans.get(name)
        if c is None:
            return
        for _ in range(n):
            cands = self._candidates(c)
            if not cands:
                return
            self._consume(c, data.draw(st.sampled_from(cands)))

    @precondition(lambda self: "late" not in self.chans)
    @rule()
    def create_late(self) -> None:
        """A channel created now starts at the newest version, at the end of every log."""
        self.chans["late"] = self._chan(self.h.newest.version,
                                        {p: len(log) for p, log in self.logs.items()},
                                        dict(self.next_seq))

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        """Reset the channel to the moment a version (not older than what retention kept)
        was committed; it walks forward from there."""
        lo = oldest_start(self.h, self.deleted)
        v = data.draw(st.integers(lo, self.h.newest.version))
        lengths, seqs = self.snapshots[v]
        self.chans["reset"] = self._chan(v, lengths, seqs)

    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        gone = [p for p in self.logs if p not in self.deleted
                and self.h.retired_in(p) is not None]
        if not gone:
            return
        p = data.draw(st.sampled_from(gone))
        if can_retire(p, self.h, [c.state for c in self.chans.values()]):
            event("partition retired")
            self.deleted.add(p)

    @rule()
    def drain(self) -> None:
        """Consume everything: every acknowledged message after each channel's start arrives,
        and each channel ends on the newest version."""
        for c in self.chans.values():
            while cands := self._candidates(c):
                self._consume(c, cands[0])
            assert c.got == self.next_seq, "an acknowledged message was never delivered"
            assert c.state.version == self.h.newest.version
            event(f"a channel walked {len(c.walked) - 1} versions")

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def stored_form_round_trips(self) -> None:
        if hasattr(self, "h"):
            assert RouteHistory.from_json(self.h.to_json()) == self.h

    @invariant()
    def nothing_needed_is_deleted(self) -> None:
        for c in getattr(self, "chans", {}).values():
            assert c.walked == list(range(c.walked[0], c.walked[0] + len(c.walked)))
            needed = {p for v in range(c.state.version, self.h.newest.version + 1)
                      for p in self.h.version(v).partitions} - c.state.passed
            assert not needed & self.deleted, f"deleted {needed & self.deleted} still needed"

    def teardown(self) -> None:
        if hasattr(self, "h"):
            self.drain()


TestRouteChanges = RouteChanges.TestCase
TestRouteChanges.settings = settings(max_examples=300, stateful_step_count=60, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
