"""Who is asking, for the cluster's internal endpoints (replication, routes): the signing
member or the refusal, counted by :class:`~nsqx.cluster.trust.RefusalLog`."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from nsqx.cluster.trust import RefusalLog, Refused, Verifier

__all__ = ["InternalAuth", "answer"]


def answer(status: int, obj: Any) -> web.Response:
    """A JSON answer of an internal endpoint."""
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


class InternalAuth:
    """Checks a member's signature (none configured: the compatible, unauthenticated mode)."""

    def __init__(self, verifier: Verifier | None, refusals: RefusalLog) -> None:
        self.verifier = verifier
        self.refusals = refusals

    def refuse(self, request: web.Request, e: Refused) -> web.Response:
        self.refusals.record(e, request.remote or "?", request.path)
        return answer(e.status, {"message": e.code, "detail": e.detail})

    async def caller(self, request: web.Request) -> str | web.Response:
        """The member that signed the request, or the refusal; without a secret the node id
        the request claims (the unauthenticated, compatible mode)."""
        if self.verifier is None:
            return request.query.get("node", "")
        body = await request.read() if request.can_read_body else b""
        try:
            return self.verifier.verify(request.method, request.path, request.query.items(),
                                        body, request.headers)
        except Refused as e:
            return self.refuse(request, e)

    def mismatch(self, request: web.Request, caller: str, node: str | None
                 ) -> web.Response | None:
        """The refusal of a signed request asking as another node than its signer."""
        if node is not None and self.verifier is not None and node != caller:
            return self.refuse(request, Refused(
                403, "E_NODE_MISMATCH", f"signed by {caller}, asks as {node}"))
        return None
