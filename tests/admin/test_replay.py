"""nsqadmin's reset action and message search (JSON API and the page, without a browser)
against real nsqds; the browser side is in test_browser.py."""

from __future__ import annotations

import pytest

from tests.admin.helpers import get_json, http, wait_for
from tests.support import http_api
from tests.support.rawclient import consumer


def _seed(cluster) -> tuple[str, str]:
    n1, n2 = cluster.nsqds
    for n, bodies in ((n1, [b"a0", b"a1", b"a2"]), (n2, [b"b0", b"b1"])):
        assert http_api.post(n.http_address, "/topic/create", topic="orders").status == 200
        assert http_api.post(n.http_address, "/channel/create", topic="orders",
                             channel="billing").status == 200
        assert http_api.mpub(n.http_address, "orders", bodies).status == 200
    return n1.http_address, n2.http_address


def _depth(addr: str) -> int:
    st = get_json(f"http://{addr}/stats?format=json&topic=orders&channel=billing")
    return st["topics"][0]["channels"][0]["depth"]


def test_reset_action_on_every_node_and_on_one(cluster, sink) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin(f"--notification-http-endpoint={sink.url}")
    api = admin.url + "/api/topics/orders/billing"
    r = http("POST", api, {"action": "reset", "position": "latest"})
    assert r.status == 200, r.body
    doc = r.json()
    assert doc["message"] == ""
    assert sorted((x["node"], x["offset"]) for x in doc["results"]) == sorted(
        [(a1, 3), (a2, 2)])
    assert _depth(a1) == 0 and _depth(a2) == 0
    # one node only, by offset
    r = http("POST", api, {"action": "reset", "position": "msgcount:1", "node": a1,
                           "partition": 0})
    assert [(x["node"], x["offset"]) for x in r.json()["results"]] == [(a1, 1)]
    assert _depth(a1) == 2 and _depth(a2) == 0
    # an offset one node does not have: that node's error is reported, the other moves
    r = http("POST", api, {"action": "reset", "position": "msgcount:3"})
    assert r.status == 200
    assert [(x["node"], x["offset"]) for x in r.json()["results"]] == [(a1, 3)]
    assert "OFFSET_OUT_OF_RANGE" in r.json()["message"]
    r = http("POST", api, {"action": "reset", "position": "msgcount:7"})
    assert r.status == 502 and "OFFSET_OUT_OF_RANGE" in r.json()["message"]
    with consumer(cluster.nsqds[1].tcp_address, "orders", "billing", rdy=0):
        r = http("POST", api, {"action": "reset", "position": "earliest", "node": a2})
        assert r.json()["results"][0]["offset"] == 0
    wait_for(lambda: any(a.get("action") == "reset_channel" for a in sink.received),
             what="the reset notification")


@pytest.mark.parametrize("body,code", [
    ({"action": "reset"}, "INVALID_POSITION"),
    ({"action": "reset", "position": "bogus"}, "INVALID_POSITION"),
    ({"action": "reset", "position": "msgcount:-1"}, "INVALID_POSITION"),
    ({"action": "reset", "position": 5}, "INVALID_POSITION"),
    ({"action": "reset", "position": "x" * 100}, "INVALID_POSITION"),
    ({"action": "reset", "position": "latest", "partition": -1}, "INVALID_PARTITION"),
    ({"action": "reset", "position": "latest", "partition": "0"}, "INVALID_PARTITION"),
    ({"action": "reset", "position": "latest", "partition": True}, "INVALID_PARTITION"),
    ({"action": "reset", "position": "latest", "node": 3}, "INVALID_NODE"),
])
def test_reset_bad_input(cluster, body: dict, code: str) -> None:
    _seed(cluster)
    admin = cluster.start_admin()
    r = http("POST", admin.url + "/api/topics/orders/billing", body)
    assert (r.status, r.json()) == (400, {"message": code})


def test_reset_errors_from_the_nodes(cluster) -> None:
    a1, _ = _seed(cluster)
    admin = cluster.start_admin()
    for path, body, want in (
            ("/orders/nope", {"action": "reset", "position": "latest"}, "CHANNEL_NOT_FOUND"),
            ("/orders/billing", {"action": "reset", "position": "latest", "partition": 4},
             "E_BAD_PARTITION"),
            ("/orders/billing", {"action": "reset", "position": "latest", "node": "1.2.3.4:5"},
             "not a producer")):
        r = http("POST", admin.url + "/api/topics" + path, body)
        assert r.status == 502 and want in r.json()["message"], r.body
    # reset is a channel action only
    r = http("POST", admin.url + "/api/topics/orders", {"action": "reset",
                                                        "position": "latest"})
    assert (r.status, r.json()) == (400, {"message": "INVALID_ACTION"})


def test_reset_needs_an_admin(cluster) -> None:
    _seed(cluster)
    admin = cluster.start_admin("--admin-user=alice")
    r = http("POST", admin.url + "/api/topics/orders/billing",
             {"action": "reset", "position": "latest"})
    assert (r.status, r.json()) == (403, {"message": "FORBIDDEN"})
    r = http("POST", admin.url + "/api/topics/orders/billing",
             {"action": "reset", "position": "latest"}, headers={"X-Forwarded-User": "alice"})
    assert r.status == 200


def test_message_search_api_and_page(cluster) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    # offset 2 only exists on the first node
    doc = get_json(admin.url + "/api/messages?topic=orders&offset=2")
    assert doc["message"] == ""
    (m,) = doc["messages"]
    assert (m["node"], m["id"], m["body"], m["attempts"], m["offset"]) == (
        a1, "0000000000000002", "a2", 1, 2)
    # id 1 exists on both nodes (each numbers its own log)
    doc = get_json(admin.url + "/api/messages?topic=orders&id=0000000000000001")
    assert sorted((x["node"], x["body"]) for x in doc["messages"]) == sorted(
        [(a1, "a1"), (a2, "b1")])
    assert get_json(admin.url + "/api/messages?topic=orders&offset=9")["messages"] == []
    page = http("GET", admin.url + "/messages?topic=orders&offset=0&partition=0").body.decode()
    assert page.count('class="card message"') == 2 and "a0" in page and "b0" in page
    page = http("GET", admin.url + "/messages?topic=orders&offset=9").body.decode()
    assert 'id="search-none"' in page
    page = http("GET", admin.url + "/messages").body.decode()
    assert 'id="message-search"' in page and 'class="card message"' not in page
    # the topic page links to the search, prefilled
    topic_page = http("GET", admin.url + "/topics/orders").body.decode()
    assert 'href="/messages?topic=orders"' in topic_page
    page = http("GET", admin.url + "/messages?topic=orders").body.decode()
    assert 'name="topic" placeholder="topic" required value="orders"' in page
    assert 'id="search-error"' not in page


@pytest.mark.parametrize("query,code", [
    ("topic=orders", "GIVE_ID_OR_OFFSET"),
    ("topic=orders&id=1&offset=1", "GIVE_ID_OR_OFFSET"),
    ("topic=bad!&id=1", "INVALID_TOPIC"),
    ("topic=orders&id=%3Cscript%3E", "INVALID_ID"),
    ("topic=orders&offset=-1", "INVALID_OFFSET"),
    ("topic=orders&offset=1&partition=x", "INVALID_PARTITION"),
    ("id=1", "MISSING_ARG_TOPIC"),
])
def test_message_search_bad_input(cluster, query: str, code: str) -> None:
    _seed(cluster)
    admin = cluster.start_admin()
    r = http("GET", admin.url + "/api/messages?" + query)
    assert (r.status, r.json()) == (400, {"message": code})
    page = http("GET", admin.url + "/messages?" + query).body.decode()
    if query in ("topic=orders", "id=1"):  # an incomplete form is shown again, no error
        assert 'id="search-error"' not in page and 'id="message-search"' in page
    else:
        assert code in page and "<script>" not in page


def test_message_search_node_errors_are_warnings(cluster) -> None:
    _seed(cluster)
    admin = cluster.start_admin()
    doc = get_json(admin.url + "/api/messages?topic=orders&offset=0&partition=3")
    assert doc["messages"] == [] and "E_BAD_PARTITION" in doc["message"]
