"""Power loss of a node (LazyFS's model, tests/faults/power.py): under a steady stream of
HTTP publishes nsqd is killed -9 and every write no fsync covered is undone; then it must
start again on what is left and deliver what it acknowledged, per fsync policy:

- ``--sync-every=1`` and a topic's ``sync_every=1`` (``syncdisk=1`` in a cluster): 0 lost;
- the defaults (fsync every 2,500 messages or 2 s): what is lost is only the newest
  acknowledged messages (a tail of the publish order), counted and reported.

And in a cluster (3 nsqd on their own hosts, min ISR 2, pynsq load; etcd keeps power: it
fsyncs its own log): of the leader alone, with the defaults, 0 lost and every acknowledged
message still in the log (the followers have it); of every node at once with ``syncdisk=1``
the same; with the defaults what the log lost (acknowledged in the last
``--sync-timeout``; a consumer that was caught up had them already) is counted and reported,
and nothing acknowledged after the restart may be lost.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.cluster.chaos_check import Load
from tests.cluster.test_cluster_processes import fetch_bodies
from tests.faults.hosts import HostCluster
from tests.faults.netns import Net
from tests.faults.power import build_shim, env, lose_unsynced
from tests.support.cluster import http, wait_until
from tests.support.rawclient import consumer

pytestmark = [pytest.mark.slow]


def publish_until(url: str, stop: threading.Event, acked: list[tuple[int, float]]) -> None:
    n = 0
    while not stop.is_set():
        try:
            code, _ = http("POST", f"{url}/pub?topic=pw", b"%08d" % n, timeout=5)
        except OSError:
            return  # the power went
        if code == 200:
            acked.append((n, time.time()))
        n += 1


@pytest.mark.parametrize("policy", ["default", "sync-every-1", "topic-sync-every-1"])
def test_power_loss_of_one_node(policy: str, nsqd_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shim = build_shim(tmp_path)
    if shim is None:
        pytest.skip("no C compiler: the power-loss shim cannot be built")
    args = ["--sync-every=1"] if policy == "sync-every-1" else []
    nsqd = nsqd_factory.create(args, name="pw")
    journal = tmp_path / "journal"
    nsqd.env = env(shim, nsqd.data_path, journal)
    nsqd.data_path.mkdir(parents=True, exist_ok=True)
    nsqd.start()
    url = f"http://{nsqd.http_address}"
    assert http("POST", f"{url}/topic/create?topic=pw")[0] == 200
    assert http("POST", f"{url}/channel/create?topic=pw&channel=c")[0] == 200
    if policy == "topic-sync-every-1":
        code, body = http("POST", f"{url}/topic/config?topic=pw&sync_every=1")
        assert code == 200, body
    acked: list[tuple[int, float]] = []
    stop = threading.Event()
    t = threading.Thread(target=publish_until, args=(url, stop, acked), daemon=True)
    t.start()
    time.sleep(3)
    nsqd.kill()  # the power goes: nothing after this instant is written
    cut = time.time()
    stop.set()
    t.join(10)
    report = lose_unsynced(journal)
    nsqd.env = None
    nsqd.start()  # starts again on what the disk kept
    with consumer(nsqd.tcp_address, "pw", "c", rdy=200) as c:
        got = {int(m.body) for m in c.drain_messages(quiet=2.0, limit=120)}
    numbers = [n for n, _ in acked]
    lost = [n for n in numbers if n not in got]
    window = cut - min((at for n, at in acked if n in lost), default=cut)
    print(f"\npower loss ({policy}): acked {len(numbers)}, lost {len(lost)} (acked in the last "
          f"{window:.2f} s before the cut), undone {report.undone_writes} writes "
          f"({report.undone_bytes} bytes) in {report.files} files")
    assert len(numbers) > 50
    if policy == "default":
        # only the newest acknowledged messages can go: a tail of the publish order
        assert not lost or lost == numbers[len(numbers) - len(lost):], lost[:20]
    else:
        assert not lost, f"{len(lost)} acknowledged messages lost: {lost[:20]}"


@pytest.mark.parametrize(("who", "policy"), [
    ("every", "default"), ("every", "syncdisk-1"), ("leader-after-failover", "default"),
    ("leader-within-lease", "default"),
    ("leader-within-lease", "syncdisk-1"), ("follower", "default")])
def test_power_loss_in_a_cluster(who: str, policy: str, net: Net, tmp_path: Path) -> None:
    """``every`` node at once, or the partition's leader alone (its followers keep what they
    received in their page cache), restarted once another leader took over or at once,
    within its lease (10 s here, so that the restart surely comes before it ends), or one
    follower."""
    shim = build_shim(tmp_path)
    if shim is None:
        pytest.skip("no C compiler: the power-loss shim cannot be built")
    c = HostCluster(net, tmp_path, power_shim=shim, nsqd_args=[
        "--cluster-node-ttl=10s"] if who == "leader-within-lease" else None).start()
    c.create_topic("pw", extra="&syncdisk=1" if policy == "syncdisk-1" else "")
    load = Load(c.lookupd_http, "pw", 3600, tmp_path, stop_file=tmp_path / "stop",
                prefix=["ip", "netns", "exec", c.client.ns])
    try:
        wait_until(lambda: load.acked() > 300, timeout=60, what="traffic before the cut")
        leader = c.leader("pw")
        victims = {"every": c.nodes,
                   "follower": [next(n for n in c.nodes if n is not leader)]}.get(who, [leader])
        epoch = c.partitions("pw")[0]["epoch"]
        for n in victims:  # they lose power at the same instant
            n.signal(signal.SIGKILL)
        cut = time.time()
        for n in victims:
            n.kill()
        undone = [lose_unsynced(n.journal) for n in victims if n.journal]
        if who == "leader-after-failover":
            wait_until(lambda: c.partitions("pw")[0]["epoch"] > epoch
                       and c.partitions("pw")[0]["leader"], timeout=60, what="a new leader")
        for n in victims:
            n.start()
        acked = load.acked()
        wait_until(lambda: len(c.partitions("pw")[0]["isr"]) == 3 and load.acked() > acked + 100,
                   timeout=120, what="full ISR and writes acknowledged after the restart")
        load.end()
        tally = load.finish()
    finally:
        load.stop()
    final = c.leader("pw")
    in_log = {int(b) for b in c.net.call(fetch_bodies, SimpleNamespace(
        http_address=f"{final.host.ip}:4151"), "pw")}
    gone = sorted(tally.acked - in_log)  # delivered (before the cut) but not in the log
    times = load.ack_times()
    lost_before = [n for n in tally.lost if times.get(n, cut) <= cut]
    window = cut - min((times[n] for n in lost_before), default=cut)
    lost_after = sorted(set(tally.lost) - set(lost_before))
    print(f"\npower loss of {who} node(s) ({policy}): {tally}; lost acked before the cut "
          f"{len(lost_before)} (in the last {window:.2f} s); lost acked after it "
          f"{len(lost_after)} {lost_after[:3]}..{lost_after[-3:]} (acked "
          f"{[round(times[n] - cut, 2) for n in lost_after[:3]]} s after the cut); "
          f"undone writes per node {[u.undone_writes for u in undone]}; acked but gone from "
          f"the log {len(gone)} (acked in the last "
          f"{cut - min((times[n] for n in gone), default=cut):.2f} s before the cut)")
    assert len(tally.acked) > 300, str(tally)
    if policy == "syncdisk-1" or who != "every":
        assert not tally.lost, f"lost acknowledged messages {sorted(tally.lost)[:20]}: {tally}"
        assert not gone, f"acknowledged messages gone from the log: {gone[:20]}"
    else:  # what goes was acknowledged just before the cut; nothing acked after it
        assert set(tally.lost) == set(lost_before), str(tally)


def test_messages_published_after_a_power_loss_are_delivered(nsqd_factory, tmp_path: Path  # type: ignore[no-untyped-def]
                                                             ) -> None:
    """A channel cursor made durable past what the log made durable (cursors are fsynced
    every pass, the log every --sync-timeout): after the power loss the log is shorter than
    the cursor says was consumed, and new messages land at offsets the cursor had passed."""
    shim = build_shim(tmp_path)
    if shim is None:
        pytest.skip("no C compiler: the power-loss shim cannot be built")
    # the log is never fsynced in this test's time: only the cursor is
    nsqd = nsqd_factory.create(["--sync-every=1000000", "--sync-timeout=1h"], name="pw")
    journal = tmp_path / "journal"
    nsqd.env = env(shim, nsqd.data_path, journal)
    nsqd.data_path.mkdir(parents=True, exist_ok=True)
    nsqd.start()
    url = f"http://{nsqd.http_address}"
    assert http("POST", f"{url}/topic/create?topic=pw")[0] == 200
    assert http("POST", f"{url}/channel/create?topic=pw&channel=c")[0] == 200
    for i in range(200):
        assert http("POST", f"{url}/pub?topic=pw", b"old-%d" % i)[0] == 200
    with consumer(nsqd.tcp_address, "pw", "c", rdy=200) as c:
        assert len(c.drain_messages(quiet=1.0, limit=60)) == 200
        time.sleep(3)  # a persist pass makes the cursor durable
    nsqd.kill()
    lose_unsynced(journal)
    nsqd.env = None
    nsqd.start()
    new = [b"new-%d" % i for i in range(20)]
    for body in new:
        assert http("POST", f"{url.rsplit(':', 1)[0]}:{nsqd.http_port}/pub?topic=pw", body)[0] == 200
    with consumer(nsqd.tcp_address, "pw", "c", rdy=200) as c:
        got = [m.body for m in c.drain_messages(quiet=2.0, limit=60)]
    assert set(new) <= set(got), f"acknowledged after the restart, never delivered: " \
        f"{sorted(set(new) - set(got))}"
