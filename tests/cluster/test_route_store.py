"""nsqx.cluster.route_store against a real etcd: the route history under ``routes/<topic>``
replaced only by a CAS on its mod revision, with RouteHistory's rules (one pending change,
versions +1) applied before any write; pass keys round-trip."""

from __future__ import annotations

import pytest

from nsqx.cluster.etcd import EtcdClient, Op
from nsqx.cluster.etcd_server import EtcdServer
from nsqx.cluster.route_store import EtcdRouteStore, parse_pass_key, pass_key
from nsqx.nsqd.routing import RouteConflict
from nsqx.protocol.routes import RouteError, RouteHistory
from tests.client.helpers import run

ROOT = b"/nsqx/test/"


def test_cas_pending_commit_and_a_lost_race(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            a = EtcdRouteStore(etcd, ROOT, "t")
            b = EtcdRouteStore(etcd, ROOT, "t")
            assert await a.fetch() is None
            h0 = RouteHistory.initial("t", ["n1", "n2"], 16)
            await a.replace(None, h0, [Op.put(ROOT + b"extra", b"1")])
            assert await etcd.get(ROOT + b"extra") is not None  # same transaction
            with pytest.raises(RouteConflict):  # b never read it: creating again loses
                await b.replace(None, h0)
            assert b.load() == h0  # the loser re-read what won
            pending = h0.split(0, 4)
            await a.replace(h0, pending)
            with pytest.raises(RouteError, match="still pending; one change at a time"):
                pending.merge(0, 1)
            # b read before a's write: its CAS on the old mod revision loses
            b2 = EtcdRouteStore(etcd, ROOT, "t")
            await b2.fetch()
            committed = pending.commit(1, 123)
            await a.replace(pending, committed)
            with pytest.raises(RouteConflict, match="now version 1"):
                await b2.replace(pending, pending.abort())
            fresh = EtcdRouteStore(etcd, ROOT, "t")
            got = await fresh.fetch()
            assert got == committed and got.newest.version == 1 and got.pending is None
            # a stale copy (kept by a deposed writer) never overwrites
            with pytest.raises(RouteConflict):
                await a.replace(pending, committed.split(2, 2))

    run(body())


def test_pass_keys() -> None:
    k = pass_key(ROOT, "t", "c", 7)
    assert k == ROOT + b"route_passed/t/c/7"
    assert parse_pass_key(ROOT, k) == ("t", "c", 7)
    assert parse_pass_key(ROOT, ROOT + b"routes/t") is None
    with pytest.raises(RouteError):
        pass_key(ROOT, "t", "bad/name", 1)


def test_place_created_leads_on_the_route_node_and_spreads_followers() -> None:
    from nsqx.cluster.model import PartitionMeta
    from nsqx.cluster.route_coord import place_created

    h = RouteHistory.initial("t", ["a", "b"], 16)
    busy = [PartitionMeta("x", i, ("c",), "c", 1, ("c",)) for i in range(3)]
    placed = place_created("t", h.split(0, 4), 2, ["a", "b", "c"], busy)
    assert [(p.partition, p.leader, p.replicas) for p in placed] == [
        (2, "a", ("a", "b")), (3, "a", ("a", "b"))]  # b holds fewer replicas than c
    assert all(p.isr == p.replicas and p.epoch == 1 for p in placed)
    placed = place_created("t", h.move(1, "c"), 3, ["a", "b", "c"], [])
    assert placed[0].leader == "c" and set(placed[0].replicas) == {"a", "b", "c"}
    with pytest.raises(RouteError, match="node gone is not a live node"):
        place_created("t", h.move(1, "gone"), 1, ["a", "b"], [])
    with pytest.raises(RouteError, match="replicator 3 is more than the 2 live nodes"):
        place_created("t", h.split(0, 4), 3, ["a", "b"], [])


def test_relabel_dead_nodes_uses_the_current_leader() -> None:
    from nsqx.cluster.route_coord import relabel_dead_nodes

    h = RouteHistory.initial("t", ["dead", "b"], 16)
    new = relabel_dead_nodes(h, h.split(0, 4), ["b", "c"], {0: "c", 1: "b"})
    assert [(r.partition, r.node) for r in new.pending.routes] == [(2, "c"), (3, "c"), (1, "b")]
    new = relabel_dead_nodes(h, h.merge(0, 1), ["b", "c"], {0: None, 1: "b"})
    assert [(r.partition, r.node) for r in new.pending.routes] == [(2, "b")]
    alive = h.split(1, 12)
    assert relabel_dead_nodes(h, alive, ["b"], {}) is alive  # its node lives: unchanged
    moved = h.move(1, "gone")
    assert relabel_dead_nodes(h, moved, ["b"], {}) is moved  # a move's node is the operator's


def test_held_resets_survive_a_restart_and_settle_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A hold taken for a cluster reset is on disk: the next process finds it once (its first
    route sync applies a newer reset record or none), and apply/release clear it."""
    from nsqx.cluster.route_store import HeldResets

    path = tmp_path / "holds.json"
    held = HeldResets(path)
    held.add("t", "a")
    held.add("t", "b")
    held.add("u", "a")
    held.discard("t", "b")  # released (or applied) before the stop
    again = HeldResets(path)  # the node restarted
    assert again.restored("t") == {"a"}
    assert again.restored("t") == set()  # once: the first sync settles it
    assert HeldResets(path).restored("t") == set()  # and it is gone from disk
    assert HeldResets(path).restored("u") == {"a"}
    path.write_text("not json")
    assert HeldResets(path).restored("u") == set()  # unreadable: forgotten, no crash
