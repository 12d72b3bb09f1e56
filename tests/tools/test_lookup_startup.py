"""A consuming tool started before its topic exists says so once and subscribes soon after
the topic appears (the shared client lookup code: every tool behaves the same)."""

from __future__ import annotations

from pathlib import Path

from tests.tools.helpers import channel_stats, create_topic, pub, wait_for


def test_nsq_to_file_tells_and_finds_a_late_topic(nsqd_factory, lookupd_factory, tools,
                                                  tmp_path: Path) -> None:
    ld = lookupd_factory.start()
    nsqd = nsqd_factory.start([f"--lookupd-tcp-address={ld.tcp_address}",
                               "--broadcast-address=127.0.0.1"])
    t = tools.start("nsq_to_file", ["--topic=late", f"--lookupd-http-address={ld.http_address}",
                                    f"--output-dir={tmp_path / 'out'}"])
    t.wait_stderr("no nsqd has topic late yet", 30)
    create_topic(nsqd.http_address, "late")
    pub(nsqd.http_address, "late", [b"a", b"b", b"c"])
    # the next poll interval is 60-78 s away: found by the early retries instead
    wait_for(lambda: (channel_stats(nsqd.http_address, "late", "nsq_to_file") or {})
             .get("message_count", 0) == 3, 40, "the late topic consumed")
    assert t.terminate() == 0, t.stderr
    assert t.stderr.count("no nsqd has topic late yet") == 1, t.stderr
    assert "topic late is on 127.0.0.1:" in t.stderr
