"""HTTP for message headers and tracing (Youzan's shapes where Youzan has them).

``POST /pub_ext?topic=T[&partition=P]&ext=<json>``
    Publish the body with headers: ``ext`` is a JSON object of strings; ``X-Nsqext-<key>:
    value`` request headers add/override keys (lowercased, as Youzan). Errors: 400
    ``E_INVALID_JSON_HEADER`` (missing, bad JSON, not an object of strings; a request line
    over 8 KiB is refused by the HTTP server first, so the 65,535-byte cap is not reached),
    ``INVALID_TRACE_ID``, ``E_BAD_TAG``, ``E_EXT_NOT_SUPPORT`` (topic created with
    ``extend=false``), and /pub's own (``MSG_EMPTY``, ``MSG_TOO_BIG``, ``E_BAD_PARTITION``).
    With a ``##trace_id`` the answer is Youzan's traced JSON, else ``OK``.
``POST /pubtrace?topic=T&trace_id=N[&partition=P]``
    Publish with trace id N (kept as the ``##trace_id`` header); answers
    ``{"status":"OK","id":<n>,"trace_id":"N","queue_offset":<n>,"rawsize":<n>}``.
``POST /topic/trace?topic=T&enable=true|false``
    Trace T's messages (every partition) or stop; persisted in ``nsqd.dat``. Youzan's
    ``POST /message/trace/enable?topic=T`` and ``/message/trace/disable?topic=T`` do the
    same (their per-channel ``channel=`` is not supported: 400 ``INVALID_ARG_CHANNEL``).
    404 ``TOPIC_NOT_FOUND``; 400 ``INVALID_TOPIC`` for ``__trace`` itself.
``GET /trace/search?topic=T&(id=<16 hex>|trace_id=N|header=<key>:<value>)[&limit=N]``
    Timelines of T's matching messages from ``__trace`` (see ``trace.search_trace``: a scan
    of the newest ``limit`` events, default 200,000, at most 2,000,000; not an index). The
    query is checked by ``nsqx.httpapi.trace_search_args``, as nsqlookupd's fan-out checks it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nsqx.httpapi import HTTPError, topic_arg, trace_search_args
from nsqx.httpapi import first as _first
from nsqx.httpapi import query as _query
from nsqx.httpapi import trace_id_arg as _trace_id
from nsqx.nsqd.http_publish import (
    idempotency_key,
    mark_replayed,
    partition_arg,
    publish,
    publish_once,
    read_message,
)
from nsqx.nsqd.trace import TRACE_TOPIC, search_trace
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.names import valid_topic_name
from nsqx.protocol.v2 import TRACE_ID_KEY, parse_ext_json

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI

log = logging.getLogger("nsqx.nsqd.http")

__all__ = ["add_routes"]

EXT_HEADER_PREFIX = "x-nsqext-"


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


class _TraceAPI:
    def __init__(self, nsqd: NodeAPI) -> None:
        self.nsqd = nsqd

    # -- publishing ------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> bytes:
        return await read_message(request, self.nsqd.opts.max_msg_size)

    async def _pub(self, request: web.Request, headers: dict[str, bytes] | None,
                   params: dict[str, list[str]], body: bytes, kind: str) -> tuple[int, int, bool]:
        """(partition, base, replayed): with an ``Idempotency-Key``, at most once."""
        name = topic_arg(params)
        if headers:
            topic = self.nsqd.topics.get(name)
            if topic is not None and not topic.ext and any(k[:2] != "##" for k in headers):
                raise HTTPError(400, "E_EXT_NOT_SUPPORT")
        key = idempotency_key(request)
        if key is not None:
            return await publish_once(self.nsqd, name, [body], 0, partition_arg(params), key=key,
                                      kind=kind, headers=[headers] if headers else None,
                                      producer=request.remote or "")
        part, base = await publish(self.nsqd, name, [body], 0, partition_arg(params),
                                   headers=[headers] if headers else None,
                                   producer=request.remote or "")
        return part, base, False

    @staticmethod
    def _traced(part: int, base: int, trace_id: str, body: bytes) -> web.Response:
        return _json({"status": "OK", "id": (part << 48) | base, "trace_id": trace_id,
                      "queue_offset": base, "rawsize": 30 + len(body)})

    async def pub_ext(self, request: web.Request) -> web.Response:
        params = _query(request)
        raw = _first(params, "ext")
        if not raw:
            raise HTTPError(400, "E_INVALID_JSON_HEADER")
        try:
            headers = parse_ext_json(raw.encode("utf-8", "surrogateescape"))
            for key, value in request.headers.items():
                if key.lower().startswith(EXT_HEADER_PREFIX) and len(key) > len(EXT_HEADER_PREFIX):
                    headers[key[len(EXT_HEADER_PREFIX):].lower()] = value.encode("utf-8", "surrogateescape")
            if headers:  # the X-Nsqext-* ones pass the same checks
                parse_ext_json(orjson.dumps({k: v.decode("utf-8", "replace")
                                             for k, v in headers.items()}))
        except ProtocolError as exc:
            raise HTTPError(400, exc.code) from None
        body = await self._body(request)
        part, base, replayed = await self._pub(request, headers or None, params, body, "pub_ext")
        tid = headers.get(TRACE_ID_KEY)
        if tid is not None:
            return mark_replayed(self._traced(part, base, tid.decode(), body), replayed)
        return mark_replayed(web.Response(text="OK", content_type="text/plain", charset="utf-8"),
                         replayed)

    async def pub_trace(self, request: web.Request) -> web.Response:
        params = _query(request)
        raw = _first(params, "trace_id")
        tid = _trace_id(raw)
        body = await self._body(request)
        part, base, replayed = await self._pub(
            request, {TRACE_ID_KEY: b"%d" % tid} if tid else None, params, body, "pubtrace")
        return mark_replayed(self._traced(part, base, str(tid), body), replayed)

    # -- switch ----------------------------------------------------------------------------
    def _topic(self, params: dict[str, list[str]]) -> Any:
        name = _first(params, "topic")
        if not name:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not valid_topic_name(name) or name == TRACE_TOPIC:
            raise HTTPError(400, "INVALID_TOPIC")
        topic = self.nsqd.topics.get(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic

    def _switch(self, params: dict[str, list[str]], on: bool) -> web.Response:
        if _first(params, "channel"):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        topic = self._topic(params)
        self.nsqd.tracer.set_traced(topic, on)
        self.nsqd.metadata_changed()
        self.nsqd.persist_metadata()
        return _json({"topic": topic.name, "trace": on})

    async def topic_trace(self, request: web.Request) -> web.Response:
        params = _query(request)
        raw = (_first(params, "enable") or "").lower()
        if raw not in ("true", "false", "1", "0"):
            raise HTTPError(400, "INVALID_ARG_ENABLE")
        return self._switch(params, raw in ("true", "1"))

    async def trace_enable(self, request: web.Request) -> web.Response:
        return self._switch(_query(request), True)

    async def trace_disable(self, request: web.Request) -> web.Response:
        return self._switch(_query(request), False)

    # -- search ----------------------------------------------------------------------------
    async def search(self, request: web.Request) -> web.Response:
        args = trace_search_args(_query(request))  # the check nsqlookupd's fan-out shares
        return _json(search_trace(self.nsqd, args.topic, **args.search_kw()))


def add_routes(app: web.Application, nsqd: NodeAPI) -> None:
    api = _TraceAPI(nsqd)
    r = app.router
    r.add_post("/pub_ext", api.pub_ext)
    r.add_post("/pubtrace", api.pub_trace)
    r.add_post("/topic/trace", api.topic_trace)
    r.add_post("/message/trace/enable", api.trace_enable)
    r.add_post("/message/trace/disable", api.trace_disable)
    r.add_get("/trace/search", api.search, allow_head=False)
