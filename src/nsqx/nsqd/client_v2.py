"""One TCP connection speaking NSQ's V2 protocol (upstream `protocol_v2.go` + `client_v2.go`).

An `asyncio.Protocol`: bytes go through the sans-IO parser, commands are
executed in order, and responses to PUB/MPUB/DPUB go out strictly in command
order once the group commit that holds them is durable. Message frames are
written as the byte ranges the log returns (`writelines`, no per-message copy).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from itertools import compress
from typing import TYPE_CHECKING, Any

import orjson

from nsqx import NSQ_VERSION
from nsqx.nsqd.auth import AuthState, query_auth
from nsqx.nsqd.channel import NotLeader, SeekError, load_position, resolve_position
from nsqx.nsqd.idempotence import (
    IdempotenceError,
    deduper_for,
    has_mark,
    leads,
    sticky_partition,
)
from nsqx.nsqd.topic import BadPartition, SealedPartition
from nsqx.protocol import frames
from nsqx.protocol.compress import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.forward import forward_command, replayed_answer
from nsqx.protocol.names import valid_channel_name, valid_topic_name
from nsqx.protocol.v2 import (
    ASK_REPLAYED_KEY,
    DEFER_KEY,
    FIN_BATCH,
    MAGIC_V2,
    MPUB_LIKE,
    TRACE_ID_KEY,
    Command,
    CommandParser,
    IdentifyLimits,
    IdentifySettings,
    cannot_in_state,
    identify_response,
    mpub_body,
    parse_fin,
    parse_identify,
    parse_lone_marked_pub,
    parse_lone_pub,
    parse_rdy,
    parse_req,
    parse_sub_advanced,
    parse_touch,
    split_ext,
    split_trace,
    strip_no_ext,
    traced_response,
)
from nsqx.storage.cursor import NotInFlight, NotOwner
from nsqx.storage.message_id import MAX_OFFSET, parse_id
from nsqx.storage.publish_keys import PRODUCER_HEADER
from nsqx.storage.records import LogError

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.interfaces import NodeAPI, TopicView
    from nsqx.protocol.v2 import StartPosition

log = logging.getLogger("nsqx.nsqd.client")

STATE_INIT, STATE_SUBSCRIBED, STATE_CLOSING = 0, 3, 4
_ID_HEX = frozenset(b"0123456789abcdef")  # message ids are lowercase hex (parse_id)
_PENDING = object()  # a response slot whose commit is not durable yet
# Publishes waiting for their commit before we stop reading from this client.
MAX_PENDING_RESPONSES = 4096


class Fatal(Exception):
    """A fatal client error: send the error frame, then close (upstream FatalClientErr)."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code, self.text = code, text


class ClientV2(asyncio.Protocol):
    """State and protocol handler of one client connection."""

    _next_id = 0

    def __init__(self, nsqd: NodeAPI, *, tls_listener: bool = False) -> None:
        ClientV2._next_id += 1
        self.id = ClientV2._next_id
        self.nsqd = nsqd
        opts = nsqd.opts
        self.transport: asyncio.Transport | None = None
        self.parser = CommandParser(
            max_body_size=opts.max_body_size, max_msg_size=opts.max_msg_size, batch_fin=True,
            strip_marked=True, max_req_timeout_ms=opts.max_delay_ms, precheck=self._precheck)
        self.state = STATE_INIT
        self.magic = b""
        self.remote_address = ""
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.connect_ts = int(time.time())
        self.heartbeat_interval = opts.client_timeout / 2
        self.msg_timeout_ms = int(opts.msg_timeout * 1000)
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.sample_rate = 0
        self.tls = tls_listener
        self.tls_version = ""
        self.tls_cipher_suite = ""
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.identified = False
        # Youzan's IDENTIFY extensions: ext frame layout (headers) and tag dispatch
        self.extend_support = False
        self.desired_tag = ""
        self.auth: AuthState | None = None
        self.ready_count = 0
        self.channel: Channel | None = None
        # every channel this client is subscribed to: one per partition it reads (a plain
        # SUB to a partitioned topic reads them all); `channel` is the first of them
        self.subs: list[Channel] = []
        self.sub_all = False
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self._encoder: Any = None
        self._decoder: Any = None
        self._decoder_new = False
        self._responses: deque[list[Any]] = deque()
        self._drained: asyncio.Future[None] | None = None  # set when _responses empties
        self._blocked = False
        self._backlog: deque[Command] = deque()
        self._raw_backlog: list[bytes] = []
        self._closing = False
        self._close_after_responses = False
        self._drain_after_pass = False  # a commit pass will answer this client at its end
        self._can_write = True
        self._reading_paused = False
        self._last_read = time.monotonic()
        self._hb_handle: asyncio.TimerHandle | None = None
        self._handed_to: int | None = None  # --workers: the worker this connection went to
        self._follow_tried = False  # --workers: its first publish tried to move it once
        self._adopted: tuple[dict[str, Any], bytes] | None = None  # see handed_over()
        # --workers: a TLS/compressed connection whose SUB the owner serves (_relay_to)
        self._relay: asyncio.Transport | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.remote_address = f"{peer[0]}:{peer[1]}"
            self.client_id = str(peer[0])
        else:
            self.remote_address = str(peer or "")
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=self.nsqd.opts.max_output_buffer_size * 16)
        self.nsqd.client_connected(self)
        self._schedule_heartbeat()
        log.debug("TCP: new client(%s)", self.remote_address)
        if self._adopted is not None:
            self._adopt()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._hb_handle is not None:
            self._hb_handle.cancel()
        for ch in self.subs:
            ch.remove_client(self)
        self.nsqd.client_disconnected(self)
        if self._relay is not None:
            self._relay.close()
        if self._handed_to is not None and self._relay is None:
            log.info("[%s] handed over to worker %d", self, self._handed_to)
            return
        log.info("[%s] closed connection%s", self, f" ({exc})" if exc else "")

    def pause_writing(self) -> None:
        # A peer that does not read what we send must not make us buffer without
        # bound: stop delivering to it and stop reading its commands.
        self._can_write = False
        if self._relay is not None:  # the owner's output waits in the pipe
            self._relay.pause_reading()
        if self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._can_write = True
        if self._relay is not None:
            self._relay.resume_reading()
        if self.transport is not None and not self._reading_paused:
            self.transport.resume_reading()
        for ch in self.subs:
            ch.wake()

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        if self._relay is not None:
            self._relay_in(data)
            return
        if self._closing:
            return
        if data[:4] == b"FIN " and len(data) == 21 and self._lone_fin(data):
            return
        if (data[:4] == b"PUB " and self._decoder is None and not self._blocked
                and not self._backlog and self.parser.idle() and self._lone_pub(data)):
            return
        if (data[:8] == b"PUB_EXT " and self._decoder is None and not self._blocked
                and not self._backlog and self.parser.idle() and self._lone_pub(data, True)):
            return
        if len(self.magic) < 4:
            need = 4 - len(self.magic)
            self.magic += data[:need]
            data = data[need:]
            if len(self.magic) < 4:
                return
            if self.magic != MAGIC_V2:
                log.error("client(%s) bad protocol magic %r", self.remote_address, self.magic)
                self._write(frames.BAD_PROTOCOL_FRAME)
                self._shutdown()
                return
            if not data:
                return
        if self._decoder is None:
            self._ingest(data)
            return
        dec = self._decoder
        try:
            for chunk in _decoded(dec, data):
                self._ingest(chunk)
                if self._closing or dec is not self._decoder:
                    break
        except ProtocolError as exc:  # corrupt or oversized compressed stream
            self._fatal(Fatal(exc.code, exc.text))

    def _lone_pub(self, data: bytes, marked: bool = False) -> bool:
        """Publish a read holding exactly one plain PUB to an existing topic; False = not that.

        Speed: the one-at-a-time producer's path (see parse_lone_pub): the same _publish
        as parser -> _run -> _cmd_pub; cases with extra checks (auth, TLS required,
        exiting, bad input) return False before doing anything and go the general way.
        ``marked``: an idempotent producer's ``PUB_EXT`` with only its mark
        (parse_lone_marked_pub), the same _publish as _cmd_pub_variant.
        """
        nsqd = self.nsqd
        if len(self.magic) < 4 or nsqd.exiting or nsqd.auth_enabled or (
                nsqd.tls_required_tcp and not self.tls):
            return False
        if nsqd.workers is not None and not self.pub_counts:
            return False  # a first publish may move the connection (_follow_topic)
        max_msg = self.parser.max_msg_size
        pub = parse_lone_marked_pub(data, max_msg) if marked else parse_lone_pub(data, max_msg)
        if pub is None:
            return False
        name = pub[0].decode("ascii")
        topic = nsqd.topics.get(name)
        if topic is not None and topic.ordered:
            return False  # refused (no partition named): the general path answers it
        if marked:
            self._publish(name, [pub[2]], 0, "E_PUB_FAILED", "PUB_EXT", None,
                          [{PRODUCER_HEADER: pub[1]}])
        else:
            self._publish(name, [pub[1]], 0, "E_PUB_FAILED", "PUB")
        return True

    def _lone_fin(self, data: bytes) -> bool:
        """FIN a read holding exactly one ``FIN <id>\n`` of the lowest in-flight message of
        the client's one subscription, then deliver at once; False = not that case.

        Speed: the one-in-flight consumer's round trip (ordered partitions, RDY 1): no
        parser, Command or command queue, and the next message goes out in this same
        callback instead of a pump scheduled for the next loop turn. Everything else (an
        out-of-order FIN, a bad id, several subscriptions, TLS required, a held partial
        command, compression) returns False before changing anything and goes the general
        way (parser -> _run -> _cmd_fin -> Channel.wake), which does the same work.
        """
        if (data[20] != 10 or self.state != STATE_SUBSCRIBED or len(self.subs) != 1
                or self._decoder is not None or self._blocked or self._backlog
                or not self.parser.idle() or (self.nsqd.tls_required_tcp and not self.tls)):
            return False
        ch = self.subs[0]
        mid = data[4:20]
        if not _ID_HEX.issuperset(mid):
            return False  # not one of our ids (parse_id's rule): the general path answers
        v = int(mid, 16)
        if v >> 48 == ch.topic.partition:
            offset = v & MAX_OFFSET
        else:  # another partition's (general path), or an imported message's original id
            offset = ch.imported_offset(self.id, v)
            if offset < 0:
                return False
        if not ch.finish_head(self, offset):
            return False
        self.finish_count += 1
        ch.pump_now(self)
        return True

    def _ingest(self, data: bytes) -> None:
        if self._blocked:
            self._raw_backlog.append(data)
            if sum(map(len, self._raw_backlog)) > self.nsqd.opts.max_body_size and self.transport:
                self.transport.pause_reading()
                self._reading_paused = True
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        return None

    def _precheck(self, name: bytes, params: list[bytes]) -> None:
        """Upstream's checks made before a body is read (TLS required, state, auth)."""
        if self.nsqd.tls_required_tcp and not self.tls and name != b"IDENTIFY":
            raise ProtocolError("E_INVALID", f"cannot {name.decode('latin-1')} in current state (TLS required)")
        # State only moves forward from INIT and IDENTIFY/AUTH end a parse, so what we
        # see here is current enough to refuse early; execution checks again.
        if name in (b"IDENTIFY", b"AUTH") and self.state != STATE_INIT:
            raise cannot_in_state(name)
        if name in MPUB_LIKE and self.nsqd.auth_enabled and params and valid_topic_name(params[0]):
            # Upstream authorizes MPUB before reading its (large) body.
            topic = params[0].decode("ascii")
            what = name.decode()
            if self.auth is None:
                raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {what}")
            if not self.auth.expired() and not self.auth.allows(topic, None, "publish"):
                raise ProtocolError("E_UNAUTHORIZED", f'AUTH failed for {what} on "{topic}" ""')

    # -- command loop ---------------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        try:
            cmds = self.parser.feed(data)
        except ProtocolError as exc:
            # Commands parsed before the bad one still run first, in order.
            cmds = list(exc.commands)
            self._backlog.extend(cmds)
            self._run()
            self._fatal(Fatal(exc.code, exc.text))
            return
        if cmds:
            self._backlog.extend(cmds)
            self._run()

    def _run(self) -> None:
        """Execute queued commands in order; an async one blocks the rest until done."""
        handlers = self._handlers
        while self._backlog and not self._blocked and not self._closing:
            cmd = self._backlog.popleft()
            if (not self.pub_counts and cmd.name in _PUBLISHES and self.nsqd.workers is not None
                    and self._follow_topic(cmd)):
                return
            handler = handlers.get(cmd.name)
            try:
                if handler is None:
                    raise Fatal("E_INVALID", f"invalid command {cmd.name.decode('latin-1')}")
                if self.nsqd.tls_required_tcp and not self.tls and cmd.name != b"IDENTIFY":
                    raise Fatal("E_INVALID", f"cannot {cmd.name.decode('latin-1')} in current state (TLS required)")
                res = handler(self, cmd)
            except Fatal as exc:
                self._fatal(exc)
                return
            except ProtocolError as exc:
                if exc.fatal:
                    self._fatal(Fatal(exc.code, exc.text))
                    return
                self._respond(frames.encode_error(exc.code, exc.text))
                continue
            if res is not None and asyncio.iscoroutine(res):
                self._blocked = True
                task = self.nsqd.loop.create_task(res)
                task.add_done_callback(self._async_done)

    def _async_done(self, task: asyncio.Task[Any]) -> None:
        self._blocked = False
        if task.cancelled():
            self._shutdown()
            return
        exc = task.exception()
        if isinstance(exc, Fatal):
            self._fatal(exc)
            return
        if exc is not None:
            log.error("[%s] internal error: %r", self, exc)
            self._fatal(Fatal("E_INVALID", "internal error"))
            return
        if self._closing:
            return
        self._run()
        if not self._blocked:
            # The parser stops after IDENTIFY/AUTH; whatever it holds (and what came
            # while we were busy) is parsed now, through a newly negotiated decoder.
            held = self.parser.take_buffered()
            if held and self._decoder is not None and self._decoder_new:
                try:
                    held = self._decoder.decode(held)
                except ProtocolError as exc:
                    self._fatal(Fatal(exc.code, exc.text))
                    return
            self._decoder_new = False
            raw = held + b"".join(self._raw_backlog)
            self._raw_backlog = []
            if self._reading_paused and not self._responses and self.transport is not None:
                self._reading_paused = False
                self.transport.resume_reading()
            self._feed(raw)

    # -- output ---------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self._encoder is not None:
            data = self._encoder.encode(data)
        self.transport.write(data)

    def _respond(self, frame: bytes) -> None:
        """Send a response frame after every earlier pending response (command order)."""
        if self._responses:
            self._responses.append([None, frame])
        else:
            self._write(frame)

    def _respond_when_done(self, ok: bytes, err: tuple[str, str],
                           ok_from: Callable[[int], bytes] | None = None
                           ) -> Callable[[int, Exception | None], None]:
        """Queue a response slot; the returned callback fills it when the commit is durable
        (``ok_from(base offset)`` builds the answer then, for traced publishes)."""
        slot: list[Any] = [_PENDING, ok, err]
        self._responses.append(slot)
        if len(self._responses) > MAX_PENDING_RESPONSES and not self._reading_paused:
            self._reading_paused = True
            if self.transport is not None:
                self.transport.pause_reading()

        sched = self.nsqd.commit_scheduler

        def done(base: int, exc: Exception | None) -> None:
            slot[0] = exc
            if exc is None and ok_from is not None:
                slot[1] = frames.encode_response(ok_from(base))
            if sched.in_pass:  # one write for all this client's batches of the pass
                if not self._drain_after_pass:
                    self._drain_after_pass = True
                    sched.after_pass(self._drain_after)
                return
            self._drain_responses()
        return done

    def _drain_after(self) -> None:
        self._drain_after_pass = False
        self._drain_responses()

    def _drain_responses(self) -> None:
        out = []
        q = self._responses
        while q:
            head = q[0]
            state = head[0]
            if state is _PENDING:
                break
            if isinstance(state, ProtocolError) and not state.fatal:  # refused, in order
                q.popleft()
                out.append(frames.encode_error(state.code, state.text))
                continue
            if state is not None:  # the commit failed
                code, text = head[2]
                log.error("[%s] %s: %s", self, text, state)
                q.clear()
                if out:
                    self._write(b"".join(out))
                self._fatal(Fatal(code, text))
                return
            q.popleft()
            out.append(head[1])
        if out:
            self._write(b"".join(out))
        if not q:
            if self._drained is not None and not self._drained.done():
                self._drained.set_result(None)
            if self._close_after_responses:
                self._shutdown()
            elif self._reading_paused and self.transport is not None:
                self._reading_paused = False
                self.transport.resume_reading()

    def _fatal(self, exc: Fatal) -> None:
        if self._closing:
            return
        log.warning("[%s] - %s %s", self, exc.code, repr(exc.text)[1:-1])  # client's bytes escaped
        self._respond(frames.encode_error(exc.code, exc.text))
        self._closing = True
        self._backlog.clear()
        if self._responses:
            self._close_after_responses = True
        else:
            self._shutdown()

    def _shutdown(self) -> None:
        self._closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def close(self) -> None:
        """Close from the server side (channel deleted, node exiting)."""
        self._shutdown()

    def send_messages(self, chunks: list[Any], count: int) -> None:
        """Write ready message frames (byte ranges from the log)."""
        if not chunks:
            return
        self.message_count += count
        if self.transport is None or self.transport.is_closing():
            return
        if self._encoder is not None:
            self.transport.write(self._encoder.encode(b"".join(chunks)))
        elif len(chunks) == 1:
            self.transport.write(chunks[0])
        else:
            self.transport.writelines(chunks)

    def ready_room(self) -> int:
        """How many more messages this client may receive now (RDY is a window)."""
        if self.state != STATE_SUBSCRIBED or not self._can_write or self._closing or self.channel is None:
            return 0
        return self.ready_count - self.in_flight_count

    @property
    def in_flight_count(self) -> int:
        subs = self.subs
        if len(subs) == 1:
            return subs[0].in_flight_of(self.id)
        return sum(ch.in_flight_of(self.id) for ch in subs)

    # -- heartbeats -----------------------------------------------------------------------
    def _schedule_heartbeat(self) -> None:
        if self._hb_handle is not None:
            self._hb_handle.cancel()
            self._hb_handle = None
        if self.heartbeat_interval > 0:
            self._hb_handle = self.nsqd.loop.call_later(self.heartbeat_interval, self._heartbeat)

    def _heartbeat(self) -> None:
        if self._closing:
            return
        if time.monotonic() - self._last_read > 2 * self.heartbeat_interval:
            log.error("[%s] missed heartbeats (no data for %.1fs), closing", self, time.monotonic() - self._last_read)
            self._shutdown()
            return
        self._write(frames.HEARTBEAT_FRAME)
        self._hb_handle = self.nsqd.loop.call_later(self.heartbeat_interval, self._heartbeat)

    # -- commands -------------------------------------------------------------------------
    def _cmd_nop(self, cmd: Command) -> None:
        return None

    def _cmd_identify(self, cmd: Command) -> Any:
        if self.state != STATE_INIT or self.identified:
            raise Fatal("E_INVALID", "cannot IDENTIFY in current state")
        o = self.nsqd.opts
        limits = IdentifyLimits(
            heartbeat_interval_ms=int(o.client_timeout * 500),
            max_heartbeat_interval_ms=int(o.max_heartbeat_interval * 1000),
            max_output_buffer_size=o.max_output_buffer_size,
            output_buffer_timeout_ms=int(o.output_buffer_timeout * 1000),
            min_output_buffer_timeout_ms=int(o.min_output_buffer_timeout * 1000),
            max_output_buffer_timeout_ms=int(o.max_output_buffer_timeout * 1000),
            msg_timeout_ms=int(o.msg_timeout * 1000),
            max_msg_timeout_ms=int(o.max_msg_timeout * 1000),
            tls_available=self.nsqd.tls_context is not None and not self.tls,
            deflate_enabled=o.deflate,
            max_deflate_level=o.max_deflate_level,
            snappy_enabled=o.snappy,
        )
        return self._identify(parse_identify(cmd.body or b"", limits))

    async def _identify(self, st: IdentifySettings) -> None:
        """Apply the settings, answer, then upgrade in upstream's order: TLS, snappy, deflate."""
        await self._wait_responses()
        o = self.nsqd.opts
        self.client_id = st.client_id or self.client_id
        self.hostname = st.hostname
        self.user_agent = st.user_agent
        self.heartbeat_interval = st.heartbeat_interval_ms / 1000
        self.output_buffer_size = st.output_buffer_size
        self.output_buffer_timeout = st.output_buffer_timeout_ms / 1000
        self.sample_rate = st.sample_rate
        self.msg_timeout_ms = st.msg_timeout_ms
        self.extend_support = st.extend_support
        self.desired_tag = st.desired_tag
        self.identified = True
        self._schedule_heartbeat()
        if not st.feature_negotiation:
            self._write(frames.OK_FRAME)
            return
        if st.tls_v1 and self.transport is not None:
            # The client sends its ClientHello as soon as it reads this response: stop
            # reading now so those bytes reach the TLS layer, not the V2 parser.
            self.transport.pause_reading()
        self._write(frames.encode_response(identify_response(
            st, max_rdy_count=o.max_rdy_count, version=NSQ_VERSION,
            max_msg_timeout_ms=int(o.max_msg_timeout * 1000),
            max_deflate_level=o.max_deflate_level, auth_required=self.nsqd.auth_enabled)))
        if st.tls_v1:
            assert self.nsqd.tls_context is not None
            await self._upgrade_tls(self.nsqd.tls_context)
            self._write(frames.OK_FRAME)
        if st.snappy:
            self._decoder, self._encoder = SnappyDecoder(), SnappyEncoder()
            self._decoder_new = True
            self.snappy = True
            self._write(frames.OK_FRAME)
        if st.deflate:
            self._decoder = DeflateDecoder()
            self._decoder_new = True
            self._encoder = DeflateEncoder(st.deflate_level)
            self.deflate, self.deflate_level = True, st.deflate_level
            self._write(frames.OK_FRAME)

    async def _upgrade_tls(self, ctx: ssl.SSLContext) -> None:
        assert self.transport is not None
        try:
            new = await asyncio.wait_for(
                self.nsqd.loop.start_tls(self.transport, self, ctx, server_side=True), 5.0
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            raise Fatal("E_IDENTIFY_FAILED", f"IDENTIFY failed {exc}") from exc
        if new is None:
            raise Fatal("E_IDENTIFY_FAILED", "IDENTIFY failed TLS handshake")
        self.transport = new
        self.tls = True
        self.tls_version = str(new.get_extra_info("ssl_object").version() or "")
        cipher = new.get_extra_info("cipher")
        self.tls_cipher_suite = cipher[0] if cipher else ""

    async def _wait_responses(self) -> None:
        """Let every earlier publish be answered before IDENTIFY's response goes out."""
        while self._responses and not self._closing:
            self._drained = self.nsqd.loop.create_future()
            await self._drained

    def _cmd_auth(self, cmd: Command) -> Any:
        if self.state != STATE_INIT:
            raise Fatal("E_INVALID", "cannot AUTH in current state")
        if cmd.params:
            raise Fatal("E_INVALID", "AUTH invalid number of parameters")
        if not self.nsqd.auth_enabled:
            raise Fatal("E_AUTH_DISABLED", "AUTH disabled")
        if self.auth is not None:
            raise Fatal("E_INVALID", "AUTH already set")
        return self._auth(cmd.body or b"")

    async def _auth(self, secret: bytes) -> None:
        state = await self._query_auth(secret.decode("utf-8", "replace"))
        self.auth = state
        resp = {
            "identity": state.identity,
            "identity_url": state.identity_url,
            "permission_count": len(state.authorizations),
        }
        self._respond(frames.encode_response(orjson.dumps(resp)))

    async def _query_auth(self, secret: str) -> AuthState:
        common_name = ""
        if self.tls and self.transport is not None:
            cert = self.transport.get_extra_info("peercert") or {}
            for rdn in cert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        common_name = value
        try:
            state = await query_auth(
                self.nsqd, secret, self.remote_address.rsplit(":", 1)[0], self.tls, common_name
            )
        except Exception as exc:
            log.warning("[%s] auth failed: %s", self, exc)
            raise Fatal("E_AUTH_FAILED", "AUTH failed") from exc
        if not state.authorizations:
            raise Fatal("E_UNAUTHORIZED", "AUTH no authorizations found")
        return state

    def _check_auth(self, topic: str, channel: str | None, permission: str, cmd: str
                    ) -> Awaitable[Any] | None:
        """None when allowed now; a coroutine when the authorization must be refreshed."""
        if not self.nsqd.auth_enabled:
            return None
        if self.auth is None:
            raise Fatal("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if self.auth.expired():
            return self._refresh_auth(topic, channel, permission, cmd)
        if not self.auth.allows(topic, channel, permission):
            raise Fatal("E_UNAUTHORIZED", f"AUTH failed for {cmd} on \"{topic}\" \"{channel or ''}\"")
        return None

    async def _refresh_auth(self, topic: str, channel: str | None, permission: str, cmd: str) -> None:
        assert self.auth is not None
        self.auth = await self._query_auth(self.auth.secret)
        if not self.auth.allows(topic, channel, permission):
            raise Fatal("E_UNAUTHORIZED", f"AUTH failed for {cmd} on \"{topic}\" \"{channel or ''}\"")

    def _sub_args(self, cmd: Command, what: str, needed: int) -> tuple[str, str, int | None]:
        """SUB / SUB_ORDERED: state, heartbeats, names (upstream's checks and texts), and
        the optional (SUB) or required (SUB_ORDERED) partition."""
        if self.state != STATE_INIT:
            raise Fatal("E_INVALID", f"cannot {what} in current state")
        if self.heartbeat_interval <= 0:
            raise Fatal("E_INVALID", f"cannot {what} with heartbeats disabled")
        if len(cmd.params) < needed:
            raise Fatal("E_INVALID", f"{what} insufficient number of parameters")
        topic = cmd.params[0].decode("utf-8", "replace")
        if not valid_topic_name(topic):
            raise Fatal("E_BAD_TOPIC", f'{what} topic name "{topic}" is not valid')
        channel = cmd.params[1].decode("utf-8", "replace")
        if not valid_channel_name(channel):
            raise Fatal("E_BAD_CHANNEL", f'{what} channel name "{channel}" is not valid')
        return topic, channel, _partition_param(cmd.params, 2, what)

    def _cmd_sub(self, cmd: Command) -> Any:
        topic, channel, partition = self._sub_args(cmd, "SUB", 2)
        handover = self._elsewhere(topic, "SUB")
        if handover is not None:
            self._backlog.appendleft(cmd)
            return handover
        pending = self._check_auth(topic, channel, "subscribe", "SUB")
        if pending is not None:
            return self._after(pending, lambda: self._subscribe(topic, channel, partition))
        self._subscribe(topic, channel, partition)
        return None

    def _cmd_sub_ordered(self, cmd: Command) -> Any:
        """Youzan's ``SUB_ORDERED <topic> <channel> <partition>``: one partition in log
        order, one message in flight at a time (RDY caps it at 1), the next after FIN."""
        topic, channel, partition = self._sub_args(cmd, "SUB_ORDERED", 3)
        handover = self._elsewhere(topic, "SUB_ORDERED")
        if handover is not None:
            self._backlog.appendleft(cmd)
            return handover
        pending = self._check_auth(topic, channel, "subscribe", "SUB_ORDERED")
        if pending is not None:
            return self._after(pending, lambda: self._subscribe(topic, channel, partition,
                                                                ordered=True))
        self._subscribe(topic, channel, partition, ordered=True)
        return None

    def _cmd_sub_advanced(self, cmd: Command) -> Any:
        """Youzan's ``SUB_ADVANCED <topic> <channel> <partition> [<type>:<value>]``: SUB to
        one partition, plus a start position applied only when this is the channel's first
        client (later clients join wherever the channel is)."""
        if self.state != STATE_INIT:
            raise Fatal("E_INVALID", "cannot SUB_ADVANCED in current state")
        if self.heartbeat_interval <= 0:
            raise Fatal("E_INVALID", "cannot SUB_ADVANCED with heartbeats disabled")
        topic, channel, partition, start = parse_sub_advanced(cmd.params)
        handover = self._elsewhere(topic, "SUB_ADVANCED")
        if handover is not None:
            self._backlog.appendleft(cmd)
            return handover
        pending = self._check_auth(topic, channel, "subscribe", "SUB_ADVANCED")
        part = None
        if start is not None:  # a position in the archive: its row group read in a thread
            existing = self.nsqd.get_topic(topic, create=False)
            if existing is not None and (partition or 0) < len(existing.partitions):
                part = existing.partitions[partition or 0]
                if part.log.lower is None:
                    part = None
        if pending is not None or part is not None:
            return self._after(self._load_start(pending, part, start),
                               lambda: self._subscribe(topic, channel, partition, start))
        self._subscribe(topic, channel, partition, start)
        return None

    @staticmethod
    async def _load_start(auth: Awaitable[Any] | None, part: TopicView | None,
                          start: StartPosition | None) -> None:
        """SUB_ADVANCED: the authorization first, then the archived row group its position
        names, read in a thread (``load_position``) so that resolving it on the loop waits
        for no store; an unreadable file fails as resolving it would."""
        if auth is not None:
            await auth
        if part is not None and start is not None:
            try:
                await load_position(part, start)
            except LogError as exc:  # E_ARCHIVE_CORRUPT <file>, the store unreachable
                raise Fatal(exc.code or "E_SUB_FAILED",
                            f"SUB_ADVANCED {exc}") from None

    async def _after(self, coro: Awaitable[Any], then: Callable[[], None]) -> None:
        await coro
        try:
            then()
        except ProtocolError as exc:  # as _run answers them
            if exc.fatal:
                raise Fatal(exc.code, exc.text) from None
            self._respond(frames.encode_error(exc.code, exc.text))

    def _subscribe(self, topic_name: str, channel_name: str, partition: int | None = None,
                   start: StartPosition | None = None, *, ordered: bool = False) -> None:
        """SUB (every partition when none is named), SUB_ADVANCED, SUB_ORDERED."""
        nsqd = self.nsqd
        what = "SUB_ORDERED" if ordered else (
            "SUB" if start is None and partition is None else "SUB_ADVANCED")
        if nsqd.exiting:
            raise Fatal("E_SUB_FAILED", f"{what} failed to subscribe to {topic_name}:{channel_name}, exiting")
        existing = nsqd.get_topic(topic_name, create=False)
        if partition and (existing is None or partition >= len(existing.partitions)):
            # checked before creating anything: a new topic has partition 0 only
            raise Fatal("E_BAD_PARTITION", f"{what} partition {partition} is not valid")
        topic = existing or nsqd.get_topic(topic_name)
        assert topic is not None
        routed = topic.routes is not None  # route-managed: a plain SUB reads every partition
        if topic.ordered and not ordered and not (routed and partition is None):
            raise Fatal("E_SUB_ORDER_IS_MUST", f"{what} topic {topic_name} is ordered: "
                        "subscribe to a partition with SUB_ORDERED")
        if (ordered or routed) and self.sample_rate:
            raise Fatal("E_INVALID", f"{what} cannot be used with sample_rate")
        parts = topic.partitions if partition is None else [topic.partitions[partition]]
        if partition is None and len(parts) > 1:
            # cluster mode: a plain SUB reads the partitions this node leads
            serving = [p for p in parts if p.gate is None or p.gate.refuse_consumers(p) is None]
            parts = serving or parts[:1]
        for part in parts:
            _check_serves_consumers(part, what)
        first = parts[0]
        prior = first.channels.get(channel_name)
        if start is not None and (prior is None or not prior.clients):
            # refuse a bad position before a new channel is created for it
            self._start_position(what, lambda: resolve_position(first, start))
        channels = []
        limit = nsqd.opts.max_channel_consumers
        for part in parts:
            channel = part.get_channel(channel_name)
            assert channel is not None
            if limit and len(channel.clients) >= limit:
                raise Fatal("E_SUB_FAILED", f"{what} failed consumers for {topic_name}:{channel_name} exceeds limit of {limit}")
            if channel.exiting or part.exiting:
                raise Fatal("E_SUB_FAILED", f"{what} failed to subscribe to {topic_name}:{channel_name}")
            channels.append(channel)
        if start is not None and not channels[0].clients:
            self._start_position(what, lambda: channels[0].seek(start, str(self)))
        for channel in channels:
            if ordered:
                channel.set_ordered()
            channel.add_client(self)
        self.channel = channels[0]
        self.subs = channels
        self.sub_all = partition is None  # gets the partitions a route change creates
        self.state = STATE_SUBSCRIBED
        self._respond(frames.OK_FRAME)

    @staticmethod
    def _start_position(what: str, fn: Callable[[], object]) -> None:
        """Run a SUB_ADVANCED position step; its errors are fatal, in Youzan's codes."""
        try:
            fn()
        except NotLeader as exc:
            raise Fatal("E_FAILED_ON_NOT_LEADER", f"{what} {exc}") from None
        except SeekError as exc:
            raise Fatal("E_SUB_FAILED", f"{what} failed to set the start position: {exc}") from None
        except LogError as exc:  # the archive: a file unreadable (E_ARCHIVE_CORRUPT <file>)
            raise Fatal(exc.code or "E_SUB_FAILED", f"{what} {exc}") from None

    def _cmd_rdy(self, cmd: Command) -> None:
        if self.state == STATE_CLOSING:
            return None
        if self.state != STATE_SUBSCRIBED:
            raise Fatal("E_INVALID", "cannot RDY in current state")
        count = parse_rdy(cmd.params, self.nsqd.opts.max_rdy_count)
        self.ready_count = count
        if count:
            for ch in self.subs:
                ch.wake()
        return None

    def _msg_target(self, cmd: Command, name: str) -> tuple[Channel | None, int]:
        """The subscribed channel of the id's partition and the offset (None, -1 if none)."""
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise Fatal("E_INVALID", f"cannot {name} in current state")
        if name == "REQ":
            mid, _ = parse_req(cmd.params, self.nsqd.opts.max_delay_ms)
        else:
            mid = parse_fin(cmd.params) if name == "FIN" else parse_touch(cmd.params)
        try:
            partition, offset = parse_id(mid)
        except ValueError:
            return None, -1  # 16 bytes but not one of ours: "not in flight"
        for ch in self.subs:
            if ch.topic.partition == partition:
                return ch, offset
        for ch in self.subs:  # no partition of ours: an imported message's original id?
            offset = ch.imported_offset(self.id, partition << 48 | offset)
            if offset >= 0:
                return ch, offset
        return None, -1

    def _cmd_fin(self, cmd: Command) -> None:
        ch, offset = self._msg_target(cmd, "FIN")
        try:
            if ch is None:
                raise NotInFlight
            ch.finish(self, offset)
        except (NotInFlight, NotOwner) as exc:
            raise ProtocolError("E_FIN_FAILED", f"FIN {cmd.params[0].decode('latin-1')} failed {_reason(exc)}", fatal=False) from None
        self.finish_count += 1
        self._wake_subs(ch)
        return None

    def _wake_subs(self, ch: Channel) -> None:
        """RDY room opened: every partition this client reads may send now."""
        if len(self.subs) == 1:
            ch.wake()
        else:
            for sub in self.subs:
                sub.wake()

    def _cmd_fin_batch(self, cmd: Command) -> None:
        """A run of FIN lines from one read: ids decoded in C, in-order runs finished at once."""
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING) or self.channel is None:
            raise Fatal("E_INVALID", "cannot FIN in current state")
        ids = cmd.params
        if len(self.subs) > 1 or self.channel.topic.partition:
            for mid in ids:  # ids of several partitions: one by one, routed by partition
                try:
                    self._cmd_fin(Command(b"FIN", [mid]))
                except ProtocolError as exc:
                    self._respond(frames.encode_error(exc.code, exc.text))
            return None
        n = len(ids)
        offsets: list[int] | None = None
        joined = b"".join(ids)
        if len(joined) == 16 * n:
            try:
                values = struct.unpack(f">{n}Q", bytes.fromhex(joined.decode("ascii")))
            except (ValueError, UnicodeDecodeError):
                values = None
            if values is not None and max(values) < (1 << 48) and (joined.islower() or joined.isdigit()):
                offsets = list(values)
        if offsets is None:  # general path: one by one, same errors as single FINs
            for mid in ids:
                try:
                    self._cmd_fin(Command(b"FIN", [mid]))
                except ProtocolError as exc:
                    self._respond(frames.encode_error(exc.code, exc.text))
            return None
        errors = self.channel.finish_many(self, offsets)
        self.finish_count += n - len(errors)
        for off, exc in errors:
            mid = b"%016x" % off
            self._respond(frames.encode_error(
                "E_FIN_FAILED", f"FIN {mid.decode()} failed {_reason(exc)}"))
        self.channel.wake()
        return None

    def _cmd_req(self, cmd: Command) -> None:
        ch, offset = self._msg_target(cmd, "REQ")
        _, delay = parse_req(cmd.params, self.nsqd.opts.max_delay_ms)
        try:
            if ch is None:
                raise NotInFlight
            ch.requeue(self, offset, delay)
        except (NotInFlight, NotOwner) as exc:
            raise ProtocolError("E_REQ_FAILED", f"REQ {cmd.params[0].decode('latin-1')} failed {_reason(exc)}", fatal=False) from None
        self.requeue_count += 1
        self._wake_subs(ch)
        return None

    def _cmd_touch(self, cmd: Command) -> None:
        ch, offset = self._msg_target(cmd, "TOUCH")
        try:
            if ch is None:
                raise NotInFlight
            ch.touch(self, offset, int(self.nsqd.opts.max_msg_timeout * 1000))
        except (NotInFlight, NotOwner) as exc:
            raise ProtocolError("E_TOUCH_FAILED", f"TOUCH {cmd.params[0].decode('latin-1')} failed {_reason(exc)}", fatal=False) from None
        return None

    def _cmd_cls(self, cmd: Command) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise Fatal("E_INVALID", "cannot CLS in current state")
        self.ready_count = 0
        self.state = STATE_CLOSING
        self._respond(frames.CLOSE_WAIT_FRAME)
        return None

    def _pub_topic(self, cmd: Command, name: str) -> str:
        if not cmd.params:
            raise Fatal("E_INVALID", f"{name} insufficient number of parameters")
        topic = cmd.params[0].decode("utf-8", "replace")
        if not valid_topic_name(topic):
            prefix = "E_BAD_TOPIC " if name == "MPUB" else ""
            raise Fatal("E_BAD_TOPIC", f'{prefix}{name} topic name "{topic}" is not valid')
        return topic

    def _publish(self, topic_name: str, bodies: list[bytes], defer_ms: int, code: str, what: str,
                 partition: int | None = None, headers: list[dict[str, bytes] | None] | None = None,
                 traced: int | None = None, route_version: int | None = None,
                 ask_replayed: bool = False) -> None:
        """Append and answer once durable; ``traced`` (a trace id) answers with Youzan's
        30-byte traced response instead of OK; ``ask_replayed``: a marked batch found
        stored answers that with REPLAYED_SUFFIX (a follower forwarding an HTTP key)."""
        nsqd = self.nsqd
        if nsqd.exiting:
            raise Fatal(code, f"{what} failed exiting")
        workers = nsqd.workers
        if workers is not None and not workers.owned(topic_name):
            self._forward(workers, topic_name, bodies, defer_ms, code, what, partition,
                          headers, route_version)
            return
        existing = None
        if headers is not None:
            existing = nsqd.get_topic(topic_name, create=False)
            if existing is not None and not existing.ext and _user_header(headers):
                raise ProtocolError("E_EXT_NOT_SUPPORT",
                                    f"ext content not supported in topic {topic_name}", False)
        topic = existing if existing is not None else nsqd.get_topic(topic_name)
        assert topic is not None
        if partition is None and headers is not None:
            partition = sticky_partition(topic, headers)
        try:
            part = topic.route(partition)
            if route_version is not None and topic.routes is not None:
                topic.routes.check_publish(part.partition, route_version)
        except SealedPartition as exc:  # E_BAD_PARTITION route version N: refresh, retry
            raise ProtocolError("E_BAD_PARTITION", str(exc), fatal=False) from None
        except BadPartition as exc:
            raise ProtocolError("E_BAD_PARTITION", f"{what} {exc}", fatal=False) from None
        ok_from = None
        if traced is not None:
            pnum, raw_size, tid = part.partition, 30 * len(bodies) + sum(map(len, bodies)), traced

            def ok_from(base: int) -> bytes:
                return traced_response((pnum << 48) | base, tid, base, raw_size)
        if headers is not None and has_mark(headers) and leads(part):
            self._publish_once(part, bodies, defer_ms, headers, code, what, ok_from,
                               ask_replayed)
        else:
            done = self._respond_when_done(frames.OK_FRAME, (code, f"{what} failed"), ok_from)
            part.publish(bodies, defer_ms, done, headers=headers, producer=self.remote_address)
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)

    def _forward(self, workers: Any, topic_name: str, bodies: list[bytes], defer_ms: int,
                 code: str, what: str, partition: int | None,
                 headers: list[dict[str, bytes] | None] | None,
                 route_version: int | None) -> None:
        """``--workers``: the topic is another worker's; the publish goes to its owner (one
        write per owner per loop turn) and its answer, the owner's, takes this command's
        slot, so the client's answers stay in command order."""
        answer: list[bytes] = []
        done = self._respond_when_done(frames.OK_FRAME, (code, f"{what} failed"),
                                       lambda _base: answer[0])

        def answered(data: bytes | None, exc: Exception | None) -> None:
            if exc is not None or data is None:
                done(-1, exc or ProtocolError(code, f"{what} failed", False))
            else:
                answer.append(data)
                done(0, None)
        workers.forward(topic_name, forward_command(topic_name, partition, bodies, defer_ms,
                                                    headers, route_version), answered)
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)

    # -- handover (--workers) -------------------------------------------------------------
    def _elsewhere(self, topic: str, what: str) -> Any:
        """None when this worker serves ``topic``'s subscribers (always with one process);
        else the coroutine that hands the connection over to the topic's owner."""
        workers = self.nsqd.workers
        if workers is None or workers.owned(topic):
            return None
        if self.auth is not None:
            raise Fatal("E_SUB_FAILED", f"{what} topic {topic} is served by another worker "
                        "of this nsqd (--workers): a connection with AUTH cannot be handed "
                        "over to it yet (connect without it, or run nsqd --workers=1)")
        if self.transport is not None:
            self.transport.pause_reading()  # what comes next is the owner's to read
        return self._hand_over(workers, topic, what)

    def _follow_topic(self, cmd: Command) -> bool:
        """``--workers``: a connection's first publish, for another worker's topic, moves
        the connection to that worker (as a SUB does) when it can, instead of forwarding
        every publish of a producer that writes one topic; True when it goes. Its later
        publishes to other workers' topics are forwarded from there."""
        if (self._follow_tried or not cmd.params or self.state != STATE_INIT or self.tls
                or self._decoder is not None or self.auth is not None
                or self.transport is None):
            return False
        self._follow_tried = True
        topic = cmd.params[0].decode("utf-8", "replace")
        workers = self.nsqd.workers
        if not valid_topic_name(topic) or workers.owned(topic):
            return False
        self._backlog.appendleft(cmd)
        self.transport.pause_reading()
        self._blocked = True
        task = self.nsqd.loop.create_task(self._hand_over(workers, topic, "PUB",
                                                          optional=True))
        task.add_done_callback(self._async_done)
        return True

    async def _hand_over(self, workers: Any, topic: str, what: str, *,
                         optional: bool = False) -> None:
        """Pass the socket (SCM_RIGHTS) to the owner with this connection's IDENTIFY state
        and every byte read but not executed (the SUB first): the owner goes on from there
        as if the client had connected to it. ``optional`` (a publish): when the owner
        cannot take it now, the connection stays and its publishes are forwarded."""
        await self._wait_responses()
        if self._closing or self.transport is None:
            return
        raw = b"".join(_encode_command(c) for c in self._backlog)
        self._backlog.clear()
        raw += self.parser.take_buffered() + b"".join(self._raw_backlog)
        self._raw_backlog = []
        relay = self.tls or self._decoder is not None  # state a descriptor cannot carry
        if relay:  # the owner gets one end of a pipe, this worker relays through the other
            mine, theirs = socket.socketpair()
        else:  # a copy: the number stays this socket's while the owner may be awaited
            theirs = socket.socket(fileno=os.dup(self.transport.get_extra_info(
                "socket").fileno()))
        try:
            self._handed_to = await workers.hand_over(
                topic, theirs.fileno(), self.handover_state(), raw, wait=not optional)
        except (OSError, ValueError) as exc:
            theirs.close()
            if relay:
                mine.close()
            if optional:  # stays here: what was taken out goes back, forwarded from here
                self._restore(raw)
                return
            raise Fatal("E_SUB_FAILED", f"{what} failed to subscribe to {topic}: its worker "
                        f"is not reachable now ({exc}); reconnect") from None
        theirs.close()  # the owner has its own copy
        if relay:
            await self._relay_to(mine)
            return
        self._closing = True
        if self.transport is not None:  # our descriptor only: the owner's keeps the connection
            self.transport.abort()

    async def _relay_to(self, sock: socket.socket) -> None:
        """``--workers``, a connection with TLS or compression handed over: the owner's
        session reads and writes the plain protocol on ``sock``'s other end; this session
        only decrypts/decompresses what the client sends into it and encrypts/compresses
        what comes out (``_RelayPipe``). Its own heartbeats stop: the owner's pass through."""
        if self._hb_handle is not None:
            self._hb_handle.cancel()
            self._hb_handle = None
        sock.setblocking(False)
        transport, _ = await self.nsqd.loop.connect_accepted_socket(
            lambda: _RelayPipe(self), sock)
        self._relay = transport  # type: ignore[assignment]
        if self._closing or self.transport is None or self.transport.is_closing():
            transport.close()
            return
        self._closing = True  # nothing more is executed here
        log.info("[%s] relayed to worker %s (its TLS/compression stay here)", self,
                 self._handed_to)
        if self._reading_paused:
            self._reading_paused = False
        self.transport.resume_reading()

    def relay_out(self, data: bytes) -> None:
        """What the owner's session wrote for a relayed connection, on to the client."""
        if self.transport is not None and not self.transport.is_closing():
            self._write(data)

    def _relay_in(self, data: bytes) -> None:
        """Bytes from the client of a relayed connection: decoded here, on to the owner."""
        assert self._relay is not None
        dec = self._decoder
        if dec is not None:
            try:
                for chunk in _decoded(dec, data):
                    self._relay.write(chunk)
            except ProtocolError:  # corrupt compressed stream: both ends go
                self._relay.close()
                if self.transport is not None:
                    self.transport.close()
            return
        self._relay.write(data)

    def _restore(self, raw: bytes) -> None:
        """A publish's handover did not happen: the bytes taken for it are parsed again."""
        self.parser = CommandParser(
            max_body_size=self.nsqd.opts.max_body_size, max_msg_size=self.nsqd.opts.max_msg_size,
            batch_fin=True, max_req_timeout_ms=self.nsqd.opts.max_delay_ms,
            precheck=self._precheck)
        self._raw_backlog = [raw] if raw else []
        if self.transport is not None:
            self.transport.resume_reading()

    def handover_state(self) -> dict[str, Any]:
        """What IDENTIFY set on this connection (``adopt`` applies it in the owner)."""
        return {k: getattr(self, k) for k in _HANDOVER_FIELDS}

    @classmethod
    def handed_over(cls, nsqd: NodeAPI, state: dict[str, Any], raw: bytes) -> ClientV2:
        """The session of a connection another worker handed over: its IDENTIFY state,
        then the bytes it had read but not executed, taken in connection_made (before
        anything the socket holds, which the loop reads from then on)."""
        client = cls(nsqd)
        client._adopted = (state, raw)
        return client

    def _adopt(self) -> None:
        assert self._adopted is not None
        state, raw = self._adopted
        self._adopted = None
        self.magic = MAGIC_V2
        for k in _HANDOVER_FIELDS:
            if k in state:
                setattr(self, k, state[k])
        self._schedule_heartbeat()
        if raw:
            self.data_received(raw)

    def _publish_once(self, part: TopicView, bodies: list[bytes], defer_ms: int,
                      headers: list[dict[str, bytes] | None], code: str, what: str,
                      ok_from: Callable[[int], bytes] | None, ask_replayed: bool = False
                      ) -> None:
        """A batch marked for idempotence (``nsqx-pub`` key or ``##nsqx_producer``
        sequence): appended once; a repeat is answered as the first was (nsqd.idempotence),
        plus REPLAYED_SUFFIX when the sender asked."""
        dedupe = deduper_for(part)
        repeat = None
        if ask_replayed:
            slot_done, repeat = self._replay_telling_slot(code, what, ok_from)
        else:
            # (a repeat of an older sequence answers base -1: 0 then, its offset is forgotten)
            slot_done = self._respond_when_done(frames.OK_FRAME, (code, f"{what} failed"),
                                                ok_from and (lambda base: ok_from(max(base, 0))))
        try:
            dedupe.publish(bodies, defer_ms, headers, slot_done, producer=self.remote_address,
                           repeat=repeat)
        except IdempotenceError as exc:  # refused before anything was appended
            slot_done(-1, ProtocolError(exc.code, exc.text, False))

    def _replay_telling_slot(self, code: str, what: str,
                             ok_from: Callable[[int], bytes] | None) -> tuple[Callable, Callable]:
        """(done, repeat) of one response slot whose answer ends with REPLAYED_SUFFIX when
        ``repeat`` filled it (a follower forwarding an HTTP key asked)."""
        seen: list[bool] = []

        def answer(base: int) -> bytes:
            out = ok_from(max(base, 0)) if ok_from is not None else b"OK"
            return replayed_answer(out) if seen else out
        slot_done = self._respond_when_done(frames.OK_FRAME, (code, f"{what} failed"), answer)

        def repeat(base: int, exc: Exception | None) -> None:
            seen.append(True)
            slot_done(base, exc)
        return slot_done, repeat

    def _cmd_pub(self, cmd: Command) -> Any:
        topic = self._pub_topic(cmd, "PUB")
        body = cmd.body or b""
        part = _partition_param(cmd.params, 1, "PUB")
        rv = _route_version_param(cmd.params, 2, "PUB")
        pending = self._check_auth(topic, None, "publish", "PUB")
        if pending is not None:
            return self._after(pending, lambda: self._publish(topic, [body], 0, "E_PUB_FAILED", "PUB", part,
                                                              route_version=rv))
        self._publish(topic, [body], 0, "E_PUB_FAILED", "PUB", part, route_version=rv)
        return None

    def _cmd_mpub(self, cmd: Command) -> Any:
        topic = self._pub_topic(cmd, "MPUB")
        bodies = cmd.bodies or []
        part = _partition_param(cmd.params, 1, "MPUB")
        rv = _route_version_param(cmd.params, 2, "MPUB")
        pending = self._check_auth(topic, None, "publish", "MPUB")
        if pending is not None:
            return self._after(pending, lambda: self._publish(topic, bodies, 0, "E_MPUB_FAILED", "MPUB", part,
                                                              route_version=rv))
        self._publish(topic, bodies, 0, "E_MPUB_FAILED", "MPUB", part, route_version=rv)
        return None

    def _cmd_dpub(self, cmd: Command) -> Any:
        if len(cmd.params) < 2:
            raise Fatal("E_INVALID", "DPUB insufficient number of parameters")
        topic = self._pub_topic(cmd, "DPUB")
        try:
            defer = int(cmd.params[1])
        except ValueError:
            raise Fatal("E_INVALID", f"DPUB could not parse timeout {cmd.params[1].decode('latin-1')}") from None
        max_ms = self.nsqd.opts.max_delay_ms
        if not 0 <= defer <= max_ms:
            raise Fatal("E_INVALID", f"DPUB timeout {defer} out of range 0-{max_ms}")
        body = cmd.body or b""
        pending = self._check_auth(topic, None, "publish", "DPUB")
        if pending is not None:
            return self._after(pending, lambda: self._publish(topic, [body], defer, "E_DPUB_FAILED", "DPUB"))
        self._publish(topic, [body], defer, "E_DPUB_FAILED", "DPUB")
        return None

    def _cmd_pub_variant(self, cmd: Command) -> Any:
        """Youzan's PUB_EXT / PUB_TRACE / MPUB_EXT / MPUB_TRACE ``<topic> [<partition>]``.

        EXT: each message is ``[2 json len][json header][body]``; the header's string values
        become the message's headers (``##trace_id`` answers with the traced response).
        TRACE: ``[8 trace id][body]``, kept as the ``##trace_id`` header; PUB_TRACE and
        MPUB_TRACE answer with the 30-byte traced response (MPUB_TRACE: the first message's
        id and offset, trace id 0, the batch's size), MPUB_EXT with OK.
        """
        what = cmd.name.decode()
        multi = what.startswith("MPUB")
        topic = self._pub_topic(cmd, what)
        part = _partition_param(cmd.params, 1, what)
        rv = _route_version_param(cmd.params, 2, what) if len(cmd.params) > 2 else None
        raw = (cmd.bodies or []) if multi else [cmd.body or b""]
        bodies: list[bytes] = []
        headers: list[dict[str, bytes] | None] = []
        traced: int | None = None
        defer_ms, ask_replayed = 0, False
        if what.endswith("_EXT"):
            rest = None if cmd.stripped or len(raw) < 2 else strip_no_ext(raw[1:])
            if cmd.stripped:
                # headers on the first message only (an idempotent producer's batch): the
                # parser cut the others' bodies in C (split_marked: batched ingest's hot path)
                bodies = raw.copy()  # (the command stays as parsed)
                h, bodies[0] = split_ext(raw[0], what)
                headers = [None] * len(raw)
                headers[0] = h
            elif rest is not None:  # the same, cut by the general split (strip_no_ext)
                h, body = split_ext(raw[0], what)
                bodies = [body, *rest]
                headers = [h] + [None] * len(rest)
            else:
                for item in raw:
                    h, body = split_ext(item, what)
                    bodies.append(body)
                    headers.append(h)
            h0 = headers[0]
            if h0 and (DEFER_KEY in h0 or ASK_REPLAYED_KEY in h0):
                defer_ms, ask_replayed = self._controls(h0, what)
            if not multi and h0 and TRACE_ID_KEY in h0:
                traced = int(h0[TRACE_ID_KEY])
        else:
            for item in raw:
                tid, body = split_trace(item, what)
                bodies.append(body)
                headers.append({TRACE_ID_KEY: b"%d" % tid} if tid else None)
            traced = 0 if multi else tid
        hdrs = headers if any(headers) else None
        code = "E_MPUB_FAILED" if multi else "E_PUB_FAILED"
        pending = self._check_auth(topic, None, "publish", what)
        if pending is not None:
            return self._after(pending, lambda: self._publish(
                topic, bodies, defer_ms, code, what, part, hdrs, traced, rv,
                ask_replayed=ask_replayed))
        self._publish(topic, bodies, defer_ms, code, what, part, hdrs, traced, rv,
                      ask_replayed=ask_replayed)
        return None

    def _controls(self, h0: dict[str, bytes], what: str) -> tuple[int, bool]:
        """Take nsqx's controls off a batch's first headers (never stored): the delay of
        ``DEFER_KEY`` (0..--max-delay ms, as DPUB's) and ``ASK_REPLAYED_KEY``."""
        ask = h0.pop(ASK_REPLAYED_KEY, None) is not None
        raw = h0.pop(DEFER_KEY, None)
        if raw is None:
            return 0, ask
        max_ms = self.nsqd.opts.max_delay_ms
        text = bytes(raw).decode("latin-1")
        if not (text.isascii() and text.isdigit() and int(text) <= max_ms):
            raise ProtocolError("E_INVALID", f"{what} {DEFER_KEY} {text[:40]} out of range "
                                f"0-{max_ms}", fatal=False)
        return int(text), ask

    _handlers: dict[bytes, Callable[[ClientV2, Command], Any]] = {
        b"NOP": _cmd_nop,
        b"IDENTIFY": _cmd_identify,
        b"AUTH": _cmd_auth,
        b"SUB": _cmd_sub,
        b"SUB_ADVANCED": _cmd_sub_advanced,
        b"SUB_ORDERED": _cmd_sub_ordered,
        b"RDY": _cmd_rdy,
        b"FIN": _cmd_fin,
        FIN_BATCH: _cmd_fin_batch,
        b"REQ": _cmd_req,
        b"TOUCH": _cmd_touch,
        b"CLS": _cmd_cls,
        b"PUB": _cmd_pub,
        b"MPUB": _cmd_mpub,
        b"DPUB": _cmd_dpub,
        b"PUB_EXT": _cmd_pub_variant,
        b"PUB_TRACE": _cmd_pub_variant,
        b"MPUB_EXT": _cmd_pub_variant,
        b"MPUB_TRACE": _cmd_pub_variant,
    }

    # -- stats ----------------------------------------------------------------------------
    def __str__(self) -> str:
        ch = self.channel
        where = f" {ch.topic.name}:{ch.name}" if ch is not None else ""
        return f"client({self.remote_address}{where})"

    def stats(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
            "tls": self.tls,
            "tls_cipher_suite": self.tls_cipher_suite,
            "tls_version": self.tls_version,
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
            "topology_zone": "",
            "topology_region": "",
        }
        if self.auth is not None:
            d["authed"] = True
            d["auth_identity"] = self.auth.identity
            d["auth_identity_url"] = self.auth.identity_url
        if self.pub_counts:
            d["pub_counts"] = [{"topic": t, "count": c} for t, c in self.pub_counts.items()]
        return d


_PUBLISHES = frozenset({b"PUB", b"MPUB", b"DPUB", b"PUB_EXT", b"PUB_TRACE", b"MPUB_EXT",
                        b"MPUB_TRACE"})
_HANDOVER_FIELDS = ("client_id", "hostname", "user_agent", "heartbeat_interval",
                    "output_buffer_size", "output_buffer_timeout", "sample_rate",
                    "msg_timeout_ms", "extend_support", "desired_tag", "identified",
                    "connect_ts", "remote_address")


def _decoded(dec: SnappyDecoder | DeflateDecoder, data: bytes) -> Iterator[bytes]:
    """What a compressed read decodes to, in bounded steps (so the parser's size checks
    stop a bomb early): the caller may stop taking them at any step."""
    chunk = dec.decode(data)
    while True:
        yield chunk
        if not dec.pending:
            return
        chunk = dec.decode(b"")


class _RelayPipe(asyncio.Protocol):
    """This worker's end of a relayed connection's pipe (``ClientV2._relay_to``): what the
    owner's session writes goes to the client through the connection's encoder and TLS."""

    def __init__(self, client: ClientV2) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.client.relay_out(data)

    def pause_writing(self) -> None:  # the client writes faster than the owner reads
        if self.transport is not None and self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client.transport is not None:
            self.client.transport.close()  # after what is buffered: the owner closed it


def _encode_command(cmd: Command) -> bytes:
    """A parsed command back to its bytes (a handover re-sends what was not executed)."""
    if cmd.name == FIN_BATCH:
        return b"".join(b"FIN " + mid + b"\n" for mid in cmd.params)
    line = b" ".join([cmd.name, *cmd.params]) + b"\n"
    if cmd.body is not None:
        return line + struct.pack(">I", len(cmd.body)) + cmd.body
    if cmd.bodies is not None:
        bodies = cmd.bodies
        if cmd.stripped:  # split_marked took the others' empty 2-byte header: give it back
            bodies = [bodies[0], *(b"\0\0" + b for b in bodies[1:])]
        inner = mpub_body(bodies)
        return line + struct.pack(">I", len(inner)) + inner
    return line


def _user_header(headers: list[dict[str, bytes] | None]) -> bool:
    """Whether a message of the batch has a header that is not reserved (``##``), which a
    topic without ext support refuses (compress skips the messages without one in C)."""
    for h in compress(headers, headers):
        for k in h:  # type: ignore[union-attr]
            if k[:2] != "##":
                return True
    return False


def _partition_param(params: list[bytes], index: int, what: str) -> int | None:
    """Youzan's optional partition parameter (None when absent); E_BAD_PARTITION if bad."""
    if len(params) <= index:
        return None
    raw = params[index]
    if not raw.isdigit() or len(raw) > 5 or int(raw) > 65535:
        raise ProtocolError("E_BAD_PARTITION", f"{what} partition {raw.decode('latin-1')!r} is "
                            "not valid", fatal=what.startswith("SUB"))
    return int(raw)


def _route_version_param(params: list[bytes], index: int, what: str) -> int | None:
    """nsqx's optional route version after the partition (``PUB <topic> <partition>
    <route version>``): the newest route the producer knew; E_BAD_PARTITION if malformed."""
    if len(params) <= index:
        return None
    raw = params[index]
    if not raw.isdigit() or len(raw) > 9:
        raise ProtocolError("E_BAD_PARTITION", f"{what} route version "
                            f"{raw.decode('latin-1')!r} is not valid", fatal=False)
    return int(raw)


def _check_serves_consumers(topic: TopicView, what: str) -> None:
    """Cluster mode: only a partition's leader delivers (Youzan's fatal error otherwise)."""
    gate = topic.gate
    refusal = gate.refuse_consumers(topic) if gate is not None else None
    if refusal:
        raise Fatal("E_FAILED_ON_NOT_LEADER", f"{what} {refusal}")


def _reason(exc: Exception) -> str:
    return "client does not own message" if isinstance(exc, NotOwner) else "ID not in flight"


