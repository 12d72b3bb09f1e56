"""nsqd's side of the auth server (``--auth-http-address``): the shared pieces are in
:mod:`nsqx.httpauth` (nsqlookupd uses them too); here the node's one HTTP authorizer and the
query TCP sessions make with the node's options."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqx import httpauth
from nsqx.httpauth import OPERATOR_RULES, AuthState, HTTPAuthorizer

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeContext

__all__ = ["OPERATOR_RULES", "AuthState", "HTTPAuthorizer", "http_authorizer", "query_auth"]


async def query_auth(nsqd: NodeContext, secret: str, remote_ip: str, tls: bool,
                     common_name: str) -> AuthState:
    """Ask the node's auth servers (random order, first answer wins), as upstream does."""
    return await httpauth.query_auth(nsqd.opts, secret, remote_ip, tls, common_name)


def http_authorizer(nsqd: NodeContext) -> HTTPAuthorizer:
    """The node's one HTTPAuthorizer (its HTTP and HTTPS apps share the cache)."""
    authz = getattr(nsqd, "_http_authorizer", None)
    if authz is None:
        authz = HTTPAuthorizer(nsqd.opts)
        try:
            nsqd._http_authorizer = authz  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return authz
