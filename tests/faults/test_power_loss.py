"""Power loss of a node (LazyFS's model, tests/faults/power.py): under a steady stream of
HTTP publishes nsqd is killed -9 and every write no fsync covered is undone; then it must
start again on what is left and deliver what it acknowledged, per fsync policy:

- ``--sync-every=1`` and a topic's ``sync_every=1`` (``syncdisk=1`` in a cluster): 0 lost;
- the defaults (fsync every 2,500 messages or 2 s): what is lost is only the newest
  acknowledged messages (a tail of the publish order), counted and reported.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.faults.power import build_shim, env, lose_unsynced
from tests.support.cluster import http
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
    time.sleep(4)
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
