"""The archive fence: at most one file per offset is ever recorded, and only by the
partition's current leader (docs/archive.md, docs/design-notes.md).

Segment boundaries are local to each node, so two nodes archiving the same offsets write
different files. Under split brain a deposed leader that still believes it leads would do
exactly that. The fence makes the choice in etcd, where leadership is decided:

- every archived file is recorded under ``ClusterKeys.archive_files`` (one key per file) and
  the end of the recorded run under ``ClusterKeys.archive_head``, by a transaction that
  holds only if the partition key is unchanged since the writer read it with itself as
  leader at the epoch it wrote the file in, and the head is unchanged since it read it
  ending at the file's base: a compare-and-swap on both;
- files are written to per-writer keys (``<base>.e<epoch>.parquet``), so a loser never
  replaces the winner's file; a loser deletes its own (nsqx.storage.archiver);
- a node taking over first lists the partition's files, then checks in etcd that it leads,
  then deletes the listed files that are not recorded (a deposed or crashed writer's);
- followers and leaders adopt the recorded files, never the listing.

The first leader with a fence and no record yet (an archive from before the fence) adopts
the listing once as before and records it (conditioned on its leadership), so an existing
archive stays whole. A topic created with an incarnation (``TopicMeta.incarnation``, issue
28) had the fence from its start: no record means nothing archived, its keys carry the
incarnation (``<base>.i<incarnation>.e<epoch>.parquet``), and its leaders neither adopt nor
delete files of another topic that had the name before.

``RecordStore`` is the asynchronous etcd side (testable on its own); ``EtcdArchiveFence`` the
blocking ``nsqx.storage.archiver.ArchiveFence`` the archiver's thread calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeVar

import orjson

from nsqx.cluster.etcd import Compare, EtcdError, KeyValue, Op
from nsqx.cluster.gates import LeaderGate
from nsqx.cluster.metadata import ClusterMetadata
from nsqx.cluster.model import PartitionMeta
from nsqx.storage.archive import ArchivedFile, ArchiveError, ArchiveTier
from nsqx.storage.archiver import Stopped

log = logging.getLogger("nsqx.cluster.archive_fence")
T = TypeVar("T")
TXN_OPS = 100  # puts per transaction (etcd's default limit is 128)
_TAG = re.compile(r"\.e(\d+)\.parquet$")
_INCARNATION = re.compile(r"\.i(\d+)\.e\d+\.parquet$")

__all__ = ["EtcdArchiveFence", "RecordStore", "epoch_of_key", "incarnation_of_key", "tagged"]


def tagged(key: str, epoch: int, incarnation: int = 0) -> str:
    """``.../<base>.parquet`` as written by the leader of ``epoch`` (of the topic's
    ``incarnation``; 0: a topic created before incarnations, whose keys do not say it)."""
    inc = f".i{incarnation}" if incarnation else ""
    return f"{key.removesuffix('.parquet')}{inc}.e{epoch}.parquet"


def incarnation_of_key(key: str) -> int:
    """The topic incarnation in a fenced file's key; 0 when the key does not carry one."""
    m = _INCARNATION.search(key)
    return int(m.group(1)) if m else 0


def epoch_of_key(key: str) -> int | None:
    """The epoch in a fenced file's key; None for an untagged (pre-fence) one."""
    m = _TAG.search(key)
    return int(m.group(1)) if m else None


class Head:
    """The recorded run of a partition: its end and how many files (with the etcd revision
    it was read at, for the compare-and-swap)."""

    __slots__ = ("end", "files", "mod_revision")

    def __init__(self, end: int, files: int, mod_revision: int) -> None:
        self.end = end
        self.files = files
        self.mod_revision = mod_revision

    @classmethod
    def from_kv(cls, kv: KeyValue) -> Head:
        d = orjson.loads(kv.value)
        return cls(int(d["end"]), int(d["files"]), kv.mod_revision)

    def accepts(self, base: int) -> bool:
        """A file starting at base continues the run (anywhere when nothing is recorded:
        the leader's log may start above 0)."""
        return self.files == 0 or base == self.end


def _file(kv: KeyValue) -> ArchivedFile:
    return ArchivedFile(**orjson.loads(kv.value))


class RecordStore:
    """The archive records of one cluster in etcd (see module doc); ``node_id()`` is this
    node's member id (known once the member started)."""

    def __init__(self, meta: ClusterMetadata, node_id: Callable[[], str]) -> None:
        self.meta = meta
        self.etcd = meta.etcd
        self.keys = meta.keys
        self.node_id = node_id

    async def leading(self, topic: str, p: int, epoch: int) -> KeyValue | None:
        """The partition key if it names this node leader at ``epoch`` (else None)."""
        kv = await self.etcd.get(self.keys.partition(topic, p))
        if kv is None:
            return None
        pm = PartitionMeta.from_json(kv.value)
        if pm.leader != self.node_id() or pm.epoch != epoch:
            return None
        return kv

    async def head(self, topic: str, p: int) -> Head | None:
        kv = await self.etcd.get(self.keys.archive_head(topic, p))
        return Head.from_kv(kv) if kv is not None else None

    async def files(self, topic: str, p: int, since: int = 0) -> list[ArchivedFile]:
        """The recorded files starting at ``since`` or later, in offset order."""
        prefix = self.keys.archive_files(topic, p)
        kvs, _ = await self.etcd.get_prefix(prefix, start=prefix + b"%020d" % since)
        return [_file(kv) for kv in kvs]

    async def create(self, topic: str, p: int, epoch: int, files: list[ArchivedFile]) -> bool:
        """Start the record with ``files`` (an archive from before the fence), if this node
        leads at ``epoch`` and there is no record yet: the files first, the head last, each
        transaction on the same condition (a crash half-way leaves no head: done again)."""
        part = await self.leading(topic, p, epoch)
        if part is None:
            return False
        head_key = self.keys.archive_head(topic, p)
        cond = [Compare.mod_revision(part.key, part.mod_revision), Compare.absent(head_key)]
        puts = [Op.put(self._file_key(topic, p, f), orjson.dumps(asdict(f))) for f in files]
        for i in range(0, len(puts), TXN_OPS):
            won, _ = await self.etcd.txn(cond, puts[i:i + TXN_OPS])
            if not won:
                return False
        end = files[-1].end if files else 0
        won, _ = await self.etcd.txn(cond, [Op.put(head_key, _head_value(end, len(files)))])
        if won:
            log.info("ARCHIVE: TOPIC(%s) PARTITION(%d): archive record started at epoch %d "
                     "with %d files up to offset %d", topic, p, epoch, len(files), end)
        return won

    async def commit(self, topic: str, p: int, epoch: int, f: ArchivedFile) -> bool:
        """Record f if this node leads at ``epoch`` and the record ends at f.base (a
        compare-and-swap on the partition key and the head; a race with an unrelated
        change of the partition key, an ISR change, is decided again)."""
        for _ in range(5):
            part = await self.leading(topic, p, epoch)
            head = await self.head(topic, p)
            if part is None or head is None or not head.accepts(f.base):
                return False
            head_key = self.keys.archive_head(topic, p)
            won, _ = await self.etcd.txn(
                [Compare.mod_revision(part.key, part.mod_revision),
                 Compare.mod_revision(head_key, head.mod_revision)],
                [Op.put(head_key, _head_value(f.end, head.files + 1)),
                 Op.put(self._file_key(topic, p, f), orjson.dumps(asdict(f)))])
            if won:
                return True
        return False

    def _file_key(self, topic: str, p: int, f: ArchivedFile) -> bytes:
        return self.keys.archive_files(topic, p) + b"%020d" % f.base


def _head_value(end: int, files: int) -> bytes:
    return orjson.dumps({"end": end, "files": files})


class EtcdArchiveFence:
    """The archiver's ``ArchiveFence`` on a RecordStore: its blocking methods run the etcd
    calls on the node's event loop (``loop``) and wait; ``epoch(topic, p)`` (run on the
    loop) is the epoch this node leads the partition at, None when it does not lead."""

    def __init__(self, store: RecordStore, loop: asyncio.AbstractEventLoop,
                 epoch: Callable[[str, int], int | None], *, timeout: float = 30.0,
                 incarnation: Callable[[str], int] = lambda topic: 0) -> None:
        self.store = store
        self.loop = loop
        self._epoch = epoch
        self._incarnation = incarnation  # the topic's TopicMeta.incarnation (run on the loop)
        self.timeout = timeout

    def _wait(self, aw: Awaitable[T]) -> T:
        async def run() -> T:
            return await aw

        try:
            fut = asyncio.run_coroutine_threadsafe(run(), self.loop)
        except RuntimeError:  # the loop is closed: the node is gone
            raise Stopped from None
        try:
            return fut.result(self.timeout)
        except EtcdError as e:
            raise ArchiveError(f"archive record in etcd: {e}") from e
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ArchiveError("archive record in etcd: no answer") from None

    def _leader_epoch(self, topic: str, p: int) -> int | None:
        async def get() -> int | None:
            return self._epoch(topic, p)

        return self._wait(get())

    def _topic_incarnation(self, topic: str) -> int:
        async def get() -> int:
            return self._incarnation(topic)

        return self._wait(get())

    def name(self, topic: str, partition: int, key: str) -> str:
        epoch = self._leader_epoch(topic, partition)
        if epoch is None:  # deposed meanwhile: write nothing
            raise ArchiveError(f"TOPIC({topic}) PARTITION({partition}): no longer the leader")
        return tagged(key, epoch, self._topic_incarnation(topic))

    def adopt(self, tier: ArchiveTier, *, leading: bool) -> list[ArchivedFile]:
        topic, p = tier.topic, tier.partition
        if not leading:
            if self._wait(self.store.head(topic, p)) is None:
                return []  # no record yet: the first leader with a fence starts it
            return self._wait(self.store.files(topic, p, tier.end))
        epoch = self._leader_epoch(topic, p)
        incarnation = self._topic_incarnation(topic)
        # the listing comes first: whatever it holds that the record (read below, while
        # this node leads) lacks can never be recorded by anyone else any more; files of
        # an earlier topic of this name are that topic's, neither adopted nor deleted
        want = f"/partition={p}/"
        listed = [k for k, _ in tier.archive.files(topic)
                  if want in k and incarnation_of_key(k) == incarnation]
        if epoch is None or self._wait(self.store.leading(topic, p, epoch)) is None:
            raise ArchiveError(f"TOPIC({topic}) PARTITION({p}): not the leader in etcd "
                               "(yet): archiving waits")
        head = self._wait(self.store.head(topic, p))
        if head is None:
            if incarnation:  # fenced since its creation: nothing archived yet
                adopted: list[ArchivedFile] = []
            else:
                tier.refresh()  # an archive from before the fence: adopted once, recorded
                adopted = list(tier.files)
            if not self._wait(self.store.create(topic, p, epoch, adopted)):
                raise ArchiveError(f"TOPIC({topic}) PARTITION({p}): archive record not "
                                   "started (leadership changed)")
            return adopted
        files = self._wait(self.store.files(topic, p))
        recorded = {f.key for f in files}
        for key in listed:
            if key not in recorded:
                log.warning("ARCHIVE: TOPIC(%s) PARTITION(%d): deleting %s: not in the "
                            "archive record (a deposed or crashed writer's)", topic, p,
                            tier.archive.describe(key))
                tier.archive.delete(key)
        return [f for f in files if f.end > tier.end]

    def commit(self, tier: ArchiveTier, f: ArchivedFile) -> bool:
        epoch = epoch_of_key(f.key)
        if epoch is None:
            return False
        return self._wait(self.store.commit(tier.topic, tier.partition, epoch, f))


def fence_for(member: Any) -> EtcdArchiveFence:
    """The fence of a cluster member's node archiver (epochs from its leader gates)."""

    def epoch(topic: str, p: int) -> int | None:
        gate = member.gates.get((topic, p))
        return gate.meta.epoch if isinstance(gate, LeaderGate) and gate.active else None

    def incarnation(topic: str) -> int:
        tm = member.topic_meta.get(topic)
        return tm.incarnation if tm is not None else 0

    return EtcdArchiveFence(RecordStore(member.meta, lambda: member.node_id),
                            member.nsqd.archiver.loop, epoch, incarnation=incarnation)
