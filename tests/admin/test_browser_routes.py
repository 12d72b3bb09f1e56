"""nsqadmin's route-change forms (split, merge, move of a route-managed ordered topic) in
headless Chromium (Playwright with Debian's /usr/bin/chromium, as test_browser.py), checked
against nsqd's own /topic/route."""

from __future__ import annotations

import pytest

from tests.admin.helpers import get_json
from tests.admin.test_browser import Browser, browser  # noqa: F401  (the fixture)
from tests.support import http_api

pytestmark = pytest.mark.slow


def _versions(addr: str) -> list[dict]:
    return get_json(f"http://{addr}/topic/route?topic=keyed")["versions"]


def _table(page) -> list[str]:  # type: ignore[no-untyped-def]
    """The route table's version column, top to bottom."""
    return page.locator("#route-table tbody tr td:first-child").all_inner_texts()


def test_split_merge_move_from_the_topic_page(nsqd_factory, admin_factory,
                                             browser: Browser) -> None:  # noqa: F811
    n = nsqd_factory.start(["--broadcast-address=127.0.0.1"])
    addr = n.http_address
    assert http_api.post(addr, "/topic/create", topic="keyed", orderedmulti="true",
                         partition_num="1", logical="8").status == 200
    admin = admin_factory.start([f"--nsqd-http-address={addr}"])
    page = browser.open(admin.url + "/topics/keyed")
    assert _table(page) == ["0"]
    split = "#route-actions form[data-op='split']"
    assert page.locator("#route-actions form[data-op='merge']").count() == 0

    # dismissing the confirm changes nothing
    page.select_option(f"{split} select[name='partition']", "0")
    page.fill(f"{split} input[name='at']", "4")
    msg = browser.click_and_confirm(f"{split} button[type='submit']", accept=False)
    assert msg.startswith("Split partition 0 at logical partition 4 (topic keyed)?")
    page.wait_for_timeout(300)
    assert len(_versions(addr)) == 1

    with page.expect_navigation():  # the page reloads once nsqd committed the change
        browser.click_and_confirm(f"{split} button[type='submit']")
    page.wait_for_selector("#flash:not(.hidden)")
    assert f"split done - route version 1 on {addr}" in page.inner_text("#flash")
    assert _table(page) == ["0", "1"]
    assert "0\u20133 \u2192 1 @ " in page.inner_text("#route-table")
    assert [r[:3] for r in _versions(addr)[-1]["routes"]] == [[0, 4, 1], [4, 8, 2]]
    browser.shot("route-split")

    # a boundary outside the partition's range: nsqd's refusal is shown as it said it
    page.select_option(f"{split} select[name='partition']", "1")  # logical 0-3
    page.fill(f"{split} input[name='at']", "6")
    browser.click_and_confirm(f"{split} button[type='submit']")
    page.wait_for_selector("#flash:not(.hidden)")
    assert page.inner_text("#flash") == ("split failed: topic keyed: cannot split partition 1 "
                                         "[0, 4) at 6: the boundary must be strictly inside")
    assert len(_versions(addr)) == 2 and _table(page) == ["0", "1"]
    assert page.locator(f"{split} button[type='submit']").is_enabled()
    browser.errors.clear()  # the refused request logs a console error on purpose
    browser.shot("route-split-refused")

    # merge the two halves back, then move the merged partition
    merge = "#route-actions form[data-op='merge']"
    page.select_option(f"{merge} select[name='a']", "1")
    page.select_option(f"{merge} select[name='b']", "2")
    with page.expect_navigation():
        assert "Merge partitions 1 and 2" in browser.click_and_confirm(
            f"{merge} button[type='submit']")
    page.wait_for_selector("#route-table")
    assert _table(page) == ["0", "1", "2"]
    assert [r[:3] for r in _versions(addr)[-1]["routes"]] == [[0, 8, 3]]
    move = "#route-actions form[data-op='move']"
    page.fill(f"{move} input[name='node']", "elsewhere:4150")
    with page.expect_navigation():
        browser.click_and_confirm(f"{move} button[type='submit']")
    page.wait_for_selector("#flash:not(.hidden)")
    assert "move done - route version 3" in page.inner_text("#flash")
    assert _table(page) == ["0", "1", "2", "3"]
    assert _versions(addr)[-1]["routes"] == [[0, 8, 4, "elsewhere:4150"]]
    browser.shot("route-move")


def test_read_only_users_see_no_route_forms(nsqd_factory, admin_factory,
                                            browser: Browser) -> None:  # noqa: F811
    n = nsqd_factory.start(["--broadcast-address=127.0.0.1"])
    assert http_api.post(n.http_address, "/topic/create", topic="keyed", orderedmulti="true",
                         partition_num="2", logical="8").status == 200
    admin = admin_factory.start([f"--nsqd-http-address={n.http_address}", "--admin-user=alice"])
    page = browser.open(admin.url + "/topics/keyed")
    assert _table(page) == ["0"] and page.locator("#route-actions").count() == 0
