"""Jepsen's nemeses on nodes that are hosts, under stock pynsq load, judged by the checker.

One topic (1 partition, 3 replicas, min ISR 2, default fsync policy), one pynsq producer and
one consumer on the client host for the whole run; each nsqd's wall clock can be shifted
(tests/faults/clock.py); the nemeses follow one another: each is injected, held for HOLD
seconds (6: past the 3 s node lease and the 3 s ISR lag timeout), healed, and the next
starts once the ISR is full again and writes are acknowledged. Checked per nemesis
(tests/faults/checker.py): 0 acknowledged messages lost, nothing invented, no epoch led by
two nodes, the cluster recovered, a clock shifted inside the 30 s signature window never
refused and one outside it always; duplicates and the longest time without an ack reported.

CI runs every nemesis once (~2 min). More, from one command:
    .venv/bin/python bench/chaos.py --only faults --minutes 20 [--nemesis kill ...]
(or NSQX_FAULT_NEMESES=halves,kill NSQX_FAULT_ROUNDS=5 pytest tests/faults/test_nemeses.py -s)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.cluster.chaos_check import Load, read_events
from tests.faults.checker import Window, invented, judge, judge_ordered, split_brains, table
from tests.faults.hosts import HostCluster, refusals_since
from tests.faults.nemesis import NEMESES, REFUSED, WITHIN_WINDOW
from tests.faults.ordered_load import OrderedLoad
from tests.support.cluster import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.compat]

CHOSEN = [n for n in os.environ.get("NSQX_FAULT_NEMESES", ",".join(NEMESES)).split(",") if n]
ROUNDS = int(os.environ.get("NSQX_FAULT_ROUNDS", "1"))
HOLD = float(os.environ.get("NSQX_FAULT_HOLD", "6"))


# each window is bounded (held HOLD s, then at most 90 s to recover): the limit scales with them
@pytest.mark.timeout(240 + ROUNDS * len(CHOSEN) * (HOLD + 100))
def test_nemeses_lose_no_acknowledged_message(host_cluster: HostCluster, tmp_path: Path) -> None:
    unknown = set(CHOSEN) - set(NEMESES)
    assert not unknown, f"unknown nemeses {unknown}; known: {sorted(NEMESES)}"
    c = host_cluster
    c.create_topic("faults")
    # three partitions: one led by each node (placement spreads leaders), so every fault to
    # a node hits an ordered partition's leader too
    c.create_topic("ordered", partitions=3, extra="&orderedmulti=true")
    prefix = ["ip", "netns", "exec", c.client.ns]
    load = Load(c.lookupd_http, "faults", 3600, tmp_path, stop_file=tmp_path / "stop",
                prefix=prefix)
    ordered = OrderedLoad(c.lookupd_http, "ordered", 3, tmp_path, prefix)
    leaders = {p["leader"] for p in c.partitions("ordered")}
    assert len(leaders) == 3, f"ordered partitions not led by three nodes: {leaders}"
    windows: list[Window] = []
    try:
        wait_until(lambda: load.acked() > 200 and ordered.acked() > 50, timeout=60,
                   what="traffic before the faults")
        for _ in range(ROUNDS):
            for name in CHOSEN:
                w = Window(name, time.time())
                if windows:
                    windows[-1].end = w.start
                refused = c.stale_refusals()
                heal = NEMESES[name](c, "faults")
                time.sleep(HOLD)
                heal()
                w.healed = time.time()
                windows.append(w)
                acked = load.acked()
                try:
                    wait_until(lambda a=acked: len(c.partitions("faults")[0]["isr"]) == 3
                               and load.acked() > a + 50, timeout=90,
                               what=f"{name}: full ISR and writes acknowledged")
                except AssertionError:
                    w.recovered = False
                w.stale_refusals = refusals_since(refused, c.stale_refusals())
                time.sleep(1)
        windows[-1].end = time.time()
        load.end()
        order = judge_ordered(*ordered.finish())
        tally = load.finish()
    finally:
        load.stop()
        ordered.stop()
    published = max((e["end"] for e in read_events(load.prod_out) if "end" in e), default=0)
    rows = judge(windows, load.ack_times(), tally.seen)
    brains = split_brains({n.name: n.logs() for n in c.nodes})
    made_up = invented(tally.seen, published)
    report = (f"{table(rows)}\nrun: {tally}; published {published}; invented {len(made_up)}; "
              f"epochs led by two nodes {len(brains)}\n{order}")
    print(f"\n{report}")
    if os.environ.get("NSQX_FAULT_REPORT"):
        Path(os.environ["NSQX_FAULT_REPORT"]).write_text(json.dumps(
            [r.__dict__ for r in rows] + [{"invented": made_up, "split_brains": len(brains)}]))
    assert len(tally.acked) > 500, report
    assert not tally.lost, f"lost acknowledged messages {sorted(tally.lost)[:20]}\n{report}"
    assert not made_up, report
    assert not brains, f"{brains}\n{report}"
    assert all(r.recovered for r in rows), report
    assert order.acked > 50, report
    assert not order.lost, f"ordered: lost {order.lost[:20]}\n{report}"
    assert not order.violations, f"ordered: out of order {order.violations[:20]}\n{report}"
    # a clock inside the 30 s signature window is never refused; one outside it always is
    assert not any(r.stale_refusals for r in rows if r.nemesis in WITHIN_WINDOW), report
    assert all(r.stale_refusals for r in rows if r.nemesis in REFUSED), report
