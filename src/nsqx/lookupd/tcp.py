"""nsqlookupd's TCP side: one ``asyncio.Protocol`` per nsqd (upstream ``nsqlookupd/tcp.go``,
``lookup_protocol_v1.go``).

The peer sends the magic ``"  V1"``, then lines (``IDENTIFY`` carries a sized JSON
body). Every answer is ``[4B size][data]``; every error is answered the same way
and then the connection is closed (all of lookupd's errors are fatal). When the
connection goes, everything the peer registered goes with it.

Parsing is ``nsqx.protocol.lookup_v1.LookupCommandParser``: lines and bodies are
bounded, so hostile input costs a bounded amount of memory and gets an error,
never a crash. Output is flow-controlled: a peer that doesn't read stops being read.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Protocol, cast

from nsqx.protocol.errors import ProtocolError, raw_text
from nsqx.protocol.lookup_v1 import (
    BAD_PROTOCOL_RESPONSE,
    MAGIC_V1,
    LookupCommand,
    LookupCommandParser,
    cannot_identify_again,
    encode_response,
    identify_response,
    must_identify,
    parse_identify,
    parse_topic_channel,
)
from nsqx.protocol.names import is_ephemeral

from .options import Options
from .registry import CHANNEL, CLIENT, TOPIC, Peer, Producer, Registration, RegistrationDB

__all__ = ["LookupProtocol", "TCPHost", "format_address"]


class TCPHost(Protocol):
    """What a peer's session needs of its node (:class:`~nsqx.lookupd.node.NSQLookupd`): the
    registrations, its own addresses for IDENTIFY's answer, and the set of open sessions it
    closes at shutdown. The session never imports the node."""

    db: RegistrationDB
    opts: Options
    version: str
    hostname: str
    tcp_port: int
    http_port: int
    connections: set[LookupProtocol]

log = logging.getLogger("nsqx.lookupd.tcp")

MAX_LINE = 16 * 1024
MAX_IDENTIFY_BODY = 1024 * 1024
LINGER = 2.0  # s to wait for the peer to close after an error
_OK = b"OK"


def format_address(addr: object) -> str:
    """A socket address as Go's ``net.Addr.String()`` prints it."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        if ":" in str(host):
            return f"[{host}]:{port}"
        return f"{host}:{port}"
    return str(addr)


class LookupProtocol(asyncio.Protocol):
    """One nsqd connection."""

    def __init__(self, lookupd: TCPHost) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.transport: asyncio.Transport | None = None
        self.remote = "?"
        self.peer: Peer | None = None
        self._magic = b""
        self._parser: LookupCommandParser | None = None
        self._identify_pending = False
        self._closing = False
        self._linger: asyncio.TimerHandle | None = None

    def __str__(self) -> str:
        return self.remote

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's isn't a subclass
        self.remote = format_address(transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass
        self.lookupd.connections.add(self)
        log.info("TCP: new client(%s)", self.remote)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            if self._parser is None:
                data = self._read_magic(data)
                if self._parser is None or not data:
                    return
            self._handle(data)
        except Exception:  # a bug must cost one connection, never the node
            log.exception("client(%s) - internal error, closing", self.remote)
            self._close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.lookupd.connections.discard(self)
        if self._parser is None and len(self._magic) < 4:
            log.error("failed to read protocol version - %s", exc or "EOF")
        else:
            log.info("PROTOCOL(V1): [%s] exiting ioloop", self.remote)
        if self.peer is not None:
            for reg in self.db.lookup_registrations(self.peer.id):
                removed, _ = self.db.remove_producer(reg, self.peer.id)
                if removed:
                    log.info("DB: client(%s) UNREGISTER category:%s key:%s subkey:%s",
                             self.remote, reg.category, reg.key, reg.subkey)
            self.peer = None
        self.transport = None

    def pause_writing(self) -> None:
        if self.transport is not None and not self._closing:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self._closing:
            self.transport.resume_reading()

    # ------------------------------------------------------------------ input
    def _read_magic(self, data: bytes) -> bytes:
        need = 4 - len(self._magic)
        self._magic += data[:need]
        rest = data[need:]
        if len(self._magic) < 4:
            return b""
        log.info("CLIENT(%s): desired protocol magic '%s'", self.remote, raw_text(self._magic))
        if self._magic != MAGIC_V1:
            log.error("client(%s) bad protocol magic '%s'", self.remote, raw_text(self._magic))
            self._write(BAD_PROTOCOL_RESPONSE)
            self._close()
            return b""
        self._parser = LookupCommandParser(
            max_body_size=MAX_IDENTIFY_BODY, max_line=MAX_LINE, precheck=self._precheck)
        return rest

    def _precheck(self, name: bytes, params: list[bytes]) -> None:
        # upstream refuses a second IDENTIFY before reading its body
        if name == b"IDENTIFY":
            if self.peer is not None or self._identify_pending:
                raise cannot_identify_again()
            self._identify_pending = True

    def _handle(self, data: bytes) -> None:
        assert self._parser is not None
        error: ProtocolError | None = None
        try:
            commands = self._parser.feed(data)
        except ProtocolError as e:
            commands = e.commands
            error = e
        out: list[bytes] = []
        for cmd in commands:
            try:
                out.append(encode_response(self._exec(cmd)))
            except ProtocolError as e:
                error = e
                break
        if error is not None:
            log.error("[%s] - %s", self.remote, error)
            out.append(encode_response(error.payload))
        if out:
            self._write(b"".join(out))
        if error is not None:
            self._close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _close(self) -> None:
        """Close after an error so that the peer gets to read the error.

        Closing a socket with unread input makes the kernel send RST, which can destroy
        the answer still in flight; so we send FIN after the answer (``write_eof``), drop
        whatever still comes in, and close when the peer does (or after ``LINGER`` s).
        """
        if self._closing:
            return
        self._closing = True
        t = self.transport
        if t is None:
            return
        if t.can_write_eof() and not t.is_closing():
            t.resume_reading()
            t.write_eof()
            self._linger = asyncio.get_running_loop().call_later(LINGER, t.abort)
        else:
            t.close()

    # ------------------------------------------------------------------ commands
    def _exec(self, cmd: LookupCommand) -> bytes:
        name = cmd.name
        if name == b"PING":
            return self._ping()
        if name == b"REGISTER":
            return self._register(cmd.params)
        if name == b"UNREGISTER":
            return self._unregister(cmd.params)
        if name == b"IDENTIFY":
            return self._identify(cmd.body or b"")
        raise ProtocolError("E_INVALID", f"invalid command {raw_text(name)}")  # pragma: no cover

    def _ping(self) -> bytes:
        if self.peer is not None:
            # a PING may come before anything else on a connection
            since = self.db.touch(self.peer)
            log.info("CLIENT(%s): pinged (last ping %.6fs)", self.peer.id, since / 1e9)
        return _OK

    def _identify(self, body: bytes) -> bytes:
        if self.peer is not None:
            raise cannot_identify_again()
        info = parse_identify(body, self.remote)
        peer = self.db.new_peer(self.remote, info)
        log.info("CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s", self.remote,
                 info.broadcast_address, info.tcp_port, info.http_port, info.version)
        self.peer = peer
        if self.db.add_producer(Registration(CLIENT, "", ""), Producer(peer)):
            log.info("DB: client(%s) REGISTER category:%s key:%s subkey:%s", self.remote,
                     CLIENT, "", "")
        ld = self.lookupd
        return identify_response(tcp_port=ld.tcp_port, http_port=ld.http_port,
                                 version=ld.version, broadcast_address=ld.opts.broadcast_address,
                                 hostname=ld.hostname)

    def _register(self, params: list[bytes]) -> bytes:
        peer = self.peer
        if peer is None:
            raise must_identify()
        topic, channel = parse_topic_channel("REGISTER", params)
        if channel is not None and self.db.add_producer(
                Registration(CHANNEL, topic, channel), Producer(peer)):
            log.info("DB: client(%s) REGISTER category:%s key:%s subkey:%s", self.remote,
                     CHANNEL, topic, channel)
        if self.db.add_producer(Registration(TOPIC, topic, ""), Producer(peer)):
            log.info("DB: client(%s) REGISTER category:%s key:%s subkey:%s", self.remote,
                     TOPIC, topic, "")
        return _OK

    def _unregister(self, params: list[bytes]) -> bytes:
        peer = self.peer
        if peer is None:
            raise must_identify()
        topic, channel = parse_topic_channel("UNREGISTER", params)
        db = self.db
        if channel is not None:
            key = Registration(CHANNEL, topic, channel)
            removed, left = db.remove_producer(key, peer.id)
            if removed:
                log.info("DB: client(%s) UNREGISTER category:%s key:%s subkey:%s", self.remote,
                         CHANNEL, topic, channel)
            # an ephemeral channel goes with its last producer
            if left == 0 and is_ephemeral(channel):
                db.remove_registration(key)
            return _OK
        # a topic unregistration takes this peer's channels of the topic along
        for reg in db.find_registrations(CHANNEL, topic, "*"):
            removed, _ = db.remove_producer(reg, peer.id)
            if removed:
                log.warning("client(%s) unexpected UNREGISTER category:%s key:%s subkey:%s",
                            self.remote, CHANNEL, topic, reg.subkey)
        key = Registration(TOPIC, topic, "")
        removed, left = db.remove_producer(key, peer.id)
        if removed:
            log.info("DB: client(%s) UNREGISTER category:%s key:%s subkey:%s", self.remote,
                     TOPIC, topic, "")
        if left == 0 and is_ephemeral(topic):
            db.remove_registration(key)
        return _OK
