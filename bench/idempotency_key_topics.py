"""What the cross-topic Idempotency-Key check costs a restarted nsqd: its first keyed
request reads back which topic each key of the window was used on.

    .venv/bin/python bench/idempotency_key_topics.py [--topics 20] [--keys 500] [--runs 3]

Fills a fresh nsqd with ``--topics`` topics of ``--keys`` keyed HTTP /pub requests each
(one index file per topic), restarts it (SIGKILL, so the log's tail is read back too),
and times, on the restarted node, the first keyed request (which reads every index) and
the median of the next 50 (the map is in memory then). Wall clock, one client; what the
first request adds is the difference.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import nsqd_proc  # the scripts' shared process helpers, beside this one
from nsqd_proc import stop


def post(http: str, topic: str, key: str, body: bytes) -> float:
    req = urllib.request.Request(f"http://{http}/pub?topic={topic}", data=body,
                                 headers={"Idempotency-Key": key}, method="POST")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        assert r.status == 200
    return time.perf_counter() - t0


def one_run(topics: int, keys: int) -> tuple[float, float]:
    data = Path(tempfile.mkdtemp(prefix="nsqx-keytopics-"))
    try:
        proc, _, http = nsqd_proc.start_nsqd(data)
        try:
            for t in range(topics):
                for k in range(keys):
                    post(http, f"t{t}", f"t{t}-k{k}", b"x")
        finally:
            proc.kill()
            proc.wait()
        proc, _, http = nsqd_proc.start_nsqd(data)
        try:
            first = post(http, "fresh", "fresh-0", b"x")
            rest = [post(http, "fresh", f"fresh-{i}", b"x") for i in range(1, 51)]
        finally:
            stop(proc)
        return first, statistics.median(rest)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--keys", type=int, default=500)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    results = [one_run(a.topics, a.keys) for _ in range(a.runs)]
    for first, rest in results:
        print(f"first keyed request {first * 1000:8.1f} ms | next ones (median) "
              f"{rest * 1000:6.2f} ms")
    first = statistics.median(r[0] for r in results)
    rest = statistics.median(r[1] for r in results)
    print(f"{a.topics} topics x {a.keys} keys: the first keyed request after a restart "
          f"takes {first * 1000:.1f} ms, later ones {rest * 1000:.2f} ms (medians of "
          f"{a.runs} runs)")


if __name__ == "__main__":
    main()
