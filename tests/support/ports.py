"""Blocks of free ports for tests that start a process on a port layout (``cluster up``).

Why not port 0's answer: the kernel hands ports out of the ephemeral range
(``net.ipv4.ip_local_port_range``, 32768..60999 here), the same range every outgoing
connection of the suite takes its local port from. A block probed free there can be taken
by some client's connection before the process under test binds it, and then ``cluster up``
fails its preflight (CI saw a 30 s "connection refused" wait with nothing to say why). Below
that range nothing takes a port unless a test asks for it, and the blocks handed out by
this module never overlap one another.
"""

from __future__ import annotations

import random
import socket

__all__ = ["free_block"]

_LOW, _HIGH = 20000, 32000  # below the ephemeral range
_given: set[int] = set()


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_block(offsets: list[int]) -> int:
    """A base port such that base+o is free for every o, outside the ephemeral range and
    disjoint from every block this process was given before."""
    span = max(offsets)
    for _ in range(500):
        base = random.randrange(_LOW, _HIGH - span)
        ports = [base + o for o in offsets]
        if any(p in _given for p in ports) or not all(_free(p) for p in ports):
            continue
        _given.update(ports)
        return base
    raise RuntimeError("no free port block")
