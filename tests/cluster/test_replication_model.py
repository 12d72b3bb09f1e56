"""Hypothesis state machine: one partition on three replicas under the cluster's rules.

Leaders append under their epoch, followers truncate by leader epochs then fetch, acks wait
for every ISR member (and at least min ISR of them), laggards leave the ISR, caught-up
replicas rejoin, dead leaders are replaced from the ISR (longest log), and deposed leaders
keep writing into their own log (the paused-leader case), and a leader that loses its
unsynced tail and is back within its lease steps down. Checked after every step: every
acknowledged message is in the current leader's log at its offset, and a follower that has
truncated holds a prefix of the leader's log.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nsqx.cluster.model import PartitionMeta
from nsqx.cluster.placement import elect_leader, expand_isr, node_lost, shrink_isr, step_down
from nsqx.cluster.replication import LeaderProgress, truncation_point

NODES = ("a", "b", "c")


def spans(log: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, (epoch, _) in enumerate(log):
        if not out or out[-1][0] != epoch:
            out.append((epoch, off))
    return out


class Partition(RuleBasedStateMachine):
    @initialize(min_isr=st.sampled_from([1, 2]))
    def setup(self, min_isr: int) -> None:
        self.min_isr = min_isr
        self.alive = set(NODES)
        self.logs: dict[str, list[tuple[int, int]]] = {n: [] for n in NODES}
        self.pm = PartitionMeta("t", 0, NODES, "a", 1, NODES, ())
        self.now = 0.0
        self.progress = LeaderProgress(set(NODES), lag_timeout=5.0)
        self.pending: list[tuple[int, int, int]] = []  # (offset, value, epoch)
        self.acked: dict[int, int] = {}  # value -> offset
        self.next_value = 0
        self.led: dict[str, int] = {"a": 1}  # node -> epoch it last led (it may not know it lost)

    # -- helpers ------------------------------------------------------------------------------
    def _leader_ok(self) -> bool:
        return self.pm.leader is not None and self.pm.leader in self.alive

    def _new_leader(self, pm: PartitionMeta) -> None:
        if pm.leader != self.pm.leader or pm.epoch != self.pm.epoch:
            self.pending.clear()  # unacknowledged publishes fail; the client retries
            # A new leader counts a follower's log end only from its first fetch in the new
            # epoch (after it truncated): its old end may include a deposed leader's tail.
            self.progress = LeaderProgress(set(pm.isr), lag_timeout=5.0)
            if pm.leader is not None:
                self.led[pm.leader] = pm.epoch
        pm.check()
        self.pm = pm

    # -- rules ----------------------------------------------------------------------------------
    @precondition(lambda self: self._leader_ok())
    @rule(k=st.integers(1, 3))
    def publish(self, k: int) -> None:
        if len(self.pm.isr) < self.min_isr:
            return  # refused with E_PUB_FAILED: below min ISR
        log = self.logs[self.pm.leader]
        for _ in range(k):
            v = self.next_value
            self.next_value += 1
            log.append((self.pm.epoch, v))
            self.pending.append((len(log) - 1, v, self.pm.epoch))

    @precondition(lambda self: self._leader_ok())
    @rule(follower=st.sampled_from(NODES), n=st.integers(1, 4))
    def fetch(self, follower: str, n: int) -> None:
        leader = self.pm.leader
        if follower == leader or follower not in self.alive or follower not in self.pm.replicas:
            return
        # a node fetching as a follower knows it no longer leads: it never appends as a
        # deposed leader again (only a restarted or paused one that has not fetched can)
        self.led.pop(follower, None)
        flog, llog = self.logs[follower], self.logs[leader]
        cut = truncation_point(spans(flog), len(flog), spans(llog), len(llog))
        del flog[cut:]
        assert flog == llog[:len(flog)], "after truncation a follower holds a prefix of the leader"
        flog.extend(llog[len(flog):len(flog) + n])
        self.progress.on_fetch(follower, len(flog), len(llog), self.now)

    @precondition(lambda self: self._leader_ok())
    @rule()
    def ack(self) -> None:
        if len(self.pm.isr) < self.min_isr:
            return
        self.progress.isr = set(self.pm.isr)
        hw = self.progress.acked_end(len(self.logs[self.pm.leader]), self.pm.leader)
        still = []
        for off, v, ep in self.pending:
            if off < hw and ep == self.pm.epoch:
                self.acked[v] = off
            else:
                still.append((off, v, ep))
        self.pending = still

    @precondition(lambda self: self._leader_ok())
    @rule(dt=st.floats(0.5, 8.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.progress.isr = set(self.pm.isr)
        for n in self.progress.laggards(len(self.logs[self.pm.leader]), self.now, self.pm.leader):
            self._new_leader(shrink_isr(self.pm, n, self.pm.epoch))

    @precondition(lambda self: self._leader_ok())
    @rule(follower=st.sampled_from(NODES))
    def rejoin(self, follower: str) -> None:
        if follower in self.alive and self.progress.ready_to_join(
                follower, len(self.logs[self.pm.leader])):
            self._new_leader(expand_isr(self.pm, follower, self.pm.epoch))
            self.progress.isr = set(self.pm.isr)

    @precondition(lambda self: len(self.alive) > 1)
    @rule(node=st.sampled_from(NODES))
    def kill(self, node: str) -> None:
        if node not in self.alive:
            return
        self.alive.discard(node)
        ends = {n: len(self.logs[n]) for n in self.alive}
        self._new_leader(node_lost(self.pm, node, self.alive, ends))

    @rule(node=st.sampled_from(NODES))
    def restart(self, node: str) -> None:
        if node in self.alive:
            return
        self.alive.add(node)
        if self.pm.leader is None:
            ends = {n: len(self.logs[n]) for n in self.alive}
            self._new_leader(elect_leader(self.pm, self.alive, ends))

    @precondition(lambda self: self._leader_ok()
                  and any(n in self.alive for n in self.pm.isr if n != self.pm.leader))
    @rule(lost=st.integers(1, 4))
    def leader_power_loss_within_lease(self, lost: int) -> None:
        """The leader loses its unsynced tail and is back before its lease ends: still
        registered, it moves its leadership itself (the restart's step-down)."""
        node = self.pm.leader
        assert node is not None
        del self.logs[node][max(0, len(self.logs[node]) - lost):]
        self.led.pop(node)  # a new run: it knows it leads no longer (a paused one would not)
        self._new_leader(step_down(self.pm, node, self.alive - {node}))

    @rule(node=st.sampled_from(NODES), k=st.integers(1, 2))
    def deposed_leader_writes(self, node: str, k: int) -> None:
        """A leader that was paused past its lease still believes it leads and appends."""
        if node in self.led and node != self.pm.leader:
            for _ in range(k):
                self.logs[node].append((self.led[node], -1))  # never acknowledged

    # -- the property -----------------------------------------------------------------------
    @invariant()
    def acknowledged_messages_survive(self) -> None:
        if not hasattr(self, "pm") or self.pm.leader is None:
            return
        log = self.logs[self.pm.leader]
        for v, off in self.acked.items():
            assert off < len(log) and log[off][1] == v, (
                f"acked {v}@{off} missing on leader {self.pm.leader} (epoch {self.pm.epoch})")


Partition.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestPartitionModel = Partition.TestCase
