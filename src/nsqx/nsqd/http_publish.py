"""What every HTTP route that takes messages shares: capped body reads, upstream's MPUB
body formats, the ``partition`` parameter, and the publish call with its error codes.

Kept apart from ``http`` (which builds the app and mounts the extension APIs) so the
extension modules (``fetch_api``, ``replay_api``, ``trace_api``, ``config_api``) depend
on this and on ``nsqx.httpapi`` only, never back on the module that imports them.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any

from nsqx.httpbase import HTTPError
from nsqx.httpbase import first as _first
from nsqx.nsqd.topic import BadPartition, PartitionRequired, PublishRefused, SealedPartition

if TYPE_CHECKING:
    from aiohttp import web

    from nsqx.nsqd.interfaces import NodeAPI

__all__ = ["parse_mpub_binary", "partition_arg", "publish", "read_capped", "route_version_arg",
           "split_text_mpub"]

log = logging.getLogger("nsqx.nsqd.http")


async def read_capped(request: web.Request, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the body: one byte more tells "too big"."""
    content = request.content
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        chunk = await content.read(min(1 << 18, limit + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


async def read_message(request: web.Request, max_msg: int) -> bytes:
    """One message body (``/pub``, ``/pub_ext``, ``/pubtrace``): 413 MSG_TOO_BIG past
    ``max_msg`` (told by Content-Length or by reading one byte more), 400 MSG_EMPTY."""
    if (request.content_length or 0) > max_msg:
        raise HTTPError(413, "MSG_TOO_BIG")
    body = await read_capped(request, max_msg)
    if len(body) > max_msg:
        raise HTTPError(413, "MSG_TOO_BIG")
    if not body:
        raise HTTPError(400, "MSG_EMPTY")
    return body


def parse_mpub_binary(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """An upstream binary MPUB body -> message bodies; HTTPError(413, BAD_BODY/BAD_MESSAGE)."""
    n = len(body)
    if n < 4:
        raise HTTPError(413, "BAD_BODY")
    (count,) = struct.unpack_from(">i", body, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise HTTPError(413, "BAD_BODY")
    view = memoryview(body)
    msgs: list[bytes] = []
    pos = 4
    unpack = struct.Struct(">i").unpack_from
    for _ in range(count):
        if pos + 4 > n:
            raise HTTPError(413, "BAD_MESSAGE")
        (size,) = unpack(body, pos)
        if size <= 0 or size > max_msg_size or pos + 4 + size > n:
            raise HTTPError(413, "BAD_MESSAGE")
        msgs.append(bytes(view[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return msgs


def split_text_mpub(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """Text /mpub: one message per line, empty lines skipped, in upstream's check order."""
    if len(body) <= max_body_size:
        msgs = [line for line in body.split(b"\n") if line]
        if msgs and max(map(len, msgs)) > max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        return msgs
    # Over the cap: upstream reports whichever limit a line-by-line read hits first.
    total = 0
    read_max = max_body_size + 1
    lines = body.split(b"\n")
    for i, line in enumerate(lines):
        total += len(line) + (1 if i < len(lines) - 1 else 0)
        if total >= read_max:
            raise HTTPError(413, "BODY_TOO_BIG")
        if len(line) > max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
    raise HTTPError(413, "BODY_TOO_BIG")  # pragma: no cover - the loop always reaches read_max


def partition_arg(params: dict[str, list[str]]) -> int | None:
    """The optional ``partition`` parameter (Youzan's), E_BAD_PARTITION when malformed."""
    raw = _first(params, "partition")
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) > 65535:
        raise HTTPError(400, "E_BAD_PARTITION")
    return int(raw)


def route_version_arg(params: dict[str, list[str]]) -> int | None:
    """nsqx's optional ``route_version`` (the newest route the producer knew), 400
    ``E_BAD_PARTITION`` when malformed; a sealed partition refuses whatever it says."""
    raw = _first(params, "route_version")
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise HTTPError(400, "E_BAD_PARTITION")
    return int(raw)


def existing_topic(nsqd: NodeAPI, name: str) -> Any:
    """The topic ``name`` of this node, or 404 TOPIC_NOT_FOUND: reads and admin calls never
    create a topic (only a publish or /topic/create does)."""
    topic = nsqd.topics.get(name)
    if topic is None:
        raise HTTPError(404, "TOPIC_NOT_FOUND")
    return topic


async def publish(nsqd: NodeAPI, topic_name: str, bodies: list[bytes], defer_ms: int = 0,
                  partition: int | None = None, *,
                  headers: list[dict[str, bytes] | None] | None = None,
                  producer: str = "", route_version: int | None = None) -> tuple[int, int]:
    """Publish, durable when this returns: (partition, base offset); HTTPError if not.

    A route-managed topic's sealed partition answers 400 ``E_BAD_PARTITION route version
    N (...)``: the producer refreshes its route to version N and retries."""
    topic = nsqd.get_topic(topic_name)
    if topic is None:  # None only while exiting
        raise HTTPError(503, "EXITING")
    if not bodies:
        return 0, -1
    try:
        routes = getattr(topic, "routes", None)
        if routes is not None and partition is not None and route_version is not None:
            routes.check_publish(partition, route_version)
        return await nsqd.publish(topic_name, bodies, defer_ms, partition,
                                  headers=headers, producer=producer)
    except asyncio.CancelledError:
        raise
    except (SealedPartition, PartitionRequired) as exc:
        raise HTTPError(400, f"E_BAD_PARTITION {exc}") from None
    except BadPartition:
        raise HTTPError(400, "E_BAD_PARTITION") from None
    except PublishRefused as exc:  # cluster mode: not the leader, too few in-sync replicas
        log.error("TOPIC(%s): HTTP publish refused - %s", topic_name, exc)
        raise HTTPError(503, "E_PUB_FAILED") from None
    except Exception as exc:
        log.error("TOPIC(%s): HTTP publish failed - %s", topic_name, exc)
        raise HTTPError(503, "EXITING") from None
