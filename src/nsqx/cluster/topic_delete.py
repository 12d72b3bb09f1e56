"""Deleting a topic in a cluster (issue 28 defect 5): a cluster operation, not one node's.

``/topic/delete`` on nsqlookupd or on any member removes the topic from etcd
(``ClusterMetadata.delete_topic``); every member then deletes its replica when its watch
shows the topic gone. A member that was down meanwhile does it when it comes back: it keeps
the incarnation of each cluster topic it holds a copy of (``cluster-topics.json`` in its
data path), so a copy of a topic that is no longer in etcd, or that belongs to an earlier
topic of the same name, is deleted before the member takes any role for the name, and a
topic created again starts empty on every replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from nsqx.cluster.model import TopicMeta
from nsqx.storage.fileio import write_durably

__all__ = ["LocalCopies", "local_names", "refuse_imported_topics"]

log = logging.getLogger("nsqx.cluster.member")

FILE = "cluster-topics.json"


class LocalCopies:
    """The incarnations of the cluster topics this node holds copies of, and the deletion
    of copies whose topic is gone."""

    def __init__(self, data_path: Path, delete_local: Callable[[str], Awaitable[None]],
                 on_deleted: Callable[[], None]) -> None:
        self.path = Path(data_path) / FILE
        self._delete_local = delete_local
        self._on_deleted = on_deleted
        self.held: dict[str, int] = {}
        try:
            raw = orjson.loads(self.path.read_bytes())
            self.held = {str(k): int(v) for k, v in raw.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("CLUSTER: %s unreadable (%s): copies of deleted topics are kept until "
                        "deleted by hand", self.path, e)
        self.deleting: dict[str, asyncio.Task[None]] = {}

    def stale(self, name: str, tm: TopicMeta | None, exists_locally: bool) -> bool:
        """True when the local copy of ``name`` must go before the node uses the name:
        the cluster deleted the topic (it is not in etcd, this node held a copy), or the
        topic in etcd is a later one of the same name."""
        if name in self.deleting:
            return True
        held = self.held.get(name)
        if held is None or not exists_locally:
            return False
        if tm is None:
            return True
        return bool(tm.incarnation) and held != tm.incarnation

    def holds(self, tm: TopicMeta) -> None:
        """This node has a copy of ``tm`` (called when it takes a role for it)."""
        if self.held.get(tm.name) != tm.incarnation:
            self.held[tm.name] = tm.incarnation
            self._save()

    def sweep(self, topic_meta: dict[str, TopicMeta], local: set[str]) -> None:
        """Start deleting every stale local copy; forget held topics without a copy."""
        for name in list(self.held):
            if name in self.deleting:
                continue
            if name not in local:
                if name not in topic_meta:
                    del self.held[name]
                    self._save()
                continue
            if self.stale(name, topic_meta.get(name), True):
                self.deleting[name] = asyncio.get_running_loop().create_task(
                    self._delete(name), name=f"cluster delete {name}")

    async def _delete(self, name: str) -> None:
        try:
            log.info("CLUSTER: TOPIC(%s): deleting this node's copy (the cluster deleted the "
                     "topic, or created it again)", name)
            try:
                await self._delete_local(name)
            except KeyError:
                pass  # deleted meanwhile (by /topic/delete on this node)
            self.held.pop(name, None)
            self._save()
        except Exception:
            log.exception("CLUSTER: TOPIC(%s): deleting this node's copy failed", name)
        finally:
            self.deleting.pop(name, None)
        self._on_deleted()

    def _save(self) -> None:
        try:
            write_durably(self.path, orjson.dumps(self.held))
        except OSError as e:
            log.error("CLUSTER: writing %s failed: %s", self.path, e)

    async def close(self) -> None:
        for task in list(self.deleting.values()):
            task.cancel()
        for task in list(self.deleting.values()):
            try:
                await task
            except BaseException:  # noqa: S110 - stopping: the next start sweeps again
                pass


def local_names(topics: dict[str, Any]) -> set[str]:
    """The durable topics of a node (ephemeral ones are never cluster topics)."""
    return {name for name, t in topics.items() if not t.ephemeral}


def refuse_imported_topics(topics: dict[str, Any]) -> None:
    """Refuse cluster mode on a data path with topics imported from Go nsqd (issue 28
    defect 6, docs/migrating.md): their frames carry Go's ids, which only the partition's
    ``imported-ids`` table maps to offsets. Replication copies frames but not that table,
    so a follower's id check would refuse the frames and FIN/REQ/TOUCH by Go id would stop
    working on a new leader. SystemExit with the topics and what to do."""
    held = sorted(f"{t.name}/{p.partition}" for t in topics.values() if not t.ephemeral
                  for p in t.partitions if p.log.imported is not None)
    if held:
        raise SystemExit(
            f"FATAL: cluster mode refused: topic partition(s) {', '.join(held)} hold messages "
            f"imported from Go nsqd (their imported-ids table), which cluster replication does "
            f"not carry; run this data path as a standalone nsqd until those messages are "
            f"consumed (the table is dropped then), or move the topics out first "
            f"(docs/migrating.md, 'Imported topics and cluster mode')")
