"""nsqd's replay and lookup endpoints, in Youzan's shapes: move a channel, read one message.

``POST /channel/setoffset?topic=T&channel=C[&partition=P]``
    Body (Youzan): ``timestamp:<unix seconds>`` | ``virtual_queue:<n>`` | ``msgcount:<n>``;
    also ``offset:<n>``, ``earliest``, ``latest``, ``special:-1`` (latest) and ``special:-2``
    (earliest). With an empty body the same text may come as the query parameter ``to``
    (``?to=earliest``, ``?to=timestamp:1700000000``). ``virtual_queue`` and ``msgcount``
    both name a log offset here: nsqx numbers records, so the message count before a
    record *is* its position (Youzan's ``virtual_queue`` is a byte position in its file).

    A time is a seek in the partition's time index (never a scan of the log): the channel
    restarts at the first message stored at or after it (the log end when there is none).
    An offset below the oldest kept message (retention removed it) is clamped up to it;
    one past the log end is refused (400 ``OFFSET_OUT_OF_RANGE``), because a channel moved
    there would silently skip what is published until the log reaches it.

    Effect (``Channel.seek``): in-flight and ready messages are forgotten (a late FIN of one
    gets ``E_FIN_FAILED ... not in flight``, unless it was delivered again meanwhile: the id
    is the offset), deferred ones before the position are dropped and those at or after it
    keep their delay, finished ranges are forgotten (everything from the position is
    delivered again), a paused channel stays paused. The cursor file is replaced
    atomically (tmp + fsync + rename) before the answer. Ephemeral channels (and channels
    of ephemeral topics, whose log is in memory) move too; their cursor lives in memory
    only, as everything else about them (``"persisted": false``).

    200 JSON ``{"topic", "channel", "partition", "offset", "earliest", "latest", "clamped",
    "persisted"}``. Errors: 400 ``MISSING_ARG_TOPIC``/``INVALID_ARG_TOPIC``/
    ``MISSING_ARG_CHANNEL``/``INVALID_ARG_CHANNEL``, 400 ``E_BAD_PARTITION`` (malformed or
    not a partition of the topic), 400 ``E_INVALID`` (malformed position, negative or huge
    numbers), 400 ``MISSING_POSITION``, 413 ``BODY_TOO_BIG``, 404 ``TOPIC_NOT_FOUND`` /
    ``CHANNEL_NOT_FOUND`` (nothing is created), 400 ``OFFSET_OUT_OF_RANGE``; cluster mode:
    400 ``E_FAILED_ON_NOT_LEADER`` (Youzan's code) where publishes are refused too (not the
    partition's leader, or too few in-sync replicas). Followers mirror the leader's cursor,
    a reset included, so a failover resumes from the new position.

``GET /message/get?topic=T[&partition=P]&search_mode=id|count|virtual_offset&search_pos=X[&raw=1]``
    One message of a partition, found by id (``X`` the 16-hex-digit id a consumer sees, or
    its value in decimal as Youzan's numeric ids; the partition comes from the id; a message
    moved from Go nsqd by ``nsqx import`` is found by its Go id) or by
    log offset (``count`` and ``virtual_offset`` both: see above). 200 JSON::

        {"id": "000000000000002a", "partition": 0, "offset": 42, "queue_cnt_index": 42,
         "timestamp": <ns>, "attempts": 1, "body": "...", "body_encoding": "utf-8"|"base64",
         "headers": {"k": "v"}, "headers_base64": ["k2"]}

    ``body`` is the text when the body is valid UTF-8, otherwise base64 (``body_encoding``
    says which); a header value that is not UTF-8 is base64 and its key is listed in
    ``headers_base64``. ``attempts`` is the stored count (1): delivery attempts are per
    channel. With ``raw=1`` the answer is the body itself (``application/octet-stream``)
    with the metadata in ``X-Nsqx-Message-Id``, ``X-Nsqx-Partition``, ``X-Nsqx-Offset``,
    ``X-Nsqx-Timestamp`` and ``X-Nsqx-Attempts`` headers. 404 ``MESSAGE_NOT_FOUND`` for an
    offset not written yet or removed by retention (or a topic whose log is in memory and
    has dropped it), 404 ``TOPIC_NOT_FOUND``, 400 ``E_INVALID`` (bad id, mode or position),
    400 ``E_BAD_PARTITION`` (bad partition, or one that disagrees with the id's).

Authorization (nsqd with ``--auth-http-address``, checked before the handler by
``nsqx.nsqd.http``): ``/message/get`` reads message bodies, so it needs the ``subscribe``
permission on the topic as ``/nsqx/fetch`` does (same ``Authorization: Bearer`` secret);
``/channel/setoffset`` moves a channel like the other channel actions: ``publish`` on the
topic with the channel matching (``nsqx.nsqd.auth.OPERATOR_RULES``).

Registered by :func:`add_routes` (called from ``nsqx.nsqd.http.make_app``).
"""

from __future__ import annotations

import base64
import logging
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nsqx.httpapi import HTTPError, topic_arg, topic_channel_args
from nsqx.httpapi import first as _first
from nsqx.httpapi import query as _query
from nsqx.nsqd.channel import NotLeader, SeekError, load_archived, load_position
from nsqx.nsqd.http_publish import existing_topic, read_capped
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.routes import RouteError
from nsqx.protocol.v2 import StartKind, StartPosition, parse_start_position
from nsqx.storage.imported_ids import locate_all as locate_imported
from nsqx.storage.message_id import MAX_OFFSET, MAX_PARTITION
from nsqx.storage.records import LogError

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI

__all__ = ["add_routes", "message_json", "split_position_arg"]

log = logging.getLogger("nsqx.nsqd.replay_api")

MAX_POSITION_BODY = 256
SEARCH_MODES = ("id", "count", "virtual_offset")


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json",
                        charset="utf-8")


def partition_of(topic: Any, raw: str | None) -> Any:
    """``topic.partitions[p]`` for a ``partition`` argument (absent: 0); 400 E_BAD_PARTITION."""
    if raw is None or raw == "":
        return topic.partitions[0]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 5:
        raise HTTPError(400, "E_BAD_PARTITION")
    p = int(raw)
    if p >= len(topic.partitions):
        raise HTTPError(400, "E_BAD_PARTITION")
    return topic.partitions[p]


def split_position_arg(body: bytes, params: dict[str, list[str]]) -> StartPosition:
    """The position of a setoffset request: the body, or ``to=`` when the body is empty."""
    raw = body.strip()
    if not raw:
        q = _first(params, "to")
        if not q:
            raise HTTPError(400, "MISSING_POSITION")
        raw = q.encode("utf-8", "surrogateescape")
    try:
        return parse_start_position(raw)
    except ProtocolError:
        raise HTTPError(400, "E_INVALID") from None


def _text_or_b64(value: bytes) -> tuple[str, bool]:
    try:
        return value.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), True


def message_json(partition: int, offset: int, frame: bytes,
                 headers: dict[str, bytes] | None) -> dict[str, Any]:
    """A stored frame ``[size][type][ts][attempts][id][body]`` as /message/get's JSON."""
    body, b64 = _text_or_b64(bytes(frame[34:]))
    hdrs: dict[str, str] = {}
    hdr_b64: list[str] = []
    for k, v in (headers or {}).items():
        hdrs[k], is_b64 = _text_or_b64(bytes(v))
        if is_b64:
            hdr_b64.append(k)
    return {
        "id": bytes(frame[18:34]).decode("ascii", "replace"),
        "partition": partition,
        "offset": offset,
        "queue_cnt_index": offset,
        "timestamp": int.from_bytes(frame[8:16], "big"),
        "attempts": int.from_bytes(frame[16:18], "big"),
        "body": body,
        "body_encoding": "base64" if b64 else "utf-8",
        "headers": hdrs,
        "headers_base64": hdr_b64,
    }


def _parse_id(pos: str) -> tuple[int, int]:
    """(partition, offset) of a search_pos in id mode: 16 hex digits, or decimal."""
    if len(pos) == 16 and all(c in "0123456789abcdefABCDEF" for c in pos):
        v = int(pos, 16)
    elif pos.isascii() and pos.isdigit() and len(pos) <= 20:
        v = int(pos)
    else:
        raise HTTPError(400, "E_INVALID")
    p, off = v >> 48, v & MAX_OFFSET
    if p > MAX_PARTITION:
        raise HTTPError(400, "E_INVALID")
    return p, off


def _imported(topic: Any, pid: int, offset: int) -> tuple[int, int] | None:
    """(partition, offset) of a message ``nsqx import`` moved from Go nsqd, by its Go id
    (one whose top bits name no partition); None for any other id or no such topic."""
    if topic is None or pid < len(topic.partitions):
        return None
    found = locate_imported(((t.partition, t.log.imported) for t in topic.partitions),
                            pid << 48 | offset)
    return found[0] if found else None


class _ReplayAPI:
    def __init__(self, nsqd: NodeAPI) -> None:
        self.nsqd = nsqd

    def _topic(self, name: str) -> Any:
        return existing_topic(self.nsqd, name)

    # -- POST /channel/setoffset ---------------------------------------------------------
    async def set_offset(self, request: web.Request) -> web.Response:
        params = _query(request)
        tname, cname = topic_channel_args(params)
        if (request.content_length or 0) > MAX_POSITION_BODY:
            raise HTTPError(413, "BODY_TOO_BIG")
        body = await read_capped(request, MAX_POSITION_BODY)
        if len(body) > MAX_POSITION_BODY:
            raise HTTPError(413, "BODY_TOO_BIG")
        pos = split_position_arg(body, params)
        topic = self._topic(tname)
        if topic.routes is not None:  # route-managed: every partition, versions walked again
            try:  # archived row groups the position names: read in a thread
                for p in topic.partitions if pos.kind in (StartKind.EARLIEST, StartKind.TIMESTAMP) else ():
                    await load_position(p, pos)
            except LogError as exc:
                log.error("TOPIC(%s) CHANNEL(%s): setoffset failed - %s", tname, cname, exc)
                raise HTTPError(500, str(exc)) from None
            return self._set_route_offset(topic, tname, cname, pos, request, params)
        part = partition_of(topic, _first(params, "partition"))
        channel = part.get_channel(cname, create=False)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        try:
            await load_position(part, pos)  # an archived row group: read in a thread
            res = channel.seek(pos, f"HTTP client {request.remote}")
        except NotLeader as exc:
            log.info("TOPIC(%s) CHANNEL(%s): setoffset refused - %s", tname, cname, exc)
            raise HTTPError(400, "E_FAILED_ON_NOT_LEADER") from None
        except SeekError as exc:
            log.info("TOPIC(%s) CHANNEL(%s): setoffset refused - %s", tname, cname, exc)
            raise HTTPError(400, "OFFSET_OUT_OF_RANGE") from None
        except LogError as exc:  # the archive: E_ARCHIVE_CORRUPT <file> ..., or unreachable
            log.error("TOPIC(%s) CHANNEL(%s): setoffset failed - %s", tname, cname, exc)
            raise HTTPError(500, str(exc)) from None
        return _json({"topic": tname, "channel": cname, "partition": part.partition,
                      "offset": res.offset, "earliest": res.earliest, "latest": res.latest,
                      "clamped": res.clamped, "persisted": res.persisted})

    def _set_route_offset(self, topic: Any, tname: str, cname: str, pos: Any,
                          request: web.Request, params: dict[str, list[str]]) -> web.Response:
        if _first(params, "partition"):
            raise HTTPError(400, "E_BAD_PARTITION")  # the barrier moves all partitions at once
        if topic.get_channel(cname, create=False) is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        try:
            state = topic.routes.reset_channel(cname, pos, f"HTTP client {request.remote}")
        except RouteError as exc:
            raise HTTPError(400, str(exc)) from None
        except NotLeader:
            raise HTTPError(400, "E_FAILED_ON_NOT_LEADER") from None
        return _json({"topic": tname, "channel": cname, "route_version": state.version,
                      "partitions": {str(p.partition): p.channels[cname].next_read
                                     for p in topic.partitions if cname in p.channels}})

    # -- GET /message/get ----------------------------------------------------------------
    async def message_get(self, request: web.Request) -> web.Response:
        params = _query(request)
        tname = topic_arg(params, "INVALID_ARG_TOPIC")
        mode = _first(params, "search_mode") or "id"
        if mode not in SEARCH_MODES:
            raise HTTPError(400, "E_INVALID")
        pos = _first(params, "search_pos")
        if not pos:
            raise HTTPError(400, "MISSING_ARG_SEARCH_POS")
        praw = _first(params, "partition")
        if mode == "id":
            pid, offset = _parse_id(pos)
            if praw not in (None, "") and not (praw.isascii() and praw.isdigit()
                                               and len(praw) <= 5 and int(praw) == pid):
                raise HTTPError(400, "E_BAD_PARTITION")
            praw = str(pid)
            hit = _imported(self.nsqd.topics.get(tname), pid, offset)
            if hit is not None:  # an imported message by its Go id
                praw, offset = str(hit[0]), hit[1]
        else:
            if not (pos.isascii() and pos.isdigit()) or len(pos) > 20:
                raise HTTPError(400, "E_INVALID")
            offset = int(pos)
        part = partition_of(self._topic(tname), praw)
        plog = part.log
        try:
            if offset >= 0:
                await load_archived(plog, offset)  # an archived row group: in a thread
            frame = plog.read_frame(offset)
        except (KeyError, ValueError):
            raise HTTPError(404, "MESSAGE_NOT_FOUND") from None
        except LogError as exc:  # an archived offset whose file is unreadable (names it)
            raise HTTPError(500, str(exc)) from None
        if (_first(params, "raw") or "") in ("1", "true"):
            return web.Response(body=bytes(frame[34:]), content_type="application/octet-stream",
                                headers={"X-Nsqx-Message-Id": bytes(frame[18:34]).decode(),
                                         "X-Nsqx-Partition": str(part.partition),
                                         "X-Nsqx-Offset": str(offset),
                                         "X-Nsqx-Timestamp": str(int.from_bytes(frame[8:16],
                                                                                "big")),
                                         "X-Nsqx-Attempts": str(int.from_bytes(frame[16:18],
                                                                               "big"))})
        return _json(message_json(part.partition, offset, frame, plog.headers(offset)))


def add_routes(app: web.Application, nsqd: NodeAPI) -> None:
    """Register /channel/setoffset and /message/get."""
    api = _ReplayAPI(nsqd)
    app.router.add_post("/channel/setoffset", api.set_offset)
    app.router.add_get("/message/get", api.message_get, allow_head=False)
