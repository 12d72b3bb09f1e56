"""Listening sockets the way Go's net.Listen makes them (shared by the servers)."""

from __future__ import annotations

import contextlib
import socket


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
