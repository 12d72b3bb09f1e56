"""nsqlookupd: discovery for nsqd nodes (upstream ``nsqlookupd/``)."""

from .node import NSQLookupd
from .options import Options

__all__ = ["NSQLookupd", "Options"]
