"""nsqd's HTTP API (upstream nsqd/http.go, "V1" conventions) on aiohttp.

Everything a stock client or ``curl`` sees is upstream's: query-string params
even for POST, raw bodies, errors as ``{"message":"CODE"}`` with upstream's
status, and ``X-NSQ-Content-Type: nsq; version=1.0`` on every response (go-nsq
needs it to not look for a pre-1.0 envelope). Bodies are read with a cap so a
huge upload is refused without being buffered. A bug in a handler answers 500
``INTERNAL_ERROR``; the traceback goes to the log, never to the client. With
``--auth-http-address`` the operators' endpoints (``nsqx.nsqd.auth.OPERATOR_RULES``) need
the permission a client's ``Authorization: Bearer SECRET`` grants; ``/pub`` and ``/mpub``
need none, as upstream.

The handlers talk to the node only through the NSQD/Topic/Channel facade of
the shared contract (see ``make_app``).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.httpapi import (
    JSON_TYPE,
    V1_HEADER,
    V1_VALUE,
    HTTPError,
    client_address,
    client_fault,
    make_runner,
    parse_go_query,
    task_dump,
    topic_arg,
    topic_channel_args,
)
from nsqx.httpapi import first as _first
from nsqx.httpapi import query as _query
from nsqx.nsqd import config_api, fetch_api, replay_api, routes_api, trace_api
from nsqx.nsqd.auth import OPERATOR_RULES, HTTPAuthorizer
from nsqx.nsqd.http_publish import (
    existing_topic,
    idempotency_key,
    mark_replayed,
    parse_mpub_binary,
    partition_arg,
    publish,
    publish_once,
    read_capped,
    read_message,
    route_version_arg,
    split_text_mpub,
)
from nsqx.nsqd.metrics import memory_stats, prometheus_text
from nsqx.nsqd.options import LOG_LEVELS, TLS_REQUIRED
from nsqx.nsqd.routes_api import create_routed
from nsqx.nsqd.stats_text import format_stats

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI

__all__ = ["HTTPError", "HTTPServices", "http_services", "make_app", "make_runner", "parse_go_query", "parse_mpub_binary"]

log = logging.getLogger("nsqx.nsqd.http")

# upstream's boolParams: anything else means "not given" (or "true" for /mpub binary)
BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}

_PY_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
                  "error": logging.ERROR, "fatal": logging.CRITICAL}

NSQD_KEY = web.AppKey("nsqd", object)



async def _maybe_await(result: Any) -> Any:
    if inspect.isawaitable(result):
        return await result
    return result


def _v1_error(status: int, code: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"message": code}),
                        content_type=JSON_TYPE, charset="utf-8")


def _v1_json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type=JSON_TYPE, charset="utf-8")


def _ok_text(text: str = "OK") -> web.Response:
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


def _empty() -> web.Response:
    return web.Response(body=b"")


# ---------------------------------------------------------------- the app

class _Handlers:
    def __init__(self, nsqd: NodeAPI) -> None:
        self.nsqd = nsqd

    @property
    def opts(self) -> Any:
        return self.nsqd.opts

    # -- basics ------------------------------------------------------------------------
    async def ping(self, request: web.Request) -> web.Response:
        health = self.nsqd.health()
        if not self.nsqd.is_healthy():
            return web.Response(status=500, text=health, content_type="text/plain",
                                charset="utf-8")
        return _ok_text(health)

    async def info(self, request: web.Request) -> web.Response:
        o = self.opts
        return _v1_json({
            "version": NSQ_VERSION,
            "broadcast_address": o.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.nsqd.http_port,
            "tcp_port": self.nsqd.tcp_port,
            "start_time": int(self.nsqd.start_time),
            "max_heartbeat_interval": round(o.max_heartbeat_interval * 1e9),
            "max_output_buffer_size": o.max_output_buffer_size,
            "max_output_buffer_timeout": round(o.max_output_buffer_timeout * 1e9),
            "max_deflate_level": o.max_deflate_level,
            "topology_zone": o.topology_zone,
            "topology_region": o.topology_region,
        })

    # -- publishing --------------------------------------------------------------------
    async def pub(self, request: web.Request) -> web.Response:
        body = await read_message(request, self.opts.max_msg_size)
        params = _query(request)
        name = topic_arg(params)
        defer_ms = 0
        ds = _first(params, "defer")
        if ds is not None:
            body_ = ds[1:] if ds[:1] in ("+", "-") else ds
            if not body_.isascii() or not body_.isdigit():
                raise HTTPError(400, "INVALID_DEFER")
            defer_ms = int(ds)
            if defer_ms < 0 or defer_ms >= 2**63 or defer_ms > self.opts.max_delay_ms:
                raise HTTPError(400, "INVALID_DEFER")
        key = idempotency_key(request)
        if key is not None:
            _, _, replayed = await publish_once(
                self.nsqd, name, [body], defer_ms, partition_arg(params), key=key, kind="pub",
                producer=request.remote or "", route_version=route_version_arg(params))
            return mark_replayed(_ok_text(), replayed)
        await publish(self.nsqd, name, [body], defer_ms, partition_arg(params),
                      producer=request.remote or "", route_version=route_version_arg(params))
        return _ok_text()

    async def mpub(self, request: web.Request) -> web.Response:
        o = self.opts
        if (request.content_length or 0) > o.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        params = _query(request)
        name = topic_arg(params)
        binary = False
        bv = _first(params, "binary")
        if bv is not None:
            binary = BOOL_PARAMS.get(bv, True)  # unknown values mean true (deprecated)
        body = await read_capped(request, o.max_body_size)
        if binary:
            if len(body) > o.max_body_size:
                raise HTTPError(413, "BODY_TOO_BIG")
            msgs = parse_mpub_binary(body, o.max_msg_size, o.max_body_size)
        else:
            msgs = split_text_mpub(body, o.max_msg_size, o.max_body_size)
        key = idempotency_key(request)
        if key is not None:
            _, _, replayed = await publish_once(
                self.nsqd, name, msgs, 0, partition_arg(params), key=key,
                kind="mpub-bin" if binary else "mpub", producer=request.remote or "",
                route_version=route_version_arg(params))
            return mark_replayed(_ok_text(), replayed)
        await publish(self.nsqd, name, msgs, 0, partition_arg(params), producer=request.remote or "",
                      route_version=route_version_arg(params))
        return _ok_text()

    # -- topics ------------------------------------------------------------------------
    def _topic_arg(self, request: web.Request, *, validate: bool) -> str:
        return topic_arg(_query(request), "INVALID_TOPIC" if validate else None)

    def _existing_topic(self, name: str) -> Any:
        return existing_topic(self.nsqd, name)

    async def topic_create(self, request: web.Request) -> web.Response:
        """Upstream's create, plus Youzan's ``partition_num=P`` and ``orderedmulti=true``."""
        name = self._topic_arg(request, validate=True)
        params = _query(request)
        raw = _first(params, "partition_num")
        ordered = (_first(params, "orderedmulti") or "").lower() == "true"
        extend = _first(params, "extend")
        if extend is not None and extend.lower() not in ("true", "false"):
            raise HTTPError(400, "INVALID_EXTEND")
        if extend is not None:
            existing = self.nsqd.topics.get(name)
            if existing is not None and existing.ext != (extend.lower() == "true"):
                raise HTTPError(400, "TOPIC_EXISTS")
            if existing is None:
                topic = self.nsqd.get_topic(name)
                if topic is not None and extend.lower() == "false":
                    for part in topic.partitions:
                        part.ext = False
                    self._persist_metadata()
        if _first(params, "logical") is not None:  # a route-managed ordered topic
            await create_routed(self.nsqd, name, params)
            return _empty()
        if raw is None and not ordered:
            self.nsqd.get_topic(name)
            return _empty()
        if raw is not None and (not raw.isdigit() or not 1 <= int(raw) <= 1024):
            raise HTTPError(400, "INVALID_PARTITION_NUM")
        count = int(raw) if raw is not None else 1
        existing = self.nsqd.topics.get(name)
        if existing is not None and (len(existing.partitions) != count
                                     or existing.ordered != ordered):
            raise HTTPError(400, "TOPIC_EXISTS")
        if name.endswith("#ephemeral") and (count > 1 or ordered):
            raise HTTPError(400, "INVALID_PARTITION_NUM")
        self.nsqd.ensure_partitions(name, count, ordered=ordered)
        self._persist_metadata()
        return _empty()

    async def topic_delete(self, request: web.Request) -> web.Response:
        name = self._topic_arg(request, validate=False)
        cluster_delete = self.nsqd.topic_delete_hook
        if cluster_delete is not None:  # cluster mode: every replica and the metadata
            await cluster_delete(name)  # idempotent, as nsqlookupd's: 200 for a name gone
            return _empty()
        try:
            await _maybe_await(self.nsqd.delete_topic(name))
        except KeyError:
            raise HTTPError(404, "TOPIC_NOT_FOUND") from None
        return _empty()

    async def topic_empty(self, request: web.Request) -> web.Response:
        topic = self._existing_topic(self._topic_arg(request, validate=True))
        await _maybe_await(topic.empty())
        self._persist_metadata()  # answered only once kept: a crash must not refill it
        return _empty()

    async def _topic_pause(self, request: web.Request, pause: bool) -> web.Response:
        topic = self._existing_topic(self._topic_arg(request, validate=False))
        await _maybe_await(topic.pause() if pause else topic.unpause())
        self._persist_metadata()
        return _empty()

    async def topic_pause(self, request: web.Request) -> web.Response:
        return await self._topic_pause(request, True)

    async def topic_unpause(self, request: web.Request) -> web.Response:
        return await self._topic_pause(request, False)

    def _persist_metadata(self) -> None:
        # upstream persists right away so a crash can't silently (un)pause; failure isn't fatal
        try:
            self.nsqd.persist_metadata()
        except Exception as exc:
            log.error("failed to persist metadata - %s", exc)

    # -- channels ----------------------------------------------------------------------
    def _topic_channel(self, request: web.Request) -> tuple[Any, str]:
        tname, cname = topic_channel_args(_query(request))
        return self._existing_topic(tname), cname

    def _existing_channel(self, topic: Any, name: str) -> Any:
        channel = topic.get_channel(name, create=False)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    async def channel_create(self, request: web.Request) -> web.Response:
        topic, cname = self._topic_channel(request)
        topic.get_channel(cname)
        # answered only once nsqd.dat names it, as /topic/create: the deferred write of a
        # busy disk (metadata_changed coalesces) must not let a SIGKILL forget the channel
        self._persist_metadata()
        return _empty()

    async def channel_delete(self, request: web.Request) -> web.Response:
        topic, cname = self._topic_channel(request)
        try:
            await _maybe_await(topic.delete_channel(cname))
        except KeyError:
            raise HTTPError(404, "CHANNEL_NOT_FOUND") from None
        return _empty()

    async def channel_empty(self, request: web.Request) -> web.Response:
        topic, cname = self._topic_channel(request)
        channel = self._existing_channel(topic, cname)
        await _maybe_await(channel.empty())
        return _empty()

    async def _channel_pause(self, request: web.Request, pause: bool) -> web.Response:
        topic, cname = self._topic_channel(request)
        channel = self._existing_channel(topic, cname)
        await _maybe_await(channel.pause() if pause else channel.unpause())
        self._persist_metadata()
        return _empty()

    async def channel_pause(self, request: web.Request) -> web.Response:
        return await self._channel_pause(request, True)

    async def channel_unpause(self, request: web.Request) -> web.Response:
        return await self._channel_pause(request, False)

    # -- stats -------------------------------------------------------------------------
    async def stats(self, request: web.Request) -> web.Response:
        params = _query(request)
        json_format = _first(params, "format") == "json"
        topic = _first(params, "topic") or None
        channel = _first(params, "channel") or None
        include_clients = BOOL_PARAMS.get(_first(params, "include_clients") or "", True)
        include_mem = BOOL_PARAMS.get(_first(params, "include_mem") or "", True)
        stats = self.nsqd.stats_dict(topic=topic, channel=channel,
                                     include_clients=include_clients, include_mem=include_mem)
        health = self.nsqd.health()
        memory = (stats.get("memory") or memory_stats()) if include_mem else None
        if not json_format:
            text = format_stats(stats, memory, health, float(self.nsqd.start_time))
            return _ok_text(text)
        out: dict[str, Any] = {
            "version": NSQ_VERSION,
            "health": health,
            "start_time": int(self.nsqd.start_time),
            "topics": stats.get("topics") or [],
        }
        if memory is not None:
            out["memory"] = memory
        out["producers"] = stats.get("producers")
        return _v1_json(out)

    async def metrics(self, request: web.Request) -> web.Response:
        stats = self.nsqd.stats_dict(include_clients=False, include_mem=False)
        text = prometheus_text(stats, healthy=self.nsqd.is_healthy(),
                               node_id=self.opts.node_id,
                               start_time=float(self.nsqd.start_time))
        return web.Response(body=text.encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # -- config ------------------------------------------------------------------------
    async def config(self, request: web.Request) -> web.Response:
        opt = request.match_info["opt"]
        if request.method == "PUT":
            limit = self.opts.max_msg_size
            body = await read_capped(request, limit)
            if len(body) > limit or not body:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    addrs = orjson.loads(body)
                except orjson.JSONDecodeError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                if addrs is None:
                    addrs = []
                if not isinstance(addrs, list) or not all(isinstance(a, str) for a in addrs):
                    raise HTTPError(400, "INVALID_VALUE")
                self.nsqd.set_lookupd_tcp_addresses(addrs)
            elif opt == "log_level":
                try:
                    level = body.decode("utf-8").lower()
                except UnicodeDecodeError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                if level not in LOG_LEVELS:
                    raise HTTPError(400, "INVALID_VALUE")
                self.opts.log_level = level
                logging.getLogger("nsqx").setLevel(_PY_LOG_LEVELS[level])
            else:
                raise HTTPError(400, "INVALID_OPTION")
        try:
            value = self.opts.go_value(opt)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None
        return _v1_json(value)

    # -- debug -------------------------------------------------------------------------
    async def debug_tasks(self, request: web.Request) -> web.Response:
        return _ok_text(task_dump())

    async def free_memory(self, request: web.Request) -> web.Response:
        gc.collect()
        return _empty()


@web.middleware
async def _v1_errors(request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
    start = time.perf_counter()
    status = 200
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except HTTPError as e:
        status = e.status
        return _v1_error(e.status, e.code)
    except web.HTTPMethodNotAllowed:
        status = 405
        return _v1_error(405, "METHOD_NOT_ALLOWED")
    except web.HTTPNotFound:
        status = 404
        return _v1_error(404, "NOT_FOUND")
    except web.HTTPException as e:
        status = e.status
        if e.status >= 400:
            return _v1_error(e.status, (e.reason or "ERROR").upper().replace(" ", "_"))
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        if (reason := client_fault(request, exc)) is not None:
            status = 400
            log.warning("HTTP: bad request from %s - %s", client_address(request), reason)
            return _v1_error(400, "INVALID_REQUEST")
        status = 500
        log.error("panic in HTTP handler %s %s", request.method, request.path,
                  exc_info=sys.exc_info())
        return _v1_error(500, "INTERNAL_ERROR")
    finally:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%d %s %s (%s) %.3fms", status, request.method, request.raw_path,
                      request.remote, (time.perf_counter() - start) * 1000)


def _tls_required_middleware(nsqd: NodeAPI) -> Any:
    @web.middleware
    async def tls_required(request: web.Request, handler: Any) -> web.StreamResponse:
        port = nsqd.https_port or 0
        body = f'{{"message": "TLS_REQUIRED", "https_port": {int(port)}}}'
        return web.Response(status=403, text=body, content_type=JSON_TYPE, charset="utf-8")

    return tls_required


def _operator_auth_middleware(authz: HTTPAuthorizer) -> Any:
    """With ``--auth-http-address``: the endpoints of ``OPERATOR_RULES`` need the secret's
    permission (matched on the route, so a sloppy path that is not routed is not either)."""

    @web.middleware
    async def operator_auth(request: web.Request, handler: Any) -> web.StreamResponse:
        resource = request.match_info.route.resource
        rule = OPERATOR_RULES.get((request.method, resource.canonical)) if resource else None
        if rule is not None:
            params = _query(request)
            await authz.check_rule(request, rule, _first(params, "topic"),
                                   _first(params, "channel"))
        return await handler(request)

    return operator_auth


async def _add_v1_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[V1_HEADER] = V1_VALUE


@dataclass(frozen=True)
class HTTPServices:
    """What a node's HTTP and HTTPS apps share: one authorizer (one cache of the auth
    server's answers) and one fetch API (its publish-key indexes). The node builds them
    once and hands them to each app; nothing is stored on the node behind its back."""

    authorizer: HTTPAuthorizer
    fetch: fetch_api.FetchAPI


def http_services(nsqd: NodeAPI) -> HTTPServices:
    authz = HTTPAuthorizer(nsqd.opts)
    return HTTPServices(authz, fetch_api.FetchAPI(nsqd, authz))


def make_app(nsqd: NodeAPI, *, tls_listener: bool = False,
             services: HTTPServices | None = None) -> web.Application:
    """The HTTP API of one node.

    ``tls_listener`` says whether this app serves the HTTPS listener; the plain
    listener of a node with ``--tls-required=true`` answers every request 403
    ``TLS_REQUIRED`` (``tcp-https`` keeps plain HTTP).

    Facade used: ``nsqd.opts`` (Options), ``nsqd.health()``, ``nsqd.is_healthy()``,
    ``nsqd.start_time``, ``nsqd.tcp_port``, ``nsqd.http_port``, ``nsqd.https_port``,
    ``nsqd.get_topic(name, create=True)``, ``await nsqd.delete_topic(name)``,
    ``await nsqd.publish(topic, bodies, defer_ms, partition, headers=, producer=)`` ->
    ``(partition, base offset)``, ``nsqd.persist_metadata()``,
    ``nsqd.set_lookupd_tcp_addresses(list)``, ``nsqd.http_route_hooks``,
    ``nsqd.stats_dict(topic=, channel=, include_clients=, include_mem=)``;
    Topic: ``get_channel(name, create=True)``, ``delete_channel(name)`` (KeyError if
    absent), ``pause()``, ``unpause()``, ``empty()``; Channel: ``pause()``,
    ``unpause()``, ``empty()``. Any of these may be sync or async.
    """
    middlewares: list[Any] = []
    if not tls_listener and nsqd.opts.tls_required == TLS_REQUIRED:
        middlewares.append(_tls_required_middleware(nsqd))
    middlewares.append(_v1_errors)
    if services is None:  # an app of its own (tests): nothing to share
        services = http_services(nsqd)
    authz = services.authorizer
    if authz.enabled:
        middlewares.append(_operator_auth_middleware(authz))
    app = web.Application(middlewares=middlewares)
    app[NSQD_KEY] = nsqd
    h = _Handlers(nsqd)
    r = app.router

    def get(path: str, fn: Any) -> None:
        r.add_get(path, fn, allow_head=False)

    get("/ping", h.ping)
    get("/info", h.info)
    r.add_post("/pub", h.pub)
    r.add_post("/mpub", h.mpub)
    get("/stats", h.stats)
    r.add_post("/topic/create", h.topic_create)
    r.add_post("/topic/delete", h.topic_delete)
    r.add_post("/topic/empty", h.topic_empty)
    r.add_post("/topic/pause", h.topic_pause)
    r.add_post("/topic/unpause", h.topic_unpause)
    r.add_post("/channel/create", h.channel_create)
    r.add_post("/channel/delete", h.channel_delete)
    r.add_post("/channel/empty", h.channel_empty)
    r.add_post("/channel/pause", h.channel_pause)
    r.add_post("/channel/unpause", h.channel_unpause)
    get("/config/{opt}", h.config)
    r.add_put("/config/{opt}", h.config)
    get("/metrics", h.metrics)
    get("/debug/tasks", h.debug_tasks)
    get("/debug/pprof/goroutine", h.debug_tasks)
    r.add_post("/debug/freememory", h.free_memory)
    app.on_response_prepare.append(_add_v1_header)
    fetch_api.add_routes(app, services.fetch)
    config_api.add_routes(app, nsqd)
    routes_api.add_routes(app, nsqd)
    trace_api.add_routes(app, nsqd)
    replay_api.add_routes(app, nsqd)
    for hook in nsqd.http_route_hooks:
        hook(app)  # extensions (cluster mode's replication API)
    return app
