"""The command that forwards a client's publish to where it is stored: a cluster
follower's to the partition's leader, a worker's (``nsqd --workers``) to the topic's owner.

Sans-IO: builds NSQ/Youzan wire commands from what Topic.publish (or ClientV2) received,
so the leader or owner stores exactly what a producer talking to it directly would have
stored (same partition, same headers, same trace ids), and reads back the offset of a
traced answer so the forwarder's own traced answer names the stored message id.
"""

from __future__ import annotations

from nsqx.protocol import v2
from nsqx.protocol.v2 import TRACE_ID_KEY

__all__ = ["forward_command", "traced_offset"]


def forward_command(topic: str, partition: int | None, bodies: list[bytes], defer_ms: int,
                    headers: list[dict[str, bytes] | None] | None = None,
                    route_version: int | None = None) -> bytes:
    """PUB/MPUB/DPUB or their ``_EXT``/``_TRACE`` forms for one publish batch.

    ``partition`` None lets the leader pick (single-partition topics; DPUB, which names none).
    Headers that are only trace ids go as ``MPUB_TRACE`` so the leader answers with the
    traced response; any other header as ``PUB_EXT``/``MPUB_EXT``.
    """
    if defer_ms:
        if len(bodies) != 1 or (headers is not None and any(headers)):
            raise ValueError("a deferred publish is one message without headers")
        return v2.dpub(topic, defer_ms, bodies[0])
    if headers is None or not any(headers):
        if len(bodies) == 1:
            return v2.pub(topic, bodies[0], partition, route_version)
        return v2.mpub(topic, bodies, partition, route_version)
    if len(bodies) == 1:
        return v2.pub_ext(topic, bodies[0], headers[0], partition)
    if all(not h or set(h) == {TRACE_ID_KEY} for h in headers):
        return v2.mpub_trace(topic, [(int(h[TRACE_ID_KEY]) if h else 0, b)
                                     for h, b in zip(headers, bodies, strict=True)], partition)
    return v2.mpub_ext(topic, list(zip(headers, bodies, strict=True)), partition)


def traced_offset(answer: bytes) -> int:
    """The queue offset in Youzan's 30-byte traced answer, -1 for a plain ``OK``."""
    try:
        return v2.parse_traced_response(answer)[2]
    except ValueError:
        return -1
