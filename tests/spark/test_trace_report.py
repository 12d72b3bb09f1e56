"""``nsqx spark trace-report`` on real trace data: a traced topic consumed with FINs, REQs, a
timeout and a slow consumer; the report's counts are checked against what the test did, its
latencies against the same events read back through /trace/search and computed here."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from nsqx.protocol import v2  # noqa: E402
from tests.support import http_api  # noqa: E402
from tests.support.nsqd_process import NsqdProcess  # noqa: E402
from tests.support.rawclient import RawClient, consumer  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N = 10
HOLD = 0.3  # the slow consumer keeps each message this long before its FIN


def pct(values: list[float], p: float) -> float:
    """Exact percentile with linear interpolation (what Spark's percentile computes)."""
    v = sorted(values)
    pos = p * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def run_traffic(nsqd: NsqdProcess) -> tuple[str, str]:
    """Publish N traced messages and consume them on two channels; returns the client
    addresses (fast, slow) as nsqd sees them."""
    addr = nsqd.http_address
    http_api.post(addr, "/topic/create", topic="orders")
    for ch in ("fast", "slow"):
        http_api.post(addr, "/channel/create", topic="orders", channel=ch)
    assert http_api.post(addr, "/topic/trace", topic="orders", enable="true").status == 200
    with RawClient(nsqd.tcp_address) as p:
        p.mpub("orders", [b"m%d" % i for i in range(N - 2)])
        for i in range(N - 2, N):
            p.send(v2.pub_trace("orders", 1000 + i, b"m%d" % i))
            p.expect_response()
    # fast: FIN at once, except REQ m0 and m1 once and let m2 time out once
    with consumer(nsqd.tcp_address, "orders", "fast", rdy=N,
                  identify={"msg_timeout": 1000}) as c:
        fast = f"127.0.0.1:{c.sock.getsockname()[1]}"
        seen: dict[bytes, int] = {}
        finished = 0
        while finished < N:
            m = c.read_message(timeout=10)
            seen[m.body] = seen.get(m.body, 0) + 1
            if m.body in (b"m0", b"m1") and seen[m.body] == 1:
                c.send(v2.req(m.id, 0))
            elif m.body == b"m2" and seen[m.body] == 1:
                pass  # no answer: it times out after 1 s and comes back
            else:
                c.send(v2.fin(m.id))
                finished += 1
        c.expect_nothing(0.2)
    with consumer(nsqd.tcp_address, "orders", "slow", rdy=1) as c:
        slow = f"127.0.0.1:{c.sock.getsockname()[1]}"
        for _ in range(N):
            m = c.read_message(timeout=10)
            time.sleep(HOLD)
            c.send(v2.fin(m.id))
        c.expect_nothing(0.2)
    return fast, slow


def timelines(nsqd: NsqdProcess) -> list[dict[str, Any]]:
    """Every message's events through /trace/search, once all are recorded."""
    out = []
    for off in range(N):
        deadline = time.monotonic() + 10
        while True:
            r = http_api.get(nsqd.http_address, "/trace/search", topic="orders",
                             id=f"{off:016x}").json()
            evs = r["messages"][0]["events"]
            fins = sum(e["event"] == "fin" for e in evs)
            if fins == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        out.append({"offset": off, "events": evs})
    return out


def expected(tl: list[dict[str, Any]]) -> dict[str, Any]:
    """Per channel: (handle ms of fins, pub->first deliver ms, per-client handle ms)."""
    res: dict[str, Any] = {}
    for m in tl:
        pub = min(e["ts"] for e in m["events"] if e["event"] == "pub")
        for ch in ("fast", "slow"):
            evs = sorted((e for e in m["events"] if e.get("channel") == ch), key=lambda e: e["ts"])
            r = res.setdefault(ch, {"handle": [], "first": [], "clients": {}, "deliveries": 0})
            for i, e in enumerate(evs):
                if e["event"] != "deliver":
                    continue
                r["deliveries"] += 1
                if e["attempts"] == 1:
                    r["first"].append((e["ts"] - pub) / 1e6)
                nxt = evs[i + 1] if i + 1 < len(evs) else None
                if nxt is not None and nxt["event"] == "fin":
                    ms = (nxt["ts"] - e["ts"]) / 1e6
                    r["handle"].append(ms)
                    r["clients"].setdefault(e["client"]["addr"], []).append(ms)
    return res


def test_trace_report(spark: Any, nsqd: NsqdProcess, tmp_path: Path) -> None:
    from nsqx.spark.trace_report import format_report, trace_report

    fast, slow = run_traffic(nsqd)
    tl = timelines(nsqd)
    exp = expected(tl)
    out = tmp_path / "report"
    s = trace_report(spark, out=str(out), nsqd=nsqd.http_address)
    ch = {c["channel"]: c for c in s["channels"]}
    assert set(ch) == {"fast", "slow"}
    # what the test did
    f = ch["fast"]
    assert (f["messages"], f["deliveries"], f["redelivered_messages"]) == (N, N + 3, 3)
    assert f["redelivery_rate"] == pytest.approx(0.3)
    assert (f["fin"], f["req"], f["timeout"], f["dlq"]) == (N, 2, 1, 0)
    sl = ch["slow"]
    assert (sl["messages"], sl["deliveries"], sl["redelivered_messages"], sl["fin"]) == (N, N, 0, N)
    assert sl["deliver_to_fin_ms_p50"] >= HOLD * 1000  # it held each one that long
    # the same events, computed here
    for name, c in ch.items():
        e = exp[name]
        assert c["deliveries"] == e["deliveries"]
        for p in (0.5, 0.9, 0.99):
            assert c[f"deliver_to_fin_ms_p{int(p * 100)}"] == pytest.approx(pct(e["handle"], p))
            assert c[f"pub_to_deliver_ms_p{int(p * 100)}"] == pytest.approx(pct(e["first"], p))
        assert c["deliver_to_fin_ms_max"] == pytest.approx(max(e["handle"]))
    ranked = sorted(((pct(v, 0.5), a) for name in exp for a, v in exp[name]["clients"].items()),
                    reverse=True)
    top = s["slowest_consumers"][0]
    assert top["client_addr"] == ranked[0][1] == slow and top["channel"] == "slow"
    assert top["deliver_to_fin_ms_p50"] == pytest.approx(ranked[0][0])
    assert [c["client_addr"] for c in s["slowest_consumers"]] == [slow, fast]
    # the files
    rows = spark.read.parquet(str(out / "deliveries")).where("channel = 'fast'").collect()
    assert len(rows) == N + 3
    assert sorted((r.offset, r.attempts, r.outcome) for r in rows if r.offset < 3) == [
        (0, 1, "req"), (0, 2, "fin"), (1, 1, "req"), (1, 2, "fin"), (2, 1, "timeout"),
        (2, 2, "fin")]
    assert spark.read.parquet(str(out / "channels")).count() == 2
    assert spark.read.parquet(str(out / "consumers")).count() == 2
    assert json.loads((out / "summary.json").read_text())["channels"][0]["channel"] == "fast"
    page = (out / "summary.html").read_text()
    assert "<h2>Slowest consumers</h2>" in page and slow in page and "30.0%" in page
    text = format_report(s)
    assert "orders/fast: 10 messages, 13 deliveries, redelivered 30.0%" in text
