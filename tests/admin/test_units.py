"""nsqadmin's pure parts: options, aggregation over nodes, the sampler's ring buffer."""

from __future__ import annotations

import math

import pytest

from nsqx.admin.aggregate import aggregate_topic, e2e_from_nsqd, e2e_merge, node_topic_stats
from nsqx.admin.options import Options, OptionsError, load, normalize_base_path
from nsqx.admin.sampler import Sampler
from nsqx.flags import FlagError


def test_options_go_and_gnu_syntax(tmp_path) -> None:
    opts, _ = load(["-lookupd-http-address=127.0.0.1:4161", "--lookupd-http-address",
                    "127.0.0.1:4162", "-admin-user", "a", "--admin-user=b", "-proxy-graphite",
                    "--graphite-url=http://g:8080", "--base-path=admin/", "--statsd-interval=30s"])
    assert opts.nsqlookupd_http_addresses == ["127.0.0.1:4161", "127.0.0.1:4162"]
    assert opts.admin_users == ["a", "b"] and opts.proxy_graphite
    assert opts.base_path == "/admin" and opts.statsd_interval == 30.0
    assert opts.http_address == "0.0.0.0:4171" and opts.acl_http_header == "X-Forwarded-User"
    cfg = tmp_path / "c.toml"
    cfg.write_text('nsqd_http_addresses = ["127.0.0.1:4151"]\nhttp_client_request_timeout = "1s"\n')
    opts, _ = load([f"--config={cfg}", "--http-client-request-timeout=3s"])
    assert opts.nsqd_http_addresses == ["127.0.0.1:4151"]
    assert opts.http_client_request_timeout == 3.0  # flag beats file
    with pytest.raises(OptionsError, match="required"):
        load([])
    with pytest.raises(OptionsError, match="allow-config-from-cidr"):
        load(["--nsqd-http-address=h:1", "--allow-config-from-cidr=nope"])
    with pytest.raises(FlagError):
        load(["--bogus"])
    assert normalize_base_path("") == "/" and normalize_base_path("/a//b/../c/") == "/a/c"
    Options(nsqd_http_addresses=["x:1"]).validate()


def _producer(port: int) -> dict:
    return {"broadcast_address": "127.0.0.1", "http_port": port, "hostname": f"h{port}"}


def _raw_topic(depth: int, msgs: int, chan_depth: int, q99: float, count: int) -> dict:
    e2e = {"count": count, "percentiles": [{"quantile": 0.99, "value": q99}]}
    return {"topic_name": "t", "depth": depth, "backend_depth": 1, "message_count": msgs,
            "paused": False, "e2e_processing_latency": e2e,
            "channels": [{"channel_name": "c", "depth": chan_depth, "backend_depth": 0,
                          "in_flight_count": 1, "deferred_count": 2, "requeue_count": 3,
                          "timeout_count": 4, "message_count": msgs, "client_count": 1,
                          "paused": True, "e2e_processing_latency": e2e,
                          "clients": [{"client_id": "x", "hostname": "w", "connect_ts": 100,
                                       "ready_count": 5}]}]}


def test_aggregate_topic_sums_nodes_and_channels() -> None:
    per_node = [node_topic_stats(_raw_topic(5, 10, 3, 1e6, 2), _producer(2), now=160),
                node_topic_stats(_raw_topic(7, 20, 4, 3e6, 6), _producer(1), now=160)]
    agg = aggregate_topic("t", per_node)
    assert agg["node"] == "*" and agg["depth"] == 12 and agg["message_count"] == 30
    assert agg["memory_depth"] == 10 and agg["backend_depth"] == 2
    assert [n["node"] for n in agg["nodes"]] == ["127.0.0.1:1", "127.0.0.1:2"]  # by hostname
    (c,) = agg["channels"]
    assert c["depth"] == 7 and c["in_flight_count"] == 2 and c["timeout_count"] == 8
    assert c["paused"] and len(c["clients"]) == 2 and len(c["nodes"]) == 2
    assert c["clients"][0]["connected"] == 60 * 10**9 and c["clients"][0]["ready_count"] == 5
    (p,) = agg["e2e_processing_latency"]["percentiles"]
    assert p["min"] == 1e6 and p["max"] == 3e6 and p["count"] == 8
    assert p["average"] == pytest.approx((1e6 * 2 + 3e6 * 6) / 8)
    assert agg["e2e_processing_latency"]["count"] == 8


def test_e2e_shapes() -> None:
    e = e2e_from_nsqd({"count": 0, "percentiles": None})
    assert e == {"count": 0, "percentiles": None, "topic": "", "channel": "", "host": ""}
    m = e2e_merge([e2e_from_nsqd({"count": 1, "percentiles": [
        {"quantile": 0.5, "value": 1.0}, {"quantile": 0.99, "value": 2.0}]})], "t", "c")
    assert [p["quantile"] for p in m["percentiles"]] == [0.99, 0.5]
    assert m["host"] == "*" and m["topic"] == "t" and m["channel"] == "c"


def _stats(msgs: int, depth: int, node_port: int = 1) -> list:
    return [(_producer(node_port), {"topics": [
        {"topic_name": "t", "depth": depth, "message_count": msgs, "channels": [
            {"channel_name": "c", "depth": depth, "in_flight_count": 1, "message_count": msgs,
             "client_count": 1}]}]})]


def test_sampler_ring_rates_and_gaps() -> None:
    s = Sampler(cluster=None, interval=1.0, window=4.0)  # type: ignore[arg-type]
    assert s.capacity == 5
    for i in range(8):  # wraps around
        s.record(_stats(msgs=100 * i, depth=i), now=1000.0 + i)
    q = s.query("t", metrics=("rate", "depth"))
    assert q["timestamps"] == [1003.0, 1004.0, 1005.0, 1006.0, 1007.0]
    assert q["series"]["rate"]["*"] == [None, 100.0, 100.0, 100.0, 100.0]
    assert q["series"]["depth"]["127.0.0.1:1"] == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert s.latest_topic_rates() == {"t": 100.0}
    # a node restart (counter goes back) is a gap, not a negative rate; a missing sample too
    s.record(_stats(msgs=5, depth=0), now=1008.0)
    s.record([], now=1009.0)
    q = s.query("t", "c", metrics=("rate", "in_flight_count"))
    assert q["series"]["rate"]["*"][-2:] == [None, None]
    assert q["series"]["in_flight_count"]["*"][-1] is None
    # a series unseen for a whole window is forgotten
    for i in range(6):
        s.record([], now=1010.0 + i)
    assert s.series == {}
    assert all(v is None or not math.isnan(v) for v in q["series"]["rate"]["*"])
