import asyncio
import errno
import os

import pytest

from nsqx.storage.commit import GroupCommitter
from nsqx.storage.log import LogConfig, LogError, MemoryLog, PartitionLog


class CountingLog(PartitionLog):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.flushes = 0
        self.syncs = 0
        self.sync_threads = set()

    def flush(self):
        self.flushes += 1
        return super().flush()

    def sync(self):
        import threading

        self.syncs += 1
        self.sync_threads.add(threading.get_ident())
        return super().sync()


def run(coro):
    return asyncio.run(coro)


def test_one_write_per_turn(tmp_path):
    async def main():
        lg = CountingLog(tmp_path, 0, LogConfig(sync_every=10**9, sync_interval=0))
        gc = GroupCommitter(lg)
        seen = []
        gc.on_flushed.append(seen.append)
        futs = [gc.append([b"m%d" % i] * (i + 1), 5) for i in range(10)]
        assert lg.flushed_offset == 0  # nothing written yet in this turn
        bases = await asyncio.gather(*futs)
        assert bases == [sum(range(1, i + 1)) for i in range(10)]
        assert lg.flushes == 1 and seen == [55] and lg.syncs == 0
        await gc.close()
        assert lg.synced_offset == 55
        lg.close()

    run(main())


def test_sync_every_commit_fsyncs_before_ack(tmp_path):
    async def main():
        lg = CountingLog(tmp_path, 0, LogConfig(sync_every=1))
        gc = GroupCommitter(lg)
        for round_ in range(3):
            futs = [gc.append([b"x"], 1) for _ in range(5)]
            for f in asyncio.as_completed(futs):
                await f
                assert lg.synced_offset >= 5 * (round_ + 1)
        assert 1 <= lg.syncs <= 3
        import threading

        assert threading.get_ident() not in lg.sync_threads  # fsync ran in the executor
        await gc.close()
        lg.close()

    run(main())


def test_background_sync_by_count(tmp_path):
    async def main():
        lg = CountingLog(tmp_path, 0, LogConfig(sync_every=10, sync_interval=0))
        gc = GroupCommitter(lg)
        await gc.append([b"x"] * 4)
        assert lg.syncs == 0
        await gc.append([b"x"] * 8)
        for _ in range(50):
            if lg.synced_offset == 12:
                break
            await asyncio.sleep(0.01)
        assert lg.synced_offset == 12
        await gc.close()
        lg.close()

    run(main())


def test_background_sync_by_interval(tmp_path):
    async def main():
        lg = CountingLog(tmp_path, 0, LogConfig(sync_every=10**9, sync_interval=0.01))
        gc = GroupCommitter(lg)
        await gc.append([b"x"])
        for _ in range(200):
            if lg.synced_offset == 1:
                break
            await asyncio.sleep(0.01)
        assert lg.synced_offset == 1
        await gc.close()
        lg.close()

    run(main())


@pytest.mark.parametrize("appends", [1, 2])  # one batch: the fast commit; two: general
def test_write_error_fails_turn_then_recovers(tmp_path, monkeypatch, appends):
    async def main():
        lg = PartitionLog(tmp_path, 0, LogConfig(sync_every=1))
        gc = GroupCommitter(lg)
        assert await gc.append([b"ok"]) == 0

        def enospc(*_args):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "writev", enospc)
        monkeypatch.setattr(os, "write", enospc)
        futs = [gc.append([b"no"]) for _ in range(appends)]
        for f in futs:
            with pytest.raises(LogError, match="disk full"):
                await f
        monkeypatch.undo()
        assert await gc.append([b"again"]) == 1
        assert lg.read_frame(1).endswith(b"again")
        await gc.close()
        lg.close()

    run(main())


def test_fsync_error_fails_waiters(tmp_path, monkeypatch):
    async def main():
        lg = PartitionLog(tmp_path, 0, LogConfig(sync_every=1))
        gc = GroupCommitter(lg)

        def eio(fd):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", eio)
        with pytest.raises(LogError, match="I/O error"):
            await gc.append([b"x"])
        monkeypatch.undo()
        assert await gc.append([b"y"]) == 1
        assert lg.synced_offset == 2
        await gc.close()
        lg.close()

    run(main())


def test_memory_log_committer():
    async def main():
        lg = MemoryLog(0, 100)
        gc = GroupCommitter(lg, sync_always=True)
        assert await asyncio.gather(gc.append([b"a"]), gc.append([b"b", b"c"])) == [0, 1]
        await gc.close()
        with pytest.raises(LogError):
            await gc.append([b"late"])

    run(main())


def test_file_system_syncer_covers_many_logs_with_one_syncfs(tmp_path):
    from nsqx.storage.commit import FileSystemSyncer

    async def main() -> None:
        loop = asyncio.get_running_loop()
        syncer = FileSystemSyncer(str(tmp_path), loop)
        calls = []
        real = syncer._syncfs
        assert real is not None  # Linux: libc has syncfs

        def counting(fd: int) -> int:
            calls.append(fd)
            return real(fd)

        syncer._syncfs = counting
        cfg = LogConfig(sync_every=10**9, sync_interval=0.05)
        logs = [PartitionLog(tmp_path / f"p{i}", 0, cfg) for i in range(5)]
        committers = [GroupCommitter(lg, loop, syncer=syncer) for lg in logs]
        futs = [c.append([b"x%d" % i]) for i, c in enumerate(committers)]
        await asyncio.gather(*futs)
        for _ in range(200):
            if all(lg.synced_offset == lg.flushed_offset == 1 for lg in logs):
                break
            await asyncio.sleep(0.01)
        assert all(lg.synced_offset == 1 for lg in logs)
        assert 1 <= len(calls) < len(logs)  # one pass covered several logs
        for c in committers:
            await c.close()
        for lg in logs:
            lg.close()
        # the recovery point moved: reopening verifies nothing below it
        for i in range(5):
            lg = PartitionLog(tmp_path / f"p{i}", 0, cfg)
            assert lg._read_checkpoint() == 1
            lg.close()

    asyncio.run(main())


def test_file_system_syncer_falls_back_to_fsync_without_syncfs(tmp_path):
    from nsqx.storage.commit import FileSystemSyncer

    async def main() -> None:
        loop = asyncio.get_running_loop()
        syncer = FileSystemSyncer(str(tmp_path), loop)
        syncer._syncfs = None
        lg = PartitionLog(tmp_path / "p", 0, LogConfig(sync_every=10**9, sync_interval=0.05))
        c = GroupCommitter(lg, loop, syncer=syncer)
        await c.append([b"a", b"b"])
        for _ in range(200):
            if lg.synced_offset == 2:
                break
            await asyncio.sleep(0.01)
        assert lg.synced_offset == 2
        await c.close()
        lg.close()

    asyncio.run(main())


def test_file_system_syncer_survives_a_failing_syncfs(tmp_path):
    from nsqx.storage.commit import FileSystemSyncer

    async def main() -> None:
        loop = asyncio.get_running_loop()
        syncer = FileSystemSyncer(str(tmp_path / "missing"), loop)  # os.open fails
        lg = PartitionLog(tmp_path / "p", 0, LogConfig(sync_every=10**9, sync_interval=0.05))
        c = GroupCommitter(lg, loop, syncer=syncer)
        await c.append([b"a"])
        for _ in range(200):
            if lg.synced_offset == 1:
                break
            await asyncio.sleep(0.01)
        assert lg.synced_offset == 1  # fsynced file by file instead
        await c.close()
        lg.close()

    asyncio.run(main())


def test_scheduler_flushes_every_dirty_log_in_one_pass(tmp_path):
    from nsqx.storage.commit import CommitScheduler

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sched = CommitScheduler(loop)
        logs = [CountingLog(tmp_path / f"p{i}", 0, LogConfig(sync_every=10**9)) for i in range(4)]
        committers = [GroupCommitter(lg, loop, scheduler=sched) for lg in logs]
        passes, order = [], []
        real_run = sched._run

        def counting_run() -> None:
            passes.append(1)
            real_run()
        sched._run = counting_run  # type: ignore[method-assign]
        for i, c in enumerate(committers):
            def done(base: int, exc: Exception | None, i: int = i) -> None:
                assert exc is None and sched.in_pass
                sched.after_pass(lambda i=i: order.append(("after", i)))
                order.append(("done", i))
            c.append_cb([b"a", b"b"], done)
            c.append_cb([b"c"], lambda base, exc: None)
        await asyncio.sleep(0.01)
        assert len(passes) == 1  # one call_soon for the four logs
        assert [lg.flushes for lg in logs] == [1, 1, 1, 1]
        assert [lg.flushed_offset for lg in logs] == [3, 3, 3, 3]
        # every completion of the pass ran before any after-pass callback
        assert [k for k, _ in order] == ["done"] * 4 + ["after"] * 4
        for c in committers:
            await c.close()
        for lg in logs:
            lg.close()

    asyncio.run(main())


def test_syncer_shares_one_interval_timer(tmp_path):
    from nsqx.storage.commit import FileSystemSyncer

    async def main() -> None:
        loop = asyncio.get_running_loop()
        syncer = FileSystemSyncer(str(tmp_path), loop)
        cfg = LogConfig(sync_every=10**9, sync_interval=0.05)
        logs = [PartitionLog(tmp_path / f"p{i}", 0, cfg) for i in range(5)]
        committers = [GroupCommitter(lg, loop, syncer=syncer) for lg in logs]
        await asyncio.gather(*(c.append([b"x"]) for c in committers))
        assert len(syncer._later) == 5 and syncer._later_timer is not None  # one timer
        for _ in range(200):
            if all(lg.synced_offset == 1 for lg in logs):
                break
            await asyncio.sleep(0.01)
        assert all(lg.synced_offset == 1 for lg in logs)
        assert not syncer._later and syncer._later_timer is None
        await committers[0].append([b"y"])
        committers[0]._timer.cancel()  # close() cancels a shared wait like a TimerHandle
        assert not syncer._later
        committers[0]._timer = None
        for c in committers:
            await c.close()
        for lg in logs:
            lg.close()

    asyncio.run(main())
