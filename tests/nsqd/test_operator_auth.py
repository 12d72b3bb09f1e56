"""nsqd's operators' HTTP endpoints with ``--auth-http-address`` (issue 23): every one is
refused without a secret, refused with a secret lacking the permission it needs, allowed
with it, and all are allowed without a secret when auth is off (upstream). A real nsqd
process and the fake upstream-contract auth server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support import http_api
from tests.support.auth_server import AuthServer, Identity, grant
from tests.support.nsqd_process import NsqdFactory

call = http_api.with_secret


@dataclass
class Endpoint:
    method: str
    path: str
    params: dict[str, Any]
    needs: str  # "write-topic" | "write-channel" | "read" | "admin"
    body: bytes | None = None


# In the order the allowed calls can all succeed (200): creations first, deletions last.
T, C, R = "t", "c", "r"
ENDPOINTS = [
    Endpoint("POST", "/topic/create", {"topic": T}, "write-topic"),
    Endpoint("POST", "/channel/create", {"topic": T, "channel": C}, "write-channel"),
    Endpoint("POST", "/topic/pause", {"topic": T}, "write-topic"),
    Endpoint("POST", "/topic/unpause", {"topic": T}, "write-topic"),
    Endpoint("POST", "/channel/pause", {"topic": T, "channel": C}, "write-channel"),
    Endpoint("POST", "/channel/unpause", {"topic": T, "channel": C}, "write-channel"),
    Endpoint("POST", "/channel/setoffset", {"topic": T, "channel": C}, "write-channel",
             b"earliest"),
    Endpoint("POST", "/channel/config", {"topic": T, "channel": C, "max_attempts": 3},
             "write-channel"),
    Endpoint("POST", "/topic/config", {"topic": T, "ttl": 0}, "write-topic"),
    Endpoint("POST", "/topic/trace", {"topic": T, "enable": "true"}, "write-topic"),
    Endpoint("POST", "/message/trace/disable", {"topic": T}, "write-topic"),
    Endpoint("POST", "/message/trace/enable", {"topic": T}, "write-topic"),
    Endpoint("GET", "/message/get", {"topic": T, "search_mode": "count", "search_pos": 0},
             "read"),
    Endpoint("GET", "/trace/search", {"topic": T, "id": "0" * 16}, "read"),
    Endpoint("POST", "/channel/empty", {"topic": T, "channel": C}, "write-channel"),
    Endpoint("POST", "/topic/empty", {"topic": T}, "write-topic"),
    Endpoint("POST", "/topic/create", {"topic": R, "partition_num": 2, "logical": 16},
             "write-topic"),
    Endpoint("POST", "/topic/route", {"topic": "r2", "logical": 8}, "write-topic"),
    Endpoint("POST", "/topic/split", {"topic": R, "partition": 0, "at": 4}, "write-topic"),
    Endpoint("POST", "/topic/merge", {"topic": R, "a": 3, "b": 1}, "write-topic"),
    Endpoint("POST", "/topic/move", {"topic": R, "partition": 4, "node": "elsewhere:4150"},
             "write-topic"),
    Endpoint("PUT", "/config/log_level", {}, "admin", b"info"),
    Endpoint("POST", "/channel/delete", {"topic": T, "channel": C}, "write-channel"),
    Endpoint("POST", "/topic/delete", {"topic": T}, "write-topic"),
]

# secrets: what each identity is granted, and which endpoints it must be refused
IDENTITIES = {
    # reads every topic and channel, writes nothing
    "reader": [grant(".*", (".*",), ("subscribe",))],
    # a producer: publishes everywhere, no channel of its own, reads nothing
    "producer": [grant(".*", (), ("publish",))],
    # subscribes and publishes on everything, not an admin
    "operator": [grant(".*", (".*",), ("subscribe", "publish"))],
    # every permission, but on another topic
    "elsewhere": [grant("other", (".*",), ("subscribe", "publish", "admin"))],
    # nsqx's admin permission on every topic
    "admin": [grant(".*", (".*",), ("admin",))],
}
REFUSED = {  # needs -> identities that lack it
    "write-topic": ("reader", "elsewhere"),
    "write-channel": ("reader", "producer", "elsewhere"),
    "read": ("producer", "elsewhere"),
    "admin": ("reader", "producer", "operator"),
}
ALLOWED = {"write-topic": "operator", "write-channel": "operator", "read": "reader",
           "admin": "admin"}


def _prepare(address: str) -> None:
    assert http_api.mpub(address, T, [b"one", b"two"]).status == 200  # /mpub: no auth, as upstream


def _run_allowed(address: str, secret_for: dict[str, str | None]) -> None:
    for ep in ENDPOINTS:
        r = call(address, ep.method, ep.path, ep.params, ep.body, secret_for[ep.needs])
        assert r.status == 200, (ep.path, r.status, r.body)


def test_every_operator_endpoint_needs_its_permission(nsqd_factory: NsqdFactory,
                                                      auth_server: AuthServer) -> None:
    for secret, grants in IDENTITIES.items():
        auth_server.identities[secret] = Identity(secret, grants)
    node = nsqd_factory.start([f"--auth-http-address={auth_server.address}"])
    a = node.http_address
    _prepare(a)
    assert http_api.post(a, "/channel/create", topic=T, channel=C).status == 401
    assert call(a, "POST", "/channel/create", {"topic": T, "channel": C}, None,
                "operator").status == 200
    for ep in ENDPOINTS:
        r = call(a, ep.method, ep.path, ep.params, ep.body, None)
        assert (r.status, r.json()) == (401, {"message": "AUTH_REQUIRED"}), ep.path
        r = call(a, ep.method, ep.path, ep.params, ep.body, "unknown-secret")
        assert (r.status, r.json()) == (401, {"message": "AUTH_FAILED"}), ep.path
        for who in REFUSED[ep.needs]:
            r = call(a, ep.method, ep.path, ep.params, ep.body, who)
            assert (r.status, r.json()) == (403, {"message": "UNAUTHORIZED"}), (ep.path, who)
    # nothing refused had an effect
    st = http_api.stats(a, T)
    [topic] = [t for t in st["topics"] if t["topic_name"] == T]
    [channel] = topic["channels"]
    assert (channel["channel_name"], channel["depth"], channel["paused"]) == (C, 2, False)
    assert not topic["paused"]
    _run_allowed(a, {k: v for k, v in ALLOWED.items()})
    assert not [t for t in http_api.stats(a)["topics"] if t["topic_name"] == T]
    # one WARNING line per refusal, naming the client
    logs = node.all_logs(limit=10**7)
    assert "POST /topic/delete from 127.0.0.1:" in logs
    assert "refused 401 AUTH_REQUIRED" in logs and "refused 403 UNAUTHORIZED" in logs
    assert "identity 'reader' lacks publish on topic 't'" in logs
    # the auth server is asked once per secret (answers cached for their TTL)
    seen = auth_server.secrets_seen()
    assert seen.count("operator") == 1 and seen.count("reader") == 1


def test_argument_errors_come_after_authentication(nsqd_factory: NsqdFactory,
                                                   auth_server: AuthServer) -> None:
    auth_server.identities["operator"] = Identity("o", IDENTITIES["operator"])
    node = nsqd_factory.start([f"--auth-http-address={auth_server.address}"])
    a = node.http_address
    assert call(a, "POST", "/topic/delete", {}, None, None).status == 401
    r = call(a, "POST", "/topic/delete", {}, None, "operator")
    assert (r.status, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
    r = call(a, "POST", "/channel/delete", {"topic": T}, None, "operator")
    assert (r.status, r.json()) == (400, {"message": "MISSING_ARG_CHANNEL"})
    # reads of the node stay open, as upstream: stats, config, ping
    assert http_api.get(a, "/stats", format="json").status == 200
    assert http_api.get(a, "/config/log_level").status == 200
    assert http_api.pub(a, T, b"x").status == 200


def test_without_auth_every_endpoint_stays_open(nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start()
    _prepare(node.http_address)
    _run_allowed(node.http_address, dict.fromkeys(ALLOWED))
