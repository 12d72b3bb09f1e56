"""Upstream's "V1" HTTP API conventions (``internal/http_api``), shared by the servers.

* query-string params even for POST, parsed like Go's ``url.ParseQuery``;
* success bodies are raw (``OK`` text, JSON, or empty);
* errors are ``{"message":"CODE"}`` with upstream's status;
* every response carries ``X-NSQ-Content-Type: nsq; version=1.0``;
* JSON is written like Go's ``encoding/json`` (``<``, ``>``, ``&``, U+2028/9 escaped;
  map keys sorted when asked).

Since nsq 1.0 there is no ``Accept`` negotiation any more: a client sending
``Accept: application/vnd.nsq; version=1.0`` (go-nsq, pynsq, nsqjs) and one sending
nothing get the same V1 answer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from nsqx.httpbase import (
    JSON_TYPE,
    TRACE_SCAN_DEFAULT,
    TRACE_SCAN_MAX,
    V1_HEADER,
    V1_VALUE,
    HTTPError,
    first,
    topic_arg,
)
from nsqx.protocol.names import valid_channel_name, valid_topic_name
from nsqx.storage.message_id import parse_id

__all__ = [
    "JSON_TYPE",
    "V1_HEADER",
    "V1_VALUE",
    "HTTPError",
    "QueryError",
    "TRACE_SCAN_DEFAULT",
    "TRACE_SCAN_MAX",
    "TraceSearch",
    "add_v1_header",
    "client_address",
    "client_fault",
    "make_runner",
    "empty",
    "first",
    "go_json",
    "parse_go_query",
    "query",
    "text",
    "task_dump",
    "topic_channel_args",
    "trace_id_arg",
    "trace_search_args",
    "v1_error",
    "v1_json",
]

class QueryError(ValueError):
    pass


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _unescape(s: str) -> str:
    """Go's url.QueryUnescape: '+' is a space, '%XX' must be two hex digits."""
    if "%" not in s and "+" not in s:
        return s
    raw = s.encode("utf-8", "surrogateescape")
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        b = raw[i]
        if b == 0x25:  # %
            hexpart = raw[i + 1:i + 3]
            if len(hexpart) != 2 or not all(c in _HEX for c in hexpart):
                raise QueryError("invalid URL escape")
            out.append(int(hexpart, 16))
            i += 3
        elif b == 0x2B:  # +
            out.append(0x20)
            i += 1
        else:
            out.append(b)
            i += 1
    return out.decode("utf-8", "surrogateescape")


def parse_go_query(q: str) -> dict[str, list[str]]:
    """Go's url.ParseQuery: '&' separated, ';' refused, bad escapes refused (QueryError)."""
    values: dict[str, list[str]] = {}
    error: str | None = None
    for part in q.split("&"):
        if ";" in part:
            error = error or "invalid semicolon separator in query"
            continue
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            key = _unescape(key)
            value = _unescape(value)
        except QueryError as e:
            error = error or str(e)
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise QueryError(error)
    return values


def query(request: web.Request) -> dict[str, list[str]]:
    """The request's query (upstream ``NewReqParams``); 400 ``INVALID_REQUEST`` if malformed."""
    try:
        return parse_go_query(request.raw_path.partition("?")[2].partition("#")[0])
    except QueryError:
        raise HTTPError(400, "INVALID_REQUEST") from None


_GO_ESCAPES = ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"),
               ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"))


def go_json(data: Any, *, sort_keys: bool = False) -> bytes:
    """JSON as Go's ``json.Marshal`` writes it (``sort_keys`` for Go maps)."""
    out = orjson.dumps(data, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    # those bytes can only occur inside JSON strings, so a plain replace is exact
    for raw, esc in _GO_ESCAPES:
        if raw in out:
            out = out.replace(raw, esc)
    return out


def v1_json(data: Any, *, sort_keys: bool = False) -> web.Response:
    return web.Response(body=go_json(data, sort_keys=sort_keys), content_type=JSON_TYPE,
                        charset="utf-8")


def v1_error(status: int, code: str) -> web.Response:
    return web.Response(status=status, body=go_json({"message": code}), content_type=JSON_TYPE,
                        charset="utf-8")


def text(body: str = "OK", status: int = 200) -> web.Response:
    return web.Response(status=status, text=body, content_type="text/plain", charset="utf-8")


def empty() -> web.Response:
    return web.Response(body=b"")


async def add_v1_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: the V1 marker on every response."""
    response.headers[V1_HEADER] = V1_VALUE


def topic_channel_args(params: dict[str, list[str]]) -> tuple[str, str]:
    """Upstream ``http_api.GetTopicChannelArgs``."""
    topic = topic_arg(params, "INVALID_ARG_TOPIC")
    channel = first(params, "channel")
    if channel is None:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not valid_channel_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


def trace_id_arg(raw: str | None) -> int:
    """A trace id: decimal, below 2**64; 400 ``INVALID_TRACE_ID`` otherwise."""
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 20 or int(raw) >= 1 << 64:
        raise HTTPError(400, "INVALID_TRACE_ID")
    return int(raw)


@dataclass(frozen=True)
class TraceSearch:
    """A checked ``/trace/search`` query: the topic, how many trace events to scan, and
    exactly one of ``msg_id`` (partition, offset), ``trace_id``, ``header`` (key, value)."""

    topic: str
    limit: int = TRACE_SCAN_DEFAULT
    msg_id: tuple[int, int] | None = None
    trace_id: int | None = None
    header: tuple[str, bytes] | None = None

    def search_kw(self) -> dict[str, Any]:
        """Keyword arguments of ``nsqx.nsqd.trace.search_trace`` after the topic."""
        if self.msg_id is not None:
            return {"limit": self.limit, "msg_id": self.msg_id}
        if self.trace_id is not None:
            return {"limit": self.limit, "trace_id": self.trace_id}
        return {"limit": self.limit, "header": self.header}

    def params(self) -> dict[str, str]:
        """The query again as parameters (what nsqlookupd forwards to each nsqd)."""
        out = {"topic": self.topic, "limit": str(self.limit)}
        if self.msg_id is not None:
            part, offset = self.msg_id
            out["id"] = f"{part << 48 | offset:016x}"
        elif self.trace_id is not None:
            out["trace_id"] = str(self.trace_id)
        else:
            assert self.header is not None
            key, value = self.header
            out["header"] = f"{key}:{value.decode('utf-8', 'surrogateescape')}"
        return out


def trace_search_args(params: dict[str, list[str]]) -> TraceSearch:
    """``?topic=T&(id=<16 hex>|trace_id=N|header=<key>:<value>)[&limit=N]``, checked the one
    way nsqd and nsqlookupd both answer it: 400 with the first problem's code, in this
    order: ``MISSING_ARG_TOPIC``, ``INVALID_TOPIC``, ``INVALID_LIMIT``, ``MISSING_ARG_ID``
    (not exactly one of id, trace_id, header), ``INVALID_ID``, ``INVALID_TRACE_ID``,
    ``INVALID_HEADER``."""
    name = first(params, "topic")
    if not name:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not valid_topic_name(name):
        raise HTTPError(400, "INVALID_TOPIC")
    raw_limit = first(params, "limit")
    limit = TRACE_SCAN_DEFAULT
    if raw_limit is not None:
        if not raw_limit.isascii() or not raw_limit.isdigit() or len(raw_limit) > 9 or not (
                0 < int(raw_limit) <= TRACE_SCAN_MAX):
            raise HTTPError(400, "INVALID_LIMIT")
        limit = int(raw_limit)
    mid, tid, hdr = first(params, "id"), first(params, "trace_id"), first(params, "header")
    if sum(x is not None for x in (mid, tid, hdr)) != 1:
        raise HTTPError(400, "MISSING_ARG_ID")
    if mid is not None:
        try:
            return TraceSearch(name, limit, msg_id=parse_id(mid.encode("ascii")))
        except (ValueError, UnicodeEncodeError):
            raise HTTPError(400, "INVALID_ID") from None
    if tid is not None:
        return TraceSearch(name, limit, trace_id=trace_id_arg(tid))
    assert hdr is not None
    key, sep, value = hdr.partition(":")
    if not sep or not key:
        raise HTTPError(400, "INVALID_HEADER")
    return TraceSearch(name, limit, header=(key, value.encode("utf-8", "surrogateescape")))


def task_dump() -> str:
    """Every asyncio task with its stack: the Python analogue of pprof/goroutine."""
    import asyncio
    import io

    buf = io.StringIO()
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    buf.write(f"tasks: {len(tasks)}\n")
    for task in tasks:
        buf.write(f"\n--- {task.get_name()} {task!r}\n")
        try:
            task.print_stack(limit=30, file=buf)
        except Exception as exc:  # a stack can't always be walked
            buf.write(f"(no stack: {exc})\n")
    return buf.getvalue()


# -- the server set-up shared by nsqd, nsqlookupd and nsqadmin ------------------------------

_REASON_MAX = 200  # a client's junk in a log line is cut to this many characters
_NO_HOST = "400 Bad Request: missing required Host header"  # Go's words


def _escaped(text: str) -> str:
    """Client text as it may go into a log line: one line, control bytes escaped, length
    bounded (aiohttp's parser messages span lines and quote the client's bytes)."""
    out = repr(" ".join(text.split()))[1:-1]
    return out if len(out) <= _REASON_MAX else out[:_REASON_MAX] + "..."


def client_address(request: web.BaseRequest) -> str:
    """``host:port`` of the client (only the host once it has hung up)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(request.remote)


def client_fault(request: web.BaseRequest, exc: BaseException) -> str | None:
    """Why ``exc``, raised while a handler read the request, is the client's doing (a body
    aiohttp could not parse, a client that went away mid-body), or None for a real fault
    of ours. The middlewares log the former as one WARNING line, not a traceback."""
    if isinstance(exc, HttpProcessingError):
        return _escaped(exc.message or type(exc).__name__)
    gone = request.transport is None or request.protocol.transport is None
    # aiohttp's body reader raises RuntimeError("Connection closed.") once the client left
    if isinstance(exc, ConnectionError) or (isinstance(exc, RuntimeError) and gone):
        return "connection closed before the request body was read"
    return None


def _go_error(status: int, text: str) -> web.Response:
    """What Go's net/http writes for a request it cannot parse: plain text, then close."""
    resp = _NoServerResponse(status=status, text=text, content_type="text/plain",
                             charset="utf-8")
    resp.force_close()
    return resp


class _NoServerResponse(web.Response):
    """A response without aiohttp's ``Server: Python/... aiohttp/...`` header (the error
    answers written before routing, where no ``on_response_prepare`` hook runs)."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.popall(hdrs.SERVER, None)


async def _drop_server_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: upstream sends no ``Server`` header; aiohttp's names its
    own version, which is nobody's business."""
    response.headers.popall(hdrs.SERVER, None)


class _QuietHandler(RequestHandler):
    """aiohttp's connection handler, but a request it cannot parse (bad Content-Length,
    oversized head, bad chunking...) is the client's mistake: one WARNING line with the
    client's address and the reason, and Go's answer (``400 Bad Request`` or ``431``)
    instead of a traceback at ERROR and aiohttp's parser text. An HTTP/1.1 request without
    ``Host`` gets 400 as RFC 9112 section 3.2 (and Go) say."""

    def __init__(self, manager: Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        inner = self._request_handler
        assert inner is not None

        async def host_checked(request: web.BaseRequest) -> web.StreamResponse:
            if request.version >= HttpVersion11 and hdrs.HOST not in request.headers:
                self.logger.warning("HTTP: bad request from %s - missing Host header",
                                    client_address(request))
                return _go_error(400, _NO_HOST)
            return await inner(request)

        self._request_handler = host_checked

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None
                     ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        self.logger.warning("HTTP: bad request from %s - %s", client_address(request),
                            _escaped(exc.message or type(exc).__name__))
        if request.writer.output_size > 0:
            raise ConnectionError("response already sent")
        if isinstance(exc, LineTooLong):
            return _go_error(431, "431 Request Header Fields Too Large")
        if "'Host'" in (exc.message or ""):  # aiohttp >= 3.14 checks it in the parser
            return _go_error(400, _NO_HOST)
        return _go_error(400, "400 Bad Request")


class _QuietServer(Server):
    """aiohttp's low-level server whose connections are ``_QuietHandler``s. It keeps the loop
    and the connection options it was made with itself (``Server`` keeps them private)."""

    def __init__(self, handler: Any, *, loop: asyncio.AbstractEventLoop,
                 handler_options: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(handler, loop=loop, **kwargs, **handler_options)
        self.handler_loop = loop
        self.handler_options = handler_options

    def __call__(self) -> RequestHandler:
        return _QuietHandler(self, loop=self.handler_loop, **self.handler_options)


class _Runner(web.AppRunner):
    """``AppRunner`` serving with ``_QuietServer``. ``handler_options`` are the connection
    options (``RequestHandler``'s keywords); aiohttp's own server gets them too."""

    def __init__(self, app: web.Application, *, handler_options: dict[str, Any],
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs, **handler_options)
        self.handler_options = handler_options

    async def _make_server(self) -> Server:
        base = await super()._make_server()  # runs the app's startup, freezes it
        loop = asyncio.get_running_loop()
        # what aiohttp's Application gives its server besides ours (nsqx's apps set neither
        # debug nor handler_args: debug is then the loop's)
        options = {"debug": loop.get_debug(), "access_log_class": web.AccessLogger,
                   **self.handler_options}
        return _QuietServer(base.request_handler, request_factory=base.request_factory,
                            handler_cancellation=base.handler_cancellation,
                            loop=loop, handler_options=options)


def make_runner(app: web.Application, logger: logging.Logger, **kwargs: Any) -> web.AppRunner:
    """The ``AppRunner`` every nsqx HTTP listener uses: no access log, no signal handlers,
    no ``Server`` header, and a client's malformed request logged by ``logger`` as one
    WARNING line (see ``_QuietHandler``)."""
    app.on_response_prepare.append(_drop_server_header)
    return _Runner(app, handler_options={"access_log": None, "logger": logger},
                   handle_signals=False, **kwargs)

