"""The command that forwards a client's publish to where it is stored: a cluster
follower's to the partition's leader, a worker's (``nsqd --workers``) to the topic's owner.

Sans-IO: builds NSQ/Youzan wire commands from what Topic.publish (or ClientV2) received,
so the leader or owner stores exactly what a producer talking to it directly would have
stored (same partition, same headers, same trace ids), and reads back the offset of a
traced answer so the forwarder's own traced answer names the stored message id.
"""

from __future__ import annotations

from nsqx.protocol import v2
from nsqx.protocol.v2 import ASK_REPLAYED_KEY, DEFER_KEY, TRACE_ID_KEY

__all__ = ["REPLAYED_SUFFIX", "forward_command", "replayed_answer", "split_replayed",
           "traced_offset"]

# appended to the answer of a marked batch that was a repeat, for a sender that asked
# (ASK_REPLAYED_KEY): "OK REPLAYED", or the traced answer followed by it
REPLAYED_SUFFIX = b" REPLAYED"


def forward_command(topic: str, partition: int | None, bodies: list[bytes], defer_ms: int,
                    headers: list[dict[str, bytes] | None] | None = None,
                    route_version: int | None = None, *, ask_replayed: bool = False) -> bytes:
    """PUB/MPUB/DPUB or their ``_EXT``/``_TRACE`` forms for one publish batch.

    ``partition`` None lets the leader pick (single-partition topics; DPUB, which names none).
    Headers that are only trace ids go as ``MPUB_TRACE`` so the leader answers with the
    traced response; any other header as ``PUB_EXT``/``MPUB_EXT``. A deferred batch with
    headers (or of several messages) goes as ``PUB_EXT``/``MPUB_EXT`` with ``DEFER_KEY``;
    ``ask_replayed`` adds ``ASK_REPLAYED_KEY`` (the answer then says whether the leader
    found the batch's mark stored already: :func:`split_replayed`).
    """
    has_headers = headers is not None and any(headers)
    if ask_replayed or (defer_ms and (has_headers or len(bodies) != 1)):
        first: dict[str, bytes] = dict((headers[0] or {}) if headers else {})
        if defer_ms:
            first[DEFER_KEY] = b"%d" % defer_ms
        if ask_replayed:
            first[ASK_REPLAYED_KEY] = b"1"
        if len(bodies) == 1:
            return v2.pub_ext(topic, bodies[0], first, partition)
        rest = headers[1:] if headers else [None] * (len(bodies) - 1)
        return v2.mpub_ext(topic, list(zip([first, *rest], bodies, strict=True)), partition)
    if defer_ms:
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


def replayed_answer(answer: bytes) -> bytes:
    """The answer to a marked batch found stored, for a sender that asked."""
    return answer + REPLAYED_SUFFIX


def split_replayed(answer: bytes) -> tuple[bytes, bool]:
    """(the answer as it would be without the request, whether it was a repeat)."""
    if answer.endswith(REPLAYED_SUFFIX):
        return answer[:-len(REPLAYED_SUFFIX)], True
    return answer, False


def traced_offset(answer: bytes) -> int:
    """The queue offset in Youzan's 30-byte traced answer, -1 for a plain ``OK``."""
    try:
        return v2.parse_traced_response(answer)[2]
    except ValueError:
        return -1
