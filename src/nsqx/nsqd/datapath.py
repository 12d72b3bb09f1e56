"""The layout of nsqd's ``--data-path``, spelled once: the node, its topics, routed topics
and the offline importer (``nsqx.migrate``) all read and write the same directory, so a
file name written in two places could drift and lose data on restart.

::

    <data-path>/nsqd.dat                           node metadata (topics, channels, pauses)
    <data-path>/.nsqx.lock                         flock()ed by the running node or importer
    <data-path>/nsqd.w<K>.dat, .nsqx.w<K>.lock     worker K's metadata and lock (--workers > 1)
    <data-path>/.workers/w<K>.{tcp,http,ctl}       worker K's internal unix sockets
    <data-path>/topics/t-<topic>/p<N>/             partition N's log (storage.log)
    <data-path>/topics/t-<topic>/routes.json       a route-managed topic's history
    <data-path>/topics/t-<topic>/pubkeys-p<N>.sqlite   idempotent publishes' keys
    <data-path>/topics/t-<topic>/channels/c-<channel>[.p<N>].cursor   a channel's cursor
    <data-path>/topics/t-<topic>/channels/c-<channel>.route           its barrier state
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

METADATA_FILE = "nsqd.dat"
LOCK_FILE = ".nsqx.lock"
ROUTES_FILE = "routes.json"  # a route-managed topic's history, in its topic directory
CURSOR_GLOB = "c-*.cursor"  # partition 0's cursor files (and others: callers check names)

_TOPIC_PREFIX = "t-"  # keeps names such as "." and ".." (valid NSQ names) from being path tricks
_CURSOR_PREFIX, _CURSOR_SUFFIX = "c-", ".cursor"


def metadata_path(data_path: Path) -> Path:
    return data_path / METADATA_FILE


def lock_path(data_path: Path) -> Path:
    return data_path / LOCK_FILE


def lock_data_path(data_path: Path, lock_file: Path) -> int:
    """Create ``data_path`` and hold ``lock_file`` in it (an flock, released when the
    returned descriptor is closed): one process per data path, as upstream. Unusable or
    held: SystemExit with one FATAL line."""
    try:
        data_path.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise SystemExit(f"FATAL: --data-path={data_path} cannot be used: "
                         f"{e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SystemExit(f"FATAL: --data-path={data_path} in use (possibly by another "
                         "instance of nsqd)") from None
    return fd


def worker_metadata_path(data_path: Path, index: int) -> Path:
    """Worker ``index``'s nsqd.dat (``--workers`` > 1): the topics it owns."""
    return data_path / f"nsqd.w{index}.dat"


def worker_metadata_paths(data_path: Path) -> list[Path]:
    """Every worker metadata file there is, whatever the worker count that wrote it."""
    return sorted(p for p in data_path.glob("nsqd.w*.dat")
                  if worker_of_metadata(p) is not None)


def worker_of_metadata(path: Path) -> int | None:
    """K of a ``nsqd.w<K>.dat`` path, None for any other name."""
    k = path.name[len("nsqd.w"):-len(".dat")]
    return int(k) if path.name.startswith("nsqd.w") and k.isdigit() else None


def worker_lock_path(data_path: Path, index: int) -> Path:
    return data_path / f".nsqx.w{index}.lock"


def workers_dir(data_path: Path) -> Path:
    """The workers' internal unix sockets (``--workers`` > 1)."""
    return data_path / ".workers"


def worker_socket_path(data_path: Path, index: int, kind: str) -> Path:
    """Worker ``index``'s internal socket: ``tcp`` (NSQ protocol), ``http`` or ``ctl``."""
    return workers_dir(data_path) / f"w{index}.{kind}"


def topics_root(data_path: Path) -> Path:
    return data_path / "topics"


def topic_dir(data_path: Path, name: str) -> Path:
    return topics_root(data_path) / f"{_TOPIC_PREFIX}{name}"


def topic_name(tdir: Path) -> str | None:
    """The topic stored in a directory of :func:`topics_root`, None for anything else."""
    return tdir.name[len(_TOPIC_PREFIX):] if tdir.name.startswith(_TOPIC_PREFIX) else None


def partition_dir(tdir: Path, partition: int) -> Path:
    return tdir / f"p{partition}"


def channels_dir(tdir: Path) -> Path:
    return tdir / "channels"


def cursor_path(tdir: Path, channel: str, partition: int = 0) -> Path:
    """One cursor file per partition; partition 0 keeps the single-partition name."""
    suffix = f".p{partition}" if partition else ""
    return channels_dir(tdir) / f"{_CURSOR_PREFIX}{channel}{suffix}{_CURSOR_SUFFIX}"


def cursor_channel(path: Path) -> str:
    """The channel name in a cursor file's name (the inverse of :func:`cursor_path` at 0)."""
    return path.name[len(_CURSOR_PREFIX):-len(_CURSOR_SUFFIX)]


def route_state_path(tdir: Path, channel: str) -> Path:
    return channels_dir(tdir) / f"{_CURSOR_PREFIX}{channel}.route"


def publish_keys_path(tdir: Path, partition: int) -> Path:
    """Idempotent publishes' key index of one partition (``nsqd.idempotence``)."""
    return tdir / f"pubkeys-p{partition}.sqlite"


def has_routes(tdir: Path) -> bool:
    """Whether the topic stored in ``tdir`` is route-managed (``routing.TopicRoutes``)."""
    return (tdir / ROUTES_FILE).exists()
