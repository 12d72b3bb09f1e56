"""Depth counts pending messages whether the topic is paused or not (Go's depth does)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.nsqd.inprocess import running_node


def test_paused_topic_keeps_its_channels_depth(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as nsqd:
            topic = nsqd.get_topic("t")
            for name in ("a", "b"):
                topic.get_channel(name)
            topic.pause()
            await nsqd.publish("t", [b"m%d" % i for i in range(4)])
            (t,) = nsqd.stats_dict()["topics"]
            assert t["paused"] is True
            assert {c["channel_name"]: c["depth"] for c in t["channels"]} == {"a": 4, "b": 4}
            url = f"http://127.0.0.1:{nsqd.http_port}/metrics"
            async with aiohttp.ClientSession() as s, s.get(url) as r:
                text = await r.text()
            assert 'nsq_channel_depth{topic="t",channel="a"} 4' in text
            topic.unpause()
            (t,) = nsqd.stats_dict()["topics"]
            assert [c["depth"] for c in t["channels"]] == [4, 4]

    asyncio.run(main())
