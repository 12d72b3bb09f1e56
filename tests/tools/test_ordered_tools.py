"""nsq_tail and nsq_to_file read an ordered topic (every partition, each in order) with no
new flag: the Consumer they share answers E_SUB_ORDER_IS_MUST with SUB_ORDERED."""

from __future__ import annotations

from pathlib import Path

from tests.client.test_ordered_consumer import (
    PARTITIONS,
    PER_PARTITION,
    assert_each_partition_in_order,
    make_ordered_topic,
)
from tests.tools.helpers import channel_stats, wait_for

TOTAL = PARTITIONS * PER_PARTITION


def test_nsq_tail_reads_an_ordered_topic(nsqd, tools) -> None:
    make_ordered_topic(nsqd, "ordered_tail")
    t = tools.start("nsq_tail", ["--topic=ordered_tail", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                 f"-n={TOTAL}"])
    assert t.wait(60) == 0, t.stderr
    lines = t.stdout.splitlines()
    assert len(lines) == TOTAL
    assert_each_partition_in_order(lines)


def test_nsq_to_file_reads_an_ordered_topic(nsqd, tools, tmp_path: Path) -> None:
    make_ordered_topic(nsqd, "ordered_ntf")
    out = tmp_path / "out"
    t = tools.start("nsq_to_file", ["--topic=ordered_ntf", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                    f"--output-dir={out}", "--sync-interval=100ms"])
    wait_for(lambda: (channel_stats(nsqd.http_address, "ordered_ntf", "nsq_to_file") or {})
             .get("message_count", 0) >= TOTAL
             and channel_stats(nsqd.http_address, "ordered_ntf", "nsq_to_file")["depth"] == 0,
             60, "every message consumed")
    assert t.terminate() == 0, t.stderr
    lines = [line for p in sorted(out.iterdir()) for line in p.read_bytes().splitlines()]
    assert len(lines) == TOTAL
    assert_each_partition_in_order(lines)
