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
import time
import weakref
from collections import OrderedDict
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import orjson

from nsqx.httpbase import HTTPError
from nsqx.httpbase import first as _first
from nsqx.nsqd.datapath import publish_keys_path
from nsqx.nsqd.idempotence import IdempotenceError, deduper_for, fingerprint, leads
from nsqx.nsqd.topic import BadPartition, PartitionRequired, PublishRefused, SealedPartition
from nsqx.protocol.routes import key_partition
from nsqx.storage.publish_keys import HTTP_KEY_PREFIX, PUB_KEY_HEADER

if TYPE_CHECKING:
    from aiohttp import web

    from nsqx.nsqd.interfaces import NodeAPI

__all__ = ["IDEMPOTENCY_KEY", "REPLAYED", "idempotency_key", "mark_replayed", "parse_mpub_binary", "partition_arg",
           "publish", "publish_once", "read_capped", "route_version_arg", "split_text_mpub"]

IDEMPOTENCY_KEY = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY_LEN = 255
# key -> topic of recent keyed requests: a key reused on another topic is a 422 (in memory,
# read back from the partitions' indexes at the first keyed request after a start)
KEY_TOPICS_MAX = 100_000

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
        routes = topic.routes
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


def idempotency_key(request: web.Request) -> str | None:
    """The request's ``Idempotency-Key`` (a plain or a quoted string, 1..255 visible ASCII
    characters), None without one; 400 ``INVALID_IDEMPOTENCY_KEY`` when malformed."""
    raw = request.headers.get(IDEMPOTENCY_KEY)
    if raw is None:
        return None
    key = raw.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':  # the IETF draft's sf-string form
        key = key[1:-1]
    if not (0 < len(key) <= MAX_KEY_LEN and key.isascii() and key.isprintable()):
        raise HTTPError(400, "INVALID_IDEMPOTENCY_KEY")
    return key


def mark_replayed(response: Any, replayed: bool) -> Any:
    """A keyed publish answered from the index says so (the IETF draft's header)."""
    if replayed:
        response.headers[REPLAYED] = "true"
    return response


# one key -> topic map per node, shared by every HTTP handler that publishes with a key
# (/pub, /mpub, /pubtrace...); kept here, where it is used, and gone with its node
_KEY_TOPICS: weakref.WeakKeyDictionary[NodeAPI, OrderedDict[str, str]] = weakref.WeakKeyDictionary()


def _key_topics(nsqd: NodeAPI) -> OrderedDict[str, str]:
    kt = _KEY_TOPICS.get(nsqd)
    if kt is None:
        kt = _KEY_TOPICS[nsqd] = _recovered_key_topics(nsqd)
    return kt


def _recovered_key_topics(nsqd: NodeAPI) -> OrderedDict[str, str]:
    """Which topic each HTTP key of the window was used on, newest last: read once, at the
    node's first keyed request, from the index of every partition that has one (opening
    it takes in the log's unindexed tail, as a publish would), so a key reused on another
    topic is a 422 after a restart or a kill -9 too. Off the publish path after that; at
    most KEY_TOPICS_MAX keys read per partition (the map keeps no more)."""
    since = time.time() - float(nsqd.opts.idempotency_window)
    found: list[tuple[float, str, str]] = []
    for name, topic in list(nsqd.topics.items()):
        for part in topic.partitions:
            if part.ephemeral or not publish_keys_path(part.dir, part.partition).exists():
                continue  # no keyed publish ever (an ephemeral topic's keys die with it)
            try:
                keys = deduper_for(part).keys.keys_since(HTTP_KEY_PREFIX, since,
                                                         KEY_TOPICS_MAX)
            except Exception as exc:  # the partition's own check still holds
                log.error("TOPIC(%s) PARTITION(%d): reading its idempotency keys failed: %s",
                          name, part.partition, exc)
                continue
            found += [(created, unquote(k[len(HTTP_KEY_PREFIX):]), name)
                      for k, created in keys]
    found.sort()
    return OrderedDict((key, name) for _, key, name in found[-KEY_TOPICS_MAX:])


async def publish_once(nsqd: NodeAPI, topic_name: str, bodies: list[bytes], defer_ms: int,
                       partition: int | None, *, key: str, kind: str,
                       headers: list[dict[str, bytes] | None] | None = None,
                       producer: str = "", route_version: int | None = None
                       ) -> tuple[int, int, bool]:
    """:func:`publish` with an ``Idempotency-Key``: (partition, base offset, replayed).

    The key picks the partition when none is named (so a retry finds it), and rides as the
    ``nsqx-pub`` mark on the first message, with a fingerprint of the request (``kind``,
    topic, delay, bodies, headers): a retry answers the first append's offsets, another
    request under the same key is 422 ``IDEMPOTENCY_KEY_REUSED``."""
    kt = _key_topics(nsqd)
    seen = kt.get(key)
    if seen is not None and seen != topic_name:
        raise HTTPError(422, f"IDEMPOTENCY_KEY_REUSED: key already used on topic {seen}")
    topic = nsqd.get_topic(topic_name)
    if topic is None:
        raise HTTPError(503, "EXITING")
    parts = topic.partitions
    if partition is None and len(parts) > 1 and not topic.ordered and topic.routes is None:
        partition = key_partition(key, len(parts))
    fp = fingerprint(kind.encode(), topic_name.encode(), b"%d" % defer_ms,
                     orjson.dumps([{k: v.decode("latin-1") for k, v in (h or {}).items()}
                                   for h in headers or []]), *bodies)
    mark = f"{HTTP_KEY_PREFIX}{quote(key, safe='')}#{len(bodies)}#{fp}".encode()
    marked: list[dict[str, bytes] | None] = list(headers) if headers else [None] * len(bodies)
    marked[0] = {**(marked[0] or {}), PUB_KEY_HEADER: mark}
    try:
        part = topic.route(partition)
        routes = topic.routes
        if routes is not None and route_version is not None:
            routes.check_publish(part.partition, route_version)
        if leads(part):
            base, replayed = await deduper_for(part).publish_async(bodies, defer_ms, marked,
                                                                   producer)
        else:  # a follower: the leader checks the mark it forwards, and says if a repeat
            again: list[bool] = []
            fut = part.publish(bodies, defer_ms, headers=marked, producer=producer,
                               on_replayed=partial(again.append, True))
            assert fut is not None
            base = await fut
            replayed = bool(again)
    except asyncio.CancelledError:
        raise
    except IdempotenceError as exc:
        raise HTTPError(exc.status, f"{exc.code[2:]}: {exc.text}") from None
    except (SealedPartition, PartitionRequired) as exc:
        raise HTTPError(400, f"E_BAD_PARTITION {exc}") from None
    except BadPartition:
        raise HTTPError(400, "E_BAD_PARTITION") from None
    except Exception as exc:
        if "E_IDEMPOTENCY_KEY_REUSED" in str(exc):  # the leader's answer to a forward
            raise HTTPError(422, "IDEMPOTENCY_KEY_REUSED: key already used for a different "
                                 "request") from None
        if isinstance(exc, PublishRefused):
            log.error("TOPIC(%s): HTTP publish refused - %s", topic_name, exc)
            raise HTTPError(503, "E_PUB_FAILED") from None
        log.error("TOPIC(%s): HTTP publish failed - %s", topic_name, exc)
        raise HTTPError(503, "EXITING") from None
    kt[key] = topic_name
    kt.move_to_end(key)
    while len(kt) > KEY_TOPICS_MAX:
        kt.popitem(last=False)
    return part.partition, base, replayed
