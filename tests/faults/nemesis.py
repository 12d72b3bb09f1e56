"""Nemeses as Jepsen's, on a :class:`HostCluster`: each one injects a fault and returns how
to heal it. The client host is never cut (it is the control node); etcd and nsqlookupd are
hosts of their own and can be.

- ``halves``: a random nsqd alone on one side; the other two, etcd and nsqlookupd on the other.
- ``isolate-leader``: the partition's leader alone (cut from every host but the client).
- ``one-way``: the followers stop hearing the leader; the leader still hears them.
- ``bridge``: leader A, followers B and C: A–B and B–C connected, A–C cut.
- ``etcd-minority``: etcd cut off from the leader only (a minority of the nsqds).
- ``pause``: SIGSTOP of the leader (SIGCONT heals).
- ``kill``: kill -9 of the leader (a restart on the same data heals).
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable

from tests.faults.hosts import HostCluster

Heal = Callable[[], None]


def _followers(c: HostCluster, topic: str) -> tuple[str, list[str]]:
    leader = c.leader(topic).name
    return leader, [n.name for n in c.nodes if n.name != leader]


def halves(c: HostCluster, topic: str) -> Heal:
    alone = random.choice(c.nodes).name
    for other in [n.name for n in c.nodes if n.name != alone] + ["etcd", "lookupd"]:
        c.net.cut(alone, other)
    return c.net.heal


def isolate_leader(c: HostCluster, topic: str) -> Heal:
    leader, followers = _followers(c, topic)
    for other in [*followers, "etcd", "lookupd"]:
        c.net.cut(leader, other)
    return c.net.heal


def one_way(c: HostCluster, topic: str) -> Heal:
    leader, followers = _followers(c, topic)
    for f in followers:
        c.net.block(leader, f)
    return c.net.heal


def bridge(c: HostCluster, topic: str) -> Heal:
    leader, followers = _followers(c, topic)
    c.net.cut(leader, followers[1])
    return c.net.heal


def etcd_minority(c: HostCluster, topic: str) -> Heal:
    leader, _ = _followers(c, topic)
    c.net.cut(leader, "etcd")
    return c.net.heal


def pause(c: HostCluster, topic: str) -> Heal:
    leader = c.leader(topic)
    leader.signal(signal.SIGSTOP)
    return lambda: leader.signal(signal.SIGCONT)


def kill(c: HostCluster, topic: str) -> Heal:
    leader = c.leader(topic)
    leader.kill()
    return lambda: leader.start()


NEMESES: dict[str, Callable[[HostCluster, str], Heal]] = {
    "halves": halves, "isolate-leader": isolate_leader, "one-way": one_way, "bridge": bridge,
    "etcd-minority": etcd_minority, "pause": pause, "kill": kill,
}
