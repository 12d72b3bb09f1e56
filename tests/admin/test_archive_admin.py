"""nsqadmin shows tiered storage on the topic page (a real nsqd with --archive-url)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from tests.admin.helpers import get_json, http  # noqa: E402
from tests.nsqd.test_archive_nsqd import archived_node  # noqa: E402


def test_topic_page_shows_the_archive(nsqd_factory, admin_factory, tmp_path: Path) -> None:
    nsqd, a = archived_node(nsqd_factory, tmp_path / "arch",
                            extra=["--broadcast-address=127.0.0.1"])
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
