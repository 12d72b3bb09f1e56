"""nsqlookupd's HTTP API (upstream ``nsqlookupd/http.go``), V1 conventions, on aiohttp.

Routing imitates upstream's httprouter so that what a client sees is the same:
unknown path 404 ``NOT_FOUND``, known path with another method 405
``METHOD_NOT_ALLOWED`` (with ``Allow``), ``OPTIONS`` answered with ``Allow``, a
path that only differs by a trailing slash, case or ``//``/``..`` redirected
(301 for GET, 308 otherwise). Request bodies are never needed and never read.
A bug in a handler answers 500 ``INTERNAL_ERROR``; the traceback goes to the log.
With ``--auth-http-address`` (nsqx) the topic and channel changes and ``/trace/search``
need a client secret granting the permission nsqd asks for (``nsqx.httpauth``).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from nsqx.httpapi import (
    HTTPError,
    add_v1_header,
    client_address,
    client_fault,
    empty,
    first,
    query,
    task_dump,
    text,
    topic_channel_args,
    v1_error,
    v1_json,
)
from nsqx.httpauth import OPERATOR_RULES, HTTPAuthorizer, Rule
from nsqx.protocol.names import valid_topic_name

from .options import Options
from .registry import CHANNEL, CLIENT, TOPIC, Registration, RegistrationDB, filter_by_active
from .trace_search import trace_search

__all__ = ["HTTPHost", "make_app", "registry_lookup", "topic_delete"]


class HTTPHost(Protocol):
    """What the HTTP API needs of its node (:class:`~nsqx.lookupd.node.NSQLookupd`), which
    builds the app and owns it: the API never imports the node."""

    db: RegistrationDB
    opts: Options
    version: str
    # extensions (cluster mode): (method, path, handler) routes added over the defaults
    http_routes: list[tuple[str, str, Callable[..., Any]]]

log = logging.getLogger("nsqx.lookupd.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# time.Time{}.UnixNano() in Go: what upstream's /debug shows for "never tombstoned"
GO_ZERO_TIME_UNIX_NANO = -6795364578871345152


def _peer_json(info: Any) -> dict[str, Any]:
    """A PeerInfo as Go marshals the struct (field order)."""
    return {
        "remote_address": info.remote_address,
        "hostname": info.hostname,
        "broadcast_address": info.broadcast_address,
        "tcp_port": info.tcp_port,
        "http_port": info.http_port,
        "version": info.version,
        "topology_zone": info.topology_zone,
        "topology_region": info.topology_region,
    }




async def registry_lookup(lookupd: HTTPHost, request: web.Request) -> web.Response:
    """``GET /lookup`` as this nsqlookupd's registry answers it (upstream's answer). Cluster
    mode answers /lookup itself and falls back to this for a topic etcd does not know."""
    topic = first(query(request), "topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    db, opts = lookupd.db, lookupd.opts
    if not db.find_registrations(TOPIC, topic, ""):
        raise HTTPError(404, "TOPIC_NOT_FOUND")
    channels = [r.subkey for r in db.find_registrations(CHANNEL, topic, "*")]
    producers = filter_by_active(
        db.find_producers(TOPIC, topic, ""), round(opts.inactive_producer_timeout * 1e9),
        round(opts.tombstone_lifetime * 1e9), db.clock())
    return v1_json({"channels": channels,
                    "producers": [_peer_json(p.peer.info) for p in producers]})


class _Handlers:
    def __init__(self, lookupd: HTTPHost) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db

    @property
    def opts(self) -> Options:
        return self.lookupd.opts

    def _ns(self, seconds: float) -> int:
        return round(seconds * 1e9)

    async def ping(self, request: web.Request) -> web.Response:
        return text("OK")

    async def info(self, request: web.Request) -> web.Response:
        return v1_json({"version": self.lookupd.version})

    async def topics(self, request: web.Request) -> web.Response:
        regs = self.db.find_registrations(TOPIC, "*", "")
        return v1_json({"topics": [r.key for r in regs]})

    async def channels(self, request: web.Request) -> web.Response:
        topic = first(query(request), "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        regs = self.db.find_registrations(CHANNEL, topic, "*")
        return v1_json({"channels": [r.subkey for r in regs]})

    async def lookup(self, request: web.Request) -> web.Response:
        return await registry_lookup(self.lookupd, request)

    async def nodes(self, request: web.Request) -> web.Response:
        db = self.db
        now = db.clock()
        lifetime = self._ns(self.opts.tombstone_lifetime)
        # tombstoned nodes are listed (with their tombstones), inactive ones are not
        producers = filter_by_active(db.find_producers(CLIENT, "", ""),
                                     self._ns(self.opts.inactive_producer_timeout), 0, now)
        nodes = []
        for p in producers:
            peer = p.peer
            topics = [r.key for r in db.lookup_registrations(peer.id) if r.category == TOPIC]
            tombstones = []
            for t in topics:
                tp = db.producer(Registration(TOPIC, t, ""), peer.id)
                tombstones.append(tp is not None and tp.is_tombstoned(lifetime, now))
            node = _peer_json(peer.info)
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return v1_json({"producers": nodes})

    async def trace_search(self, request: web.Request) -> web.Response:
        """nsqx: a message-trace search over every active nsqd (see ``trace_search``)."""
        db = self.db
        producers = filter_by_active(db.find_producers(CLIENT, "", ""),
                                     self._ns(self.opts.inactive_producer_timeout), 0, db.clock())
        nodes = sorted({f"{p.peer.info.broadcast_address}:{p.peer.info.http_port}"
                        for p in producers})
        return await trace_search(request, nodes)

    async def debug(self, request: web.Request) -> web.Response:
        data: dict[str, list[dict[str, Any]]] = {}
        for reg, producers in self.db.items():
            if not producers:
                continue
            key = f"{reg.category}:{reg.key}:{reg.subkey}"
            entries = data.setdefault(key, [])
            for p in producers:
                info = p.peer.info
                peer = _peer_json(info)
                del peer["remote_address"]  # /debug names the peer by its id
                entries.append({
                    "id": p.peer.id,
                    **peer,
                    "last_update": p.peer.last_update,
                    "tombstoned": p.tombstoned,
                    "tombstoned_at": p.tombstoned_at if p.tombstoned else GO_ZERO_TIME_UNIX_NANO,
                })
        return v1_json(data, sort_keys=True)  # Go maps: keys sorted

    async def topic_create(self, request: web.Request) -> web.Response:
        topic = first(query(request), "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration(TOPIC, topic, ""))
        return empty()

    async def topic_delete(self, request: web.Request) -> web.Response:
        topic = first(query(request), "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        db = self.db
        for reg in db.find_registrations(CHANNEL, topic, "*"):
            log.info("DB: removing channel(%s) from topic(%s)", reg.subkey, topic)
            db.remove_registration(reg)
        for reg in db.find_registrations(TOPIC, topic, ""):
            log.info("DB: removing topic(%s)", topic)
            db.remove_registration(reg)
        return empty()

    async def topic_tombstone(self, request: web.Request) -> web.Response:
        params = query(request)
        topic = first(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        node = first(params, "node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        now = self.db.clock()
        for p in self.db.find_producers(TOPIC, topic, ""):
            if p.peer.node_address() == node:
                p.tombstone(now)
        return empty()

    async def channel_create(self, request: web.Request) -> web.Response:
        topic, channel = topic_channel_args(query(request))
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration(CHANNEL, topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration(TOPIC, topic, ""))
        return empty()

    async def channel_delete(self, request: web.Request) -> web.Response:
        topic, channel = topic_channel_args(query(request))
        regs = self.db.find_registrations(CHANNEL, topic, channel)
        if not regs:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for reg in regs:
            self.db.remove_registration(reg)
        return empty()

    async def debug_tasks(self, request: web.Request) -> web.Response:
        return text(task_dump())


# ---------------------------------------------------------------- httprouter-like routing

_SLASHES = re.compile(r"/{2,}")


def _clean_path(p: str) -> str:
    """httprouter's CleanPath: one leading '/', no '.', '..' or '//', trailing '/' kept."""
    if not p:
        return "/"
    if not p.startswith("/"):
        p = "/" + p
    cleaned = _SLASHES.sub("/", posixpath.normpath(p))
    if cleaned.startswith("//"):
        cleaned = cleaned[1:]
    if p.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


class _Router:
    def __init__(self) -> None:
        self.routes: dict[str, dict[str, Handler]] = {}
        self.methods: set[str] = set()

    def add(self, method: str, path: str, handler: Handler) -> None:
        self.routes.setdefault(path, {})[method] = handler
        self.methods.add(method)

    def allowed(self, path: str, method: str) -> str:
        """httprouter's ``Allow`` value for ``path`` ("" when no other method serves it)."""
        methods = [m for m in sorted(self.routes.get(path, {})) if m not in (method, "OPTIONS")]
        return ", ".join(methods) + ", OPTIONS" if methods else ""

    def fixed_path(self, path: str, method: str) -> str | None:
        """The route a sloppy path means (trailing slash, case, dot segments), if any."""
        clean = _clean_path(path)
        candidates = [clean]
        if clean.endswith("/") and clean != "/":
            candidates.append(clean[:-1])
        else:
            candidates.append(clean + "/")
        for cand in candidates:
            low = cand.lower()
            for route, handlers in self.routes.items():
                if route.lower() == low and method in handlers:
                    return route
        return None

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        method = request.method
        handlers = self.routes.get(path)
        if handlers is not None:
            handler = handlers.get(method)
            if handler is not None:
                return await handler(request)
        if method in self.methods and method != "CONNECT" and path != "/":
            target = self.fixed_path(path, method)
            if target is not None and target != path:
                qs = request.raw_path.partition("?")[2]
                location = target + ("?" + qs if qs else "")
                status = 301 if method == "GET" else 308
                return web.Response(status=status, headers={"Location": location},
                                    text=f'<a href="{location}">Moved Permanently</a>.\n\n'
                                    if method == "GET" else "",
                                    content_type="text/html" if method == "GET" else None)
        if method == "OPTIONS":
            allow = self.allowed(path, method)
            if allow:
                return web.Response(status=200, headers={"Allow": allow})
        allow = self.allowed(path, method)
        if allow:
            resp = v1_error(405, "METHOD_NOT_ALLOWED")
            resp.headers["Allow"] = allow
            return resp
        raise HTTPError(404, "NOT_FOUND")


def _log_middleware() -> Any:
    @web.middleware
    async def v1_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        status = 200
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except HTTPError as e:
            status = e.status
            return v1_error(e.status, e.code)
        except web.HTTPException as e:
            status = e.status
            if e.status >= 400:
                return v1_error(e.status, (e.reason or "ERROR").upper().replace(" ", "_"))
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            if (reason := client_fault(request, exc)) is not None:
                status = 400
                log.warning("HTTP: bad request from %s - %s", client_address(request), reason)
                return v1_error(400, "INVALID_REQUEST")
            status = 500
            log.exception("panic in HTTP handler %s %s", request.method, request.path)
            return v1_error(500, "INTERNAL_ERROR")
        finally:
            if log.isEnabledFor(logging.INFO):
                peer = request.transport.get_extra_info("peername") if request.transport else None
                remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
                log.info("%d %s %s (%s) %s", status, request.method, request.raw_path, remote,
                         f"{(time.perf_counter() - start) * 1e6:.3f}µs")

    return v1_errors


def _guarded(fn: Handler, rule: Rule, authz: HTTPAuthorizer) -> Handler:
    """``fn`` after the auth server's check of ``rule`` (``--auth-http-address``)."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        params = query(request)
        await authz.check_rule(request, rule, first(params, "topic"), first(params, "channel"))
        return await fn(request)

    return guarded


async def topic_delete(lookupd: HTTPHost, request: web.Request) -> web.Response:
    """Upstream's ``/topic/delete`` on this lookupd's registry (cluster mode deletes the
    topic in etcd first, then answers with this)."""
    return await _Handlers(lookupd).topic_delete(request)


def make_app(lookupd: HTTPHost) -> web.Application:
    """The HTTP API of one nsqlookupd (uses ``lookupd.db``, ``.opts``, ``.version``)."""
    h = _Handlers(lookupd)
    router = _Router()
    authz = HTTPAuthorizer(lookupd.opts)
    get, post = "GET", "POST"
    for method, path, fn in (
        (get, "/ping", h.ping),
        (get, "/info", h.info),
        (get, "/debug", h.debug),
        (get, "/lookup", h.lookup),
        (get, "/topics", h.topics),
        (get, "/channels", h.channels),
        (get, "/nodes", h.nodes),
        (get, "/trace/search", h.trace_search),
        (get, "/debug/tasks", h.debug_tasks),
        (get, "/debug/pprof/goroutine", h.debug_tasks),
        (post, "/topic/create", h.topic_create),
        (post, "/topic/delete", h.topic_delete),
        (post, "/channel/create", h.channel_create),
        (post, "/channel/delete", h.channel_delete),
        (post, "/topic/tombstone", h.topic_tombstone),
        *lookupd.http_routes,  # extensions (cluster mode) may replace a default
    ):
        rule = OPERATOR_RULES.get((method, path)) if authz.enabled else None
        router.add(method, path, fn if rule is None else _guarded(fn, rule, authz))
    app = web.Application(middlewares=[_log_middleware()])
    app.router.add_route("*", "/{tail:.*}", router.dispatch)
    app.on_response_prepare.append(add_v1_header)
    return app
