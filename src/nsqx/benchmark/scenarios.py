"""Benchmark scenarios against any NSQ-compatible nsqd address.

Each scenario runs its load generators in separate processes and returns a
flat dict of numbers (msgs/s, MB/s, latency percentiles, and server CPU/RSS
when the server's pid is known).
"""

from __future__ import annotations

import http.client
import multiprocessing as mp
import statistics
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from nsqx.benchmark import loadgen


def _pool(n: int) -> Any:
    return mp.get_context("fork").Pool(n)


def _server(pid: int | None) -> dict[str, float]:
    return loadgen.proc_stats(pid) if pid else {}


def _with_server(pid: int | None, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    before = _server(pid)
    out = fn()
    after = _server(pid)
    if before and after:
        out["server_cpu_s"] = after["cpu_s"] - before["cpu_s"]
        out["server_peak_rss_mib"] = after["peak_rss"] / 2**20
        msgs = out.get("messages") or 0
        if msgs:
            out["server_us_per_msg"] = out["server_cpu_s"] / msgs * 1e6
    return out


def _sum(results: list[loadgen.Result], seconds: float) -> dict[str, Any]:
    msgs = sum(r.messages for r in results)
    nbytes = sum(r.bytes for r in results)
    wall = max((r.seconds for r in results), default=seconds) or seconds
    errors = [e for r in results for e in r.errors]
    return {"messages": msgs, "msgs_per_s": msgs / wall, "mb_per_s": nbytes / wall / 1e6,
            "seconds": wall, "errors": errors[:5]}


def ingest(addr: str, topic: str, *, size: int = 200, batch: int = 200, seconds: float = 10.0,
           writers: int = 2, mixed: tuple[int, int] | None = None, pid: int | None = None,
           tls: bool = False, window: int = 8) -> dict[str, Any]:
    """MPUB ingest from `writers` processes (bench_writer's scenario), `window` MPUBs in
    flight on each."""
    def go() -> dict[str, Any]:
        with _pool(writers) as pool:
            res = pool.starmap(loadgen.run_writer,
                               [(addr, topic, size, batch, seconds, mixed, window, tls)] * writers)
        return _sum(res, seconds)
    return _with_server(pid, go)


def ingest_topics(addr: str, topics: list[str], *, size: int = 200, batch: int = 20,
                  seconds: float = 10.0, writers: int = 2, per_send: int = 10,
                  pid: int | None = None) -> dict[str, Any]:
    """MPUB batches of `batch` round-robin over many topics from `writers` processes.

    Each writer starts at a different point of the topic list so they do not
    walk it in lockstep.
    """
    def go() -> dict[str, Any]:
        step = len(topics) // writers
        args = [(addr, "", size, batch, seconds, None, 8, False,
                 topics[i * step:] + topics[: i * step], per_send) for i in range(writers)]
        with _pool(writers) as pool:
            res = pool.starmap(loadgen.run_writer, args)
        return _sum(res, seconds)
    return _with_server(pid, go)


def drain(addr: str, topic: str, channel: str, *, expect: int, seconds: float = 60.0,
          readers: int = 1, rdy: int = 2500, pid: int | None = None,
          tls: bool = False) -> dict[str, Any]:
    """Consume `expect` messages with `readers` connections, FIN each (bench_reader)."""
    def go() -> dict[str, Any]:
        per = -(-expect // readers)
        with _pool(readers) as pool:
            res = pool.starmap(loadgen.run_reader,
                               [(addr, topic, channel, per, seconds, rdy, tls)] * readers)
        return _sum(res, seconds)
    return _with_server(pid, go)


def http_pub(http_addr: str, topic: str, *, size: int = 200, seconds: float = 10.0,
             clients: int = 2, raw: bool = False, pid: int | None = None) -> dict[str, Any]:
    """HTTP POST /pub requests/s, one keep-alive connection per client process.

    raw=False uses http.client; raw=True a pre-encoded request on a raw socket
    (cheap enough that the server, not the client, sets the rate).
    """
    fn = loadgen.run_http_pub_raw if raw else loadgen.run_http_pub
    def go() -> dict[str, Any]:
        with _pool(clients) as pool:
            res = pool.starmap(fn, [(http_addr, topic, size, seconds)] * clients)
        out = _sum(res, seconds)
        out.update(_percentiles(sorted(x for r in res for x in r.latencies_us)))
        return out
    return _with_server(pid, go)


def idle_cpu(pid: int, seconds: float = 10.0) -> dict[str, Any]:
    """Server CPU while nothing happens (timer/scan cost), as % of one core."""
    before = loadgen.proc_stats(pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    after = loadgen.proc_stats(pid)
    wall = time.monotonic() - t0
    cpu = after["cpu_s"] - before["cpu_s"]
    return {"messages": 0, "msgs_per_s": 0.0, "seconds": wall, "server_cpu_s": cpu,
            "cpu_pct": cpu / wall * 100, "server_peak_rss_mib": after["peak_rss"] / 2**20,
            "server_rss_mib": after["rss"] / 2**20}


def _percentiles(lat: list[float]) -> dict[str, float]:
    if not lat:
        return {}
    def q(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))]
    return {"p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999),
            "mean_us": statistics.fmean(lat)}


def fanout(addr: str, topic: str, channels: list[str], *, expect: int, seconds: float = 60.0,
           pid: int | None = None) -> dict[str, Any]:
    """Drain the same `expect` messages on every channel at once (1 topic x N channels)."""
    def go() -> dict[str, Any]:
        with _pool(len(channels)) as pool:
            res = pool.starmap(loadgen.run_reader,
                               [(addr, topic, ch, expect, seconds, 2500) for ch in channels])
        return _sum(res, seconds)
    return _with_server(pid, go)


def pub_latency(addr: str, topic: str, *, size: int = 200, seconds: float = 10.0,
                clients: int = 1, pid: int | None = None) -> dict[str, Any]:
    """One PUB at a time per connection, waiting for each OK (`clients` processes)."""
    def go() -> dict[str, Any]:
        with _pool(clients) as pool:
            res = pool.starmap(loadgen.run_pub_latency, [(addr, topic, size, seconds)] * clients)
        out = _sum(res, seconds)
        out.update(_percentiles(sorted(x for r in res for x in r.latencies_us)))
        return out
    return _with_server(pid, go)


def http_post(http_addr: str, path: str) -> None:
    req = urllib.request.Request(f"http://{http_addr}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def http_post_many(http_addr: str, paths: list[str]) -> None:
    """POST each path over one keep-alive connection (bulk topic/channel creation)."""
    host, _, port = http_addr.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for path in paths:
            conn.request("POST", path, b"")
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"POST {path}: {r.status} {data[:200]!r}")
    finally:
        conn.close()


def wait_depth(http_addr: str, topic: str, channel: str, depth: int, timeout: float = 30.0) -> int:
    """Wait until a channel's depth reaches `depth` (messages published are visible)."""
    import json

    deadline = time.monotonic() + timeout
    last = -1
    while time.monotonic() < deadline:
        with urllib.request.urlopen(
                f"http://{http_addr}/stats?format=json&topic={topic}&channel={channel}",
                timeout=10) as r:
            data = json.loads(r.read())
        data = data.get("data", data)
        for t in data.get("topics", []):
            for c in t.get("channels", []):
                if c.get("channel_name") == channel:
                    last = c.get("depth", 0)
        if last >= depth:
            return last
        time.sleep(0.2)
    return last
