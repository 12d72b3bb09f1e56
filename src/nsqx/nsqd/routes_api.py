"""Route-managed ordered topics over HTTP (nsqx additions; see :mod:`nsqx.nsqd.routing`).

``POST /topic/create?topic=T&partition_num=P&logical=L`` (or ``POST /topic/route`` with the
same parameters)
    A route-managed ordered topic: P physical partitions (default 1) over L logical ones
    (default 1024; ``orderedmulti`` is implied). Idempotent for the same shape; 400
    ``TOPIC_EXISTS`` if T exists otherwise.
``GET /topic/route?topic=T``
    The route history (``RouteHistory.to_json``) plus this node's ``sealed`` partitions
    (command message offsets) and each channel's barrier state.
``POST /topic/split?topic=T&partition=P&at=A``
    Split P's logical range at A into two new partitions.
``POST /topic/merge?topic=T&a=P1&b=P2``
    Merge two partitions with adjacent ranges into one new partition.
``POST /topic/move?topic=T&partition=P&node=N``
    Move P's range to a new partition labelled with node N (a standalone nsqd creates it
    locally whatever N says).

In a cluster the same three calls go to nsqlookupd (:mod:`nsqx.cluster.lookupd_api`, which
parses them with :func:`parse_change`); a cluster node refuses them with the reason (its
history is the member's mirror of etcd) but answers ``GET /topic/route`` with its view.

Each change answers 200 with the new history once it is committed; a change the rules
refuse answers 400 with the RouteError text as ``message`` (bad boundary, non-adjacent
merge, a change while another is pending, unknown or retired partition); 404
``TOPIC_NOT_FOUND``; 400 ``TOPIC_NOT_ROUTE_MANAGED`` for a topic without routes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nsqx.httpapi import HTTPError, topic_arg
from nsqx.httpapi import first as _first
from nsqx.httpapi import query as _query
from nsqx.nsqd.http_publish import existing_topic
from nsqx.protocol.names import is_ephemeral
from nsqx.protocol.routes import DEFAULT_LOGICAL, RouteError, RouteHistory

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI
    from nsqx.nsqd.routing import TopicRoutes

log = logging.getLogger("nsqx.nsqd.http")

__all__ = ["add_routes", "create_routed", "parse_change", "parse_int"]


def _json(obj: Any) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def parse_int(params: dict[str, list[str]], name: str, *, default: int | None = None) -> int:
    """A non-negative integer argument (HTTPError ``MISSING_ARG_X`` / ``INVALID_X``)."""
    raw = _first(params, name)
    if raw is None or raw == "":
        if default is None:
            raise HTTPError(400, f"MISSING_ARG_{name.upper()}")
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise HTTPError(400, f"INVALID_{name.upper()}")
    return int(raw)


def node_label(nsqd: NodeAPI) -> str:
    return f"{nsqd.opts.broadcast_address}:{nsqd.tcp_port or 0}"


async def create_routed(nsqd: NodeAPI, name: str, params: dict[str, list[str]]) -> TopicRoutes:
    """Create (or find, same shape) the route-managed topic ``name``; HTTPError if not."""
    if is_ephemeral(name):
        raise HTTPError(400, "INVALID_PARTITION_NUM")
    count = parse_int(params, "partition_num", default=1)
    if not 1 <= count <= 1024:
        raise HTTPError(400, "INVALID_PARTITION_NUM")
    logical = parse_int(params, "logical", default=DEFAULT_LOGICAL)
    existing = nsqd.topics.get(name)
    if existing is not None:
        r = existing.routes
        if r is None or r.history.logical != logical or (
                _first(params, "partition_num") and len(r.history.versions) == 1
                and len(r.history.newest.routes) != count):
            raise HTTPError(400, "TOPIC_EXISTS")
        return r
    try:  # the node loads the routing code on first use (nsqd.lazy)
        routes: TopicRoutes = await nsqd.create_routed_topic(name, count, logical,
                                                             node_label(nsqd))
        return routes
    except RouteError as exc:
        raise HTTPError(400, str(exc)) from None


class _RoutesAPI:
    def __init__(self, nsqd: NodeAPI) -> None:
        self.nsqd = nsqd

    def _routes(self, request: web.Request) -> tuple[dict[str, list[str]], TopicRoutes]:
        params = _query(request)
        topic = existing_topic(self.nsqd, topic_arg(params))
        if topic.routes is None:
            raise HTTPError(400, "TOPIC_NOT_ROUTE_MANAGED")
        return params, topic.routes

    async def route_get(self, request: web.Request) -> web.Response:
        _, routes = self._routes(request)
        return _json(routes.to_dict())

    async def route_post(self, request: web.Request) -> web.Response:
        params = _query(request)
        routes = await create_routed(self.nsqd, topic_arg(params), params)
        return _json(routes.to_dict())

    async def _change(self, routes: TopicRoutes, op: Any, what: str,
                      request: web.Request) -> web.Response:
        try:
            await routes.change(op)
        except RouteError as exc:
            log.info("TOPIC(%s): %s refused - %s", routes.topic.name, what, exc)
            raise HTTPError(400, str(exc)) from None
        log.info("TOPIC(%s): %s by HTTP client %s", routes.topic.name, what, request.remote)
        return _json(routes.to_dict())

    async def split(self, request: web.Request) -> web.Response:
        return await self._op(request, "split")

    async def merge(self, request: web.Request) -> web.Response:
        return await self._op(request, "merge")

    async def move(self, request: web.Request) -> web.Response:
        return await self._op(request, "move")

    async def _op(self, request: web.Request, kind: str) -> web.Response:
        params, routes = self._routes(request)
        what, op = parse_change(kind, params)
        return await self._change(routes, op, what, request)


RouteOp = Callable[[RouteHistory], RouteHistory]


def parse_change(kind: str, params: dict[str, list[str]],
                 node: Callable[[str], str] = lambda n: n) -> tuple[str, RouteOp]:
    """The query of ``/topic/split|merge|move`` as (description, operation on a history);
    HTTPError for a missing or malformed argument. Shared by nsqd and, in a cluster,
    nsqlookupd (whose ``node`` resolves the ``node`` argument to a cluster node id)."""
    if kind == "split":
        p, at = parse_int(params, "partition"), parse_int(params, "at")
        return f"split {p} at {at}", lambda h: h.split(p, at)
    if kind == "merge":
        a, b = parse_int(params, "a"), parse_int(params, "b")
        return f"merge {a}+{b}", lambda h: h.merge(a, b)
    if kind == "move":
        p = parse_int(params, "partition")
        raw = _first(params, "node")
        if not raw:
            raise HTTPError(400, "MISSING_ARG_NODE")
        target = node(raw)
        return f"move {p} to {target}", lambda h: h.move(p, target)
    raise HTTPError(400, f"unknown route change {kind!r}")


def add_routes(app: web.Application, nsqd: NodeAPI) -> None:
    api = _RoutesAPI(nsqd)
    app.router.add_get("/topic/route", api.route_get, allow_head=False)
    app.router.add_post("/topic/route", api.route_post)
    app.router.add_post("/topic/split", api.split)
    app.router.add_post("/topic/merge", api.merge)
    app.router.add_post("/topic/move", api.move)
