"""nsqadmin's reset-offset form and message search page in headless Chromium (Playwright with
Debian's /usr/bin/chromium, as test_browser.py), checked against the nodes' own answers."""

from __future__ import annotations

import json

import pytest

from tests.admin.helpers import get_json, http, nsqd_channel, wait_for
from tests.admin.test_browser import Browser, browser  # noqa: F401  (the fixture)
from tests.support import http_api

pytestmark = pytest.mark.slow


def _seed(cluster) -> tuple[str, str]:
    n1, n2 = cluster.nsqds
    for n, bodies in ((n1, [b"a0", b"a1", b"a2"]), (n2, [b"b0", "b1 \u00e9".encode()])):
        assert http_api.post(n.http_address, "/topic/create", topic="orders").status == 200
        assert http_api.post(n.http_address, "/channel/create", topic="orders",
                             channel="billing").status == 200
        assert http_api.mpub(n.http_address, "orders", bodies).status == 200
    return n1.http_address, n2.http_address


def _depths(*addrs: str) -> tuple[int, ...]:
    return tuple(nsqd_channel(a, "orders", "billing")["depth"] for a in addrs)


def test_reset_offset_form(cluster, browser: Browser) -> None:  # noqa: F811
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    assert http_api.request("POST", f"http://{a1}/channel/setoffset?topic=orders&channel=billing",
                            b"latest").status == 200
    assert http_api.request("POST", f"http://{a2}/channel/setoffset?topic=orders&channel=billing",
                            b"latest").status == 200
    assert _depths(a1, a2) == (0, 0)
    page = browser.open(admin.url + "/topics/orders/billing")
    form = "#reset-form"
    # the offset field shows only for "to an offset"
    assert page.locator(f"{form} input[name='offset']").is_hidden()
    page.select_option(f"{form} select[name='kind']", "offset")
    assert page.locator(f"{form} input[name='time']").is_hidden()
    page.fill(f"{form} input[name='offset']", "1")
    page.select_option(f"{form} select[name='node']", a1)

    # dismissing the confirm does nothing
    msg = browser.click_and_confirm(f"{form} button[type='submit']", accept=False)
    assert "Reset channel orders/billing to offset 1 on " + a1 in msg
    page.wait_for_timeout(300)
    assert _depths(a1, a2) == (0, 0)

    with page.expect_navigation():  # the page reloads once the nodes answered
        browser.click_and_confirm(f"{form} button[type='submit']")
    wait_for(lambda: _depths(a1, a2) == (2, 0), what="node 1 replays from offset 1")
    page.wait_for_selector("#flash:not(.hidden)")
    assert f"{a1}: offset 1" in page.inner_text("#flash")
    browser.shot("channel-reset-offset")

    # a time before everything, on every node (the browser's time zone is converted)
    page.select_option(f"{form} select[name='kind']", "time")
    page.fill(f"{form} input[name='time']", "2001-01-01T00:00:00")
    with page.expect_navigation():
        assert "every node" in browser.click_and_confirm(f"{form} button[type='submit']")
    wait_for(lambda: _depths(a1, a2) == (3, 2), what="both nodes replay everything")

    # a paused channel moves and stays paused
    assert http_api.post(a2, "/channel/pause", topic="orders", channel="billing").status == 200
    page = browser.open(admin.url + "/topics/orders/billing")
    page.select_option(f"{form} select[name='kind']", "latest")
    with page.expect_navigation():
        browser.click_and_confirm(f"{form} button[type='submit']")
    wait_for(lambda: _depths(a1, a2) == (0, 0), what="both nodes skip to the end")
    assert nsqd_channel(a2, "orders", "billing")["paused"] is True

    # an error from the nodes is shown, nothing moves
    page = browser.open(admin.url + "/topics/orders/billing")
    page.select_option(f"{form} select[name='kind']", "offset")
    page.fill(f"{form} input[name='offset']", "99")
    browser.click_and_confirm(f"{form} button[type='submit']")
    page.wait_for_selector("#flash:not(.hidden)")
    assert "OFFSET_OUT_OF_RANGE" in page.inner_text("#flash")
    assert _depths(a1, a2) == (0, 0)
    browser.errors.clear()  # the refused request logs a console error on purpose
    browser.shot("channel-reset-error")


def test_reset_needs_the_csrf_token(cluster, browser: Browser) -> None:  # noqa: F811
    a1, _ = _seed(cluster)
    admin = cluster.start_admin()
    browser.open(admin.url + "/topics/orders/billing")
    status = browser.page.evaluate(
        "fetch('/api/topics/orders/billing', {method: 'POST', credentials: 'same-origin',"
        " headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify({action: 'reset', position: 'latest'})}).then(r => r.status)")
    assert status == 403
    assert nsqd_channel(a1, "orders", "billing")["depth"] == 3
    browser.errors.clear()


def test_read_only_users_see_no_reset_form(cluster, browser: Browser) -> None:  # noqa: F811
    _seed(cluster)
    admin = cluster.start_admin("--admin-user=alice")
    page = browser.open(admin.url + "/topics/orders/billing")
    assert page.locator("#reset-form").count() == 0


def test_message_search_page(cluster, browser: Browser) -> None:  # noqa: F811
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    page = browser.open(admin.url + "/")
    page.click("nav a[href='/messages']")
    page.wait_for_selector("#message-search")
    page.fill("#message-search input[name='topic']", "orders")
    page.fill("#message-search input[name='id']", "0000000000000001")
    page.click("#message-search button[type='submit']")
    page.wait_for_selector(".card.message")
    cards = page.locator(".card.message")
    assert cards.count() == 2  # each node numbers its own log
    for addr in (a1, a2):
        want = get_json(f"http://{addr}/message/get?topic=orders&search_pos=0000000000000001")
        card = page.locator(f".card.message[data-node='{addr}']")
        assert card.locator("[data-field='body']").inner_text() == want["body"]
        assert card.locator("[data-field='attempts']").inner_text() == str(want["attempts"])
        assert card.locator("[data-field='offset']").inner_text() == "1"
        assert card.locator("[data-field='timestamp']").get_attribute("data-value") == \
            str(want["timestamp"])
    assert page.locator(f".card.message[data-node='{a2}'] [data-field='body']").inner_text() \
        == "b1 \u00e9"
    browser.shot("message-search")

    # by offset, with headers: a keyed publish stores a "key" header
    body = json.dumps({"k": 1}).encode()
    keyed = (b"\x00\x00\x00\x01" + len(b"user-7").to_bytes(4, "big") + b"user-7"
             + len(body).to_bytes(4, "big") + body)
    r = http("POST", f"http://{a1}/nsqx/pub?topic=orders&writer=w&batch=1&task=0&keys=1", keyed)
    assert r.status == 200 and r.json()["base"] == 3
    page.fill("#message-search input[name='id']", "")
    page.fill("#message-search input[name='offset']", "3")
    page.fill("#message-search input[name='partition']", "0")
    page.click("#message-search button[type='submit']")
    page.wait_for_selector(f".card.message[data-node='{a1}']")
    card = page.locator(f".card.message[data-node='{a1}']")
    assert card.locator("[data-field='body']").inner_text() == '{"k": 1}'
    assert "user-7" in card.inner_text()
    browser.shot("message-search-headers")

    # not found, and malformed input shown as an error, not a crash
    page.fill("#message-search input[name='offset']", "42")
    page.click("#message-search button[type='submit']")
    page.wait_for_selector("#search-none")
    page = browser.open(admin.url + "/messages?topic=orders&id=%3Cb%3Ex")
    assert "INVALID_ID" in page.inner_text("#search-error")
    assert page.locator("#search-error b").count() == 0
    browser.errors.clear()  # the 400 page load is reported as a console error


def test_small_screen_layout(cluster, browser: Browser) -> None:  # noqa: F811
    _seed(cluster)
    admin = cluster.start_admin()
    page = browser.page
    page.set_viewport_size({"width": 390, "height": 844})
    for name, path in (("channel", "/topics/orders/billing"),
                       ("messages", "/messages?topic=orders&offset=1")):
        browser.open(admin.url + path)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, (path, overflow)
        browser.shot(f"mobile-{name}")
