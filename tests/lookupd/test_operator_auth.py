"""nsqlookupd's operators' endpoints with ``--auth-http-address`` (nsqx, issue 23): refused
without a secret or without the permission, allowed with it, open without the flag (as
upstream); ``/trace/search`` passes the client's secret on to nsqds that check it."""

from __future__ import annotations

import json
import time
import urllib.request

from tests.nsqd.test_operator_auth import IDENTITIES
from tests.support.auth_server import AuthServer, Identity
from tests.support.http_api import with_secret as call

# (method, path, params, secret allowed, secrets refused) in an order that all succeed
ENDPOINTS = [
    ("POST", "/topic/create", {"topic": "t"}, "operator", ("reader", "elsewhere")),
    ("POST", "/channel/create", {"topic": "t", "channel": "c"}, "operator",
     ("reader", "producer", "elsewhere")),
    ("GET", "/trace/search", {"topic": "t", "id": "0" * 16}, "reader", ("producer",)),
    ("POST", "/topic/tombstone", {"topic": "t", "node": "127.0.0.1:4151"}, "operator",
     ("reader",)),
    ("POST", "/channel/delete", {"topic": "t", "channel": "c"}, "operator",
     ("reader", "producer")),
    ("POST", "/topic/delete", {"topic": "t"}, "operator", ("reader", "elsewhere")),
]


def test_lookupd_endpoints_need_their_permission(lookupd_factory, auth_server: AuthServer) -> None:  # type: ignore[no-untyped-def]
    for secret, grants in IDENTITIES.items():
        auth_server.identities[secret] = Identity(secret, grants)
    ld = lookupd_factory.start([f"--auth-http-address={auth_server.address}"])
    a = ld.http_address
    for method, path, params, _, refused in ENDPOINTS:
        r = call(a, method, path, params, None, None)
        assert (r.status, r.json()) == (401, {"message": "AUTH_REQUIRED"}), path
        for who in refused:
            r = call(a, method, path, params, None, who)
            assert (r.status, r.json()) == (403, {"message": "UNAUTHORIZED"}), (path, who)
    with urllib.request.urlopen(f"http://{a}/topics", timeout=5) as r:  # reads stay open
        assert json.loads(r.read())["topics"] == []
    for method, path, params, allowed, _ in ENDPOINTS:
        r = call(a, method, path, params, None, allowed)
        assert r.status == 200, (path, r.body)
    assert "POST /topic/delete from 127.0.0.1:" in ld.all_logs(limit=10**6)


def test_lookupd_without_auth_stays_open(lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    ld = lookupd_factory.start()
    for method, path, params, _, _ in ENDPOINTS:
        assert call(ld.http_address, method, path, params, None, None).status == 200, path


def test_trace_search_passes_the_secret_on(lookupd_factory, nsqd_factory,  # type: ignore[no-untyped-def]
                                           auth_server: AuthServer) -> None:
    auth_server.identities["reader"] = Identity("r", IDENTITIES["reader"])
    ld = lookupd_factory.start()  # lookupd itself checks nothing: the nsqd does
    node = nsqd_factory.start([f"--lookupd-tcp-address={ld.tcp_address}",
                               "--broadcast-address=127.0.0.1",
                               f"--auth-http-address={auth_server.address}"])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{ld.http_address}/nodes", timeout=5) as r:
            if json.loads(r.read())["producers"]:
                break
        time.sleep(0.05)
    q = {"topic": "t", "id": "0" * 16}
    r = call(ld.http_address, "GET", "/trace/search", q, None, None)
    assert (r.status, r.json()) == (401, {"message": "AUTH_REQUIRED"})
    r = call(ld.http_address, "GET", "/trace/search", q, None, "reader")
    assert r.status == 200 and len(r.json()["nodes"]) == 1, r.body
    assert "GET /trace/search from 127.0.0.1:" in node.all_logs()
