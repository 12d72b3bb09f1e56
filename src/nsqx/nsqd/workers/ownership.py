"""Which worker owns a topic, and the per-worker metadata files (``nsqd --workers``).

Whole topics in this first step: a topic, all its partitions and its dead-letter topic
``<topic>.dlq`` belong to worker ``crc32(name) % N`` (stable across restarts and Python
versions, unlike ``hash()``). Per-partition ownership is the next step (issue 32).

Worker K keeps its topics in ``nsqd.w<K>.dat``. The supervisor, holding the node's lock
with no worker running, splits the node's metadata over the workers before starting them
(``split_metadata``: a restart with another N moves every topic's entry to its new owner,
whose log directory is the same one under ``topics/``) and merges it back into ``nsqd.dat``
after they stopped (``merge_metadata``), so ``--workers=1`` finds everything where it was.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import Any

import orjson

from nsqx import NSQ_VERSION
from nsqx.nsqd import datapath
from nsqx.storage.fileio import write_durably

__all__ = ["DLQ_SUFFIX", "merge_metadata", "owner_of", "read_entries", "split_metadata"]

log = logging.getLogger("nsqx.nsqd")

DLQ_SUFFIX = ".dlq"


def owner_of(topic: str, count: int) -> int:
    """The worker (0..count-1) owning ``topic``; a dead-letter topic goes with its topic."""
    if count <= 1:
        return 0
    if topic.endswith(DLQ_SUFFIX) and len(topic) > len(DLQ_SUFFIX):
        topic = topic[:-len(DLQ_SUFFIX)]
    return zlib.crc32(topic.encode()) % count


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise SystemExit(f"FATAL: failed to load metadata {path}: {exc}") from exc
    return [t for t in data.get("topics", []) if isinstance(t, dict)]


def read_entries(data_path: Path) -> dict[str, dict[str, Any]]:
    """Every topic entry of nsqd.dat and of the workers' files (theirs win: newer)."""
    entries = {t.get("name", ""): t for t in _read(datapath.metadata_path(data_path))}
    for path in datapath.worker_metadata_paths(data_path):
        entries.update((t.get("name", ""), t) for t in _read(path))
    return entries


def _write(path: Path, topics: list[dict[str, Any]]) -> None:
    data = orjson.dumps({"topics": topics, "version": NSQ_VERSION})
    write_durably(path, data, path.with_name(f"{path.name}.{os.getpid()}.tmp"))


def split_metadata(data_path: Path, count: int) -> None:
    """Before the workers start: each one's file lists exactly the topics it owns now;
    nsqd.dat and the files of workers beyond ``count`` go (after the new files are
    durable: a crash in between leaves duplicates, which read_entries resolves)."""
    entries = read_entries(data_path)
    shares: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    for name, t in entries.items():
        shares[owner_of(name, count)].append(t)
    for k in range(count):
        _write(datapath.worker_metadata_path(data_path, k), shares[k])
    for path in datapath.worker_metadata_paths(data_path):
        if (datapath.worker_of_metadata(path) or 0) >= count:
            path.unlink(missing_ok=True)
    datapath.metadata_path(data_path).unlink(missing_ok=True)
    log.info("workers: %d topics split over %d workers", len(entries), count)


def merge_metadata(data_path: Path) -> None:
    """After the workers stopped: nsqd.dat lists every topic again (a one-process node
    reads it as always), and the workers' files go."""
    entries = read_entries(data_path)
    _write(datapath.metadata_path(data_path), list(entries.values()))
    for path in datapath.worker_metadata_paths(data_path):
        path.unlink(missing_ok=True)
