"""nsqd's log API for data pipelines (Spark): offsets, raw fetch, idempotent publish.

These endpoints read a topic's partition log by offset, independently of channels (no cursor
moves, nothing is FINished), which is what Spark's data source ``nsqx.spark`` needs.

Endpoints (query-string parameters, errors as upstream's ``{"message": CODE}``):

``GET /nsqx/offsets?topic=T[&timestamp_ns=NS]``
    200 JSON ``{"topic": T, "partitions": [{"partition": 0, "earliest": E, "latest": L,
    "synced": S[, "offset_for_timestamp": O]}]}``. ``earliest`` is the first offset still
    kept (in the archive too, with ``--archive-url``), ``latest`` the next offset to be written (records ``[earliest, latest)`` are
    readable), ``synced`` the end of what is fsynced. ``offset_for_timestamp`` is the first
    offset whose timestamp is >= NS (``latest`` when there is none). 404 ``TOPIC_NOT_FOUND``
    (the topic is never created by a read), 400 ``MISSING_ARG_TOPIC``/``INVALID_TOPIC``/
    ``INVALID_TIMESTAMP``.

``GET /nsqx/fetch?topic=T&partition=P&offset=O[&end=E][&max_bytes=B][&headers=1]``
    200 ``application/octet-stream``: whole records from ``O`` (at least one when any is
    readable, at most ``B`` bytes otherwise, never at or past ``E``)::

        header (48 bytes, big endian, struct ">4sBBHQIQQQI"):
          magic "NQXF", version 1, flags (bit 0: headers section follows),
          partition u16, start u64 (offset of the first record; > O when retention
          removed O..start-1), count u32, next_offset u64, earliest u64, latest u64,
          frames_len u32
        frames   frames_len bytes: the stored records, which are ready NSQ message frames
                 [4B size][4B type=2][8B ts ns][2B attempts][16B hex id][body], back to back
        headers  (flag bit 0, asked for with headers=1) u32 n, then n entries
                 [u64 offset][u16 nkeys]([u16 klen][key utf-8][u32 vlen][value])*

    The same range always returns the same bytes (offsets are immutable). ``O`` past
    ``latest``: 416 ``OFFSET_OUT_OF_RANGE``; ``O == latest``: an empty answer (count 0).
    ``B`` defaults to 8 MiB and is capped at 64 MiB. In cluster mode ``latest`` (here and
    in ``/nsqx/offsets``) is the partition's high watermark, the end every in-sync replica
    has: a reader never sees a tail a failover may truncate (``uncommitted=1`` reads to
    the local log's end, for diagnostics). 404 ``TOPIC_NOT_FOUND`` or
    ``PARTITION_NOT_FOUND``; 400 ``INVALID_ARG_*`` for malformed numbers.

``POST /nsqx/pub?topic=T&writer=W&batch=B&task=K[&partition=P][&keys=1]``
    Idempotent publish: the body (upstream's binary MPUB body, ``[u32 n]([u32 size][body])*``;
    with ``keys=1`` each message is ``[u32 klen][key][u32 size][body]`` and a non-empty key is
    stored as the message's ``key`` extension header) is appended at most once per
    ``(W, B, K)`` and topic. 200 JSON ``{"partition": 0, "base": first offset, "count": n,
    "duplicate": bool}``; a duplicate answers the first publish's offsets and appends
    nothing. A retry while the first attempt is still being written waits for it. The key is
    stored in the log itself (extension header ``nsqx-pub`` on the batch's first record) and
    in a small SQLite index under the topic directory (``pubkeys-p<P>.sqlite``); after a
    crash the index is completed from the log's headers, so a key acknowledged once is never
    appended again (``nsqx.nsqd.idempotence``, shared with HTTP ``Idempotency-Key`` and
    idempotent TCP producers). Keys older than 7 days (or ``--idempotency-window`` when
    longer) are forgotten. 400 ``MISSING_ARG_WRITER`` etc., 413 for
    bodies over ``--max-body-size``.

Authorization (nsqd with ``--auth-http-address``): the secret comes from an
``Authorization: Bearer SECRET`` header; offsets and fetch need the ``subscribe`` permission
on the topic (as SUB; an optional ``channel`` parameter is matched as SUB does), pub needs
``publish``. 401 ``AUTH_REQUIRED`` without a secret, 401 ``AUTH_FAILED`` when the auth
server refuses it or cannot be asked, 403 ``UNAUTHORIZED`` when the permission is missing
(``nsqx.nsqd.auth.HTTPAuthorizer``, shared with the operators' endpoints). Answers are
cached for the TTL the auth server gives.

Registered by :func:`add_routes` (called from ``nsqx.nsqd.http.make_app``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nsqx.httpapi import HTTPError, topic_arg
from nsqx.httpapi import first as _first
from nsqx.httpapi import query as _query
from nsqx.nsqd.auth import HTTPAuthorizer
from nsqx.nsqd.channel import load_archived, load_time
from nsqx.nsqd.http_publish import (
    existing_topic,
    parse_mpub_binary,
    read_capped,
)
from nsqx.nsqd.idempotence import deduper_for, leads
from nsqx.protocol.names import valid_channel_name
from nsqx.storage.publish_keys import PUB_KEY_HEADER

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI
    from nsqx.nsqd.topic import Topic

__all__ = ["add_routes", "FETCH_HEADER", "FETCH_MAGIC", "PUB_KEY_HEADER", "encode_fetch_headers"]

log = logging.getLogger("nsqx.nsqd.fetch_api")

FETCH_MAGIC = b"NQXF"
FETCH_VERSION = 1
FETCH_HEADER = struct.Struct(">4sBBHQIQQQI")  # 48 bytes
FLAG_HEADERS = 1
DEFAULT_MAX_BYTES = 8 << 20
MAX_MAX_BYTES = 64 << 20
_U32 = struct.Struct(">I")
_HDR_ENTRY = struct.Struct(">QH")
_U16 = struct.Struct(">H")
_MAX_NAME = 256


def _no_wait() -> None:
    """ready_end's callback for a reader that does not wait (fetch: the client asks again)."""


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json",
                        charset="utf-8")


def _int_arg(params: dict[str, list[str]], key: str, default: int | None = None, *,
             lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    v = _first(params, key)
    if v is None or v == "":
        if default is None:
            raise HTTPError(400, f"MISSING_ARG_{key.upper()}")
        return default
    if not (v.isascii() and v.isdigit()) or not lo <= int(v) <= hi:
        raise HTTPError(400, f"INVALID_ARG_{key.upper()}")
    return int(v)


def _partitions(topic: Topic) -> dict[int, Any]:
    """partition id -> log."""
    return {pid: part.log for pid, part in enumerate(topic.partitions)}


def _partition_objects(topic: Topic) -> dict[int, Topic]:
    return dict(enumerate(topic.partitions))


def readable_end(part: Topic, uncommitted: bool = False) -> int:
    """Where readers stop: the flushed end, or in cluster mode (``hold_reads``) the end every
    in-sync replica has (the high watermark), so a pipeline never reads a tail that a
    failover may truncate. ``uncommitted`` (diagnostics) reads to the flushed end anyway."""
    plog = part.log
    if part.hold_reads and not uncommitted:
        return min(int(part.readable_end), plog.flushed_offset)
    return plog.flushed_offset


def encode_fetch_headers(items: list[tuple[int, dict[str, bytes]]]) -> bytes:
    parts = [_U32.pack(len(items))]
    for off, h in items:
        parts.append(_HDR_ENTRY.pack(off, len(h)))
        for k, v in h.items():
            kb = k.encode()
            parts += (_U16.pack(len(kb)), kb, _U32.pack(len(v)), bytes(v))
    return b"".join(parts)


# ---------------------------------------------------------------- handlers

class FetchAPI:
    """The node's one fetch API: its HTTP and HTTPS apps share the publish-key indexes, so
    the node builds it once (``nsqd.http.http_services``) and hands it to both."""

    def __init__(self, nsqd: NodeAPI, authz: HTTPAuthorizer) -> None:
        self.nsqd = nsqd
        self._authz = authz

    # -- common -----------------------------------------------------------------------
    def _topic(self, name: str) -> Any:
        return existing_topic(self.nsqd, name)

    @staticmethod
    def _channel(params: dict[str, list[str]]) -> str | None:
        ch = _first(params, "channel")
        if ch is not None and not valid_channel_name(ch):
            raise HTTPError(400, "INVALID_CHANNEL")
        return ch

    # -- offsets ----------------------------------------------------------------------
    async def offsets(self, request: web.Request) -> web.Response:
        params = _query(request)
        name = topic_arg(params)
        await self._authz.check(request, name, "subscribe", self._channel(params))
        ts = _first(params, "timestamp_ns")
        ts_ns: int | None = None
        if ts is not None:
            body = ts[1:] if ts[:1] == "-" else ts
            if not (body.isascii() and body.isdigit()):
                raise HTTPError(400, "INVALID_TIMESTAMP")
            ts_ns = int(ts)
        topic = self._topic(name)
        uncommitted = (_first(params, "uncommitted") or "") in ("1", "true")
        out = []
        for pid, part in sorted(_partition_objects(topic).items()):
            plog = part.log
            if ts_ns is not None:
                await load_time(plog, ts_ns)  # the archive's part in a thread
            entry = {"partition": pid, "earliest": plog.earliest_offset,  # (archive too)
                     "latest": readable_end(part, uncommitted), "synced": plog.synced_offset}
            if ts_ns is not None:
                entry["offset_for_timestamp"] = plog.offset_for_time(ts_ns)
            out.append(entry)
        return _json({"topic": name, "partitions": out})

    # -- fetch ------------------------------------------------------------------------
    async def fetch(self, request: web.Request) -> web.Response:
        params = _query(request)
        name = topic_arg(params)
        await self._authz.check(request, name, "subscribe", self._channel(params))
        pid = _int_arg(params, "partition", 0, hi=(1 << 16) - 1)
        offset = _int_arg(params, "offset")
        end = _int_arg(params, "end", (1 << 63) - 1)
        max_bytes = min(_int_arg(params, "max_bytes", DEFAULT_MAX_BYTES, lo=1), MAX_MAX_BYTES)
        want_headers = (_first(params, "headers") or "") in ("1", "true")
        part = _partition_objects(self._topic(name)).get(pid)
        if part is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        plog = part.log
        uncommitted = (_first(params, "uncommitted") or "") in ("1", "true")
        earliest, latest = plog.earliest_offset, readable_end(part, uncommitted)
        if offset > latest:
            raise HTTPError(416, "OFFSET_OUT_OF_RANGE")
        start = max(offset, earliest)
        limit = max(0, min(end, latest) - start)
        if limit and plog.lower is not None and start < plog.start_offset:
            # archived: decoded in a thread, and the read stops where the next group is not
            await load_archived(plog, start)
            limit = min(limit, max(1, plog.ready_end(start, _no_wait) - start))
        if limit:
            r = plog.read(start, max_bytes, limit)
            data, count, nxt = r.data, r.count, r.next_offset
        else:
            data, count, nxt = b"", 0, start
        flags = 0
        tail = b""
        if want_headers:
            flags |= FLAG_HEADERS
            items = []
            for off in range(start, start + count):
                h = plog.headers(off)
                if h:
                    items.append((off, h))
            tail = encode_fetch_headers(items)
        head = FETCH_HEADER.pack(FETCH_MAGIC, FETCH_VERSION, flags, pid, start, count, nxt,
                                 earliest, latest, len(data))
        if len(data) < (64 << 10):
            return web.Response(body=b"".join((head, data, tail)),
                                content_type="application/octet-stream")
        # large answers: the frames go to the socket as they are (no join copy)
        resp = web.StreamResponse()
        resp.content_type = "application/octet-stream"
        resp.content_length = len(head) + len(data) + len(tail)
        await resp.prepare(request)
        await resp.write(head)
        await resp.write(data)
        if tail:
            await resp.write(tail)
        await resp.write_eof()
        return resp

    # -- idempotent publish -----------------------------------------------------------
    @staticmethod
    def _parse_keyed(body: bytes, max_msg: int) -> tuple[list[bytes], list[bytes]]:
        n = len(body)
        if n < 4:
            raise HTTPError(413, "BAD_BODY")
        (count,) = _U32.unpack_from(body, 0)
        if count <= 0 or count > n // 8:
            raise HTTPError(413, "BAD_BODY")
        view = memoryview(body)
        keys: list[bytes] = []
        msgs: list[bytes] = []
        pos = 4
        for _ in range(count):
            if pos + 4 > n:
                raise HTTPError(413, "BAD_MESSAGE")
            (kl,) = _U32.unpack_from(body, pos)
            if kl > 65535 or pos + 8 + kl > n:
                raise HTTPError(413, "BAD_MESSAGE")
            keys.append(bytes(view[pos + 4:pos + 4 + kl]))
            pos += 4 + kl
            (size,) = _U32.unpack_from(body, pos)
            if size <= 0 or size > max_msg or pos + 4 + size > n:
                raise HTTPError(413, "BAD_MESSAGE")
            msgs.append(bytes(view[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if pos != n:
            raise HTTPError(413, "BAD_BODY")
        return msgs, keys

    async def pub(self, request: web.Request) -> web.Response:
        o = self.nsqd.opts
        if (request.content_length or 0) > o.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        params = _query(request)
        name = topic_arg(params)
        ids = []
        for arg in ("writer", "batch", "task"):
            v = _first(params, arg)
            if not v:
                raise HTTPError(400, f"MISSING_ARG_{arg.upper()}")
            if len(v) > _MAX_NAME or "#" in v:
                raise HTTPError(400, f"INVALID_ARG_{arg.upper()}")
            ids.append(v)
        key = ":".join(ids)
        pid = _int_arg(params, "partition", 0, hi=(1 << 16) - 1)
        keyed = (_first(params, "keys") or "") in ("1", "true")
        await self._authz.check(request, name, "publish")
        body = await read_capped(request, o.max_body_size)
        if len(body) > o.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        if keyed:
            msgs, keys = self._parse_keyed(body, o.max_msg_size)
        else:
            msgs = parse_mpub_binary(body, o.max_msg_size, o.max_body_size)
            keys = []
        topic = self.nsqd.get_topic(name)
        if topic is None:
            raise HTTPError(503, "EXITING")
        plog = _partitions(topic).get(pid)
        if plog is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        headers: list[dict[str, bytes] | None] = [
            {"key": k} if k else None for k in keys] if keys else [None] * len(msgs)
        headers[0] = {**(headers[0] or {}), PUB_KEY_HEADER: f"{key}#{len(msgs)}".encode()}
        parts = topic.partitions
        target = parts[pid] if pid < len(parts) else topic
        if target.committer is None:
            raise HTTPError(500, "INTERNAL_ERROR")
        try:
            # in cluster mode only a leader takes it (acked after its ISR); a follower
            # forwards it with its mark, which the leader checks (and says if a repeat)
            if leads(target):
                base, duplicate = await deduper_for(target).publish_async(msgs, 0, headers)
            else:
                again: list[bool] = []
                published = target.publish(msgs, headers=headers,
                                           on_replayed=partial(again.append, True))
                assert published is not None
                base = await published
                duplicate = bool(again)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("TOPIC(%s): idempotent publish %s failed - %s", name, key, exc)
            raise HTTPError(503, "PUB_FAILED") from None
        return _json({"partition": pid, "base": base, "count": len(msgs), "duplicate": duplicate})

    async def close(self, _app: web.Application) -> None:
        """The indexes are the partitions' (closed with them)."""


def add_routes(app: web.Application, api: FetchAPI) -> None:
    """Register /nsqx/offsets, /nsqx/fetch and /nsqx/pub of the node's ``api`` on one of
    its HTTP apps."""
    app.router.add_get("/nsqx/offsets", api.offsets, allow_head=False)
    app.router.add_get("/nsqx/fetch", api.fetch, allow_head=False)
    app.router.add_post("/nsqx/pub", api.pub)
    app.on_cleanup.append(api.close)
