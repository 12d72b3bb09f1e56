"""The parts of a node loaded when first used, named in one place (as uvicorn names its
lazily loaded parts): spawn-to-/ping is budgeted at 0.15 s (``bench/startup.py``) and
these are most of an import's time, yet a node may never need them. Every other nsqd
module imports at the top; a new lazy part is added here, with its reason.

The node calls these functions; each returns what it loads (a module or a class), so the
import stays visible to ``lint-imports`` (a name in a string table would hide it).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsqx.nsqd.archiving import NodeArchiver
    from nsqx.nsqd.routing import TopicRoutes
    from nsqx.nsqd.statsd import StatsdEmitter
    from nsqx.nsqd.trace import TraceRecorder


def http_api() -> ModuleType:
    """``nsqx.nsqd.http``: aiohttp and every sub-API, most of a start's time; the plain
    listener answers /ping, /pub and /mpub without it (``http_fast``) while a worker
    thread loads it."""
    from nsqx.nsqd import http

    return http


def trace_recorder() -> type[TraceRecorder]:
    """Only a node with a traced topic records traces."""
    from nsqx.nsqd.trace import TraceRecorder

    return TraceRecorder


def topic_routes() -> type[TopicRoutes]:
    """Only a node with a route-managed topic needs the routing code."""
    from nsqx.nsqd.routing import TopicRoutes

    return TopicRoutes


def statsd_emitter() -> type[StatsdEmitter]:
    """Only ``--statsd-address`` pushes metrics (the emitter and the metrics it formats)."""
    from nsqx.nsqd.statsd import StatsdEmitter

    return StatsdEmitter


def node_archiver() -> type[NodeArchiver]:
    """Only ``--archive-url`` needs tiered storage (and its Parquet writer)."""
    from nsqx.nsqd.archiving import NodeArchiver

    return NodeArchiver
