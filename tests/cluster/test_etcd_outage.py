"""etcd unreachable (issue 28 defect 4): the metadata watch of a cluster nsqd retried every
0.5 s and logged every retry for as long as etcd was down. Now: capped exponential backoff
and one line per change of state (lost, still down once a minute, back)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nsqx.cluster.etcd import EtcdUnavailable
from nsqx.cluster.member import NodeMember
from nsqx.cluster.outage import Outage

FAILURES = 40


async def _no_delete(name: str) -> None:
    raise AssertionError(f"nothing is deleted here ({name})")


def _member(tmp_path: Path) -> NodeMember:
    nsqd = SimpleNamespace(opts=SimpleNamespace(cluster_replication="stream"),
                           data_path=str(tmp_path), http_route_hooks=[], topic_hooks=[],
                           archiver=None, topics={}, delete_topic=_no_delete)
    return NodeMember(nsqd, ["http://127.0.0.1:1"], "t")


def test_metadata_watch_backs_off_and_logs_changes_of_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nsqx.cluster")
    now = [1000.0]
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float, result: Any = None) -> Any:
        delays.append(delay)
        now[0] += delay
        await real_sleep(0)
        return result

    async def main() -> None:
        member = _member(tmp_path)
        member.watch_outage.clock = lambda: now[0]
        calls = [0]
        back = asyncio.Event()

        async def get_prefix(prefix: bytes) -> tuple[list[Any], int]:
            calls[0] += 1
            if calls[0] <= FAILURES:
                raise EtcdUnavailable("etcd unreachable at http://127.0.0.1:1")
            return [], 7

        async def watch(prefix: bytes, rev: int) -> AsyncIterator[list[Any]]:
            back.set()
            await asyncio.Event().wait()
            yield []

        member.etcd.get_prefix = get_prefix  # type: ignore[method-assign]
        member.meta.watch = watch  # type: ignore[method-assign]
        task = asyncio.ensure_future(member._watch())
        try:
            waiting = asyncio.ensure_future(back.wait())
            await asyncio.wait({waiting, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            assert back.is_set(), task
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await member.etcd.close()

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    asyncio.run(main())
    watch_delays = delays[:FAILURES]
    assert watch_delays[:5] == [0.25, 0.5, 1.0, 2.0, 4.0], watch_delays
    assert max(watch_delays) == 5.0 and watch_delays[-1] == 5.0
    lines = [r for r in caplog.records if "metadata watch" in r.getMessage()]
    down = sum(watch_delays[:-1])  # the outage as the log saw it: ~3 minutes
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert "etcd unreachable" in warnings[0]
    assert all("still unreachable" in w for w in warnings[1:])
    assert len(warnings) == 1 + int(down // 60), warnings
    infos = [r.getMessage() for r in lines if r.levelno == logging.INFO]
    assert len(infos) == 1 and "reachable again" in infos[0], infos


def test_outage_without_failures_logs_nothing() -> None:
    log = logging.getLogger("nsqx.test.outage")
    outage = Outage("x", log)
    outage.ok()
    assert not outage.down and outage.next_delay() == 0.25 and outage.next_delay() == 0.5
