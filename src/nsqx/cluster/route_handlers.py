"""A member's part in route-managed ordered topics: the route histories, barrier passes and
reset records from the etcd watch, mirrored into nsqd's :class:`~nsqx.nsqd.routing.TopicRoutes`
(which never reads etcd itself), and the coordinator's calls on this node: seal a retired
partition, and prepare, apply or release a cluster reset of a channel."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from nsqx.cluster.etcd import EtcdClient, EtcdError
from nsqx.cluster.gates import LeaderGate
from nsqx.cluster.internal_auth import InternalAuth, answer
from nsqx.cluster.route_store import (
    HeldResets,
    ResetRecord,
    parse_pass_key,
    parse_reset_key,
    pass_key,
    passes_prefix,
    reset_key,
    resets_prefix,
    routes_prefix,
)
from nsqx.nsqd.routing import TopicRoutes
from nsqx.nsqd.topic import PublishRefused, settle
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.routes import RouteError, RouteHistory, routes_key
from nsqx.protocol.v2 import parse_start_position

log = logging.getLogger("nsqx.cluster.member")

__all__ = ["RESET_HOLD", "RouteHandlers"]

RESET_HOLD = 20.0  # a channel held for a cluster reset delivers again after this at most


class RouteHandlers:
    """Handed nsqd, etcd and the cluster's key root, the member's gates (who leads what),
    the internal endpoints' auth, and how to guard a new local partition."""

    def __init__(self, nsqd: Any, etcd: EtcdClient, root: bytes,
                 gates: dict[tuple[str, int], Any], auth: InternalAuth,
                 guard: Callable[[Any], None], node_id: Callable[[], str]) -> None:
        self.nsqd = nsqd
        self.etcd = etcd
        self.root = root
        self.gates = gates
        self.auth = auth
        self.guard = guard
        self.node_id = node_id
        # route-managed ordered topics: their histories and the barrier passes recorded by
        # the leaders (this node's own included), both from the etcd watch
        self.histories: dict[str, RouteHistory] = {}
        self.passes: dict[str, dict[str, set[int]]] = {}
        self.passes_sent: set[tuple[str, str, int]] = set()
        self.pass_tasks: set[asyncio.Task[None]] = set()
        self.resets: dict[tuple[str, str], ResetRecord] = {}
        self.held_resets = HeldResets(Path(nsqd.data_path) / "cluster-reset-holds.json")

    # -- the watch ---------------------------------------------------------------------------
    def clear(self) -> None:
        self.histories.clear()
        self.passes.clear()
        self.resets.clear()

    def apply_kv(self, key: bytes, value: bytes | None) -> bool:
        """Take a watched key if it is a route's (False: not one of these)."""
        root = self.root
        if key.startswith(routes_prefix(root)):
            name = key[len(routes_prefix(root)):].decode()
            if value is None:
                self.histories.pop(name, None)
            else:
                self.histories[name] = RouteHistory.from_json(value)
        elif key.startswith(passes_prefix(root)):
            found = parse_pass_key(root, key)
            if found is not None:
                topic, channel, p = found
                passes = self.passes.setdefault(topic, {}).setdefault(channel, set())
                if value is not None:
                    passes.add(p)
                else:  # a cluster reset of the channel walks that partition again
                    passes.discard(p)
                    self.passes_sent.discard((topic, channel, p))
        elif key.startswith(resets_prefix(root)):
            where = parse_reset_key(root, key)
            if where is not None:
                if value is None:
                    self.resets.pop(where, None)
                else:
                    self.resets[where] = ResetRecord.from_json(value)
        else:
            return False
        return True

    def sync_all(self) -> None:
        for name in list(self.histories):
            self.sync(name)

    def sync(self, name: str) -> None:
        """Give the local topic the route history from etcd and the barrier passes other
        nodes recorded (nsqd's TopicRoutes never reads etcd itself)."""
        h = self.histories.get(name)
        topic = self.nsqd.topics.get(name)
        if h is None or topic is None:
            return
        routes = topic.routes
        if routes is None:
            routes = TopicRoutes.mirror(self.nsqd, topic, h, lambda p: self.leads(name, p),
                                        lambda ch, p: self.record_pass(name, ch, p))
            for part in topic.partitions:
                if not topic.ephemeral:
                    self.guard(part)
        elif (routes.history.newest.version, routes.history.pending is not None) <= (
                h.newest.version, h.pending is not None):  # never back to an older copy
            routes.apply(h)
        for channel, parts in self.passes.get(name, {}).items():
            routes.set_passes(channel, parts)
        was_held = self.held_resets.restored(name)  # held when this node stopped
        for (topic, channel), rec in self.resets.items():
            # a reset this node was prepared for (held) whose apply call did not come (the
            # coordinator died after its transaction, or gave up while the node restarted)
            if topic == name and (channel in routes.held or channel in was_held) and \
                    rec.gen > routes.reset_gen(channel):
                self.clear_sent(name, channel)
                routes.apply_reset(channel, rec.gen, rec.version, rec.offsets,
                                   set(self.passes.get(name, {}).get(channel, ())))
        routes.subscribe_led()

    # -- barrier passes ----------------------------------------------------------------------
    def leads(self, name: str, p: int) -> bool:
        gate = self.gates.get((name, p))
        return isinstance(gate, LeaderGate) and gate.active

    def record_pass(self, name: str, channel: str, p: int) -> None:
        """A channel passed the command message of a partition this node leads: record it in
        etcd (once), so the nodes leading the next version's partitions open them to it."""
        k = (name, channel, p)
        if k in self.passes_sent or not self.leads(name, p):
            return
        self.passes_sent.add(k)
        self.passes.setdefault(name, {}).setdefault(channel, set()).add(p)
        task = asyncio.get_running_loop().create_task(self.put_pass(name, channel, p),
                                                      name=f"pass {name}/{channel}")
        self.pass_tasks.add(task)
        task.add_done_callback(self.pass_tasks.discard)

    def clear_sent(self, name: str, channel: str) -> None:
        self.passes_sent = {k for k in self.passes_sent if k[:2] != (name, channel)}

    async def put_pass(self, name: str, channel: str, p: int) -> None:
        key = pass_key(self.root, name, channel, p)
        for attempt in range(100):
            try:
                await self.etcd.put(key, b"1")
                log.info("CLUSTER: TOPIC(%s) CHANNEL(%s): passed the command message of "
                         "partition %d (recorded for the other nodes)", name, channel, p)
                return
            except EtcdError as e:
                log.warning("CLUSTER: recording a route pass failed (%s); retry %d", e, attempt)
                await asyncio.sleep(0.5)
        self.passes_sent.discard((name, channel, p))

    async def h_route_seal(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/seal?topic=T&partition=P&version=V`` (the coordinator): append
        the command message of route version V to P, which this node leads, and answer once
        the ISR has it. The history is read from etcd first, so the seal never runs ahead of
        the pending change it belongs to."""
        caller = await self.auth.caller(request)
        if isinstance(caller, web.Response):
            return caller
        q = request.query
        try:
            name, p, version = q["topic"], int(q["partition"]), int(q["version"])
        except (KeyError, ValueError):
            return answer(400, {"message": "E_INVALID",
                                 "detail": "topic, partition and version are required"})
        gate = self.gates.get((name, p))
        if not isinstance(gate, LeaderGate) or not gate.active:
            return answer(409, {"message": "E_NOT_LEADER"})
        try:
            kv = await self.etcd.get(routes_key(self.root, name))
        except EtcdError as e:
            return answer(503, {"message": f"E_CLUSTER_UNAVAILABLE: {e}"})
        if kv is None:
            return answer(404, {"message": "TOPIC_NOT_FOUND"})
        h = RouteHistory.from_json(kv.value)
        if h.retired_in(p) != version:
            return answer(400, {"message": f"partition {p} is not retired by route version "
                                            f"{version}"})
        known = self.histories.get(name)
        if known is None or (known.newest.version, known.pending is not None) <= (
                h.newest.version, h.pending is not None):
            self.histories[name] = h  # the watch may not have brought it yet
        self.sync(name)
        routes = gate.topic.routes
        if routes is None:
            return answer(409, {"message": "E_NOT_ROUTE_MANAGED"})
        try:
            off, fut = routes.seal(p)
            if fut is not None:
                await fut
        except RouteError as e:
            return answer(400, {"message": str(e)})
        if gate.acked_end() <= off:  # wait until the ISR has the command message
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            gate.wrap(gate.topic, off + 1, settle(done))(off, None)
            try:
                await asyncio.wait_for(done, 10)
            except (TimeoutError, PublishRefused) as e:
                return answer(503, {"message": f"command message not replicated: {e}"})
        log.info("CLUSTER: TOPIC(%s) PARTITION(%d): sealed for route version %d (command "
                 "message at %d)", name, p, version, off)
        return answer(200, {"offset": off})

    # -- cluster reset of a channel (the coordinator's steps on this node) -------------------
    async def reset_target(self, request: web.Request
                            ) -> tuple[str, str, Any] | web.Response:
        caller = await self.auth.caller(request)
        if isinstance(caller, web.Response):
            return caller
        q = request.query
        name, channel = q.get("topic", ""), q.get("channel", "")
        try:
            pass_key(self.root, name, channel, 0)  # validates both names
        except RouteError as e:
            return answer(400, {"message": "E_INVALID", "detail": str(e)})
        topic = self.nsqd.topics.get(name)
        return name, channel, topic.routes if topic is not None else None

    async def h_reset_prepare(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/reset/prepare?topic=T&channel=C&to=POS`` (the coordinator):
        hold channel C on this node (nothing delivered, so no barrier pass is recorded),
        wait for the pass records already under way, and report, per partition this node
        leads, where POS is, the log's bounds and the command message's offset."""
        found = await self.reset_target(request)
        if isinstance(found, web.Response):
            return found
        name, channel, routes = found
        try:
            pos = parse_start_position(request.query.get("to", "").encode())
        except ProtocolError:
            return answer(400, {"message": "E_INVALID", "detail": "bad position"})
        if routes is None:  # this node holds nothing of the topic
            return answer(200, {"node": self.node_id(), "partitions": {}})
        routes.hold(channel, RESET_HOLD)
        self.held_resets.add(name, channel)
        busy = [t for t in self.pass_tasks if t.get_name() == f"pass {name}/{channel}"]
        if busy:
            _done, pending = await asyncio.wait(busy, timeout=5)
            if pending:
                routes.release(channel)
                return answer(503, {"message": "E_CLUSTER_UNAVAILABLE",
                                     "detail": f"{self.node_id()}: a barrier pass of {channel} "
                                               f"could not be recorded in etcd"})
        parts = routes.prepare_reset(channel, pos)
        return answer(200, {"node": self.node_id(),
                             "partitions": {str(p): v for p, v in parts.items()}})

    async def h_reset_apply(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/reset/apply?topic=T&channel=C&gen=N``: apply the reset record
        N the coordinator committed (read from etcd with the channel's pass keys, so this
        never acts on an older watch view), then deliver again."""
        found = await self.reset_target(request)
        if isinstance(found, web.Response):
            return found
        name, channel, routes = found
        try:
            gen = int(request.query.get("gen", ""))
            kv = await self.etcd.get(reset_key(self.root, name, channel))
            kvs, _ = await self.etcd.get_prefix(passes_prefix(self.root)
                                                + f"{name}/{channel}/".encode())
        except ValueError:
            return answer(400, {"message": "E_INVALID", "detail": "gen must be an integer"})
        except EtcdError as e:
            return answer(503, {"message": "E_CLUSTER_UNAVAILABLE", "detail": str(e)})
        if kv is None:
            return answer(404, {"message": "E_NO_RESET"})
        rec = ResetRecord.from_json(kv.value)
        if rec.gen != gen:
            return answer(409, {"message": "E_STALE_RESET", "gen": rec.gen})
        self.resets[(name, channel)] = rec
        self.held_resets.discard(name, channel)
        passes = {pk[2] for k in kvs if (pk := parse_pass_key(self.root, k.key))}
        self.passes.setdefault(name, {})[channel] = set(passes)
        self.clear_sent(name, channel)
        applied = False
        if routes is not None:
            applied = routes.apply_reset(channel, rec.gen, rec.version, rec.offsets, passes)
            routes.subscribe_led()
        return answer(200, {"node": self.node_id(), "applied": applied, "gen": rec.gen})

    async def h_reset_release(self, request: web.Request) -> web.Response:
        """``POST /nsqx/route/reset/release?topic=T&channel=C``: the coordinator gave the
        reset up before its transaction: deliver again, nothing changed."""
        found = await self.reset_target(request)
        if isinstance(found, web.Response):
            return found
        name, channel, routes = found
        self.held_resets.discard(name, channel)
        if routes is not None:
            routes.release(channel)
        return answer(200, {"node": self.node_id()})
