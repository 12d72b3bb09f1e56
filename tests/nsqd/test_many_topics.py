"""Idle topics cost nothing per tick and hold no file descriptors (in-process node)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from nsqx.nsqd.channel import now_ms
from tests.nsqd.inprocess import running_node


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_idle_topics_release_descriptors_and_reopen_on_use(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            before = _open_fds()
            for i in range(300):
                nsqd.get_topic(f"t{i}").get_channel("c")
            for i in range(0, 300, 3):  # some have data
                await nsqd.publish(f"t{i}", [b"m%d" % i])
            await nsqd.publish("e#ephemeral", [b"in memory"])  # a memory log has no files
            assert _open_fds() - before >= 100  # the written ones opened their files
            for t in nsqd.topics.values():
                t.log.sync()
            for _ in range(2):  # idle across two passes: nothing written in between
                for t in nsqd.topics.values():
                    t.release_idle_files()
            assert sum(t.log.open_files for t in nsqd.topics.values()) == 0
            assert _open_fds() - before < 20
            # a released topic takes a publish and serves it from disk again
            await nsqd.publish("t3", [b"again"])
            topic = nsqd.get_topic("t3")
            topic.log._drop_caches()
            got = topic.log.read(0, 1 << 16)
            assert got.count == 2 and bytes(got.data).endswith(b"again")
        async with running_node(tmp_path) as nsqd:  # restart: recovery opens nothing
            assert sum(t.log.open_files for t in nsqd.topics.values()) == 0
            assert nsqd.get_topic("t3").log.next_offset == 2

    asyncio.run(main())


def test_scanner_visits_only_channels_with_timers(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            for i in range(200):
                nsqd.get_topic(f"t{i}").get_channel("c")
            await nsqd.publish("t7", [b"a", b"b"])
            assert not nsqd.timed_channels  # nothing in flight or deferred anywhere
            topic = nsqd.get_topic("t7")
            ch = topic.get_channel("c")
            ch.cursor.take(1, 1, topic.log.flushed_offset, now_ms(), 150)  # times out soon
            assert nsqd.timed_channels == {ch}
            await _until(lambda: ch.cursor.timeout_count == 1)
            # back in the ready queue: still scheduled until it is delivered again
            got = ch.cursor.take(1, 2, topic.log.flushed_offset, now_ms(), 60_000)
            offsets = [d.offset + k for d in got for k in range(d.count)]
            assert sorted(offsets) == [0, 1]
            assert not ch.cursor.finish_many(1, offsets)
            await _until(lambda: ch not in nsqd.timed_channels)
            # a deferred publish schedules its channel; it is delivered when due
            await nsqd.publish("t9", [b"later"], 200)
            ch9 = nsqd.get_topic("t9").get_channel("c")
            assert ch9 in nsqd.timed_channels
            await _until(lambda: ch9.cursor.pending_redeliveries(now_ms()))

    asyncio.run(main())


async def _until(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.02)


def test_over_the_descriptor_budget_synced_logs_let_go(tmp_path: Path) -> None:
    """A burst of writes to many topics (faster than the idle passes): past the node's
    descriptor budget, the logs that are synced and have no consumer close their files."""
    from nsqx.storage.segment import open_segments

    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            for i in range(40):
                await nsqd.publish(f"b{i}", [b"m"])
            before = open_segments()
            assert before >= 40
            nsqd.fd_budget = 6 * 10
            nsqd.get_topic("b0").get_channel("c")  # a channel, no consumer: may let go
            for t in nsqd.topics.values():
                t.log.sync()
            await nsqd.publish("b1", [b"unsynced"])  # written, not synced: kept open
            assert nsqd.release_files_over_budget() == 39
            assert open_segments() == before - 39
            assert nsqd.get_topic("b1").log.open_files > 0
            await nsqd.publish("b5", [b"again"])  # reopens on use
            assert nsqd.get_topic("b5").log.read(0, 1 << 16).count == 2

    asyncio.run(main())


def test_over_budget_warning_is_rate_limited(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """The persist pass runs every second while the node is over its budget: it warns once
    a minute, then says how many warnings it held back."""
    import logging

    from nsqx.nsqd.node import BUDGET_WARN_INTERVAL

    now = [1000.0]

    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            await nsqd.publish("busy", [b"m"])
            nsqd.get_topic("busy").log.sync()
            nsqd.fd_warning.clock = lambda: now[0]
            with caplog.at_level(logging.WARNING, logger="nsqx.nsqd"):
                for _ in range(59):  # one pass a second for a minute
                    nsqd.release_files_over_budget()
                    now[0] += 1.0
                now[0] += BUDGET_WARN_INTERVAL - 59
                nsqd.release_files_over_budget()
                nsqd.release_files_over_budget()
            warned = [r.getMessage() for r in caplog.records if "held open" in r.getMessage()]
            assert len(warned) == 2, warned
            assert "released the files of 1 idle logs" in warned[0]
            assert "suppressed" not in warned[0]
            assert warned[1].endswith("(58 similar warnings suppressed since the last one)")

    asyncio.run(main())


def test_warn_every() -> None:
    from nsqx.nsqd.node import WarnEvery

    now = [0.0]
    w = WarnEvery(60.0, clock=lambda: now[0])
    assert w.due() == 0
    now[0] = 30.0
    assert w.due() is None and w.due() is None
    now[0] = 59.9
    assert w.due() is None
    now[0] = 60.0
    assert w.due() == 3
    assert w.due() is None
    now[0] = 500.0
    assert w.due() == 1


def _descriptor_limit(monkeypatch, limit: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Segment opens fail with EMFILE while ``limit`` segments hold their files (as the
    process's RLIMIT_NOFILE would, without lowering it for the whole test run)."""
    import errno

    from nsqx.storage import segment

    real = segment._open
    failures = [0]

    def open_(path):  # type: ignore[no-untyped-def]
        if segment.open_segments() >= limit:
            failures[0] += 1
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return real(path)

    monkeypatch.setattr(segment, "_open", open_)
    return failures


def test_emfile_on_open_releases_idle_logs_and_retries(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from nsqx.storage.segment import open_segments

    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            for i in range(10):
                await nsqd.publish(f"f{i}", [b"m"])
            for t in nsqd.topics.values():
                t.log.sync()
            failures = _descriptor_limit(monkeypatch, open_segments())
            # at the limit, a new topic's first open fails: the idle (synced, no consumer)
            # logs let go of their files and the one retry succeeds
            await nsqd.publish("new", [b"first"])
            assert failures[0] == 1
            assert nsqd.get_topic("new").log.read(0, 1 << 16).count == 1
            assert sum(nsqd.get_topic(f"f{i}").log.open_files > 0 for i in range(10)) == 0
            nsqd.get_topic("new").log.sync()
            nsqd.get_topic("f3").get_channel("c")
            got = nsqd.get_topic("f3").log.read(0, 1 << 16)  # reopens: below the limit now
            assert got.count == 1 and failures[0] == 1

    asyncio.run(main())


def test_emfile_with_nothing_to_release_fails_after_one_retry(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from nsqx.storage.records import LogError
    from nsqx.storage.segment import open_segments

    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            await nsqd.publish("busy", [b"m"])  # written, not synced: cannot let go
            failures = _descriptor_limit(monkeypatch, open_segments())
            try:
                await nsqd.publish("new", [b"x"])
            except LogError as exc:
                assert "Too many open files" in str(exc)
            else:
                raise AssertionError("the publish should fail")
            assert failures[0] == 2  # the open, then the one retry
            assert nsqd.get_topic("busy").log.open_files > 0

    asyncio.run(main())
