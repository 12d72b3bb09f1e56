"""`nsqx bench` and the load generators against a real nsqd (counts only, never timings)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess


def _bench(nsqd: NsqdProcess, *args: str) -> str:
    target = f"{nsqd.tcp_address},{nsqd.http_address}"
    r = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", "bench", "--nsqd", target,
                        "--seconds", "0.5", "--writers", "1", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_ingest_counts_match_the_server(nsqd: NsqdProcess) -> None:
    out = _bench(nsqd, "--scenario", "ingest", "--size", "100", "--batch", "50")
    sent = int(re.search(r"\(([\d,]+) msgs\)", out).group(1).replace(",", ""))
    assert sent > 0 and sent % 50 == 0
    ch = http_api.channel_stats(nsqd.http_address, "nsqx_bench0", "bench")
    assert ch is not None and ch["depth"] == sent


def test_drain_consumes_everything(nsqd: NsqdProcess) -> None:
    out = _bench(nsqd, "--scenario", "drain", "--batch", "20")
    drained = int(re.search(r"\(([\d,]+) msgs\)", out).group(1).replace(",", ""))
    ch = http_api.channel_stats(nsqd.http_address, "nsqx_bench0", "bench")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
    assert drained == ch["message_count"] > 0


def test_pub_reports_latency_percentiles(nsqd: NsqdProcess) -> None:
    out = _bench(nsqd, "--scenario", "pub")
    assert re.search(r"p50 \d+us p99 \d+us p999 \d+us", out), out
