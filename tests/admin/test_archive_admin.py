"""nsqadmin shows tiered storage on the topic page (a real nsqd with --archive-url)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from tests.admin.helpers import get_json, http  # noqa: E402
from tests.nsqd.test_archive_nsqd import (  # noqa: E402
    archived_and_deleted,
    bodies,
    publish,
)
from tests.nsqd.test_archive_nsqd import http as nsqd_http  # noqa: E402
from tests.support.cluster import wait_until  # noqa: E402


def test_topic_page_shows_the_archive(nsqd_factory, admin_factory, tmp_path: Path) -> None:
    nsqd = nsqd_factory.start(["--broadcast-address=127.0.0.1", "--max-bytes-per-file=4096",
                               "--sync-timeout=100ms", f"--archive-url={tmp_path / 'arch'}"])
    nsqd_http(nsqd, "POST", "/topic/create?topic=t")
    nsqd_http(nsqd, "POST", "/channel/create?topic=t&channel=c")
    publish(nsqd, bodies(0, 300))
    nsqd_http(nsqd, "POST", "/channel/empty?topic=t&channel=c")
    a = wait_until(lambda: archived_and_deleted(nsqd), what="archiving", timeout=60)
    admin = admin_factory.start([f"--nsqd-http-address={nsqd.http_address}"])
    t = get_json(admin.url + "/api/topics/t")
    arch = t["nodes"][0]["archive"][0]
    assert (arch["partition"], arch["archive_start"], arch["log_start"]) == (0, 0,
                                                                             a["log_start"])
    page = http("GET", admin.url + "/topics/t").body.decode()
    assert 'id="topic-archive"' in page
    row = page[page.index('id="topic-archive"'):]
    assert f'<td class="num">{a["log_start"]:,}</td>' in row
    assert ">ok</td>" in row
