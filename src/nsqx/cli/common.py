"""What the ``nsqx`` command groups share, so that none imports another: one blocking
request to an nsqd's (or nsqlookupd's) HTTP API (a failure is one line on stderr naming the
program and the address, never a traceback), the local default addresses, the parser
of a command group, and the auth secret every request carries (``NSQX_AUTH_SECRET``, or
``nsqx --auth-secret``): nodes with ``--auth-http-address`` ask their auth server what it
may do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["AUTH_SECRET_ENV", "LOCAL_LOOKUPD_HTTP", "LOCAL_NSQD_HTTP", "LOCAL_NSQD_TCP",
           "answer_failed", "auth_headers", "command_group",
           "help_when_bare",
           "default_to_local", "http_call", "http_failed", "nsqd_http"]

# what every nsqx command talks to when given no address: the local programs' default ports
LOCAL_NSQD_TCP = "127.0.0.1:4150"
LOCAL_NSQD_HTTP = "127.0.0.1:4151"
LOCAL_LOOKUPD_HTTP = "127.0.0.1:4161"

# the secret sent as ``Authorization: Bearer`` (what TCP AUTH sends) to nodes with auth on
AUTH_SECRET_ENV = "NSQX_AUTH_SECRET"


def auth_headers() -> dict[str, str]:
    """The ``Authorization`` header of every request, when a secret is given."""
    secret = os.environ.get(AUTH_SECRET_ENV, "").strip()
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def option(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    """An option that some subcommands define and others do not (argparse sets only the
    ones the chosen subcommand has): its value, or ``default`` when it has none."""
    return vars(args).get(name, default)


def default_to_local(args: argparse.Namespace) -> None:
    """A command given neither an nsqd nor an nsqlookupd address talks to the local nsqd
    (``--nsqd-http-address``, or the Spark jobs' ``--nsqd``: 127.0.0.1:4151), as
    ``nsqx cluster status`` talks to the local nsqlookupd."""
    given = vars(args)
    if option(args, "lookupd_http_address") or option(args, "lookupd"):
        return
    if "nsqd_http_address" in given and args.nsqd_http_address is None:
        args.nsqd_http_address = LOCAL_NSQD_HTTP
    if "lookupd" in given and option(args, "nsqd", "") is None:
        args.nsqd = LOCAL_NSQD_HTTP


def nsqd_http(method: str, address: str, path: str, params: dict[str, str],
              body: bytes | None = None, timeout: float = 30.0) -> tuple[int, bytes, Any]:
    """One request to nsqd's HTTP API -> (status, body, headers); HTTP errors are returned."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlencode

    base = address if "://" in address else f"http://{address}"
    req = urllib.request.Request(f"{base.rstrip('/')}{path}?{urlencode(params)}", data=body,
                                 method=method, headers=auth_headers())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def http_failed(prog: str, status: int, data: bytes) -> int:
    """Print nsqd's error answer (its JSON ``message`` or the start of the body); exit 1."""
    try:
        msg = json.loads(data)["message"]
    except (ValueError, KeyError, TypeError):
        msg = data.decode("utf-8", "replace").strip()[:300]
    print(f"{prog}: nsqd answered {status} {msg}", file=sys.stderr)
    return 1


def answer_failed(prog: str, who: str, status: int, body: Any) -> int:
    """Print a server's error answer (its JSON ``message`` and ``detail``); exit status 1."""
    if isinstance(body, dict):
        text = str(body.get("message"))
        if body.get("detail"):
            text += f": {body['detail']}"
    else:
        text = str(body)
    print(f"{prog}: {who} answered {status} {text}", file=sys.stderr)
    return 1


def http_call(prog: str, method: str, address: str, path: str, params: dict[str, str],
              body: bytes | None = None) -> tuple[int, bytes, Any] | None:
    """:func:`nsqd_http`, or None after printing why the address cannot be reached."""
    try:
        return nsqd_http(method, address, path, params, body)
    except OSError as exc:
        print(f"{prog}: cannot reach nsqd at {address}: {exc}", file=sys.stderr)
        return None


class _RawDescriptionParser(argparse.ArgumentParser):
    """A command whose description and examples keep their own line breaks."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kw)


def command_group(sub: Any, name: str, help: str, description: str) -> Any:
    """``nsqx NAME COMMAND``: the group's parser (printing its help when no command is
    given, exit 2) -> the subparsers its commands are added to (their descriptions and
    examples keep their line breaks)."""
    group = sub.add_parser(name, help=help, description=description)
    commands = group.add_subparsers(dest=f"{name}_command", metavar="COMMAND",
                                    parser_class=_RawDescriptionParser)
    help_when_bare(group)
    return commands


def help_when_bare(group: argparse.ArgumentParser) -> None:
    """``nsqx GROUP`` with no command prints the group's own help (its commands) and exits
    2; without this the top-level help came out, which does not list them."""
    group.set_defaults(func=lambda _args: (group.print_help(), 2)[1])
