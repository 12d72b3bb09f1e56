"""Listening sockets the way Go's net.Listen makes them (shared by the servers)."""

from __future__ import annotations

import contextlib
import socket
from urllib.parse import urlsplit

__all__ = ["bind_listener", "check_listen_address", "check_peer_address", "split_host_port"]


def split_host_port(address: str) -> tuple[str, int]:
    """Go's ``net.SplitHostPort`` plus the port as a number: ``host:port``, ``:port``,
    ``[v6]:port``. ValueError (its text meant for the user) when the port is missing, not
    a number, or outside 0-65535."""
    host, sep, port_s = address.rpartition(":")
    if not sep:
        raise ValueError("missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("too many colons in address (write an IPv6 host as [host]:port)")
    if not port_s.isdigit() or not port_s.isascii():
        raise ValueError(f"invalid port {port_s!r}")
    port = int(port_s)
    if port > 65535:
        raise ValueError(f"port {port} out of range (1-65535)")
    return host, port


def check_listen_address(address: str) -> str:
    """A ``host:port`` to listen on, checked at start as Go's ``net.Listen`` would fail on
    it later: a port in 0-65535 (0: any free port) and a host that resolves. "" is allowed
    (a listener that is off)."""
    if not address:
        return address
    host, port = split_host_port(address)
    try:
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                           flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"cannot resolve host {host!r}: "
                         f"{(e.strerror if isinstance(e, OSError) else None) or e}") from None
    return address


def check_peer_address(address: str) -> str:
    """A peer's ``host:port`` (or, for HTTP peers, a ``http(s)://`` URL): a host and a
    port in 1-65535. Not resolved here: a peer may come up after this program does (it is
    resolved, and retried, when connecting, as upstream does)."""
    if "://" in address:
        try:
            url = urlsplit(address)
            url.port  # noqa: B018 - raises ValueError for a bad or out-of-range port
        except ValueError as e:
            raise ValueError(f"invalid URL: {e}") from None
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("a URL needs http:// or https:// and a host")
        if url.port == 0:
            raise ValueError("port 0 out of range (1-65535)")
        return address
    host, port = split_host_port(address)
    if not host:
        raise ValueError("missing host in address")
    if port == 0:
        raise ValueError("port 0 out of range (1-65535)")
    return address


def bind_listener(address: str, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket for ``host:port`` like Go's ``net.Listen("tcp", ...)``
    (``:port`` and an empty host mean every interface; ``[v6]:port`` works)."""
    host, sep, port_s = address.rpartition(":")
    if not sep:
        raise OSError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_s)
    except ValueError:
        raise OSError(f"address {address}: invalid port") from None
    if not 0 <= port <= 65535:
        raise OSError(f"address {address}: invalid port")
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    if not host:
        # Go's ":port" listens on every interface: prefer a dual-stack IPv6 socket
        infos.sort(key=lambda i: i[0] != socket.AF_INET6)
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and not host:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(sockaddr)
            sock.listen(backlog)
            sock.setblocking(False)
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise last or OSError(f"address {address}: no usable address")
