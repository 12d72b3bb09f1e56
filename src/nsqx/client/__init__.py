"""nsqx.client: asyncio producer and consumer for nsqd (and any NSQ server), plus a small
synchronous ``publish`` for scripts.

    async with Producer(["127.0.0.1:4150"]) as p:
        await p.publish("events", b"hello")

    async def handle(msg: Message) -> None: ...
    c = Consumer("events", "archive", handle, lookupd_http_addresses=["127.0.0.1:4161"],
                 max_in_flight=100)
    await c.start(); ...; await c.close()

In cluster mode ``ClusterProducer(["127.0.0.1:4161"])`` publishes to each partition's
leader directly (found through nsqlookupd), a key hashed over the topic's partitions.
"""

from .cluster import ClusterProducer
from .conn import ConnConfig, Connection
from .consumer import Consumer
from .errors import ClosedError, ConnectionClosedError, NoConnectionsError, NSQError
from .message import Message
from .producer import Producer, key_partition
from .sync import publish

__all__ = [
    "ClosedError",
    "ClusterProducer",
    "ConnConfig",
    "Connection",
    "ConnectionClosedError",
    "Consumer",
    "Message",
    "NSQError",
    "NoConnectionsError",
    "Producer",
    "key_partition",
    "publish",
]
