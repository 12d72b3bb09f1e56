"""The parts an entry point loads only when asked for, named in one place (the node's own
lazily loaded parts are in :mod:`nsqx.nsqd.lazy`; a layer may not reach above itself, so
each layer names its own). A standalone ``nsqd`` or ``nsqlookupd`` never loads the cluster
code: etcd's client, replication and their crypto are a large part of an import, and
spawn-to-/ping is budgeted at 0.15 s (``bench/startup.py``). Every other ``nsqx.cli``
module imports at the top; a new lazy part is added here, with its reason.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:

    from nsqx.cluster.lookupd_api import ClusterLookupd
    from nsqx.cluster.member import NodeMember


def cluster_trust() -> ModuleType:
    """``nsqx.cluster.trust`` (secret and TLS files): cluster mode only."""
    from nsqx.cluster import trust

    return trust


def node_member() -> type[NodeMember]:
    """The cluster side of nsqd (``--cluster-leadership-address``)."""
    from nsqx.cluster.member import NodeMember

    return NodeMember


def cluster_lookupd() -> type[ClusterLookupd]:
    """The cluster side of nsqlookupd (``--cluster-leadership-address``)."""
    from nsqx.cluster.lookupd_api import ClusterLookupd

    return ClusterLookupd


def workers() -> ModuleType:
    """``nsqx.nsqd.workers.launch`` (``Supervisor``, ``attach``): ``nsqd --workers=N`` with
    N > 1 only; a one-process nsqd never loads it."""
    from nsqx.nsqd.workers import launch

    return launch
