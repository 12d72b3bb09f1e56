"""nsqadmin's JSON API (upstream's ``/api/...`` shapes) against real nsqd + nsqlookupd."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.admin.helpers import (
    get_json,
    http,
    nsqd_channel,
    nsqd_topic,
    wait_for,
)
from tests.support import http_api
from tests.support.rawclient import consumer


def _admin_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsqx.cli.nsqadmin", *args],
                          capture_output=True, text=True, timeout=30)


# ----------------------------------------------------------------------------- flags

def test_help_version_and_bad_flags(tmp_path) -> None:
    r = _admin_cli("--help")
    assert r.returncode == 0
    for flag in ("-lookupd-http-address", "-nsqd-http-address", "-graphite-url",
                 "-proxy-graphite", "-statsd-prefix", "-notification-http-endpoint",
                 "-acl-http-header", "-admin-user", "-base-path", "-allow-config-from-cidr",
                 "-http-client-tls-root-ca-file", "-stats-sample-interval"):
        assert flag in r.stdout, flag
    assert "0.0.0.0:4171" in r.stdout
    r = _admin_cli("-version")
    assert r.returncode == 0 and r.stdout.startswith("nsqadmin v")
    r = _admin_cli()
    assert r.returncode == 2
    assert "--nsqd-http-address or --lookupd-http-address required" in r.stderr
    r = _admin_cli("--nsqd-http-address=127.0.0.1:1", "-lookupd-http-address", "127.0.0.1:2")
    assert r.returncode == 2 and "not both" in r.stderr
    r = _admin_cli("--lookupd-http-address=127.0.0.1:2", "--http-client-tls-cert=/x")
    assert r.returncode == 2 and "--http-client-tls-key must be specified" in r.stderr


def test_config_file_and_config_endpoint(cluster, tmp_path) -> None:
    cfg = tmp_path / "nsqadmin.toml"
    cfg.write_text(f'nsqlookupd_http_addresses = ["{cluster.lookupd.http_address}"]\n'
                   'admin_users = ["alice"]\nstats_sample_interval = "1s"\n')
    admin = cluster.admin_factory.start([f"--config={cfg}"])
    assert get_json(admin.url + "/config/nsqlookupd_http_addresses") == [
        cluster.lookupd.http_address]
    assert get_json(admin.url + "/config/admin_users") == ["alice"]
    assert get_json(admin.url + "/config/http_client_request_timeout") == 5_000_000_000
    r = http("GET", admin.url + "/config/nope")
    assert r.status == 400 and r.json() == {"message": "INVALID_OPTION"}
    # PUT a new lookupd list (a dead one added): still answers, marks it in warnings
    r = http("PUT", admin.url + "/config/nsqlookupd_http_addresses",
             f'["{cluster.lookupd.http_address}", "127.0.0.1:1"]'.encode())
    assert r.status == 200, r.body
    topics = get_json(admin.url + "/api/topics")
    assert topics["message"].startswith("WARNING: ") and "127.0.0.1:1" in topics["message"]
    r = http("PUT", admin.url + "/config/log_level", b"bogus")
    assert r.status == 400 and r.json() == {"message": "INVALID_VALUE"}
    assert http("PUT", admin.url + "/config/log_level", b"debug").status == 200


def test_config_refused_outside_cidr(cluster) -> None:
    admin = cluster.start_admin("--allow-config-from-cidr=10.0.0.0/8")
    r = http("GET", admin.url + "/config/nsqlookupd_http_addresses")
    assert r.status == 403 and r.json() == {"message": "FORBIDDEN"}


# ----------------------------------------------------------------------------- reads

def _seed(cluster) -> tuple[str, str]:
    n1, n2 = cluster.nsqds
    http_api.mpub(n1.http_address, "orders", [b"a", b"b", b"c"])
    http_api.mpub(n2.http_address, "orders", [b"d", b"e"])
    for n in (n1, n2):
        assert http_api.post(n.http_address, "/channel/create", topic="orders",
                             channel="billing").status == 200
    http_api.mpub(n1.http_address, "orders", [b"f"])
    return n1.http_address, n2.http_address


def test_topics_topic_channel_nodes_counter_match_stats(cluster) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    assert http("GET", admin.url + "/ping").body == b"OK"

    topics = get_json(admin.url + "/api/topics")
    assert topics == {"topics": ["orders"], "message": ""}

    r = http("GET", admin.url + "/api/topics/orders")
    assert r.headers["x-nsq-content-type"] == "nsq; version=1.0"
    t = r.json()
    s1, s2 = nsqd_topic(a1, "orders"), nsqd_topic(a2, "orders")
    assert t["node"] == "*" and t["topic_name"] == "orders" and t["message"] == ""
    assert t["message_count"] == s1["message_count"] + s2["message_count"] == 6
    assert t["depth"] == s1["depth"] + s2["depth"]
    assert sorted(n["node"] for n in t["nodes"]) == sorted([a1, a2])
    for n in t["nodes"]:
        st = s1 if n["node"] == a1 else s2
        assert n["depth"] == st["depth"] and n["message_count"] == st["message_count"]
        assert n["memory_depth"] == st["depth"] - st["backend_depth"]
    (ch,) = t["channels"]
    assert ch["channel_name"] == "billing" and ch["node"] == "*"
    c1, c2 = nsqd_channel(a1, "orders", "billing"), nsqd_channel(a2, "orders", "billing")
    assert ch["depth"] == c1["depth"] + c2["depth"]
    assert len(ch["nodes"]) == 2
    assert set(t["e2e_processing_latency"]) >= {"count", "percentiles", "topic", "channel", "host"}

    # a client on the channel shows up with upstream's ClientStats fields
    with consumer(cluster.nsqds[0].tcp_address, "orders", "billing", rdy=0,
                  identify={"client_id": "worker-1", "hostname": "worker-host",
                            "user_agent": "test-agent/1.0"}):
        wait_for(lambda: nsqd_channel(a1, "orders", "billing")["client_count"] == 1)
        c = get_json(admin.url + "/api/topics/orders/billing")
        assert c["channel_name"] == "billing" and c["client_count"] == 1
        (cl,) = c["clients"]
        for key in ("node", "remote_address", "version", "client_id", "hostname", "user_agent",
                    "connect_ts", "connected", "in_flight_count", "ready_count", "finish_count",
                    "requeue_count", "message_count", "sample_rate", "deflate", "snappy",
                    "authed", "auth_identity", "auth_identity_url", "tls", "tls_cipher_suite",
                    "tls_version", "tls_negotiated_protocol",
                    "tls_negotiated_protocol_is_mutual"):
            assert key in cl, key
        assert cl["node"] == a1 and cl["user_agent"] == "test-agent/1.0"
        assert cl["hostname"] == "worker-host"
        node = get_json(admin.url + f"/api/nodes/{a1}")
        assert node["node"] == a1 and node["total_clients"] == 1
        assert node["total_messages"] == nsqd_topic(a1, "orders")["message_count"]

    nodes = get_json(admin.url + "/api/nodes")
    assert nodes["message"] == ""
    assert sorted(f"{n['broadcast_address']}:{n['http_port']}" for n in nodes["nodes"]) == \
        sorted([a1, a2])
    for n in nodes["nodes"]:
        assert n["topics"] == [{"topic": "orders", "tombstoned": False}]
        assert len(n["remote_addresses"]) == 1 and n["out_of_date"] is False
        assert {"hostname", "tcp_port", "version", "remote_address"} <= set(n)

    counter = get_json(admin.url + "/api/counter")
    assert set(counter["stats"]) == {f"orders:billing:{a1}", f"orders:billing:{a2}"}
    for v in counter["stats"].values():
        assert set(v) == {"node", "topic_name", "channel_name", "message_count"}

    assert http("GET", admin.url + "/api/nodes/127.0.0.1:1").json() == {
        "message": "NODE_NOT_FOUND"}
    assert http("GET", admin.url + "/api/nope").status == 404


def test_inactive_topics(cluster) -> None:
    admin = cluster.start_admin()
    assert http_api.post(cluster.lookupd.http_address, "/topic/create", topic="lonely").status \
        == 200
    assert http_api.post(cluster.lookupd.http_address, "/channel/create", topic="lonely",
                         channel="c").status == 200
    r = get_json(admin.url + "/api/topics?inactive=true")
    assert r == {"topics": {"lonely": ["c"]}, "message": ""}


def test_nsqd_mode_and_down_node_marked(nsqd_factory, admin_factory) -> None:
    n = nsqd_factory.start(["--broadcast-address=127.0.0.1"])
    http_api.pub(n.http_address, "solo", b"x")
    admin = admin_factory.start([f"--nsqd-http-address={n.http_address}",
                                 "--nsqd-http-address=127.0.0.1:1",
                                 "--http-client-request-timeout=2s"])
    t = get_json(admin.url + "/api/topics")
    assert t["topics"] == ["solo"]
    assert t["message"].startswith("WARNING: ") and "127.0.0.1:1" in t["message"]
    topic = get_json(admin.url + "/api/topics/solo")
    assert topic["message_count"] == 1 and len(topic["nodes"]) == 1
    health = get_json(admin.url + "/api/health")["nodes"]
    down = [h for h in health if not h["ok"]]
    assert [h["address"] for h in down] == ["127.0.0.1:1"]
    page = http("GET", admin.url + "/").body.decode()
    assert 'id="down-nodes"' in page and "127.0.0.1:1" in page and "solo" in page
    # every node down: upstream's 502 UPSTREAM_ERROR
    n.stop()
    r = http("GET", admin.url + "/api/topics")
    assert r.status == 502 and r.json()["message"].startswith("UPSTREAM_ERROR: ")


def test_frozen_node_times_out_rest_shown(cluster) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    cluster.freeze(cluster.nsqds[1])
    t0 = time.monotonic()
    t = get_json(admin.url + "/api/topics/orders")
    assert time.monotonic() - t0 < 10
    assert [n["node"] for n in t["nodes"]] == [a1]
    assert t["message"].startswith("WARNING: ") and a2 in t["message"]
    page = http("GET", admin.url + "/nodes").body.decode()
    assert 'id="down-nodes"' in page and "DOWN" in page
    cluster.thaw()
    wait_for(lambda: len(get_json(admin.url + "/api/topics/orders")["nodes"]) == 2, 15)


# ----------------------------------------------------------------------------- actions

def test_actions_change_the_nodes_and_notify(cluster, sink) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin(f"--notification-http-endpoint={sink.url}")
    api = admin.url + "/api/topics"

    def post(path: str, body: dict) -> dict:
        r = http("POST", api + path, body, headers={"User-Agent": "pytest-script"})
        assert r.status == 200, r.body
        return r.json()

    assert post("/orders", {"action": "pause"}) == {"message": ""}
    assert nsqd_topic(a1, "orders")["paused"] and nsqd_topic(a2, "orders")["paused"]
    post("/orders", {"action": "unpause"})
    assert not nsqd_topic(a1, "orders")["paused"]
    post("/orders/billing", {"action": "pause"})
    assert nsqd_channel(a1, "orders", "billing")["paused"]
    assert nsqd_channel(a2, "orders", "billing")["paused"]
    post("/orders/billing", {"action": "unpause"})
    assert not nsqd_channel(a2, "orders", "billing")["paused"]
    assert nsqd_channel(a1, "orders", "billing")["depth"] > 0
    post("/orders/billing", {"action": "empty"})
    assert nsqd_channel(a1, "orders", "billing")["depth"] == 0
    assert nsqd_channel(a2, "orders", "billing")["depth"] == 0
    post("/orders", {"action": "empty"})
    assert nsqd_topic(a1, "orders")["depth"] == 0

    r = http("POST", api + "/orders", {"action": "explode"})
    assert r.status == 400 and r.json() == {"message": "INVALID_ACTION"}
    r = http("POST", api, {"topic": "bad topic!"})
    assert r.status == 400 and r.json() == {"message": "INVALID_TOPIC"}

    # create via lookupd (upstream): topic + channel registered there
    assert post("", {"topic": "fresh", "channel": "ch"}) == {"message": ""}
    assert "fresh" in get_json(f"http://{cluster.lookupd.http_address}/topics")["topics"]
    assert get_json(f"http://{cluster.lookupd.http_address}/channels?topic=fresh")[
        "channels"] == ["ch"]
    # create a channel on a topic with producers: the nsqds get it
    post("", {"topic": "orders", "channel": "audit"})
    assert nsqd_channel(a1, "orders", "audit") is not None
    assert nsqd_channel(a2, "orders", "audit") is not None

    r = http("DELETE", api + "/orders/audit")
    assert r.status == 200
    assert nsqd_channel(a1, "orders", "audit") is None
    r = http("DELETE", api + "/orders")
    assert r.status == 200
    assert nsqd_topic(a1, "orders") is None and nsqd_topic(a2, "orders") is None

    got = sink.wait(12)
    actions = [n["action"] for n in got]
    assert actions == ["pause_topic", "unpause_topic", "pause_channel", "unpause_channel",
                       "empty_channel", "empty_topic", "create_topic", "create_channel",
                       "create_topic", "create_channel", "delete_channel", "delete_topic"]
    n = got[2]
    assert set(n) == {"action", "topic", "channel", "timestamp", "remote_ip", "user_agent",
                      "url", "via"}
    assert n["topic"] == "orders" and n["channel"] == "billing"
    assert n["user_agent"] == "pytest-script"
    assert n["url"] == f"http://{admin.address}/api/topics/orders/billing"
    assert n["remote_ip"].startswith("127.0.0.1:")
    assert abs(n["timestamp"] - time.time()) < 60
    assert "channel" not in got[0] and "node" not in got[0] and "user" not in got[0]
    assert sink.headers[0]["Content-Type"] == "application/json"


def test_tombstone_topic_producer(cluster, sink) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin(f"--notification-http-endpoint={sink.url}")
    r = http("DELETE", admin.url + f"/api/nodes/{a2}", {"topic": "orders"},
             headers={"Authorization": "Basic Ym9iOnNlY3JldA=="})  # bob:secret
    assert r.status == 200 and r.json() == {"message": ""}
    assert nsqd_topic(a2, "orders") is None and nsqd_topic(a1, "orders") is not None
    lookup = get_json(f"http://{cluster.lookupd.http_address}/lookup?topic=orders")
    assert [p["http_port"] for p in lookup["producers"]] == [cluster.nsqds[0].http_port]
    (n,) = sink.wait(1)
    assert n["action"] == "tombstone_topic_producer" and n["node"] == a2
    assert n["user"] == "bob"
    r = http("DELETE", admin.url + f"/api/nodes/{a2}", b"not json")
    assert r.status == 400 and r.json() == {"message": "INVALID_BODY"}


def test_admin_users_acl(cluster) -> None:
    _seed(cluster)
    admin = cluster.start_admin("--admin-user=alice", "--acl-http-header=X-Auth-User")
    body = {"action": "pause"}
    r = http("POST", admin.url + "/api/topics/orders", body)
    assert r.status == 403 and r.json() == {"message": "FORBIDDEN"}
    r = http("POST", admin.url + "/api/topics/orders", body, headers={"X-Auth-User": "mallory"})
    assert r.status == 403
    for method, path in (("DELETE", "/api/topics/orders"), ("DELETE", "/api/topics/orders/billing"),
                         ("POST", "/api/topics")):
        assert http(method, admin.url + path, {"topic": "x"}).status == 403
    assert not nsqd_topic(cluster.nsqds[0].http_address, "orders")["paused"]
    r = http("POST", admin.url + "/api/topics/orders", body, headers={"X-Auth-User": "alice"})
    assert r.status == 200
    assert nsqd_topic(cluster.nsqds[0].http_address, "orders")["paused"]
    # read-only pages for others: no action buttons
    page = http("GET", admin.url + "/topics/orders").body.decode()
    assert "data-action=" not in page and 'data-admin="0"' in page
    page = http("GET", admin.url + "/topics/orders",
                headers={"X-Auth-User": "alice"}).body.decode()
    assert 'data-action="unpause"' in page


def test_csrf_browser_requests_need_token_and_same_origin(cluster) -> None:
    _seed(cluster)
    admin = cluster.start_admin()
    url = admin.url + "/api/topics/orders"
    a1 = cluster.nsqds[0].http_address
    page = http("GET", admin.url + "/")
    cookie = page.headers["set-cookie"]
    assert "nsqadmin_csrf=" in cookie and "SameSite=Strict" in cookie
    token = cookie.split("nsqadmin_csrf=", 1)[1].split(";", 1)[0]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "<script>" not in page.body.decode() and " style=" not in page.body.decode()
    body = {"action": "pause"}
    evil = {"Origin": "http://evil.example", "Cookie": f"nsqadmin_csrf={token}",
            "X-CSRF-Token": token}
    r = http("POST", url, body, headers=evil)
    assert r.status == 403 and r.json() == {"message": "CSRF_ORIGIN_MISMATCH"}
    r = http("POST", url, body, headers={"Origin": admin.url, "Sec-Fetch-Site": "cross-site",
                                          "Cookie": f"nsqadmin_csrf={token}",
                                          "X-CSRF-Token": token})
    assert r.status == 403
    r = http("POST", url, body, headers={"Origin": admin.url,
                                          "Cookie": f"nsqadmin_csrf={token}"})
    assert r.status == 403 and r.json() == {"message": "CSRF_TOKEN_INVALID"}
    r = http("POST", url, body, headers={"Origin": admin.url, "Cookie": f"nsqadmin_csrf={token}",
                                          "X-CSRF-Token": ("y" if token[0] == "x" else "x") + token[1:]})
    assert r.status == 403
    assert not nsqd_topic(a1, "orders")["paused"]
    r = http("POST", url, body, headers={"Origin": admin.url, "Cookie": f"nsqadmin_csrf={token}",
                                          "X-CSRF-Token": token, "Sec-Fetch-Site": "same-origin"})
    assert r.status == 200
    assert nsqd_topic(a1, "orders")["paused"]
    # a script (no browser headers at all) keeps working as with upstream
    assert http("POST", url, {"action": "unpause"}).status == 200
    assert not nsqd_topic(a1, "orders")["paused"]


def test_base_path(cluster) -> None:
    _seed(cluster)
    admin = cluster.start_admin("--base-path=/nsq/admin/")
    assert get_json(admin.url + "/nsq/admin/api/topics")["topics"] == ["orders"]
    page = http("GET", admin.url + "/nsq/admin/topics/orders").body.decode()
    assert 'href="/nsq/admin/static/app.css"' in page
    assert http("GET", admin.url + "/nsq/admin/static/app.js").status == 200
    assert http("GET", admin.url + "/nsq/admin").status == 200
    assert http("GET", admin.url + "/api/topics").status == 404


def test_graphs_sample_rates_and_depth(cluster) -> None:
    a1, _ = _seed(cluster)
    admin = cluster.start_admin()

    def rate_seen() -> bool:
        http_api.mpub(a1, "orders", [b"m"] * 50)
        g = get_json(admin.url + "/api/graphs/topics/orders?metric=rate,depth")
        rates = [v for v in g["series"]["rate"]["*"] if v is not None]
        return bool(rates) and max(rates) > 0

    wait_for(rate_seen, 20, interval=1.0, what="a positive message rate in the graph data")
    g = get_json(admin.url + "/api/graphs/topics/orders/billing?metric=depth,in_flight_count")
    assert g["interval"] == 1.0 and len(g["timestamps"]) >= 2
    assert set(g["series"]["depth"]) == {"*", a1, cluster.nsqds[1].http_address}
    latest = [v for v in g["series"]["depth"]["*"] if v is not None][-1]
    assert latest > 0
    r = http("GET", admin.url + "/api/graphs/topics/orders?metric=in_flight_count")
    assert r.status == 400


@pytest.mark.slow
def test_thousand_topics_render_quickly(nsqd_factory, admin_factory) -> None:
    from concurrent.futures import ThreadPoolExecutor

    n = nsqd_factory.start(["--broadcast-address=127.0.0.1"])
    names = [f"topic-{i:04d}" for i in range(1000)]
    with ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(lambda t: http_api.post(n.http_address, "/topic/create",
                                                    topic=t).status, names))
    assert set(codes) == {200}
    admin = admin_factory.start([f"--nsqd-http-address={n.http_address}"])
    http("GET", admin.url + "/")  # warm up
    t0 = time.monotonic()
    r = http("GET", admin.url + "/")
    elapsed = time.monotonic() - t0
    assert r.status == 200
    page = r.body.decode()
    assert page.count('data-topic="topic-') == 1000
    print(f"streams page with 1000 topics: {elapsed * 1000:.0f} ms, {len(page)} bytes")
    assert elapsed < 10.0  # generous: it takes well under a second here
    assert len(get_json(admin.url + "/api/topics")["topics"]) == 1000


def test_graphite_proxy_and_rate(cluster) -> None:
    import json as _json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Graphite(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            body = _json.dumps([{"target": "x", "datapoints": [[120.0, 1700000000]]}]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Graphite)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _seed(cluster)
        g = f"http://127.0.0.1:{server.server_address[1]}"
        admin = cluster.start_admin(f"--graphite-url={g}", "--proxy-graphite",
                                    "--statsd-interval=60s")
        r = http("GET", admin.url + "/render?target=sumSeries(a.b)&format=json")
        assert r.status == 200 and r.json()[0]["target"] == "x"
        assert seen[-1] == "/render?target=sumSeries(a.b)&format=json"
        assert get_json(admin.url + "/api/graphite?metric=rate&target=a.b") == {"rate": "2.00"}
        assert http("GET", admin.url + "/api/graphite?metric=depth&target=a").status == 400
        page = http("GET", admin.url + "/topics/orders").body.decode()
        assert 'src="/render?target=sumSeries' in page
    finally:
        server.shutdown()
        server.server_close()


def test_channel_page_shows_dead_letters_and_expired(cluster) -> None:
    from nsqx.protocol import v2

    nsqd = cluster.nsqds[0]
    http_api.pub(nsqd.http_address, "jobs", b"poison")
    with consumer(nsqd.tcp_address, "jobs", "work", rdy=0):
        pass
    r = http_api.post(nsqd.http_address, "/channel/config", topic="jobs", channel="work",
                      max_attempts="1")
    assert r.status == 200
    with consumer(nsqd.tcp_address, "jobs", "work", rdy=1) as c:
        c.send(v2.req(c.read_message().id, 0))
        c.expect_nothing(0.5)
    wait_for(lambda: nsqd_channel(nsqd.http_address, "jobs", "work")["dlq_count"] == 1, 10,
             what="dead-lettered")
    admin = cluster.start_admin()
    ch = get_json(admin.url + "/api/topics/jobs/work")
    assert ch["dlq_count"] == 1 and ch["expired_count"] == 0
    page = http("GET", admin.url + "/topics/jobs/work").body.decode()
    assert "Dead-lettered" in page and "Expired" in page


def test_route_managed_topic_page_shows_the_route_history(nsqd_factory, admin_factory) -> None:
    """A route-managed ordered topic's page: the versions as bars and a table, read from
    nsqd's /topic/route; a plain topic's page has none."""
    n = nsqd_factory.start(["--broadcast-address=127.0.0.1"])
    assert http_api.post(n.http_address, "/topic/create", topic="keyed", partition_num="1",
                         logical="64").status == 200
    assert http_api.post(n.http_address, "/topic/split", topic="keyed", partition="0",
                         at="32").status == 200
    assert http_api.post(n.http_address, "/channel/create", topic="keyed",
                         channel="billing").status == 200
    http_api.pub(n.http_address, "plain", b"x")
    admin = admin_factory.start([f"--nsqd-http-address={n.http_address}"])
    page = http("GET", admin.url + "/topics/keyed").body.decode()
    assert 'id="routes"' in page and "64 logical partitions, 2 versions" in page
    assert page.count('class="route-row"') == 2 and '<svg class="route-picture"' in page
    assert "0&#8211;63 &#8594; 0 @ " in page  # version 0: everything on partition 0
    assert "0&#8211;31 &#8594; 1 @ " in page and "32&#8211;63 &#8594; 2 @ " in page
    # the topic's first channel starts at version 0 (it gets what came before it)
    assert "Sealed partitions (offset of their command message): 0 @ 0" in page
    assert "Channels' route versions: billing v0" in page
    assert 'id="routes"' not in http("GET", admin.url + "/topics/plain").body.decode()


def test_route_changes_through_nsqadmin(nsqd_factory, admin_factory) -> None:
    """POST /api/topics/:topic {"action": "split"|"merge"|"move", ...} calls nsqd's
    /topic/split|merge|move on the node that keeps the routes; nsqd's refusal comes back
    with its status and text as is."""
    n = nsqd_factory.start(["--broadcast-address=127.0.0.1"])
    assert http_api.post(n.http_address, "/topic/create", topic="keyed", orderedmulti="true",
                         partition_num="1", logical="64").status == 200
    http_api.pub(n.http_address, "plain", b"x")
    admin = admin_factory.start([f"--nsqd-http-address={n.http_address}"])
    api = admin.url + "/api/topics/keyed"

    def versions() -> list[dict]:
        return get_json(f"http://{n.http_address}/topic/route?topic=keyed")["versions"]

    r = http("POST", api, {"action": "split", "partition": 0, "at": 32})
    assert r.status == 200, r.body
    assert r.json()["version"] == 1 and r.json()["node"] == n.http_address
    assert [x[:3] for x in versions()[-1]["routes"]] == [[0, 32, 1], [32, 64, 2]]
    r = http("POST", api, {"action": "split", "partition": "1", "at": "40"})  # as typed
    assert (r.status, r.json()["message"]) == (400, "topic keyed: cannot split partition 1 "
                                               "[0, 32) at 40: the boundary must be strictly inside")
    assert http("POST", api, {"action": "merge", "a": 1, "b": 2}).json()["version"] == 2
    r = http("POST", api, {"action": "move", "partition": 3, "node": "elsewhere:4150"})
    assert r.status == 200 and r.json()["version"] == 3
    assert versions()[-1]["routes"] == [[0, 64, 4, "elsewhere:4150"]]
    # what nsqd refuses, nsqadmin does not change
    assert http("POST", api, {"action": "merge", "a": 4, "b": 4}).json()["message"] == \
        "topic keyed: cannot merge partition 4 with itself"
    assert http("POST", api, {"action": "split", "partition": 4}).json()["message"] == "INVALID_AT"
    assert http("POST", api, {"action": "split", "partition": 4, "at": ""}).json()["message"] \
        == "MISSING_ARG_AT"
    assert http("POST", api, {"action": "split", "partition": "x", "at": 1}).json()["message"] \
        == "INVALID_PARTITION"
    r = http("POST", admin.url + "/api/topics/plain", {"action": "split", "partition": 0, "at": 1})
    assert (r.status, r.json()["message"]) == (400, "TOPIC_NOT_ROUTE_MANAGED")
    assert http("POST", admin.url + "/api/topics/nope",
                {"action": "split", "partition": 0, "at": 1}).status == 404
    assert len(versions()) == 4
    page = http("GET", admin.url + "/topics/keyed").body.decode()
    assert 'id="route-actions"' in page and 'data-op="split"' in page
    assert 'data-op="merge"' not in page  # one partition: nothing to merge
