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
- ``clock-skew``: the leader's wall clock 20 s ahead (inside the 30 s signature window).
- ``clock-jumps``: a follower's wall clock jumps between -25 s and +25 s twice a second.
- ``clock-far``: a follower restarted (kill -9) with its wall clock 90 s ahead: outside the
  window, the requests it signs to rejoin are refused (as they must be; a replication stream
  already open was authenticated when it opened and is not signed again, so the restart is
  what makes it sign anew); writes go on with the other two, and it rejoins once its clock
  is right again.
"""

from __future__ import annotations

import random
import signal
import threading
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


def _clock(c: HostCluster, name: str):  # type: ignore[no-untyped-def]
    clock = next(n for n in c.nodes if n.name == name).clock
    assert clock is not None, "no clock shim (no C compiler): the clock nemeses cannot run"
    return clock


def clock_skew(c: HostCluster, topic: str) -> Heal:
    leader, _ = _followers(c, topic)
    clock = _clock(c, leader)
    clock.set(20)
    return lambda: clock.set(0)


def clock_jumps(c: HostCluster, topic: str) -> Heal:
    _, followers = _followers(c, topic)
    clock = _clock(c, followers[0])
    done = threading.Event()

    def strobe() -> None:
        sign = 1
        while not done.wait(0.5):
            clock.set(25 * sign)
            sign = -sign

    t = threading.Thread(target=strobe, daemon=True)
    t.start()

    def heal() -> None:
        done.set()
        t.join(5)
        clock.set(0)
    return heal


def clock_far(c: HostCluster, topic: str) -> Heal:
    _, followers = _followers(c, topic)
    node = next(n for n in c.nodes if n.name == followers[0])
    clock = _clock(c, node.name)
    node.kill()
    clock.set(90)
    node.start()
    return lambda: clock.set(0)


NEMESES: dict[str, Callable[[HostCluster, str], Heal]] = {
    "halves": halves, "isolate-leader": isolate_leader, "one-way": one_way, "bridge": bridge,
    "etcd-minority": etcd_minority, "pause": pause, "kill": kill,
    "clock-skew": clock_skew, "clock-jumps": clock_jumps, "clock-far": clock_far,
}
# inside the signature window a shifted clock must not be refused; outside it, it must be
WITHIN_WINDOW = {"clock-skew", "clock-jumps"}
REFUSED = {"clock-far"}
