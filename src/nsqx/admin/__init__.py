"""nsqadmin: the web UI over a whole NSQ cluster, built only on the public HTTP APIs of
nsqd and nsqlookupd (pages, upstream's ``/api`` JSON, actions, built-in graphs)."""

from .options import Options
from .server import NSQAdmin

__all__ = ["NSQAdmin", "Options"]
