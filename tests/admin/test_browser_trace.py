"""nsqadmin's message trace page in headless Chromium (as test_browser.py), checked against the
nodes' own /trace/search answers."""

from __future__ import annotations

import pytest

from nsqx.protocol import v2
from tests.admin.helpers import get_json, http, wait_for
from tests.admin.test_browser import Browser, browser  # noqa: F401  (the fixture)
from tests.support import http_api
from tests.support.rawclient import RawClient, consumer

pytestmark = pytest.mark.slow

EVENTS = ["pub", "deliver", "req", "deliver", "fin"]


def _seed(cluster) -> tuple[str, str, str]:
    """Node 1 traces orders: one message published with headers, REQ'd once, then FINed.
    Node 2 has the topic, untraced. Returns (node 1, node 2, the message id)."""
    n1, n2 = cluster.nsqds
    for n in (n1, n2):
        assert http_api.post(n.http_address, "/topic/create", topic="orders").status == 200
        assert http_api.post(n.http_address, "/channel/create", topic="orders",
                             channel="billing").status == 200
    assert http_api.post(n1.http_address, "/topic/trace", topic="orders",
                         enable="true").status == 200
    assert http_api.pub(n2.http_address, "orders", b"elsewhere").status == 200
    with RawClient(n1.tcp_address) as p:
        p.send(v2.pub_ext("orders", b"body", {"order_id": "A-17", "##trace_id": "77"}))
        p.expect_response()
    with consumer(n1.tcp_address, "orders", "billing", rdy=1) as c:
        m = c.read_message()
        c.send(v2.req(m.id, 0))
        m = c.read_message()
        c.send(v2.fin(m.id))
        c.expect_nothing(0.2)
    mid = m.id.decode()
    wait_for(lambda: [e["event"] for e in get_json(
        f"http://{n1.http_address}/trace/search?topic=orders&id={mid}")["messages"][0]["events"]]
        == EVENTS, what="the trace events are recorded")
    return n1.http_address, n2.http_address, mid


def test_trace_page(cluster, browser: Browser) -> None:  # noqa: F811
    a1, a2, mid = _seed(cluster)
    admin = cluster.start_admin()
    page = browser.open(admin.url + "/")
    page.click("nav a[href='/trace']")
    page.wait_for_selector("#trace-search")
    page.fill("#trace-search input[name='topic']", "orders")
    page.fill("#trace-search input[name='trace_id']", "77")
    page.click("#trace-search button[type='submit']")
    page.wait_for_selector(".card.trace")
    cards = page.locator(".card.trace")
    assert cards.count() == 1  # only node 1 traced it
    card = page.locator(f".card.trace[data-node='{a1}']")
    assert card.get_attribute("data-id") == mid
    assert card.locator("[data-field='trace_id']").inner_text() == "77"
    assert "order_id: A-17" in card.locator(".trace-headers").inner_text()
    want = get_json(f"http://{a1}/trace/search?topic=orders&trace_id=77")["messages"][0]["events"]
    rows = card.locator("tr.trace-event")
    assert [rows.nth(i).get_attribute("data-event") for i in range(rows.count())] == EVENTS
    for i, ev in enumerate(want):
        row = rows.nth(i)
        assert row.locator("[data-field='since']").inner_text() == \
            f"+{(ev['ts'] - want[0]['ts']) / 1e6:,.1f} ms"
        if ev["event"] != "pub":
            assert row.locator("[data-field='channel']").inner_text() == "billing"
        if ev["event"] == "deliver":
            assert ev["client"]["addr"] in row.locator("[data-field='client']").inner_text()
    assert [rows.nth(i).locator("[data-field='attempts']").inner_text()
            for i in (1, 3)] == ["1", "2"]
    marks = card.locator(".trace-mark")
    assert marks.count() == 5 and marks.nth(4).get_attribute("data-left") == "100.00"
    lefts = [marks.nth(i).evaluate("m => m.getBoundingClientRect().left") for i in range(5)]
    assert lefts == sorted(lefts) and lefts[4] > lefts[0]  # spread along the bar, in order
    assert page.locator(f".trace-off[data-node='{a2}']").count() == 1
    browser.shot("message-trace")

    # by id and by header give the same message; a message nobody has gives a note
    for field, value in (("id", mid), ("header", "order_id:A-17")):
        page = browser.open(admin.url + f"/trace?topic=orders&{field}={value}")
        assert page.locator(f".card.trace[data-node='{a1}'] tr.trace-event").count() == 5
    page = browser.open(admin.url + "/trace?topic=orders&header=order_id:none")
    assert page.locator("#trace-none").count() == 1
    # bad input: the form says why, nothing is asked of the nodes
    page = browser.open(admin.url + f"/trace?topic=orders&id={mid}&trace_id=77")
    assert page.inner_text("#trace-error") == "GIVE_ONE_OF_ID_TRACE_ID_HEADER"
    page = browser.open(admin.url + "/trace?topic=orders&id=XYZ")
    assert page.inner_text("#trace-error") == "INVALID_ID"
    browser.errors.clear()  # the 400 pages log console errors on purpose


def test_trace_api(cluster) -> None:
    a1, _, mid = _seed(cluster)
    admin = cluster.start_admin()
    doc = get_json(admin.url + f"/api/trace?topic=orders&id={mid}")
    by_node = {n["node"]: n for n in doc["nodes"]}
    assert [e["event"] for e in by_node[a1]["messages"][0]["events"]] == EVENTS
    for q, code in (("", "MISSING_ARG_TOPIC"), ("?topic=orders", "GIVE_ONE_OF_ID_TRACE_ID_HEADER"),
                    ("?topic=bad!&id=" + mid, "INVALID_TOPIC"),
                    ("?topic=orders&trace_id=-1", "INVALID_TRACE_ID"),
                    ("?topic=orders&header=nokey", "INVALID_HEADER")):
        r = http("GET", admin.url + "/api/trace" + q)
        assert (r.status, r.json()["message"]) == (400, code), q
