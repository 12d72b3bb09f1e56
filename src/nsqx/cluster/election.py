"""Leader election through an etcd lease: who coordinates the cluster.

The candidate that creates the election key (a transaction that succeeds only while the key
is absent) under its lease leads until the lease ends: it stops refreshing (process killed,
paused past the TTL, cut off from etcd) or resigns. The others watch the key and campaign
again when it is deleted. Each win bumps a term, so a deposed leader's late writes can be
told from the new leader's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nsqx.cluster.etcd import Compare, EtcdClient, EtcdError, Op
from nsqx.cluster.outage import Outage

log = logging.getLogger("nsqx.cluster.election")


class Election:
    """Campaign for ``key``; ``on_change(leader_id_or_None, is_me)`` follows every change."""

    def __init__(self, etcd: EtcdClient, key: bytes, candidate_id: str, *, ttl: int = 5,
                 on_change: Callable[[str | None, bool], None] | None = None) -> None:
        self.etcd = etcd
        self.key = key
        self.candidate_id = candidate_id
        self.ttl = ttl
        self.on_change = on_change
        self.leader: str | None = None
        self.lease = 0
        self._task: asyncio.Task[None] | None = None
        self._won = asyncio.Event()
        # a steady retry (leadership must be regained soon), logged once per state change
        retry = min(1.0, ttl / 3)
        self.outage = Outage(f"election {key.decode(errors='replace')}", log,
                             first=retry, cap=retry)

    @property
    def is_leader(self) -> bool:
        return self.leader == self.candidate_id

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"election {self.key!r}")

    async def wait_leader(self) -> None:
        await self._won.wait()

    async def close(self, *, resign: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if resign and self.lease:
            with contextlib.suppress(EtcdError):
                await self.etcd.lease_revoke(self.lease)
            self.lease = 0

    def _set(self, leader: str | None) -> None:
        if leader != self.leader:
            self.leader = leader
            log.info("election %s: leader is now %s%s", self.key.decode(errors="replace"),
                     leader, " (this node)" if leader == self.candidate_id else "")
            if leader == self.candidate_id:
                self._won.set()
            else:
                self._won.clear()
            if self.on_change is not None:
                self.on_change(leader, leader == self.candidate_id)

    async def _run(self) -> None:
        while True:
            try:
                await self._campaign_once()
            except EtcdError as e:
                if self.is_leader:
                    self._set(None)  # cannot prove leadership without etcd: step down
                self.lease = 0
                await self.outage.failed(e)

    async def _campaign_once(self) -> None:
        self.lease = await self.etcd.lease_grant(self.ttl)
        self.outage.ok()
        won, rev = await self.etcd.txn(
            [Compare.absent(self.key)],
            [Op.put(self.key, self.candidate_id.encode(), self.lease)])
        if won:
            self._set(self.candidate_id)
            await self._keep_alive()  # returns when the lease is lost
            self._set(None)
            return
        await self.etcd.lease_revoke(self.lease)
        self.lease = 0
        current = await self.etcd.get(self.key)
        if current is None:
            return  # gone meanwhile: campaign again at once
        self._set(current.value.decode())
        # wait for the key to go (its lease ended or the leader resigned)
        async for events in self.etcd.watch_prefix(self.key, current.mod_revision + 1):
            for ev in events:
                if ev.kv.key != self.key:
                    continue
                if ev.type == "DELETE":
                    self._set(None)
                    return
                self._set(ev.kv.value.decode())

    async def _keep_alive(self) -> None:
        interval = max(self.ttl / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            if await self.etcd.lease_keepalive(self.lease) <= 0:
                log.warning("election %s: lease expired, stepping down",
                            self.key.decode(errors="replace"))
                self.lease = 0
                return
