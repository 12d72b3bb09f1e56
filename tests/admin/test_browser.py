"""nsqadmin in a real browser: headless Debian Chromium driven by Playwright.

Each test opens the pages against a real nsqlookupd + two nsqds, checks the numbers shown
against the nodes' own ``/stats``, clicks the actions (accepting or dismissing the confirm
dialog) and checks the effect on the nodes. Screenshots land in the test's tmp dir.
Chromium comes from ``scripts/install-browser.sh`` (Debian package, never
``playwright install``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nsqx.protocol import v2
from tests.admin.helpers import get_json, nsqd_channel, nsqd_topic, wait_for
from tests.support import http_api
from tests.support.rawclient import consumer

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("NSQX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


class Browser:
    def __init__(self, page: Any, shots: Path) -> None:
        self.page = page
        self.shots = shots
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                and "favicon" not in m.text else None)

    def open(self, url: str) -> Any:
        self.page.goto(url, wait_until="load")
        return self.page

    def shot(self, name: str, full_page: bool = True) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def values(self, selector: str, metric: str) -> int:
        return int(self.page.locator(f"{selector} [data-metric='{metric}']").first
                   .get_attribute("data-value"))

    def wait_js(self, expression: str, timeout: float = 15.0) -> Any:
        """Poll a JS expression until truthy. Not page.wait_for_function: Playwright may
        evaluate a string predicate with eval in the page, which nsqadmin's CSP
        (script-src 'self') refuses and reports as a page error (a flaky failure)."""
        from playwright.sync_api import Error as PlaywrightError

        def check() -> Any:
            try:
                return self.page.evaluate(expression)
            except PlaywrightError as exc:  # the page navigated meanwhile: ask again
                if "context was destroyed" in str(exc) or "navigat" in str(exc):
                    return None
                raise
        return wait_for(check, timeout, what=expression)

    def click_and_confirm(self, selector: str, accept: bool = True) -> str:
        seen: list[str] = []

        def on_dialog(d: Any) -> None:
            seen.append(d.message)
            d.accept() if accept else d.dismiss()

        self.page.once("dialog", on_dialog)
        self.page.click(selector)
        wait_for(lambda: seen, 10, what="the confirm dialog")
        return seen[0]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `bash scripts/install-browser.sh` "
                    "(installs Debian's chromium) or deselect with -m 'not slow'",
                    pytrace=False)
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "screenshots"
    shots.mkdir()
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            ctx = b.new_context(viewport={"width": 1280, "height": 900})
            ctx.set_default_timeout(15_000)
            br = Browser(ctx.new_page(), shots)
            yield br
            assert not br.errors, f"errors in the page: {br.errors}"
            ctx.close()
        finally:
            b.close()
    finally:
        pw.stop()


def _seed(cluster) -> tuple[str, str]:
    n1, n2 = cluster.nsqds
    http_api.mpub(n1.http_address, "orders", [b"a", b"b", b"c"])
    http_api.mpub(n2.http_address, "orders", [b"d", b"e"])
    for n in (n1, n2):
        assert http_api.post(n.http_address, "/channel/create", topic="orders",
                             channel="billing").status == 200
    http_api.mpub(n1.http_address, "orders", [b"f", b"g"])
    http_api.mpub(n2.http_address, "orders", [b"h"])
    return n1.http_address, n2.http_address


def test_every_page_shows_the_numbers_of_stats(cluster, browser) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    with consumer(cluster.nsqds[0].tcp_address, "orders", "billing", rdy=1,
                  identify={"client_id": "w1", "hostname": "worker-host",
                            "user_agent": "browser-test/1.0"}) as cl:
        (msg,) = cl.read_messages(1)
        cl.send(v2.fin(msg.id))  # the next message is sent: 1 finished, 1 in flight
        wait_for(lambda: nsqd_channel(a1, "orders", "billing")["clients"][0]["finish_count"]
                 == 1 and nsqd_channel(a1, "orders", "billing")["in_flight_count"] == 1)
        t1, t2 = nsqd_topic(a1, "orders"), nsqd_topic(a2, "orders")
        c1, c2 = nsqd_channel(a1, "orders", "billing"), nsqd_channel(a2, "orders", "billing")

        # Streams
        page = browser.open(admin.url + "/")
        row = "#topics-table tr[data-topic='orders']"
        assert browser.values(row, "depth") == t1["depth"] + t2["depth"]
        assert browser.values(row, "message_count") == t1["message_count"] + t2["message_count"]
        assert browser.values(row, "in_flight_count") == 1
        assert browser.values(row, "channel_depth") == c1["depth"] + c2["depth"]
        assert page.locator(f"{row} [data-metric='message_count']").inner_text() == \
            f"{t1['message_count'] + t2['message_count']:,}"
        browser.shot("streams")

        # topic
        page = browser.open(admin.url + "/topics/orders")
        for addr, t in ((a1, t1), (a2, t2)):
            sel = f"#topic-nodes tr[data-node='{addr}']"
            assert browser.values(sel, "depth") == t["depth"]
            assert browser.values(sel, "message_count") == t["message_count"]
        chan = "#topic-channels tr[data-channel='billing']"
        assert browser.values(chan, "depth") == c1["depth"] + c2["depth"]
        assert browser.values(chan, "in_flight_count") == 1
        assert browser.values(chan, "message_count") == c1["message_count"] + c2["message_count"]
        assert browser.values(chan, "client_count") == 1
        assert page.locator("#topic-nodes th", has_text="e2e 99th").count() == 1
        # the built-in charts fill in from the sampler
        page.wait_for_selector("figure.chart[data-metric='rate'] svg path", state="attached",
                               timeout=20_000)
        page.wait_for_selector("figure.chart[data-metric='depth'] svg path", state="attached",
                               timeout=20_000)
        browser.shot("topic")

        # channel
        page = browser.open(admin.url + "/topics/orders/billing")
        for addr, c in ((a1, c1), (a2, c2)):
            sel = f"#channel-nodes tr[data-node='{addr}']"
            for m in ("depth", "in_flight_count", "deferred_count", "requeue_count",
                      "timeout_count", "message_count", "client_count"):
                assert browser.values(sel, m) == c[m], (addr, m)
        total = "#channel-nodes tr[data-node='*']"
        assert browser.values(total, "depth") == c1["depth"] + c2["depth"]
        client = page.locator("#channel-clients tr[data-client='w1']")
        text = client.inner_text()
        assert "worker-host" in text and "browser-test/1.0" in text and a1 in text
        (raw,) = c1["clients"]
        assert browser.values("#channel-clients tr[data-client='w1']", "ready_count") == \
            raw["ready_count"] == 1
        assert browser.values("#channel-clients tr[data-client='w1']", "finish_count") == 1
        assert browser.values("#channel-clients tr[data-client='w1']", "in_flight_count") == 1
        page.wait_for_selector("figure.chart[data-metric='in_flight_count'] svg path",
                               state="attached", timeout=20_000)
        browser.shot("channel")

        # nodes
        page = browser.open(admin.url + "/nodes")
        for addr in (a1, a2):
            r = page.locator(f"#nodes-table tr[data-node='{addr}']")
            assert "OK" in r.inner_text() and "1.3.0" in r.inner_text()
        assert "OK" in page.locator(
            f"#lookupd-table tr[data-lookupd='{cluster.lookupd.http_address}']").inner_text()
        browser.shot("nodes")

        # node detail
        page = browser.open(admin.url + f"/nodes/{a1}")
        assert page.locator("[data-metric='total_messages']").inner_text() == \
            f"{t1['message_count']:,}"
        assert page.locator("[data-metric='total_clients']").inner_text() == "1"
        assert browser.values("#node-topics tr.channel-row[data-channel='billing']",
                              "message_count") == c1["message_count"]
        browser.shot("node")

    # counter: the live total of messages processed by channels
    counter = get_json(admin.url + "/api/counter")
    want = sum(v["message_count"] for v in counter["stats"].values())
    page = browser.open(admin.url + "/counter")
    browser.wait_js(f"document.getElementById('counter').dataset.total === '{want}'")
    wait_for(lambda: page.inner_text("#counter").replace(",", "") == str(want), 10)
    browser.shot("counter")

    # lookup
    page = browser.open(admin.url + "/lookup")
    assert "billing" in page.locator("#lookup-table tr[data-topic='orders']").inner_text()
    browser.shot("lookup")


def test_topic_actions_pause_empty_delete(cluster, browser) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    page = browser.open(admin.url + "/topics/orders")

    # dismissing the dialog does nothing
    msg = browser.click_and_confirm("button[data-action='pause']", accept=False)
    assert "Pause topic orders" in msg
    page.wait_for_timeout(300)
    assert not nsqd_topic(a1, "orders")["paused"]

    browser.click_and_confirm("button[data-action='pause']")
    wait_for(lambda: nsqd_topic(a1, "orders")["paused"] and nsqd_topic(a2, "orders")["paused"])
    page.wait_for_selector("button[data-action='unpause']")
    assert page.locator("h2 .badge-paused").count() == 1
    browser.shot("topic-paused")
    browser.click_and_confirm("button[data-action='unpause']")
    wait_for(lambda: not nsqd_topic(a1, "orders")["paused"])
    page.wait_for_selector("button[data-action='pause']")

    # topic depth: messages published to a topic with no channel stay in the topic
    http_api.mpub(a1, "solo", [b"1", b"2", b"3"])
    page = browser.open(admin.url + "/topics/solo")
    assert browser.values(f"#topic-nodes tr[data-node='{a1}']", "depth") == 3
    browser.click_and_confirm("button[data-action='empty']")
    wait_for(lambda: nsqd_topic(a1, "solo")["depth"] == 0)
    browser.wait_js(
        f"document.querySelector(\"#topic-nodes tr[data-node='{a1}'] [data-metric=depth]\")"
        ".dataset.value === '0'")

    page = browser.open(admin.url + "/topics/orders")
    assert "Delete topic orders" in browser.click_and_confirm("button[data-action='delete']")
    wait_for(lambda: nsqd_topic(a1, "orders") is None and nsqd_topic(a2, "orders") is None)
    page.wait_for_url(admin.url + "/")
    assert "orders" not in get_json(f"http://{cluster.lookupd.http_address}/topics")["topics"]
    browser.shot("after-delete")


def test_channel_actions_pause_empty_delete(cluster, browser) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    page = browser.open(admin.url + "/topics/orders/billing")
    browser.click_and_confirm("button[data-action='pause']")
    wait_for(lambda: nsqd_channel(a1, "orders", "billing")["paused"]
             and nsqd_channel(a2, "orders", "billing")["paused"])
    page.wait_for_selector("button[data-action='unpause']")
    browser.click_and_confirm("button[data-action='unpause']")
    wait_for(lambda: not nsqd_channel(a2, "orders", "billing")["paused"])
    page.wait_for_selector("button[data-action='pause']")

    assert nsqd_channel(a1, "orders", "billing")["depth"] > 0
    assert "Empty channel billing" in browser.click_and_confirm("button[data-action='empty']")
    wait_for(lambda: nsqd_channel(a1, "orders", "billing")["depth"] == 0
             and nsqd_channel(a2, "orders", "billing")["depth"] == 0)
    browser.wait_js(
        "document.querySelector(\"#channel-nodes tr[data-node='*'] [data-metric=depth]\")"
        ".dataset.value === '0'")
    browser.shot("channel-emptied")

    browser.click_and_confirm("button[data-action='delete']")
    wait_for(lambda: nsqd_channel(a1, "orders", "billing") is None
             and nsqd_channel(a2, "orders", "billing") is None)
    page.wait_for_url(admin.url + "/topics/orders")
    assert page.locator("#topic-channels").count() == 0


def test_create_channel_and_tombstone(cluster, browser) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    page = browser.open(admin.url + "/topics/orders")
    page.fill("#create-form input[name='channel']", "audit")
    seen: list[str] = []
    page.once("dialog", lambda d: (seen.append(d.message), d.accept()))
    page.click("#create-form button[type='submit']")
    wait_for(lambda: nsqd_channel(a1, "orders", "audit") is not None
             and nsqd_channel(a2, "orders", "audit") is not None)
    assert seen == ["Create channel orders/audit?"]
    page.wait_for_selector("#topic-channels tr[data-channel='audit']")

    browser.click_and_confirm(f"#topic-nodes tr[data-node='{a2}'] button[data-action='tombstone']")
    wait_for(lambda: nsqd_topic(a2, "orders") is None)
    assert nsqd_topic(a1, "orders") is not None
    lookup = get_json(f"http://{cluster.lookupd.http_address}/lookup?topic=orders")
    assert [f"127.0.0.1:{p['http_port']}" for p in lookup["producers"]] == [a1]


def test_read_only_for_non_admins(cluster, browser) -> None:
    _seed(cluster)
    admin = cluster.start_admin("--admin-user=alice")
    page = browser.open(admin.url + "/topics/orders")
    assert page.locator("button[data-action]").count() == 0
    assert page.locator("#create-form").count() == 0
    page = browser.open(admin.url + "/topics/orders/billing")
    assert page.locator("button[data-action]").count() == 0


def test_down_node_is_marked_and_the_rest_shown(cluster, browser) -> None:
    a1, a2 = _seed(cluster)
    admin = cluster.start_admin()
    cluster.freeze(cluster.nsqds[1])
    page = browser.open(admin.url + "/topics/orders")
    banner = page.locator("#down-nodes")
    assert banner.is_visible() and a2 in banner.inner_text()
    assert page.locator(f"#topic-nodes tr[data-node='{a1}']").count() == 1
    assert page.locator(f"#topic-nodes tr[data-node='{a2}']").count() == 0
    assert browser.values(f"#topic-nodes tr[data-node='{a1}']", "depth") == \
        nsqd_topic(a1, "orders")["depth"]
    browser.shot("topic-node-down")
    page = browser.open(admin.url + "/nodes")
    assert "DOWN" in page.locator(f"#nodes-table tr[data-node='{a2}']").inner_text()
    assert "OK" in page.locator(f"#nodes-table tr[data-node='{a1}']").inner_text()
    browser.shot("nodes-node-down")
    cluster.thaw()


class _EvilSite:
    """A page on another origin that tries to act on nsqadmin (CSRF)."""

    def __init__(self, admin_url: str) -> None:
        html = f"""<!DOCTYPE html><html><body>
<form id="f" method="POST" action="{admin_url}/api/topics/orders" enctype="text/plain">
<input name='{{"action":"pause","x":"' value='"}}'><button id="go">go</button></form>
<button id="fetch">fetch</button>
<script>
document.getElementById('fetch').onclick = function () {{
  fetch('{admin_url}/api/topics/orders', {{method: 'POST', mode: 'no-cors',
    credentials: 'include', body: '{{"action":"pause"}}'}})
    .then(function () {{ document.title = 'sent'; }}, function () {{ document.title = 'err'; }});
}};
</script></body></html>""".encode()

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(html)))
                self.end_headers()
                self.wfile.write(html)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_cross_site_requests_are_refused(cluster, browser) -> None:
    a1, _ = _seed(cluster)
    admin = cluster.start_admin()
    browser.open(admin.url + "/topics/orders")  # the browser now holds the CSRF cookie
    evil = _EvilSite(admin.url)
    try:
        page = browser.open(evil.url)
        page.click("#fetch")
        browser.wait_js("document.title === 'sent' || document.title === 'err'")
        with page.expect_navigation():
            page.click("#go")
        assert "CSRF" in page.content()
        page.wait_for_timeout(300)
        assert not nsqd_topic(a1, "orders")["paused"]
    finally:
        browser.errors.clear()  # the refused requests log console errors on purpose
        evil.close()


def test_small_screen_layout(cluster, browser) -> None:
    _seed(cluster)
    admin = cluster.start_admin()
    page = browser.page
    page.set_viewport_size({"width": 390, "height": 844})
    for name, path in (("streams", "/"), ("topic", "/topics/orders"),
                       ("channel", "/topics/orders/billing"), ("nodes", "/nodes")):
        browser.open(admin.url + path)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, (path, overflow)
        browser.shot(f"mobile-{name}")


# ----------------------------------------------------------------------------- cluster mode

def _partition_rows(page: Any, scope: str) -> list[dict[str, Any]]:
    """The partition table's rows as data: what the page shows for each partition."""
    return page.evaluate(
        """(scope) => Array.from(document.querySelectorAll(scope + " tr[data-partition]"))
        .map(tr => ({partition: +tr.dataset.partition, leader: tr.dataset.leader,
                     epoch: +tr.dataset.epoch, replicas: tr.dataset.replicas,
                     isr: tr.dataset.isr, catchup: tr.dataset.catchup,
                     ends: Object.fromEntries(Array.from(tr.querySelectorAll(".replica"))
                        .map(r => [r.dataset.node, [r.dataset.logEnd, r.dataset.lag]]))}))""",
        scope)


def _as_shown(p: dict[str, Any]) -> dict[str, Any]:
    """A partition of lookupd's /cluster/stats?log_ends=true as the table shows it."""
    def s(v: Any) -> str:
        return "" if v is None else str(v)
    return {"partition": p["partition"], "leader": p["leader"] or "", "epoch": p["epoch"],
            "replicas": ",".join(p["replicas"]), "isr": ",".join(p["isr"]),
            "catchup": ",".join(p["catchup"]),
            "ends": {r: [s(p["log_end"][r]), s(p["lag"][r])] for r in p["replicas"]}}


def _table_matches_lookupd(browser: Browser, c: Any, url: str, scope: str, topic: str,
                           pred: Any = None) -> list[dict[str, Any]]:
    """Reload until the table equals lookupd's own answer (read right after the page)."""
    from tests.admin.test_cluster_views import lookupd_stats

    def check() -> Any:
        page = browser.open(url)
        rows = _partition_rows(page, scope)
        want = [_as_shown(p) for p in lookupd_stats(c)["topics"][topic]["partitions"]]
        return rows if rows == want and (pred is None or pred(rows)) else None
    return wait_for(check, 30, interval=0.3, what=f"{scope} equal to lookupd's /cluster/stats")


def test_cluster_page_create_partition_table_and_drain(real_cluster, admin_factory,
                                                       browser) -> None:
    from tests.admin.test_cluster_views import lookupd_stats, publish_to_leaders, start_admin

    c = real_cluster
    admin = start_admin(admin_factory, c)
    page = browser.open(admin.url + "/cluster")
    stats = lookupd_stats(c)
    assert page.locator("#coordinator").inner_text() == stats["coordinator"]
    ids = sorted(c.node_id(n) for n in c.nodes)
    assert sorted(page.evaluate(
        "Array.from(document.querySelectorAll('#cluster-nodes tr[data-state=live]'))"
        ".map(tr => tr.dataset.node)")) == ids
    assert page.locator("nav a.active", has_text="Cluster").count() == 1

    # create a partitioned topic through the form
    page.fill("#cluster-create-form input[name='topic']", "shop")
    page.fill("#cluster-create-form input[name='partitions']", "3")
    page.fill("#cluster-create-form input[name='replicas']", "2")
    msg = browser.click_and_confirm("#cluster-create-form button[type='submit']")
    assert msg == "Create topic shop with 3 partition(s) x 2 replicas?"
    page.wait_for_selector("section.cluster-topic[data-topic='shop'] tr[data-partition='2']")
    assert "created topic shop" in page.locator("#flash").inner_text()
    t = lookupd_stats(c)["topics"]["shop"]
    assert (t["partition_num"], t["replica"]) == (3, 2)
    assert len({p["leader"] for p in t["partitions"]}) == 3  # spread over the nodes

    # leaders, epochs, ISR, catch-up and log ends as lookupd reports them; lag 0 once synced
    scope = "section.cluster-topic[data-topic='shop']"
    wait_for(lambda: all(c.role_of(c.node_by_id(p["leader"]), "shop", p["partition"])
                         == "leader" for p in c.partitions("shop")), 30, what="leaders ready")
    sent = publish_to_leaders(c, "shop", 5)
    rows = _table_matches_lookupd(
        browser, c, admin.url + "/cluster", scope, "shop",
        lambda rows: all(v[1] in ("0", "") and v[0] != "" for r in rows
                         for v in r["ends"].values()))
    assert sum(int(r["ends"][r["leader"]][0]) for r in rows) == sent == 15
    for r in rows:
        assert sorted(r["isr"].split(",")) == sorted(r["replicas"].split(",")) and not r["catchup"]
    browser.shot("cluster")

    # another shape is refused: lookupd's reason is shown
    page.fill("#cluster-create-form input[name='topic']", "shop")
    page.fill("#cluster-create-form input[name='partitions']", "2")
    browser.click_and_confirm("#cluster-create-form button[type='submit']")
    browser.wait_js("document.getElementById('flash').textContent.indexOf('E_TOPIC_EXISTS') >= 0")
    assert page.locator("#flash").inner_text() == (
        "create failed: E_TOPIC_EXISTS: topic shop already exists with 3 partitions x 2 "
        "replicas")
    assert all("400" in e for e in browser.errors), browser.errors  # the refused fetch
    browser.errors.clear()
    browser.shot("cluster-create-refused")

    # the topic's own page shows the same partition table
    _table_matches_lookupd(browser, c, admin.url + "/topics/shop", "table.partitions", "shop")
    browser.shot("topic-partitions")

    # drain the leader of partition 0 with its button: marked draining, replicas move away
    victim = rows[0]["leader"]
    page = browser.open(admin.url + "/cluster")
    msg = browser.click_and_confirm(
        f"#cluster-nodes tr[data-node='{victim}'] button[data-action='drain']")
    assert msg.startswith(f"Drain node {victim}?")
    page.wait_for_selector(f"#cluster-nodes tr[data-node='{victim}'][data-state='draining']")
    assert victim in lookupd_stats(c)["draining"]
    rows = _table_matches_lookupd(
        browser, c, admin.url + "/cluster", scope, "shop",
        lambda rows: all(victim not in r["replicas"].split(",") for r in rows))
    page = browser.page
    assert page.locator(f"#cluster-nodes tr[data-node='{victim}'] "
                        "[data-metric='replicas']").inner_text() == "0"
    assert "draining" in page.locator(f"#cluster-nodes tr[data-node='{victim}']").inner_text()
    browser.shot("cluster-drained")
    browser.click_and_confirm(
        f"#cluster-nodes tr[data-node='{victim}'] button[data-action='undrain']")
    page.wait_for_selector(f"#cluster-nodes tr[data-node='{victim}'][data-state='live']")
    assert victim not in lookupd_stats(c)["draining"]
