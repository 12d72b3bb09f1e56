"""Disk full on a real nsqd (a 4 MiB tmpfs): publishes are refused (TCP ``E_PUB_FAILED``,
HTTP 503 ``EXITING`` as upstream's doPUB answers a failed put), the process keeps serving,
nothing acknowledged is damaged, and writes come back with space."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nsqx.protocol import v2
from tests.support.cluster import http, wait_until
from tests.support.rawclient import RawClient, consumer

pytestmark = [pytest.mark.slow]

PAD = b"x" * 4000


def resize(path: Path, size: str) -> None:
    """Grow the tmpfs at ``path``: space comes back on a full disk."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def body(i: int) -> bytes:
    return b"%06d" % i + PAD


def test_disk_full_refuses_then_recovers_without_damage(small_disk: Path, nsqd_factory) -> None:  # type: ignore[no-untyped-def]
    nsqd = nsqd_factory.start(["--max-bytes-per-file=262144"], data_path=small_disk / "data")
    url = f"http://{nsqd.http_address}"
    assert http("POST", f"{url}/topic/create?topic=full")[0] == 200
    assert http("POST", f"{url}/channel/create?topic=full&channel=c")[0] == 200
    acked, refused = [], None
    for i in range(3000):  # 12 MB into 4 MiB
        code, answer = http("POST", f"{url}/pub?topic=full", body(i))
        if code != 200:
            refused = (code, answer)
            break
        acked.append(i)
    assert refused is not None, "the disk never filled"
    assert refused == (503, {"message": "EXITING"}), refused
    assert len(acked) > 100
    assert nsqd.is_running(), nsqd.all_logs()
    # still answering, still refusing while full: TCP says E_PUB_FAILED, the link stays up
    with RawClient(nsqd.tcp_address) as c:
        c.identify()
        c.send(v2.pub("full", body(len(acked))))
        c.expect_error("E_PUB_FAILED")
    assert http("GET", f"{url}/ping")[0] in (200, 500)  # answers (500: unhealthy, as upstream)
    resize(small_disk, "64m")
    n = len(acked)
    wait_until(lambda: http("POST", f"{url}/pub?topic=full", body(n))[0] == 200, timeout=30,
               what="publishes acknowledged once space is back")
    acked.append(n)
    for i in range(n + 1, n + 20):
        assert http("POST", f"{url}/pub?topic=full", body(i))[0] == 200
        acked.append(i)
    assert http("GET", f"{url}/ping")[0] == 200, "still unhealthy once writes succeed"
    nsqd.restart()  # every acknowledged message survives a restart, undamaged
    with consumer(nsqd.tcp_address, "full", "c", rdy=100) as c:
        got = [m.body for m in c.drain_messages(quiet=2.0, limit=120)]
    numbers = [int(b[:6]) for b in got]
    assert all(b == body(int(b[:6])) for b in got), "a damaged body was delivered"
    assert set(acked) <= set(numbers), sorted(set(acked) - set(numbers))[:20]
    assert set(numbers) <= set(acked), "a refused publish was delivered"
