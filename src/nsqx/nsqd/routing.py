"""Route-managed ordered topics on one nsqd: the pure core (:mod:`nsqx.cluster.routes`,
:mod:`nsqx.cluster.barrier`) wired into topics, publishes and channels.

* A route-managed topic is an ordered topic whose physical partitions are the topic's
  ``Topic`` partition objects: physical id ``k`` is ``topic.partitions[k]`` (ids are never
  reused and only grow, so the list stays contiguous; retired partitions stay in it).
* The history is kept by a :class:`RouteStore`: here :class:`FileRouteStore`, the topic
  directory's ``routes.json`` written atomically (tmp + fsync + rename + dir fsync) with a
  compare-and-swap on the history it replaces, so the cluster coordinator can later provide
  the same two calls over etcd (``routes/<topic>`` with a CAS on its mod revision).
* A change (split, merge, move) is: pending (stored) -> the retired partitions refuse every
  publish -> the command message is appended to each of them -> commit (stored) -> channels
  advance. A node restarted with a pending change rolls it forward (appending a command
  that is missing) before it serves anything.
* The command message is an ordinary log record whose body is
  :func:`~nsqx.cluster.routes.command_body`; it is recognised by its *position*, not by a
  flag: a retired partition refuses every publish once it is pending, so its command is its
  last record (``sealed[p]`` = its offset, found again at load by reading the last record).
  Delivery never reads it: a channel's fresh reads in a sealed partition stop before it; when
  everything before it is finished the channel moves its cursor past it itself (the server's
  FIN) and tells the barrier.
* Per channel a :class:`~nsqx.cluster.barrier.ChannelRoute` lives in
  ``channels/c-<name>.route`` beside the cursor files; a partition delivers to the channel
  only while it is in :func:`~nsqx.cluster.barrier.readable_partitions`.
* In a cluster (:meth:`TopicRoutes.mirror`) the history is the cluster member's copy of
  etcd (:class:`MirroredRouteStore`: no local changes); the member asks for seals, says
  which partitions this node leads and feeds in the barrier passes other nodes recorded.
  This module never sees etcd.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nsqx.nsqd.datapath import ROUTES_FILE, route_state_path
from nsqx.nsqd.topic import SealedPartition
from nsqx.protocol.barrier import (
    ChannelRoute,
    StaleRoute,
    advance,
    can_retire,
    check_publish_version,
    on_command_fin,
    readable_partitions,
    start,
)
from nsqx.protocol.names import is_ephemeral
from nsqx.protocol.routes import RouteError, RouteHistory, command_body, parse_command
from nsqx.protocol.v2 import StartKind, StartPosition
from nsqx.storage.fileio import write_durably

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import ChannelView, NodeContext
    from nsqx.nsqd.topic import Topic

log = logging.getLogger("nsqx.nsqd.routing")


class RouteConflict(RouteError):
    """The stored history is not the one a change was computed from (a lost CAS)."""


class RouteStore(Protocol):
    """Where a topic's route history lives: a file on a standalone nsqd, etcd in a cluster."""

    def load(self) -> RouteHistory | None:
        """The stored history (None if the topic has none)."""

    async def replace(self, old: RouteHistory | None, new: RouteHistory) -> None:
        """Store ``new`` if the stored history is still ``old`` (RouteConflict if not)."""


class FileRouteStore:
    """``<topic dir>/routes.json``, replaced atomically; the CAS compares with what this store
    last read or wrote (one nsqd owns its topic directory: the data path is locked)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / ROUTES_FILE
        self._current: RouteHistory | None = None

    def load(self) -> RouteHistory | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        self._current = RouteHistory.from_json(raw)
        return self._current

    async def replace(self, old: RouteHistory | None, new: RouteHistory) -> None:
        if self._current != old:
            raise RouteConflict(f"topic {new.topic}: the stored route history changed meanwhile")
        write_atomic(self.path, new.to_json())
        self._current = new


class MirroredRouteStore:
    """A cluster topic's history as the cluster member last saw it in etcd. Changes go
    through nsqlookupd's coordinator (:mod:`nsqx.cluster.route_coord`), never this node."""

    def __init__(self, history: RouteHistory) -> None:
        self._current = history

    def load(self) -> RouteHistory | None:
        return self._current

    async def replace(self, old: RouteHistory | None, new: RouteHistory) -> None:
        raise RouteError(f"topic {new.topic} is a cluster topic: change its route through "
                         f"nsqlookupd (/topic/split, /topic/merge, /topic/move)")


def write_atomic(path: Path, data: bytes) -> None:
    """The whole file or the old one (storage's durable write), its directory made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_durably(path, data, path.with_name(f"{path.name}.{os.getpid()}.tmp"))


class TopicRoutes:
    """The route history of one topic on this node and every channel's place in it."""

    def __init__(self, nsqd: NodeContext, topic: Topic, store: RouteStore, history: RouteHistory) -> None:
        self.nsqd = nsqd
        self.topic = topic  # partition 0: holds the shared `partitions` list
        self.store = store
        self.history = history
        self.sealed: dict[int, int] = {}  # retired partition -> offset of its command message
        self.states: dict[str, ChannelRoute] = {}
        self.readable: dict[str, frozenset[int]] = {}
        self.open: frozenset[int] = frozenset()
        self._rr = 0
        self._lock = asyncio.Lock()
        # cluster mode (set by the member, see mirror()): whether this node leads a partition
        # (only a leader's cursors count as a channel passing a command message), who hears
        # of a local pass (the member records it in etcd for the other nodes), and the passes
        # recorded by other nodes, per channel
        self.cluster = False
        self.leads: Callable[[int], bool] = lambda _p: True
        self.on_pass: Callable[[str, int], None] | None = None
        self.remote_passed: dict[str, set[int]] = {}
        self._sealing: dict[int, asyncio.Future[int]] = {}  # command appends under way
        # a cluster reset of a channel (nsqx.cluster.route_coord.RouteCoordinator.reset_channel):
        # channels held (nothing delivered on this node) between the coordinator's prepare and
        # apply, each with the timer that releases it if the coordinator never comes back;
        # and the last reset generation applied per channel (persisted, c-<name>.reset)
        self.held: dict[str, asyncio.TimerHandle] = {}
        self.reset_gens: dict[str, int] = {}
        self._set_history(history)

    # -- creation / load -------------------------------------------------------------------
    @classmethod
    async def create(cls, nsqd: NodeContext, name: str, partitions: int, logical: int,
                     node: str) -> TopicRoutes:
        """A new route-managed topic of ``partitions`` physical partitions (RouteError if the
        arguments break a rule; ValueError if the topic exists with another shape)."""
        history = RouteHistory.initial(name, [node] * partitions, logical,
                                       now_ms=time.time_ns() // 1_000_000)
        existing = nsqd.topics.get(name)
        if existing is not None:
            if existing.routes is not None:
                return existing.routes
            raise ValueError("TOPIC_EXISTS")
        topic = nsqd.ensure_partitions(name, partitions, ordered=True)
        store = FileRouteStore(topic.dir)
        await store.replace(None, history)
        routes = cls(nsqd, topic, store, history)
        routes.attach()
        log.info("TOPIC(%s): route-managed, %d logical partitions over %d", name, logical,
                 partitions)
        return routes

    @classmethod
    def load(cls, nsqd: NodeContext, topic: Topic) -> TopicRoutes:
        """Attach the stored history to a topic loaded from nsqd.dat (rolls forward a pending
        change's command messages; the commit itself happens in :meth:`recover`)."""
        store = FileRouteStore(topic.dir)
        history = store.load()
        assert history is not None
        nsqd.ensure_partitions(topic.name, history.next_partition, ordered=True)
        routes = cls(nsqd, topic, store, history)
        for p in range(len(topic.partitions)):
            if history.retired_in(p) is not None:
                routes._find_or_append_command(p)
        routes.attach()
        for cname in list(topic.channels):
            routes.channel_created(cname, first=False)
        return routes

    async def recover(self) -> None:
        """Commit a change found pending at load (its commands are in)."""
        pending = self.history.pending
        if pending is not None:
            async with self._lock:
                await self._commit(pending.version)

    # -- cluster mode (driven by nsqx.cluster.member; nsqd itself knows no etcd) -----------
    @classmethod
    def mirror(cls, nsqd: NodeContext, topic: Topic, history: RouteHistory,
               leads: Callable[[int], bool], on_pass: Callable[[str, int], None]) -> TopicRoutes:
        """Attach a cluster topic's history (read from etcd by the member). The route is
        changed by the coordinator only; this node seals the partitions it leads when asked
        (:meth:`seal`) and learns the other nodes' barrier passes (:meth:`learn_passes`)."""
        nsqd.ensure_partitions(topic.name, history.next_partition, ordered=True)
        routes = cls(nsqd, topic, MirroredRouteStore(history), history)
        routes.cluster, routes.leads, routes.on_pass = True, leads, on_pass
        routes._find_commands()
        routes.attach()
        for cname in list(topic.channels):
            routes.channel_created(cname, first=True)
        return routes

    def apply(self, history: RouteHistory) -> None:
        """A newer history from etcd: pending (its retired partitions refuse publishes from
        now on) or committed (channels advance)."""
        if history == self.history:
            if any(part.routes is not self for part in self.topic.partitions):
                self.attach()
            return
        old = self.history
        self.store = MirroredRouteStore(history)
        self._set_history(history)
        if history.next_partition > len(self.topic.partitions):
            self.nsqd.ensure_partitions(self.topic.name, history.next_partition, ordered=True)
        if any(part.routes is not self for part in self.topic.partitions):
            self.attach()  # partitions the member created first (it saw the topic grow)
        self._find_commands()
        if history.newest.version != old.newest.version:
            log.info("TOPIC(%s): route version %d committed", self.topic.name,
                     history.newest.version)
        for name in list(self.states):
            self._set_state(name, self._with_passes(name, advance(self.states[name], history)))
            self._refresh(name)
        # a channel may have passed a command before the node saw the change commit (the
        # seal comes first): release those partitions now rather than at the periodic pass
        for v in range(old.newest.version + 1, history.newest.version + 1):
            for p in history.change(v).retired:
                if p < len(self.topic.partitions):
                    self._retire_if_passed(p)

    def _find_commands(self) -> None:
        """Learn where the command messages of retired partitions are (a new leader after a
        failover holds them: the seal was acked by the ISR). Never appends: only
        :meth:`seal` on the leader does."""
        for p in range(min(len(self.topic.partitions), self.history.next_partition)):
            if p not in self.sealed and self.history.retired_in(p) is not None:
                off = self._command_at_end(p)
                if off is not None:
                    self.sealed[p] = off

    def _command_at_end(self, p: int) -> int | None:
        part = self.topic.partitions[p]
        end = part.log.next_offset
        if end <= part.log.start_offset:
            return None
        try:
            _, ch = parse_command(part.log.read_frame(end - 1)[34:])
        except (RouteError, KeyError, ValueError):
            return None
        return end - 1 if ch.version == self.history.retired_in(p) else None

    def seal(self, p: int) -> tuple[int, asyncio.Future[int] | None]:
        """Append p's command message (the history must retire p): its offset, and the
        append's future (None if it was already there). Idempotent."""
        if self.history.retired_in(p) is None:
            raise RouteError(f"topic {self.topic.name}: partition {p} is not retired by any "
                             f"route version")
        busy = self._sealing.get(p)
        if busy is not None and not busy.done():  # a retried request while it is written
            return self.sealed[p], busy
        # the log, not the cached offset: a follower may have truncated an unacknowledged
        # command of a leader that died (this node leads now and must append its own)
        off = self._command_at_end(p)
        if off is not None:
            self.sealed[p] = off
            return off, None
        fut = self._sealing[p] = self._append_command(p)
        return self.sealed[p], fut

    def subscribe_led(self) -> None:
        """Cluster mode: plain-SUB clients (``sub_all``) read every partition this node
        leads, including ones a change created or a failover gave it after they subscribed
        (the member closes the clients of a partition this node stops leading)."""
        for name, ch0 in list(self.topic.channels.items()):
            clients = {c.id: c for sib in ch0.siblings() for c in sib.clients.values()
                       if c.sub_all}
            if not clients:
                continue
            for p, part in enumerate(self.topic.partitions):
                ch = part.channels.get(name)
                if ch is None or not self.leads(p):
                    continue
                for c in clients.values():
                    if ch not in c.subs:
                        ch.set_ordered()
                        c.subs.append(ch)
                        ch.add_client(c)
                        ch.wake()

    def learn_passes(self, name: str, partitions: set[int]) -> None:
        """Other nodes' leaders recorded that channel ``name`` consumed these partitions'
        command messages: feed them to the local barrier (kept for a channel created later)."""
        known = self.remote_passed.setdefault(name, set())
        if partitions <= known:
            return
        known |= partitions
        if name in self.states:
            self._set_state(name, self._with_passes(name, self.states[name]))

    def set_passes(self, name: str, partitions: set[int]) -> None:
        """The passes recorded in etcd for channel ``name`` are now exactly ``partitions``
        (a cluster reset deleted some). Applied to the local barrier as they are; forgetting
        one never moves a channel back by itself: only :meth:`apply_reset` does."""
        known = self.remote_passed.get(name, set())
        if partitions == known:
            return
        self.remote_passed[name] = set(partitions)
        if name in self.states and not partitions <= known:
            self._set_state(name, self._with_passes(name, self.states[name]))

    # -- cluster reset of a channel (driven by the member for the coordinator) -------------
    def hold(self, name: str, timeout: float) -> None:
        """Deliver nothing of channel ``name`` from this node's partitions until
        :meth:`release` (or ``timeout`` seconds: a coordinator that died mid-reset)."""
        old = self.held.pop(name, None)
        if old is not None:
            old.cancel()
        self.held[name] = asyncio.get_running_loop().call_later(
            timeout, self._hold_expired, name)
        if name in self.states:
            self._refresh(name)

    def _hold_expired(self, name: str) -> None:
        if self.held.pop(name, None) is not None:
            log.warning("TOPIC(%s) CHANNEL(%s): reset hold expired (the coordinator did not "
                        "finish the reset): delivering again", self.topic.name, name)
            if name in self.states:
                self._refresh(name)

    def release(self, name: str) -> None:
        timer = self.held.pop(name, None)
        if timer is not None:
            timer.cancel()
            if name in self.states:
                self._refresh(name)

    def reset_gen(self, name: str) -> int:
        gen = self.reset_gens.get(name)
        if gen is None:
            gen = 0
            path = self._state_path(name)
            if path is not None:
                try:
                    gen = int(path.with_suffix(".reset").read_text())
                except (OSError, ValueError):
                    gen = 0
            self.reset_gens[name] = gen
        return gen

    def prepare_reset(self, name: str, pos: StartPosition) -> dict[int, dict]:
        """The coordinator's first step: where ``pos`` is in each partition this node leads,
        the log's bounds and the command message's offset (retired partitions), and whether
        the channel exists there. Nothing changes here (the member holds the channel)."""
        out: dict[int, dict] = {}
        for p, part in enumerate(self.topic.partitions[:self.history.next_partition]):
            if not self.leads(p):
                continue
            plog = part.log
            start_off, end = plog.start_offset, plog.next_offset
            if pos.kind is StartKind.EARLIEST:
                off = start_off
            elif pos.kind is StartKind.LATEST:
                off = end
            else:
                off = min(max(plog.offset_for_time(pos.value * 1_000_000_000), start_off), end)
            command = None
            if self.history.retired_in(p) is not None:
                command = self.sealed.get(p)
                if command is None:
                    command = self._command_at_end(p)
            out[p] = {"offset": off, "start": start_off, "end": end, "command": command,
                      "channel": name in part.channels}
        return out

    def apply_reset(self, name: str, gen: int, version: int, offsets: dict[int, int],
                    passes: set[int]) -> bool:
        """Apply a cluster reset of channel ``name`` (generation ``gen``) once: each partition
        this node leads moves its cursor to ``offsets[p]`` (the channel is created where it is
        missing), the channel's barrier starts again on route ``version`` with exactly the
        passes etcd holds now (``passes``), and the hold ends. Followers only reset the barrier
        state (they mirror the leader's cursor). False if ``gen`` was applied already."""
        if gen <= self.reset_gen(name):
            self.release(name)
            return False
        on_pass, self.on_pass = self.on_pass, None  # a channel created here below counts
        try:  # the commands its new cursors are past: those are not passes, the reset's are
            for p in offsets:
                if p < len(self.topic.partitions) and self.leads(p):
                    self.topic.partitions[p].get_channel(name)
        finally:
            self.on_pass = on_pass
        for p, off in sorted(offsets.items()):
            if p >= len(self.topic.partitions) or not self.leads(p):
                continue
            part = self.topic.partitions[p]
            ch = part.channels.get(name)
            if ch is None:
                continue
            off = min(max(off, part.log.start_offset), part.log.next_offset)
            ch.reset_to(off)
            log.info("TOPIC(%s) CHANNEL(%s): partition %d reset to offset %d (cluster reset "
                     "%d, route version %d)", self.topic.name, name, p, off, gen, version)
        if name not in self.states and self.topic.get_channel(name, create=False) is None:
            self.reset_gens[name] = gen  # no channel here: nothing to reset
            self.release(name)
            return True
        self.remote_passed[name] = set(passes)
        path = self._state_path(name)
        if path is not None:
            write_atomic(path.with_suffix(".reset"), str(gen).encode())
        self.reset_gens[name] = gen
        timer = self.held.pop(name, None)
        if timer is not None:
            timer.cancel()
        state = start(self.history, version)
        self.states[name] = state
        self._set_state(name, self._with_passes(name, self._past_commands(name, state)),
                        force=True)
        for part in self.topic.partitions:
            ch = part.channels.get(name)
            if ch is not None:
                ch.wake()
        return True

    def _with_passes(self, name: str, state: ChannelRoute) -> ChannelRoute:
        """Apply the remote passes that fit (one may name a partition of a later version:
        it applies once the channel reaches that version)."""
        passes = self.remote_passed.get(name)
        if not passes:
            return state
        while True:
            before = state
            for p in passes:
                try:
                    state = on_command_fin(state, self.history, p)
                except RouteError:
                    continue  # not readable yet at the channel's version, or not retired yet
            if state == before:
                return state

    def _passed(self, name: str, p: int) -> None:
        if self.on_pass is not None and not is_ephemeral(name):
            self.on_pass(name, p)

    def attach(self) -> None:
        for part in self.topic.partitions:
            part.routes = self
        self.nsqd.metadata_changed()

    def _set_history(self, history: RouteHistory) -> None:
        self.history = history
        self.open = frozenset(history.open_partitions())

    # -- publishing ------------------------------------------------------------------------
    def check_publish(self, partition: int, route_version: int | None = None) -> None:
        """Raise SealedPartition unless ``partition`` takes publishes now."""
        if partition in self.open:
            check_publish_version(partition, None, route_version)
            return
        h = self.history
        version = h.retired_in(partition)
        if version is None:  # created by the pending change: usable once it commits
            version = h.pending.version if h.pending is not None else h.newest.version
        try:
            check_publish_version(partition, version, route_version)
        except StaleRoute as exc:
            raise SealedPartition(exc, h.topic) from None

    def pick_open(self) -> int:
        """A partition for a publish that names none (no key: no order to keep)."""
        parts = sorted(self.open)
        if self.cluster:  # only a leader takes publishes
            parts = [p for p in parts if self.leads(p)] or parts
        if not parts:  # only while a change is pending on a one-partition topic
            self.check_publish(self.history.newest.partitions[0])
        self._rr += 1
        return parts[self._rr % len(parts)]

    # -- changes ---------------------------------------------------------------------------
    async def change(self, op: Callable[[RouteHistory], RouteHistory]) -> RouteHistory:
        """Run one change (``op`` proposes it on the current history): pending, seal with the
        command messages, commit, advance the channels. RouteError if refused."""
        old = self.history
        new = op(old)  # refuses a second change while one is pending (RouteHistory._base)
        self._set_history(new)  # the retired partitions refuse publishes from here on
        try:
            await self.store.replace(old, new)
        except BaseException:
            self._set_history(old)
            raise
        async with self._lock:
            ch = new.pending_change
            assert ch is not None and new.pending is not None
            self.nsqd.ensure_partitions(self.topic.name, new.next_partition, ordered=True)
            self.attach()
            self._subscribe_new(ch.created)
            futs = [self._append_command(p) for p in ch.retired]
            await asyncio.gather(*futs)
            await self._commit(new.pending.version)
        log.info("TOPIC(%s): route version %d committed (%s: %s -> %s)", self.topic.name,
                 ch.version, ch.kind, list(ch.retired), list(ch.created))
        return self.history

    async def _commit(self, version: int) -> None:
        old = self.history
        new = old.commit(version, time.time_ns() // 1_000_000)
        await self.store.replace(old, new)
        self._set_history(new)
        for name in list(self.states):
            self._set_state(name, advance(self.states[name], new))

    def _append_command(self, p: int) -> asyncio.Future[int]:
        part = self.topic.partitions[p]
        ch = self.history.change(self.history.retired_in(p) or 0)
        self.sealed[p] = part.log.next_offset  # appended synchronously below: its offset
        return part.committer.append([command_body(self.topic.name, ch)])

    def _find_or_append_command(self, p: int) -> None:
        """At load: the command is the partition's last record; append it if the change was
        interrupted before it was written (a roll-forward)."""
        part = self.topic.partitions[p]
        end = part.log.next_offset
        version = self.history.retired_in(p)
        if end > part.log.start_offset:
            try:
                _, ch = parse_command(part.log.read_frame(end - 1)[34:])
            except (RouteError, KeyError, ValueError):
                ch = None
            if ch is not None and ch.version == version:
                self.sealed[p] = end - 1
                return
        log.warning("TOPIC(%s) PARTITION(%d): command message of route version %s missing: "
                    "appending it (roll-forward)", self.topic.name, p, version)
        self._append_command(p)

    def _subscribe_new(self, created: tuple[int, ...]) -> None:
        """Clients that read every partition (plain SUB) read the new ones too."""
        for name, ch0 in self.topic.channels.items():
            clients = {}
            for sib in ch0.siblings():
                for c in sib.clients.values():
                    if c.sub_all:
                        clients[c.id] = c
            for p in created:
                ch = self.topic.partitions[p].channels.get(name)
                if ch is None:
                    continue
                ch.set_ordered()
                for c in clients.values():
                    if ch not in c.subs:
                        c.subs.append(ch)
                        ch.add_client(c)
                ch.wake()

    # -- channels --------------------------------------------------------------------------
    def _state_path(self, name: str) -> Path | None:
        if is_ephemeral(name):
            return None
        return route_state_path(self.topic.dir, name)

    def channel_created(self, name: str, *, first: bool) -> None:
        """A channel now exists in every partition: load its barrier state, or start it (the
        topic's first channel reads from version 0, as it gets what was published before it;
        a later one from the newest version), counting commands its cursors are past."""
        path = self._state_path(name)
        if path is not None and path.exists():
            try:
                self.states[name] = ChannelRoute.from_json(path.read_bytes())
                self._set_state(name, advance(self.states[name], self.history), persist=False)
                self._refresh(name)
                return
            except (OSError, RouteError) as exc:
                log.error("TOPIC(%s) CHANNEL(%s): bad route state (%s): starting again",
                          self.topic.name, name, exc)
        # in a cluster every channel walks from version 0: whether it passed a command is
        # known only from the leaders' cursors (here or, through etcd, on other nodes)
        state = start(self.history, 0 if first or self.cluster else None)
        self.states[name] = state
        self._set_state(name, self._with_passes(name, self._past_commands(name, state)),
                        force=True)

    def _past_commands(self, name: str, state: ChannelRoute) -> ChannelRoute:
        """Count the commands the channel's cursors already passed (creation, reset)."""
        while True:
            before = state
            for p in readable_partitions(state, self.history):
                off = self.sealed.get(p)
                ch = self.topic.partitions[p].channels.get(name)
                if off is not None and ch is not None and ch.confirmed > off and \
                        self.leads(p):  # a follower's cursor may not be the leader's yet
                    state = on_command_fin(state, self.history, p)
                    self._passed(name, p)
            if state == before:
                return state

    def channel_deleted(self, name: str) -> None:
        self.states.pop(name, None)
        self.readable.pop(name, None)
        path = self._state_path(name)
        if path is not None:
            try:
                path.unlink()
            except OSError:
                pass

    def _set_state(self, name: str, state: ChannelRoute, *, persist: bool = True,
                   force: bool = False) -> None:
        old = self.states.get(name)
        self.states[name] = state
        if state == old and not force:
            return
        if persist:
            path = self._state_path(name)
            if path is not None:
                write_atomic(path, state.to_json())
        self._refresh(name)

    def _retire_if_passed(self, p: int) -> None:
        """Every channel has passed retired partition ``p``'s command message: nothing in it
        will be read again except by a replay, so its consumed segments go now, under the
        node's retention rules (``--retention-time``/``--retention-bytes`` keep them for
        replay as for any log), rather than at the next periodic pass. The last segment,
        which holds the command record, stays: it is how a restart finds the seal."""
        if not can_retire(p, self.history, self.states.values()):
            return
        part = self.topic.partitions[p]
        before = part.log.start_offset
        part.apply_retention()
        log.info("TOPIC(%s) PARTITION(%d): retired - every channel passed its command "
                 "message; log start %d -> %d", self.topic.name, p, before,
                 part.log.start_offset)

    def _refresh(self, name: str) -> None:
        before = self.readable.get(name)
        now = (frozenset() if name in self.held
               else frozenset(readable_partitions(self.states[name], self.history)))
        self.readable[name] = now
        if before != now:
            for p in now - (before or frozenset()):
                ch = self.topic.partitions[p].channels.get(name)
                if ch is not None:
                    ch.wake()

    def gate(self, channel: ChannelView, end: int) -> int:
        """Called by the channel's pump: the end offset it may read to (-1: nothing now).

        A partition outside the channel's readable set delivers nothing. In a sealed partition
        the reads stop before the command message; once everything before it is finished the
        channel passes it (moves its cursor over it, the server's own FIN) and the barrier may
        open the next version's partitions."""
        name = channel.name
        readable = self.readable.get(name)
        if readable is None:
            self.channel_created(name, first=False)
            readable = self.readable[name]
        p = channel.topic.partition
        if p not in readable:
            return -1
        off = self.sealed.get(p)
        if off is None:
            if not self.cluster or self.history.retired_in(p) is None:
                return end
            self._find_commands()  # a retired partition whose command is not known yet
            off = self.sealed.get(p)
            if off is None:
                return end
        if channel.confirmed >= off and channel.in_flight_count == 0:
            if channel.confirmed == off:
                channel.skip_to(off + 1)
                channel.dirty = True
            self._set_state(name, on_command_fin(self.states[name], self.history, p))
            self._passed(name, p)
            log.info("TOPIC(%s) CHANNEL(%s): passed the command message of partition %d "
                     "(route version %d)", self.topic.name, name, p, self.states[name].version)
            self._retire_if_passed(p)
            return -1
        return min(end, off)

    def reset_channel(self, name: str, pos: StartPosition, who: str = "") -> ChannelRoute:
        """Move the channel in every partition to a time (``earliest``, ``latest`` or
        ``timestamp``) and walk the versions again from the one current then: version 0 for
        earliest (no partition is deleted yet), the newest for latest, ``version_at(T)``.
        A per-partition offset has no meaning across partitions: RouteError."""
        h = self.history
        if self.cluster:  # the barrier state lives on every node and in etcd: not one node's
            raise RouteError(f"topic {h.topic} is a route-managed cluster topic: reset the "
                             f"channel through nsqlookupd (POST /channel/setoffset there, or "
                             f"nsqx channel reset --lookupd-http-address)")
        version = h.restart_version(pos)
        for part in self.topic.partitions:
            ch = part.channels.get(name)
            if ch is not None:
                ch.seek(pos, who)
        state = start(h, version)
        self.states[name] = state
        self._set_state(name, self._past_commands(name, state), force=True)
        for part in self.topic.partitions:
            ch = part.channels.get(name)
            if ch is not None:
                ch.wake()
        return self.states[name]

    # -- views -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = self.history.to_dict()
        d["sealed"] = {str(p): off for p, off in sorted(self.sealed.items())}
        d["channels"] = {n: {"version": s.version, "passed": sorted(s.passed),
                             "readable": sorted(self.readable.get(n, ()))}
                         for n, s in sorted(self.states.items())}
        return d
