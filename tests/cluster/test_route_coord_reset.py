"""The pure steps of a cluster channel reset (nsqx.cluster.route_coord): the version a
position restarts on (``reset_target``) and the check of the leaders' reports
(``check_reset``); the whole reset across processes is in test_routes_reset_cluster.py."""

from __future__ import annotations

from typing import Any

import pytest

from nsqx.cluster.route_coord import ResetPlan, ResetRefused, check_reset, reset_target
from nsqx.protocol.routes import RouteHistory
from nsqx.protocol.v2 import StartKind, StartPosition

# partitions 0 (retired by version 1, committed at 100 s) and 1 on node a; 2 and 3 on b
HISTORY = RouteHistory.initial("t", ["a", "a"], logical=16).split(0, 4, ("b", "b")) \
    .commit(1, now_ms=100_000)
LEADERS: dict[int, str | None] = {0: "a", 1: "a", 2: "b", 3: "b"}
EARLIEST, LATEST = StartPosition(StartKind.EARLIEST), StartPosition(StartKind.LATEST)


def plan(pos: StartPosition) -> ResetPlan:
    version, to = reset_target(HISTORY, pos, now_ms=200_000)
    return ResetPlan("t", None, HISTORY, version, to, {}, LEADERS,  # type: ignore[arg-type]
                     b"k", None)


def reports(**over: dict[str, Any]) -> dict[str, dict]:
    """Node a leads 0 (sealed at offset 5 of 6) and 1, node b leads 2 and 3."""
    row = {"offset": 0, "start": 0, "end": 6, "command": None, "channel": True}
    rows = {p: dict(row) for p in "0123"}
    rows["0"]["command"] = 5
    for p, changes in over.items():
        rows[p.removeprefix("p")].update(changes)
    return {"a": {"0": rows["0"], "1": rows["1"]}, "b": {"2": rows["2"], "3": rows["3"]}}


def refusal(pos: StartPosition, reps: dict[str, dict]) -> tuple[int, str]:
    with pytest.raises(ResetRefused) as ei:
        check_reset(plan(pos), "c", pos, reps)
    return ei.value.status, ei.value.code


def test_target_version_and_text_of_each_position() -> None:
    assert reset_target(HISTORY, EARLIEST, 200_000) == (0, "earliest")
    assert reset_target(HISTORY, LATEST, 200_000) == (1, "latest")
    at = StartPosition(StartKind.TIMESTAMP, 150)
    assert reset_target(HISTORY, at, 200_000) == (1, "timestamp:150")
    for pos, now in ((StartPosition(StartKind.TIMESTAMP, 300), 200_000),
                     (StartPosition(StartKind.OFFSET, 3), 200_000)):
        with pytest.raises(ResetRefused) as ei:
            reset_target(HISTORY, pos, now)
        assert (ei.value.status, ei.value.code) == (400, "E_INVALID")


def test_offsets_and_the_retired_partitions_already_passed() -> None:
    assert check_reset(plan(EARLIEST), "c", EARLIEST, reports()) == (
        {0: 0, 1: 0, 2: 0, 3: 0}, frozenset())
    latest = reports(p0={"offset": 6}, p1={"offset": 6}, p2={"offset": 2}, p3={"offset": 3})
    assert check_reset(plan(LATEST), "c", LATEST, latest) == (
        {0: 6, 1: 6, 2: 2, 3: 3}, frozenset({0}))


def test_refusals() -> None:
    missing = reports()
    del missing["b"]["3"]
    assert refusal(EARLIEST, missing) == (503, "E_NO_LEADER")
    gone = reports(p1={"start": 4, "offset": 4})  # retention deleted 0..3, the walk needs them
    assert refusal(EARLIEST, gone) == (400, "E_RETENTION")
    assert check_reset(plan(LATEST), "c", LATEST, gone)[0][1] == 4  # latest needs none
    assert refusal(EARLIEST, reports(p0={"command": None})) == (503, "E_NOT_SEALED")
    nowhere = reports(**{p: {"channel": False} for p in ("p0", "p1", "p2", "p3")})
    assert refusal(EARLIEST, nowhere) == (404, "CHANNEL_NOT_FOUND")
