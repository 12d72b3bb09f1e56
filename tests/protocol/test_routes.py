"""Key hashing and route history of ordered topics: every operation, every refusal, storage
round trips."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import orjson
import pytest

from nsqx.cluster.model import ClusterKeys
from nsqx.protocol.routes import (
    Change,
    Route,
    RouteError,
    RouteHistory,
    RouteVersion,
    command_body,
    key_partition,
    logical_partition,
    parse_command,
    routes_key,
)
from nsqx.protocol.v2 import StartKind, StartPosition


def two() -> RouteHistory:
    return RouteHistory.initial("orders", ["a", "b"], logical=16)


def test_initial_covers_all_logical_partitions_evenly() -> None:
    h = RouteHistory.initial("orders", ["a", "b", "c"])
    assert h.logical == 1024
    assert [(r.lo, r.hi, r.partition, r.node) for r in h.newest.routes] == [
        (0, 341, 0, "a"), (341, 682, 1, "b"), (682, 1024, 2, "c")]
    assert h.next_partition == 3 and h.newest.version == 0 and h.pending is None
    assert h.open_partitions() == (0, 1, 2)


def test_key_routing_uses_the_client_hash_and_the_newest_version() -> None:
    h = RouteHistory.initial("orders", ["a", "b", "c", "d"])
    for key in ["k1", b"k2", "\u00e9t\u00e9", ""]:
        data = key.encode() if isinstance(key, str) else key
        logical = zlib.crc32(data) % 1024
        assert logical_partition(key, 1024) == key_partition(key, 1024) == logical
        r = h.route(key)
        assert r.lo <= logical < r.hi
    some = h.route("k1")
    h2 = h.split(some.partition, some.lo + 1).commit(1)
    r2 = h2.route("k1")
    assert r2.partition >= 4 and r2.lo <= logical_partition("k1") < r2.hi
    assert h2.version(0).lookup(logical_partition("k1")) == some  # old versions stay readable


def test_lookup_boundaries() -> None:
    v = two().newest
    assert v.lookup(0).partition == 0 and v.lookup(7).partition == 0
    assert v.lookup(8).partition == 1 and v.lookup(15).partition == 1
    for bad in (-1, 16):
        with pytest.raises(RouteError, match="out of range"):
            v.lookup(bad)


def test_split_creates_two_new_partitions_and_retires_the_old_one() -> None:
    h = two().split(0, 3, expect=0)
    assert h.newest.version == 0, "pending until committed: producers keep version 0"
    assert h.pending is not None and h.pending.version == 1
    assert h.pending_change == Change(1, "split", (0,), (2, 3))
    assert h.open_partitions() == (1,), "the retired partition is sealed while pending"
    h = h.commit(1, now_ms=5)
    assert [(r.lo, r.hi, r.partition, r.node) for r in h.newest.routes] == [
        (0, 3, 2, "a"), (3, 8, 3, "a"), (8, 16, 1, "b")]
    assert h.created_in(2) == h.created_in(3) == 1 and h.retired_in(0) == 1
    assert h.retired_in(1) is None and h.created_in(1) == 0
    assert h.next_partition == 4 and h.newest.committed_ms == 5


def test_split_onto_other_nodes() -> None:
    h = two().split(1, 12, nodes=("c", "d")).commit(1)
    assert [(r.partition, r.node) for r in h.newest.routes] == [(0, "a"), (2, "c"), (3, "d")]


def test_merge_adjacent_in_either_order() -> None:
    for a, b in ((0, 1), (1, 0)):
        h = two().merge(a, b).commit(1)
        assert h.newest.routes == (Route(0, 16, 2, "a"),)
        assert h.change(1) == Change(1, "merge", (0, 1), (2,))
    assert two().merge(0, 1, node="z").commit(1).newest.routes[0].node == "z"


def test_move_creates_a_new_partition_on_the_other_node() -> None:
    h = two().move(1, "c").commit(1)
    assert h.newest.routes[1] == Route(8, 16, 2, "c")
    assert h.change(1) == Change(1, "move", (1,), (2,))


def test_ids_are_never_reused_across_many_changes() -> None:
    h = two()
    h = h.split(0, 4).commit(1)   # 2, 3
    h = h.merge(2, 3).commit(2)   # 4
    h = h.move(4, "c").commit(3)  # 5
    h = h.merge(5, 1).commit(4)   # 6
    assert h.newest.routes == (Route(0, 16, 6, "c"),)
    assert [h.created_in(p) for p in range(7)] == [0, 0, 1, 1, 2, 3, 4]
    assert [h.retired_in(p) for p in range(7)] == [1, 4, 2, 2, 3, 4, None]
    assert [v.version for v in h.versions] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("at", [0, 8, 9, -1, 100])
def test_split_at_a_bad_boundary_is_refused(at: int) -> None:
    with pytest.raises(RouteError, match=r"cannot split partition 0 \[0, 8\) at .*strictly inside"):
        two().split(0, at)


def test_split_of_a_single_logical_partition_is_refused() -> None:
    h = RouteHistory.initial("t", ["a"], logical=1)
    with pytest.raises(RouteError, match="strictly inside"):
        h.split(0, 0)


def test_merge_of_non_adjacent_partitions_is_refused() -> None:
    h = RouteHistory.initial("t", ["a", "b", "c"], logical=12)
    with pytest.raises(RouteError, match="partitions 0 and 2 are not adjacent"):
        h.merge(0, 2)
    with pytest.raises(RouteError, match="with itself"):
        h.merge(1, 1)


def test_unknown_and_retired_partitions_are_refused() -> None:
    h = two().split(0, 4).commit(1)
    with pytest.raises(RouteError, match=r"partition 0 is not in route version 1 \(retired in "
                                         r"version 1\)"):
        h.move(0, "c")
    with pytest.raises(RouteError, match=r"partition 9 is not in route version 1 \(unknown\)"):
        h.split(9, 1)
    with pytest.raises(RouteError, match="not in route version"):
        h.merge(1, 42)


def test_move_to_the_same_node_is_refused() -> None:
    with pytest.raises(RouteError, match="already on a"):
        two().move(0, "a")


def test_one_change_at_a_time() -> None:
    h = two().split(0, 4)
    for op in (lambda: h.split(1, 10), lambda: h.merge(0, 1), lambda: h.move(1, "c")):
        with pytest.raises(RouteError, match="split to route version 1 is still pending; one "
                                             "change at a time"):
            op()
    with pytest.raises(RouteError, match="no pending change"):
        two().commit(1)
    with pytest.raises(RouteError, match="pending change is route version 1, not 2"):
        h.commit(2)
    aborted = h.abort()
    assert aborted.versions == two().versions and aborted.pending is None
    assert aborted.next_partition == 4, "ids of an aborted change stay burnt (never reused)"
    with pytest.raises(RouteError, match="no pending change to abort"):
        two().abort()


def test_stale_version_is_refused() -> None:
    h = two().split(0, 4).commit(1)
    with pytest.raises(RouteError, match="stale route version 0, newest is 1"):
        h.move(1, "c", expect=0)
    assert h.move(1, "c", expect=1).pending is not None


def test_versions_and_changes_lookup() -> None:
    h = two().split(0, 4).commit(1, now_ms=100).move(1, "c").commit(2, now_ms=200)
    with pytest.raises(RouteError, match="no route version 3"):
        h.version(3)
    with pytest.raises(RouteError, match="no change produced route version 0"):
        h.change(0)
    assert h.version_at(50) == 0 and h.version_at(100) == 1 and h.version_at(10**9) == 2


def test_restart_version_of_each_start_position() -> None:
    """One resolver for nsqd's and the cluster's channel reset (nsqd.routing, route_coord)."""
    h = two().split(0, 4).commit(1, now_ms=100_000).move(1, "c").commit(2, now_ms=200_000)
    assert h.restart_version(StartPosition(StartKind.EARLIEST)) == 0
    assert h.restart_version(StartPosition(StartKind.LATEST)) == 2
    assert h.restart_version(StartPosition(StartKind.TIMESTAMP, 150)) == 1
    with pytest.raises(RouteError, match="not to a partition's offset"):
        h.restart_version(StartPosition(StartKind.OFFSET, 5))


def test_ids_exhausted() -> None:
    h = RouteHistory("t", 16, two().versions, 65535)
    assert h.move(0, "z").pending is not None
    with pytest.raises(RouteError, match="exhausted"):
        h.split(0, 4)


def test_json_round_trip_with_pending() -> None:
    h = two().split(0, 4).commit(1, now_ms=7).merge(2, 3)
    raw = h.to_json()
    back = RouteHistory.from_json(raw)
    assert back == h and back.pending_change == h.pending_change
    assert RouteHistory.from_json(raw.decode()) == h


def _doc() -> dict:
    return orjson.loads(two().split(0, 4).commit(1).to_json())


def _bad(mutate: Callable[[dict], object], match: str) -> None:
    d = _doc()
    mutate(d)
    with pytest.raises(RouteError, match=match):
        RouteHistory.from_json(orjson.dumps(d))


def test_hostile_json_is_refused() -> None:
    for raw, match in [(b"{", "not JSON"), (b"[]", "JSON object"), (b"null", "JSON object"),
                       (b'{"versions": 3}', "'versions' must be a list")]:
        with pytest.raises(RouteError, match=match):
            RouteHistory.from_json(raw)
    v1 = lambda d: d["versions"][1]  # noqa: E731
    _bad(lambda d: v1(d)["routes"][0].__setitem__(1, 3), "gap at logical 3")
    _bad(lambda d: v1(d)["routes"][1].__setitem__(0, 2), "overlap at logical 4")
    _bad(lambda d: v1(d)["routes"][2].__setitem__(1, 15), "ranges end at 15, not at 16")
    _bad(lambda d: v1(d)["routes"][0].__setitem__(1, 0), "contiguous|empty range")
    _bad(lambda d: v1(d).__setitem__("version", 2), "expected 1, got 2")
    _bad(lambda d: d["versions"].reverse(), "expected 0, got 1")
    _bad(lambda d: d.__setitem__("versions", []), "needs version 0")
    _bad(lambda d: v1(d)["routes"][0].__setitem__(2, 0), "partition 0 changed its range")
    _bad(lambda d: v1(d)["routes"][0].__setitem__(2, 3), "holds two ranges")
    _bad(lambda d: v1(d)["routes"][0].__setitem__(2, 70000), "not in 0..65535")
    _bad(lambda d: v1(d)["routes"][0].__setitem__(3, ""), "no valid node")
    _bad(lambda d: v1(d)["routes"][0].__setitem__(0, "0"), "lo must be an integer")
    _bad(lambda d: v1(d)["routes"][0].__setitem__(0, True), "lo must be an integer")
    _bad(lambda d: v1(d)["routes"][0].pop(), r"must be \[lo, hi, partition, node\]")
    _bad(lambda d: v1(d).__setitem__("routes", {}), "a version must be an object")
    _bad(lambda d: d.__setitem__("next_partition", 3), "next partition id 3 is not above")
    _bad(lambda d: d.__setitem__("logical", 0), "logical partition count")
    _bad(lambda d: d.__setitem__("topic", "a b"), "invalid topic name")
    _bad(lambda d: d.__setitem__("topic", None), "topic must be a string")
    _bad(lambda d: d.__setitem__("pending", v1(d)), "expected 2, got 1")


def test_stored_versions_must_differ_by_one_legal_change() -> None:
    base = RouteVersion(0, (Route(0, 8, 0, "a"), Route(8, 16, 1, "b")))

    def hist(*routes: Route) -> RouteHistory:
        return RouteHistory("t", 16, (base, RouteVersion(1, routes)), 10)

    with pytest.raises(RouteError, match="changes nothing"):
        hist(*base.routes)
    with pytest.raises(RouteError, match="one change per version"):
        hist(Route(0, 4, 2, "a"), Route(4, 8, 3, "a"), Route(8, 12, 4, "b"), Route(12, 16, 5, "b"))
    with pytest.raises(RouteError, match="one change per version"):
        hist(Route(0, 2, 2, "a"), Route(2, 4, 3, "a"), Route(4, 8, 4, "a"), Route(8, 16, 1, "b"))
    with pytest.raises(RouteError, match="a move must change the node"):
        hist(Route(0, 8, 2, "a"), Route(8, 16, 1, "b"))
    with pytest.raises(RouteError, match="physical partition 0 reused"):
        RouteHistory("t", 16, (base, RouteVersion(1, (Route(0, 16, 2, "a"),)),
                               RouteVersion(2, (Route(0, 8, 0, "a"), Route(8, 16, 3, "a")))), 10)


def test_command_message_body_round_trip_and_refusals() -> None:
    h = two().split(0, 4)
    ch = h.pending_change
    assert ch is not None
    assert parse_command(command_body("orders", ch)) == ("orders", ch)
    for body in (b"", b"{}", b"[1]", b'{"nsqx_route_change": {"version": 1}}',
                 orjson.dumps({"nsqx_route_change": {"topic": "t", "version": 0, "kind": "split",
                                                     "retired": [0], "created": [1, 2]}}),
                 orjson.dumps({"nsqx_route_change": {"topic": "t", "version": 1, "kind": "zap",
                                                     "retired": [0], "created": [1, 2]}})):
        with pytest.raises(RouteError, match="not a route command message"):
            parse_command(body)


def test_routes_key_sits_beside_the_other_cluster_keys() -> None:
    keys = ClusterKeys("c1")
    assert routes_key(keys.root, "orders") == b"/nsqx/c1/routes/orders"
    with pytest.raises(RouteError, match="invalid topic name"):
        routes_key(keys.root, "a/b")
