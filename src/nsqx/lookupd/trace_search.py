"""``GET /trace/search`` on nsqlookupd: one message-trace search over every nsqd it knows.

Each nsqd keeps the trace events of what it handled in its own ``__trace`` topic and
answers ``/trace/search?topic=T&id=|trace_id=|header=k:v[&limit=N]``. nsqlookupd checks
the query with nsqd's own check (``nsqx.httpapi.trace_search_args``: the same 400 codes,
and garbage is not fanned out), sends the checked query to every active nsqd
concurrently (with the client's ``Authorization`` header: nodes with
``--auth-http-address`` check it as their own ``/trace/search`` does), and answers
``{"nodes": [{"node": "host:http_port", ...that node's answer}], "errors": ["host:port:
why"]}``: a node that is down or slow is named in
``errors`` and the others' answers still come back. When every node refuses the query
anyway (a node of another version, say, or every node refusing the client's secret) their
400, 401 or 403 is passed on as it is.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson
from aiohttp import web

from nsqx.httpapi import HTTPError, trace_search_args, v1_json
from nsqx.httpapi import query as _query

__all__ = ["trace_search"]

NODE_TIMEOUT = 5.0


async def _ask(session: aiohttp.ClientSession, addr: str, qs: str,
               headers: dict[str, str]) -> tuple[int, Any]:
    async with session.get(f"http://{addr}/trace/search?{qs}", headers=headers) as resp:
        raw = await resp.read()
        try:
            return resp.status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return resp.status, raw[:200].decode(errors="replace")


async def trace_search(request: web.Request, nodes: list[str]) -> web.Response:
    """Fan the checked query out to ``nodes`` (HTTP addresses) and merge the answers."""
    qs = urlencode(trace_search_args(_query(request)).params(), errors="surrogateescape")
    found: list[dict[str, Any]] = []
    errors: list[str] = []
    refusals: list[tuple[int, Any]] = []
    auth = request.headers.get("Authorization")  # nodes with auth ask for the client's secret
    headers = {"Authorization": auth} if auth else {}
    if nodes:
        timeout = aiohttp.ClientTimeout(total=NODE_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            answers = await asyncio.gather(*(_ask(session, n, qs, headers) for n in nodes),
                                           return_exceptions=True)
        for node, ans in zip(nodes, answers, strict=True):
            if isinstance(ans, BaseException):
                errors.append(f"{node}: {type(ans).__name__}: {ans}".rstrip(": "))
                continue
            status, body = ans
            if status == 200 and isinstance(body, dict):
                found.append({"node": node, **body})
            else:
                if status in (400, 401, 403):
                    refusals.append((status, body))
                errors.append(f"{node}: HTTP {status} {body}")
    if refusals and not found and len(refusals) == len(nodes):
        status, body = refusals[0]  # every node refused the query itself: say why
        code = body.get("message") if isinstance(body, dict) else None
        raise HTTPError(status, str(code or "INVALID_REQUEST"))
    return v1_json({"nodes": found, "errors": errors})
