"""A publish that reaches a follower goes to the partition's leader (issue 28 defect 2).

The leader is looked up in the partition's metadata on every attempt, not fixed when the
publish arrived: during a failover the first attempt may go to a dead leader, and the
retries follow the metadata to the new one, or append here once this node leads. An
attempt in flight is given up as soon as the metadata names another leader. The publish
fails only when no leader took it within ``FORWARD_TIMEOUT``, with the last reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from nsqx.client import NSQError, Producer
from nsqx.cluster.forward import split_replayed, traced_offset
from nsqx.cluster.model import NodeInfo, PartitionMeta
from nsqx.nsqd.idempotence import IdempotenceError, deduper_for, has_mark
from nsqx.nsqd.topic import PublishRefused

__all__ = ["FORWARD_TIMEOUT", "Forwarder", "reason_of"]

log = logging.getLogger("nsqx.cluster.member")

FORWARD_TIMEOUT = 10.0  # a forwarded publish fails when no leader took it within this
RETRY_FIRST = 0.05  # the first pause between attempts; doubled up to RETRY_CAP
RETRY_CAP = 1.0
WATCH_EVERY = 0.1  # an attempt in flight checks this often whether leadership moved
# the leader's answers that may change with the leader (not leading any more, ISR shrunk
# during the failover): tried again; any other error is the publish's own and final
RETRIED_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED",
                           "E_FAILED_ON_NOT_LEADER"})


class ClusterView(Protocol):
    """What the forwarder reads of the member: this node and the metadata it watches."""

    node_id: str
    partitions: dict[tuple[str, int], PartitionMeta]
    nodes: dict[str, NodeInfo]


class LeaderMoved(Exception):
    pass


def reason_of(exc: BaseException) -> str:
    """Why an attempt failed, never empty (a timeout's str() is)."""
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text and name not in text else (text or name)


class Forwarder:
    """Forwards publishes for one member; one producer per leader address."""

    def __init__(self, member: ClusterView, timeout: float = FORWARD_TIMEOUT) -> None:
        self.member = member
        self.timeout = timeout
        self.producers: dict[str, Any] = {}  # leader tcp address -> nsqx.client Producer
        self._tasks: set[asyncio.Task[None]] = set()
        self.local_appends = 0  # forwarded publishes this node appended once it led

    def start(self, topic: Any, bodies: list[bytes], defer_ms: int,
              headers: list[dict[str, bytes] | None] | None, command: bytes,
              done: Callable, on_replayed: Callable[[], None] | None = None) -> None:
        task = asyncio.get_running_loop().create_task(
            self._forward(topic, bodies, defer_ms, headers, command, done, on_replayed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for producer in self.producers.values():
            with contextlib.suppress(Exception):
                await producer.close(timeout=1)
        self.producers.clear()

    def _producer(self, addr: str) -> Any:
        producer = self.producers.get(addr)
        if producer is None:
            producer = self.producers[addr] = Producer(addr, wait_timeout=self.timeout,
                                                       user_agent="nsqx-forward")
        return producer

    async def _forward(self, topic: Any, bodies: list[bytes], defer_ms: int,
                       headers: list[dict[str, bytes] | None] | None, command: bytes,
                       done: Callable, on_replayed: Callable[[], None] | None) -> None:
        loop = asyncio.get_running_loop()
        key = (topic.name, topic.partition)
        deadline = loop.time() + self.timeout
        delay = RETRY_FIRST
        reason = "no leader"
        try:
            while True:
                meta = self.member.partitions.get(key)
                leader_id = meta.leader if meta is not None else None
                node = self.member.nodes.get(leader_id) if leader_id else None
                if leader_id is None:
                    reason = "the partition has no leader"
                elif leader_id == self.member.node_id:
                    refusal = self._local_refusal(topic, len(bodies))
                    if refusal is None:  # this node leads now: append here
                        self.local_appends += 1
                        self._append_here(topic, bodies, defer_ms, headers, done,
                                          on_replayed)
                        return
                    reason = f"this node leads but refuses: {refusal}"
                elif node is None:
                    reason = f"the leader {leader_id} is not registered"
                else:
                    try:
                        answer = await self._attempt(node.tcp_address, key, leader_id,
                                                     command, deadline)
                    except NSQError as e:
                        if e.code not in RETRIED_CODES and not e.retriable \
                                and not isinstance(e, ConnectionError):
                            self._fail(topic, len(bodies), node.tcp_address, reason_of(e), done)
                            return
                        reason = f"the leader at {node.tcp_address}: {reason_of(e)}"
                    except (LeaderMoved, OSError, TimeoutError) as e:
                        reason = f"the leader at {node.tcp_address}: {reason_of(e)}"
                    except Exception as e:  # unexpected: answered, never left hanging
                        log.exception("CLUSTER: TOPIC(%s): forwarding failed", topic.name)
                        self._fail(topic, len(bodies), node.tcp_address, reason_of(e), done)
                        return
                    else:
                        answer, replayed = split_replayed(answer)
                        if replayed and on_replayed is not None:
                            on_replayed()  # (the leader says so only when asked)
                        done(traced_offset(answer), None)
                        return
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self._fail(topic, len(bodies), None, reason, done)
                    return
                log.debug("CLUSTER: TOPIC(%s) PARTITION(%d): forwarding: %s; trying again",
                          topic.name, topic.partition, reason)
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, RETRY_CAP)
        except asyncio.CancelledError:  # the node stops
            done(-1, PublishRefused(f"TOPIC({topic.name}): node stopping while forwarding"))
            raise

    @staticmethod
    def _append_here(topic: Any, bodies: list[bytes], defer_ms: int,
                     headers: list[dict[str, bytes] | None] | None, done: Callable,
                     on_replayed: Callable[[], None] | None = None) -> None:
        """Append a publish this node was forwarding, now that it leads. A marked one
        (idempotent) passes the check a leader makes: an earlier attempt may have reached
        the old leader and been replicated here before it died (a repeat: ``on_replayed``
        before ``done``)."""
        if headers is not None and has_mark(headers):
            repeat = None
            if on_replayed is not None:
                def repeat(base: int, exc: Exception | None) -> None:
                    on_replayed()
                    done(base, exc)
            try:
                deduper_for(topic).publish(bodies, defer_ms, headers, done, repeat=repeat)
            except IdempotenceError as exc:
                done(-1, NSQError(exc.code, exc.text))
            return
        # done records the pub trace events already (the first publish)
        topic.publish(bodies, defer_ms, done, headers=headers, trace=False)

    @staticmethod
    def _local_refusal(topic: Any, count: int) -> str | None:
        """None when this node's gate for ``topic`` admits the publish as its leader."""
        gate = topic.gate
        if gate is None or gate.forwards:
            return "it is still taking over the partition"
        refusal: str | None = gate.refuse(topic, count)
        return refusal

    async def _attempt(self, addr: str, key: tuple[str, int], leader_id: str, command: bytes,
                       deadline: float) -> bytes:
        """One send to ``addr``; given up when the metadata names another leader."""
        loop = asyncio.get_running_loop()
        sending = asyncio.ensure_future(self._producer(addr).send_command(command))
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"no answer within {self.timeout:g} s")
                finished, _ = await asyncio.wait({sending}, timeout=min(WATCH_EVERY, remaining))
                if finished:
                    return sending.result()
                meta = self.member.partitions.get(key)
                now = meta.leader if meta is not None else None
                if now != leader_id:
                    raise LeaderMoved(f"leadership moved from {leader_id} to {now or 'none'}")
        finally:
            if not sending.done():
                sending.cancel()
                with contextlib.suppress(BaseException):
                    await sending

    def _fail(self, topic: Any, count: int, addr: str | None, reason: str,
              done: Callable) -> None:
        where = f"to the leader at {addr}" if addr else "to the partition's leader"
        log.warning("CLUSTER: TOPIC(%s) PARTITION(%d): forwarding %d messages %s failed: %s",
                    topic.name, topic.partition, count, where, reason)
        done(-1, PublishRefused(f"TOPIC({topic.name}): forwarding {where} failed: {reason}"))
