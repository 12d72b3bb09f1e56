"""Coordinator election on a real etcd: one leader, takeover when it dies or resigns."""

from __future__ import annotations

import asyncio

from nsqx.cluster.election import Election
from nsqx.cluster.etcd import EtcdClient
from nsqx.cluster.etcd_server import EtcdServer
from tests.client.helpers import run, wait_for

KEY = b"/nsqx/test/coordinator"


def test_one_leader_then_takeover_on_resign(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        clients = [EtcdClient([etcd_server.endpoint]) for _ in range(3)]
        elections = [Election(c, KEY, f"lookupd-{i}", ttl=2) for i, c in enumerate(clients)]
        try:
            for e in elections:
                e.start()
            await wait_for(lambda: all(e.leader is not None for e in elections), 10)
            leaders = [e for e in elections if e.is_leader]
            assert len(leaders) == 1
            assert {e.leader for e in elections} == {leaders[0].candidate_id}
            first = leaders[0]
            await first.close(resign=True)
            rest = [e for e in elections if e is not first]
            await wait_for(lambda: sum(e.is_leader for e in rest) == 1
                           and rest[0].leader == rest[1].leader, 10)
            assert rest[0].leader != first.candidate_id
        finally:
            for e in elections:
                await e.close()
            for c in clients:
                await c.close()

    run(body())


def test_takeover_when_the_leader_stops_refreshing(etcd_server: EtcdServer) -> None:
    """A leader that dies without resigning (its lease just ends) is replaced after the TTL."""

    async def body() -> None:
        ca, cb = EtcdClient([etcd_server.endpoint]), EtcdClient([etcd_server.endpoint])
        a = Election(ca, KEY, "a", ttl=1)
        b = Election(cb, KEY, "b", ttl=1)
        try:
            a.start()
            await asyncio.wait_for(a.wait_leader(), 10)
            b.start()
            await wait_for(lambda: b.leader == "a", 10)
            await a.close(resign=False)  # like kill -9: the lease is left to expire
            await wait_for(lambda: b.is_leader, 15)
        finally:
            await a.close()
            await b.close()
            await ca.close()
            await cb.close()

    run(body())
