"""nsqd's side of the auth server (``--auth-http-address``): the shared pieces are in
:mod:`nsqx.httpauth` (nsqlookupd uses them too); here the query TCP sessions make with the node's options."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqx import httpauth
from nsqx.httpauth import OPERATOR_RULES, AuthState, HTTPAuthorizer

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeContext

__all__ = ["OPERATOR_RULES", "AuthState", "HTTPAuthorizer", "query_auth"]


async def query_auth(nsqd: NodeContext, secret: str, remote_ip: str, tls: bool,
                     common_name: str) -> AuthState:
    """Ask the node's auth servers (random order, first answer wins), as upstream does."""
    return await httpauth.query_auth(nsqd.opts, secret, remote_ip, tls, common_name)

