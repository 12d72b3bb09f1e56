"""An ephemeral channel of a topic with several partitions is deleted once when its last
client leaves (issue 28 defect 3: each partition scheduled the delete and the later ones
raised KeyError in tasks nobody awaited)."""

from __future__ import annotations

import asyncio
import gc
import struct
from pathlib import Path
from typing import Any

from tests.nsqd.inprocess import running_node


def test_ephemeral_channel_of_partitioned_topic_deleted_once(tmp_path: Path) -> None:
    async def main() -> None:
        errors: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        async with running_node(tmp_path) as nsqd:
            topic = nsqd.ensure_partitions("p3", 3)
            reader, writer = await asyncio.open_connection("127.0.0.1", nsqd.tcp_port)
            writer.write(b"  V2SUB p3 tail#ephemeral\n")
            await writer.drain()
            size = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 10))[0]
            assert await reader.readexactly(size) == struct.pack(">I", 0) + b"OK"
            assert all("tail#ephemeral" in p.channels for p in topic.partitions)
            writer.close()
            for _ in range(1000):
                await asyncio.sleep(0.01)
                if not any("tail#ephemeral" in p.channels for p in topic.partitions):
                    break
            await asyncio.sleep(0.1)  # the other partitions' deletes, if any, run now
            gc.collect()
            assert not any("tail#ephemeral" in p.channels for p in topic.partitions)
            assert nsqd.get_topic("p3", create=False) is topic  # the topic stays
        assert errors == [], errors

    asyncio.run(main())
